#!/usr/bin/env python3
"""gac.rl.signals' cost on 1 M tokens against the loss whose tensors it reads,
in one process.

The batch: B = 256 sequences of T = 4096 tokens (1,048,576 positions),
bf16 log-probabilities of the learner (a leaf that requires grad) and of
the behaviour policy, a right-padded mask of lengths uniform in [T/4, T]
(about 62% of the positions), one fp32 advantage per sequence, each
sequence's policy version. The loss: GRPO's clipped surrogate, written
here from its definition as TRL and verl compute it (ratio exp(lp - old)
in fp32, -min(r A, clip(r, 1 - 0.2, 1 + 0.28) A), each sequence's mean
over its tokens, the batch's mean), forward and backward. The signals:
gac.rl.signals with the advantages, clip 0.2/0.28, truncation 2 and the
versions; then the same with bf16 per-token entropies given, and with bf16
logits of V entries (the entropy computed from them), compared also with
the log-softmax of those logits that gives the log-probabilities (per
sequence, in bf16, as TRL's selective_log_softmax does for bf16; forward
and backward), the computation a trainer runs before its loss.

Each round times each computation once, in a rotating order; the figures
are medians over rounds of the per-round ratio to the loss (the machine's
speed drifts; a round's computations are back to back), with the
quartiles, and the median times.

    .venv/bin/python bench/rl_bench.py [--rounds N] [--vocab V] [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch

import gac.rl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=1024, help="V of the logits (0: no logits)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=4096, help="T")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="small sizes, few rounds (smoke test)")
    args = ap.parse_args()
    if args.quick:
        args.batch, args.tokens, args.vocab, args.rounds = 16, 256, 64, 3
    dev = torch.device(args.device)
    b_size, t_size, v_size = args.batch, args.tokens, args.vocab
    g = torch.Generator().manual_seed(0)
    old = (-6 * torch.rand(b_size, t_size, generator=g)).to(torch.bfloat16)
    lp = (old.float() + 0.1 * torch.randn(b_size, t_size, generator=g)).to(torch.bfloat16)
    lengths = torch.randint(t_size // 4, t_size + 1, (b_size,), generator=g)
    mask = torch.arange(t_size)[None, :] < lengths[:, None]
    adv = torch.randn(b_size, generator=g)
    versions = torch.randint(90, 101, (b_size,), generator=g)
    entropies = (3 * torch.rand(b_size, t_size, generator=g)).to(torch.bfloat16)
    lp, old, mask, adv, versions, entropies = (t.to(dev) for t in (lp, old, mask, adv, versions, entropies))
    lp.requires_grad_()
    logits = None
    ids = None
    if v_size:
        logits = (2 * torch.randn(b_size, t_size, v_size, generator=g)).to(torch.bfloat16).to(dev)
        logits.requires_grad_()
        ids = torch.randint(0, v_size, (b_size, t_size, 1), generator=g).to(dev)
    eps_low, eps_high = 0.2, 0.28

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def loss() -> None:
        lp.grad = None
        ratio = torch.exp(lp.float() - old.float())
        a = adv[:, None]
        per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)
        m = mask.float()
        ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean().backward()

    common = dict(advantages=adv, clip_low=eps_low, clip_high=eps_high, truncation=2.0, versions=versions,
                  current_version=100)

    def signals() -> None:
        gac.rl.signals(lp, old, mask, **common)  # type: ignore[arg-type]

    def signals_entropies() -> None:
        gac.rl.signals(lp, old, mask, entropies=entropies, **common)  # type: ignore[arg-type]

    def signals_logits() -> None:
        gac.rl.signals(lp, old, mask, logits=logits, **common)  # type: ignore[arg-type]

    def log_softmax() -> None:
        assert logits is not None and ids is not None
        logits.grad = None
        # Row by row through unbind (as iterating over the tensor does): one backward node for all rows.
        rows = [torch.log_softmax(row, -1).gather(-1, i).squeeze(-1)
                for row, i in zip(logits.unbind(0), ids.unbind(0))]
        torch.stack(rows).float().sum().backward()

    work: Dict[str, Callable[[], None]] = {"loss": loss, "signals": signals, "signals+entropies": signals_entropies}
    if v_size:
        work["signals+logits"] = signals_logits
        work["log_softmax"] = log_softmax
    names = list(work)
    seconds: Dict[str, List[float]] = {k: [] for k in names}
    for name in names:                            # warm-up
        work[name]()
    sync()
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            sync()
            t0 = time.perf_counter()
            work[name]()
            sync()
            seconds[name].append(time.perf_counter() - t0)
    n_tokens = int(mask.sum())
    print(f"gac.rl.signals on B={b_size} x T={t_size} = {b_size * t_size:,} positions ({n_tokens:,} masked tokens), "
          f"bf16 log-probs, V={v_size}; device {dev}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds")
    print(f"  {'computation':22s} {'median ms':>10s}  {'/ loss: median [q25, q75]':>28s}")
    for name in names:
        ratios = [s / base for s, base in zip(seconds[name], seconds["loss"])]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        print(f"  {name:22s} {1e3 * statistics.median(seconds[name]):10.1f}  "
              f"{statistics.median(ratios):12.2f} [{q[0]:.2f}, {q[2]:.2f}]")
    if v_size:
        ratios = [s / base for s, base in zip(seconds["signals+logits"], seconds["log_softmax"])]
        print(f"  signals+logits / log_softmax: {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
