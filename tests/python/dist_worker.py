"""One rank of the sharded-gradient test (test_distributed.py): holds a
shard of every tensor of one model, steps gac.Agent with the gloo process
group, and saves its reports and projected shards for the test to compare
with the unsharded computation.

usage: dist_worker.py RANK WORLD INIT_FILE OUT_FILE MODE
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

import gac
from dist_model import ALPHA_MODE, C_HIGH, C_LOW, STEPS, full_gradients, shard


class FailsOnRankOne(gac.DecisionSource):
    """Decides like the local controller, except on rank 1 at even steps,
    where it fails: every rank must then fall back."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.controller = gac.Controller(C_LOW, C_HIGH, ALPHA_MODE)

    def decide(self, step: int, stats: gac.AlignmentStats) -> gac.Decision:
        if self.rank == 1 and step % 2 == 0:
            raise ConnectionError("gacd unreachable from rank 1")
        return self.controller.decide(stats.dot, stats.grad_sq, stats.ref_sq, stats.has_reference)


def main() -> None:
    rank, world, init_file, out_file, mode = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                              sys.argv[5])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    source = FailsOnRankOne(rank) if mode == "remote" else None
    agent = gac.Agent(C_LOW, C_HIGH, mode=mode, alpha_mode=ALPHA_MODE, process_group=dist.group.WORLD,
                      decision_source=source, num_threads=1)
    params = None
    reports = []
    updates = []
    for step in range(1, STEPS + 1):
        grads = [shard(g, rank, world) for g in full_gradients(step)]
        if params is None:
            params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        r = agent.step(step, params)
        reports.append(dict(regime=r.regime, cosine=r.cosine, alpha=r.alpha, grad_norm=r.grad_norm,
                            ref_norm=r.ref_norm, step_optimizer=r.step_optimizer, fallback=r.fallback,
                            elements=r.elements))
        updates.append([p.grad.clone() for p in params])
    torch.save(dict(reports=reports, updates=updates, fallbacks=agent.fallbacks), out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
