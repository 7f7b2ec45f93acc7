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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, cast

import torch

from gac._attachment import Attachment
from gac._plan import AGENT_OPTIONS, ATTACH_OPTIONS, AgentOptions, plan_attach
from gac._targets import OptimizerTarget
from gac.integrations._gacd import CONFIG_KEYS, GACD_OPTIONS, GacdLink

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
# Every key the plug-in takes: attach's own choices, the agent's options, gacd's.
_GAC_OPTIONS = tuple("gac_" + name for name in ATTACH_OPTIONS + _AGENT_OPTIONS + GACD_OPTIONS)


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
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, **options: Any) -> None:
        gac_options = {k: options.pop(k) for k in list(options) if k.startswith("gac_")}
        unknown = sorted(set(gac_options) - set(_GAC_OPTIONS))
        if unknown:
            raise TypeError(f"gac.integrations.verl.AdamW: unknown option(s) {', '.join(unknown)}; "
                            f"GAC takes {', '.join(_GAC_OPTIONS)}")
        super().__init__(params, lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps,
                         weight_decay=weight_decay, **options)
        self.gac: Attachment = _attachment(gac_options)
        self.gac.hook(OptimizerTarget(self))

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
