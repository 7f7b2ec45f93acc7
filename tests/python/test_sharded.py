"""Sharded gradients under torch's own data-parallel wrappers, on Gloo
groups of CPU processes: FSDP2 (fully_shard) on 2 and 4 ranks (uneven and
empty shards), HSDP on a 2 x 2 mesh (Replicate, Shard: the replicas must be
counted once), FSDP1 with flat parameters and with use_orig_params, and
DDP (already reduced: no all-reduce). Every rank must reach the c_t and the
regime of the unsharded fp64 computation (gac_reference over the sum of
every rank's gradient) and the whole gradient's norm (replicas counted
once), and the whole gradient after GAC must be the
reference's projected gradient. Gloo's FSDP reduces by a sum or a mean
depending on the release, so the gradients are compared up to that one
scale, and c_t, a cosine, not at all."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import List, Tuple

import pytest
import torch
import torch.distributed as dist

import gac
from gac import _dist
from conftest import run_ranks
from gac_reference import ReferenceGac
from shard_model import STEPS, batch, make_model


def reference_gradients(world: int) -> List[List[torch.Tensor]]:
    """Per step, the gradient of the sum of every rank's loss, in fp64."""
    model = make_model().double()
    out = []
    for step in range(1, STEPS + 1):
        model.zero_grad(set_to_none=True)
        for rank in range(world):
            x, y = batch(step, rank)
            torch.nn.functional.mse_loss(model(x.double()), y.double()).backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def thresholds(grads: List[List[torch.Tensor]]) -> Tuple[float, float]:
    """c_low and c_high between the sorted |c_t| of the reference, so that
    safe, project and skip all occur and no c_t sits on a threshold."""
    ref = ReferenceGac(0.5, 0.9)  # the cosines do not depend on the thresholds
    steps = [ref.step(g) for g in grads]  # type: ignore[arg-type]
    cos = sorted(abs(s.cosine) for s in steps[1:] if s.cosine is not None)
    i, j = len(cos) // 3, 2 * len(cos) // 3
    return (cos[i - 1] + cos[i]) / 2, (cos[j] + cos[j + 1]) / 2


@pytest.mark.parametrize("kind, world", [("fsdp2", 2), ("fsdp2", 4), ("hsdp", 4), ("fsdp1", 2),
                                         ("fsdp1_orig", 2), ("ddp", 2)])
def test_every_rank_matches_the_unsharded_fp64_computation(tmp_path: Path, kind: str, world: int) -> None:
    grads = reference_gradients(world)
    c_low, c_high = thresholds(grads)
    ref = ReferenceGac(c_low, c_high)
    expected = [ref.step(g) for g in grads]
    assert {e.regime for e in expected[1:]} == {"safe", "project", "skip"}
    ranks = run_ranks(tmp_path, world, "shard_worker.py", [kind, repr(c_low), repr(c_high)])
    total = sum(int(p.numel()) for p in make_model().parameters())
    for rank, out in enumerate(ranks):
        for step, (r, e) in enumerate(zip(out["reports"], expected), start=1):
            assert r["regime"] == e.regime, (kind, rank, step)
            # Each element counted once: replicas (HSDP, DDP) not summed again.
            assert r["grad_norm"] == pytest.approx(r["whole_norm"], rel=1e-5), (kind, rank, step)
            if e.cosine is None:
                assert r["cosine"] is None
            else:
                assert r["cosine"] == pytest.approx(e.cosine, rel=1e-5, abs=1e-7), (kind, rank, step)
        whole = out["grads"]
        if whole[0] is None:
            continue
        # The gradient after GAC, gathered, against the reference's, up to the
        # wrapper's one scale (a sum or a mean over the ranks).
        for step, (got, e) in enumerate(zip(whole, expected), start=1):
            got64 = torch.cat([g.double().flatten() for g in got])
            want = torch.cat([g.flatten() for g in e.grads])  # type: ignore[union-attr]
            scale = float(want.norm() / got64.norm())
            assert scale == pytest.approx(1.0, rel=1e-5) or scale == pytest.approx(float(world), rel=1e-5)
            assert torch.allclose(got64 * scale, want, rtol=1e-4, atol=1e-6 * float(want.abs().max())), \
                (kind, rank, step)
    local = [out["local_elements"][0] for out in ranks]
    if kind in ("fsdp2", "fsdp1", "fsdp1_orig"):
        assert sum(local) >= total and max(local) < total  # each rank holds a part (FSDP1 pads the flat shard)
    if kind == "fsdp2" and world == 4:
        assert "Shard(dim=0)" in ranks[0]["placements"][0]
    if kind == "hsdp":
        assert "Replicate()" in ranks[0]["placements"][0] and "Shard(dim=0)" in ranks[0]["placements"][0]
        assert local[0] == local[2] and local[1] == local[3]  # the two replicas hold the same shards
    if kind == "ddp":
        assert local == [total] * world


def test_plan_reduction_of_one_mesh(tmp_path: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = torch.nn.Parameter(distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)]))
        replicated = torch.nn.Parameter(distribute_tensor(torch.randn(3), mesh, [Replicate()]))
        plain = torch.nn.Parameter(torch.randn(3))
        assert _dist.plan_reduction([sharded]).group is not None
        assert _dist.plan_reduction([replicated]) == (None, [])
        # Placements that differ between parameters (tensor parallelism): one
        # group all the same, each value counted once.
        assert _dist.plan_reduction([sharded, replicated]).uncounted == []
        with pytest.raises(ValueError, match="plain tensor beside DTensor"):
            _dist.plan_reduction([sharded, plain])
        agent = gac.Agent(0.05, 0.3)
        for p in (sharded, plain):
            p.grad = torch.ones_like(p)
        with pytest.raises(ValueError, match="plain tensor beside DTensor"):
            agent.step(1, [sharded, plain])
        # A DTensor parameter's snapshot is its local shard; a step sums it.
        agent = gac.Agent(0.05, 0.3)
        sharded.grad = distribute_tensor(torch.ones(4, 3), mesh, [Shard(0)])
        assert agent.step(1, [sharded]).grad_norm == pytest.approx(12 ** 0.5)
    finally:
        dist.destroy_process_group()
