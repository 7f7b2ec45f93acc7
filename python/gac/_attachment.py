"""The Attachment: GAC gating one optimizer's step (gac/_attach.py says what
gac.attach does with it; gac/_targets.py, which objects can be gated).

The object's ``step`` is replaced by a bound method that, once per update,
runs :meth:`gac.Agent.step` on the parameters the target names (their
gradients are read, and projected in place when GAC projects) and then
takes the step or skips it as the report says. A skipped update leaves the
weights, the optimizer's state and its step count unchanged, as Algorithm 1
of the paper keeps theta_t = theta_{t-1}. With ``warmup=N`` the first N
steps observe (monitor mode); their |c_t| then calibrate the thresholds of
the agent that controls from there on. When more than half of the last
``skip_window`` updates were skipped, a warning is logged (logger "gac").
"""

from __future__ import annotations

import collections
import functools
import logging
import types
from typing import (TYPE_CHECKING, Callable, Deque, Dict, Iterable, Literal, Mapping, Optional, Tuple, TypedDict,
                    Union, cast)

from gac._controller import CalibrationWindow, suggest_thresholds
from gac._errors import GacError
from gac._native import agent_class

if TYPE_CHECKING:
    import torch
    import torch.distributed
    from typing_extensions import Unpack

    from gac._agent import Agent
    from gac._controller import AlphaMode, CalibrationStats, DecisionSource, Mode, StepReport, Trigger
    from gac._dist import ReplicatedOn
    from gac._targets import StepFunction, StepTarget
    from gac._transport import Telemetry

logger = logging.getLogger("gac")

_MODES = ("monitor", "local", "remote")
# suggest_thresholds needs at least this many cosines; the first step has none.
_MIN_WARMUP = 21
# The attribute of GAC's step function that names its Attachment.
_MARK = "__gac_attachment__"

# A function returning the scalars sent with each report ({name: value}).
Scalars = Callable[[], Mapping[str, float]]


class AgentOptions(TypedDict, total=False):
    """The options of :class:`gac.Agent` that gac.attach passes on to the
    agents it makes (all but ``mode``, which attach chooses)."""

    c_low: float
    c_high: float
    alpha_mode: AlphaMode
    snapshot_dtype: Union[torch.dtype, Literal["float32", "bfloat16"]]
    reference: Literal["raw_gradient", "applied_update"]
    layers: Optional[Dict[str, Iterable[torch.Tensor]]]
    groups: Optional[Dict[str, Iterable[torch.Tensor]]]  # deprecated: layers
    process_group: Optional[torch.distributed.ProcessGroup]
    decision_source: Optional[DecisionSource]
    num_threads: int
    chunk_elements: int
    trigger: Trigger
    window: int
    window_c_low: float
    window_c_high: float
    max_grad_norm: Optional[float]
    spike_sigma: Optional[float]
    spike_window: Optional[int]
    spike_warmup: Optional[int]
    passes: Literal["auto", "kernels", "torch"]
    replicated_on: Optional[ReplicatedOn]


# The options of the spike guard: asking for any of them asks for control.
SPIKE_OPTIONS = ("max_grad_norm", "spike_sigma", "spike_window", "spike_warmup")


