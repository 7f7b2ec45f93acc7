"""gac.Controller, the calibration helpers and gac's exceptions, against
formulas written here; and the controller without torch."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import List, Optional

import numpy as np
import pytest

import gac


def reference_decision(dot: float, gg: float, pp: float, has_ref: bool, c_low: float, c_high: float,
                       mode: str) -> dict:
    """docs/ALGORITHM.md's rules; the cosine after projection is that of the exact
    cosine of g and p (without the 1e-8), by after()."""
    if not all(math.isfinite(x) for x in (dot, gg, pp)) or gg < 0 or pp < 0:
        return dict(regime="invalid", cosine=None, alpha=1.0, coeff=0.0, apply=False, after=None)
    if not has_ref or pp == 0:
        return dict(regime="safe", cosine=None, alpha=1.0, coeff=0.0, apply=True, after=None)
    c = dot / (math.sqrt(gg * pp) + 1e-8)
    if abs(c) <= c_low:
        return dict(regime="safe", cosine=c, alpha=1.0, coeff=0.0, apply=True, after=c)
    if abs(c) >= c_high:
        return dict(regime="skip", cosine=c, alpha=1.0, coeff=0.0, apply=False, after=None)
    a = c_low / abs(c) if mode == "paper" else c_low * math.sqrt(1 - c * c) / (abs(c) * math.sqrt(1 - c_low**2))
    return dict(regime="project", cosine=c, alpha=a, coeff=(1 - a) * dot / pp, apply=True,
                after=after(dot / math.sqrt(gg * pp), a))


def after(c: float, alpha: float) -> float:
    """From first principles: for unit p and g = c p + s q (q orthogonal to
    p), g' = alpha c p + s q, so cos(g', p) = alpha c / sqrt(1 - (1 - alpha^2) c^2)."""
    return alpha * c / math.sqrt(1 - (1 - alpha * alpha) * c * c)


CASES = [(d, 1.0, 1.0, True) for d in (0.0, 0.03, -0.05, 0.051, 0.1, -0.2, 0.299, 0.3, 0.8, -0.999)] + [
    (5.0, 100.0, 4.0, True), (-3.0, 100.0, 4.0, True), (0.5, 1.0, 1.0, False), (0.5, 1.0, 0.0, True),
    (float("nan"), 1.0, 1.0, True), (0.1, float("inf"), 1.0, True), (0.1, -1.0, 1.0, True),
    (1e-30, 1e-60, 1e-60, True)]


@pytest.mark.parametrize("mode", ["paper", "exact"])
@pytest.mark.parametrize("thresholds", [(0.05, 0.3), (0.01, 0.9), (0.2, 1.0)])
def test_decisions_match_the_rules(mode: str, thresholds: tuple) -> None:
    c = gac.Controller(*thresholds, alpha_mode=mode)
    assert (c.c_low, c.c_high, c.alpha_mode) == (*thresholds, mode)
    for dot, gg, pp, has_ref in CASES:
        d = c.decide(dot, gg, pp, has_reference=has_ref)
        e = reference_decision(dot, gg, pp, has_ref, *thresholds, mode)
        what = f"decide({dot}, {gg}, {pp}, {has_ref})"
        assert d.regime == e["regime"], what
        assert d.apply_update == e["apply"], what
        for got, want, rel in ((d.cosine, e["cosine"], 1e-12), (d.cosine_after, e["after"], 1e-9)):
            assert (got is None) == (want is None), what
            if want is not None:
                assert got == pytest.approx(want, rel=rel, abs=1e-12), what
        assert d.alpha == pytest.approx(e["alpha"], rel=1e-12), what
        assert d.projection_coeff == pytest.approx(e["coeff"], rel=1e-9, abs=1e-15), what
        if math.isfinite(gg) and gg >= 0:
            assert d.grad_norm == pytest.approx(math.sqrt(gg))
        if e["regime"] == "project":
            assert c.alpha(d.cosine) == pytest.approx(e["alpha"], rel=1e-12)
            assert gac.cosine_after_projection(d.cosine, d.alpha) == pytest.approx(after(d.cosine, d.alpha), rel=1e-12)


@pytest.mark.parametrize("c_low, c_high", [(0.3, 0.05), (0.1, 0.1), (0.0, 0.3), (-0.1, 0.3), (0.05, 1.5),
                                           (float("nan"), 0.3), (0.05, float("inf"))])
def test_bad_thresholds_raise_value_error(c_low: float, c_high: float) -> None:
    with pytest.raises(ValueError) as e:
        gac.Controller(c_low, c_high)
    assert isinstance(e.value, gac.InvalidArgumentError)
    assert e.value.code == gac.StatusCode.INVALID_ARGUMENT
    assert "c_low" in str(e.value) or "c_high" in str(e.value)


def test_bad_alpha_mode() -> None:
    with pytest.raises(ValueError, match="alpha_mode must be 'paper' or 'exact', got 'fast'"):
        gac.Controller(alpha_mode="fast")


def test_calibration_statistics_match_numpy() -> None:
    rng = np.random.default_rng(0)
    values: List[Optional[float]] = list(rng.normal(0, 0.03, 500))
    values += [None, float("nan"), float("inf")]
    s = gac.calibration_stats(values, c_low=0.05)
    finite = np.abs(np.array([v for v in values if v is not None and math.isfinite(v)]))
    assert s.count == len(finite) == 500
    assert s.q90 == pytest.approx(np.quantile(finite, 0.9), rel=1e-12)
    assert s.max == pytest.approx(finite.max()) and s.mean == pytest.approx(finite.mean(), rel=1e-12)
    assert s.frac_le_c_low == pytest.approx(np.mean(finite <= 0.05), rel=1e-12)
    c_low, c_high = gac.suggest_thresholds(s)
    q = float(np.quantile(finite, 0.9))
    digits = 2 - math.floor(math.log10(q))
    assert c_low == pytest.approx(math.ceil(q * 10**digits) / 10**digits, rel=1e-9)
    assert c_high == pytest.approx(min(1.0, max(3 * finite.max(), 2 * c_low)), rel=1e-12)
    empty = gac.calibration_stats([])
    assert (empty.count, empty.q90, empty.max) == (0, 0.0, 0.0)


def test_suggested_thresholds_of_the_papers_figures() -> None:
    # Qwen3-1.7B on-policy: q0.9 of |c| 0.0471, max 0.0924 (the paper's Table 3).
    window = gac.CalibrationWindow(capacity=100)
    for v in [0.0471] * 91 + [0.0924] * 9:
        window.add(v)
    s = window.stats()
    assert s.q90 == pytest.approx(0.0471) and s.max == pytest.approx(0.0924)
    assert gac.suggest_thresholds(s) == pytest.approx((0.0471, 0.2772))


def test_too_few_values_to_calibrate() -> None:
    with pytest.raises(gac.FailedPreconditionError) as e:
        gac.suggest_thresholds(gac.calibration_stats([0.01] * 5))
    assert e.value.code == gac.StatusCode.FAILED_PRECONDITION
    assert gac.suggest_thresholds(gac.calibration_stats([0.01] * 5), min_count=5)[0] == pytest.approx(0.01)


def test_calibration_window_keeps_the_last_values_after_the_warm_up() -> None:
    w = gac.CalibrationWindow(capacity=10, skip_first=3)
    values = [0.9, 0.8, 0.7] + [0.01 * i for i in range(1, 21)] + [None]
    for v in values:
        w.add(v)
    assert w.seen == len(values) and w.size == 10
    s = w.stats(c_low=0.15)
    kept = np.array([0.01 * i for i in range(11, 21)])
    assert s.count == 10 and s.max == pytest.approx(0.2) and s.mean == pytest.approx(kept.mean())
    assert s.frac_le_c_low == pytest.approx(np.mean(kept <= 0.15))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        gac.CalibrationWindow(0)


def test_decision_constructor_checks_its_fields() -> None:
    d = gac.Decision("project", cosine=0.2, alpha=0.25, projection_coeff=0.15)
    assert d.regime == "project" and d.apply_update and d.alpha == 0.25
    assert not gac.Decision("skip", cosine=0.9).apply_update
    assert d.to_dict()["projection_coeff"] == 0.15
    with pytest.raises(ValueError, match="regime must be"):
        gac.Decision("maybe")
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        gac.Decision("project", alpha=1.5)
    with pytest.raises(ValueError, match="projection_coeff must be 0 unless"):
        gac.Decision("safe", projection_coeff=0.1)


def test_errors_carry_message_and_code() -> None:
    e = gac.UnavailableError("gacd is down", gac.StatusCode.UNAVAILABLE)
    assert isinstance(e, ConnectionError) and isinstance(e, gac.GacError)
    assert str(e) == "gacd is down" and e.code.name == "UNAVAILABLE"
    assert "StatusCode.UNAVAILABLE" in repr(e)
    assert issubclass(gac.DeadlineExceededError, TimeoutError)
    assert issubclass(gac.InvalidArgumentError, ValueError)


def test_controller_works_without_torch() -> None:
    # torch made unimportable: the controller, the calibration and the
    # errors still work; gac.Agent loads (its module links no torch) and its
    # step() says what it needs.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import gac\n"
        "assert gac.Controller(0.05, 0.3).decide(0.1, 1.0, 1.0).regime == 'project'\n"
        "assert gac.suggest_thresholds(gac.calibration_stats([0.01] * 30))[0] == 0.01\n"
        "agent = gac.Agent(0.05, 0.3)\n"
        "try:\n"
        "    agent.step(1, [])\n"
        "except ImportError as e:\n"
        "    assert 'torch' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('agent.step without torch')\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
