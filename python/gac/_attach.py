"""gac.attach: GAC on a trainer's optimizer step in one line.

    attachment = gac.attach(optimizer)                 # observe: c_t and the regime, nothing changed
    attachment = gac.attach(optimizer, control=True)   # GAC projects and skips updates
    attachment = gac.attach(optimizer, warmup=100)     # observe 100 steps, calibrate, then control
    attachment = gac.attach(trainer, control=True)     # a transformers / TRL Trainer (GacCallback)
    attachment = gac.attach(engine)                    # a DeepSpeed engine: its ZeRO optimizer (1, 2, 3)

The optimizer's ``step`` is wrapped: before the update it runs
:meth:`gac.Agent.step` on the parameters the optimizer updates (their
gradients are read, and projected in place when GAC projects), and it calls
the original ``step`` only when the report says so. A skipped update leaves
the weights, the optimizer's state and its step count unchanged, as
Algorithm 1 of the paper keeps theta_t = theta_{t-1}.

Safe by default: without ``control=True``, an explicit ``mode=`` or a
``warmup=``, the agent only observes (monitor mode). The paper's thresholds
are for language models; on another model they can skip most updates, so
control is something to ask for, ideally with thresholds calibrated on the
model itself (``warmup=N``). When more than half of the last
``skip_window`` updates were skipped, a warning is logged (logger "gac")
and ``skip_fraction`` says so.

DeepSpeed ZeRO: the ZeRO optimizer's ``step`` is wrapped instead, and the
agent reads this rank's gradient partition, summed over the data-parallel
group (gac/_deepspeed.py says where the partitions are and what a skip does).
"""

from __future__ import annotations

import collections
import functools
import logging
import types
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Tuple, cast

if TYPE_CHECKING:
    from gac._controller import Mode

logger = logging.getLogger("gac")

_MODES = ("monitor", "local", "remote")
# suggest_thresholds needs at least this many cosines; the first step has none.
_MIN_WARMUP = 21