class Attachment:
    """What :func:`gac.attach` installed: the agent, the latest report,
    counters, and :meth:`detach`, which puts the optimizer's own ``step``
    back.

    agent: the :class:`gac.Agent` (after a warm-up, the one made with the
        calibrated thresholds); agent_made_in: the mode gac made it in, or
        None when it is the caller's, used as it is (a DeepSpeed ZeRO target
        needs a ``process_group``: gac makes its own agent again with one).
    telemetry, scalars: every report is sent to ``telemetry`` with the
        scalars ``scalars()`` returns and ``gac/skip_fraction``.
    warmup, control_mode, agent_options: N steps observed before the
        thresholds are calibrated; then an agent of ``control_mode`` is made
        with them and ``agent_options``.
    skip_window: the number of recent updates the skip warning looks at.

    Used on the training thread only (the optimizer's step).
    """

    def __init__(self, agent: Agent, *, telemetry: Optional[Telemetry] = None, scalars: Optional[Scalars] = None,
                 warmup: int = 0, control_mode: Mode = "local", agent_options: Optional[AgentOptions] = None,
                 skip_window: int = 20, agent_made_in: Optional[Mode] = None) -> None:
        self.agent = agent
        self.telemetry = telemetry
        self.scalars = scalars
        self.last_report: Optional[StepReport] = None
        self.reports = 0
        self.skipped = 0
        self.projected = 0
        self.warmup = warmup
        self.thresholds: Optional[Tuple[float, float]] = None  # (c_low, c_high) the warm-up calibrated
        self.calibration: Optional[CalibrationStats] = None  # of the warm-up's |c_t|
        self.calibration_error: Optional[str] = None
        self.on_report: Optional[Callable[[StepReport], None]] = None
        self._control_mode = control_mode
        self._agent_options: AgentOptions = agent_options.copy() if agent_options else {}
        self._agent_made_in = agent_made_in
        self._calibration_window = CalibrationWindow(warmup) if warmup > 0 else None
        self._skip_window = skip_window
        self._recent: Deque[str] = collections.deque(maxlen=skip_window)  # the withheld updates' regimes, "" if taken
        self._warned_at = -skip_window
        self._step = 0
        # What hook() installed; None when detached.
        self._target: Optional[StepTarget] = None
        self._original_step: Optional[StepFunction] = None
        self._had_instance_step = False
        self._wrapper: Optional[types.MethodType] = None
        self._step_of: Optional[Callable[[], int]] = None

    @property
    def step(self) -> int:
        """The step number of the latest report (0 before the first)."""
        return self._step

    @step.setter
    def step(self, step: int) -> None:
        # Where the numbering goes on after a resume (the next step is step + 1).
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        self._step = step

    @property
    def skip_fraction(self) -> float:
        """The fraction of the last ``skip_window`` updates that GAC skipped (0 before the first)."""
        return sum(1 for r in self._recent if r) / len(self._recent) if self._recent else 0.0

    @property
    def warming_up(self) -> bool:
        """True while the warm-up observes (before its thresholds are in use)."""
        return self._calibration_window is not None

    @property
    def optimizer(self) -> object:
        """The object whose ``step`` is gated (a DeepSpeed engine's ZeRO
        optimizer for the engine); None when detached."""
        return self._target.optimizer if self._target is not None else None

    def metrics(self, prefix: str = "gac/") -> Dict[str, float]:
        """The attachment's counters under flat names: ``skipped_total``,
        ``projected_total``, ``skip_fraction``; ``fallbacks_total`` in remote mode."""
        out = {prefix + "skipped_total": float(self.skipped), prefix + "projected_total": float(self.projected),
               prefix + "skip_fraction": self.skip_fraction}
        if self.agent.mode == "remote":
            out[prefix + "fallbacks_total"] = float(self.agent.fallbacks)
        return out

    def hook(self, target: StepTarget, *, step_of: Optional[Callable[[], int]] = None) -> None:
        """Gates ``target``'s step (``gac._targets.step_target`` makes the
        target of an optimizer, a wrapper, a container or a DeepSpeed
        engine), in place of the step gated before: that one is detached
        first, unless it is the same object's (then nothing changes).

        step_of: returns the step number of each update (a Trainer's
            ``global_step + 1``); by default the number after the latest.

        Raises ValueError, with nothing changed on ``target``, when another
        attachment gates its step, or when its gradient is partitioned
        (ZeRO) and the caller's agent has no ``process_group``.
        """
        optimizer = target.optimizer
        if self._target is not None:
            if self._target.optimizer is optimizer:
                return
            self.detach()
        check_not_gated(target)
        if target.group is not None:
            self._use_group(target.group)
        original: StepFunction = getattr(optimizer, "step")
        attachment = self

        # A bound method, as the optimizer's own step is: torch's LR schedulers
        # wrap optimizer.step again through its __func__.
        @functools.wraps(original)
        def step(opt: object, *args: object, **kwargs: object) -> object:
            if attachment._target is not target:  # detached while another wrapper held this one
                return original(*args, **kwargs)
            return attachment._gated_step(target, original, args, kwargs)

        setattr(step, _MARK, self)
        self._had_instance_step = "step" in vars(optimizer)
        self._wrapper = types.MethodType(step, optimizer)
        setattr(optimizer, "step", self._wrapper)
        self._target = target
        self._original_step = original
        self._step_of = step_of

    def detach(self) -> None:
        """Puts the optimizer's own ``step`` back (idempotent). When something
        wrapped the step after gac (an LR scheduler made later), that wrapper
        stays and gac's inside it only passes the call on."""
        target, self._target = self._target, None
        if target is not None and vars(target.optimizer).get("step") is self._wrapper:
            if self._had_instance_step:
                setattr(target.optimizer, "step", self._original_step)  # e.g. an LR scheduler's own wrapper
            else:
                delattr(target.optimizer, "step")  # the instance attribute; the class's step shows again
        self._original_step = None
        self._wrapper = None

    def __repr__(self) -> str:
        optimizer = type(self.optimizer).__name__ if self._target is not None else None
        return (f"<gac.Attachment optimizer={optimizer} mode={self.agent.mode} steps={self.reports} "
                f"skipped={self.skipped}>")

    # The gated step.

    def _gated_step(self, target: StepTarget, original: StepFunction, args: Tuple[object, ...],
                    kwargs: Dict[str, object]) -> object:
        if target.between_updates():
            return original(*args, **kwargs)
        self._step = self._step_of() if self._step_of is not None else self._step + 1
        # The loss the spike guard reads: optimizer.step(loss=...) (taken out
        # before the optimizer sees it), or what a closure returns: the closure
        # runs here, before GAC reads the gradients it makes, and the
        # optimizer's first call of it gets that loss again.
        loss = kwargs.pop("loss", None)
        closure, args, kwargs = _run_closure(args, kwargs)
        if closure is not None:
            loss = closure.loss
        try:
            # A loss of another type is the agent's TypeError.
            report = self.agent.step(self._step, target.parameters(), loss=cast("Optional[float]", loss))
        finally:
            target.release()
        # A GradScaler (or DeepSpeed's fp16 loss scaler) finds the same non-finite gradient,
        # skips the update itself and lowers its scale; withheld here, the scale would stay too high.
        withheld = not (report.step_optimizer or (report.regime == "invalid" and target.leaves_invalid_to_scaler()))
        self._record(report, withheld)
        if withheld:
            skipped = target.skip(original, args, kwargs)
            return closure.loss if closure is not None and skipped is None else skipped
        return target.take(original, args, kwargs)

    def _record(self, report: StepReport, withheld: bool) -> None:
        self.last_report = report
        self.reports += 1
        self.skipped += withheld
        if report.regime == "project" and report.gradient_modified:
            self.projected += 1
        self._recent.append(report.regime if withheld else "")
        self._warn_if_mostly_skipped()
        if self.telemetry is not None:
            scalars = dict(self.scalars()) if self.scalars is not None else {}
            scalars["gac/skip_fraction"] = self.skip_fraction
            self.telemetry.send(report, scalars=scalars)
        if self.on_report is not None:
            self.on_report(report)
        if self._calibration_window is not None:
            self._calibration_window.add(report.cosine)
            if self._calibration_window.seen >= self.warmup:
                self._end_warmup(self._calibration_window)

    def _warn_if_mostly_skipped(self) -> None:
        n = len(self._recent)
        skipped = sum(1 for r in self._recent if r)
        if n < self._skip_window or 2 * skipped <= n or self.reports - self._warned_at < self._skip_window:
            return
        self._warned_at = self.reports
        by = collections.Counter(r for r in self._recent if r)
        spikes, aligned = by.pop("spike", 0), by.pop("skip", 0)
        causes = [f"{aligned} with |c_t| >= c_high = {self.agent.c_high:.3g}"] if aligned else []
        causes += [f"{spikes} by the spike guard"] if spikes else []
        causes += [f"{count} {regime}" for regime, count in sorted(by.items())]
        advice = []
        if aligned:
            advice.append("the thresholds may not suit this model: calibrate them on it (gac.attach(..., warmup=N), "
                          "gacctl calibrate) or observe only (control=False)")
        if spikes:
            advice.append("the gradient norm or the loss rose above the recent steps and stayed there (a learning-rate "
                          "change, a data or loss-scale shift): the guard follows a level that persists after a run "
                          "of skips; check the data, or loosen spike_sigma")
        if by:
            advice.append("non-finite gradients: check the loss scale and the data")
        logger.warning("gac: %d of the last %d updates were skipped (%s): %s.", skipped, n, ", ".join(causes),
                       "; ".join(advice))

    def _end_warmup(self, window: CalibrationWindow) -> None:
        self._calibration_window = None
        stats = window.stats()
        self.calibration = stats
        try:
            c_low, c_high = suggest_thresholds(stats)
        except GacError as e:  # too few finite cosines, or c_low would not be below c_high
            self.calibration_error = str(e)
            logger.warning("gac: the warm-up of %d steps gave no thresholds (%s); GAC goes on observing only",
                           self.warmup, e)
            return
        options: AgentOptions = {**self._agent_options, "c_low": c_low, "c_high": c_high}
        self.agent = agent_class()(mode=self._control_mode, **options)
        self.thresholds = (c_low, c_high)
        logger.info("gac: warm-up of %d steps: q0.9 |c_t| %.4g, max %.4g -> c_low %.4g, c_high %.4g; "
                    "GAC controls from step %d", self.warmup, stats.q90, stats.max, c_low, c_high,
                    self._step + 1)

    def _use_group(self, group: torch.distributed.ProcessGroup) -> None:
        # The partitions of a ZeRO optimizer add up over its data-parallel group: an
        # agent made here is made again with it; the caller's agent must have a group.
        if self.agent.process_group is not None:
            return
        if self._agent_made_in is None:
            raise ValueError("gac.attach: the agent given has no process_group, and a DeepSpeed ZeRO rank holds only "
                             "its partition of the gradient: make it with process_group= the data-parallel group "
                             "(engine.optimizer.dp_process_group)")
        self._agent_options["process_group"] = group
        self.agent = agent_class()(mode=self._agent_made_in, **self._agent_options)


