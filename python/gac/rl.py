"""gac.rl: the policy-health signals of an RL step, from the tensors its
policy-gradient loss already has.

One call, :func:`signals`, takes the learner's per-token log-probabilities,
the behaviour (sampler) policy's, the response mask (all B x T) and,
optionally, the advantages, the loss's clip bounds, a truncation bound, the
per-token entropies or the logits, and each sequence's policy version; it
returns a :class:`PolicySignals` (:class:`StepPool` pools the micro-batches
of one optimizer step into one call): the normalised ESS of the importance
weights per token and per sequence, the fractions of tokens the loss
clipped (low and high side) and truncated, the log-ratio tails, the
sampler-learner KL (k3) and the mean absolute log-ratio, the mean entropy
and the batch's staleness in policy versions.

Everything is computed on the tensors' device, under ``torch.no_grad()``,
with no host synchronisation but one: the signals are stacked into one
fp64 vector read back with one ``.tolist()`` (about 20 numbers). No
boolean indexing, no ``.item()``, no data-dependent shape. Torch is
imported when :func:`signals` is first called (``import gac.rl`` works
without it).

docs/PYTHON.md ("Policy-health signals: gac.rl") has the definitions, the
masking, dtype and bad-input rules and the measured cost.
"""

from __future__ import annotations

import logging
import math
import numbers
import operator
import sys
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Sequence, Tuple, Union

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("gac")

__all__ = ["PolicySignals", "SEQUENCE_LEVELS", "StepPool", "signals"]

# The ratio the loss clips and truncates: per token (None), or per sequence,
# broadcast to its tokens: exp of the mean of its log-ratios ("mean": GSPO,
# verl's geometric level) or of their sum ("sum": sequence-level importance
# sampling, the product of the token ratios).
SEQUENCE_LEVELS: Tuple[Optional[str], ...] = (None, "mean", "sum")

# The tails: quantiles of the masked log-ratios (linear interpolation
# between order statistics, numpy's default "linear" method).
_Q_HIGH = 0.99
_Q_LOW = 0.01
# Logits elements per piece of the entropy: on a GPU 2^24 (64 MiB per fp32
# temporary, few kernel launches); on the CPU 2^20 (4 MiB: below glibc's
# mmap threshold, so that the temporaries are reused, not mapped and
# faulted in again for every piece). The numbers do not depend on it.
_LOGITS_PIECE = 1 << 24
_LOGITS_PIECE_CPU = 1 << 20
# What an fp64 value that overflowed is reported as (only kl_k3 can, for a
# log-ratio above ~709: exp overflows).
_DOUBLE_MAX = sys.float_info.max

Number = Union[int, float, str, None]


