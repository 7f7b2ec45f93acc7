"""An optimizer module for verl's ``optim.optimizer_impl``: AdamW gated by GAC.

verl builds the actor's optimizer from two settings
(``verl/workers/config/optimizer.py``, ``build_optimizer``): it imports the
module ``optim.optimizer_impl`` (default ``torch.optim``), takes the class
named ``optim.optimizer`` (default ``AdamW``) from it and calls it with the
parameters, ``lr``, ``weight_decay``, ``betas`` (for Adam-like names) and
the entries of ``optim.override_optimizer_config``. So one setting puts GAC
into verl's actor update::

    actor_rollout_ref.actor.optim.optimizer_impl=gac.integrations.verl

and GAC's options are ``gac_*`` entries of ``override_optimizer_config``
(the rest of it goes to ``torch.optim.AdamW``), added as verl's own
examples add entries there::

    +actor_rollout_ref.actor.optim.override_optimizer_config.gac_control=true
    +actor_rollout_ref.actor.optim.override_optimizer_config.gac_address=gacd:7070
    +actor_rollout_ref.actor.optim.override_optimizer_config.gac_run=exp-1

Without ``gac_control`` (or ``gac_mode``, ``gac_warmup``) GAC observes only.
Each call of ``step()`` (one per PPO mini-batch in verl's engine
``optimizer_step``, ``FSDPEngine`` in verl 0.9, ``DataParallelPPOActor``
before it; after verl's clipping) is one GAC
step; a skipped step leaves the weights and the AdamW state unchanged, and
verl's LR scheduler still advances. The step count goes into the
optimizer's ``state_dict`` (key ``"gac"``), so a resumed run numbers its
steps on.

Policy health: importing this module (verl does, to build the optimizer,
before the actor's first update) registers a verl policy loss ``"gac"``
through verl's own ``register_policy_loss`` (verl/trainer/ppo/core_algos.py).
It is the policy loss named by the ``gac_policy_loss`` entry (default
``"vanilla"``), unchanged, which also keeps the tensors verl hands it::

    actor_rollout_ref.actor.policy_loss.loss_mode=gac
    +actor_rollout_ref.actor.optim.override_optimizer_config.gac_policy_loss=gspo   # when not vanilla

Each optimizer step then computes :func:`gac.rl.signals` once over the
step's micro-batches (each micro-batch's ``log_prob``, ``old_log_prob``,
``advantages`` and ``response_mask``, pooled: the union), just before GAC
judges it, and that step's report (and gacd's record) carries them. The
clip bounds are verl's ``clip_ratio_low``/``clip_ratio_high`` (or
``clip_ratio``) for the losses that clip with them: "vanilla" and
"clip_cov" (PPO's clip: the advantage's sign decides the side), "gspo" (the
same on the sequence's ratio, exp of its mean log-ratio) and "cispo" (its
clip stops the gradient of every token outside the range, whatever the
advantage: counted without it); the other losses get no clip fraction.
No entropy (verl's policy losses do not get it) and no staleness;
``old_log_prob`` is what verl's loss divides by (the rollout's log-probs in
its bypass mode, which sets its own loss_mode and so leaves "gac" out). The
signals are this rank's micro-batches; forward-only passes (no gradient)
are not counted.
"""

from __future__ import annotations

import functools
import importlib.util
import types
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, cast

import torch

from gac._attachment import Attachment
from gac._plan import AGENT_OPTIONS, ATTACH_OPTIONS, AgentOptions, plan_attach
from gac._targets import OptimizerTarget
from gac.integrations._gacd import CONFIG_KEYS, GACD_OPTIONS, GacdLink
from gac.rl import StepPool

if TYPE_CHECKING:
    from torch.optim.optimizer import ParamsT

