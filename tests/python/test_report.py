"""report.to_dict(): every documented flat name with the report's own value,
numbers only by default (regime, mode and trigger as their index in
gac.REGIMES, gac.MODES and TRIGGERS, booleans 0/1, absent values left out),
the report's own values with numeric=False, per-layer names, another prefix;
the rule the agent decided with (and none when gacd decided); bad arguments
raise."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch

import gac

FIELDS = ["step", "loss", "mode", "regime", "cosine", "cosine_after", "window_mean", "grad_norm_z", "loss_z", "alpha", "projection_coeff", "grad_norm", "ref_norm",
          "step_optimizer", "skipped", "gradient_modified", "fallback", "remote_error", "elements", "tensors",
          "strided_tensors", "passes", "stats_seconds", "decide_seconds", "apply_seconds", "agent_overhead_seconds",
          "c_low", "c_high", "trigger", "window", "window_c_low", "window_c_high"]


def _reports() -> Dict[str, Any]:
    """Reports of a first step (no reference), a projected step and a skipped one."""
    a, b = torch.nn.Parameter(torch.zeros(6)), torch.nn.Parameter(torch.zeros(4))
    agent = gac.Agent(0.05, 0.3, layers={"a": [a], "b": [b]})
    g1 = [torch.tensor([1.0, 0, 0, 0, 0, 0]), torch.tensor([0.0, 1, 0, 0])]
    g2 = [torch.tensor([0.2, 1, 0, 0, 0, 0]), torch.tensor([0.0, 0, 1, 0])]   # cosine 0.2/sqrt(2*2.04): project
    g3 = [torch.tensor([0.2, 1, 0, 0, 0, 0]), torch.tensor([0.0, 0, 1, 0])]   # the same again: skip
    out = {}
    for step, (name, gs) in enumerate([("first", g1), ("project", g2), ("skip", g3)], start=1):
        a.grad, b.grad = gs[0].clone(), gs[1].clone()
        out[name] = agent.step(step, [a, b])
    assert (out["first"].regime, out["project"].regime, out["skip"].regime) == ("safe", "project", "skip")
    return out


def test_numeric_dict_has_every_field_as_a_number() -> None:
    for name, r in _reports().items():
        d = r.to_dict()
        assert all(k.startswith("gac/") for k in d)
        assert all(type(v) in (int, float) for v in d.values()), d
        # Text (remote_error, passes) and absent values (no loss given, no z-score, no reference) are left out.
        expected = [f for f in FIELDS if f not in ("remote_error", "passes") and getattr(r, f) is not None]
        assert [k for k in d if k.count("/") == 1] == ["gac/" + f for f in expected], name
        assert d["gac/regime"] == gac.REGIMES.index(r.regime) == ["safe", "project", "skip", "invalid", "spike"].index(r.regime)
        assert d["gac/mode"] == gac.MODES.index("local") == 1
        # The rule this agent decided with: Agent(0.05, 0.3), the default trigger.
        assert (d["gac/c_low"], d["gac/c_high"], d["gac/trigger"], d["gac/window"]) == (0.05, 0.3, 0, 20)
        assert r.trigger == "per_step" and (r.window_c_low, r.window_c_high) == (d["gac/window_c_low"], d["gac/window_c_high"])
        assert d["gac/skipped"] == int(not r.step_optimizer)
        assert d["gac/step_optimizer"] == int(r.step_optimizer)
        assert d["gac/gradient_modified"] == int(r.gradient_modified)
        for f in ("step", "alpha", "projection_coeff", "grad_norm", "ref_norm", "elements", "tensors",
                  "agent_overhead_seconds"):
            assert d["gac/" + f] == getattr(r, f), f
        if r.cosine is not None:
            assert d["gac/cosine"] == r.cosine
        for layer, stats in r.layers.items():
            assert d[f"gac/grad_norm/{layer}"] == stats.grad_norm
            assert (f"gac/cosine/{layer}" in d) == (stats.cosine is not None)
    reports = _reports()
    assert reports["skip"].to_dict()["gac/skipped"] == 1 and reports["project"].to_dict()["gac/skipped"] == 0
    assert reports["project"].to_dict()["gac/alpha"] < 1.0
    assert reports["first"].to_dict()["gac/elements"] == 10


def test_readable_dict_keeps_the_reports_values() -> None:
    r = _reports()["first"]
    d = r.to_dict(numeric=False)
    assert list(d)[:len(FIELDS)] == ["gac/" + f for f in FIELDS]
    assert d["gac/regime"] == "safe" and d["gac/mode"] == "local"
    assert d["gac/cosine"] is None and d["gac/remote_error"] is None and d["gac/window_mean"] is None
    assert d["gac/step_optimizer"] is True and d["gac/skipped"] is False
    assert d["gac/cosine/a"] is None and d["gac/grad_norm/b"] == pytest.approx(1.0)


def test_window_mean_once_the_window_is_full() -> None:
    p = torch.nn.Parameter(torch.zeros(4))
    agent = gac.Agent(trigger="window", window=2, window_c_low=0.1, window_c_high=0.9)
    grads = [[1.0, 0, 0, 0], [0.6, 0.8, 0, 0], [0.6, 0.8, 0, 0], [0.0, 0.0, 1.0, 0]]
    dicts = []
    for step, g in enumerate(grads, start=1):
        p.grad = torch.tensor(g)
        dicts.append(agent.step(step, [p]).to_dict())
    # Cosines: none, 0.6, 1, 0: a mean from the third step, 0.8 then 0.5.
    assert ["gac/window_mean" in d for d in dicts] == [False, False, True, True]
    assert dicts[2]["gac/window_mean"] == pytest.approx(0.8, abs=1e-6)
    assert dicts[3]["gac/window_mean"] == pytest.approx(0.5, abs=1e-6)
    assert dicts[2]["gac/regime"] == dicts[3]["gac/regime"] == gac.REGIMES.index("project")
    assert list(dicts[3])[:6] == ["gac/" + f for f in FIELDS if f != "loss"][:6]


def test_the_rule_is_the_agents_own_and_absent_when_gacd_decides() -> None:
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.ones(4)
    windowed = gac.Agent(0.1, 0.6, trigger="window", window=7, window_c_low=0.2, window_c_high=0.5, mode="monitor")
    r = windowed.step(1, [p])
    assert (r.c_low, r.c_high, r.trigger, r.window, r.window_c_low, r.window_c_high) == (0.1, 0.6, "window", 7, 0.2, 0.5)
    assert r.to_dict()["gac/trigger"] == 1

    class Gacd(gac.DecisionSource):  # decides itself: the report carries no rule of the agent's
        def decide(self, step: int, stats: Any) -> Any:
            return gac.Decision("safe", cosine=None)

    class Failing(gac.DecisionSource):  # fails: the agent's fallback decision, with its rule
        def decide(self, step: int, stats: Any) -> Any:
            raise RuntimeError("gacd is away")

    remote = gac.Agent(0.05, 0.3, mode="remote", decision_source=Gacd())
    d = remote.step(1, [p]).to_dict(numeric=False)
    assert [d["gac/" + f] for f in FIELDS[-6:]] == [None] * 6
    numeric = remote.step(2, [p]).to_dict()
    assert not any(k in numeric for k in ("gac/c_low", "gac/trigger", "gac/window"))
    fallback = gac.Agent(0.05, 0.3, mode="remote", decision_source=Failing()).step(1, [p])
    assert fallback.fallback and (fallback.c_low, fallback.c_high, fallback.trigger) == (0.05, 0.3, "per_step")


def test_prefix_and_the_free_function() -> None:
    r = _reports()["skip"]
    assert r.to_dict("") == {k[len("gac/"):]: v for k, v in r.to_dict().items()}
    assert r.to_dict("run1.gac.")["run1.gac.regime"] == 2
    from gac._report import report_to_dict
    assert report_to_dict(r) == r.to_dict()


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((3,), {}, TypeError, "prefix must be a str"),
    ((), {"numeric": 1}, TypeError, "numeric must be a bool"),
    ((), {"nonsense": True}, TypeError, "nonsense"),
])
def test_bad_arguments(args: Any, kwargs: Any, error: type, match: str) -> None:
    r = _reports()["first"]
    before = r.to_dict()
    with pytest.raises(error, match=match):
        r.to_dict(*args, **kwargs)
    assert r.to_dict() == before