@dataclass(frozen=True)
class PolicySignals:
    """The policy-health signals of one step (:func:`signals`).

    Every signal is a float, or None when its input was not given (the
    entropy without entropies or logits, the truncated fraction without a
    truncation bound, a clip side whose bound is None, the staleness
    without versions) or when the step is ``invalid``. Fractions are of the
    masked tokens; log-ratios, the KL and the entropy are in nats; the
    staleness in policy versions.

    tokens: the masked tokens counted (n).
    sequences: the sequences with at least one masked token.
    ess_token, ess_sequence: normalised Kish ESS of the importance weights,
        per token and per sequence, in [1/n, 1].
    clip_fraction_low, clip_fraction_high: the fractions of tokens whose
        ratio the loss clipped below 1 - clip_low and above 1 + clip_high.
    truncation_fraction: the fraction of tokens whose ratio exceeds the
        truncation bound.
    log_ratio_max, log_ratio_p99, log_ratio_p1: the largest masked
        log-ratio and its 99th and 1st percentiles, before any truncation.
    kl_k3: the mean over tokens of k3 = (r - 1) - log r, an estimate of
        KL(behaviour || learner).
    log_ratio_abs_mean: the mean over tokens of |log r|.
    entropy_mean: the mean over tokens of the learner's entropy.
    staleness_min, staleness_mean, staleness_max: current_version minus each
        counted sequence's version.
    invalid: None, or why the data gave no signal ("no token", "non-finite
        log-probabilities at 3 of 4096 tokens", ...).
    """

    tokens: int
    sequences: int
    ess_token: Optional[float] = None
    ess_sequence: Optional[float] = None
    clip_fraction_low: Optional[float] = None
    clip_fraction_high: Optional[float] = None
    truncation_fraction: Optional[float] = None
    log_ratio_max: Optional[float] = None
    log_ratio_p99: Optional[float] = None
    log_ratio_p1: Optional[float] = None
    kl_k3: Optional[float] = None
    log_ratio_abs_mean: Optional[float] = None
    entropy_mean: Optional[float] = None
    staleness_min: Optional[float] = None
    staleness_mean: Optional[float] = None
    staleness_max: Optional[float] = None
    invalid: Optional[str] = None

    def to_dict(self, prefix: str = "", *, numeric: bool = False) -> Dict[str, Number]:
        """The fields under the names ``prefix + field``, in the order above.

        numeric: False (the default): every field, always the same keys,
            None for what has no value and ``invalid``'s reason as text (a
            record's fields). True: numbers only, for a logger: absent
            values left out and ``invalid`` as 0 or 1.
        """
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if not isinstance(numeric, bool):
            raise TypeError(f"numeric must be a bool, got {type(numeric).__name__}")
        out: Dict[str, Number] = {}
        for f in fields(self):
            value: Number = getattr(self, f.name)
            if numeric:
                if f.name == "invalid":
                    value = int(value is not None)
                elif value is None:
                    continue
            out[prefix + f.name] = value
        return out


