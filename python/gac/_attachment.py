"""The Attachment: GAC gating one step target's update (gac/_attach.py says
what gac.attach does with it; gac/_targets.py, which objects can be gated;
gac/_plan.py, how the agent's mode and options are chosen).

An Attachment is made of parts with one job each, all used on the training
thread only:

- :class:`StepGate` replaces the target's ``step`` by a bound method that,
  once per update, runs the optimizer's closure (or takes ``loss=`` out),
  asks the attachment whether to take the update, and takes or skips it;
- the agent, a :class:`gac.Agent`, made once per attachment
  (:func:`build_attachment`) and reconfigured in place afterwards: its
  thresholds and mode when the warm-up ends, its ``process_group`` when a
  ZeRO target's gradient turns out to be partitioned;
- :class:`Warmup`, the calibration: with ``warmup=N`` the first N steps
  observe (monitor mode) and their |c_t| calibrate the thresholds the agent
  controls with from then on;
- :class:`SkipWatch`: the regimes of the last ``skip_window`` updates, and a
  warning (logger "gac") when more than half of them were skipped;
- :class:`ReportFeed`: every report to a :class:`gac.Telemetry`, with the
  caller's scalars.

A skipped update leaves the weights, the optimizer's state and its step
count unchanged, as Algorithm 1 of the paper keeps theta_t = theta_{t-1}.
"""

from __future__ import annotations

import collections
import functools
import logging
import types
from typing import TYPE_CHECKING, Callable, Deque, Dict, Mapping, Optional, Tuple, cast

from gac._controller import CalibrationWindow, suggest_thresholds
from gac._errors import GacError
from gac._native import agent_class
from gac._plan import AgentOptions as AgentOptions  # re-exported: the integrations' Unpack[AgentOptions]
from gac._plan import AttachPlan, plan_attach
from gac.rl import PolicySignals

if TYPE_CHECKING:
    import torch
    import torch.distributed
    from typing_extensions import Unpack

    from gac._agent import Agent
    from gac._controller import CalibrationStats, Mode, StepReport
    from gac._targets import StepFunction, StepTarget
    from gac._transport import Telemetry

logger = logging.getLogger("gac")

# The attribute of GAC's step function that names its StepGate.
_MARK = "__gac_attachment__"

# A function returning the scalars sent with each report ({name: value}).
Scalars = Callable[[], Mapping[str, float]]
# What the gate asks once per update: given the target and the step's loss
# (None when none was given), runs GAC and says whether to take the update.
Judge = Callable[["StepTarget", Optional[object]], bool]


