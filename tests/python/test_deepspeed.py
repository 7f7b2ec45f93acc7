"""gac.attach on a real DeepSpeed engine: ZeRO stages 1, 2 (also with the
optimizer offloaded to the CPU) and 3, fp32, two CPU processes on Gloo
(DeepSpeed's CPU accelerator), GAC in control (local mode).

Each rank's GAC step sees only its partition of the gradient; every rank
must reach the c_t, the regime and the whole gradient's norm of an fp64
computation (gac_reference) over the whole gradient, recomputed by the
worker from the engine's current weights and gathered over the ranks; the
gradient AdamW steps with, gathered from the partitions, must be the
reference's gradient after GAC (projected where it projects); a skipped
update must leave the weights, the fp32 master partition and AdamW's state
unchanged, and the engine must count it as skipped.

Skipped when deepspeed is not installed (it is not a dependency of gac).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import deepspeed  # noqa: F401  (requirements.txt; the workers run it on the CPU: DS_ACCELERATOR=cpu, Gloo)
from conftest import run_ranks
from gac_reference import ReferenceGac

C_LOW, C_HIGH = 0.3, 0.8  # between the |c_t| of deepspeed_model's batches: every regime occurs
WORLD = 2


@pytest.mark.parametrize("kind, zero", [("zero1", "DeepSpeedZeroOptimizer"), ("zero2", "DeepSpeedZeroOptimizer"),
                                        ("zero2_offload", "DeepSpeedZeroOptimizer"),
                                        ("zero3", "DeepSpeedZeroOptimizer_Stage3")])
def test_every_rank_matches_the_whole_fp64_gradient(tmp_path: Path, kind: str, zero: str) -> None:
    ranks = run_ranks(tmp_path, WORLD, "deepspeed_worker.py", [kind, repr(C_LOW), repr(C_HIGH)],
                      env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    # The whole gradient is the same on every rank (an all-reduce); the reference runs on it.
    wholes = [s["whole"] for s in ranks[0]["steps"]]
    for out in ranks[1:]:
        for a, b in zip(wholes, (s["whole"] for s in out["steps"])):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
    ref = ReferenceGac(C_LOW, C_HIGH)
    expected = [ref.step(g) for g in wholes]
    assert {e.regime for e in expected} == {"safe", "project", "skip"}
    for rank, out in enumerate(ranks):
        assert out["zero"] == zero and out["group_size"] == WORLD
        assert "no process_group" in out["refused"]  # an agent without the group: refused, nothing changed
        assert out["skipped"] == sum(e.regime == "skip" for e in expected)
        for step, (s, e) in enumerate(zip(out["steps"], expected), start=1):
            where = (kind, rank, step)
            assert s["regime"] == e.regime, where
            assert s["step_optimizer"] == (e.regime != "skip"), where
            whole = torch.cat([g.flatten() for g in s["whole"]])
            assert s["grad_norm"] == pytest.approx(float(whole.norm()), rel=1e-5), where  # each element once
            if e.cosine is None:
                assert s["cosine"] is None, where
            else:
                assert s["cosine"] == pytest.approx(e.cosine, rel=1e-5, abs=1e-7), where
            if e.regime == "skip":
                assert s["seen"] is None, where  # AdamW did not step
                assert s["weights_unchanged"] and s["master_unchanged"] and s["state_unchanged"], where
                assert s["engine_skipped"] == 1, where
                continue
            assert not (s["weights_unchanged"] or s["master_unchanged"] or s["state_unchanged"]), where
            assert s["engine_skipped"] == 0, where
            # What AdamW stepped with, gathered: the reference's gradient after GAC.
            got = torch.cat([g.flatten() for g in s["seen"]])
            want = torch.cat([g.flatten() for g in e.grads])  # type: ignore[union-attr]
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max())), where
