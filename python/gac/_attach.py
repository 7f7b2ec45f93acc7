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

Each kind of target has its step target (gac/_targets.py: what is read,
whose step is hooked, how a step is skipped), and the
:class:`~gac._attachment.Attachment` gates it with the one agent it makes
(gac/_plan.py checks the arguments first, without making anything); a
Trainer goes to
:class:`gac.integrations.transformers.GacCallback`, which gates the
Trainer's optimizer when training begins. DeepSpeed ZeRO: the ZeRO
optimizer's ``step`` is gated, and the agent reads this rank's gradient
partition, summed over the data-parallel group (gac/_deepspeed.py says
where the partitions are and what a skip does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from gac._attachment import Attachment, Scalars, check_not_gated, make_attachment
from gac._targets import is_trainer, step_target

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gac._agent import Agent
    from gac._controller import Mode
    from gac._plan import AgentOptions
    from gac._transport import Telemetry


def attach(target: object, *, control: bool = False, mode: Optional[Mode] = None, warmup: int = 0,
           agent: Optional[Agent] = None, telemetry: Optional[Telemetry] = None, scalars: Optional[Scalars] = None,
           skip_window: int = 20, **agent_options: Unpack[AgentOptions]) -> Attachment:
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
    control: False (default): observe only (monitor mode) unless ``mode``,
        ``warmup`` or the spike guard says otherwise; True: GAC projects and
        skips (local mode, or remote when ``decision_source`` is given).
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
    max_grad_norm, spike_sigma, spike_window, spike_warmup: the spike guard
        (:class:`gac.Agent`'s): a step whose |g|, or loss, is far above the
        recent steps is skipped with the regime "spike". Asking for it asks
        for control. The loss is what the optimizer's closure returns
        (``optimizer.step(closure)``: run once, before GAC reads the
        gradients) or ``optimizer.step(loss=loss)`` (taken out before the
        optimizer sees it).

    Raises TypeError / ValueError (and the Agent's own errors) before
    anything is changed.
    """
    if is_trainer(target):
        from gac.integrations.transformers import GacCallback
        callback = GacCallback(control=control, mode=mode, warmup=warmup, agent=agent, telemetry=telemetry,
                               scalars=scalars, skip_window=skip_window, **agent_options)
        return callback.install(target).attachment
    step = step_target(target)
    if step is None:
        raise TypeError("gac.attach needs a torch.optim.Optimizer (or a wrapper with param_groups, or a "
                        "container with optimizers) or a transformers Trainer, got " + type(target).__name__)
    check_not_gated(step)
    attachment = make_attachment(control=control, mode=mode, warmup=warmup, agent=agent, telemetry=telemetry,
                                 scalars=scalars, skip_window=skip_window, **agent_options)
    attachment.hook(step)
    return attachment