class Attachment:
    """What :func:`gac.attach` installed: the agent, the latest report,
    counters, and :meth:`detach`, which puts the optimizer's own ``step``
    back (the module's text lists its parts).

    agent: the :class:`gac.Agent`, the same object for the attachment's
        life; owns_agent: True when gac made it (it may then give it the
        ZeRO target's ``process_group``), False when it is the caller's,
        used as it is.
    warmup: the calibration of a warm-up, or None; feed: where each report
        is sent (a :class:`gac.Telemetry`, with scalars), None for nowhere.
    skip_window: the number of recent updates the skip warning looks at.
    """

    def __init__(self, agent: Agent, *, owns_agent: bool = False, warmup: Optional[Warmup] = None,
                 feed: Optional[ReportFeed] = None, skip_window: int = 20) -> None:
        self.agent = agent
        self.last_report: Optional[StepReport] = None
        self.reports = 0
        self.skipped = 0
        self.projected = 0
        self.on_report: Optional[Callable[[StepReport], None]] = None
        self._owns_agent = owns_agent
        self._warmup = warmup
        self._feed = feed if feed is not None else ReportFeed()
        self._skips = SkipWatch(skip_window, lambda: self.agent.c_high)
        self._gate = StepGate(self._judge)
        self._step = 0
        self._step_of: Optional[Callable[[], int]] = None
        self._policy: Optional[PolicySignals] = None

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
        return self._skips.fraction

    @property
    def warmup(self) -> int:
        """The steps observed before the thresholds are calibrated (0: no warm-up)."""
        return self._warmup.steps if self._warmup is not None else 0

    @property
    def warming_up(self) -> bool:
        """True while the warm-up observes (before its thresholds are in use)."""
        return self._warmup is not None and self._warmup.running

    @property
    def thresholds(self) -> Optional[Tuple[float, float]]:
        """(c_low, c_high) the warm-up calibrated; None before it ended, or without one."""
        return self._warmup.thresholds if self._warmup is not None else None

    @property
    def calibration(self) -> Optional[CalibrationStats]:
        """The statistics of the warm-up's |c_t| (once it ended)."""
        return self._warmup.stats if self._warmup is not None else None

    @property
    def calibration_error(self) -> Optional[str]:
        """Why the warm-up gave no thresholds (GAC then goes on observing); None otherwise."""
        return self._warmup.error if self._warmup is not None else None

    @property
    def telemetry(self) -> Optional[Telemetry]:
        """The :class:`gac.Telemetry` every report is sent to (None: none)."""
        return self._feed.telemetry

    @telemetry.setter
    def telemetry(self, telemetry: Optional[Telemetry]) -> None:
        self._feed = ReportFeed(telemetry, self._feed.scalars)

    @property
    def scalars(self) -> Optional[Scalars]:
        """The function whose ``{name: value}`` is sent with each report."""
        return self._feed.scalars

    @scalars.setter
    def scalars(self, scalars: Optional[Scalars]) -> None:
        self._feed = ReportFeed(self._feed.telemetry, scalars)

    @property
    def optimizer(self) -> object:
        """The object whose ``step`` is gated (a DeepSpeed engine's ZeRO
        optimizer for the engine); None when detached."""
        return self._gate.target.optimizer if self._gate.target is not None else None

    def metrics(self, prefix: str = "gac/") -> Dict[str, float]:
        """The attachment's counters under flat names: ``skipped_total``,
        ``projected_total``, ``skip_fraction``; ``fallbacks_total`` in remote mode."""
        out = {prefix + "skipped_total": float(self.skipped), prefix + "projected_total": float(self.projected),
               prefix + "skip_fraction": self.skip_fraction}
        if self.agent.mode == "remote":
            out[prefix + "fallbacks_total"] = float(self.agent.fallbacks)
        return out

    def record_policy(self, signals: Optional[PolicySignals]) -> None:
        """Hands over the policy-health signals (:func:`gac.rl.signals`) of
        the batch whose gradient the next gated optimizer step applies: that
        step's report carries them, and so its record in gacd; then they are
        cleared. A later call before that step replaces them (give the
        signals of the whole batch the step applies); None clears them.
        Raises TypeError for anything but a :class:`gac.rl.PolicySignals` or None."""
        if signals is not None and not isinstance(signals, PolicySignals):
            raise TypeError(f"signals must be a gac.rl.PolicySignals or None, got {type(signals).__name__}")
        self._policy = signals

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
        gated = self._gate.target
        if gated is not None:
            if gated.optimizer is target.optimizer:
                return
            self._gate.detach()
        check_not_gated(target)
        if target.group is not None:
            self._use_group(target.group)
        self._gate.hook(target)
        self._step_of = step_of

    def detach(self) -> None:
        """Puts the optimizer's own ``step`` back (idempotent). When something
        wrapped the step after gac (an LR scheduler made later), that wrapper
        stays and gac's inside it only passes the call on."""
        self._gate.detach()

    def __repr__(self) -> str:
        optimizer = type(self.optimizer).__name__ if self._gate.target is not None else None
        return (f"<gac.Attachment optimizer={optimizer} mode={self.agent.mode} steps={self.reports} "
                f"skipped={self.skipped}>")

    # One update: the agent's step, then the parts that follow a report.

    def _judge(self, target: StepTarget, loss: Optional[object]) -> bool:
        self._step = self._step_of() if self._step_of is not None else self._step + 1
        policy, self._policy = self._policy, None
        try:
            # A loss of another type is the agent's TypeError.
            report = self.agent.step(self._step, target.parameters(), loss=cast("Optional[float]", loss),
                                     policy=policy)
        finally:
            target.release()
        # A GradScaler (or DeepSpeed's fp16 loss scaler) finds the same non-finite gradient,
        # skips the update itself and lowers its scale; withheld here, the scale would stay too high.
        withheld = not (report.step_optimizer or (report.regime == "invalid" and target.leaves_invalid_to_scaler()))
        self._record(report, withheld)
        return not withheld

    def _record(self, report: StepReport, withheld: bool) -> None:
        self.last_report = report
        self.reports += 1
        self.skipped += withheld
        if report.regime == "project" and report.gradient_modified:
            self.projected += 1
        self._skips.add(report.regime if withheld else "")
        self._feed.send(report, self.skip_fraction)
        if self.on_report is not None:
            self.on_report(report)
        if self._warmup is not None and self._warmup.add(report.cosine):
            self._end_warmup(self._warmup)

    def _end_warmup(self, warmup: Warmup) -> None:
        if warmup.thresholds is None or warmup.stats is None:
            logger.warning("gac: the warm-up of %d steps gave no thresholds (%s); GAC goes on observing only",
                           warmup.steps, warmup.error)
            return
        c_low, c_high = warmup.thresholds
        # The agent starts over with them, as a new one would: the first controlled step has no reference.
        self.agent.set_thresholds(c_low, c_high)
        self.agent.mode = warmup.control_mode
        logger.info("gac: warm-up of %d steps: q0.9 |c_t| %.4g, max %.4g -> c_low %.4g, c_high %.4g; "
                    "GAC controls from step %d", warmup.steps, warmup.stats.q90, warmup.stats.max, c_low, c_high,
                    self._step + 1)

    def _use_group(self, group: torch.distributed.ProcessGroup) -> None:
        # The partitions of a ZeRO optimizer add up over its data-parallel group: the
        # agent gac made takes it; the caller's must have one.
        if self.agent.process_group is not None:
            return
        if not self._owns_agent:
            raise ValueError("gac.attach: the agent given has no process_group, and a DeepSpeed ZeRO rank holds only "
                             "its partition of the gradient: make it with process_group= the data-parallel group "
                             "(engine.optimizer.dp_process_group)")
        self.agent.process_group = group


