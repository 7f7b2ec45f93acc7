"""The spike guard through the Python package: gac.attach on a real
optimizer, gac.Agent in each mode, the loss from a closure or a keyword.

Checked against references computed here: the z-score from the held
steps' norms, a spike's held at the bound it broke (numpy-free, fp64), the
cosine after a spike against the last accepted raw gradient (fp64), the weights and the optimizer's state bit for
bit."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
from typing import Dict, List, Optional, Tuple

import pytest
import torch

import gac
from conftest import Gacd

SPIKE_STEP = 80


def _model_and_data(seed: int) -> Tuple[torch.nn.Module, List[Tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    w = torch.randn(16, 4)
    batches = []
    for _ in range(200):
        x = torch.randn(32, 16)
        batches.append((x, x @ w + 0.1 * torch.randn(32, 4)))
    return model, batches


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().double().flatten() for p in model.parameters()])


def _state(opt: torch.optim.Optimizer) -> Dict[int, Dict[str, torch.Tensor]]:
    return {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(opt.state.values())}


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm() + 1e-8))


def _z(x: float, held: List[float], window: int) -> float:
    last = held[-window:]
    return (x - statistics.fmean(last)) / statistics.stdev(last)


def _at_bound(x: float, held: List[float], window: int, sigma: float) -> float:
    """What a spike adds to the guard's history: x clamped to mean + sigma sd of the last `window` held."""
    last = held[-window:]
    return min(x, statistics.fmean(last) + sigma * statistics.stdev(last))


