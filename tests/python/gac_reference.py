"""GAC in float64 torch operations, written from docs/ALGORITHM.md's algorithm and
independent of gac's code: the oracle the Python tests hold gac.Agent to.

For each step, over the parameters that have a gradient this step:
dot = <g, p>, gg = |g|^2, pp = |p|^2 (p: the parameter's snapshot, zeros
until it has one); c = dot / (sqrt(gg * pp) + 1e-8); no reference (first
step or pp == 0): safe with no cosine; non-finite sums: invalid (skip, the
snapshot kept); |c| <= c_low: safe; |c| >= c_high: skip; otherwise project
g' = g - (1 - alpha) (dot / pp) p with alpha = c_low / |c| ('paper') or
c_low sqrt(1 - c^2) / (|c| sqrt(1 - c_low^2)) ('exact'). The snapshot
becomes the raw gradient (also after a skip), or, with
reference='applied_update', the applied gradient when the optimizer steps.

With trigger='window' the regime is decided on m, the signed mean of the
last W cosines (those of steps with a reference and finite sums, this
step's included), by the window thresholds: fewer than W cosines held or
|m| <= window_c_low: safe; |m| >= window_c_high: skip; otherwise project
with alpha of |m| in place of |c| (coeff (1 - alpha) dot / pp). m is
reported (window_mean) with either trigger; reset() forgets the cosines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

EPS = 1e-8


@dataclass
class RefStep:
    regime: str
    cosine: Optional[float]
    alpha: float
    coeff: float
    dot: float
    gg: float
    pp: float
    step_optimizer: bool
    # The gradients after the step (float64), None where there was none.
    grads: List[Optional[torch.Tensor]]
    # The mean of the last `window` cosines; None until that many.
    window_mean: Optional[float] = None


def decide(dot: float, gg: float, pp: float, has_reference: bool, c_low: float, c_high: float, alpha_mode: str):
    """(regime, cosine, alpha, coeff) for the three sums."""
    if not (math.isfinite(dot) and math.isfinite(gg) and math.isfinite(pp)):
        return "invalid", None, 1.0, 0.0
    if not has_reference or pp == 0.0:
        return "safe", None, 1.0, 0.0
    c = dot / (math.sqrt(gg * pp) + EPS)
    if abs(c) <= c_low:
        return "safe", c, 1.0, 0.0
    if abs(c) >= c_high:
        return "skip", c, 1.0, 0.0
    if alpha_mode == "paper":
        alpha = c_low / abs(c)
    else:
        alpha = c_low * math.sqrt(1.0 - c * c) / (abs(c) * math.sqrt(1.0 - c_low * c_low))
    return "project", c, alpha, (1.0 - alpha) * dot / pp


def alpha_of(a: float, c_low: float, alpha_mode: str) -> float:
    """alpha for |c| (or |m|) = a in the projection band."""
    if alpha_mode == "paper":
        return c_low / a
    return c_low * math.sqrt(1.0 - a * a) / (a * math.sqrt(1.0 - c_low * c_low))


def decide_on_mean(dot: float, gg: float, pp: float, has_reference: bool, mean: Optional[float], c_low: float,
                   c_high: float, alpha_mode: str):
    """(regime, cosine, alpha, coeff) by the windowed rule: the regime of |mean|."""
    if not (math.isfinite(dot) and math.isfinite(gg) and math.isfinite(pp)):
        return "invalid", None, 1.0, 0.0
    if not has_reference or pp == 0.0:
        return "safe", None, 1.0, 0.0
    c = dot / (math.sqrt(gg * pp) + EPS)
    if mean is None or abs(mean) <= c_low:
        return "safe", c, 1.0, 0.0
    if abs(mean) >= c_high:
        return "skip", c, 1.0, 0.0
    alpha = alpha_of(abs(mean), c_low, alpha_mode)
    return "project", c, alpha, (1.0 - alpha) * dot / pp


class ReferenceGac:
    """The fp64 reference agent over a fixed list of parameter shapes."""

    def __init__(
        self,
        c_low: float = 0.05,
        c_high: float = 0.3,
        alpha_mode: str = "paper",
        mode: str = "local",
        reference: str = "raw_gradient",
        snapshot_dtype: torch.dtype = torch.float32,
        trigger: str = "per_step",
        window: int = 20,
        window_c_low: float = 0.05,
        window_c_high: float = 0.3,
    ) -> None:
        self.c_low, self.c_high, self.alpha_mode = c_low, c_high, alpha_mode
        self.trigger, self.window = trigger, window
        self.window_c_low, self.window_c_high = window_c_low, window_c_high
        self.cosines: List[float] = []  # every valid cosine so far (the window is their tail)
        self.mode, self.reference, self.snapshot_dtype = mode, reference, snapshot_dtype
        self.snapshot: Optional[List[Optional[torch.Tensor]]] = None
        self.has_reference = False
        self._written: List[bool] = []  # parameters whose snapshot the last step wrote

    def _stored(self, g: torch.Tensor) -> torch.Tensor:
        # What the snapshot keeps of g: rounded to its dtype.
        return g.to(self.snapshot_dtype).to(torch.float64)

    def step(self, grads: Sequence[Optional[torch.Tensor]],
             dtypes: Optional[Sequence[torch.dtype]] = None) -> RefStep:
        """grads: each parameter's gradient as float64 (already rounded to the
        gradient's dtype), or None for a parameter without one; dtypes: the
        gradients' dtypes (the applied update is what the gradient holds after
        the step, rounded to its dtype; float32 if not given)."""
        if self.snapshot is None:
            self.snapshot = [torch.zeros(g.shape, dtype=torch.float64) if g is not None else None for g in grads]
        snap = self.snapshot
        for i, g in enumerate(grads):
            if snap[i] is None and g is not None:
                snap[i] = torch.zeros(g.shape, dtype=torch.float64)
        dot = gg = pp = 0.0
        for g, p in zip(grads, snap):
            if g is None:
                continue
            assert p is not None
            dot += float((g * p).sum())
            gg += float((g * g).sum())
            pp += float((p * p).sum())
        finite = math.isfinite(dot) and math.isfinite(gg) and math.isfinite(pp)
        if finite and self.has_reference and pp != 0.0:
            self.cosines.append(dot / (math.sqrt(gg * pp) + EPS))
        window_mean = None
        if len(self.cosines) >= self.window:
            window_mean = math.fsum(self.cosines[-self.window:]) / self.window
        if self.trigger == "window":
            regime, cosine, alpha, coeff = decide_on_mean(dot, gg, pp, self.has_reference, window_mean,
                                                          self.window_c_low, self.window_c_high, self.alpha_mode)
        else:
            regime, cosine, alpha, coeff = decide(dot, gg, pp, self.has_reference, self.c_low, self.c_high,
                                                  self.alpha_mode)
        applies = regime in ("safe", "project")
        step_optimizer = self.mode == "monitor" or applies
        project = self.mode != "monitor" and regime == "project"
        out: List[Optional[torch.Tensor]] = []
        for g, p in zip(grads, snap):
            if g is None:
                out.append(None)
                continue
            assert p is not None
            out.append(g - coeff * p if project else g.clone())
        self._written = [False] * len(grads)
        if regime != "invalid":
            applied = self.reference == "applied_update"
            if not applied or step_optimizer:
                self._written = [g is not None for g in grads]
                for i, (g, o) in enumerate(zip(grads, out)):
                    if g is not None:
                        dtype = dtypes[i] if dtypes is not None else torch.float32
                        snap[i] = self._stored(o.to(dtype).to(torch.float64) if applied else g)
                self.has_reference = True
        return RefStep(regime, cosine, alpha, coeff, dot, gg, pp, step_optimizer, out, window_mean)

    def reset(self) -> None:
        """As agent.reset(): no snapshot, no reference, no cosines in the window."""
        self.snapshot = None
        self.has_reference = False
        self.cosines = []

    def adopt_applied(self, applied: Sequence[Optional[torch.Tensor]]) -> None:
        """With reference='applied_update', takes as the snapshot what the
        gradients hold after the step (checked against step()'s own result
        first): the applied update is, by definition, those values, and
        adopting them keeps the two roundings of each projection (gac's
        fp32, this float64) from compounding from step to step."""
        assert self.reference == "applied_update" and self.snapshot is not None
        for i, a in enumerate(applied):
            if a is not None and self._written[i]:
                self.snapshot[i] = self._stored(a.to(torch.float64))


def ulp_tolerance(dtype: torch.dtype) -> float:
    """Relative difference allowed between gac's projected gradient and the
    fp64 reference rounded to `dtype`: one unit in the last place of the
    dtype (both round a value computed at a different precision)."""
    return {torch.float32: 2.0**-22, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]


def subnormal_spacing(dtype: torch.dtype) -> float:
    """The spacing of the dtype's subnormal numbers: below the smallest
    normal number, rounding errors are bounded by this, not relatively
    (fp16's subnormals start at 6.1e-5, in reach of a projected gradient)."""
    return {torch.float32: 2.0**-149, torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24}[dtype]


def close(got: float, want: float, rel: float = 1e-6) -> bool:
    return abs(got - want) <= rel * max(abs(want), 1e-12)


def check_rank_report(report: Dict[str, Any], expected: RefStep, where: str) -> None:
    """A rank's report (its to_dict(numeric=False) values) against the fp64
    reference's step over the full model: the regime, |g|, c_t and |p|."""
    assert report["regime"] == expected.regime, where
    assert close(report["grad_norm"], math.sqrt(expected.gg)), (where, report["grad_norm"], math.sqrt(expected.gg))
    if expected.cosine is None:
        assert report["cosine"] is None, where
    else:
        assert abs(report["cosine"] - expected.cosine) <= 1e-6, (where, report["cosine"], expected.cosine)
        assert close(report["ref_norm"], math.sqrt(expected.pp)), where
