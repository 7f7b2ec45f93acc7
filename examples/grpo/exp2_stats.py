"""The statistics the second registered experiment (docs/RESULTS.md, "Second
registered experiment") names and analyze.py does not have: Clopper-Pearson
intervals, McNemar's exact test, percentile bootstrap intervals over runs,
the permutation test of an AUC, and the least-squares slope with its
t-interval. Standard library only; analyze.py holds the paired t-test, the
paired interval, Holm's correction and Fisher's exact test.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
from typing import Callable, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze  # noqa: E402  (Student's t)

SEED = 52                 # every resampling and permutation draw: random.Random(SEED)
BOOTSTRAP_RESAMPLES = 10_000
PERMUTATIONS = 100_000    # random arrangements when complete enumeration would exceed EXACT_LIMIT
EXACT_LIMIT = 1_000_000


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k), X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, sum(math.comb(n, i) * p ** i * (1.0 - p) ** (n - i) for i in range(k + 1)))


def _bisect(f: Callable[[float], float], lo: float, hi: float) -> float:
    """The root of f, increasing on [lo, hi] with f(lo) <= 0 <= f(hi), to 1e-12."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < 0.0:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> Tuple[Optional[float], Optional[float]]:
    """The exact (Clopper-Pearson) interval of a proportion k / n: the lower
    bound solves P(X >= k | p) = a/2, the upper P(X <= k | p) = a/2; (None,
    None) when n = 0."""
    if n <= 0:
        return None, None
    if not 0 <= k <= n:
        raise ValueError(f"k = {k} outside 0..{n}")
    a = (1.0 - level) / 2.0
    lo = 0.0 if k == 0 else _bisect(lambda p: (1.0 - binomial_cdf(k - 1, n, p)) - a, 0.0, 1.0)
    hi = 1.0 if k == n else _bisect(lambda p: a - binomial_cdf(k, n, p), 0.0, 1.0)
    return lo, hi


def mcnemar_exact_p(b: int, c: int) -> float:
    """McNemar's exact test of the discordant pairs b (first only) and c
    (second only): min(1, 2 P(X <= min(b, c))), X ~ Binomial(b + c, 1/2);
    1 when there is no discordant pair."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0 ** n)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, linearly interpolated (numpy's default)."""
    x = (len(sorted_values) - 1) * q
    i = int(math.floor(x))
    j = min(i + 1, len(sorted_values) - 1)
    return sorted_values[i] + (sorted_values[j] - sorted_values[i]) * (x - i)


def bootstrap_ci(runs: Sequence[object], statistic: Callable[[List[object]], Optional[float]],
                 level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = SEED) -> Tuple[Optional[float], Optional[float]]:
    """The percentile bootstrap interval of statistic(runs): `resamples`
    resamples of the runs (not of steps) with replacement, drawn by
    random.Random(seed); resamples where the statistic is None are left out.
    (None, None) without runs or without any defined resample."""
    if not runs:
        return None, None
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        v = statistic([runs[rng.randrange(len(runs))] for _ in runs])
        if v is not None:
            values.append(v)
    if not values:
        return None, None
    values.sort()
    a = (1.0 - level) / 2.0
    return percentile(values, a), percentile(values, 1.0 - a)


def auc(bad: Sequence[float], good: Sequence[float], direction: str = "up") -> Optional[float]:
    """P(a value of `bad` lies beyond a value of `good` in the bad direction
    ("up": larger, "down": smaller); ties count 1/2. None if either is empty."""
    if not bad or not good:
        return None
    sign = 1.0 if direction == "up" else -1.0
    wins = sum(1.0 if sign * (x - y) > 0 else 0.5 if x == y else 0.0 for x in bad for y in good)
    return wins / (len(bad) * len(good))


def midranks_doubled(values: Sequence[float]) -> List[int]:
    """Twice the midrank of each value (ties share the mean of their ranks; doubled to stay integral)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            out[order[m]] = (i + 1) + (j + 1)
        i = j + 1
    return out


def permutation_auc_p(bad: Sequence[float], good: Sequence[float], direction: str = "up",
                      seed: int = SEED) -> Tuple[Optional[float], Optional[float]]:
    """(AUC, two-sided p) of the Mann-Whitney test by the permutation
    distribution of the labels: p = the share of arrangements whose AUC is at
    least as far from 1/2 as the observed one; exact by complete enumeration
    when there are at most EXACT_LIMIT arrangements (counted by rank sum),
    else PERMUTATIONS random ones drawn by random.Random(seed),
    p = (b + 1) / (R + 1). The AUC of an arrangement is its rank sum's:
    (R - k (k + 1) / 2) / (k (n - k)) with midranks."""
    observed = auc(bad, good, direction)
    if observed is None:
        return None, None
    sign = 1.0 if direction == "up" else -1.0
    ranks = midranks_doubled([sign * v for v in list(bad) + list(good)])
    n, k = len(ranks), len(bad)
    base = k * (k + 1)  # doubled

    def far(doubled_sum: int) -> bool:
        # |AUC - 1/2| >= |observed - 1/2|, in doubled rank sums: AUC = (S/2 - k(k+1)/2) / (k(n-k)).
        return abs((doubled_sum - base) / (2.0 * k * (n - k)) - 0.5) >= abs(observed - 0.5) - 1e-12

    if math.comb(n, k) <= EXACT_LIMIT:
        counts = [dict() for _ in range(k + 1)]  # counts[j][doubled rank sum] = subsets of size j
        counts[0][0] = 1
        for r in ranks:
            for j in range(min(k, n) - 1, -1, -1):
                for total, c in counts[j].items():
                    counts[j + 1][total + r] = counts[j + 1].get(total + r, 0) + c
        hits = sum(c for total, c in counts[k].items() if far(total))
        return observed, hits / math.comb(n, k)
    rng = random.Random(seed)
    hits = sum(far(sum(rng.sample(ranks, k))) for _ in range(PERMUTATIONS))
    return observed, (hits + 1) / (PERMUTATIONS + 1)


def ols_slope(x: Sequence[float], y: Sequence[float],
              level: float = 0.95) -> Tuple[float, Optional[float], Optional[float], Optional[float]]:
    """(slope, low, high, two-sided p) of the least-squares line y = a + b x:
    the interval b +- t(1 - a/2, n - 2) se(b), p of t = b / se(b) on n - 2
    degrees of freedom; None bounds and p with fewer than 3 points."""
    n = len(x)
    if n != len(y) or n < 2:
        raise ValueError("the slope needs at least 2 points, as many x as y")
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0.0:
        raise ValueError("every x is the same")
    b = sum((a - mx) * (c - my) for a, c in zip(x, y)) / sxx
    if n < 3:
        return b, None, None, None
    residual = sum((c - (my + b * (a - mx))) ** 2 for a, c in zip(x, y))
    se = math.sqrt(residual / (n - 2) / sxx)
    if se == 0.0:
        return b, b, b, (1.0 if b == 0.0 else 0.0)
    half = analyze.t_quantile(1.0 - (1.0 - level) / 2.0, n - 2) * se
    p = min(1.0, 2.0 * (1.0 - analyze.t_cdf(abs(b / se), n - 2)))
    return b, b - half, b + half, p