class _Closure:
    """An optimizer's closure, run once before GAC: its first call returns
    that loss; later calls (an optimizer that evaluates it again) run it."""

    def __init__(self, closure: Callable[[], object]) -> None:
        import torch

        self._closure = closure
        with torch.enable_grad():
            self.loss = closure()
        self._used = False

    def __call__(self) -> object:
        if not self._used:
            self._used = True
            return self.loss
        return self._closure()


def _run_closure(args: Tuple[object, ...], kwargs: Dict[str, object]
                 ) -> Tuple[Optional[_Closure], Tuple[object, ...], Dict[str, object]]:
    # The closure of optimizer.step(closure), run now; the arguments with it in its place.
    given = kwargs.get("closure")
    if callable(given):
        closure = _Closure(given)
        return closure, args, {**kwargs, "closure": closure}
    if args and callable(args[0]):
        closure = _Closure(args[0])
        return closure, (closure,) + args[1:], kwargs
    return None, args, kwargs


def check_not_gated(target: StepTarget) -> None:
    """Raises ValueError when an attachment gates ``target``'s step already."""
    attachment = getattr(getattr(target.optimizer, "step", None), _MARK, None)
    if isinstance(attachment, Attachment) and attachment.optimizer is target.optimizer:
        raise ValueError("gac.attach: this optimizer's step is already gated by gac; detach() the first "
                         "attachment before attaching again")


