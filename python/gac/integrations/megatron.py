"""GAC on a Megatron-Core optimizer: c_t over the full model under tensor,
pipeline, context, expert and data parallelism, each value counted once, as
Megatron's own gradient norm counts it::

    from gac.integrations import megatron as gac_megatron

    optimizer = get_megatron_optimizer(config, model)           # Megatron's own
    attachment = gac_megatron.attach(optimizer)                 # observe
    attachment = gac_megatron.attach(optimizer, control=True)   # project and skip

Where. Megatron's ``step()`` (``MixedPrecisionOptimizer``, ``FP32Optimizer``,
``ChainedOptimizer``; megatron/core/optimizer/optimizer.py, checked against
megatron-core 0.19.2) runs ``prepare_grads()`` (the model's gradients become
the ``.grad`` of the parameters the inner torch optimizer steps: copied
from ``main_grad``, unscaled, checked for inf/NaN), then takes the gradient
norm and clips, then calls ``step_with_ready_grads()`` (the inner step, the
copy back to the model's parameters, the distributed optimizer's parameter
all-gather). GAC runs at the start of ``step_with_ready_grads`` of the
optimizer given (for a ``ChainedOptimizer``, once for all its optimizers):
after clipping, before any weight moves.

What it reads: the ``.grad`` of ``optimizer.get_parameters()``, the fp32
main parameters of each inner optimizer's ``param_groups``: with the
distributed optimizer, this rank's shards of them (1-D slices of the
reduce-scattered gradient buffer); with ``Float16OptimizerWithFloat16Params``
the fp32 copies of the bf16/fp16 parameters; with ``FP32Optimizer`` the
parameters themselves (``.grad`` is their ``main_grad``). These are what
Megatron's norm reads (``get_grads_for_grad_norm``) and what the inner
optimizer steps with, so a projection made in place is the update's.

How the ranks' sums add up: one all-reduce over the ranks of one model
replica-set (Megatron's intra-distributed-optimizer-instance group: every
rank of the model; the distributed optimizer's own ``grad_stats`` group), in
which each parameter's part is counted by one rank, read from the
attributes Megatron's norm reads (``clip_grads.py``,
``param_is_not_shared``, ``param_is_not_tensor_parallel_duplicate``):

- ``tensor_model_parallel`` (ColumnParallelLinear, RowParallelLinear,
  VocabParallelEmbedding weights; ``partition_dim`` says which dimension):
  each tensor-parallel rank holds its own part;
- no ``tensor_model_parallel`` (norms, RowParallelLinear's bias, routers):
  the same values on every rank of the tensor-parallel group (the expert
  tensor-parallel group for expert parameters): its lowest rank counts them;
- ``allreduce=False``: an expert parameter (its experts on this rank's
  expert-parallel coordinate), replicated over the expert data-parallel
  group, not the dense one;
- ``shared``: the last pipeline stage's copy of the word embedding tied to
  the output layer (``shared_embedding``), or a copy for multi-token
  prediction: Megatron leaves it out of its norm because the first stage
  holds the same parameter. Here it is held, projected and snapshotted
  like any other, and counted by the first stage: its group is the
  embedding group (``parallel_state.get_embedding_group``), whose lowest
  rank is the first stage's;
- with the distributed optimizer, each data-parallel rank's shard is its
  own part; with the others, each data-parallel replica holds the same
  gradient (after DDP's all-reduce): the lowest rank of the data-parallel
  group (with context parallelism; the expert data-parallel group for
  experts; with the tensor-parallel group for the parameters above that
  every tensor-parallel rank holds) counts it.

These become ``gac.Agent``'s ``process_group`` and ``replicated_on``
(``gac._dist.plan_reduction`` applies them on the first step): every rank
gets the c_t, norms and decision of one agent over the full model.

A skip: ``step_with_ready_grads`` returns False without stepping, so
``step()`` returns ``update_successful=False``, as Megatron's own
``grad_norm_skip_threshold`` does: the main and model weights, the inner
optimizer's state and step count and the distributed optimizer's parameter
buffers stay as they were (no all-gather is started), and Megatron's
training loop holds its learning-rate scheduler and counts a skipped
iteration. Trainers that treat an unsuccessful update as an error (verl's
Megatron actor and engine raise, slime asserts) take
``skip_reported="successful"``: the same skip, reported as taken. An fp16 overflow never reaches GAC: ``prepare_grads`` finds it
and ``step()`` returns before ``step_with_ready_grads``; a non-finite bf16
gradient is GAC's ``invalid`` (a skip).

Every rank must attach (one all-reduce of one value, so that a rank that
cannot count its parameters makes every rank raise, none waiting at its
first step). Not supported (NotImplementedError at attach): Megatron-FSDP,
the precision-aware optimizer (gradients in ``decoupled_grad``), generalized
tensor parallelism's weight rematerialisation (``gtp_remat_size`` > 1),
``LayerWiseDistributedOptimizer`` and optimizers of other classes; and
(ValueError) a ``shared`` parameter on a rank that is not in an embedding
group with a lower rank, an expert parameter every expert tensor-parallel
rank holds when the expert tensor-parallel size is above 1 under the
non-distributed optimizer (no Megatron group holds exactly its replicas).

megatron-core is imported only when ``attach`` or ``agent_options`` runs
without a ``pg_collection``; the optimizers are recognised by their class
names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List, Literal, Optional, Protocol, Sequence, Tuple

from gac._attachment import Attachment, Scalars, check_not_gated, make_attachment
from gac._dist import AllReduce

if TYPE_CHECKING:
    import torch
    import torch.distributed
    from typing_extensions import Unpack

    from gac._agent import Agent
    from gac._attachment import AgentOptions
    from gac._controller import Mode
    from gac._targets import StepFunction
    from gac._transport import Telemetry

    ProcessGroup = torch.distributed.ProcessGroup

# What step() returns as update_successful for an update GAC withheld.
SkipReported = Literal["unsuccessful", "successful"]

_CHAINED = "ChainedOptimizer"
_DISTRIBUTED = "DistributedOptimizer"
_REPLICATED = ("Float16OptimizerWithFloat16Params", "FP32Optimizer")
_REFUSED = {
    "LayerWiseDistributedOptimizer": "its layer-wise sharding of the emerging optimizers",
}
# The groups of megatron.core's ProcessGroupCollection that the rules read.
_GROUPS = ["tp", "dp_cp", "tp_dp_cp", "expt_tp", "expt_dp", "embd", "pos_embd", "intra_dist_opt", "gtp_remat",
           "expt_gtp_remat"]
# The attribute of the step_with_ready_grads gac installs that names its StepWithReadyGrads.
_MARK = "__gac_ready_grads__"


class _MegatronOptimizer(Protocol):
    """What is read of a Megatron optimizer (the rest through getattr)."""

    def get_parameters(self) -> List[torch.Tensor]: ...
    def step_with_ready_grads(self) -> bool: ...


def attach(optimizer: object, *, control: bool = False, mode: Optional[Mode] = None, warmup: int = 0,
           agent: Optional[Agent] = None, telemetry: Optional[Telemetry] = None, scalars: Optional[Scalars] = None,
           skip_window: int = 20, pg_collection: object = None, skip_reported: SkipReported = "unsuccessful",
           **agent_options: Unpack[AgentOptions]) -> Attachment:
    """Gates a Megatron-Core optimizer's update with GAC; returns the
    :class:`gac.Attachment` (``attachment.optimizer`` is the
    :class:`StepWithReadyGrads` gated).

    optimizer: what ``get_megatron_optimizer`` returns (a ``ChainedOptimizer``
        of the dense and the expert optimizers), or one
        ``DistributedOptimizer``, ``Float16OptimizerWithFloat16Params`` or
        ``FP32Optimizer``: the object whose ``step()`` the training loop calls.
    pg_collection: the ``ProcessGroupCollection`` the model and optimizer were
        built with (default: Megatron's ``parallel_state`` groups).
    skip_reported: what ``step()`` says of an update GAC withheld:
        "unsuccessful" (default: ``update_successful=False``, Megatron's own
        path: its training loop holds the LR scheduler and counts a skipped
        iteration) or "successful" (True: for trainers that treat an
        unsuccessful update as an error, verl's and slime's Megatron workers;
        the weights and the optimizer's state stay as they were all the same,
        and their LR scheduler advances).
    process_group (among ``agent_options``): the group the sums are
        all-reduced over, in place of every rank of the model (Megatron's
        intra-distributed-optimizer group); it must hold every part once.
    control, mode, warmup, agent, telemetry, scalars, skip_window and the
        other Agent options: as for :func:`gac.attach` (observing unless
        control is asked for). An ``agent=`` of your own must have been made
        with :func:`agent_options`' group and ``replicated_on``.

    Raises TypeError for what is not a Megatron optimizer,
    NotImplementedError and ValueError for what the module's text lists,
    before anything is changed.
    """
    if "replicated_on" in agent_options:
        raise TypeError("gac.integrations.megatron.attach finds replicated_on itself, from Megatron's parameter "
                        "attributes and groups; pass process_group= to change the summing group only")
    group = agent_options.pop("process_group", None)
    if skip_reported not in ("unsuccessful", "successful"):
        raise ValueError(f"skip_reported must be 'unsuccessful' or 'successful', got {skip_reported!r}")
    target = MegatronTarget(optimizer, pg_collection=pg_collection, process_group=group)
    target.skip_reported = skip_reported
    if getattr(getattr(optimizer, "step_with_ready_grads", None), _MARK, None) is not None:
        check_not_gated(target)  # (gac's step_with_ready_grads is installed once; it may be gated already)
    if agent is not None and agent.process_group is None and target.process_group is not None:
        raise ValueError("gac.integrations.megatron.attach: the agent given has no process_group, and each rank "
                         "holds only its part of the model: make it with "
                         "gac.Agent(..., **gac.integrations.megatron.agent_options(optimizer))")
    if agent is None:
        agent_options.update(target.agent_options())
    attachment = make_attachment(control=control, mode=mode, warmup=warmup, agent=agent, telemetry=telemetry,
                                 scalars=scalars, skip_window=skip_window, **agent_options)
    attachment.hook(target)
    return attachment


def agent_options(optimizer: object, pg_collection: object = None,
                  process_group: Optional[ProcessGroup] = None) -> AgentOptions:
    """``process_group`` and ``replicated_on`` for a :class:`gac.Agent` of
    your own over ``MegatronTarget(optimizer).parameters()`` (what
    :func:`attach` gives the agent it makes)."""
    return MegatronTarget(optimizer, pg_collection=pg_collection, process_group=process_group).agent_options()


class StepWithReadyGrads:
    """A Megatron optimizer's ``step_with_ready_grads`` as an object with a
    ``step``, which :class:`gac.Attachment` gates: the optimizer's own
    ``step_with_ready_grads`` is replaced by one that calls ``self.step()``
    (installed once per optimizer; after ``detach`` it only passes the call
    on). ``megatron`` is the optimizer."""

    def __init__(self, megatron: _MegatronOptimizer) -> None:
        self.megatron = megatron
        self._own = megatron.step_with_ready_grads

        def step_with_ready_grads() -> object:
            return self.step()

        setattr(step_with_ready_grads, _MARK, self)
        setattr(megatron, "step_with_ready_grads", step_with_ready_grads)

    @classmethod
    def of(cls, megatron: _MegatronOptimizer) -> StepWithReadyGrads:
        """The one installed on ``megatron``, or a new one."""
        installed = getattr(megatron.step_with_ready_grads, _MARK, None)
        return installed if isinstance(installed, cls) else cls(megatron)

    def step(self) -> object:
        """Megatron's own ``step_with_ready_grads``: the inner step; True when taken."""
        return self._own()

    def __repr__(self) -> str:
        return f"<gac StepWithReadyGrads of {type(self.megatron).__name__}>"


class MegatronTarget:
    """A Megatron optimizer as a gac step target (gac/_targets.py): its
    ``step_with_ready_grads`` is gated; GAC reads the ``.grad`` of
    ``get_parameters()``; a skip returns False (``update_successful``; True
    with ``skip_reported="successful"``) without stepping.

    ``process_group`` and :meth:`replicated_on` say how the ranks' sums add
    up (the module's text); both are worked out here, so that a layout the
    rules cannot count raises before the first step.
    """

    # The agent gets its group from attach (process_group); Attachment.hook's
    # group is DeepSpeed's partitions'.
    group: Optional[ProcessGroup] = None
    # What a skip returns as update_successful (attach's skip_reported).
    skip_reported: SkipReported = "unsuccessful"

    def __init__(self, optimizer: object, *, pg_collection: object = None,
                 process_group: Optional[ProcessGroup] = None) -> None:
        self.megatron: _MegatronOptimizer = _checked(optimizer)
        self.leaves = _leaves(optimizer)
        self.pg = pg_collection if pg_collection is not None else _parallel_state_groups()
        for name in ("gtp_remat", "expt_gtp_remat"):
            if _size(getattr(self.pg, name, None)) > 1:
                raise NotImplementedError("gac.integrations.megatron: generalized tensor parallelism's weight "
                                          "rematerialisation (gtp_remat_size > 1) is not supported")
        for leaf in self.leaves:
            config = getattr(leaf, "config", None)
            if getattr(config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False):
                raise NotImplementedError("gac.integrations.megatron: the precision-aware optimizer keeps its "
                                          "gradients in decoupled_grad, which gac does not read yet")
            if getattr(getattr(leaf, "ddp_config", None), "use_megatron_fsdp", False):
                raise NotImplementedError("gac.integrations.megatron: Megatron-FSDP is not supported")
        self.process_group = process_group if process_group is not None else self._summing_group()
        self._params: List[torch.Tensor] = []
        self._groups: Dict[int, Optional[ProcessGroup]] = {}
        error: Optional[Exception] = None
        try:
            # One process (no torch.distributed) holds the whole model: nothing to count.
            for leaf in self.leaves if self.process_group is not None else []:
                for p in _parameters(leaf):
                    if id(p) not in self._groups:
                        self._groups[id(p)] = self._holders(leaf, p, len(self._params))
                        self._params.append(p)
        except (ValueError, NotImplementedError) as e:
            error = e
        self._agree(error)
        self._cached: List[torch.Tensor] = []
        self._step: Optional[StepWithReadyGrads] = None

    @property
    def optimizer(self) -> StepWithReadyGrads:
        """What is gated: the optimizer's step_with_ready_grads (installed on first use)."""
        if self._step is None:
            self._step = StepWithReadyGrads.of(self.megatron)
        return self._step

    # StepTarget

    def between_updates(self) -> bool:
        return False

    def leaves_invalid_to_scaler(self) -> bool:
        # Megatron's fp16 scaler finds inf/NaN in prepare_grads and returns before
        # step_with_ready_grads; what GAC finds non-finite here no scaler will.
        return False

    def parameters(self) -> List[torch.Tensor]:
        """The parameters the inner optimizers step (the same list object while they are the same)."""
        params: List[torch.Tensor] = []
        seen = set()
        for leaf in self.leaves:
            for p in _parameters(leaf):
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        if len(params) != len(self._cached) or any(a is not b for a, b in zip(params, self._cached)):
            self._cached = params
        return self._cached

    def release(self) -> None:
        pass

    def take(self, step: StepFunction, args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        return step(*args, **kwargs)

    def skip(self, step: StepFunction, args: Tuple[object, ...], kwargs: Dict[str, object]) -> object:
        # update_successful: False as grad_norm_skip_threshold's skip, unless the trainer cannot take it.
        return self.skip_reported == "successful"

    # The reduction

    def agent_options(self) -> AgentOptions:
        """gac.Agent's process_group and replicated_on (none without torch.distributed: one process)."""
        if self.process_group is None:
            return {}
        return {"process_group": self.process_group, "replicated_on": self.replicated_on}

    def replicated_on(self, param: object) -> Optional[ProcessGroup]:
        """The group of the ranks that hold the same values as ``param`` (None:
        its own part), for gac.Agent's ``replicated_on``."""
        try:
            return self._groups[id(param)]
        except KeyError:
            raise ValueError("gac.integrations.megatron: a parameter the optimizer did not hold when GAC was "
                             "attached (attach again after the optimizer's parameters change)") from None

    def _agree(self, error: Optional[Exception]) -> None:
        """Raises on every rank of the group when one cannot count its parameters
        (the rules read each rank's own), so that none goes on to its first step
        and waits there for the others."""
        failed = error is not None
        if self.process_group is not None:
            failed = AllReduce(self.process_group)([1.0 if failed else 0.0])[0] > 0
        if error is not None:
            raise error
        if failed:
            raise ValueError("gac.integrations.megatron: another rank cannot count its parameters (its error says "
                             "why); GAC was not attached")

    def _summing_group(self) -> Optional[ProcessGroup]:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        distributed = [leaf for leaf in self.leaves if _kind(leaf) == _DISTRIBUTED]
        groups: List[Optional[ProcessGroup]] = [getattr(leaf, "grad_stats_parallel_group", None)
                                                for leaf in distributed]
        known = [g for g in groups if g is not None]
        if known:
            ranks = [sorted(dist.get_process_group_ranks(g)) for g in known]
            if any(r != ranks[0] for r in ranks):
                raise NotImplementedError("gac.integrations.megatron: the distributed optimizers reduce their "
                                          "gradient statistics over different groups")
            return known[0]
        group: Optional[ProcessGroup] = getattr(self.pg, "intra_dist_opt", None)
        return group if group is not None else dist.group.WORLD

    def _holders(self, leaf: object, p: torch.Tensor, i: int) -> Optional[ProcessGroup]:
        """Which ranks hold the same values as p (the module's text gives the rules)."""
        if getattr(p, "__fsdp_param__", False):
            raise NotImplementedError("gac.integrations.megatron: Megatron-FSDP parameters are not supported")
        what = f"parameter {i} (shape {tuple(p.shape)})"
        if getattr(p, "shared", False):
            return self._first_stage_holds(what)
        expert = not getattr(p, "allreduce", True)
        sharded = bool(getattr(p, "tensor_model_parallel", False))
        tp = getattr(leaf, "expert_tp_group" if expert else "tp_group", None)
        if tp is None:
            tp = self._pg_group("expt_tp" if expert else "tp", what)
        if _kind(leaf) == _DISTRIBUTED:
            # Each data-parallel rank's shard is its own part; a tensor-parallel
            # duplicate is the same shard on every tensor-parallel rank (the
            # buffers' layouts match: the shards' shapes do).
            return None if sharded else _replicas(tp)
        if expert:
            if not sharded and _size(tp) > 1:
                raise ValueError(f"gac.integrations.megatron: expert {what} is held whole by every rank of its "
                                 "expert tensor-parallel group and replicated over the expert data-parallel "
                                 "group: no Megatron group holds exactly its replicas (use the distributed "
                                 "optimizer, or expert_tensor_parallel_size=1)")
            return _replicas(self._pg_group("expt_dp", what))
        return _replicas(self._pg_group("dp_cp" if sharded else "tp_dp_cp", what))

    def _pg_group(self, name: str, what: str) -> Optional[ProcessGroup]:
        """A group of the ProcessGroupCollection (None: not made, one rank); one it lacks is an error, not a
        guess: counting a replica as its own part would count it again."""
        try:
            group: Optional[ProcessGroup] = getattr(self.pg, name)
        except AttributeError:
            raise ValueError(f"gac.integrations.megatron: {what} needs the {name!r} group, which the "
                             "pg_collection given has not") from None
        return group

    def _first_stage_holds(self, what: str) -> ProcessGroup:
        """The embedding group of a `shared` copy: the first stage's rank, lower, counts the parameter."""
        import torch.distributed as dist

        rank = dist.get_rank()
        for name in ("embd", "pos_embd"):
            group = self._pg_group(name, what)
            if group is None:
                continue
            ranks = dist.get_process_group_ranks(group)
            if rank in ranks and min(ranks) != rank:
                found: ProcessGroup = group
                return found
        raise ValueError(f"gac.integrations.megatron: {what} is marked shared (Megatron leaves it out of its "
                         "norm: another stage holds it), but this rank is in no embedding group with a lower "
                         "rank that would count it")


def _names(obj: object) -> List[str]:
    return [c.__name__ for c in type(obj).__mro__]


def _kind(leaf: object) -> str:
    names = _names(leaf)
    return _DISTRIBUTED if _DISTRIBUTED in names else next(n for n in _REPLICATED if n in names)


def _checked(optimizer: object) -> _MegatronOptimizer:
    names = _names(optimizer)
    if not any(n in names for n in (_CHAINED, _DISTRIBUTED) + _REPLICATED) or not callable(
            getattr(optimizer, "step_with_ready_grads", None)):
        raise TypeError("gac.integrations.megatron.attach needs a Megatron-Core optimizer (what "
                        "get_megatron_optimizer returns: a ChainedOptimizer, DistributedOptimizer, "
                        f"Float16OptimizerWithFloat16Params or FP32Optimizer), got {type(optimizer).__name__}")
    checked: _MegatronOptimizer = optimizer  # type: ignore[assignment]  # (checked by its class and method)
    return checked


def _leaves(optimizer: object) -> List[object]:
    """The optimizers that hold parameters: a ChainedOptimizer's, flattened."""
    names = _names(optimizer)
    for name, why in _REFUSED.items():
        if name in names:
            raise NotImplementedError(f"gac.integrations.megatron: {name} ({why}) is not supported")
    if _CHAINED in names:
        inner: Sequence[object] = getattr(optimizer, "chained_optimizers")
        return [leaf for o in inner for leaf in _leaves(o)]
    if _DISTRIBUTED in names or any(n in names for n in _REPLICATED):
        return [optimizer]
    raise NotImplementedError(f"gac.integrations.megatron: a {type(optimizer).__name__} is not supported (the "
                              "Megatron optimizers are: DistributedOptimizer, Float16OptimizerWithFloat16Params, "
                              "FP32Optimizer and ChainedOptimizer of them)")


def _parameters(leaf: object) -> List[torch.Tensor]:
    params: List[torch.Tensor] = getattr(leaf, "get_parameters")()
    return params


def _parallel_state_groups() -> object:
    """Megatron's parallel_state groups, as the ProcessGroupCollection the optimizer uses by default."""
    try:
        module = importlib.import_module("megatron.core.process_groups_config")
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("gac.integrations.megatron needs megatron-core (or pass pg_collection=)") from e
    try:
        return module.ProcessGroupCollection.use_mpu_process_groups(required_pgs=_GROUPS)
    except AssertionError as e:
        raise ValueError("gac.integrations.megatron: Megatron's parallel_state is not initialised "
                         f"(initialize_model_parallel), or pass pg_collection= ({e})") from e


def _size(group: Any) -> int:
    if group is None:
        return 1
    import torch.distributed as dist

    return int(dist.get_world_size(group))


def _replicas(group: Optional[ProcessGroup]) -> Optional[ProcessGroup]:
    """``group`` as replicated_on says it: None when it is one rank (the rank's own part)."""
    return group if _size(group) > 1 else None
