"""One rank of test_tp_fsdp.py: torchtitan's 2-D recipe (tp_fsdp_model.py:
tensor and sequence parallelism on the "tp" dimension of a (dp 2 x tp 2)
DeviceMesh, then fully_shard on "dp") on a Gloo group of 4 CPU processes,
and gac.Agent with no option but the mode stepping over
model.parameters() after each real forward and backward. Saves per step
the report, the gradients' placements and, in local mode, the full
gradients after the step (gathered).

usage: tp_fsdp_worker.py RANK WORLD INIT_FILE OUT_FILE MODE
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, Dict

import torch
import torch.distributed as dist

import gac
from tp_fsdp_model import DP, STEPS, TP, apply_fsdp, apply_tp, batch, loss_of, make_model


def main() -> None:
    rank, world, init_file, out_file, mode = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                              sys.argv[5])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    model = make_model()
    apply_tp(model, mesh["tp"])
    apply_fsdp(model, mesh["dp"])
    params = list(model.parameters())
    agent = gac.Agent(mode=mode)
    replica = mesh.get_local_rank("dp")
    out: Dict[str, Any] = {"reports": [], "full": [], "placements": None}
    for step in range(1, STEPS + 1):
        model.zero_grad(set_to_none=True)
        tokens, targets = batch(step, replica)
        loss_of(model(tokens), targets).backward()
        if out["placements"] is None:
            out["placements"] = {n: str(p.grad.placements) for n, p in model.named_parameters()}
        r = agent.step(step, params)
        out["reports"].append(dict(regime=r.regime, cosine=r.cosine, grad_norm=r.grad_norm, ref_norm=r.ref_norm,
                                   elements=r.elements))
        if mode == "local":
            out["full"].append({n: p.grad.full_tensor().detach().clone() for n, p in model.named_parameters()})
    torch.save(out, out_file)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