def resolve_mode(control: bool, mode: Optional[Mode], warmup: int, agent: Optional[Agent],
                 agent_options: AgentOptions, skip_window: int) -> Tuple[Mode, Mode]:
    """Checks attach's choice of control; returns (the first agent's mode, the
    mode after the warm-up). Raises TypeError / ValueError saying what is wrong."""
    if not isinstance(control, bool):
        raise TypeError(f"control must be a bool, got {type(control).__name__}")
    if mode is not None and mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, _MODES))} or None, got {mode!r}")
    if not isinstance(warmup, int) or isinstance(warmup, bool):
        raise TypeError(f"warmup must be an int (steps), got {type(warmup).__name__}")
    if warmup < 0 or 0 < warmup < _MIN_WARMUP:
        raise ValueError(f"warmup must be 0 (none) or at least {_MIN_WARMUP} steps (the calibration needs 20 "
                         f"cosines; the first step has none), got {warmup}")
    if not isinstance(skip_window, int) or isinstance(skip_window, bool) or skip_window < 1:
        raise ValueError(f"skip_window must be an int >= 1, got {skip_window!r}")
    if agent is not None:
        if agent_options or mode is not None or control or warmup:
            raise ValueError("pass either agent= (used as it is, in its own mode) or the options of a new "
                             "agent (control, mode, warmup, c_low, ...), not both")
        return agent.mode, agent.mode
    if control and mode == "monitor":
        raise ValueError("control=True asks GAC to change updates, mode='monitor' never does: pass one")
    if mode is None:
        # The spike guard skips in local and remote mode: asking for it asks for control.
        guard = any(agent_options.get(name) is not None for name in SPIKE_OPTIONS)
        mode = "local" if (control or warmup or guard) else "monitor"
        if mode == "local" and agent_options.get("decision_source") is not None:
            mode = "remote"
    if warmup:
        if mode != "local":
            raise ValueError(f"warmup= calibrates the local thresholds and then controls with them; mode={mode!r} "
                             "does not (in remote mode gacd's run thresholds decide: gacctl calibrate)")
        if "c_low" in agent_options or "c_high" in agent_options:
            raise ValueError("warmup= chooses c_low and c_high itself: pass the warm-up or the thresholds")
        return "monitor", "local"
    return mode, mode


