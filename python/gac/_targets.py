"""What gac.attach can gate, one step target per kind of object: each says
which parameters GAC reads, whose ``step`` is hooked, and how a step is
taken or skipped.

- :class:`OptimizerTarget`: a ``torch.optim.Optimizer``, or anything with a
  list ``param_groups`` and a ``step``; a skip does not call ``step``;
- :class:`OptimizerContainerTarget`: a container of optimizers with an
  ``optimizers`` list (torchtitan's ``OptimizersContainer``: one optimizer
  per model part and kind): one GAC step over the parameters of all of
  them, and a skip skips every one;
- :class:`AcceleratedOptimizerTarget`: accelerate's ``AcceleratedOptimizer``
  (``gradient_state``, ``scaler``): its micro-steps between accumulation
  boundaries pass straight through, a non-finite gradient is left to its
  GradScaler, and a skip is reported as accelerate reports an overflow;
- :class:`gac._deepspeed.ZeroTarget`: a DeepSpeed engine's ZeRO optimizer
  (stage 1, 2, 3), reading this rank's gradient partition.

A transformers ``Trainer`` is no step target: its optimizer is made when
training begins, so gac.attach hands the Trainer to
``gac.integrations.transformers.GacCallback``, which gates that optimizer
(an ``AcceleratedOptimizer``, or DeepSpeed's) then. The objects are
recognised by what they have, not by their classes: none of torch's
wrappers' packages is imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from gac._deepspeed import zero_target

if TYPE_CHECKING:
    import torch
    import torch.distributed
    from typing_extensions import TypeGuard

# A parameter group of a torch optimizer: "params" and the optimizer's own options.
ParamGroup = Dict[str, Any]
# An optimizer's step (the original, bound), its arguments and what it returns.
StepFunction = Callable[..., object]


class StepTarget(Protocol):
    """One object whose ``step`` GAC gates (Attachment.hook): used on the
    training thread only."""

    @property
    def optimizer(self) -> object:
        """The object whose ``step`` is replaced by GAC's."""

    @property
    def group(self) -> Optional[torch.distributed.ProcessGroup]:
        """The group that the parameters' sums add up over, when they are
        partitions (DeepSpeed ZeRO); None for whole gradients."""

    def between_updates(self) -> bool:
        """True for a call of ``step`` that updates nothing (a micro-step of
        gradient accumulation): it passes straight through, without GAC."""

    def leaves_invalid_to_scaler(self) -> bool:
        """True when a loss scaler finds a non-finite gradient itself, skips
        the update and lowers its scale: GAC then lets the step run."""

    def parameters(self) -> List[torch.Tensor]:
        """What the agent reads this step: tensors whose ``.grad`` is the gradient."""

    def release(self) -> None:
        """Called after the agent's step: drops what :meth:`parameters` holds for it."""

    def take(self, step: StepFunction, args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        """Runs the update: the original ``step`` with the caller's arguments."""

    def skip(self, step: StepFunction, args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        """Leaves the weights and the optimizer's state as they were; returns what the caller gets."""


class _HasParamGroups(Protocol):
    param_groups: List[ParamGroup]


class OptimizerTarget:
    """A ``torch.optim.Optimizer`` (or anything with a list ``param_groups``
    and a ``step``): GAC reads the parameters of its groups."""

    group: Optional[torch.distributed.ProcessGroup] = None

    def __init__(self, optimizer: object) -> None:
        self.optimizer = optimizer
        self._params: List[torch.Tensor] = []
        self._params_key: List[Tuple[int, int]] = []

    def param_groups(self) -> Sequence[ParamGroup]:
        groups: List[ParamGroup] = getattr(self.optimizer, "param_groups")
        return groups

    def between_updates(self) -> bool:
        return False

    def leaves_invalid_to_scaler(self) -> bool:
        return False

    def parameters(self) -> List[torch.Tensor]:
        # Made once, and again when a group or its list of parameters changes
        # (add_param_group, a new list): the same list each step spares the iteration,
        # and the agent reuses its conversion of it.
        groups = self.param_groups()
        key = [(id(g["params"]), len(g["params"])) for g in groups]
        if key != self._params_key:
            params: List[torch.Tensor] = []
            seen = set()
            for group in groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
            self._params, self._params_key = params, key
        return self._params

    def release(self) -> None:
        pass

    def take(self, step: StepFunction, args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        return step(*args, **kwargs)

    def skip(self, step: StepFunction, args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        return None


class OptimizerContainerTarget(OptimizerTarget):
    """A container with an ``optimizers`` list, each with ``param_groups``
    (torchtitan's ``OptimizersContainer``): its ``step`` steps every one of
    them, so GAC reads all their parameters at once."""

    def param_groups(self) -> Sequence[ParamGroup]:
        inner: Sequence[_HasParamGroups] = getattr(self.optimizer, "optimizers")
        return [g for o in inner for g in o.param_groups]


class AcceleratedOptimizerTarget(OptimizerTarget):
    """accelerate's ``AcceleratedOptimizer``, or a wrapper shaped like it
    (``param_groups`` and ``gradient_state``, ``scaler`` or ``_is_overflow``)."""

    def between_updates(self) -> bool:
        # Under accelerator.accumulate(...) its step does nothing until the
        # accumulation boundary: GAC runs once per real update.
        state = getattr(self.optimizer, "gradient_state", None)
        return state is not None and not getattr(state, "sync_gradients", True)

    def leaves_invalid_to_scaler(self) -> bool:
        return getattr(self.optimizer, "scaler", None) is not None

    def take(self, step: StepFunction, args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        self._report_skipped(False)
        return step(*args, **kwargs)

    def skip(self, step: StepFunction, args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        self._report_skipped(True)
        return None

    def _report_skipped(self, skipped: bool) -> None:
        # accelerate reports a step it did not take through _is_overflow (a
        # mixed-precision overflow otherwise; `step_was_skipped` reads it): the
        # Trainer then leaves the learning-rate scheduler where it was.
        if hasattr(self.optimizer, "_is_overflow"):
            setattr(self.optimizer, "_is_overflow", skipped)


def _is_container(obj: object) -> bool:
    inner = getattr(obj, "optimizers", None)
    return isinstance(inner, (list, tuple)) and bool(inner) and all(hasattr(o, "param_groups") for o in inner)


def _is_accelerated(obj: object) -> bool:
    return any(hasattr(obj, name) for name in ("gradient_state", "scaler", "_is_overflow"))


def step_target(obj: object) -> Optional[StepTarget]:
    """The step target of ``obj`` (the module's text lists the kinds), or
    None when ``obj`` is none of them. Raises NotImplementedError for a
    DeepSpeed engine or ZeRO optimizer that is not supported."""
    zero = zero_target(obj)
    if zero is not None:
        return zero
    if not callable(getattr(obj, "step", None)):
        return None
    if _is_container(obj):
        return OptimizerContainerTarget(obj)
    if not isinstance(getattr(obj, "param_groups", None), list):
        return None
    if _is_accelerated(obj):
        return AcceleratedOptimizerTarget(obj)
    return OptimizerTarget(obj)


class CallbackHandler(Protocol):
    callbacks: List[object]


class Trainer(Protocol):
    """What gac uses of a transformers ``Trainer`` (TRL's trainers are ones)."""

    callback_handler: CallbackHandler

    def add_callback(self, callback: object) -> None: ...


def is_trainer(obj: object) -> TypeGuard[Trainer]:
    """True for a transformers ``Trainer`` (``add_callback``, ``args``, ``state``)."""
    return hasattr(obj, "add_callback") and hasattr(obj, "args") and hasattr(obj, "state")
