#!/usr/bin/env python3
"""The Python host overhead of gac.Agent.step, one build against another.

Times agent.step on 2,000 parameters of 16 fp32 elements (local mode, the
gradients alternating between two sets so that every step decides on a real
cosine), one process per build, the builds alternating, and prints each
process's median per-step time and the per-pair ratio B / A. This is the
2,000 x 16 case of bench/python_agent_bench.py reduced to the call itself,
for comparing two commits on the same machine (its absolute figure moves
with the machine; the per-pair ratio is the measure).

  python bench/python_host_ab.py --a OLD/build/python --b NEW/build/python [--pairs 8] [--steps 2500]

Each PATH is a staged package directory (a build's build/python). A
process run with --child times one build and prints its median in us.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time


def child(steps: int) -> None:
    import torch
    import gac
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(16)) for _ in range(2000)]
    g1 = [torch.randn(16) for _ in params]
    g2 = [0.3 * a + torch.randn(16) for a in g1]
    agent = gac.Agent(1e-3, 1.0, num_threads=1)
    times = []
    for i in range(steps):
        for p, g in zip(params, g1 if i % 2 else g2):
            p.grad = g.clone()
        t0 = time.perf_counter()
        agent.step(i, params)
        times.append(time.perf_counter() - t0)
    print(f"{statistics.median(times[200:]) * 1e6:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", help="the first build's staged package directory (build/python)")
    ap.add_argument("--b", help="the second build's")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.steps)
        return 0
    if not args.a or not args.b or args.steps <= 200 or args.pairs < 1:
        ap.error("give --a and --b, --steps > 200 and --pairs >= 1")
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def one(path: str) -> float:
        out = subprocess.run([sys.executable, __file__, "--child", "--steps", str(args.steps)], check=True,
                             capture_output=True, text=True, env=dict(env, PYTHONPATH=path), timeout=600)
        return float(out.stdout.split()[-1])

    a, b = [], []
    for i in range(args.pairs):
        a.append(one(args.a))
        b.append(one(args.b))
        print(f"pair {i + 1}: A {a[-1]:.1f} us, B {b[-1]:.1f} us, B/A {b[-1] / a[-1]:.3f}", flush=True)
    ratios = [y / x for x, y in zip(a, b)]
    print(f"A median {statistics.median(a):.1f} us ({min(a):.1f}-{max(a):.1f}); "
          f"B median {statistics.median(b):.1f} us ({min(b):.1f}-{max(b):.1f}); "
          f"B/A per pair: median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
