"""gac.rl.signals against a reference written here, independently of the
module: plain Python loops over the masked tokens, in float64 (the math
module, math.fsum) or, where float64 cannot hold the weights (log-ratios of
+-1000), in mpmath at 60 digits. The reference takes the inputs' own
values (a bf16 log-probability is the float64 number it stands for) and
the definitions of docs/PYTHON.md ("Policy-health signals: gac.rl"); it
calls nothing of gac.

Bounds: 1e-6 relative (and 1e-12 absolute, for the zeros) for fp32, bf16
and fp16 inputs alike. gac.rl takes the log-ratio as the float64 difference
of the inputs, which is exact for bf16 and fp16 (8 and 11 significant bits)
and for nearly every pair of fp32 values, and computes every sum in
float64; so bf16 adds no error of gac's own: the rounding of the
log-probabilities to bf16 (2^-9 of each, up to 0.01 nats in a log-ratio of
log-probabilities near -6) is the trainer's, and the reference sees the
same rounded values. The one float32 computation is the entropy from
logits (per token, about 1e-7 of it): 1e-6 relative on the mean holds for
the logits here (entropies about 1 to 2 nats). Also: hand-computed batches,
log-ratios of +-80 and +-1000, every bad input, and the one device-to-host
transfer (on the meta device, where any other read of a value raises, and
by recording every torch call on CPU tensors).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import mpmath
import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import gac.rl
from gac.rl import PolicySignals, signals

DOUBLE_MAX = sys.float_info.max
FIELDS = ["tokens", "sequences", "ess_token", "ess_sequence", "clip_fraction_low", "clip_fraction_high",
          "truncation_fraction", "log_ratio_max", "log_ratio_p99", "log_ratio_p1", "kl_k3", "log_ratio_abs_mean",
          "entropy_mean", "staleness_min", "staleness_mean", "staleness_max", "invalid"]


# ---------------------------------------------------------------------------
# The reference.

def _rows(t: Optional[torch.Tensor]) -> Any:
    """A tensor's values as nested lists of Python floats (exact: float64 holds bf16, fp16 and fp32)."""
    return None if t is None else t.detach().to(torch.float64).tolist()


