"""gac.attach's control: observing by default (monitor: nothing skipped or
changed even where GAC would skip), controlling when asked, the warm-up
that calibrates the thresholds from its steps' |c_t| (checked against the
rule applied to fp64 cosines of the same gradients) and then controls with
them, the warning and metric when most recent updates were skipped, and
every bad argument refused before anything changes."""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

import gac
from conftest import SOURCE_DIR
from gac._attachment import make_attachment
from gac._targets import OptimizerTarget


class Gradients:
    """Gradients of a few parameters whose consecutive cosine is set by
    rho: g_t = rho g_{t-1} + sqrt(1 - rho^2) noise (raw, whatever GAC did)."""

    def __init__(self, seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n, generator=self.gen))
                                             for n in (2000, 300, 7)])
        self.raw = [torch.randn(p.shape, generator=self.gen) for p in self.model]

    def backward(self, rho: float) -> List[torch.Tensor]:
        for i, p in enumerate(self.model):
            self.raw[i] = rho * self.raw[i] + math.sqrt(1 - rho * rho) * torch.randn(p.shape, generator=self.gen)
            p.grad = self.raw[i].clone()
        return [g.double() for g in self.raw]


def fp64_stats(g: List[torch.Tensor], p: List[torch.Tensor]) -> Tuple[float, float, float]:
    return (sum(float((a * b).sum()) for a, b in zip(g, p)), sum(float((a * a).sum()) for a in g),
            sum(float((b * b).sum()) for b in p))


def weights(model: torch.nn.Module) -> List[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def moved(before: List[torch.Tensor], model: torch.nn.Module) -> bool:
    return any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_attach_observes_by_default() -> None:
    grads = Gradients()
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.1)
    # Thresholds that would skip every step after the first: observed only.
    att = gac.attach(opt, c_low=1e-9, c_high=2e-9)
    assert att.agent.mode == "monitor"
    for step in range(1, 8):
        g = [t.clone() for t in grads.backward(0.5)]
        before = weights(grads.model)
        opt.step()
        assert moved(before, grads.model)
        assert all(torch.equal(p.grad.double(), t) for p, t in zip(grads.model.parameters(), g))  # not projected
        if step > 1:
            assert att.last_report.regime == "skip" and att.last_report.step_optimizer
    assert att.reports == 7 and att.skipped == 0 and att.skip_fraction == 0.0


@pytest.mark.parametrize("kwargs, mode", [({"control": True}, "local"), ({"mode": "local"}, "local"),
                                          ({"mode": "monitor"}, "monitor"), ({}, "monitor")])
def test_control_is_asked_for(kwargs: Dict[str, Any], mode: str) -> None:
    grads = Gradients()
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.1)
    att = gac.attach(opt, c_low=1e-9, c_high=2e-9, **kwargs)
    assert att.agent.mode == mode
    for _ in range(3):
        grads.backward(0.5)
        opt.step()
    assert att.skipped == (2 if mode == "local" else 0)


def test_control_with_a_decision_source_is_remote_mode() -> None:
    class Always(gac.DecisionSource):
        def decide(self, step: int, stats: gac.AlignmentStats) -> gac.Decision:
            return gac.Decision("skip", cosine=0.5)

    grads = Gradients()
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.1)
    att = gac.attach(opt, control=True, decision_source=Always())
    assert att.agent.mode == "remote"
    grads.backward(0.0)
    before = weights(grads.model)
    opt.step()
    assert not moved(before, grads.model) and att.skipped == 1
    assert att.metrics()["gac/fallbacks_total"] == 0.0


def test_windowed_trigger_through_attach() -> None:
    # Alternating signs: every |c_t| is above the per-step c_high (0.3), the mean of 4 is near 0 (safe); then
    # a persistent alignment that the mean follows into project and skip. Decisions against the rule
    # applied to the fp64 cosines of the same gradients.
    grads = Gradients(2)
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.1)
    att = gac.attach(opt, control=True, trigger="window", window=4, window_c_low=0.1, window_c_high=0.4)
    assert att.agent.mode == "local" and att.agent.trigger == "window" and att.agent.window == 4
    rhos = [0.0] + [0.6 if i % 2 == 0 else -0.6 for i in range(12)] + [0.7] * 8
    prev: Optional[List[torch.Tensor]] = None
    cosines: List[float] = []
    regimes = []
    for rho in rhos:
        g = grads.backward(rho)
        opt.step()
        r = att.last_report
        if prev is not None:
            dot, gg, pp = fp64_stats(g, prev)
            cosines.append(dot / (math.sqrt(gg * pp) + 1e-8))
        prev = g
        mean = math.fsum(cosines[-4:]) / 4 if len(cosines) >= 4 else None
        expected = "safe" if mean is None or abs(mean) <= 0.1 else "skip" if abs(mean) >= 0.4 else "project"
        assert r.regime == expected, (len(regimes), r.window_mean, mean)
        if mean is None:
            assert r.window_mean is None and "gac/window_mean" not in r.to_dict()
        else:
            assert r.window_mean == pytest.approx(mean, abs=1e-6)
            assert r.to_dict()["gac/window_mean"] == r.window_mean
        regimes.append(r.regime)
    assert regimes[:13] == ["safe"] * 13, regimes
    assert "project" in regimes and regimes[-1] == "skip"