class Attachment:
    """What :func:`attach` installed: the agent, the latest report, counters,
    and :meth:`detach`, which puts the optimizer's own ``step`` back.

    Used on the training thread only (the optimizer's step).
    """

    def __init__(self, agent: Any, *, telemetry: Any = None,
                 scalars: Optional[Callable[[], Dict[str, float]]] = None, warmup: int = 0,
                 control_mode: str = "local", agent_options: Optional[Dict[str, Any]] = None,
                 skip_window: int = 20) -> None:
        self.agent = agent
        self.telemetry = telemetry
        self.scalars = scalars
        self.last_report: Any = None
        self.reports = 0
        self.skipped = 0
        self.projected = 0
        self.warmup = warmup
        self.thresholds: Optional[Tuple[float, float]] = None  # (c_low, c_high) the warm-up calibrated
        self.calibration: Any = None  # gac.CalibrationStats of the warm-up
        self.calibration_error: Optional[str] = None
        self.on_report: Optional[Callable[[Any], None]] = None
        self._control_mode = control_mode
        self._agent_options = dict(agent_options or {})
        self._calibration_window: Any = None
        if warmup > 0:
            from gac import CalibrationWindow
            self._calibration_window = CalibrationWindow(warmup)
        self._skip_window = skip_window
        self._recent: Deque[bool] = collections.deque(maxlen=skip_window)
        self._warned_at = -skip_window
        self._optimizer: Any = None
        self._original_step: Optional[Callable[..., Any]] = None
        self._had_instance_step = False
        self._wrapper: Any = None
        self._step = 0
        self._step_of: Optional[Callable[[], int]] = None
        self._params: List[Any] = []
        self._params_key: List[Any] = []
        self._zero: Any = None  # gac._deepspeed.ZeroGradients when a ZeRO optimizer's step is gated
        self._first_mode: Optional[str] = None  # the mode the agent was made in here (None: the caller's agent)

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
        return sum(self._recent) / len(self._recent) if self._recent else 0.0

    @property
    def warming_up(self) -> bool:
        """True while the warm-up observes (before its thresholds are in use)."""
        return self._calibration_window is not None

    def metrics(self, prefix: str = "gac/") -> Dict[str, float]:
        """The attachment's counters under flat names: ``skipped_total``,
        ``projected_total``, ``skip_fraction``; ``fallbacks_total`` in remote mode."""
        out = {prefix + "skipped_total": float(self.skipped), prefix + "projected_total": float(self.projected),
               prefix + "skip_fraction": self.skip_fraction}
        if self.agent.mode == "remote":
            out[prefix + "fallbacks_total"] = float(self.agent.fallbacks)
        return out

    # The optimizer whose step is gated; its parameters are what the agent reads.
    def _wrap(self, optimizer: Any, step_of: Optional[Callable[[], int]] = None) -> None:
        from gac import _deepspeed
        zero_optimizer = _deepspeed.attach_target(optimizer)  # a DeepSpeed engine's, or accelerate's wrapper's
        if zero_optimizer is not None:
            optimizer = zero_optimizer
        if self._optimizer is not None:
            if self._optimizer is optimizer:
                return
            self.detach()
        _check_not_attached(optimizer)
        zero = None
        if zero_optimizer is not None:
            zero = _deepspeed.ZeroGradients(optimizer)
            self._bind_group(zero.group)
        original = optimizer.step
        attachment = self

        # A bound method, as the optimizer's own step is: torch's LR schedulers
        # wrap optimizer.step again through its __func__.
        @functools.wraps(original)
        def step(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if attachment._optimizer is not opt:  # detached while another wrapper held this one
                return original(*args, **kwargs)
            return attachment._gated_step(original, args, kwargs)

        step.__gac_attachment__ = self  # type: ignore[attr-defined]
        self._had_instance_step = "step" in vars(optimizer)
        self._wrapper = types.MethodType(step, optimizer)
        optimizer.step = self._wrapper
        self._optimizer = optimizer
        self._original_step = original
        self._step_of = step_of
        self._params_key = []
        self._zero = zero

    def _bind_group(self, group: Any) -> None:
        # The partitions of a ZeRO optimizer add up over its data-parallel group: an
        # agent made here is made again with it; the caller's agent must have a group.
        if self.agent.process_group is not None:
            return
        if self._first_mode is None:
            raise ValueError("gac.attach: the agent given has no process_group, and a DeepSpeed ZeRO rank holds only "
                             "its partition of the gradient: make it with process_group= the data-parallel group "
                             "(engine.optimizer.dp_process_group)")
        from gac import Agent
        self._agent_options["process_group"] = group
        self.agent = Agent(mode=cast("Mode", self._first_mode), **self._agent_options)

    def _parameters(self) -> List[Any]:
        if self._zero is not None:
            return cast(List[Any], self._zero.tensors())
        # Made once, and again when a group or its list of parameters changes
        # (add_param_group, a new list): the same list each step spares the iteration,
        # and the agent reuses its conversion of it.
        groups = _param_groups(self._optimizer)
        key = [(id(g["params"]), len(g["params"])) for g in groups]
        if key != self._params_key:
            params: List[Any] = []
            seen = set()
            for group in groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
            self._params, self._params_key = params, key
        return self._params

    def _gated_step(self, original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        if _accumulating(self._optimizer):
            # accelerate's optimizer between accumulation boundaries: its step does
            # nothing, and GAC runs once per real update.
            return original(*args, **kwargs)
        self._step = self._step_of() if self._step_of is not None else self._step + 1
        zero = self._zero
        try:
            report = self.agent.step(self._step, self._parameters())
        finally:
            if zero is not None:
                zero.release()
        # A GradScaler (or DeepSpeed's fp16 loss scaler) finds the same non-finite gradient,
        # skips the update itself and lowers its scale; withheld here, the scale would stay too high.
        scaler = zero.handles_overflow if zero is not None else _has_scaler(self._optimizer)
        withheld = not (report.step_optimizer or (report.regime == "invalid" and scaler))
        self._record(report, withheld)
        if zero is not None:
            return zero.skip(original, args, kwargs) if withheld else original(*args, **kwargs)
        _set_skipped(self._optimizer, withheld)
        return None if withheld else original(*args, **kwargs)

    def _record(self, report: Any, withheld: bool) -> None:
        self.last_report = report
        self.reports += 1
        self.skipped += withheld
        if report.regime == "project" and report.gradient_modified:
            self.projected += 1
        self._recent.append(withheld)
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
                self._end_warmup()

    def _warn_if_mostly_skipped(self) -> None:
        n = len(self._recent)
        skipped = sum(self._recent)
        if n < self._skip_window or 2 * skipped <= n or self.reports - self._warned_at < self._skip_window:
            return
        self._warned_at = self.reports
        logger.warning(
            "gac: %d of the last %d updates were skipped (|c_t| >= c_high = %.3g): the thresholds may not suit "
            "this model. Calibrate them on it (gac.attach(..., warmup=N), gacctl calibrate) or observe only "
            "(control=False).", skipped, n, self.agent.c_high)

    def _end_warmup(self) -> None:
        from gac import Agent, GacError, suggest_thresholds

        window, self._calibration_window = self._calibration_window, None
        stats = window.stats()
        self.calibration = stats
        try:
            c_low, c_high = suggest_thresholds(stats)
        except GacError as e:  # too few finite cosines, or c_low would not be below c_high
            self.calibration_error = str(e)
            logger.warning("gac: the warm-up of %d steps gave no thresholds (%s); GAC goes on observing only",
                           self.warmup, e)
            return
        self.agent = Agent(c_low, c_high, mode=cast("Mode", self._control_mode), **self._agent_options)
        self.thresholds = (c_low, c_high)
        logger.info("gac: warm-up of %d steps: q0.9 |c_t| %.4g, max %.4g -> c_low %.4g, c_high %.4g; "
                    "GAC controls from step %d", self.warmup, stats.q90, stats.max, c_low, c_high,
                    self._step + 1)

    def detach(self) -> None:
        """Puts the optimizer's own ``step`` back (idempotent). When something
        wrapped the step after gac (an LR scheduler made later), that wrapper
        stays and gac's inside it only passes the call on."""
        opt = self._optimizer
        if opt is not None and vars(opt).get("step") is self._wrapper:
            if self._had_instance_step:
                opt.step = self._original_step  # e.g. an LR scheduler's own wrapper
            else:
                del opt.step  # the instance attribute; the class's step shows again
        self._optimizer = None
        self._original_step = None
        self._wrapper = None
        self._zero = None


def _param_groups(optimizer: Any) -> List[Dict[str, Any]]:
    # A container of optimizers (torchtitan's OptimizersContainer: `optimizers`,
    # one per model part and kind) steps every one of them: GAC reads all their
    # parameters at once.
    inner = getattr(optimizer, "optimizers", None)
    if isinstance(inner, (list, tuple)) and inner and all(hasattr(o, "param_groups") for o in inner):
        return [g for o in inner for g in o.param_groups]
    return list(optimizer.param_groups)


def _accumulating(optimizer: Any) -> bool:
    state = getattr(optimizer, "gradient_state", None)
    return state is not None and not getattr(state, "sync_gradients", True)


def _has_scaler(optimizer: Any) -> bool:
    return getattr(optimizer, "scaler", None) is not None


def _set_skipped(optimizer: Any, skipped: bool) -> None:
    # accelerate's AcceleratedOptimizer reports a step it did not take through
    # _is_overflow (a mixed-precision overflow otherwise): the Trainer then
    # leaves the learning-rate scheduler where it was.
    if hasattr(optimizer, "_is_overflow"):
        optimizer._is_overflow = skipped


def _check_not_attached(optimizer: Any) -> None:
    attachment = getattr(getattr(optimizer, "step", None), "__gac_attachment__", None)
    if attachment is not None and attachment._optimizer is optimizer:
        raise ValueError("gac.attach: this optimizer's step is already gated by gac; detach() the first "
                         "attachment before attaching again")


def _is_trainer(target: Any) -> bool:
    return hasattr(target, "add_callback") and hasattr(target, "args") and hasattr(target, "state")


def _is_optimizer(target: Any) -> bool:
    if not callable(getattr(target, "step", None)):
        return False
    inner = getattr(target, "optimizers", None)
    if isinstance(inner, (list, tuple)) and inner and all(hasattr(o, "param_groups") for o in inner):
        return True
    return isinstance(getattr(target, "param_groups", None), list)


def resolve_mode(control: Any, mode: Any, warmup: Any, agent: Any, agent_options: Dict[str, Any],
                 skip_window: Any) -> Tuple[str, str]:
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
        mode = "local" if (control or warmup) else "monitor"
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


def make_attachment(*, control: bool = False, mode: Optional[str] = None, warmup: int = 0, agent: Any = None,
                    telemetry: Any = None, scalars: Optional[Callable[[], Dict[str, float]]] = None,
                    skip_window: int = 20, **agent_options: Any) -> Attachment:
    """An Attachment with its agent, not yet on any optimizer (attach's and GacCallback's common part)."""
    first_mode, control_mode = resolve_mode(control, mode, warmup, agent, agent_options, skip_window)
    if scalars is not None and not callable(scalars):
        raise TypeError("scalars must be a function returning {name: value}")
    if telemetry is not None and not callable(getattr(telemetry, "send", None)):
        raise TypeError(f"telemetry must be a gac.Telemetry, got {type(telemetry).__name__}")
    made = agent is None
    if agent is None:
        from gac import Agent
        agent = Agent(mode=cast("Mode", first_mode), **agent_options)
        if warmup:
            # The thresholds after the warm-up are unknown yet: check the other options now.
            Agent(0.05, 0.3, mode="local", **agent_options)
    attachment = Attachment(agent, telemetry=telemetry, scalars=scalars, warmup=warmup, control_mode=control_mode,
                            agent_options=agent_options, skip_window=skip_window)
    attachment._first_mode = first_mode if made else None
    return attachment


def attach(target: Any, *, control: bool = False, mode: Optional[str] = None, warmup: int = 0,
           agent: Any = None, telemetry: Any = None, scalars: Optional[Callable[[], Dict[str, float]]] = None,
           skip_window: int = 20, **agent_options: Any) -> Attachment:
    """Gates ``target``'s optimizer step with GAC; returns the :class:`Attachment`.

    target: a ``torch.optim.Optimizer``, a wrapper with ``param_groups``
        (accelerate's ``AcceleratedOptimizer``), a container of optimizers
        with ``optimizers`` (torchtitan's ``OptimizersContainer``: one GAC
        step over all their parameters, a skip skips every one), or a
        transformers ``Trainer`` (TRL's trainers included: attached through
        :class:`gac.integrations.transformers.GacCallback`), or a DeepSpeed
        engine or its ZeRO optimizer (stage 1, 2, 3): GAC reads this rank's
        gradient partition at the start of the ZeRO optimizer's step and sums
        over its data-parallel group (the agent's ``process_group`` unless
        given); a skip leaves the master weights and the optimizer's state
        as they were, and the engine counts it in ``skipped_steps``.
    control: False (default): observe only (monitor mode) unless ``mode`` or
        ``warmup`` says otherwise; True: GAC projects and skips (local mode,
        or remote when ``decision_source`` is given).
    mode: "monitor", "local" or "remote", explicitly (overrides ``control``).
    warmup: 0, or N >= 21 steps observed in monitor mode, after which the
        thresholds are calibrated from their |c_t| (gac.suggest_thresholds:
        c_low = q0.9, c_high = max(3 max, 2 c_low) capped at 1) and GAC
        controls with them in local mode.
    agent: a :class:`gac.Agent` to use as it is; else one is made from
        ``agent_options`` (``c_low``, ``c_high``, ``alpha_mode``,
        ``process_group``, ``decision_source``, ...).
    telemetry: a :class:`gac.Telemetry` every report is sent to, with the
        scalars ``scalars()`` returns and ``gac/skip_fraction``.
    skip_window: the number of recent updates the skip warning looks at.

    Raises TypeError / ValueError (and the Agent's own errors) before
    anything is changed.
    """
    if _is_trainer(target):
        from gac.integrations.transformers import GacCallback
        callback = GacCallback(control=control, mode=mode, warmup=warmup, agent=agent, telemetry=telemetry,
                               scalars=scalars, skip_window=skip_window, **agent_options)
        return callback.install(target).attachment
    from gac import _deepspeed
    zero_optimizer = _deepspeed.attach_target(target)
    if zero_optimizer is not None:
        _check_not_attached(zero_optimizer)
        attachment = make_attachment(control=control, mode=mode, warmup=warmup, agent=agent, telemetry=telemetry,
                                     scalars=scalars, skip_window=skip_window, **agent_options)
        attachment._wrap(zero_optimizer)
        return attachment
    if not _is_optimizer(target):
        raise TypeError("gac.attach needs a torch.optim.Optimizer (or a wrapper with param_groups, or a "
                        "container with optimizers) or a transformers Trainer, got " + type(target).__name__)
    _check_not_attached(target)
    attachment = make_attachment(control=control, mode=mode, warmup=warmup, agent=agent, telemetry=telemetry,
                                 scalars=scalars, skip_window=skip_window, **agent_options)
    attachment._wrap(target)
    return attachment
