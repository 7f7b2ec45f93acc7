"""GAC on a DeepSpeed ZeRO optimizer's step: the step target (gac/_targets.py)
of a DeepSpeed engine, of accelerate's ``DeepSpeedOptimizerWrapper`` and of
a ZeRO optimizer itself. DeepSpeed is not imported: the engine and the
optimizers are recognised by their class names and read through the
attributes named below, checked against DeepSpeed 0.19.8. So this module
sits beside gac/_targets.py rather than in gac/integrations/ (whose modules
each import their trainer): ``gac.attach(engine)`` recognises an engine on
its own (``step_target``), and ``GacCallback`` uses it for a Trainer run
under DeepSpeed.

Where the gradient is when the ZeRO optimizer's ``step`` begins (the
engine calls it once per optimizer step, at the accumulation boundary,
after the reduce-scatter): each data-parallel rank holds its partition of
the flat, averaged gradient, and the partitions of the ranks are disjoint,
so summing over the data-parallel group counts every element once.

- ZeRO 1 and 2 (``DeepSpeedZeroOptimizer``): ``averaged_gradients[i]``, a
  list of tensors per parameter group ``i`` (whole parameters' gradients,
  slices of the parameters cut by the partition boundaries, and zeros that
  pad the last partition); with the optimizer offloaded to the CPU, the
  flat ``single_partition_of_fp32_groups[i].grad``. The group is
  ``real_dp_process_group[i]``.
- ZeRO 3 (``DeepSpeedZeroOptimizer_Stage3``): ``averaged_gradients[i]``, one
  tensor per parameter of sub-group ``i`` (its partition, zero-padded on the
  last rank). The group is ``dp_process_group``.

The gradients are still multiplied by the loss scale (fp16) and not yet
clipped: c_t and the regime do not depend on either; the reported norm
does. GAC projects them in place, where the optimizer's step reads them.

A skipped update runs the ZeRO optimizer's step with the wrapped optimizer's
own ``step`` (AdamW, ...) made a no-op for the call: DeepSpeed releases the
gradients and keeps its buffers consistent, the fp32 master weights, the
optimizer's state and its step count stay as they were, and ``overflow`` is
set so that the engine counts the step in ``skipped_steps`` and leaves its
learning-rate scheduler where it was (as on a loss-scale overflow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Protocol, Tuple, cast

if TYPE_CHECKING:
    import torch
    import torch.distributed

ZERO_12 = "DeepSpeedZeroOptimizer"
ZERO_3 = "DeepSpeedZeroOptimizer_Stage3"


class ZeroOptimizer(Protocol):
    """What gac reads of both stages' ZeRO optimizers (the attributes of one
    stage are read with ``getattr``)."""

    optimizer: object  # the wrapped torch optimizer (AdamW, ...), stepping on the fp32 partitions
    averaged_gradients: Mapping[int, Optional[List[torch.Tensor]]]
    overflow: bool


def _class_names(obj: object) -> List[str]:
    return [c.__name__ for c in type(obj).__mro__]


def is_zero_optimizer(obj: object) -> bool:
    names = _class_names(obj)
    return ZERO_12 in names or ZERO_3 in names


def is_engine(obj: object) -> bool:
    return "DeepSpeedEngine" in _class_names(obj)


def zero_target(target: object) -> Optional[ZeroTarget]:
    """The step target of ``target`` when it is a DeepSpeed engine,
    accelerate's ``DeepSpeedOptimizerWrapper`` or a ZeRO optimizer; None
    when it is none of them. Raises NotImplementedError for an engine
    without ZeRO (stage 0) and for what :class:`ZeroTarget` does not
    support."""
    if is_zero_optimizer(target):
        return ZeroTarget(cast(ZeroOptimizer, target))
    if not (is_engine(target) or type(target).__name__ == "DeepSpeedOptimizerWrapper"):
        return None
    inner: object = getattr(target, "optimizer", None)
    if is_zero_optimizer(inner):
        return ZeroTarget(cast(ZeroOptimizer, inner))
    what = type(inner).__name__ if inner is not None else "no optimizer"
    raise NotImplementedError(
        f"gac.attach: this DeepSpeed engine's optimizer is a {what}, not a ZeRO optimizer (stage 1, 2 or 3); "
        "without ZeRO, attach the engine's torch optimizer itself (gac.attach(engine.optimizer)) when it is one")


class ZeroTarget:
    """A ZeRO optimizer as a step target: its ``step`` is gated; the
    parameters GAC reads are the rank's gradient partition at the entry of
    that step, as tensors whose ``.grad`` is each piece; the pieces are
    summed over the data-parallel ``group``; a skip runs the step with the
    wrapped optimizer's step made a no-op.

    Raises NotImplementedError for what is not supported: several
    data-parallel groups (MoE expert groups), ZeRO-3 with an offloaded
    optimizer, ZenFlow.
    """

    def __init__(self, optimizer: ZeroOptimizer) -> None:
        self.optimizer = optimizer
        self.stage = 3 if ZERO_3 in _class_names(optimizer) else 12
        if getattr(optimizer, "zenflow", False):
            raise NotImplementedError("gac.attach: DeepSpeed's ZenFlow optimizer is not supported")
        if self.stage == 3:
            if getattr(optimizer, "offload_optimizer", False):
                raise NotImplementedError("gac.attach: ZeRO-3 with the optimizer offloaded is not supported "
                                          "(ZeRO-1/2 with offload and ZeRO-3 without are)")
            self.group: Optional[torch.distributed.ProcessGroup] = getattr(optimizer, "dp_process_group")
            self.offload = False
        else:
            groups: List[torch.distributed.ProcessGroup] = list(getattr(optimizer, "real_dp_process_group"))
            if any(g is not groups[0] for g in groups):
                raise NotImplementedError("gac.attach: the ZeRO optimizer's parameter groups use different "
                                          "data-parallel groups (MoE expert parallelism): not supported")
            self.group = groups[0]
            self.offload = bool(getattr(optimizer, "cpu_offload", False))
        # The ZeRO optimizer skips a non-finite fp16 step itself and lowers its loss scale.
        import torch
        self._handles_overflow: bool = getattr(optimizer, "dtype", None) == torch.float16
        self._holders: List[torch.Tensor] = []
        self._key: List[Tuple[object, ...]] = []

    def between_updates(self) -> bool:
        """Never: the engine calls the ZeRO optimizer's step at the accumulation boundary only."""
        return False

    def leaves_invalid_to_scaler(self) -> bool:
        """With fp16 the ZeRO optimizer skips a non-finite step itself and lowers its loss scale."""
        return self._handles_overflow

    def _pieces(self) -> List[Optional[torch.Tensor]]:
        opt = self.optimizer
        pieces: List[Optional[torch.Tensor]]
        if self.offload:
            pieces = [t.grad for t in getattr(opt, "single_partition_of_fp32_groups")]
        else:
            pieces = []
            for i in range(len(opt.averaged_gradients)):
                group = opt.averaged_gradients.get(i)
                if group is None:
                    pieces.append(None)
                else:
                    pieces.extend(group)
        return pieces

    def parameters(self) -> List[torch.Tensor]:
        """Tensors (the same objects while the layout stays) whose ``.grad``
        is this step's pieces; :meth:`release` drops the references."""
        import torch

        pieces = self._pieces()
        present = [p for p in pieces if p is not None]
        if len(present) != len(pieces):
            raise RuntimeError("gac: the ZeRO optimizer's step began without this rank's gradient partition "
                               "(no backward since the last step?)")
        key = [(tuple(p.shape), p.dtype, p.device) for p in present]
        if key != self._key:
            # A zero-stride view of one element: no copy of the gradient is held.
            self._holders = [torch.empty((), dtype=dt, device=dev).expand(shape) for shape, dt, dev in key]
            self._key = list(key)
        for h, p in zip(self._holders, present):
            h.grad = p
        return self._holders

    def release(self) -> None:
        for h in self._holders:
            h.grad = None

    def take(self, step: Callable[..., object], args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        return step(*args, **kwargs)

    def skip(self, step: Callable[..., object], args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        """Runs the ZeRO optimizer's ``step`` with its wrapped optimizer's
        step made a no-op, then marks the step as not taken (``overflow``)."""
        opt = self.optimizer
        inner = opt.optimizer
        had_own = "step" in vars(inner)
        own = vars(inner).get("step")
        # ZeRO-1/2 links the hp parameters to the optimizer's state after its first step;
        # a first step skipped here must not link them to a still empty state.
        linked = getattr(opt, "_hp_optimizer_states_linked", None)
        setattr(inner, "step", _no_step)
        try:
            result = step(*args, **kwargs)
        finally:
            if had_own:
                setattr(inner, "step", own)
            else:
                delattr(inner, "step")
            if linked is False:
                setattr(opt, "_hp_optimizer_states_linked", False)
        opt.overflow = True
        return result


def _no_step(*args: object, **kwargs: object) -> None:
    return None
