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

import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Union

import torch

from gac._attachment import AgentOptions, Attachment, make_attachment, resolve_mode
from gac._controller import Controller
from gac._native import remote_controller_class, telemetry_class
from gac._targets import OptimizerTarget

if TYPE_CHECKING:
    from torch.optim.optimizer import ParamsT

_GAC_OPTIONS = ("gac_control", "gac_mode", "gac_warmup", "gac_c_low", "gac_c_high", "gac_alpha_mode",
                "gac_snapshot_dtype", "gac_trigger", "gac_window", "gac_window_c_low", "gac_window_c_high",
                "gac_address", "gac_run", "gac_token", "gac_tls", "gac_deadline", "gac_spool_dir", "gac_all_ranks",
                "gac_skip_window", "gac_max_grad_norm", "gac_spike_sigma", "gac_spike_window", "gac_spike_warmup",
                "gac_passes")
# gac.Agent's options passed on as they are (gac_<name> -> name).
_AGENT_OPTIONS = ("c_low", "c_high", "alpha_mode", "snapshot_dtype", "trigger", "window", "window_c_low",
                  "window_c_high", "max_grad_norm", "spike_sigma", "spike_window", "spike_warmup", "passes")


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
        self.gac: Attachment = make_attachment(**_attach_options(gac_options))
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


def _attach_options(o: Dict[str, Any]) -> Dict[str, Any]:
    """gac.attach's arguments from the gac_* options (checked by make_attachment and the classes it makes).
    The values are whatever verl's configuration holds: make_attachment checks them."""
    out: Dict[str, Any] = {"control": o.get("gac_control", False), "mode": o.get("gac_mode"),
                           "warmup": o.get("gac_warmup", 0), "skip_window": o.get("gac_skip_window", 20)}
    for name in _AGENT_OPTIONS:
        if "gac_" + name in o:
            out[name] = o["gac_" + name]
    # Checked before any client to gacd is made; make_attachment checks the rest.
    thresholds: AgentOptions = {}
    if "c_low" in out:
        thresholds["c_low"] = out["c_low"]
    if "c_high" in out:
        thresholds["c_high"] = out["c_high"]
    resolve_mode(out["control"], out["mode"], out["warmup"], None, thresholds, out["skip_window"])
    if thresholds:
        Controller(thresholds.get("c_low", 0.05), thresholds.get("c_high", 0.3))
    group = _process_group()
    if group is not None:
        out["process_group"] = group
    rank = torch.distributed.get_rank() if group is not None else int(os.environ.get("RANK", "0"))
    world_size = torch.distributed.get_world_size() if group is not None else int(os.environ.get("WORLD_SIZE", "1"))
    address: Optional[str] = o.get("gac_address")
    run: Optional[str] = o.get("gac_run")
    if address is None and (run is not None or out["mode"] == "remote"):
        raise ValueError("gac_run and gac_mode='remote' need gac_address (gacd's host:port)")
    if address is not None:
        if not isinstance(run, str):
            raise ValueError("gac_address needs gac_run (the run id the steps are stored under)")
        token: Optional[str] = o.get("gac_token")
        tls: Optional[str] = o.get("gac_tls")
        if out["mode"] == "remote":
            out["decision_source"] = remote_controller_class()(address, run, rank=rank, token=token, tls=tls,
                                                               deadline=float(o.get("gac_deadline", 0.05)))
        if rank == 0 or o.get("gac_all_ranks", False):
            spool: Union[str, None] = o.get("gac_spool_dir")
            out["telemetry"] = telemetry_class()(address, run, rank=rank, world_size=world_size, spool_dir=spool,
                                                 token=token, tls=tls)
    return out


def _process_group() -> Optional[torch.distributed.ProcessGroup]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_world_size() > 1:
            return torch.distributed.group.WORLD
    return None