def signals(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    *,
    advantages: Optional[torch.Tensor] = None,
    clip_low: Optional[float] = 0.2,
    clip_high: Optional[float] = 0.2,
    truncation: Optional[float] = None,
    sequence_level: Optional[str] = None,
    entropies: Optional[torch.Tensor] = None,
    logits: Optional[torch.Tensor] = None,
    versions: Union[torch.Tensor, Sequence[int], None] = None,
    current_version: Optional[int] = None,
) -> PolicySignals:
    """The step's policy-health signals, from the loss's own tensors.

    logprobs: (B, T) float: the learner's log pi(y_t), the policy being
        trained (as the loss computes it; its graph is not touched).
    old_logprobs: (B, T) float: the behaviour policy's, the one that
        sampled the tokens (the sampler's, or its recomputation: the
        denominator of the loss's ratio).
    mask: (B, T) bool, integer or float, or None (every token): a token
        counts where ``mask != 0`` (the values are not weights). Padding
        contributes nothing, whatever it holds (NaN included); a sequence
        with no masked token is not a sequence.
    advantages: (B, T) per token or (B,) per sequence, or None.
    clip_low, clip_high: the loss's epsilons: the ratio range is
        [1 - clip_low, 1 + clip_high] (TRL's epsilon_low/high, verl's
        clip_ratio_low/high); None: that side is not clipped (its fraction
        is None).
    truncation: the bound C of truncated or masked importance sampling
        (ratios above C are capped or dropped), or None.
    sequence_level: the ratio the clip and truncation fractions test: None
        (per token), "mean" (per sequence, exp of the mean of its
        log-ratios: GSPO) or "sum" (exp of their sum: sequence-level IS),
        broadcast to the sequence's tokens.
    entropies: (B, T) float: the learner's per-token entropy, or None.
    logits: (B, T, V) float: the learner's logits, when entropies are not
        given: the entropy is computed from them in fp32, in pieces of at
        most 2**24 elements (2**20 on the CPU).
    versions: (B,) integers (a sequence, or a tensor on the log-probs'
        device or the CPU): the policy version that generated each
        sequence; with ``current_version``, the version being trained.

    With r = exp(logprobs - old_logprobs) = pi_learner / pi_behaviour, over
    the n masked tokens. Precision: everything in fp64 (the log-ratio is
    the fp64 difference of the inputs, exact for bf16 and fp16 and for fp32
    values within a factor 2^29 of each other; the weights, the sums and
    the counts), but the entropy from logits, fp32 per token; so CPU and
    CUDA tensors give the same numbers to about 1e-12 (the order of the
    sums), the entropy from logits to about 1e-6.

    - ess_token = (sum r)^2 / (n sum r^2), ess_sequence the same over the
      sequences' weights exp(sum of their log-ratios): computed in log
      space, shifted by the largest log-weight M, (sum e^(log w - M))^2 /
      (n sum e^(2 (log w - M))) = exp(2 LSE(log w) - LSE(2 log w) - log n),
      so log-ratios of +-1000 neither overflow nor vanish.
    - clip_fraction_high: tokens with r > 1 + clip_high and, when
      advantages are given, advantage > 0; clip_fraction_low: r < 1 -
      clip_low and advantage < 0. These are the tokens PPO's
      min(r A, clip(r) A) clips (their gradient through r is zero; an
      advantage of 0 clips nothing). Without advantages: the fractions of
      tokens outside the range on each side, an upper bound on what the
      loss clipped.
    - truncation_fraction: tokens with r > truncation.
    - log_ratio_max, log_ratio_p99, log_ratio_p1: of the masked log r (the
      percentiles interpolate linearly between order statistics).
    - kl_k3: mean of expm1(log r) - log r = (r - 1) - log r >= 0, Schulman's
      k3: with the tokens sampled from the behaviour policy, an unbiased
      estimate of KL(behaviour || learner) per token; reported as the
      largest double (1.8e308) where it overflows fp64 (a log-ratio above
      ~709).
    - log_ratio_abs_mean: mean of |log r|.
    - entropy_mean: mean of the entropies (or of -sum p log p from the
      logits: fp32 per token, max-shifted, about 1e-7 of the entropy plus
      1e-7 nats).
    - staleness_min, staleness_mean, staleness_max: current_version -
      versions over the sequences with a masked token.

    Errors are for programming errors, raised before anything is computed:
    TypeError for an argument of the wrong type (a list for a tensor, a
    string for a bound); ValueError for a shape that does not match (B, T),
    a dtype (integer log-probabilities or advantages, a complex mask, float
    versions), tensors on different devices, a bad bound (negative or NaN
    clip, truncation <= 0), an unknown sequence_level, entropies and logits
    both given, versions without current_version or the other way round;
    and, found with the signals (after their one transfer), a counted
    sequence whose version is ahead of current_version.

    Data that gives no signal is no error: the result has ``invalid`` set
    and every signal None (``tokens`` and ``sequences`` still counted):
    no token (an empty batch, an all-zero mask), and non-finite values at
    masked tokens in the log-probabilities (NaN, +-inf: either policy's),
    the advantages, the entropies or the logits. No signal is ever NaN.
    """
    import torch

    checked = _check(logprobs, old_logprobs, mask, advantages, clip_low, clip_high, truncation,
                     sequence_level, entropies, logits, versions, current_version)
    with torch.no_grad():
        return _compute(checked)


@dataclass(frozen=True)
class _Inputs:
    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    mask: Optional[torch.Tensor]
    advantages: Optional[torch.Tensor]
    clip_low: Optional[float]
    clip_high: Optional[float]
    truncation: Optional[float]
    sequence_level: Optional[str]
    entropies: Optional[torch.Tensor]
    logits: Optional[torch.Tensor]
    versions: Optional[torch.Tensor]
    current_version: Optional[int]


