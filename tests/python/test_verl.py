"""gac.integrations.verl as verl resolves it. verl itself (Ray, vLLM or
SGLang, Hydra, its FSDP workers) is too heavy for this suite, so
`verl_build_optimizer` below does what verl's `build_optimizer` does
(verl/workers/config/optimizer.py, verl 0.8.0.dev at git b178a3c): import
the module `optim.optimizer_impl`, take the class named `optim.optimizer`,
call it with the parameters, lr, weight_decay, betas for Adam-like names
and the entries of `override_optimizer_config`; and `actor_update` does
what DataParallelPPOActor._optimizer_step does (clip, then step).

Checked: with only optimizer_impl set, the run is bit-for-bit torch's
AdamW (GAC observes); with gac_control a skip leaves the weights and the
AdamW state unchanged while verl's LR scheduler advances, and each c_t
matches fp64 from the clipped gradients; AdamW's own options pass through;
the step count survives a checkpoint; reports reach gacd; bad options
raise before anything is made."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch

import gac
from conftest import Gacd


def verl_build_optimizer(parameters: Any, optim: Dict[str, Any]) -> Any:
    kwargs: Dict[str, Any] = {"lr": optim["lr"], "weight_decay": optim["weight_decay"]}
    if "adam" in optim["optimizer"].lower():
        kwargs["betas"] = optim["betas"]
    kwargs.update(optim.get("override_optimizer_config") or {})
    cls = getattr(importlib.import_module(optim["optimizer_impl"]), optim["optimizer"])
    return cls(parameters, **kwargs)


def optim_config(impl: str = "gac.integrations.verl", override: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    # verl's optim/fsdp.yaml defaults, with the one setting changed.
    return {"optimizer": "AdamW", "optimizer_impl": impl, "lr": 1e-2, "weight_decay": 0.01, "betas": [0.9, 0.999],
            "override_optimizer_config": override}


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def actor_update(model: torch.nn.Module, optimizer: Any, step: int) -> List[torch.Tensor]:
    """One mini-batch update as verl's actor makes it; returns the gradients the optimizer is handed."""
    gen = torch.Generator().manual_seed(100 + step)
    optimizer.zero_grad()
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 2, generator=gen)
    torch.nn.functional.mse_loss(model(x), y).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    assert torch.isfinite(grad_norm)
    grads = [p.grad.detach().double().clone() for p in model.parameters()]  # type: ignore[union-attr]
    optimizer.step()
    return grads


def test_the_one_setting_observes_and_changes_nothing() -> None:
    plain_model, gac_model = make_model(), make_model()
    plain = verl_build_optimizer(plain_model.parameters(), optim_config("torch.optim"))
    gated = verl_build_optimizer(gac_model.parameters(), optim_config())
    assert type(gated).__module__ == "gac.integrations.verl" and isinstance(gated, torch.optim.AdamW)
    assert gated.gac.agent.mode == "monitor"
    assert gated.param_groups[0]["betas"] == (0.9, 0.999) and gated.param_groups[0]["weight_decay"] == 0.01
    for step in range(1, 6):
        actor_update(plain_model, plain, step)
        actor_update(gac_model, gated, step)
    assert gated.gac.reports == 5 and gated.gac.last_report.step == 5
    for a, b in zip(plain_model.parameters(), gac_model.parameters()):
        assert torch.equal(a, b)


def test_the_windowed_trigger_is_an_option() -> None:
    model = make_model()
    opt = verl_build_optimizer(model.parameters(), optim_config(override={
        "gac_control": True, "gac_trigger": "window", "gac_window": 4, "gac_window_c_low": 0.1,
        "gac_window_c_high": 0.4}))
    agent = opt.gac.agent
    assert (agent.mode, agent.trigger, agent.window, agent.window_c_low, agent.window_c_high) == (
        "local", "window", 4, 0.1, 0.4)
    for step in range(1, 4):
        actor_update(model, opt, step)
        assert opt.gac.last_report.regime == "safe" and opt.gac.last_report.window_mean is None


