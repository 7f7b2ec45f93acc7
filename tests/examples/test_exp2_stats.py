"""examples/grpo/exp2_stats.py against references computed another way:
published values and closed forms of Clopper-Pearson bounds, McNemar's test
by enumerating every outcome, the permutation AUC test by enumerating every
labelling, the slope's t-test by integrating Student's density. Standard
library and pytest only."""

import importlib.util
import itertools
import math
import os
import random
import statistics
import sys
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SOURCE_DIR / "examples" / "grpo"))
_spec = importlib.util.spec_from_file_location("gac_grpo_exp2_stats", SOURCE_DIR / "examples" / "grpo" / "exp2_stats.py")
stats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stats)


def t_two_sided_p(t, df, pieces=20000):
    """2 P(T > |t|) by Simpson's rule on Student's density over [0, |t|]."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    f = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)
    h = abs(t) / pieces
    body = f(0) + f(abs(t)) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, pieces))
    return 2 * (0.5 - body * h / 3)


# --- Clopper-Pearson ---------------------------------------------------------------------

def test_clopper_pearson_matches_published_values_and_closed_forms():
    lo, hi = stats.clopper_pearson(3, 10)  # R: binom.test(3, 10)$conf.int
    assert lo == pytest.approx(0.06673951, abs=1e-7) and hi == pytest.approx(0.65245285, abs=1e-7)
    for n in (1, 5, 24, 84):
        assert stats.clopper_pearson(0, n) == (0.0, pytest.approx(1 - 0.025 ** (1 / n), abs=1e-9))
        assert stats.clopper_pearson(n, n) == (pytest.approx(0.025 ** (1 / n), abs=1e-9), 1.0)
    assert stats.clopper_pearson(0, 0) == (None, None)
    with pytest.raises(ValueError):
        stats.clopper_pearson(5, 4)


@pytest.mark.parametrize("k, n", [(1, 24), (12, 24), (23, 24), (40, 84)])
def test_clopper_pearson_bounds_leave_a_quarter_of_five_percent_in_each_tail(k, n):
    lo, hi = stats.clopper_pearson(k, n)
    tail_at_least = lambda p: sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))
    tail_at_most = lambda p: sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))
    assert tail_at_least(lo) == pytest.approx(0.025, abs=1e-9)
    assert tail_at_most(hi) == pytest.approx(0.025, abs=1e-9)
    assert lo < k / n < hi


# --- McNemar -----------------------------------------------------------------------------

@pytest.mark.parametrize("b, c", [(0, 0), (5, 0), (0, 5), (8, 1), (3, 3), (10, 4), (1, 12)])
def test_mcnemar_is_twice_the_smaller_tail_counted_over_every_outcome(b, c):
    n = b + c
    if n == 0:
        assert stats.mcnemar_exact_p(b, c) == 1.0
        return
    small = min(b, c)
    outcomes = list(itertools.product((0, 1), repeat=n))
    tail = sum(1 for o in outcomes if sum(o) <= small) / len(outcomes)
    assert stats.mcnemar_exact_p(b, c) == pytest.approx(min(1.0, 2 * tail), abs=1e-15)
    assert stats.mcnemar_exact_p(b, c) == stats.mcnemar_exact_p(c, b)


# --- the permutation test of the AUC ------------------------------------------------------

def brute_auc_p(bad, good, direction):
    values = list(bad) + list(good)
    sign = 1 if direction == "up" else -1

    def auc(pos, neg):
        return sum(1.0 if sign * (x - y) > 0 else 0.5 if x == y else 0.0 for x in pos for y in neg) / (len(pos) * len(neg))

    observed = auc(bad, good)
    hits = total = 0
    for chosen in itertools.combinations(range(len(values)), len(bad)):
        rest = [values[i] for i in range(len(values)) if i not in chosen]
        total += 1
        hits += abs(auc([values[i] for i in chosen], rest) - 0.5) >= abs(observed - 0.5) - 1e-12
    return observed, hits / total


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("bad, good", [
    ([0.5, 0.7, 0.9, 0.3], [0.1, 0.2, 0.5, 0.4, 0.05]),
    ([1, 1, 2, 3], [1, 2, 2, 0, 0, 1]),               # ties across the labels
    ([0.3], [0.1, 0.2, 0.4]),
    ([5, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5, 6]),
])
def test_the_permutation_auc_test_equals_enumerating_every_labelling(bad, good, direction):
    observed, p = stats.permutation_auc_p(bad, good, direction)
    ref_auc, ref_p = brute_auc_p(bad, good, direction)
    assert observed == pytest.approx(ref_auc, abs=1e-12)
    assert p == pytest.approx(ref_p, abs=1e-12)


def test_the_random_permutation_branch_agrees_with_the_exact_count(monkeypatch):
    rng = random.Random(7)
    bad = [rng.gauss(0.4, 1) for _ in range(7)]
    good = [rng.gauss(0.0, 1) for _ in range(9)]
    exact = stats.permutation_auc_p(bad, good)
    monkeypatch.setattr(stats, "EXACT_LIMIT", 10)
    monkeypatch.setattr(stats, "PERMUTATIONS", 20000)
    sampled = stats.permutation_auc_p(bad, good)
    assert sampled[0] == exact[0]
    assert sampled[1] == pytest.approx(exact[1], abs=0.015)
    assert sampled == stats.permutation_auc_p(bad, good)  # random.Random(52): the same draws every time
    assert stats.permutation_auc_p([], [1.0]) == (None, None)


# --- bootstrap ---------------------------------------------------------------------------

def test_the_bootstrap_interval_of_a_proportion_is_close_to_the_normal_one():
    runs = [1] * 60 + [0] * 140
    lo, hi = stats.bootstrap_ci(runs, statistics.mean)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 200)
    assert lo == pytest.approx(0.3 - half, abs=0.01) and hi == pytest.approx(0.3 + half, abs=0.01)
    assert (lo, hi) == stats.bootstrap_ci(runs, statistics.mean)  # seeded
    assert stats.bootstrap_ci([2.0] * 5, statistics.mean) == (2.0, 2.0)
    assert stats.bootstrap_ci([], statistics.mean) == (None, None)
    # Resamples where the statistic is undefined are left out, not counted as anything.
    only_defined = stats.bootstrap_ci([None, 1.0, 3.0], lambda rs: (statistics.mean([r for r in rs if r is not None])
                                                                    if any(r is not None for r in rs) else None))
    assert 1.0 <= only_defined[0] <= only_defined[1] <= 3.0


# --- the least-squares slope --------------------------------------------------------------

def test_the_slope_its_interval_and_p_match_the_textbook_formulas():
    x = [15.5, 16.9, 18.3, 15.5, 16.9, 18.3, 20.2, 21.9, 20.2, 21.9, 15.5, 16.9, 18.3, 20.2, 21.9]
    y = [1.2, 1.1, 1.6, 0.9, 1.4, 1.3, 1.9, 1.7, 1.5, 2.2, 1.0, 1.5, 1.2, 1.6, 2.0]
    n = len(x)
    # Normal equations by hand: [n, Sx; Sx, Sxx] (a, b) = (Sy, Sxy).
    sx, sy = sum(x), sum(y)
    sxx, sxy = sum(v * v for v in x), sum(u * v for u, v in zip(x, y))
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    a = (sy - b * sx) / n
    s2 = sum((v - a - b * u) ** 2 for u, v in zip(x, y)) / (n - 2)
    se = math.sqrt(s2 * n / (n * sxx - sx * sx))
    slope, lo, hi, p = stats.ols_slope(x, y)
    assert slope == pytest.approx(b, rel=1e-12)
    assert p == pytest.approx(t_two_sided_p(b / se, n - 2), abs=1e-7)
    t975 = (hi - lo) / (2 * se)
    assert t_two_sided_p(t975, n - 2) == pytest.approx(0.05, abs=1e-6)  # the 97.5 % point of t(13)
    assert stats.ols_slope([1, 2], [3, 5])[1:] == (None, None, None)
    with pytest.raises(ValueError):
        stats.ols_slope([1, 1, 1], [1, 2, 3])
