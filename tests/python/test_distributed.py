"""Sharded gradients: 2 and 4 processes, each holding a shard of every
tensor of one model, joined by a torch.distributed gloo process group on
loopback. Every rank must reach the same c_t, regime and alpha as the
unsharded computation (one gac.Agent over the whole tensors) and the fp64
reference, within 1e-6, and apply the same update; in remote mode a
decision source that fails on one rank makes every rank fall back."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

import gac
from dist_model import ALPHA_MODE, C_HIGH, C_LOW, STEPS, full_gradients, shard
from conftest import run_ranks
from gac_reference import ReferenceGac


def unsharded() -> List[Dict[str, Any]]:
    """The same steps on one process: gac.Agent and the fp64 reference."""
    agent = gac.Agent(C_LOW, C_HIGH, alpha_mode=ALPHA_MODE, num_threads=1)
    ref = ReferenceGac(C_LOW, C_HIGH, ALPHA_MODE)
    params = None
    out = []
    for step in range(1, STEPS + 1):
        grads = full_gradients(step)
        if params is None:
            params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        expected = ref.step([g.to(torch.float64) for g in grads], [g.dtype for g in grads])
        r = agent.step(step, params)
        assert r.regime == expected.regime
        if expected.cosine is not None:
            assert r.cosine == pytest.approx(expected.cosine, rel=1e-6, abs=1e-8)
        out.append(dict(regime=r.regime, cosine=r.cosine, alpha=r.alpha, grad_norm=r.grad_norm,
                        ref_norm=r.ref_norm, step_optimizer=r.step_optimizer,
                        update=[p.grad.clone() for p in params]))
    return out


@pytest.fixture(scope="module")
def whole() -> List[Dict[str, Any]]:
    return unsharded()


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_steps_match_the_unsharded_computation(tmp_path: Path, world: int,
                                                       whole: List[Dict[str, Any]]) -> None:
    ranks = run_ranks(tmp_path, world, "dist_worker.py", ["local"])
    regimes = [w["regime"] for w in whole]
    assert {"safe", "project", "skip"} <= set(regimes), regimes
    total = sum(g.numel() for g in full_gradients(1))
    for step in range(STEPS):
        w = whole[step]
        assert sum(r["reports"][step]["elements"] for r in ranks) == total
        for rank, r in enumerate(ranks):
            got = r["reports"][step]
            what = f"rank {rank} of {world}, step {step + 1}"
            assert got["regime"] == w["regime"], what
            assert got["step_optimizer"] == w["step_optimizer"], what
            if w["cosine"] is None:
                assert got["cosine"] is None, what
            else:
                assert abs(got["cosine"] - w["cosine"]) <= 1e-6 * max(abs(w["cosine"]), 1e-2), what
            for key in ("alpha", "grad_norm", "ref_norm"):
                assert got[key] == pytest.approx(w[key], rel=1e-6), f"{what}: {key}"
            for t, (mine, full) in enumerate(zip(r["updates"][step], w["update"])):
                expected = shard(full, rank, world).to(torch.float64)
                diff = (mine.to(torch.float64) - expected).abs()
                # One unit in the last place of the dtype: the coefficient comes
                # from sums added in another order.
                ulp = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[mine.dtype]
                bound = 2 * ulp * expected.abs() + 1e-30
                assert bool((diff <= bound).all()), f"{what}: tensor {t} off by {float(diff.max())}"


def test_a_fallback_on_one_rank_is_a_fallback_on_every_rank(tmp_path: Path,
                                                             whole: List[Dict[str, Any]]) -> None:
    ranks = run_ranks(tmp_path, 2, "dist_worker.py", ["remote"])
    for step in range(STEPS):
        for rank, r in enumerate(ranks):
            got = r["reports"][step]
            assert got["fallback"] == ((step + 1) % 2 == 0), f"rank {rank} step {step + 1}"
            # Fallback or not, the decision is the local controller's.
            assert got["regime"] == whole[step]["regime"]
    assert [r["fallbacks"] for r in ranks] == [STEPS // 2, STEPS // 2]
