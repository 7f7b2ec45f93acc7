#!/usr/bin/env python3
"""What counting each value once costs a step, at 2,000 parameters.

gac.Agent works out on its first step which parameters this rank counts and
over which group the sums are reduced (gac._dist.plan_reduction, from the
DTensor placements); later steps only skip the uncounted parameters in the
statistics pass. This times, in one process on a Gloo group of one rank and
a (dp 1 x tp 1) mesh, 2,000 parameters of 16 elements (the host-overhead
workload of docs/BENCHMARKS.md), half placed (Shard(0), Shard(0)) and half
(Shard(0), Replicate()) as tensor parallelism places them:

  plan      gac._dist.plan_reduction over the 2,000 parameters (once per
            agent, on its first step)
  dtensor   a monitor-mode agent.step over them (the DTensors' local shards
            read from Python, one all-reduce of 3 values over the group)
  plain     the same step over 2,000 plain tensors of 16 elements, no group:
            the baseline of the same run

Medians over the rounds, and dtensor / plain per round (median, quartiles).

    PYTHONPATH=build/python .venv/bin/python bench/layout_bench.py [--rounds N]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from typing import List

import torch
import torch.distributed as dist

import gac
from gac import _dist

TENSORS, ELEMENTS = 2000, 16


def median_ms(xs: List[float]) -> str:
    return f"{1e3 * statistics.median(xs):.3f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60))
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Replicate, Shard, distribute_tensor

            mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
            placements = [[Shard(0), Shard(0)], [Shard(0), Replicate()]]
            dtensors = [torch.nn.Parameter(distribute_tensor(torch.zeros(ELEMENTS), mesh, placements[i % 2]))
                        for i in range(TENSORS)]
            plain = [torch.nn.Parameter(torch.zeros(ELEMENTS)) for _ in range(TENSORS)]
            for p in dtensors:
                p.grad = distribute_tensor(torch.randn(ELEMENTS), mesh, placements[0])
            for p in plain:
                p.grad = torch.randn(ELEMENTS)
            plan = []
            for _ in range(max(args.rounds // 10, 5)):
                t0 = time.perf_counter()
                _dist.plan_reduction(dtensors)
                plan.append(time.perf_counter() - t0)
            agents = {"dtensor": gac.Agent(mode="monitor", num_threads=1),
                      "plain": gac.Agent(mode="monitor", num_threads=1)}
            params = {"dtensor": dtensors, "plain": plain}
            times = {k: [] for k in agents}
            for step in range(1, args.rounds + 3):
                for k in ("dtensor", "plain") if step % 2 else ("plain", "dtensor"):
                    t0 = time.perf_counter()
                    agents[k].step(step, params[k])
                    if step > 2:
                        times[k].append(time.perf_counter() - t0)
            ratios = [a / b for a, b in zip(times["dtensor"], times["plain"])]
            q = statistics.quantiles(ratios, n=4)
            print(f"layout_bench: torch {torch.__version__}, {TENSORS} x {ELEMENTS}, {args.rounds} rounds")
            print(f"plan_reduction (once per agent): {median_ms(plan)}")
            print(f"step over DTensors: {median_ms(times['dtensor'])}; over plain tensors: {median_ms(times['plain'])}; "
                  f"ratio {statistics.median(ratios):.3f} [{q[0]:.3f}, {q[2]:.3f}]")
        finally:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