def test_warmup_calibrates_then_controls() -> None:
    warmup = 40
    grads = Gradients(1)
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.01)
    att = gac.attach(opt, warmup=warmup)
    assert att.agent.mode == "monitor" and att.warming_up
    gen = torch.Generator().manual_seed(7)
    cosines: List[float] = []
    prev: Optional[List[torch.Tensor]] = None
    for step in range(1, warmup + 1):
        rho = float(torch.empty(1).uniform_(-0.2, 0.2, generator=gen))  # a healthy, on-policy-like phase
        g = grads.backward(rho)
        before = weights(grads.model)
        opt.step()
        assert moved(before, grads.model)  # observed only
        if prev is not None:
            dot, gg, pp = fp64_stats(g, prev)
            cosines.append(dot / math.sqrt(gg * pp))
        prev = g
    assert not att.warming_up and att.agent.mode == "local" and att.calibration_error is None
    assert att.calibration.count == warmup - 1
    # The documented rule on the fp64 cosines: c_low = q0.9 of |c| (3 significant
    # digits, rounded up), c_high = max(3 max|c|, 2 c_low), at most 1.
    q90 = float(torch.tensor([abs(c) for c in cosines], dtype=torch.float64).quantile(0.9))
    c_max = max(abs(c) for c in cosines)
    c_low, c_high = att.thresholds  # type: ignore[misc]
    assert (att.agent.c_low, att.agent.c_high) == (c_low, c_high)
    assert q90 <= c_low <= q90 * (1 + 1e-2) + 1e-12
    assert c_high == pytest.approx(min(1.0, max(3 * c_max, 2 * c_low)), rel=1e-6)
    assert (c_low, c_high) == pytest.approx(gac.suggest_thresholds(gac.calibration_stats(cosines)), rel=1e-6)
    # Then alignment rises (staleness): GAC decides with the calibrated thresholds.
    controller = gac.Controller(c_low, c_high)
    regimes = []
    prev = None  # the new agent starts without a reference
    for step in range(warmup + 1, warmup + 16):
        g = grads.backward(0.1 if step % 3 == 0 else 0.9)
        before = weights(grads.model)
        opt.step()
        r = att.last_report
        assert r.step == step and r.mode == "local"
        if prev is None:
            assert r.cosine is None and r.regime == "safe"
        else:
            dot, gg, pp = fp64_stats(g, prev)
            assert r.cosine == pytest.approx(dot / math.sqrt(gg * pp), rel=1e-6)
            assert r.regime == controller.decide(dot, gg, pp).regime
        assert moved(before, grads.model) == r.step_optimizer
        regimes.append(r.regime)
        prev = g
    assert "skip" in regimes and att.skipped == regimes.count("skip")


def test_a_warmup_without_usable_cosines_keeps_observing(caplog: pytest.LogCaptureFixture) -> None:
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=0.1)
    att = gac.attach(opt, warmup=21)
    with caplog.at_level(logging.WARNING, logger="gac"):
        for _ in range(25):
            p.grad = torch.zeros(4)  # no norm: no cosine
            opt.step()
    assert att.agent.mode == "monitor" and att.thresholds is None and not att.warming_up
    assert att.calibration_error and "gave no thresholds" in caplog.text


def test_most_updates_skipped_warns_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    grads = Gradients(2)
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.1)
    att = gac.attach(opt, control=True, c_low=1e-9, c_high=2e-9)
    fractions = []
    with caplog.at_level(logging.WARNING, logger="gac"):
        for step in range(1, 46):
            grads.backward(0.3)
            opt.step()
            fractions.append(att.skip_fraction)
            if step == 19:
                assert not caplog.records  # the window (20) is not full yet
    warnings = [r for r in caplog.records if r.name == "gac" and r.levelno == logging.WARNING]
    assert len(warnings) == 2  # at step 20, then not again before 20 more steps (at 40)
    assert "19 of the last 20 updates were skipped (19 with |c_t| >= c_high = 2e-09)" in warnings[0].getMessage()
    assert "calibrate them" in warnings[0].getMessage() and "spike" not in warnings[0].getMessage()
    assert "20 of the last 20 updates were skipped" in warnings[1].getMessage()
    assert fractions[0] == 0.0 and fractions[1] == 0.5 and fractions[19] == 0.95 and fractions[-1] == 1.0
    assert att.metrics() == {"gac/skipped_total": 44.0, "gac/projected_total": 0.0, "gac/skip_fraction": 1.0}
    # In monitor mode nothing is skipped, whatever the regime: no warning.
    caplog.clear()
    att.detach()
    att2 = gac.attach(opt, c_low=1e-9, c_high=2e-9)
    with caplog.at_level(logging.WARNING, logger="gac"):
        for _ in range(25):
            grads.backward(0.3)
            opt.step()
    assert att2.skip_fraction == 0.0 and not caplog.records