# The agent's options a config cannot carry (a YAML/Hydra value), with the
# reason; every other one is a gac_<name> key, passed on as it is.
_LEFT_OUT = {
    "reference": "the plug-in always snapshots the raw gradient (the paper's p)",
    "layers": "parameter objects, not config values",
    "groups": "deprecated (layers)",
    "process_group": "the plug-in finds the data-parallel group itself",
    "replicated_on": "parameter objects and groups, not config values",
    "decision_source": "an object; remote mode comes from gac_address",
    "num_threads": "the agent's default (one per core, up to 8) suits a trainer's process",
    "chunk_elements": "a benchmark knob",
}
# gac.Agent's options passed on as they are (gac_<name> -> name).
_AGENT_OPTIONS = tuple(name for name in AGENT_OPTIONS if name not in _LEFT_OUT)
# Every key the plug-in takes: attach's own choices, the agent's options, gacd's, and the policy loss "gac" wraps.
_GAC_OPTIONS = tuple("gac_" + name for name in ATTACH_OPTIONS + _AGENT_OPTIONS + GACD_OPTIONS) + ("gac_policy_loss",)
# verl's policy losses that clip the ratio to [1 - clip_ratio_low, 1 + clip_ratio_high]: (the ratio they
# clip, as gac.rl.signals' sequence_level; whether the clip depends on the advantage's sign, as PPO's does).
_CLIPPING: Dict[str, Tuple[Optional[str], bool]] = {
    "vanilla": (None, True), "clip_cov": (None, True), "gspo": ("mean", True), "cispo": (None, False)}
# The micro-batches of the update under way, once an AdamW of this module exists in the process (it
# clears them in zero_grad and hands their signals to its attachment in step); None before.
_POOL: Optional[StepPool] = None