class StepGate:
    """One step target's ``step`` behind a judge: :meth:`hook` replaces the
    optimizer's ``step`` by a bound method (as the optimizer's own is: torch's
    LR schedulers wrap ``optimizer.step`` again through its ``__func__``)
    that calls ``judge`` once per update and then takes the update or skips
    it; :meth:`detach` puts the optimizer's own ``step`` back.

    The loss the judge gets (the spike guard reads it) is
    ``optimizer.step(loss=...)``'s, taken out before the optimizer sees it,
    or what the closure of ``optimizer.step(closure)`` returns: the closure
    runs before the judge (GAC reads the gradients it makes), and the
    optimizer's first call of it gets that loss again.
    """

    def __init__(self, judge: Judge) -> None:
        self._judge = judge
        self.target: Optional[StepTarget] = None  # the target gated; None when detached
        self._original: Optional[StepFunction] = None
        self._had_instance_step = False
        self._wrapper: Optional[types.MethodType] = None

    def hook(self, target: StepTarget) -> None:
        """Gates ``target``'s step. REQUIRES: nothing gated (detach() first),
        and no other gate on ``target`` (check_not_gated)."""
        optimizer = target.optimizer
        original: StepFunction = getattr(optimizer, "step")
        gate = self

        @functools.wraps(original)
        def step(opt: object, *args: object, **kwargs: object) -> object:
            if gate.target is not target:  # detached while another wrapper held this one
                return original(*args, **kwargs)
            return gate._gated(target, original, args, kwargs)

        setattr(step, _MARK, self)
        self._had_instance_step = "step" in vars(optimizer)
        self._wrapper = types.MethodType(step, optimizer)
        setattr(optimizer, "step", self._wrapper)
        self.target = target
        self._original = original

    def detach(self) -> None:
        """Puts the optimizer's own ``step`` back (idempotent)."""
        target, self.target = self.target, None
        if target is not None and vars(target.optimizer).get("step") is self._wrapper:
            if self._had_instance_step:
                setattr(target.optimizer, "step", self._original)  # e.g. an LR scheduler's own wrapper
            else:
                delattr(target.optimizer, "step")  # the instance attribute; the class's step shows again
        self._original = None
        self._wrapper = None

    def _gated(self, target: StepTarget, original: StepFunction, args: Tuple[object, ...],
               kwargs: Dict[str, object]) -> object:
        if target.between_updates():
            return original(*args, **kwargs)
        loss = kwargs.pop("loss", None)
        closure, args, kwargs = _run_closure(args, kwargs)
        if closure is not None:
            loss = closure.loss
        if self._judge(target, loss):
            return target.take(original, args, kwargs)
        skipped = target.skip(original, args, kwargs)
        return closure.loss if closure is not None and skipped is None else skipped


class Warmup:
    """The calibration of a warm-up: the c_t of its first ``steps`` reports
    (a :class:`gac.CalibrationWindow`), then the thresholds
    :func:`gac.suggest_thresholds` makes of their |c_t|, or why it made none.
    The agent controls with them in ``control_mode`` from the next step."""

    def __init__(self, steps: int, control_mode: Mode) -> None:
        self.steps = steps
        self.control_mode = control_mode
        self.thresholds: Optional[Tuple[float, float]] = None  # (c_low, c_high)
        self.stats: Optional[CalibrationStats] = None
        self.error: Optional[str] = None
        self._window: Optional[CalibrationWindow] = CalibrationWindow(steps)

    @property
    def running(self) -> bool:
        """True until ``steps`` reports were added."""
        return self._window is not None

    def add(self, cosine: Optional[float]) -> bool:
        """Adds a report's c_t (None: none); True when it ends the warm-up,
        which sets ``stats`` and ``thresholds`` or ``error``."""
        window = self._window
        if window is None:
            return False
        window.add(cosine)
        if window.seen < self.steps:
            return False
        self._window = None
        self.stats = window.stats()
        try:
            self.thresholds = suggest_thresholds(self.stats)
        except GacError as e:  # too few finite cosines, or c_low would not be below c_high
            self.error = str(e)
        return True