def make_attachment(*, control: bool = False, mode: Optional[Mode] = None, warmup: int = 0,
                    agent: Optional[Agent] = None, telemetry: Optional[Telemetry] = None,
                    scalars: Optional[Scalars] = None, skip_window: int = 20,
                    **agent_options: Unpack[AgentOptions]) -> Attachment:
    """An Attachment with its agent, not yet on any optimizer (attach's and
    GacCallback's common part); the arguments are gac.attach's."""
    first_mode, control_mode = resolve_mode(control, mode, warmup, agent, agent_options, skip_window)
    if scalars is not None and not callable(scalars):
        raise TypeError("scalars must be a function returning {name: value}")
    if telemetry is not None and not callable(getattr(telemetry, "send", None)):
        raise TypeError(f"telemetry must be a gac.Telemetry, got {type(telemetry).__name__}")
    made_in: Optional[Mode] = None
    if agent is None:
        agent = agent_class()(mode=first_mode, **agent_options)
        made_in = first_mode
        if warmup:
            # The thresholds after the warm-up are unknown yet: check the other options now.
            checked: AgentOptions = {**agent_options, "c_low": 0.05, "c_high": 0.3}
            agent_class()(mode="local", **checked)
    return Attachment(agent, telemetry=telemetry, scalars=scalars, warmup=warmup, control_mode=control_mode,
                      agent_options=agent_options, skip_window=skip_window, agent_made_in=made_in)