@pytest.mark.parametrize("scale", [1e3])
def test_attach_skips_the_spike_step_alone_and_keeps_weights_state_and_reference(scale: float) -> None:
    model, batches = _model_and_data(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # Thresholds GAC never reaches: the guard alone decides here.
    att = gac.attach(opt, spike_sigma=6, spike_window=64, c_low=0.999, c_high=1.0)
    assert att.agent.mode == "local"  # asking for the guard asks for control
    assert (att.agent.spike_sigma, att.agent.spike_window, att.agent.spike_warmup) == (6.0, 64, 32)
    held: List[float] = []
    raw: List[torch.Tensor] = []
    regimes: List[str] = []
    for step, (x, y) in enumerate(batches[:120], start=1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == SPIKE_STEP:
            for p in model.parameters():
                p.grad.mul_(scale)
        g = _flat_grad(model)
        weights = [p.detach().clone() for p in model.parameters()]
        state = _state(opt)
        opt.step()
        r = att.last_report
        regimes.append(r.regime)
        norm = float(g.norm())
        assert r.grad_norm == pytest.approx(norm, rel=1e-5)
        if len(held) >= 32:
            assert r.grad_norm_z == pytest.approx(_z(norm, held, 64), rel=1e-4, abs=1e-6)
        else:
            assert r.grad_norm_z is None
        if step == SPIKE_STEP:
            assert r.regime == "spike" and r.skipped and not r.step_optimizer
            assert r.grad_norm_z > 6
            assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
            after = _state(opt)
            assert after.keys() == state.keys()
            for i in state:
                assert all(torch.equal(state[i][k], after[i][k]) for k in state[i])
            # The guard's cosine is the step's own, against the last accepted gradient.
            assert r.cosine == pytest.approx(_cos(g, raw[-1]), abs=1e-5)
            held.append(_at_bound(norm, held, 64, 6.0))
        else:
            held.append(norm)
            if raw:
                # The reference is the last accepted raw gradient: after the spike, step 79's.
                assert r.cosine == pytest.approx(_cos(g, raw[-1]), abs=1e-5)
            raw.append(g)
    assert [s for s, reg in enumerate(regimes, start=1) if reg == "spike"] == [SPIKE_STEP]
    d = att.last_report.to_dict()
    assert "gac/grad_norm_z" in d and "gac/loss_z" not in d  # no loss given: loss_z is None, left out


def test_max_grad_norm_alone_skips_above_the_bound() -> None:
    model, batches = _model_and_data(1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    att = gac.attach(opt, max_grad_norm=50.0, c_low=0.999, c_high=1.0)
    regimes = []
    for step, (x, y) in enumerate(batches[:30], start=1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 20:
            for p in model.parameters():
                p.grad.mul_(1e3)
        norm = float(_flat_grad(model).norm())
        opt.step()
        regimes.append(att.last_report.regime)
        assert (att.last_report.regime == "spike") == (norm > 50.0)
        assert att.last_report.grad_norm_z is None  # the z-score is off
    assert regimes.count("spike") == 1


def test_monitor_mode_reports_the_spike_and_changes_nothing() -> None:
    model, batches = _model_and_data(2)
    agent = gac.Agent(mode="monitor", spike_sigma=4, spike_window=16, spike_warmup=8)
    held = []
    for step, (x, y) in enumerate(batches[:40], start=1):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 30:
            for p in model.parameters():
                p.grad.mul_(100.0)
        before = [p.grad.clone() for p in model.parameters()]
        r = agent.step(step, model.parameters())
        held.append(agent.window_held)
        assert r.step_optimizer  # monitor: never skips
        assert all(torch.equal(a, p.grad) for a, p in zip(before, model.parameters()))
        assert (r.regime == "spike") == (step == 30)
    # The spike entered no window: GAC's window did not grow at step 30.
    assert held[29] == held[28]


def test_the_loss_z_score_reads_a_loss_given_to_step_or_returned_by_a_closure() -> None:
    model, batches = _model_and_data(3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    att = gac.attach(opt, spike_sigma=5, spike_window=32, c_low=0.999, c_high=1.0)
    calls = 0
    losses: List[float] = []
    for step, (x, y) in enumerate(batches[:60], start=1):
        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            nonlocal calls
            calls += 1
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            # At step 50 the loss alone spikes; the gradient is the batch's own.
            return loss.detach() * 0 + 1e6 if step == 50 else loss
        returned = opt.step(closure)
        r = att.last_report
        assert returned is not None and r.loss == pytest.approx(float(returned))
        if step == 50:
            assert r.regime == "spike" and r.loss_z > 5
            losses.append(_at_bound(r.loss, losses, 32, 5.0))  # held at the bound it broke
        else:
            assert r.regime != "spike"
            losses.append(r.loss)
    assert calls == 60  # the closure ran once a step: gac's call, handed on to the optimizer
    # optimizer.step(loss=...) without a closure: taken out before the optimizer sees it.
    x, y = batches[60]
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step(loss=loss.detach())
    assert att.last_report.loss == pytest.approx(float(loss))
    assert att.last_report.loss_z == pytest.approx(_z(float(loss), losses, 32), rel=1e-4)


@pytest.mark.parametrize("kwargs, message", [
    ({"spike_sigma": 0}, "spike_sigma must be finite and > 0"),
    ({"spike_sigma": -1.0}, "spike_sigma must be finite and > 0"),
    ({"spike_window": 1}, "spike_window must be in [2, 10000]"),
    ({"spike_window": 8, "spike_warmup": 9}, "spike_warmup must be in [2, spike_window=8]"),
    ({"max_grad_norm": -1.0}, "max_grad_norm must be finite and >= 0"),
    ({"max_grad_norm": math.inf}, "max_grad_norm must be finite and >= 0"),
])
def test_bad_settings_are_value_errors_naming_the_setting(kwargs: Dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        gac.Agent(**kwargs)
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError):
        gac.attach(opt, **kwargs)
    assert "step" not in vars(opt)  # nothing was hooked


def test_a_loss_that_is_no_number_is_a_type_error() -> None:
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    agent = gac.Agent(spike_sigma=6)
    with pytest.raises(TypeError, match="loss must be a number or a one-element tensor"):
        agent.step(1, model.parameters(), loss="high")
    r = agent.step(1, model.parameters(), loss=torch.tensor(0.5))
    assert r.loss == 0.5 and r.regime == "safe"


def test_the_guard_is_off_unless_asked_for() -> None:
    agent = gac.Agent()
    assert (agent.max_grad_norm, agent.spike_sigma, agent.spike_window, agent.spike_warmup) == (0.0, None, None, None)
    model = torch.nn.Linear(4, 4)
    for step in range(1, 40):
        model.zero_grad()
        (model(torch.randn(8, 4)).sum() * (1e6 if step == 35 else 1.0)).backward()
        r = agent.step(step, model.parameters())
        assert r.regime != "spike" and r.grad_norm_z is None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert gac.attach(opt).agent.mode == "monitor"


def test_remote_mode_gacd_guards_with_the_runs_settings_on_the_agents_history(gacd: Gacd) -> None:
    gacctl = os.environ.get("GAC_GACCTL")
    if not gacctl:
        pytest.skip("built without gacctl")
    run = "py-spike"

    def ctl(*args: str) -> str:
        out = subprocess.run([gacctl, "--address", gacd.address, *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    bad = subprocess.run([gacctl, "--address", gacd.address, "config", "set", run, "--spike-sigma", "0",
                          "--reason", "t"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--spike-sigma must be finite and > 0" in bad.stderr
    ctl("config", "set", run, "--mode", "remote", "--c-low", "0.999", "--c-high", "1", "--spike-sigma", "5",
        "--spike-window", "24", "--reason", "spike guard test")
    assert "spike_guard z > 5 over 24 steps (after 12)" in ctl("config", "get", run)
    model, batches = _model_and_data(4)
    rc = gac.RemoteController(gacd.address, run, deadline=10.0)
    # The agent's own guard is off: gacd's decides.
    agent = gac.Agent(mode="remote", decision_source=rc)
    norms: List[float] = []
    regimes = []
    with gac.Telemetry(gacd.address, run) as t:
        for step, (x, y) in enumerate(batches[:50], start=1):
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            if step == 40:
                for p in model.parameters():
                    p.grad.mul_(1e3)
            norm = float(_flat_grad(model).norm())
            r = agent.step(step, model.parameters())
            assert not r.fallback, r.remote_error
            regimes.append(r.regime)
            if len(norms) >= 12:
                assert r.grad_norm_z == pytest.approx(_z(norm, norms, 24), rel=1e-4, abs=1e-6)
            norms.append(_at_bound(norm, norms, 24, 5.0) if r.regime == "spike" else norm)
            t.send(r)
        assert t.flush(30)
    assert [s for s, reg in enumerate(regimes, start=1) if reg == "spike"] == [40]
    stored = {int(r["step"]): r for r in gacd.steps(run)}  # type: ignore[arg-type]
    assert stored[40]["regime"] == "REGIME_SPIKE" and float(stored[40]["grad_norm_z"]) > 5  # type: ignore[arg-type]
    assert "REGIME_SPIKE" not in {stored[s]["regime"] for s in stored if s != 40}
    csv = ctl("steps", run, "--format", "csv").splitlines()
    header = csv[0].split(",")
    spikes = [row.split(",") for row in csv[1:] if row.split(",")[header.index("regime")] == "spike"]
    assert [int(row[header.index("step")]) for row in spikes] == [40]
    ctl("config", "set", run, "--spike-off", "--reason", "off again")
    assert "spike_guard off" in ctl("config", "get", run)
    # The same through the Python API: set, refused before gacd is asked, off.
    rc.set_spike_guard(max_grad_norm=100.0, spike_sigma=4, reason="from python")
    assert "spike_guard |g| > 100 or z > 4 over 128 steps (after 64)" in ctl("config", "get", run)
    with pytest.raises(ValueError, match="spike_window must be in"):
        rc.set_spike_guard(spike_window=1)
    rc.set_spike_guard(reason="off from python")
    assert "spike_guard off" in ctl("config", "get", run)