class AdamW(torch.optim.AdamW):  # type: ignore[misc, unused-ignore]  # (torch unanalysed: Any)
    """``torch.optim.AdamW`` whose ``step`` GAC gates (see the module's text).

    gac_control, gac_mode, gac_warmup, gac_c_low, gac_c_high,
    gac_alpha_mode, gac_snapshot_dtype, gac_trigger, gac_window,
    gac_window_c_low, gac_window_c_high, gac_skip_window, gac_max_grad_norm,
    gac_spike_sigma, gac_spike_window, gac_spike_warmup, gac_passes: as
    :func:`gac.attach`'s control, mode, warmup, c_low, ... (observing unless
    control, or the spike guard, is asked for).
    gac_address, gac_run: stream every step to gacd (rank 0 only unless
    ``gac_all_ranks``); with ``gac_mode="remote"`` gacd decides (a
    :class:`gac.RemoteController` on every rank, ``gac_deadline`` seconds).
    gac_token, gac_tls, gac_spool_dir: the token, the TLS roots (PEM text or
    a file path) and the Telemetry's spool folder.

    Sharded gradients (verl's FSDP/FSDP2): when torch.distributed is
    initialised with more than one rank, the agent sums each rank's shard
    over the default group (every rank), so every rank reaches the same
    decision. The attachment is ``optimizer.gac``.

    gac_policy_loss: the verl policy loss that verl's ``loss_mode=gac``
    computes (a registered name, not "gac"; default "vanilla"): see the
    module's text. Raises ValueError for what is not such a name.
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, **options: Any) -> None:
        gac_options = {k: options.pop(k) for k in list(options) if k.startswith("gac_")}
        unknown = sorted(set(gac_options) - set(_GAC_OPTIONS))
        if unknown:
            raise TypeError(f"gac.integrations.verl.AdamW: unknown option(s) {', '.join(unknown)}; "
                            f"GAC takes {', '.join(_GAC_OPTIONS)}")
        _check_policy_loss(gac_options.pop("gac_policy_loss", "vanilla"))
        super().__init__(params, lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps,
                         weight_decay=weight_decay, **options)
        self.gac: Attachment = _attachment(gac_options)
        self.gac.hook(OptimizerTarget(self))
        _flush_before(self)

    def zero_grad(self, set_to_none: bool = True) -> None:
        # verl's engine zeroes the gradients before an update's micro-batches (and after a
        # non-finite gradient, without a step): what the pool holds then is no update's.
        if _POOL is not None:
            _POOL.clear()
        super().zero_grad(set_to_none)

    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = super().state_dict()
        state["gac"] = {"step": self.gac.step}
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("gac", None)
        super().load_state_dict(state_dict)
        if saved is not None:
            self.gac.step = int(saved["step"])


def _attachment(o: Dict[str, Any]) -> Attachment:
    """The attachment the gac_* options ask for. The values are whatever verl's
    configuration holds: plan_attach, GacdLink and the agent check them."""
    options = cast(AgentOptions, {name: o["gac_" + name] for name in _AGENT_OPTIONS if "gac_" + name in o})
    gacd = GacdLink(**{name: o["gac_" + name] for name in GACD_OPTIONS if "gac_" + name in o}, spelling=CONFIG_KEYS)
    plan = plan_attach(o.get("gac_control", False), o.get("gac_mode"), o.get("gac_warmup", 0), None,
                       o.get("gac_skip_window", 20), options)
    group = _process_group()
    if group is not None:
        plan = plan.with_options({"process_group": group})
    return gacd.attachment(plan)


def _process_group() -> Optional[torch.distributed.ProcessGroup]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_world_size() > 1:
            return torch.distributed.group.WORLD
    return None


def _check_policy_loss(name: object) -> None:
    if not isinstance(name, str) or name == "gac":
        raise ValueError(f"gac.integrations.verl.AdamW: gac_policy_loss must name the verl policy loss that loss_mode "
                         f"gac computes (vanilla, gspo, ...; not gac itself), got {name!r}")


def _flush_before(optimizer: AdamW) -> None:
    # optimizer.step, GAC's gate, behind one more bound method that first hands the pooled
    # micro-batches' signals to the attachment (for the report of the step the gate judges).
    global _POOL
    if _POOL is None:
        _POOL = StepPool()
    gated = optimizer.step

    @functools.wraps(gated)
    def step(opt: AdamW, *args: Any, **kwargs: Any) -> Any:
        if _POOL is not None:
            _POOL.flush(opt.gac)
        return gated(*args, **kwargs)

    setattr(optimizer, "step", types.MethodType(step, optimizer))


def policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Any = None,
                rollout_is_weights: Optional[torch.Tensor] = None) -> Any:
    """verl's policy loss ``"gac"`` (a ``PolicyLossFn``): the loss named by
    the actor's ``gac_policy_loss`` (``optim.override_optimizer_config``;
    default "vanilla"), called with the same arguments; its tensors also go
    to the update's pool when it computes a gradient and an AdamW of this
    module will step (see the module's text)."""
    overrides = getattr(getattr(config, "optim", None), "override_optimizer_config", None) or {}
    name = overrides.get("gac_policy_loss", "vanilla")
    if _POOL is not None and torch.is_grad_enabled():
        level, by_advantage = _CLIPPING.get(name, (None, False))
        _POOL.add(log_prob, old_log_prob, response_mask, advantages=advantages if by_advantage else None,
                  clip_low=_bound(config, "clip_ratio_low", name), clip_high=_bound(config, "clip_ratio_high", name),
                  sequence_level=level)
    loss = _core_algos().get_policy_loss_fn(name)
    return loss(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
                loss_agg_mode=loss_agg_mode, config=config, rollout_is_weights=rollout_is_weights)


def _bound(config: Any, name: str, loss: str) -> Optional[float]:
    # verl's clip_ratio_low / clip_ratio_high (clip_ratio where unset, as its losses read them) for a
    # loss that clips with them; None for another.
    if loss not in _CLIPPING:
        return None
    value = getattr(config, name, None)
    return float(config.clip_ratio if value is None else value)


def _core_algos() -> Any:
    return importlib.import_module("verl.trainer.ppo.core_algos")  # verl's policy-loss registry


if importlib.util.find_spec("verl") is not None:
    _core_algos().register_policy_loss("gac")(policy_loss)
