"""torchtitan's 2-D recipe on 4 Gloo CPU ranks (tp_fsdp_model.py,
tp_fsdp_worker.py): tensor and sequence parallelism by torch's
parallelize_module (ColwiseParallel, RowwiseParallel, SequenceParallel, as
torchtitan's apply_tp) on the "tp" dimension of a (dp 2 x tp 2) DeviceMesh,
then fully_shard on "dp"; real forwards and backwards; gac.Agent with no
option but the mode. Every rank's c_t, ‖g‖, ‖p‖ and regime equal fp64 over
the unsharded model's gradient (a single process, the same weights and
batches), each value counted once; in local mode the full gradient after
the step is the fp64 projection."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import run_ranks
from gac_reference import ReferenceGac, check_rank_report
from tp_fsdp_model import STEPS, full_gradients, names

WORLD = 4


@pytest.mark.parametrize("mode", ["monitor", "local"])
def test_every_rank_matches_fp64_over_the_unsharded_model(tmp_path: Path, mode: str) -> None:
    ranks = run_ranks(tmp_path, WORLD, "tp_fsdp_worker.py", [mode])
    order = names()
    # FSDP's dp shard composed with tensor parallelism: torch's strided shard on dp, Shard on tp.
    placements = ranks[0]["placements"]
    assert placements["layers.0.feed_forward.w1.weight"] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    assert placements["layers.0.feed_forward.w2.weight"] == "(Shard(dim=0), Shard(dim=1))"
    assert placements["layers.0.ffn_norm.weight"] == "(Shard(dim=0), Replicate())"
    ref = ReferenceGac(0.05, 0.3, mode=mode)
    regimes = []
    for step in range(1, STEPS + 1):
        full = full_gradients(step)
        e = ref.step([full[n] for n in order])
        regimes.append(e.regime)
        for rank, out in enumerate(ranks):
            r = out["reports"][step - 1]
            where = f"{mode} rank {rank} step {step}"
            check_rank_report(r, e, where)
            if mode == "local":
                for n, want in zip(order, e.grads):
                    got = out["full"][step - 1][n].double()
                    error = float((got - want).abs().max())
                    assert error <= 1e-6 * float(want.abs().max()), (where, n, error)
    assert {"safe", "project", "skip"} <= set(regimes), regimes