def test_the_warning_needs_more_than_half(caplog: pytest.LogCaptureFixture) -> None:
    class EvenSteps(gac.DecisionSource):
        """Skips the even steps, and every step from 21 on."""

        def decide(self, step: int, stats: gac.AlignmentStats) -> gac.Decision:
            return gac.Decision("skip" if step % 2 == 0 or step > 20 else "safe")

    grads = Gradients(3)
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.1)
    att = gac.attach(opt, control=True, decision_source=EvenSteps())
    with caplog.at_level(logging.WARNING, logger="gac"):
        for step in range(1, 22):
            grads.backward(0.0)
            opt.step()
            if step == 20:
                assert att.skip_fraction == 0.5 and not caplog.records  # half is not more than half
    assert att.skip_fraction == 11 / 20
    assert [r.getMessage()[:32] for r in caplog.records] == ["gac: 11 of the last 20 updates w"]


def test_step_numbering_can_resume() -> None:
    grads = Gradients()
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.1)
    att = gac.attach(opt)
    att.step = 100
    grads.backward(0.0)
    opt.step()
    assert att.last_report.step == 101 and att.step == 101
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="step must be an int >= 0"):
            att.step = bad  # type: ignore[assignment]
    assert att.step == 101


def test_the_attachment_says_what_it_gates() -> None:
    grads = Gradients()
    opt = torch.optim.AdamW(grads.model.parameters(), lr=0.01)
    att = gac.attach(opt, control=True, c_low=1e-9, c_high=2e-9)  # skips every step after the first
    assert att.optimizer is opt
    assert repr(att) == "<gac.Attachment optimizer=AdamW mode=local steps=0 skipped=0>"
    for _ in range(3):
        grads.backward(0.5)
        opt.step()
    assert repr(att) == "<gac.Attachment optimizer=AdamW mode=local steps=3 skipped=2>"
    att.detach()
    assert att.optimizer is None and repr(att) == "<gac.Attachment optimizer=None mode=local steps=3 skipped=2>"
    watcher = gac.attach(torch.optim.SGD(grads.model.parameters(), lr=0.1))
    assert repr(watcher) == "<gac.Attachment optimizer=SGD mode=monitor steps=0 skipped=0>"


def _bad_calls(opt: torch.optim.Optimizer) -> List[Tuple[Any, Dict[str, Any], type, str]]:
    return [
        (object(), {}, TypeError, "gac.attach needs a torch.optim.Optimizer"),
        (opt, {"control": "yes"}, TypeError, "control must be a bool"),
        (opt, {"mode": "auto"}, ValueError, "mode must be one of 'monitor', 'local', 'remote'"),
        (opt, {"control": True, "mode": "monitor"}, ValueError, "mode='monitor' never does"),
        (opt, {"warmup": 5}, ValueError, "at least 21 steps"),
        (opt, {"warmup": -1}, ValueError, "warmup must be 0"),
        (opt, {"warmup": 2.5}, TypeError, "warmup must be an int"),
        (opt, {"warmup": 50, "mode": "remote"}, ValueError, "in remote mode gacd's run thresholds decide"),
        (opt, {"warmup": 50, "c_low": 0.1}, ValueError, "warmup= chooses c_low and c_high itself"),
        (opt, {"skip_window": 0}, ValueError, "skip_window must be an int >= 1"),
        (opt, {"agent": gac.Agent(), "c_low": 0.1}, ValueError, "either agent="),
        (opt, {"agent": gac.Agent(), "control": True}, ValueError, "either agent="),
        (opt, {"c_low": 0.5, "c_high": 0.1}, ValueError, "c_low"),
        (opt, {"warmup": 30, "snapshot_dtype": "float16"}, ValueError, "snapshot_dtype"),
        (opt, {"mode": "remote"}, ValueError, "decision_source"),
        (opt, {"telemetry": object()}, TypeError, "telemetry must be a gac.Telemetry"),
        (opt, {"scalars": 3}, TypeError, "scalars must be a function"),
        (opt, {"nonsense": 1}, TypeError, "nonsense"),
    ]


