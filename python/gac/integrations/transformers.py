"""GacCallback: GAC in transformers' Trainer and TRL's trainers.

    callback = GacCallback()                                    # observe; gac/* in the Trainer's logs
    callback = GacCallback(control=True, address="gacd:7070", run="exp-1")   # control, stream to gacd
    GacCallback(mode="remote", address="gacd:7070", run="exp-1").install(trainer)   # gacd decides

When training begins the callback gates the Trainer's optimizer step (the
accelerate-wrapped optimizer, after the gradients were accumulated,
synchronised and clipped) with :func:`gac.attach`'s wrapper; the GAC step is
the Trainer's ``global_step + 1``. A skipped update is reported to the
Trainer as not taken, so the learning-rate schedule holds too.

Logs: at every logging step ``on_log`` adds gac's values to the logs dict
(``gac/cosine``, ``gac/regime``, ``gac/alpha``, ``gac/grad_norm``,
``gac/cosine_max``, ``gac/skipped``, ``gac/projected``,
``gac/skipped_total``, ``gac/projected_total``, ``gac/skip_fraction``, and
``gac/fallbacks_total`` in remote mode), so every ``report_to`` backend logs
them. The Trainer calls its ``report_to`` callbacks before the ones passed
in ``callbacks=[...]``: :meth:`GacCallback.install` puts it first.

Policy health: installed on TRL's GRPOTrainer (``install(trainer)``, as
``gac.attach(trainer)`` does), the callback also computes gac.rl's
policy-health signals of each optimizer step from the loss's own tensors
(the union of the step's micro-batches) and hands them to the step's report
(:mod:`gac.integrations.trl` says where they come from); the logs then carry
the report's ``gac/policy_tokens``, ``gac/ess_token``,
``gac/ess_sequence``, ``gac/clip_fraction_low``, ``gac/clip_fraction_high``,
``gac/truncation_fraction``, ``gac/log_ratio_max``, ``gac/log_ratio_p99``,
``gac/log_ratio_p1``, ``gac/kl_k3``, ``gac/log_ratio_abs_mean``,
``gac/entropy_mean`` and ``gac/policy_invalid`` (those with a value), as
gacd's record does.

Telemetry: with ``address`` (or ``telemetry=``) each step's report is sent
to gacd once, with the Trainer's numeric logs of that step as scalars when
it is a logging step.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import fields
from typing import TYPE_CHECKING, Dict, Optional, Union

from transformers import TrainerCallback

from gac._attachment import Attachment, ReportFeed, Scalars, build_attachment
from gac._controller import MAX_TRAINER_SCALARS
from gac._deepspeed import zero_target
from gac._plan import plan_attach
from gac._report import REGIMES
from gac._targets import is_trainer, step_target
from gac.integrations._gacd import GacdLink
from gac.integrations.trl import GrpoPolicy, grpo_policy
from gac.rl import PolicySignals

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from typing_extensions import Unpack

    from gac._agent import Agent
    from gac._controller import Mode, StepReport
    from gac._plan import AgentOptions
    from gac._targets import StepTarget
    from gac._transport import Telemetry

logger = logging.getLogger("gac")

# The report's fields that carry gac.rl's signals: PolicySignals' fields, by the report's names.
_POLICY_FIELDS = frozenset({"tokens": "policy_tokens", "invalid": "policy_invalid"}.get(f.name, f.name)
                           for f in fields(PolicySignals))


class GacCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]  # (transformers unanalysed: Any)
    """GAC on a transformers/TRL Trainer's optimizer step, its values in the
    Trainer's logs, its reports streamed to gacd when asked.

    control, mode, warmup, agent, skip_window and the Agent's options
    (c_low, c_high, alpha_mode, process_group, decision_source, ...): as for
    :func:`gac.attach`; observing (monitor mode) unless control is asked for.
    address, run: gacd (``host:port`` or a list) and the run id: each step is
    sent there by a :class:`gac.Telemetry` (rank 0 only unless
    ``all_ranks``); with ``mode="remote"`` a :class:`gac.RemoteController`
    on the same address decides (every rank), its Decide ``deadline`` in
    seconds. token, tls, spool_dir: the Telemetry's and the controller's.
    telemetry: a Telemetry of your own instead of ``address``.
    scalars: a function whose ``{name: value}`` is sent with each report.
    The rank and world size are torch.distributed's, or before it is
    initialised torch's launch variables RANK and WORLD_SIZE.

    Raises TypeError / ValueError (and the Agent's own errors) for bad
    arguments, before anything is made.
    """

    def __init__(self, *, control: bool = False, mode: Optional[Mode] = None, warmup: int = 0,
                 address: Optional[str] = None, run: Optional[str] = None, token: Optional[str] = None,
                 tls: Union[str, bytes, "os.PathLike[str]", None] = None,
                 spool_dir: Union[str, "os.PathLike[str]", None] = None, deadline: float = 0.05,
                 all_ranks: bool = False, agent: Optional[Agent] = None, telemetry: Optional[Telemetry] = None,
                 scalars: Optional[Scalars] = None, skip_window: int = 20,
                 **agent_options: Unpack[AgentOptions]) -> None:
        gacd = GacdLink(address, run, token=token, tls=tls, spool_dir=spool_dir, deadline=deadline,
                        all_ranks=all_ranks, telemetry=telemetry)
        plan = plan_attach(control, mode, warmup, agent, skip_window, agent_options)
        # The reports go to gacd from here (with the Trainer's logs), not from the attachment.
        self._feed = ReportFeed(telemetry, scalars)
        self.attachment: Attachment = build_attachment(gacd.decided_by_gacd(plan))
        self.attachment.on_report = self._on_report
        self._feed.telemetry = gacd.telemetry()
        self._owns_telemetry = gacd.made_telemetry
        self._pending: Optional[StepReport] = None
        self._installed = False
        self._warned_order = False
        self._reports_at_log = 0
        self._skipped_at_log = 0
        self._projected_at_log = 0
        self._cosine_max: Optional[float] = None
        self._policy: Optional[GrpoPolicy] = None

    @property
    def telemetry(self) -> Optional[Telemetry]:
        """The Telemetry the reports go to: the one made for ``address`` (on
        this rank), the caller's, or None."""
        return self._feed.telemetry

    @property
    def scalars(self) -> Optional[Scalars]:
        """The function whose ``{name: value}`` is sent with each report."""
        return self._feed.scalars

    def install(self, trainer: object) -> "GacCallback":
        """Adds this callback to ``trainer`` before every other one (so the
        ``report_to`` backends see its values in the logs); on TRL's
        GRPOTrainer, also records the policy-health signals of each step
        (:func:`gac.integrations.trl.grpo_policy`). Returns the callback."""
        if not is_trainer(trainer):
            raise TypeError(f"install needs a transformers Trainer, got {type(trainer).__name__}")
        callbacks = trainer.callback_handler.callbacks
        if any(isinstance(cb, GacCallback) and cb is not self for cb in callbacks):
            raise ValueError("this Trainer already has a GacCallback")
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        self._installed = True
        self._policy = grpo_policy(trainer, self.attachment) or self._policy
        return self

    # Trainer events.

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       optimizer: object = None, **kwargs: object) -> None:
        if optimizer is None:
            raise RuntimeError("GacCallback: the Trainer began training without an optimizer")
        if getattr(args, "deepspeed", None) or type(optimizer).__name__ == "DeepSpeedOptimizerWrapper":
            # DeepSpeed steps inside accelerator.backward() (engine.step(), before the Trainer's
            # global_step moves): GAC gates the engine's ZeRO optimizer instead.
            target: Optional[StepTarget] = zero_target(optimizer)
            if target is None:
                raise NotImplementedError("GacCallback: under DeepSpeed only ZeRO optimizers (stage 1, 2, 3) are "
                                          f"supported, got {type(optimizer).__name__}")
        else:
            target = step_target(optimizer)  # accelerate's AcceleratedOptimizer
            if target is None:
                raise TypeError(f"GacCallback: the Trainer's optimizer is a {type(optimizer).__name__}, which "
                                "has no param_groups and step()")
        self.attachment.hook(target, step_of=lambda: int(state.global_step) + 1)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: object) -> None:
        self._send_pending(None)
        if self._policy is not None:
            self._policy.pool.clear()  # what an unfinished step left

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: Optional[Dict[str, object]] = None, **kwargs: object) -> None:
        if logs is None:
            return
        if not self._installed and not self._warned_order and getattr(args, "report_to", None):
            self._warned_order = True
            logger.warning("GacCallback was given in Trainer(callbacks=[...]): the report_to backends %s run "
                           "before it and miss its gac/* values; use GacCallback(...).install(trainer) or "
                           "gac.attach(trainer)", args.report_to)
        report = self.attachment.last_report
        if report is not None and self.attachment.reports > self._reports_at_log:
            metrics = self._log_metrics(report)
            logs.update(metrics)
            history = getattr(state, "log_history", None)
            if history and history[-1].get("step") == state.global_step:
                history[-1].update(metrics)  # the Trainer recorded the logs before calling on_log
        if self._pending is not None and self._pending.step == state.global_step:
            self._send_pending(logs)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: object) -> None:
        self._send_pending(None)
        if self._policy is not None:
            self._policy.pool.clear()
        self.attachment.detach()
        if self.telemetry is not None and not self.telemetry.flush(10.0):
            logger.warning("GacCallback: gacd did not acknowledge every step within 10 s: %s",
                           self.telemetry.last_error)

    def close(self) -> None:
        """Closes the Telemetry the callback made (what gacd has not
        acknowledged stays in the spool, when there is one)."""
        if self._owns_telemetry and self.telemetry is not None:
            self.telemetry.close()

    # What goes to the logs and to gacd.

    def _on_report(self, report: StepReport) -> None:
        self._send_pending(None)  # a step that no on_step_begin followed
        self._pending = report if self.telemetry is not None else None
        if report.cosine is not None:
            c = abs(report.cosine)
            self._cosine_max = c if self._cosine_max is None else max(self._cosine_max, c)

    def _log_metrics(self, r: StepReport) -> Dict[str, float]:
        att = self.attachment
        out: Dict[str, float] = {}
        if r.cosine is not None:
            out["gac/cosine"] = r.cosine
        out["gac/regime"] = float(REGIMES.index(r.regime))
        out["gac/alpha"] = r.alpha
        out["gac/grad_norm"] = r.grad_norm
        if self._cosine_max is not None:
            out["gac/cosine_max"] = self._cosine_max
        out["gac/skipped"] = float(att.skipped - self._skipped_at_log)
        out["gac/projected"] = float(att.projected - self._projected_at_log)
        if r.policy_tokens is not None:
            out.update((k, v) for k, v in r.to_dict("gac/").items() if k[4:] in _POLICY_FIELDS)
        out.update(att.metrics())
        self._reports_at_log, self._skipped_at_log = att.reports, att.skipped
        self._projected_at_log, self._cosine_max = att.projected, None
        return out

    def _send_pending(self, logs: Optional[Dict[str, object]]) -> None:
        report, self._pending = self._pending, None
        if report is None or self.telemetry is None:
            return
        # The Trainer's numeric logs, as many as a record takes besides gac's sender's counters and
        # gac/skip_fraction (gac/transport/scalar_budget.h).
        logged: Dict[str, float] = {}
        for k, v in (logs or {}).items():
            if (isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith("gac/")
                    and math.isfinite(v) and len(logged) < MAX_TRAINER_SCALARS - 1):
                logged[k] = float(v)
        self._feed.send(report, self.attachment.skip_fraction, logged)