def _check(logprobs: object, old_logprobs: object, mask: object, advantages: object,
           clip_low: object, clip_high: object, truncation: object, sequence_level: object, entropies: object,
           logits: object, versions: object, current_version: object) -> _Inputs:
    import torch as th

    def tensor(name: str, x: object) -> th.Tensor:
        if not isinstance(x, th.Tensor):
            raise TypeError(f"gac.rl.signals: {name} must be a torch.Tensor, got {type(x).__name__}")
        return x

    def floating(name: str, x: th.Tensor) -> None:
        if not x.is_floating_point():
            raise ValueError(f"gac.rl.signals: {name} must be floating point (float32, bfloat16, float16, "
                             f"float64), got {x.dtype}")

    def same_device(name: str, x: th.Tensor) -> None:
        if x.device != lp.device:
            raise ValueError(f"gac.rl.signals: {name} is on {x.device}, logprobs on {lp.device}: "
                             "give every tensor on one device")

    def bound(name: str, x: object, positive: bool) -> Optional[float]:
        if x is None:
            return None
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise TypeError(f"gac.rl.signals: {name} must be a float or None, got {type(x).__name__}")
        value = float(x)
        if math.isnan(value) or value < 0 or (positive and value == 0):
            raise ValueError(f"gac.rl.signals: {name} must be {'> 0' if positive else '>= 0'}, got {x}")
        return value

    lp = tensor("logprobs", logprobs)
    old = tensor("old_logprobs", old_logprobs)
    if lp.dim() != 2:
        raise ValueError(f"gac.rl.signals: logprobs must be (B, T), got shape {tuple(lp.shape)}")
    shape = tuple(lp.shape)
    for name, x in (("logprobs", lp), ("old_logprobs", old)):
        floating(name, x)
        if tuple(x.shape) != shape:
            raise ValueError(f"gac.rl.signals: old_logprobs has shape {tuple(x.shape)}, logprobs {shape}")
        same_device(name, x)
    m: Optional[th.Tensor] = None
    if mask is not None:
        m = tensor("mask", mask)
        if m.is_complex():
            raise ValueError(f"gac.rl.signals: mask must be bool, integer or float, got {m.dtype}")
        if tuple(m.shape) != shape:
            raise ValueError(f"gac.rl.signals: mask has shape {tuple(m.shape)}, logprobs {shape}")
        same_device("mask", m)
    adv: Optional[th.Tensor] = None
    if advantages is not None:
        adv = tensor("advantages", advantages)
        floating("advantages", adv)
        if tuple(adv.shape) not in (shape, shape[:1], (shape[0], 1)):
            raise ValueError(f"gac.rl.signals: advantages must be (B, T) or (B,) = {shape} or {shape[:1]}, "
                             f"got shape {tuple(adv.shape)}")
        same_device("advantages", adv)
    ent: Optional[th.Tensor] = None
    lg: Optional[th.Tensor] = None
    if entropies is not None and logits is not None:
        raise ValueError("gac.rl.signals: give entropies or logits, not both")
    if entropies is not None:
        ent = tensor("entropies", entropies)
        floating("entropies", ent)
        if tuple(ent.shape) != shape:
            raise ValueError(f"gac.rl.signals: entropies has shape {tuple(ent.shape)}, logprobs {shape}")
        same_device("entropies", ent)
    if logits is not None:
        lg = tensor("logits", logits)
        floating("logits", lg)
        if lg.dim() != 3 or tuple(lg.shape[:2]) != shape or lg.shape[2] == 0:
            raise ValueError(f"gac.rl.signals: logits must be (B, T, V) with (B, T) = {shape} and V >= 1, "
                             f"got shape {tuple(lg.shape)}")
        same_device("logits", lg)
    if sequence_level not in SEQUENCE_LEVELS:
        raise ValueError(f"gac.rl.signals: sequence_level must be one of {SEQUENCE_LEVELS}, got {sequence_level!r}")
    ver: Optional[th.Tensor] = None
    current: Optional[int] = None
    if (versions is None) != (current_version is None):
        raise ValueError("gac.rl.signals: give versions and current_version together (the staleness is "
                         "current_version - versions)")
    if versions is not None:
        if isinstance(versions, th.Tensor):
            ver = versions
        elif isinstance(versions, (list, tuple)):
            try:
                if any(isinstance(v, bool) for v in versions):
                    raise TypeError
                ver = th.tensor([operator.index(v) for v in versions], dtype=th.int64)
            except TypeError:
                raise TypeError("gac.rl.signals: versions must be integers") from None
        else:
            raise TypeError(f"gac.rl.signals: versions must be a tensor or a sequence of ints, "
                            f"got {type(versions).__name__}")
        if ver.is_floating_point() or ver.is_complex() or ver.dtype == th.bool:
            raise ValueError(f"gac.rl.signals: versions must be integers, got {ver.dtype}")
        if tuple(ver.shape) != shape[:1]:
            raise ValueError(f"gac.rl.signals: versions must be (B,) = {shape[:1]}, got shape {tuple(ver.shape)}")
        if ver.device != lp.device and ver.device.type != "cpu":
            raise ValueError(f"gac.rl.signals: versions is on {ver.device}, logprobs on {lp.device}: give versions "
                             "on the log-probabilities' device or on the CPU")
        if isinstance(current_version, bool):
            raise TypeError("gac.rl.signals: current_version must be an int, got bool")
        try:
            current = operator.index(current_version)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"gac.rl.signals: current_version must be an int, "
                            f"got {type(current_version).__name__}") from None
    return _Inputs(lp, old, m, adv, bound("clip_low", clip_low, False), bound("clip_high", clip_high, False),
                   bound("truncation", truncation, True), sequence_level if isinstance(sequence_level, str) else None,
                   ent, lg, ver, current)