def test_bad_arguments_raise_and_change_nothing() -> None:
    grads = Gradients()
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.1)
    for target, kwargs, error, match in _bad_calls(opt):
        with pytest.raises(error, match=match):
            gac.attach(target, **kwargs)
        assert "step" not in vars(opt), kwargs
    grads.backward(0.0)
    before = weights(grads.model)
    opt.step()  # the optimizer's own step, untouched
    assert moved(before, grads.model)
    att = gac.attach(opt)
    with pytest.raises(ValueError, match="already gated by gac"):
        gac.attach(opt, control=True)
    assert att.agent.mode == "monitor"
    grads.backward(0.0)
    opt.step()
    assert att.reports == 1
    att.detach()
    att.detach()  # idempotent
    assert "step" not in vars(opt)


def test_updates_skipped_by_the_spike_guard_are_named_as_such(caplog: pytest.LogCaptureFixture) -> None:
    grads = Gradients(2)
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.1)
    # Every gradient is above max_grad_norm; GAC's thresholds are out of reach.
    att = gac.attach(opt, max_grad_norm=1e-9, c_low=0.999, c_high=1.0)
    with caplog.at_level(logging.WARNING, logger="gac"):
        for _ in range(20):
            grads.backward(0.3)
            opt.step()
    warnings = [r.getMessage() for r in caplog.records if r.name == "gac" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "20 of the last 20 updates were skipped (20 by the spike guard)" in warnings[0]
    assert "check the data" in warnings[0] and "c_high" not in warnings[0]


# One native agent per attach: made from the plan (gac/_plan.py) in one place,
# gac._attachment.build_attachment, and reconfigured in place after that
# (conftest.py's agents_made fixture counts them).

def test_the_package_makes_agents_in_one_place() -> None:
    sites = [(path.name, line) for path in sorted((SOURCE_DIR / "python" / "gac").rglob("*.py"))
             for line in path.read_text().splitlines() if "agent_class()(" in line]
    assert [name for name, _ in sites] == ["_attachment.py"], sites


class PartitionedTarget(OptimizerTarget):
    """An optimizer whose gradients are this rank's partition, summed over
    ``group`` (as a DeepSpeed ZeRO optimizer's)."""

    def __init__(self, optimizer: object, group: object) -> None:
        super().__init__(optimizer)
        self.group = group  # type: ignore[assignment]


def one_rank_group() -> Any:
    import datetime
    import torch.distributed as dist
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))


def test_one_agent_per_attach_through_the_warmup_and_a_partitioned_target(agents_made: List[Any]) -> None:
    grads = Gradients(1)
    opt = torch.optim.SGD(grads.model.parameters(), lr=0.01)
    att = gac.attach(opt, warmup=21)
    agent = att.agent
    assert agents_made == [agent] and agent.mode == "monitor"
    for _ in range(21):
        grads.backward(0.1)
        opt.step()
    # The warm-up's end sets the thresholds and the mode of the same agent.
    assert att.agent is agent and agents_made == [agent]
    assert (agent.mode, agent.c_low, agent.c_high) == ("local", *att.thresholds)  # type: ignore[misc]
    grads.backward(0.1)
    opt.step()
    assert att.last_report.mode == "local" and att.last_report.cosine is None  # started over, as a new agent
    att.detach()

    # A target whose gradient is partitioned gives the agent gac made its group, in place.
    plain = gac.attach(opt)
    assert plain.agent.process_group is None
    plain.detach()
    group = one_rank_group()
    plain.hook(PartitionedTarget(opt, group))
    assert plain.agent.process_group is group and len(agents_made) == 2
    for step in range(2):
        grads.backward(0.5)
        opt.step()
    assert plain.reports == 2 and plain.last_report.cosine is not None

    # The caller's agent is used as it is: it must have the group itself.
    other = torch.optim.SGD(grads.model.parameters(), lr=0.01)
    with pytest.raises(ValueError, match="has no process_group"):
        make_attachment(agent=gac.Agent(mode="monitor")).hook(PartitionedTarget(other, group))
    assert len(agents_made) == 2 and "step" not in vars(other)


def test_one_agent_per_attach_in_the_integrations(agents_made: List[Any]) -> None:
    pytest.importorskip("transformers")
    from gac.integrations import verl
    from gac.integrations.transformers import GacCallback
    grads = Gradients()
    opt = verl.AdamW(grads.model.parameters(), gac_control=True, gac_c_low=0.2, gac_c_high=0.5)
    assert agents_made == [opt.gac.agent] and opt.gac.agent.mode == "local"
    callback = GacCallback(warmup=30)
    assert agents_made[1:] == [callback.attachment.agent]
    callback.attachment.hook(PartitionedTarget(torch.optim.SGD(grads.model.parameters(), lr=0.1), one_rank_group()))
    assert len(agents_made) == 2 and callback.attachment.agent.process_group is not None
