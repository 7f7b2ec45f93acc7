"""c_t exact under tensor, pipeline, expert and sharded data parallelism, on
Gloo groups of 4 CPU processes (parallel_model.py has the layouts): every
rank's c_t, ‖g‖, ‖p‖ and regime equal fp64 over the full model, each value
counted once, with no option but the mode (the placements say where each
value lives; pipeline stages and plain tensors say it with process_group=
and replicated_on=); in local mode the gradients after the step are the
fp64 projection of the full gradient; the spike guard and the window see the
same global values on every rank; layouts gac cannot account for raise
before the first decision, with advice that gives the right number."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
import torch.distributed as dist

import gac
from conftest import run_ranks
from gac_reference import ReferenceGac, check_rank_report, close
from parallel_model import MODEL, STEPS, full_gradients

WORLD = 4
# What a layout needs besides the mode: pipeline stages hold other
# parameters than the mesh shows, which only the trainer knows.
NEEDS = {"pp_tp": {"process_group": "world"}}


def run(tmp_path: Path, layout: str, mode: str, **options: Any) -> List[Dict[str, Any]]:
    return run_ranks(tmp_path, WORLD, "parallel_worker.py",
                     [layout, mode, json.dumps({**NEEDS.get(layout, {}), **options})])


@pytest.mark.parametrize("mode", ["monitor", "local"])
@pytest.mark.parametrize("layout", ["dp_tp", "dp_tp_ep", "hsdp_tp", "pp_tp", "tp_plain"])
def test_every_rank_matches_fp64_over_the_full_model(tmp_path: Path, layout: str, mode: str) -> None:
    ranks = run(tmp_path, layout, mode)
    ref = ReferenceGac(0.05, 0.3, mode=mode)
    regimes = set()
    for step in range(1, STEPS + 1):
        full = full_gradients(step)
        e = ref.step([full[n].double() for n in MODEL[layout]])
        regimes.add(e.regime)
        for rank, out in enumerate(ranks):
            assert out["error"] is None, out["error"]
            r = out["reports"][step - 1]
            where = f"{layout} {mode} rank {rank} step {step}"
            check_rank_report(r, e, where)
            if mode == "local":
                # The full gradient after the step, from what this rank gathered.
                for name, got in out["full"][step - 1].items():
                    if name not in MODEL[layout]:
                        continue
                    want = e.grads[MODEL[layout].index(name)]
                    if got.shape != want.shape:  # a plain tensor: this rank's cut, compared below
                        continue
                    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6), (where, name)
    assert {"safe", "project", "skip"} <= regimes, regimes
    if layout == "tp_plain" and mode == "local":
        # Each tp rank's shard of the projected gradient, and the norm whole.
        for rank, out in enumerate(ranks):
            k = rank % 2
            for step in range(1, STEPS + 1):
                got = out["full"][step - 1]
                assert torch.allclose(got["norm"].double(), _projected(step, "norm"), rtol=1e-5, atol=1e-6)
                assert torch.allclose(got["w_col"].double(), _projected(step, "w_col").chunk(2, 0)[k], rtol=1e-5,
                                      atol=1e-6)


def _projected(step: int, name: str) -> torch.Tensor:
    ref = ReferenceGac(0.05, 0.3, mode="local")
    e = None
    for s in range(1, step + 1):
        full = full_gradients(s)
        e = ref.step([full[n].double() for n in MODEL["tp_plain"]])
    assert e is not None
    return e.grads[MODEL["tp_plain"].index(name)]


def test_the_spike_guard_and_the_window_see_the_same_global_values_on_every_rank(tmp_path: Path) -> None:
    # A bound between the steps' norms (step 5's gradient is 30 times the
    # others'), the z-score, and the windowed trigger: every rank decides
    # as one agent over the full model would.
    options = dict(max_grad_norm=100.0, spike_sigma=3.0, spike_window=4, spike_warmup=2, trigger="window", window=3)
    ranks = run(tmp_path, "dp_tp", "local", **options)
    one = gac.Agent(mode="local", num_threads=1, **options)
    params = [torch.nn.Parameter(torch.zeros(full_gradients(1)[n].shape)) for n in MODEL["dp_tp"]]
    regimes = []
    for step in range(1, STEPS + 1):
        for p, n in zip(params, MODEL["dp_tp"]):
            p.grad = full_gradients(step)[n].clone()
        want = one.step(step, params)
        regimes.append(want.regime)
        for rank, out in enumerate(ranks):
            r = out["reports"][step - 1]
            where = f"rank {rank} step {step}"
            assert r["regime"] == want.regime, where
            assert close(r["grad_norm"], want.grad_norm), where
            for key in ("window_mean", "grad_norm_z"):
                w = getattr(want, key)
                assert (r[key] is None) == (w is None), (where, key)
                if w is not None:
                    assert abs(r[key] - w) <= 1e-6 * max(1.0, abs(w)), (where, key, r[key], w)
    assert "spike" in regimes, regimes


@pytest.mark.parametrize("layout, options, message", [
    ("partial", {}, "(Partial) on mesh dimension 0: its gradient is not yet reduced"),
    ("missing", {}, "holds 2 of its 4 parts"),
    ("pp_tp", {"process_group": None}, "spans 2 of the world's 4 ranks"),
])
def test_layouts_gac_cannot_count_raise_before_the_first_decision(tmp_path: Path, layout: str,
                                                                 options: Dict[str, Any], message: str) -> None:
    ranks = run_ranks(tmp_path, WORLD, "parallel_worker.py", [layout, "local", json.dumps(options)])
    for out in ranks:
        assert out["error"] is not None and message in out["error"], out["error"]
        assert out["reports"] == []


def test_a_plain_tensor_beside_dtensors_must_say_where_it_is_replicated(tmp_path: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from gac import _dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = torch.nn.Parameter(distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)]))
        plain = torch.nn.Parameter(torch.randn(3))
        with pytest.raises(ValueError, match="plain tensor beside DTensor parameters: say which ranks hold"):
            _dist.plan_reduction([sharded, plain])
        # Said: its own part (counted), or replicated on a group (the lowest rank counts it: here this one).
        assert _dist.plan_reduction([sharded, plain], replicated_on={plain: None}).uncounted == []
        assert _dist.plan_reduction([sharded, plain], replicated_on=lambda p: dist.group.WORLD).uncounted == []
        with pytest.raises(ValueError, match="pass that group as process_group="):
            _dist.plan_reduction([plain], replicated_on={plain: dist.group.WORLD})
        with pytest.raises(TypeError, match="replicated_on must be a dict"):
            gac.Agent(replicated_on=[plain])
    finally:
        dist.destroy_process_group()