def _log_bound(x: float) -> float:
    """log(x), -inf for x <= 0."""
    return math.log(x) if x > 0 else -math.inf


def _entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """(B, T) fp32 entropies -sum softmax(z) log softmax(z) of (B, T, V)
    logits, in pieces of at most _LOGITS_PIECE (on the CPU
    _LOGITS_PIECE_CPU) elements: slices, never a copy of the whole. Per
    row, with s = z - max z: H = log S + (sum e^s (-s)) / S, S = sum e^s >=
    1: two non-negative terms, no cancellation. -inf logits (a masked
    vocabulary) contribute nothing; a row with a NaN or +inf, or all -inf,
    gives NaN (the caller makes it invalid)."""
    import torch as th

    b_size, t_size, v_size = logits.shape
    out = th.empty((b_size, t_size), dtype=th.float32, device=logits.device)
    lowest = th.finfo(th.float32).min
    piece = _LOGITS_PIECE_CPU if logits.device.type == "cpu" else _LOGITS_PIECE
    per_t = max(1, min(t_size, piece // v_size))
    per_b = max(1, min(b_size, piece // (per_t * v_size)))
    for b0 in range(0, b_size, per_b):
        for t0 in range(0, t_size, per_t):
            piece_in = logits[b0:b0 + per_b, t0:t0 + per_t]
            z = piece_in.float()
            if z is piece_in:                     # fp32 logits: the caller's, not to be written
                s = z - z.amax(-1, keepdim=True)
            else:                                 # a copy of ours: in place
                s = z.sub_(z.amax(-1, keepdim=True))
            s.clamp_(min=lowest)                  # -inf -> lowest: e^s = 0 and 0 * s = 0, not NaN
            e = s.exp()
            total = e.sum(-1)
            e.mul_(s)
            out[b0:b0 + per_b, t0:t0 + per_t] = total.log() - e.sum(-1) / total
    return out


def _compute(x: _Inputs) -> PolicySignals:
    import torch as th

    lp = x.logprobs.detach()
    b_size, t_size = lp.shape
    count = lp.numel()
    if count == 0:
        return PolicySignals(tokens=0, sequences=0, invalid="no token")
    f64 = th.float64
    inf = math.inf
    if x.mask is None:
        m = th.ones_like(lp, dtype=th.bool)
    else:
        m = x.mask if x.mask.dtype == th.bool else x.mask != 0
    # The log-ratio: the fp64 difference of the inputs (exact for bf16 and
    # fp16, and for fp32 values within a factor 2^29), and fp64 from here
    # on: k3 of a log-ratio x is about x^2 / 2, which fp32's expm1(x) - x
    # gets to only 2^-23 / |x| (1e-5 at x = 0.01), and fp32 sums over a
    # million tokens lose about 1e-6.
    raw = lp.to(f64) - x.old_logprobs.detach().to(f64)
    lr = th.where(m, raw, 0.0)                    # padding: 0, whatever it held
    lr_abs = lr.abs()
    per_seq = th.count_nonzero(m, dim=1)
    n = per_seq.sum().to(f64)
    has = per_seq > 0
    n_seq = th.count_nonzero(has).to(f64)
    # Names and values of the one vector read back, in order.
    names: List[str] = ["tokens", "sequences", "bad_logprobs"]
    # Non-finite at a masked token: |lr| is NaN or inf (padding is 0).
    values: List[torch.Tensor] = [n, n_seq, count - th.count_nonzero(lr_abs <= _DOUBLE_MAX).to(f64)]

    def put(name: str, value: torch.Tensor) -> None:
        names.append(name)
        values.append(value.to(f64))

    # The tails, from the top and bottom k order statistics of the masked
    # log-ratios (k covers the 1% of n <= B*T nearest each end; topk needs
    # no host value, as kthvalue's k or boolean indexing would).
    lw = th.where(m, raw, -inf).reshape(-1)       # log w; padding: w = 0
    k = min(count, (count - 1) // 100 + 2)
    top = lw.topk(k, largest=True, sorted=True).values                               # descending
    bottom = th.where(m, raw, inf).reshape(-1).topk(k, largest=False, sorted=True).values  # ascending
    top_max = top[0]
    last = (n - 1).clamp(min=0)
    last_i = last.to(th.int64)

    def percentile(q: float, ordered: torch.Tensor, descending: bool) -> torch.Tensor:
        pos = q * last
        lo = th.floor(pos)
        frac = pos - lo
        i_lo = lo.to(th.int64)
        i_hi = th.minimum(i_lo + 1, last_i)
        if descending:                            # ascending index i is descending index n - 1 - i
            i_lo, i_hi = last_i - i_lo, last_i - i_hi
        a = ordered.index_select(0, i_lo.clamp(0, k - 1).reshape(1))[0]
        b = ordered.index_select(0, i_hi.clamp(0, k - 1).reshape(1))[0]
        return a + frac * (b - a)

    # Kish's ESS in log space, shifted by the largest log-weight M:
    # (sum w)^2 / (n sum w^2) = (sum e^(log w - M))^2 / (n sum e^(2 (log w - M))),
    # each term in [0, 1] and the largest 1: no overflow, nothing lost that counts.
    shifted = th.exp(lw - top_max)
    put("ess_token", shifted.sum().square() / (n * th.dot(shifted, shifted)))
    seq_lr = lr.sum(1)
    seq_lw = th.where(has, seq_lr, -inf)
    seq_shifted = th.exp(seq_lw - seq_lw.max())
    put("ess_sequence", seq_shifted.sum().square() / (n_seq * th.dot(seq_shifted, seq_shifted)))

    # The fractions clipped and truncated. The token bounds hold 0 between
    # them (log(1 - clip_low) <= 0 <= log(1 + clip_high)): padding (lr = 0)
    # is never outside; truncation tests lw (padding -inf).
    adv: Optional[torch.Tensor] = None
    if x.advantages is not None:
        adv = x.advantages.detach()
        if adv.dim() == 1:
            adv = adv.unsqueeze(1)
        put("bad_advantages", th.count_nonzero(m & ~th.isfinite(adv)))
    low_bound = _log_bound(1.0 - x.clip_low) if x.clip_low is not None else None
    high_bound = math.log1p(x.clip_high) if x.clip_high is not None else None
    trunc_bound = math.log(x.truncation) if x.truncation is not None else None
    if x.sequence_level is None:
        def tokens_where(outside: torch.Tensor, sign: int) -> torch.Tensor:
            # Masked tokens outside the bound (and, with advantages, of the sign that clips).
            if adv is None:
                return th.count_nonzero(outside)
            if adv.shape[1] == 1:                 # per sequence: count per row, then select rows
                return (th.count_nonzero(outside, dim=1) * (adv[:, 0] * sign > 0)).sum()
            return th.count_nonzero(outside & (adv * sign > 0))
        if low_bound is not None:
            put("clip_fraction_low", tokens_where(lr < low_bound, -1) / n)
        if high_bound is not None:
            put("clip_fraction_high", tokens_where(lr > high_bound, 1) / n)
        if trunc_bound is not None:
            put("truncation_fraction", th.count_nonzero(lw > trunc_bound) / n)
    else:
        # One ratio per sequence, tested once and counted for each of its masked tokens.
        level = seq_lr if x.sequence_level == "sum" else seq_lr / per_seq.clamp(min=1).to(f64)

        def sequences_where(outside: torch.Tensor, sign: int) -> torch.Tensor:
            if adv is None:
                per_row = per_seq
            elif adv.shape[1] == 1:
                per_row = per_seq * (adv[:, 0] * sign > 0)
            else:
                per_row = th.count_nonzero(m & (adv * sign > 0), dim=1)
            return (per_row * outside).sum()
        if low_bound is not None:
            put("clip_fraction_low", sequences_where(level < low_bound, -1) / n)
        if high_bound is not None:
            put("clip_fraction_high", sequences_where(level > high_bound, 1) / n)
        if trunc_bound is not None:
            put("truncation_fraction", (per_seq * (level > trunc_bound)).sum() / n)

    put("log_ratio_max", top_max)
    put("log_ratio_p99", percentile(_Q_HIGH, top, True))
    put("log_ratio_p1", percentile(_Q_LOW, bottom, False))
    # k3 = (r - 1) - log r summed as sum expm1(lr) - sum lr (padding: 0 in both).
    put("kl_k3", (th.expm1(lr).sum() - seq_lr.sum()) / n)
    put("log_ratio_abs_mean", lr_abs.sum() / n)

    entropy: Optional[torch.Tensor] = None
    if x.entropies is not None:
        entropy = x.entropies.detach()
    elif x.logits is not None:
        entropy = _entropy_from_logits(x.logits.detach())
    if entropy is not None:
        masked_entropy = th.where(m, entropy.to(f64), 0.0)
        put("bad_entropies", count - th.count_nonzero(masked_entropy.abs() <= _DOUBLE_MAX))
        put("entropy_mean", masked_entropy.sum() / n)

    if x.versions is not None and x.current_version is not None:
        # From the CPU: a copy to the device that waits for nothing (no stream synchronisation).
        stale = (x.current_version - x.versions.to(device=lp.device, dtype=th.int64, non_blocking=True)).to(f64)
        put("staleness_min", th.where(has, stale, inf).min())
        put("staleness_mean", th.where(has, stale, 0.0).sum() / n_seq)
        put("staleness_max", th.where(has, stale, -inf).max())

    # The one device-to-host transfer.
    read: List[float] = th.stack(values).tolist()
    return _result(dict(zip(names, read)), x)


def _result(got: Dict[str, float], x: _Inputs) -> PolicySignals:
    """The signals from the values read back: invalid for data that gives
    none, an fp64 overflow as the largest double, never a NaN."""
    tokens, sequences = int(got.pop("tokens")), int(got.pop("sequences"))
    if x.versions is not None and tokens > 0 and got["staleness_min"] < 0:
        raise ValueError(f"gac.rl.signals: a sequence's version is ahead of current_version "
                         f"{x.current_version} (staleness {got['staleness_min']:g})")
    bad = {what: int(got.pop(key, 0)) for what, key in (
        ("log-probabilities", "bad_logprobs"), ("advantages", "bad_advantages"),
        ("entropies" if x.entropies is not None else "logits", "bad_entropies"))}
    reason: Optional[str] = None
    if tokens == 0:
        reason = "no token"
    else:
        reason = next((f"non-finite {what} at {k} of {tokens} tokens" for what, k in bad.items() if k), None)
    if reason is None:
        for key, value in got.items():
            if math.isnan(value):                # not expected from finite inputs: never report a NaN
                reason = f"{key} is NaN"
            elif math.isinf(value):              # an fp64 overflow (kl_k3 above a log-ratio of ~709)
                got[key] = math.copysign(_DOUBLE_MAX, value)
    if reason is not None:
        return PolicySignals(tokens=tokens, sequences=sequences, invalid=reason)
    g = got.get
    return PolicySignals(
        tokens=tokens, sequences=sequences, ess_token=g("ess_token"), ess_sequence=g("ess_sequence"),
        clip_fraction_low=g("clip_fraction_low"), clip_fraction_high=g("clip_fraction_high"),
        truncation_fraction=g("truncation_fraction"), log_ratio_max=g("log_ratio_max"),
        log_ratio_p99=g("log_ratio_p99"), log_ratio_p1=g("log_ratio_p1"), kl_k3=g("kl_k3"),
        log_ratio_abs_mean=g("log_ratio_abs_mean"), entropy_mean=g("entropy_mean"),
        staleness_min=g("staleness_min"), staleness_mean=g("staleness_mean"), staleness_max=g("staleness_max"))


class PolicyRecorder(Protocol):
    """What takes a step's signals: :class:`gac.Attachment` (``gac.attach``'s)."""

    def record_policy(self, signals: Optional[PolicySignals]) -> None: ...


class StepPool:
    """The policy-gradient loss's tensors of the micro-batches of one
    optimizer step, and :func:`gac.rl.signals` over their union.

    Each :meth:`add` keeps references to (detached) tensors of one
    micro-batch; :meth:`flush` pads them to the longest (mask 0), stacks
    the sequences and hands the signals to an attachment. Not thread-safe:
    the training thread's.
    """

    def __init__(self) -> None:
        self._batches: List[Dict[str, torch.Tensor]] = []
        self._options: Dict[str, Any] = {}

    def __len__(self) -> int:
        """The micro-batches held."""
        return len(self._batches)

    def add(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, *,
            advantages: Optional[torch.Tensor] = None, entropies: Optional[torch.Tensor] = None,
            **options: Any) -> None:
        """Adds a micro-batch: :func:`gac.rl.signals`' tensors (B, T) and,
        in ``options``, its other arguments (the step's last ones are used).
        Advantages of one per sequence, (B,) or (B, 1), are broadcast to (B, T)."""
        rows, cols = logprobs.shape
        batch = {"logprobs": logprobs.detach(), "old_logprobs": old_logprobs.detach(), "mask": mask.detach()}
        if advantages is not None:
            a = advantages.detach()
            batch["advantages"] = a.reshape(rows, 1).expand(rows, cols) if a.numel() == rows else a
        if entropies is not None:
            batch["entropies"] = entropies.detach()
        self._batches.append(batch)
        self._options = options

    def clear(self) -> None:
        """Drops what was added."""
        self._batches = []

    def signals(self) -> Optional[PolicySignals]:
        """The signals of every micro-batch added, as one batch; None when
        none was added."""
        if not self._batches:
            return None
        cols = max(b["logprobs"].shape[1] for b in self._batches)
        keys = [k for k in self._batches[-1] if all(k in b for b in self._batches)]
        t = {k: _stack([b[k] for b in self._batches], cols) for k in keys}
        return signals(t["logprobs"], t["old_logprobs"], t["mask"], advantages=t.get("advantages"),
                       entropies=t.get("entropies"), **self._options)

    def flush(self, attachment: PolicyRecorder) -> None:
        """Hands the signals of what was added to ``attachment`` (for its
        next optimizer step), then clears; nothing when nothing was added.
        Tensors :func:`gac.rl.signals` refuses (a programming error of the
        trainer's side, never its data) are logged, not raised into the
        trainer's step: that step then carries no signals."""
        if not self._batches:
            return
        try:
            attachment.record_policy(self.signals())
        except (TypeError, ValueError) as e:
            logger.warning("gac: no policy-health signals for this step: %s", e)
            attachment.record_policy(None)
        finally:
            self.clear()


def _stack(parts: List[torch.Tensor], cols: int) -> torch.Tensor:
    # Right-padded with zeros (mask 0: the padding counts for nothing) to `cols` columns, then stacked.
    import torch

    return torch.cat([p if p.shape[1] == cols else torch.cat([p, p.new_zeros(p.shape[0], cols - p.shape[1])], 1)
                      for p in parts])
