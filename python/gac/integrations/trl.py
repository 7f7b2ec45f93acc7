"""gac.rl's policy-health signals from TRL's GRPOTrainer, with no code of
the user's (the micro-batches of one optimizer step pooled by
:class:`gac.rl.StepPool`).

:class:`gac.integrations.transformers.GacCallback` installs
:class:`GrpoPolicy` when it is installed on a GRPOTrainer
(``gac.attach(trainer)``, ``GacCallback(...).install(trainer)``; not when
it is only given in ``callbacks=[...]``, where it never sees the trainer).

Where the tensors are (TRL 1.16.0, trl/trainer/grpo_trainer.py): the loss,
``GRPOTrainer._compute_loss`` behind ``compute_loss``, computes the
learner's per-token log-probabilities and entropies with
``self._get_per_token_logps_and_entropies(..., compute_entropy=True)`` and
reads the rest from its ``inputs``: ``old_per_token_logps`` (absent when
the step is on-policy: the loss then takes the log-probabilities themselves,
every ratio 1), ``completion_mask`` (times ``tool_mask``) and
``advantages``. No callback, documented method or logged metric hands these
tensors out (TRL logs only their means), so :class:`GrpoPolicy` wraps two
bound methods on the trainer instance, never the class: ``compute_loss``,
the Trainer's documented overridable method, to see each training
micro-batch's inputs, and TRL's private ``_get_per_token_logps_and_entropies``,
to keep what the loss computed (no second forward). It checks both
signatures when installed and, when they are not TRL 1.16's, installs
nothing and says so (logger "gac"); tests/python/test_trl_policy.py fails
then.

What is recorded: the signals of the union of the micro-batches of the
optimizer step (gradient accumulation): their tensors are pooled and
:func:`gac.rl.signals` runs once, in the step's last micro-batch (the one
accelerate marks ``sync_gradients``, as TRL's own entropy controller finds
it), before its backward and so before the optimizer step, DeepSpeed's
included; :meth:`gac.Attachment.record_policy` hands them to that step's
report. The behaviour log-probabilities are the loss's ratio's denominator
(``old_per_token_logps``, not vLLM's sampler's); the clip bounds the loss's
(see :func:`grpo_options`); no staleness (TRL keeps no policy version per
completion). Evaluation's ``compute_loss`` is not counted. Signals are this
process's micro-batches (one rank's).
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from gac.rl import StepPool

if TYPE_CHECKING:
    import torch

    from gac._attachment import Attachment

__all__ = ["GrpoPolicy", "grpo_options", "grpo_policy"]

logger = logging.getLogger("gac")

# The attribute that marks gac's wrappers on a trainer (installed once).
_MARK = "__gac_policy__"
# The loss types that clip the ratio to [1 - epsilon_low, 1 + epsilon_high] (and cap it at args.delta).
_CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# The parameters of TRL 1.16's methods this module calls through.
_LOGPS_PARAMETERS = ("model", "input_ids", "attention_mask", "logits_to_keep", "compute_entropy")
_LOSS_PARAMETERS = ("model", "inputs")


def grpo_options(trainer: Any) -> Dict[str, Any]:
    """The arguments of :func:`gac.rl.signals` that describe ``trainer``'s
    loss: the clipping loss types (grpo, bnpo, dr_grpo, dapo, luspo) clip
    at ``epsilon_low``/``epsilon_high`` and cap the ratio at ``args.delta``
    (truncation); cispo caps it at ``epsilon_high`` (truncation, no clip);
    sapo and vespo neither clip nor cap; ``importance_sampling_level
    ="sequence"`` (GSPO) tests the sequence's ratio, exp of its mean
    log-ratio."""
    level = "mean" if trainer.importance_sampling_level == "sequence" else None
    clip: Tuple[Optional[float], Optional[float]] = (None, None)
    truncation: Optional[float] = None
    if trainer.loss_type in _CLIPPED:
        clip, truncation = (trainer.epsilon_low, trainer.epsilon_high), getattr(trainer.args, "delta", None)
    elif trainer.loss_type == "cispo":
        truncation = trainer.epsilon_high
    return {"clip_low": clip[0], "clip_high": clip[1], "truncation": truncation, "sequence_level": level}


class GrpoPolicy:
    """The policy-health signals of a GRPOTrainer's optimizer steps, to an
    attachment (see the module's text). Made by :func:`grpo_policy`."""

    def __init__(self, trainer: Any, attachment: Attachment) -> None:
        self.trainer = trainer
        self.attachment = attachment
        self.pool = StepPool()
        self._kept: Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]] = None
        self._in_loss = False
        _wrap(trainer, "_get_per_token_logps_and_entropies", self._logps)
        _wrap(trainer, "compute_loss", self._loss)

    def _logps(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if self._in_loss and kwargs.get("compute_entropy"):
            self._kept = (out[0], out[1])  # the loss's log-probabilities and entropies
        return out

    def _loss(self, original: Callable[..., Any], model: Any, inputs: Dict[str, Any], *args: Any,
              **kwargs: Any) -> Any:
        if not self.trainer.model.training:  # evaluation
            return original(model, inputs, *args, **kwargs)
        self._kept, self._in_loss = None, True
        try:
            loss = original(model, inputs, *args, **kwargs)
        finally:
            self._in_loss = False
        kept, self._kept = self._kept, None
        if kept is not None:
            self._add(inputs, *kept)
        if self.trainer.accelerator.sync_gradients:  # the step's last micro-batch, before its backward
            self.pool.flush(self.attachment)
        return loss

    def _add(self, inputs: Dict[str, Any], logprobs: torch.Tensor, entropies: Optional[torch.Tensor]) -> None:
        old = inputs.get("old_per_token_logps")
        mask = inputs["completion_mask"]
        if inputs.get("tool_mask") is not None:
            mask = mask * inputs["tool_mask"]
        self.pool.add(logprobs, logprobs if old is None else old, mask, advantages=inputs["advantages"],
                      entropies=entropies, **grpo_options(self.trainer))


def grpo_policy(trainer: object, attachment: Attachment) -> Optional[GrpoPolicy]:
    """A :class:`GrpoPolicy` on ``trainer`` when it is a TRL GRPOTrainer
    whose methods have TRL 1.16's signatures; None for another trainer (and
    a warning for a GRPOTrainer of other signatures), and None when gac's
    is installed on it already."""
    module = sys.modules.get("trl.trainer.grpo_trainer")
    grpo = getattr(module, "GRPOTrainer", None)
    if grpo is None or not isinstance(trainer, grpo) or hasattr(getattr(trainer, "compute_loss"), _MARK):
        return None
    missing = _missing(trainer, "_get_per_token_logps_and_entropies", _LOGPS_PARAMETERS) + _missing(
        trainer, "compute_loss", _LOSS_PARAMETERS)
    missing += [name for name in ("epsilon_low", "epsilon_high", "loss_type", "importance_sampling_level",
                                  "accelerator") if not hasattr(trainer, name)]
    if missing:
        logger.warning("gac: this GRPOTrainer is not TRL 1.16's shape (%s): no policy-health signals are "
                       "recorded; call gac.rl.signals and attachment.record_policy in its loss",
                       ", ".join(missing))
        return None
    return GrpoPolicy(trainer, attachment)


def _missing(trainer: object, method: str, parameters: Tuple[str, ...]) -> List[str]:
    # The parameters `method` of `trainer` lacks, as "method(name)"; ["method"] when it is no method.
    try:
        have = inspect.signature(getattr(trainer, method)).parameters
    except (AttributeError, TypeError, ValueError):
        return [method]
    return [f"{method}({name})" for name in parameters if name not in have]


def _wrap(trainer: object, name: str, wrapper: Callable[..., Any]) -> None:
    # trainer.<name> = wrapper(original, ...), as an attribute of the instance (the class is untouched).
    original = getattr(trainer, name)

    @functools.wraps(original)
    def method(self: object, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    setattr(method, _MARK, True)
    setattr(trainer, name, types.MethodType(method, trainer))
