#!/usr/bin/env python3
"""The spike guard's cost: gac.Agent.step with the guard on (z-score of |g|
and of the loss over 128 steps, and max_grad_norm) against the same agent
without it, on the same gradients, in one process.

The guard reads the norm the statistics pass already has (no pass over the
gradients of its own): its cost is a z-score over at most 128 held values
on the host. Each round restores the gradients untimed and times one step
of each agent, in alternating order; the figures are medians over rounds of
the per-round ratio on/off (the machine's speed drifts; a round's two steps
are back to back), with the quartiles, of the C++ step's own time
(StepReport.agent_overhead_seconds) and of the call's wall time. Both
agents are in monitor mode, so every step does the same work whatever the
guard says (the gradients are two alternating sets; no step is a spike).

    .venv/bin/python bench/spike_guard_bench.py [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, List

import torch

import gac


def run(tensors: int, elements: int, rounds: int) -> Dict[str, List[float]]:
    gen = torch.Generator().manual_seed(0)
    per = max(1, elements // tensors)
    params = [torch.nn.Parameter(torch.zeros(per)) for _ in range(tensors)]
    sets = [[torch.randn(per, generator=gen) for _ in params] for _ in range(2)]
    off = gac.Agent(mode="monitor")
    on = gac.Agent(mode="monitor", spike_sigma=6, spike_window=128, max_grad_norm=1e12)
    out: Dict[str, List[float]] = {"cpp": [], "wall": []}
    step = 0
    for r in range(rounds + 20):  # 20 untimed: both guards' windows fill past their warm-up
        times = {}
        for agent in ((off, on) if r % 2 == 0 else (on, off)):
            step += 1
            for p, g in zip(params, sets[step % 2]):
                p.grad = g.clone()
            t0 = time.perf_counter()
            report = agent.step(step, params, loss=0.5 + 0.01 * (step % 3))
            wall = time.perf_counter() - t0
            assert report.regime != "spike"
            times[agent is on] = (report.agent_overhead_seconds, wall)
        if r >= 20:
            out["cpp"].append(times[True][0] / times[False][0])
            out["wall"].append(times[True][1] / times[False][1])
    assert on.spike_window == 128
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="small sizes, few rounds (smoke test)")
    args = ap.parse_args()
    rounds = 10 if args.quick else args.rounds
    workloads = [("1 M parameters in 20 tensors", 20, 1 << 20), ("200 k parameters in 2,000 tensors", 2000, 200_000)]
    if not args.quick:
        workloads.insert(0, ("20 M parameters in 200 tensors", 200, 20 << 20))
    print(f"spike guard on / off, gac.Agent.step in monitor mode, {rounds} rounds (median [q25, q75] of per-round ratios)")
    for name, tensors, elements in workloads:
        r = run(tensors, elements, rounds)
        q = {k: statistics.quantiles(v, n=4) for k, v in r.items()}
        print(f"  {name:36s} C++ step {statistics.median(r['cpp']):.3f} [{q['cpp'][0]:.3f}, {q['cpp'][2]:.3f}]"
              f"   call {statistics.median(r['wall']):.3f} [{q['wall'][0]:.3f}, {q['wall'][2]:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
