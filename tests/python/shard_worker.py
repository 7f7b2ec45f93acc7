"""One rank of test_sharded.py: a small model wrapped by a real data-parallel
wrapper of torch (FSDP2 fully_shard, HSDP, FSDP1, DDP) on a Gloo group of
CPU processes. Each step: a batch of this rank's own, backward (the wrapper
reduces and shards the gradients), gac.Agent.step in local mode over
model.parameters(), then the whole (gathered) gradient after GAC. The
parameters never move, so the gradients do not depend on GAC's decisions
and the test can recompute every step unsharded in fp64.

usage: shard_worker.py RANK WORLD INIT_FILE OUT_FILE KIND C_LOW C_HIGH
KIND: fsdp2 | hsdp | fsdp1 | fsdp1_orig | ddp
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, List, Optional

import torch
import torch.distributed as dist

import gac
from shard_model import STEPS, batch, make_model


def gathered(kind: str, model: Any) -> Optional[List[torch.Tensor]]:
    """The whole gradient of every parameter, on every rank."""
    if kind in ("fsdp2", "hsdp"):
        return [p.grad.full_tensor().detach().clone() for p in model.parameters()]
    if kind == "ddp":
        return [p.grad.detach().clone() for p in model.parameters()]
    if kind == "fsdp1_orig":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        with FSDP.summon_full_params(model, with_grads=True):
            return [p.grad.detach().clone() for p in model.parameters()]
    return None  # FSDP1's flat parameters: compared by the reports only


def main() -> None:
    rank, world, init_file, out_file, kind = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                              sys.argv[5])
    c_low, c_high = float(sys.argv[6]), float(sys.argv[7])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    model = make_model()
    group = None
    if kind in ("fsdp2", "hsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = (init_device_mesh("cpu", (world,)) if kind == "fsdp2"
                else init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard")))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif kind in ("fsdp1", "fsdp1_orig"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, use_orig_params=kind == "fsdp1_orig", device_id=torch.device("cpu"))
        group = dist.group.WORLD  # plain tensors: gac is told the group
    elif kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    agent = gac.Agent(c_low, c_high, process_group=group, num_threads=1)
    params = list(model.parameters())
    reports, grads, locals_ = [], [], []
    for step in range(1, STEPS + 1):
        model.zero_grad(set_to_none=True)
        x, y = batch(step, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        # The whole gradient's norm, as the wrapper sees it (FSDP1's own
        # clip_grad_norm_ for its flat shards, which leaves them unchanged at
        # an infinite bound).
        raw = gathered(kind, model)
        norm = (float(torch.stack([g.double().pow(2).sum() for g in raw]).sum().sqrt()) if raw is not None
                else float(model.clip_grad_norm_(float("inf"))))
        r = agent.step(step, params)
        reports.append(dict(regime=r.regime, cosine=r.cosine, grad_norm=r.grad_norm, whole_norm=norm,
                            elements=r.elements, tensors=r.tensors))
        grads.append(gathered(kind, model))
        locals_.append(sum(int(p.grad.numel()) if p.grad is not None and not hasattr(p.grad, "to_local")
                           else int(p.grad.to_local().numel()) if p.grad is not None else 0 for p in params))
    torch.save(dict(reports=reports, grads=grads, local_elements=locals_,
                    placements=[str(getattr(p, "placements", "")) for p in params]), out_file)
    # Teardown in order: every rank done with the group, the agent (which
    # holds the group's backend for its all-reduce) gone, then the group. A
    # rank that tore its backend down while the other still used it aborted
    # ("terminate called without an active exception") on a loaded machine.
    dist.barrier()
    del agent, model, params
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