class SkipWatch:
    """The last ``window`` updates (the regime of each one withheld, "" for
    one taken), and a warning (logger "gac") when more than half of them
    were withheld, at most once per ``window`` updates. ``c_high`` reads the
    agent's threshold for the warning's text."""

    def __init__(self, window: int, c_high: Callable[[], float]) -> None:
        self.window = window
        self._c_high = c_high
        self._recent: Deque[str] = collections.deque(maxlen=window)
        self._added = 0
        self._warned_at = -window

    @property
    def fraction(self) -> float:
        """The fraction of the recent updates withheld (0 before the first)."""
        return sum(1 for r in self._recent if r) / len(self._recent) if self._recent else 0.0

    def add(self, withheld_regime: str) -> None:
        """Adds an update: the regime it was withheld for, or "" when it was taken."""
        self._recent.append(withheld_regime)
        self._added += 1
        n = len(self._recent)
        skipped = sum(1 for r in self._recent if r)
        if n < self.window or 2 * skipped <= n or self._added - self._warned_at < self.window:
            return
        self._warned_at = self._added
        by = collections.Counter(r for r in self._recent if r)
        spikes, aligned = by.pop("spike", 0), by.pop("skip", 0)
        causes = [f"{aligned} with |c_t| >= c_high = {self._c_high():.3g}"] if aligned else []
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


class ReportFeed:
    """Every report to ``telemetry`` (a :class:`gac.Telemetry`; nothing
    without one), with the scalars ``scalars()`` returns and
    ``gac/skip_fraction``. Raises TypeError for what is neither."""

    def __init__(self, telemetry: Optional[Telemetry] = None, scalars: Optional[Scalars] = None) -> None:
        if scalars is not None and not callable(scalars):
            raise TypeError("scalars must be a function returning {name: value}")
        if telemetry is not None and not callable(getattr(telemetry, "send", None)):
            raise TypeError(f"telemetry must be a gac.Telemetry, got {type(telemetry).__name__}")
        self.telemetry = telemetry
        self.scalars = scalars

    def send(self, report: StepReport, skip_fraction: float, logged: Optional[Mapping[str, float]] = None) -> None:
        """Sends ``report`` with ``logged`` (the trainer's own values of the
        step), then the caller's scalars and ``gac/skip_fraction``."""
        if self.telemetry is None:
            return
        values = dict(logged) if logged else {}
        if self.scalars is not None:
            values.update(self.scalars())
        values["gac/skip_fraction"] = skip_fraction
        self.telemetry.send(report, scalars=values)


def build_attachment(plan: AttachPlan, *, telemetry: Optional[Telemetry] = None,
                     scalars: Optional[Scalars] = None) -> Attachment:
    """The Attachment ``plan`` describes (gac/_plan.py), not yet on any step
    target: the plan's agent, or the one agent made here in the plan's first
    mode, its reports sent to ``telemetry`` with ``scalars()``. Raises
    TypeError for a ``telemetry`` or ``scalars`` of the wrong kind, and the
    Agent's own errors for its options."""
    feed = ReportFeed(telemetry, scalars)
    agent = plan.agent if plan.agent is not None else agent_class()(mode=plan.first_mode, **plan.agent_options)
    warmup = Warmup(plan.warmup, plan.control_mode) if plan.warmup else None
    return Attachment(agent, owns_agent=plan.agent is None, warmup=warmup, feed=feed, skip_window=plan.skip_window)


def make_attachment(*, control: bool = False, mode: Optional[Mode] = None, warmup: int = 0,
                    agent: Optional[Agent] = None, telemetry: Optional[Telemetry] = None,
                    scalars: Optional[Scalars] = None, skip_window: int = 20,
                    **agent_options: Unpack[AgentOptions]) -> Attachment:
    """An Attachment with its agent, not yet on any step target: the
    arguments are gac.attach's (:func:`gac._plan.plan_attach`, then
    :func:`build_attachment`)."""
    plan = plan_attach(control, mode, warmup, agent, skip_window, agent_options)
    return build_attachment(plan, telemetry=telemetry, scalars=scalars)


def check_not_gated(target: StepTarget) -> None:
    """Raises ValueError when an attachment gates ``target``'s step already."""
    gate = getattr(getattr(target.optimizer, "step", None), _MARK, None)
    if isinstance(gate, StepGate) and gate.target is not None and gate.target.optimizer is target.optimizer:
        raise ValueError("gac.attach: this optimizer's step is already gated by gac; detach() the first "
                         "attachment before attaching again")


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
