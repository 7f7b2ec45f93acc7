#!/usr/bin/env python3
"""Asynchronous GRPO on two-digit addition with gac, in PyTorch: the Python
twin of examples/grpo (gac_grpo).

A prompt is "a1 a0 + b1 b0 =" and the policy writes the three digits of
a + b; the reward is the fraction of digits that are right. The policy is an
autoregressive MLP over one-hot inputs. Rollouts come from the policy of
--staleness steps ago (a ring of snapshots: what an asynchronous trainer's
rollout workers hold), so the learner trains on off-policy data, which is
where consecutive gradients align and GAC steps in, on the optimizer's step:

    attachment = gac.attach(optimizer, mode="local", c_low=..., c_high=...)
    ...
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()                           # c_t first; projects g in place, or skips the update
    telemetry.send(attachment.last_report, scalars={"reward": ...}, staleness=behind)

--mode local decides in-process, monitor only measures, remote lets gacd
decide (its thresholds set from --c-low/--c-high). --gacd streams every
step to gacd. The default thresholds are those calibrated for this policy
from a synchronous run (docs/RESULTS.md: a tiny policy's on-policy |c_t| is
far above an LLM's); the run's own |c_t| statistics and the thresholds
gac.suggest_thresholds derives from them end the output (run with
--staleness 0 --mode monitor to calibrate). The last line is a JSON summary
with --json.

    python3 examples/python/grpo.py --steps 300 --staleness 8 --mode local --gacd 127.0.0.1:7070
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import sys
import time
from typing import Deque, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import gac
import gac.rl

PROMPT_DIGITS, ANSWER_DIGITS, VOCAB = 4, 3, 10
INPUTS = PROMPT_DIGITS * VOCAB + (ANSWER_DIGITS - 1) * VOCAB + ANSWER_DIGITS  # 63


class Task:
    """Training and held-out (a, b) pairs; the held-out 1,000 never train."""

    def __init__(self) -> None:
        pairs = torch.tensor([(a, b) for a in range(100) for b in range(100)])
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(20240601))
        self.heldout, self.train = pairs[order[:1000]], pairs[order[1000:]]

    def sample(self, count: int, gen: torch.Generator) -> torch.Tensor:
        return self.train[torch.randint(len(self.train), (count,), generator=gen)]


def answer_digits(pairs: torch.Tensor) -> torch.Tensor:
    s = pairs[:, 0] + pairs[:, 1]
    return torch.stack([s // 100, s // 10 % 10, s % 10], dim=1)


def inputs(pairs: torch.Tensor, answer: torch.Tensor, k: int) -> torch.Tensor:
    """The policy's input for answer digit k: the prompt's digits, the
    answer digits before k, and k, all one-hot."""
    n = len(pairs)
    prompt = torch.stack([pairs[:, 0] // 10, pairs[:, 0] % 10, pairs[:, 1] // 10, pairs[:, 1] % 10], dim=1)
    x = torch.zeros(n, INPUTS)
    x[:, :PROMPT_DIGITS * VOCAB] = F.one_hot(prompt, VOCAB).reshape(n, -1).float()
    for j in range(k):
        x[torch.arange(n), PROMPT_DIGITS * VOCAB + j * VOCAB + answer[:, j]] = 1.0
    x[:, INPUTS - ANSWER_DIGITS + k] = 1.0
    return x


def make_policy(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(INPUTS, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, VOCAB))


class Rollouts:
    """G sampled answers per prompt from the behaviour policy, their
    rewards and group-normalised advantages (one per token)."""

    def __init__(self, behaviour: nn.Module, prompts: torch.Tensor, group: int, gen: torch.Generator) -> None:
        pairs = prompts.repeat_interleave(group, dim=0)
        n = len(pairs)
        answer = torch.zeros(n, ANSWER_DIGITS, dtype=torch.long)
        xs, logps = [], []
        with torch.no_grad():
            for k in range(ANSWER_DIGITS):
                x = inputs(pairs, answer, k)
                logp = F.log_softmax(behaviour(x), dim=-1)
                answer[:, k] = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
                xs.append(x)
                logps.append(logp.gather(1, answer[:, k:k + 1]).squeeze(1))
        correct = (answer == answer_digits(pairs)).float()
        self.rewards = correct.mean(dim=1)
        grouped = self.rewards.view(-1, group)
        adv = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-6)
        self.inputs = torch.cat(xs)
        self.actions = answer.t().reshape(-1)
        self.behaviour_logp = torch.cat(logps)
        self.advantages = adv.reshape(-1).repeat(ANSWER_DIGITS)


def grpo_loss(policy: nn.Module, reference: nn.Module, batch: Rollouts, clip_eps: float = 0.2,
              kl_coef: float = 1e-3, entropy_coef: float = 1e-3,
              lag: int = 0) -> Tuple[torch.Tensor, Dict[str, float], gac.rl.PolicySignals]:
    """-min(r A, clip(r) A) per token, plus the k3 KL to the reference and an
    entropy bonus; and the batch's policy-health signals (gac.rl) from the
    same tensors, its sequences `lag` policy versions behind."""
    logp_all = F.log_softmax(policy(batch.inputs), dim=-1)
    logp = logp_all.gather(1, batch.actions[:, None]).squeeze(1)
    ratio = (logp - batch.behaviour_logp).exp()
    pg = -torch.min(ratio * batch.advantages, ratio.clamp(1 - clip_eps, 1 + clip_eps) * batch.advantages).mean()
    with torch.no_grad():
        ref_logp = F.log_softmax(reference(batch.inputs), dim=-1).gather(1, batch.actions[:, None]).squeeze(1)
    kl = ((ref_logp - logp).exp() - (ref_logp - logp) - 1).mean()
    token_entropy = -(logp_all.exp() * logp_all).sum(dim=1)
    entropy = token_entropy.mean()
    loss = pg + kl_coef * kl - entropy_coef * entropy
    # The tokens are digit-major (all first digits, then all second ones): (T, B) -> (B, T).
    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.view(ANSWER_DIGITS, -1).t()
    sequences = rows(logp).shape[0]
    signals = gac.rl.signals(rows(logp), rows(batch.behaviour_logp), None, advantages=rows(batch.advantages),
                             clip_low=clip_eps, clip_high=clip_eps, entropies=rows(token_entropy),
                             versions=[0] * sequences, current_version=lag)
    return loss, {"loss": pg.item(), "kl": kl.item(), "entropy": entropy.item()}, signals


def accuracy(policy: nn.Module, pairs: torch.Tensor) -> float:
    """Greedy exact match."""
    answer = torch.zeros(len(pairs), ANSWER_DIGITS, dtype=torch.long)
    with torch.no_grad():
        for k in range(ANSWER_DIGITS):
            answer[:, k] = policy(inputs(pairs, answer, k)).argmax(dim=-1)
    return float((answer == answer_digits(pairs)).all(dim=1).float().mean())


def warm_up(policy: nn.Module, task: Task, steps: int, gen: torch.Generator) -> None:
    """Teacher-forced cross-entropy: the "pretrained" start of RL post-training."""
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    for _ in range(steps):
        pairs = task.sample(64, gen)
        target = answer_digits(pairs)
        x = torch.cat([inputs(pairs, target, k) for k in range(ANSWER_DIGITS)])
        loss = F.cross_entropy(policy(x), target.t().reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--staleness", type=int, default=8, help="policy versions the rollouts lag")
    ap.add_argument("--mode", choices=["local", "monitor", "remote", "off"], default="local")
    ap.add_argument("--c-low", type=float, default=0.584)
    ap.add_argument("--c-high", type=float, default=1.0)
    ap.add_argument("--alpha-mode", choices=["paper", "exact"], default="paper")
    ap.add_argument("--gacd", help="gacd's host:port: stream every step there")
    ap.add_argument("--token", help="bearer token for gacd")
    ap.add_argument("--deadline", type=float, default=0.05,
                    help="seconds gacd has to answer a Decide in remote mode before the local decision is used")
    ap.add_argument("--run", help="run id (default: py-grpo-<mode>-s<staleness>-seed<seed>)")
    ap.add_argument("--spool-dir", help="where unacknowledged telemetry waits")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip-grad", type=float, default=1.0)
    ap.add_argument("--sft-steps", type=int, default=600)
    ap.add_argument("--every", type=int, default=25, help="progress line every N steps")
    ap.add_argument("--json", action="store_true", help="end with a JSON summary line")
    args = ap.parse_args(argv)
    if args.mode == "remote" and not args.gacd:
        ap.error("--mode remote needs --gacd")
    run = args.run or f"py-grpo-{args.mode}-s{args.staleness}-seed{args.seed}"

    torch.set_num_threads(1)  # tiny matrices
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    task = Task()
    policy = make_policy(args.hidden)
    warm_up(policy, task, args.sft_steps, gen)
    reference = copy.deepcopy(policy).requires_grad_(False)
    params = list(policy.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)

    telemetry = gac.Telemetry(args.gacd, run, token=args.token, spool_dir=args.spool_dir) if args.gacd else None
    source = None
    if args.mode == "remote":
        source = gac.RemoteController(args.gacd, run, token=args.token, deadline=args.deadline)
        # gacd decides with the run's thresholds; the run is in remote mode, as this trainer.
        source.set_thresholds(args.c_low, args.c_high, args.alpha_mode, reason="examples/python/grpo.py",
                              mode="remote")
    attachment = None
    if args.mode != "off":
        attachment = gac.attach(optimizer, mode=args.mode, c_low=args.c_low, c_high=args.c_high,
                                alpha_mode=args.alpha_mode, decision_source=source, num_threads=1)

    print(f"grpo.py: run {run}, mode {args.mode}, staleness {args.staleness}, {args.steps} steps, "
          f"{sum(p.numel() for p in params)} parameters, held-out accuracy {accuracy(policy, task.heldout):.3f}")
    ring: Deque[nn.Module] = collections.deque()
    regimes: Dict[str, int] = collections.Counter()
    window = gac.CalibrationWindow(args.steps, skip_first=min(50, args.steps // 4))
    rewards: List[float] = []
    start = time.monotonic()
    for step in range(1, args.steps + 1):
        ring.append(copy.deepcopy(policy).requires_grad_(False))
        if len(ring) > args.staleness + 1:
            ring.popleft()
        behind = len(ring) - 1
        batch = Rollouts(ring[0], task.sample(args.prompts, gen), args.group, gen)
        optimizer.zero_grad(set_to_none=True)
        loss, scalars, signals = grpo_loss(policy, reference, batch, lag=behind)
        if attachment is not None:
            attachment.record_policy(signals)  # this update's report, and its record, carry them
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip_grad)
        optimizer.step()  # when attached, GAC first: its report is attachment.last_report

        report = attachment.last_report if attachment else None
        reward = float(batch.rewards.mean())
        rewards.append(reward)
        if report is not None:
            regimes[report.regime] += 1
            window.add(report.cosine)
            if telemetry is not None:
                # Sent here rather than by attach(telemetry=...), which has no staleness to send.
                telemetry.send(report, scalars={"reward": reward, **scalars}, staleness=behind)
        if step % args.every == 0 or step == args.steps:
            c = report.cosine if report is not None else None
            print(f"step {step:5d}  reward {reward:.3f}  c_t {'-' if c is None else f'{c:+.4f}'}  "
                  f"regime {report.regime if report else '-'}", flush=True)

    heldout = accuracy(policy, task.heldout)
    stats = window.stats(args.c_low)
    summary: Dict[str, object] = dict(
        run=run, mode=args.mode, steps=args.steps, heldout_acc=heldout,
        final_reward=sum(rewards[-20:]) / len(rewards[-20:]), regimes=dict(regimes),
        fallbacks=attachment.agent.fallbacks if attachment else 0,
        steps_per_s=args.steps / (time.monotonic() - start),
        q90=stats.q90, max=stats.max, frac_le_c_low=stats.frac_le_c_low)
    if telemetry is not None:
        flushed = telemetry.flush(30)
        summary["telemetry"] = telemetry.counters.to_dict()
        telemetry.close()
        if not flushed:
            print(f"telemetry not acknowledged: {telemetry.last_error}", file=sys.stderr)
            return 1
    print(f"summary: held-out accuracy {heldout:.3f}, regimes {dict(regimes)}, "
          f"fallbacks {summary['fallbacks']}, {summary['steps_per_s']:.1f} steps/s")
    if stats.count >= 20:
        c_low, c_high = gac.suggest_thresholds(stats)
        summary["suggested"] = [c_low, c_high]
        print(f"|c_t| after the warm-up: q0.9 {stats.q90:.4f}, max {stats.max:.4f} over {stats.count} steps "
              f"-> suggested c_low {c_low:.4g}, c_high {c_high:.4g}")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