def _quantile(ordered: Sequence[Any], q: float) -> Any:
    """Linear interpolation between order statistics (numpy's "linear")."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])


def reference(lp: torch.Tensor, old: torch.Tensor, mask: Optional[torch.Tensor] = None, *,
              advantages: Optional[torch.Tensor] = None, clip_low: Optional[float] = 0.2,
              clip_high: Optional[float] = 0.2, truncation: Optional[float] = None,
              sequence_level: Optional[str] = None, entropies: Optional[torch.Tensor] = None,
              logits: Optional[torch.Tensor] = None, versions: Optional[Sequence[int]] = None,
              current_version: Optional[int] = None, exact: bool = False) -> Dict[str, Any]:
    """Every signal by its definition, token by token. exact: in mpmath
    (60 digits) instead of float64, for weights float64 cannot hold."""
    if exact:
        mpmath.mp.dps = 60
        num: Any = mpmath.mpf
        exp, log, fsum = mpmath.exp, mpmath.log, mpmath.fsum
    else:
        num = float
        exp, log, fsum = math.exp, math.log, math.fsum
    a, b = _rows(lp), _rows(old)
    rows, cols = len(a), len(a[0]) if a else 0
    inside = _rows(mask) if mask is not None else [[1.0] * cols for _ in range(rows)]
    tokens = [(i, j) for i in range(rows) for j in range(cols) if inside[i][j] != 0]
    seqs = [i for i in range(rows) if any(inside[i][j] != 0 for j in range(cols))]
    n = len(tokens)
    lr = {(i, j): num(a[i][j]) - num(b[i][j]) for (i, j) in tokens}
    out: Dict[str, Any] = {"tokens": n, "sequences": len(seqs)}
    w = [exp(lr[t]) for t in tokens]
    out["ess_token"] = fsum(w) ** 2 / (n * fsum(x * x for x in w))
    seq_sum = {i: fsum(lr[(i, j)] for j in range(cols) if inside[i][j] != 0) for i in seqs}
    seq_n = {i: sum(1 for j in range(cols) if inside[i][j] != 0) for i in seqs}
    sw = [exp(seq_sum[i]) for i in seqs]
    out["ess_sequence"] = fsum(sw) ** 2 / (len(seqs) * fsum(x * x for x in sw))

    def ratio(t: Tuple[int, int]) -> Any:
        if sequence_level == "mean":
            return exp(seq_sum[t[0]] / seq_n[t[0]])
        if sequence_level == "sum":
            return exp(seq_sum[t[0]])
        return exp(lr[t])

    adv = _rows(advantages)

    def advantage(t: Tuple[int, int]) -> Optional[float]:
        if adv is None:
            return None
        row = adv[t[0]]
        return float(row) if not isinstance(row, list) else float(row[t[1]] if len(row) > 1 else row[0])

    if clip_low is not None:
        out["clip_fraction_low"] = sum(1 for t in tokens if ratio(t) < 1 - num(clip_low) and
                                       (adv is None or advantage(t) < 0)) / n  # type: ignore[operator]
    if clip_high is not None:
        out["clip_fraction_high"] = sum(1 for t in tokens if ratio(t) > 1 + num(clip_high) and
                                        (adv is None or advantage(t) > 0)) / n  # type: ignore[operator]
    if truncation is not None:
        out["truncation_fraction"] = sum(1 for t in tokens if ratio(t) > truncation) / n
    ordered = sorted(lr[t] for t in tokens)
    out["log_ratio_max"] = ordered[-1]
    out["log_ratio_p99"] = _quantile(ordered, 0.99)
    out["log_ratio_p1"] = _quantile(ordered, 0.01)
    out["kl_k3"] = fsum((exp(lr[t]) - 1) - lr[t] for t in tokens) / n
    out["log_ratio_abs_mean"] = fsum(abs(lr[t]) for t in tokens) / n
    if entropies is not None:
        e = _rows(entropies)
        out["entropy_mean"] = fsum(num(e[i][j]) for (i, j) in tokens) / n
    if logits is not None:
        z = _rows(logits)
        per_token = []
        for (i, j) in tokens:
            row = [num(v) for v in z[i][j]]
            top = max(row)
            total = fsum(exp(v - top) for v in row)
            # H = -sum p log p, p = e^(v - top) / total; entries of p = 0 (v = -inf) contribute nothing.
            per_token.append(-fsum(exp(v - top) / total * ((v - top) - log(total)) for v in row if v != -math.inf))
        out["entropy_mean"] = fsum(per_token) / n
    if versions is not None:
        assert current_version is not None
        stale = [current_version - versions[i] for i in seqs]
        out["staleness_min"], out["staleness_max"] = min(stale), max(stale)
        out["staleness_mean"] = sum(stale) / len(stale)
    return {k: (float(v) if k not in ("tokens", "sequences") else v) for k, v in out.items()}


def assert_matches(got: PolicySignals, want: Dict[str, Any], rel: float = 1e-6, abs_tol: float = 1e-12) -> None:
    assert got.invalid is None, got.invalid
    d = got.to_dict()
    for key in FIELDS[:-1]:
        if key not in want:
            assert d[key] is None, f"{key}: {d[key]} given no input for it"
            continue
        value, expected = d[key], want[key]
        assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)
        if expected == math.inf:                  # beyond float64: the largest double
            assert value == DOUBLE_MAX, (key, value)
        else:
            assert math.isclose(value, expected, rel_tol=rel, abs_tol=abs_tol), (key, value, expected)


# ---------------------------------------------------------------------------
# Random masked batches.

def batch(seed: int, rows: int, cols: int, dtype: torch.dtype, spread: float = 0.3,
          garbage: bool = True) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs, old_logprobs, mask): log-probabilities in (-6, 0], log-ratios
    of about `spread`, right padding of random lengths (one sequence all
    padding), a few holes, and garbage (NaN, inf) in the padding."""
    g = torch.Generator().manual_seed(seed)
    old = -6 * torch.rand(rows, cols, generator=g, dtype=torch.float64)
    lp = old + spread * torch.randn(rows, cols, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    lengths[rows // 2] = 0
    mask = torch.arange(cols)[None, :] < lengths[:, None]
    mask &= torch.rand(rows, cols, generator=g) > 0.05
    lp, old = lp.to(dtype), old.to(dtype)
    if garbage:
        lp[~mask] = math.nan
        old[~mask] = math.inf
    return lp, old, mask


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_signal_against_the_reference(dtype: torch.dtype) -> None:
    lp, old, mask = batch(1, 12, 96, dtype)
    g = torch.Generator().manual_seed(2)
    adv_seq = torch.randn(12, generator=g).to(dtype)
    adv_tok = torch.randn(12, 96, generator=g).to(dtype)
    entropies = (2 * torch.rand(12, 96, generator=g)).to(dtype)
    entropies[~mask] = math.nan
    versions = [int(v) for v in torch.randint(90, 101, (12,), generator=g)]
    for kwargs in (
        {},
        {"advantages": adv_seq, "truncation": 1.2},
        {"advantages": adv_tok, "clip_low": 0.1, "clip_high": 0.28, "truncation": 2.0},
        {"advantages": adv_seq.unsqueeze(1), "clip_low": None, "clip_high": 0.05},
        {"advantages": adv_tok, "sequence_level": "mean", "truncation": 1.05, "clip_low": 0.02, "clip_high": 0.02},
        {"advantages": adv_seq, "sequence_level": "sum", "truncation": 3.0},
        {"sequence_level": "sum", "clip_low": 0.5, "clip_high": None},
        {"entropies": entropies, "versions": versions, "current_version": 100},
        {"clip_low": 1.0, "clip_high": math.inf, "truncation": math.inf},
    ):
        got = signals(lp, old, mask, **kwargs)  # type: ignore[arg-type]
        assert_matches(got, reference(lp, old, mask, **kwargs))  # type: ignore[arg-type]
    # The fractions are not all zero: the test tests something.
    got = signals(lp, old, mask, advantages=adv_seq, truncation=1.2)
    assert got.clip_fraction_low and got.clip_fraction_high and got.truncation_fraction


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_entropy_from_logits_against_the_reference(dtype: torch.dtype) -> None:
    lp, old, mask = batch(3, 6, 40, torch.float32)
    g = torch.Generator().manual_seed(4)
    logits = (2 * torch.randn(6, 40, 11, generator=g)).to(dtype)
    logits[:, :, 3] = -math.inf                 # a masked vocabulary entry: contributes nothing
    logits[~mask] = math.nan                    # padding rows of garbage
    before = logits.clone()
    got = signals(lp, old, mask, logits=logits)
    torch.testing.assert_close(logits, before, rtol=0, atol=0, equal_nan=True)   # the caller's logits untouched
    want = reference(lp, old, mask, logits=logits)
    assert 0.5 < want["entropy_mean"] < math.log(10)
    assert_matches(got, want)


def test_entropy_from_logits_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pieces smaller than a row of T and than one token's row: the same numbers.
    lp, old, mask = batch(5, 5, 30, torch.float32)
    logits = 3 * torch.randn(5, 30, 17, generator=torch.Generator().manual_seed(6))
    whole = signals(lp, old, mask, logits=logits)
    for piece in (17 * 7, 17 * 30 * 2, 5):
        monkeypatch.setattr(gac.rl, "_LOGITS_PIECE_CPU", piece)
        parts = signals(lp, old, mask, logits=logits.transpose(0, 1).contiguous().transpose(0, 1))
        assert parts.entropy_mean == pytest.approx(whole.entropy_mean, rel=1e-12)
    assert_matches(whole, reference(lp, old, mask, logits=logits))


def test_larger_batches_and_the_percentiles_ends() -> None:
    # The percentiles come from the top and bottom 1% of B*T: few tokens
    # among many, all of them, one and two tokens.
    lp, old, _ = batch(7, 40, 500, torch.float32, garbage=False)
    g = torch.Generator().manual_seed(8)
    for mask in (torch.rand(40, 500, generator=g) < 0.003, torch.ones(40, 500, dtype=torch.bool),
                 torch.rand(40, 500, generator=g) < 0.7):
        assert_matches(signals(lp, old, mask), reference(lp, old, mask))
    one = torch.zeros(40, 500, dtype=torch.bool)
    one[3, 7] = True
    got = signals(lp, old, one)
    value = float(lp[3, 7].double() - old[3, 7].double())
    assert got.log_ratio_max == got.log_ratio_p99 == got.log_ratio_p1 == value
    assert got.ess_token == got.ess_sequence == 1.0 and (got.tokens, got.sequences) == (1, 1)
    one[3, 9] = True
    assert_matches(signals(lp, old, one), reference(lp, old, one))


def test_the_reference_percentile_is_numpys_linear() -> None:
    values = sorted(np.random.default_rng(0).normal(size=537).tolist())
    for q in (0.01, 0.99, 0.5):
        assert _quantile(values, q) == pytest.approx(float(np.quantile(values, q, method="linear")), rel=1e-14)


# ---------------------------------------------------------------------------
# By hand.

def test_a_batch_computed_by_hand() -> None:
    # Three sequences, T = 3. Log-ratios (learner - behaviour), "." padding:
    #   seq 0: log 2, 0, .      r = 2, 1
    #   seq 1: log 1/2, ., .    r = 1/2
    #   seq 2: ., ., .          no token: not a sequence
    # n = 3 tokens, 2 sequences.
    # ESS per token: (2 + 1 + 1/2)^2 / (3 (4 + 1 + 1/4)) = 12.25 / 15.75 = 7/9.
    # Sequence weights: exp(log 2 + 0) = 2 and 1/2: 2.5^2 / (2 (4 + 1/4)) = 6.25 / 8.5 = 25/34.
    # Clip 0.2/0.2, no advantages: low r < 0.8: {1/2} = 1/3; high r > 1.2: {2} = 1/3.
    #   Advantages (+1, +1): low needs A < 0: 0; high: 1/3. (-1, -1): low 1/3, high 0.
    # Truncation 1.5: r > 1.5: {2}: 1/3.
    # k3 = (r - 1) - log r: 1 - log 2, 0, -1/2 + log 2; sum 1/2, mean 1/6.
    # |log r|: log 2, 0, log 2: mean 2 log 2 / 3. Max log 2.
    # Sorted log-ratios (-log 2, 0, log 2): p99 at 0.99 * 2 = 1.98: 0 + 0.98 log 2; p1 at 0.02: -0.98 log 2.
    # Entropies 1, 2 and 3 at the tokens (NaN and 99 in the padding): mean 2.
    # Versions (7, 9, 0), current 10: staleness 3 and 1 (seq 2 is not a sequence): min 1, mean 2, max 3.
    # sequence_level="mean": seq 0's ratio is exp(log 2 / 2) = 1.414 > 1.2: both its tokens high, 2/3;
    #   seq 1: 1/2 < 0.8: 1/3 low; truncation 1.5: 1.414 is not above: 0.
    # sequence_level="sum": seq 0's ratio 2: high 2/3, truncated 2/3; seq 1: low 1/3.
    ln2 = math.log(2)
    old = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    lp = old + torch.tensor([[ln2, 0.0, 5.0], [-ln2, 7.0, 7.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    entropies = torch.tensor([[1.0, 2.0, 99.0], [3.0, math.nan, math.nan], [math.nan] * 3])
    got = signals(lp, old, mask, truncation=1.5, entropies=entropies, versions=[7, 9, 0], current_version=10)
    expected = dict(tokens=3, sequences=2, ess_token=7 / 9, ess_sequence=25 / 34, clip_fraction_low=1 / 3,
                    clip_fraction_high=1 / 3, truncation_fraction=1 / 3, log_ratio_max=ln2,
                    log_ratio_p99=0.98 * ln2, log_ratio_p1=-0.98 * ln2, kl_k3=1 / 6,
                    log_ratio_abs_mean=2 * ln2 / 3, entropy_mean=2.0, staleness_min=1.0, staleness_mean=2.0,
                    staleness_max=3.0)
    assert got.invalid is None
    assert {k: v for k, v in got.to_dict().items() if k != "invalid"} == pytest.approx(expected, rel=1e-12, abs=1e-15)
    up = signals(lp, old, mask, advantages=torch.tensor([1.0, 1.0, -5.0], dtype=torch.float64))
    down = signals(lp, old, mask, advantages=torch.tensor([-1.0, -1.0, 5.0], dtype=torch.float64))
    assert (up.clip_fraction_low, up.clip_fraction_high) == (0.0, pytest.approx(1 / 3))
    assert (down.clip_fraction_low, down.clip_fraction_high) == (pytest.approx(1 / 3), 0.0)
    zero = signals(lp, old, mask, advantages=torch.zeros(3, 3, dtype=torch.float64))
    assert (zero.clip_fraction_low, zero.clip_fraction_high) == (0.0, 0.0)   # A = 0 clips nothing
    mean = signals(lp, old, mask, sequence_level="mean", truncation=1.5)
    assert (mean.clip_fraction_low, mean.clip_fraction_high, mean.truncation_fraction) == pytest.approx(
        (1 / 3, 2 / 3, 0))
    total = signals(lp, old, mask, sequence_level="sum", truncation=1.5)
    assert (total.clip_fraction_low, total.clip_fraction_high, total.truncation_fraction) == pytest.approx(
        (1 / 3, 2 / 3, 2 / 3))
    # What does not depend on the clip's level is the same.
    assert (mean.ess_token, mean.kl_k3) == (got.ess_token, got.kl_k3)
    # The reference agrees with the hand.
    assert reference(lp, old, mask, truncation=1.5, entropies=entropies, versions=[7, 9, 0],
                     current_version=10) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_identical_policies() -> None:
    lp, _, mask = batch(9, 4, 20, torch.bfloat16, garbage=False)
    got = signals(lp, lp.clone(), mask, advantages=torch.randn(4))
    assert (got.ess_token, got.ess_sequence, got.kl_k3, got.log_ratio_abs_mean) == (1.0, 1.0, 0.0, 0.0)
    assert (got.clip_fraction_low, got.clip_fraction_high, got.log_ratio_max, got.log_ratio_p99,
            got.log_ratio_p1) == (0.0, 0.0, 0.0, 0.0, 0.0)


# ---------------------------------------------------------------------------
# Extreme log-ratios.

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_log_ratios_of_80_in_float64(dtype: torch.dtype) -> None:
    # e^80 = 5.5e34 and its square fit in float64: the reference sums the weights directly.
    lp, old, mask = batch(10, 8, 50, dtype, spread=2.0)
    lp[0, 0], old[0, 0], mask[0, 0] = 0.0, -80.0, True
    lp[1, 3], old[1, 3], mask[1, 3] = -80.0, 0.0, True
    lp[2, 5], old[2, 5], mask[2, 5] = -1.0, -81.0, True
    adv = torch.randn(8, generator=torch.Generator().manual_seed(16))
    for level in (None, "mean"):
        got = signals(lp, old, mask, advantages=adv, truncation=2.0, sequence_level=level)
        assert_matches(got, reference(lp, old, mask, advantages=adv, truncation=2.0, sequence_level=level))
    assert got.log_ratio_max == 80.0 and got.ess_token is not None and got.ess_token < 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_log_ratios_of_1000(dtype: torch.dtype) -> None:
    # Four tokens in one row; log-ratios as given.
    # (+1000, 0, 0, 0): the one weight e^1000 dwarfs the others: ESS = (e^1000 + 3)^2 / (4 (e^2000 + 3)) = 1/4
    #   (to 1e-430); k3 = e^1000 - 1001 overflows float64: the largest double; |log r| mean 250.
    # (-1000, 0, 0, 0): ESS = (3 + e^-1000)^2 / (4 (3 + e^-2000)) = 9/12 = 3/4; k3 = (e^-1000 - 1 + 1000) / 4 = 999/4.
    # (+1000, -1000, 0, 0): ESS 1/4. All +1000: ESS 1.
    cases = {(1000.0, 0.0, 0.0, 0.0): (0.25, math.inf), (-1000.0, 0.0, 0.0, 0.0): (0.75, 999 / 4),
             (1000.0, -1000.0, 0.0, 0.0): (0.25, math.inf), (1000.0, 1000.0, 1000.0, 1000.0): (1.0, math.inf)}
    for log_ratios, (ess, k3) in cases.items():
        lp = torch.tensor([log_ratios], dtype=dtype)
        old = torch.zeros(1, 4, dtype=dtype)
        got = signals(lp, old, torch.ones(1, 4), truncation=2.0)
        assert got.invalid is None and got.ess_token == pytest.approx(ess, rel=1e-12)
        assert got.kl_k3 == (DOUBLE_MAX if k3 == math.inf else pytest.approx(k3, rel=1e-12))
        assert got.log_ratio_abs_mean == pytest.approx(sum(abs(v) for v in log_ratios) / 4)
        assert all(math.isfinite(v) for v in got.to_dict(numeric=True).values())
        assert_matches(got, reference(lp, old, torch.ones(1, 4), truncation=2.0, exact=True))
    # Over many rows, sequences of +-1000 per token (sums of +-2e5) against the mpmath reference.
    g = torch.Generator().manual_seed(11)
    log_ratios = torch.randint(-1, 2, (6, 200), generator=g).to(torch.float64) * 1000
    old = -torch.rand(6, 200, generator=g, dtype=torch.float64).to(dtype)
    lp = (old.double() + log_ratios).to(dtype)
    mask = torch.rand(6, 200, generator=g) < 0.5
    assert_matches(signals(lp, old, mask, truncation=2.0), reference(lp, old, mask, truncation=2.0, exact=True))


# ---------------------------------------------------------------------------
# Bad input.

def _ok() -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return batch(12, 3, 5, torch.float32, garbage=False)


@pytest.mark.parametrize("change, message", [
    (lambda a: dict(a, old_logprobs=a["old_logprobs"][:, :4]), "old_logprobs has shape"),
    (lambda a: dict(a, mask=a["mask"][:2]), "mask has shape"),
    (lambda a: dict(a, logprobs=a["logprobs"][0], old_logprobs=a["old_logprobs"][0], mask=a["mask"][0]),
     "must be \\(B, T\\)"),
    (lambda a: dict(a, logprobs=a["logprobs"][None], old_logprobs=a["old_logprobs"][None], mask=a["mask"][None]),
     "must be \\(B, T\\)"),
    (lambda a: dict(a, logprobs=a["logprobs"].to(torch.int64)), "floating point"),
    (lambda a: dict(a, old_logprobs=a["old_logprobs"].to(torch.int32)), "floating point"),
    (lambda a: dict(a, mask=a["mask"].to(torch.complex64)), "mask must be bool, integer or float"),
    (lambda a: dict(a, mask=a["mask"].to("meta")), "on one device"),
    (lambda a: dict(a, advantages=torch.zeros(3, 4)), "advantages must be"),
    (lambda a: dict(a, advantages=torch.zeros(4)), "advantages must be"),
    (lambda a: dict(a, advantages=torch.zeros(3, dtype=torch.int64)), "floating point"),
    (lambda a: dict(a, entropies=torch.zeros(3, 4)), "entropies has shape"),
    (lambda a: dict(a, logits=torch.zeros(3, 5)), "logits must be"),
    (lambda a: dict(a, logits=torch.zeros(3, 5, 0)), "logits must be"),
    (lambda a: dict(a, logits=torch.zeros(3, 4, 7)), "logits must be"),
    (lambda a: dict(a, logits=torch.zeros(3, 5, 7), entropies=torch.zeros(3, 5)), "not both"),
    (lambda a: dict(a, clip_low=-0.1), "clip_low must be >= 0"),
    (lambda a: dict(a, clip_high=math.nan), "clip_high must be >= 0"),
    (lambda a: dict(a, truncation=0.0), "truncation must be > 0"),
    (lambda a: dict(a, sequence_level="token"), "sequence_level must be one of"),
    (lambda a: dict(a, versions=[1, 2, 3]), "together"),
    (lambda a: dict(a, current_version=3), "together"),
    (lambda a: dict(a, versions=[1, 2], current_version=3), "versions must be \\(B,\\)"),
    (lambda a: dict(a, versions=torch.tensor([1.0, 2.0, 3.0]), current_version=3), "versions must be integers"),
    (lambda a: dict(a, versions=[1, 2, 5], current_version=3), "ahead of current_version"),
    (lambda a: dict(a, versions=torch.zeros(3, dtype=torch.int64, device="meta"), current_version=3),
     "on the log-probabilities' device or on the CPU"),
])
def test_programming_errors_raise_value_error(change: Callable[[Dict[str, Any]], Dict[str, Any]],
                                              message: str) -> None:
    lp, old, mask = _ok()
    args = change({"logprobs": lp, "old_logprobs": old, "mask": mask})
    with pytest.raises(ValueError, match=message):
        signals(**args)


@pytest.mark.parametrize("kwargs", [
    {"logprobs": [[0.0]]}, {"mask": [[1]]}, {"advantages": [1.0, 2.0, 3.0]}, {"clip_low": "0.2"},
    {"clip_high": True}, {"versions": "abc", "current_version": 1}, {"versions": [1, 2, 3], "current_version": 1.5},
    {"versions": [1, 2.0, 3], "current_version": 4},
])
def test_wrong_types_raise_type_error(kwargs: Dict[str, Any]) -> None:
    lp, old, mask = _ok()
    args: Dict[str, Any] = {"logprobs": lp, "old_logprobs": old, "mask": mask, **kwargs}
    with pytest.raises(TypeError):
        signals(**args)


def _assert_invalid(got: PolicySignals, reason: str, tokens: int) -> None:
    assert got.invalid is not None and reason in got.invalid, got.invalid
    assert got.tokens == tokens
    d = got.to_dict()
    assert all(d[k] is None for k in FIELDS if k not in ("tokens", "sequences", "invalid")), d
    assert got.to_dict(numeric=True) == {"tokens": got.tokens, "sequences": got.sequences, "invalid": 1}


def test_data_without_a_signal_is_invalid_not_an_error() -> None:
    lp, old, mask = _ok()
    n = int(mask.sum())
    _assert_invalid(signals(lp, old, torch.zeros_like(mask)), "no token", 0)
    _assert_invalid(signals(lp, old, torch.zeros(3, 5)), "no token", 0)
    _assert_invalid(signals(lp[:0], old[:0], mask[:0]), "no token", 0)
    _assert_invalid(signals(lp[:, :0], old[:, :0], mask[:, :0], versions=[1, 2, 3], current_version=3), "no token", 0)
    i, j = [int(v) for v in mask.nonzero()[0]]
    for bad in (math.nan, math.inf, -math.inf):
        for which in ("lp", "old"):
            a, b = lp.clone(), old.clone()
            (a if which == "lp" else b)[i, j] = bad
            _assert_invalid(signals(a, b, mask), f"non-finite log-probabilities at 1 of {n} tokens", n)
    a = lp.clone()
    a[mask] = math.nan
    _assert_invalid(signals(a.bfloat16(), old.bfloat16(), mask), f"at {n} of {n} tokens", n)
    adv = torch.randn(3, 5)
    adv[i, j] = math.nan
    _assert_invalid(signals(lp, old, mask, advantages=adv), "non-finite advantages", n)
    adv = torch.randn(3)
    adv[i] = math.inf
    _assert_invalid(signals(lp, old, mask, advantages=adv), "non-finite advantages", n)
    ent = torch.rand(3, 5)
    ent[i, j] = math.nan
    _assert_invalid(signals(lp, old, mask, entropies=ent), "non-finite entropies at 1 of", n)
    for row in ([math.nan] * 4, [0.0, math.inf, 0.0, 0.0], [-math.inf] * 4):
        logits = torch.randn(3, 5, 4)
        logits[i, j] = torch.tensor(row)
        _assert_invalid(signals(lp, old, mask, logits=logits), "non-finite logits at 1 of", n)


def test_garbage_in_the_padding_is_ignored() -> None:
    lp, old, mask = _ok()
    clean = signals(lp, old, mask, advantages=torch.randn(3, 5, generator=torch.Generator().manual_seed(1)),
                    entropies=torch.rand(3, 5, generator=torch.Generator().manual_seed(2)),
                    versions=[4, 5, 6], current_version=6)
    a, b = lp.clone(), old.clone()
    a[~mask], b[~mask] = math.nan, -math.inf
    adv = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    ent = torch.rand(3, 5, generator=torch.Generator().manual_seed(2))
    adv[~mask], ent[~mask] = math.inf, math.nan
    dirty = signals(a, b, mask.to(torch.float32), advantages=adv, entropies=ent, versions=[4, 5, 6],
                    current_version=6)
    assert dirty == clean and dirty.invalid is None
    # A sequence with no token is not a sequence, whatever its version says.
    lp2, old2, mask2 = lp.clone(), old.clone(), mask.clone()
    mask2[1] = False
    got = signals(lp2, old2, mask2, versions=[4, -100, 6], current_version=6)
    assert (got.sequences, got.staleness_max) == (2, 2.0)


def test_never_a_nan_and_never_a_raise_for_random_garbage() -> None:
    g = torch.Generator().manual_seed(13)
    choices = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e30, -1e30, 80.0, -1000.0])
    for trial in range(60):
        shape = (int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 7, (1,), generator=g)))
        pick = torch.randint(0, len(choices), (2, *shape), generator=g)
        values = choices[pick]
        mask = torch.rand(shape, generator=g) < 0.6
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            got = signals(values[0].to(dtype), values[1].to(dtype), mask, truncation=2.0,
                          advantages=torch.randn(shape[0], generator=g))
            for key, value in got.to_dict().items():
                if isinstance(value, float):
                    assert math.isfinite(value), (trial, key, value)
            assert (got.invalid is None) == (got.ess_token is not None), got


# ---------------------------------------------------------------------------
# The one device-to-host transfer.

HOST_READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "__complex__", "numpy", "cpu",
              "__array__", "__format__", "__repr__", "__str__", "__iter__"}
