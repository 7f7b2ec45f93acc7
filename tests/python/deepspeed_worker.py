"""One rank of test_deepspeed.py: a small model trained by a real DeepSpeed
engine (ZeRO stage 1, 2, 2 with the optimizer offloaded, or 3; fp32;
torch.optim.AdamW) on a Gloo group of CPU processes, with gac.attach(engine,
control=True). Each step, before the engine steps, an fp64 copy of the
engine's current weights recomputes this rank's gradient, all-reduced (mean)
into the whole gradient; the gradient the wrapped AdamW then steps with is
gathered from every rank's partition; the weights, the fp32 master
partition and AdamW's state are compared before and after the step.

usage: deepspeed_worker.py RANK WORLD INIT_FILE OUT_FILE KIND C_LOW C_HIGH
KIND: zero1 | zero2 | zero2_offload | zero3
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import os
import sys
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

import gac
from deepspeed_model import STEPS, batch, make_model


def state_tensors(optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
    out = []
    for state in optimizer.state.values():
        for v in state.values():
            out.append(v.detach().clone() if torch.is_tensor(v) else torch.tensor(float(v)))
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same(a: List[torch.Tensor], b: List[torch.Tensor]) -> bool:
    """The same bits: ZeRO-3 leaves the padding of the last rank's partition
    uninitialised (torch.empty), and a NaN there is unequal to itself."""
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(bits(x), bits(y))
                                    for x, y in zip(a, b))


def main() -> None:
    rank, world, init_file, out_file, kind = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                              sys.argv[5])
    c_low, c_high = float(sys.argv[6]), float(sys.argv[7])
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    import deepspeed
    import deepspeed.ops
    # DeepSpeed's CPU communication would otherwise compile its shared-memory op (for
    # inference all-reduces only) with the C++ compiler on first use; Gloo does the rest.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    stage = 3 if kind == "zero3" else (1 if kind == "zero1" else 2)
    config: Dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 9,
        "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": {"stage": stage}}
    if kind == "zero2_offload":
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    model = make_model()
    reference_model = copy.deepcopy(model).double()
    client = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    engine, zero, _, _ = deepspeed.initialize(model=model, optimizer=client, config=config)
    params = list(engine.module.parameters())

    # An agent without the data-parallel group: refused, the step left as it was.
    refused = ""
    try:
        gac.attach(engine, agent=gac.Agent(c_low, c_high))
    except ValueError as e:
        refused = str(e)
    assert "step" not in vars(zero), "a refused attach changed the ZeRO optimizer's step"

    attachment = gac.attach(engine, control=True, c_low=c_low, c_high=c_high)
    group = attachment.agent.process_group  # the ZeRO optimizer's data-parallel group

    inner = zero.optimizer  # the AdamW the ZeRO optimizer steps on its fp32 partitions
    seen: List[torch.Tensor] = []
    own_step = inner.step

    def spy_step(*args: Any, **kwargs: Any) -> Any:
        for g in inner.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    seen.append(p.grad.detach().double().clone())
        return own_step(*args, **kwargs)

    inner.step = spy_step

    def whole_params() -> List[torch.Tensor]:
        ctx = deepspeed.zero.GatheredParameters(params) if stage == 3 else contextlib.nullcontext()
        with ctx:
            return [p.detach().double().clone() for p in params]

    def master() -> List[torch.Tensor]:
        flats = zero.fp32_partitioned_groups_flat if stage == 3 else zero.single_partition_of_fp32_groups
        return [t.detach().clone() for t in flats]

    def gathered_seen() -> Optional[List[torch.Tensor]]:
        # This rank's flat fp32 partition(s) of the gradient, gathered into whole tensors.
        if not seen:
            return None
        flat = torch.cat(seen)
        parts = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(parts, flat, group=group)
        numels = [int(getattr(p, "ds_numel", p.numel())) for p in params]
        out: List[torch.Tensor] = []
        if stage == 3:  # each parameter's partition: ceil(numel / world) elements, padded on the last rank
            at = 0
            for p, n in zip(params, numels):
                size = -(-n // world)
                whole = torch.cat([part[at:at + size] for part in parts])[:n]
                out.append(whole.view(getattr(p, "ds_shape", p.shape)))
                at += size
        else:  # one flat buffer split in equal partitions, the last padded
            whole = torch.cat(parts)
            at = 0
            for p, n in zip(params, numels):
                out.append(whole[at:at + n].view(p.shape))
                at += n
        return out

    steps = []
    for step in range(1, STEPS + 1):
        x, y = batch(step, rank)
        weights = whole_params()
        with torch.no_grad():
            for r, w in zip(reference_model.parameters(), weights):
                r.copy_(w)
        reference_model.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(reference_model(x.double()), y.double()).backward()
        whole = [p.grad.detach().clone() for p in reference_model.parameters()]
        for g in whole:
            dist.all_reduce(g, group=group)
            g.div_(world)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        state_before, master_before, skipped_before = state_tensors(inner), master(), engine.skipped_steps
        seen.clear()
        engine.step()
        r = attachment.last_report
        steps.append({
            "regime": r.regime, "cosine": r.cosine, "grad_norm": r.grad_norm, "step_optimizer": r.step_optimizer,
            "whole": whole, "seen": gathered_seen(),
            "weights_unchanged": same(weights, whole_params()),
            "master_unchanged": same(master_before, master()),
            "state_unchanged": same(state_before, state_tensors(inner)),
            "engine_skipped": engine.skipped_steps - skipped_before,
        })
    torch.save({"steps": steps, "refused": refused, "group_size": dist.get_world_size(group),
                "zero": type(zero).__name__, "skipped": attachment.skipped, "deepspeed": deepspeed.__version__}, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
