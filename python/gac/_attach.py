"""gac.attach: GAC on a trainer's optimizer step in one line.

    attachment = gac.attach(trainer)            # a transformers / TRL Trainer
    attachment = gac.attach(optimizer)          # any torch.optim.Optimizer

The optimizer's ``step`` is wrapped: before the update it runs
:meth:`gac.Agent.step` on the parameters the optimizer updates (their
gradients are read, and projected in place when GAC projects), and it calls
the original ``step`` only when the report says so. A skipped update leaves
the weights, the optimizer's state and (for a Trainer) the learning-rate
schedule unchanged, as Algorithm 1 of the paper keeps theta_t = theta_{t-1}.

A Trainer creates its optimizer inside ``train()``: the wrapper is installed
by a callback when training begins, around accelerate's optimizer, after
the gradients were synchronised and clipped (clipping scales every gradient
by one factor, which leaves c_t unchanged; the reported norms are the
clipped ones).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional


class Attachment:
    """What :func:`attach` installed: the agent, the latest report, and
    :meth:`detach`, which puts the optimizer's own ``step`` back."""

    def __init__(self, agent: Any, telemetry: Any = None,
                 scalars: Optional[Callable[[], Dict[str, float]]] = None) -> None:
        self.agent = agent
        self.telemetry = telemetry
        self.scalars = scalars
        self.last_report: Any = None
        self.reports = 0
        self.skipped = 0
        self._optimizer: Any = None
        self._original_step: Optional[Callable[..., Any]] = None
        self._step = 0
        self._step_of: Optional[Callable[[], int]] = None
        self._params: List[Any] = []
        self._params_key: List[Any] = []

    # The optimizer whose step is gated; its parameters are what the agent reads.
    def _wrap(self, optimizer: Any, step_of: Optional[Callable[[], int]] = None) -> None:
        if self._optimizer is not None:
            if self._optimizer is optimizer:
                return
            self.detach()
        original = optimizer.step
        attachment = self

        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            return attachment._gated_step(original, args, kwargs)

        optimizer.step = step
        self._optimizer = optimizer
        self._original_step = original
        self._step_of = step_of
        self._params_key = []

    def _parameters(self) -> List[Any]:
        # Made once, and again when a group or its list of parameters changes
        # (add_param_group, a new list): the same list each step spares the iteration,
        # and the agent reuses its conversion of it.
        groups = self._optimizer.param_groups
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
        self._step = self._step_of() if self._step_of is not None else self._step + 1
        report = self.agent.step(self._step, self._parameters())
        self.last_report = report
        self.reports += 1
        if self.telemetry is not None:
            scalars = self.scalars() if self.scalars is not None else None
            self.telemetry.send(report, scalars=scalars)
        if report.step_optimizer:
            _set_skipped(self._optimizer, False)
            return original(*args, **kwargs)
        self.skipped += 1
        _set_skipped(self._optimizer, True)
        return None

    def detach(self) -> None:
        """Puts the optimizer's own ``step`` back (idempotent)."""
        if self._optimizer is not None and self._original_step is not None:
            try:
                del self._optimizer.step  # the instance attribute; the class's step shows again
            except AttributeError:
                self._optimizer.step = self._original_step
        self._optimizer = None
        self._original_step = None


def _set_skipped(optimizer: Any, skipped: bool) -> None:
    # accelerate's AcceleratedOptimizer reports a step it did not take through
    # _is_overflow (a mixed-precision overflow otherwise): the Trainer then
    # leaves the learning-rate scheduler where it was.
    if hasattr(optimizer, "_is_overflow"):
        optimizer._is_overflow = skipped


def _is_trainer(target: Any) -> bool:
    return hasattr(target, "add_callback") and hasattr(target, "args") and hasattr(target, "state")


def attach(target: Any, *, agent: Any = None, telemetry: Any = None,
           scalars: Optional[Callable[[], Dict[str, float]]] = None, **agent_options: Any) -> Attachment:
    """Gates ``target``'s optimizer step with GAC; returns the :class:`Attachment`.

    target: a transformers ``Trainer`` (TRL's trainers included) or a
        ``torch.optim.Optimizer``.
    agent: the :class:`gac.Agent` to use; else one is made from
        ``agent_options`` (``c_low``, ``c_high``, ``mode``, ...).
    telemetry: a :class:`gac.Telemetry` every report is sent to, with the
        scalars ``scalars()`` returns, when given.
    """
    if agent is None:
        from gac import Agent
        agent = Agent(**agent_options)
    elif agent_options:
        raise ValueError("pass either agent= or the options of a new Agent, not both")
    attachment = Attachment(agent, telemetry, scalars)
    if _is_trainer(target):
        target.add_callback(_trainer_callback(attachment, target))
        return attachment
    if hasattr(target, "step") and hasattr(target, "param_groups"):
        attachment._wrap(target)
        return attachment
    raise TypeError("gac.attach needs a transformers Trainer or a torch.optim.Optimizer, got a "
                    + type(target).__name__)


def _trainer_callback(attachment: Attachment, trainer: Any) -> Any:
    from transformers import TrainerCallback

    class _GacCallback(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                           **kwargs: Any) -> None:
            opt = optimizer if optimizer is not None else trainer.optimizer
            if getattr(trainer, "is_deepspeed_enabled", False):
                raise NotImplementedError("gac.attach: DeepSpeed steps its optimizer inside backward(); "
                                          "not supported yet")
            attachment._wrap(opt, step_of=lambda: state.global_step + 1)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            attachment.detach()

    return _GacCallback()