DATA_DEPENDENT_SHAPES = {"nonzero", "nonzero_static", "argwhere", "masked_select", "unique", "unique_consecutive",
                         "repeat_interleave", "bincount", "where_one_arg", "_local_scalar_dense"}


class _Calls(TorchFunctionMode):
    """Every torch function and Tensor method called, by name (and whether an
    index was a bool tensor: boolean indexing, a host synchronisation)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: List[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", str(func))
        if name in ("__getitem__", "__setitem__") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for i in (args[1] if isinstance(args[1], tuple) else (args[1],))):
            name += "[bool]"
        if name == "to" and args[0].device.type != "cpu" and any(
                str(a) == "cpu" for a in list(args[1:]) + list((kwargs or {}).values())):
            name = "cpu"
        if name == "where" and len(args) == 1:
            name = "where_one_arg"
        self.names.append(name)
        return func(*args, **(kwargs or {}))


ALL_INPUTS: List[Dict[str, Any]] = [
    {},
    {"advantages": "seq", "truncation": 2.0, "entropies": True, "versions": True},
    {"advantages": "tok", "sequence_level": "mean", "truncation": 2.0, "logits": True},
    {"advantages": "seq", "sequence_level": "sum", "clip_low": None, "versions": "list"},
]


def _inputs(device: str, spec: Dict[str, Any]) -> Tuple[List[torch.Tensor], Dict[str, Any]]:
    g = torch.Generator().manual_seed(14)
    lp, old, mask = (t.to(device) for t in batch(15, 4, 9, torch.bfloat16))
    kwargs: Dict[str, Any] = {k: v for k, v in spec.items() if k in ("truncation", "sequence_level", "clip_low")}
    if spec.get("advantages") == "seq":
        kwargs["advantages"] = torch.randn(4, generator=g).to(device)
    if spec.get("advantages") == "tok":
        kwargs["advantages"] = torch.randn(4, 9, generator=g).to(device)
    if spec.get("entropies"):
        kwargs["entropies"] = torch.rand(4, 9, generator=g).to(device)
    if spec.get("logits"):
        kwargs["logits"] = torch.randn(4, 9, 6, generator=g).to(device)
    if spec.get("versions") == "list":             # from the host
        kwargs["versions"], kwargs["current_version"] = [3, 4, 5, 5], 5
    elif spec.get("versions"):
        kwargs["versions"], kwargs["current_version"] = torch.tensor([3, 4, 5, 5]).to(device), 5
    return [lp, old, mask], kwargs


@pytest.mark.parametrize("spec", ALL_INPUTS, ids=str)
def test_one_transfer_on_the_meta_device(spec: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # Meta tensors have no values: any read of one (item, bool, a copy to the
    # host, boolean indexing, nonzero) raises. Only tolist is let through.
    reads: List[Tuple[int, ...]] = []

    def tolist(self: torch.Tensor) -> Any:
        reads.append(tuple(self.shape))
        return [0.0] * self.numel()             # no token: the result is "invalid"

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    args, kwargs = _inputs("meta", spec)
    got = signals(*args, **kwargs)
    assert got.invalid == "no token"
    assert len(reads) == 1 and len(reads[0]) == 1 and reads[0][0] <= 24, reads


@pytest.mark.parametrize("spec", ALL_INPUTS, ids=str)
def test_one_transfer_on_cpu_tensors(spec: Dict[str, Any]) -> None:
    # Every torch call the module makes, recorded: one host read (tolist),
    # no operation whose output shape depends on the values.
    args, kwargs = _inputs("cpu", spec)
    with _Calls() as calls:
        got = signals(*args, **kwargs)
    assert got.invalid is None
    reads = [n for n in calls.names if n in HOST_READS or n.endswith("[bool]")]
    assert reads == ["tolist"], reads
    assert not set(calls.names) & DATA_DEPENDENT_SHAPES, set(calls.names) & DATA_DEPENDENT_SHAPES


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("spec", ALL_INPUTS, ids=str)
def test_cuda_same_numbers_and_one_synchronisation(spec: Dict[str, Any]) -> None:
    args, kwargs = _inputs("cpu", spec)
    on_cpu = signals(*args, **kwargs)
    cuda_args, cuda_kwargs = _inputs("cuda", spec)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            on_cuda = signals(*cuda_args, **cuda_kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    a, b = on_cpu.to_dict(), on_cuda.to_dict()
    for key in FIELDS:
        if isinstance(a[key], float):
            # fp64 everywhere but the entropy from logits (fp32 per token, the devices' exp differ by an ulp)
            rel = 1e-6 if key == "entropy_mean" else 1e-12
            assert b[key] == pytest.approx(a[key], rel=rel, abs=1e-15), key
        else:
            assert a[key] == b[key], key


# ---------------------------------------------------------------------------
# The result and the module.

def test_to_dict_has_stable_keys() -> None:
    lp, old, mask = _ok()
    got = signals(lp, old, mask)
    assert list(got.to_dict()) == FIELDS
    assert list(got.to_dict("rl/")) == ["rl/" + f for f in FIELDS]
    numeric = got.to_dict(numeric=True)
    assert all(type(v) in (int, float) for v in numeric.values())
    assert set(FIELDS) - set(numeric) == {"truncation_fraction", "entropy_mean", "staleness_min", "staleness_mean",
                                          "staleness_max"}
    assert numeric["invalid"] == 0
    with pytest.raises(TypeError):
        got.to_dict(1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        got.to_dict(numeric="yes")  # type: ignore[arg-type]
    with pytest.raises(Exception):
        got.kl_k3 = 1.0  # type: ignore[misc]  # frozen


def test_the_docs_table_names_every_field() -> None:
    root = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))
    text = (root / "docs" / "PYTHON.md").read_text()
    section = text[text.index("## Policy-health signals: `gac.rl`"):]
    section = section[:section.index("\n## ")]
    table = section[section.index("| field | definition | unit |"):].split("\n\n")[0].splitlines()[2:]
    named = {name for line in table for name in re.findall(r"`([a-z0-9_]+)`", line.split(" | ")[0])}
    assert named == set(FIELDS), set(FIELDS) ^ named


def test_the_learners_graph_is_untouched() -> None:
    lp, old, mask = _ok()
    leaf = lp.clone().requires_grad_()
    got = signals(leaf * 1.0, old, mask, logits=torch.randn(3, 5, 4, requires_grad=True))
    assert got.invalid is None and leaf.grad is None


def test_import_needs_no_torch() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys, gac.rl; assert 'torch' not in sys.modules, 'torch'"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