def test_control_skips_and_the_scheduler_still_advances() -> None:
    model = make_model()
    opt = verl_build_optimizer(model.parameters(), optim_config(override={
        "gac_control": True, "gac_c_low": 0.2, "gac_c_high": 0.5, "gac_alpha_mode": "exact", "eps": 1e-6}))
    assert opt.param_groups[0]["eps"] == 1e-6  # AdamW's own options pass through
    assert (opt.gac.agent.mode, opt.gac.agent.c_low, opt.gac.agent.alpha_mode) == ("local", 0.2, "exact")
    # verl's constant schedule with warm-up, made after the optimizer (it wraps optimizer.step again).
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    controller = gac.Controller(0.2, 0.5, "exact")
    prev: Optional[List[torch.Tensor]] = None
    regimes = []
    for step in range(1, 13):
        params = [p.detach().clone() for p in model.parameters()]
        adam = {id(p): float(s["step"]) for p, s in opt.state.items()}
        g = actor_update(model, opt, step)
        sched.step()
        r = opt.gac.last_report
        assert r.step == step and sched.last_epoch == step
        if prev is not None:
            dot = sum(float((a * b).sum()) for a, b in zip(g, prev))
            gg, pp = sum(float((a * a).sum()) for a in g), sum(float((b * b).sum()) for b in prev)
            assert r.cosine == pytest.approx(dot / math.sqrt(gg * pp), rel=1e-6, abs=1e-9)
            assert r.regime == controller.decide(dot, gg, pp).regime
        unchanged = all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
        assert unchanged == (r.regime == "skip")
        if r.regime == "skip":
            assert {id(p): float(s["step"]) for p, s in opt.state.items()} == adam
        regimes.append(r.regime)
        prev = g
    assert "skip" in regimes and "safe" in regimes, regimes


def test_the_step_count_survives_a_checkpoint() -> None:
    model = make_model()
    opt = verl_build_optimizer(model.parameters(), optim_config(override={"gac_control": True}))
    for step in range(1, 4):
        actor_update(model, opt, step)
    saved = opt.state_dict()
    assert saved["gac"] == {"step": 3}
    resumed = verl_build_optimizer(model.parameters(), optim_config(override={"gac_control": True}))
    resumed.load_state_dict(saved)
    assert resumed.gac.step == 3 and resumed.state_dict()["state"].keys() == saved["state"].keys()
    actor_update(model, resumed, 4)
    assert resumed.gac.last_report.step == 4
    # The checkpoint loads into torch's AdamW (GAC turned off), and torch's into the gated one.
    plain = torch.optim.AdamW(model.parameters())
    plain.load_state_dict(saved)
    again = verl_build_optimizer(model.parameters(), optim_config())
    again.load_state_dict(plain.state_dict())
    assert again.gac.step == 0


def test_reports_reach_gacd(gacd: Gacd, tmp_path: Path) -> None:
    model = make_model()
    opt = verl_build_optimizer(model.parameters(), optim_config(override={
        "gac_address": gacd.address, "gac_run": "verl-actor", "gac_spool_dir": str(tmp_path / "spool")}))
    reports = []
    for step in range(1, 5):
        actor_update(model, opt, step)
        reports.append(opt.gac.last_report)
    assert opt.gac.telemetry.flush(30)
    opt.gac.telemetry.close()
    stored = {int(r["step"]): r for r in gacd.steps("verl-actor")}
    assert sorted(stored) == [1, 2, 3, 4]
    for r in reports:
        assert stored[r.step]["mode"] == "CONTROL_MODE_MONITOR"
        assert float(stored[r.step]["grad_norm"]) == pytest.approx(r.grad_norm, rel=1e-12)


@pytest.mark.parametrize("override, error, match", [
    ({"gac_contrl": True}, TypeError, "unknown option.*gac_contrl"),
    ({"gac_c_low": 2.0}, ValueError, "c_low"),
    ({"gac_trigger": "mean"}, ValueError, "trigger must be"),
    ({"gac_window": 0}, ValueError, "window must be in"),
    ({"gac_control": "yes"}, TypeError, "control must be a bool"),
    ({"gac_warmup": 5}, ValueError, "at least 21"),
    ({"gac_mode": "remote"}, ValueError, "gac_mode='remote' needs gac_address"),
    ({"gac_run": "r"}, ValueError, "gac_run needs gac_address"),
    ({"gac_all_ranks": "yes"}, TypeError, "gac_all_ranks must be a bool"),
    ({"gac_address": "127.0.0.1:7070"}, ValueError, "gac_address needs gac_run"),
    ({"gac_address": "127.0.0.1:7070", "gac_run": "bad run!"}, ValueError, "run"),
    ({"lr": -1.0}, ValueError, "learning rate"),
    ({"gac_policy_loss": "gac"}, ValueError, "gac_policy_loss must name the verl policy loss"),
    ({"gac_policy_loss": 3}, ValueError, "gac_policy_loss must name the verl policy loss"),
])
def test_bad_options(override: Dict[str, Any], error: type, match: str) -> None:
    model = make_model()
    before = [p.detach().clone() for p in model.parameters()]
    config = optim_config(override=override)
    if "lr" in override:
        config["lr"] = override.pop("lr")
    with pytest.raises(error, match=match):
        verl_build_optimizer(model.parameters(), config)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
