"""What an attachment is made of, decided before anything is made.

:class:`AgentOptions` is the one list of :class:`gac.Agent`'s options that
gac.attach and the integrations pass on (tests/python/test_package.py checks
it against the Agent's keywords). :func:`plan_attach` checks attach's own
arguments and the choice of control, and returns an :class:`AttachPlan`: the
agent's mode when it is made and after the warm-up, and its options. It is a
pure function (no native object is made, nothing is changed), called once per
attach by gac.attach, ``GacCallback``, verl's and Megatron's plug-ins;
the Agent checks the values of its own options (thresholds, windows, the
spike guard, ...) when it is made from the plan, once.

The defaults of the options are the Agent's own (c_low 0.05 and c_high 0.3
are ``gac::controller::Thresholds``'): a plan names only what was given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable, Literal, NamedTuple, Optional, Tuple, TypedDict, Union

from gac._report import MODES

if TYPE_CHECKING:
    import torch
    import torch.distributed

    from gac._agent import Agent
    from gac._controller import AlphaMode, DecisionSource, Mode, Trigger
    from gac._dist import ReplicatedOn


class AgentOptions(TypedDict, total=False):
    """The options of :class:`gac.Agent` that gac.attach passes on to the
    agent it makes (all but ``mode``, which attach chooses)."""

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


# The names of AgentOptions, in its order.
AGENT_OPTIONS: Tuple[str, ...] = tuple(AgentOptions.__annotations__)
# gac.attach's own choices besides the agent's options (the integrations take them too).
ATTACH_OPTIONS = ("control", "mode", "warmup", "skip_window")
# The options of the spike guard: asking for any of them asks for control.
SPIKE_OPTIONS = ("max_grad_norm", "spike_sigma", "spike_window", "spike_warmup")
# suggest_thresholds needs at least this many cosines; the first step has none.
MIN_WARMUP = 21


class AttachPlan(NamedTuple):
    """An attachment to make: the caller's ``agent`` (used as it is, in its
    own mode), or a new one made in ``first_mode`` from ``agent_options``;
    ``warmup`` steps observed, after which the agent controls in
    ``control_mode`` with the thresholds they calibrate (``first_mode``
    otherwise); ``skip_window`` updates watched by the skip warning."""

    first_mode: Mode
    control_mode: Mode
    warmup: int
    skip_window: int
    agent: Optional[Agent]
    agent_options: AgentOptions

    def with_options(self, options: AgentOptions) -> AttachPlan:
        """The plan with ``options`` added to the new agent's."""
        merged: AgentOptions = {**self.agent_options, **options}
        return AttachPlan(self.first_mode, self.control_mode, self.warmup, self.skip_window, self.agent, merged)


def plan_attach(control: bool = False, mode: Optional[Mode] = None, warmup: int = 0, agent: Optional[Agent] = None,
                skip_window: int = 20, agent_options: Optional[AgentOptions] = None) -> AttachPlan:
    """Checks attach's choice of control (the arguments are gac.attach's);
    returns the plan. Raises TypeError / ValueError saying what is wrong."""
    options: AgentOptions = agent_options.copy() if agent_options else {}
    _check_types(control, mode, warmup, skip_window)
    if agent is not None:
        if options or mode is not None or control or warmup:
            raise ValueError("pass either agent= (used as it is, in its own mode) or the options of a new "
                             "agent (control, mode, warmup, c_low, ...), not both")
        return AttachPlan(agent.mode, agent.mode, 0, skip_window, agent, options)
    if control and mode == "monitor":
        raise ValueError("control=True asks GAC to change updates, mode='monitor' never does: pass one")
    if mode is None:
        # The spike guard skips in local and remote mode: asking for it asks for control.
        guard = any(options.get(name) is not None for name in SPIKE_OPTIONS)
        mode = "local" if (control or warmup or guard) else "monitor"
        if mode == "local" and options.get("decision_source") is not None:
            mode = "remote"
    if not warmup:
        return AttachPlan(mode, mode, 0, skip_window, None, options)
    if mode != "local":
        raise ValueError(f"warmup= calibrates the local thresholds and then controls with them; mode={mode!r} "
                         "does not (in remote mode gacd's run thresholds decide: gacctl calibrate)")
    if "c_low" in options or "c_high" in options:
        raise ValueError("warmup= chooses c_low and c_high itself: pass the warm-up or the thresholds")
    return AttachPlan("monitor", "local", warmup, skip_window, None, options)


def _check_types(control: object, mode: object, warmup: object, skip_window: object) -> None:
    if not isinstance(control, bool):
        raise TypeError(f"control must be a bool, got {type(control).__name__}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))} or None, got {mode!r}")
    if not isinstance(warmup, int) or isinstance(warmup, bool):
        raise TypeError(f"warmup must be an int (steps), got {type(warmup).__name__}")
    if warmup < 0 or 0 < warmup < MIN_WARMUP:
        raise ValueError(f"warmup must be 0 (none) or at least {MIN_WARMUP} steps (the calibration needs 20 "
                         f"cosines; the first step has none), got {warmup}")
    if not isinstance(skip_window, int) or isinstance(skip_window, bool) or skip_window < 1:
        raise ValueError(f"skip_window must be an int >= 1, got {skip_window!r}")
