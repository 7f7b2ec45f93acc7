"""gac's policy-health signals in TRL's GRPOTrainer with nothing but
gac.attach(trainer): a real tiny GRPOTrainer on the CPU (tiny_grpo's model,
tokenizer, data and reward) with gradient accumulation 2 and two passes over
each generation (num_iterations=2: the second pass's ratios move off 1).

Each optimizer step's report is checked against test_rl's reference (plain
float64 loops, no gac) fed what the loss saw, recomputed here: the
log-probabilities and the logits from a float64 copy of the model's forward
over each micro-batch's prompt and completion, TRL's old log-probabilities,
completion mask and advantages, over the union of the step's two
micro-batches, with the clip and truncation bounds each GRPO variant's loss
uses, written here by hand. The same values reach the Trainer's logs and
gacd's record. A GRPOTrainer whose methods are not TRL 1.16's shape gets no
wrapper and a warning; TRL's class is never changed."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

import gac
from conftest import Gacd
from test_rl import reference
from tiny_grpo import make_grpo_trainer

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
from gac.integrations.transformers import GacCallback  # noqa: E402

STEPS = 4
# TRL's own methods, as the class has them before any test (gac wraps the instance's only).
CLASS_METHODS = {name: vars(trl.GRPOTrainer)[name] for name in ("compute_loss", "_get_per_token_logps_and_entropies")}
SIGNALS = ("ess_token", "ess_sequence", "clip_fraction_low", "clip_fraction_high", "truncation_fraction",
           "log_ratio_max", "log_ratio_p99", "log_ratio_p1", "kl_k3", "log_ratio_abs_mean", "entropy_mean")


class Recording(trl.GRPOTrainer):  # type: ignore[misc]
    """A GRPOTrainer that keeps, per optimizer step, what each training micro-batch's loss is given,
    with the float64 log-probabilities and logits of the completions recomputed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: Dict[int, List[Dict[str, torch.Tensor]]] = {}

    def compute_loss(self, model: Any, inputs: Dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        if self.model.training:
            self.seen.setdefault(self.state.global_step + 1, []).append(fp64_view(self.model, inputs))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def fp64_view(model: Any, inputs: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """The micro-batch's completions under a float64 copy of `model`: logits and log-probabilities of
    the sampled tokens; with TRL's old log-probabilities, mask and advantages."""
    completion = inputs["completion_ids"]
    cols = completion.shape[1]
    body = copy.deepcopy(model.model).double()
    with torch.no_grad():
        hidden = body(input_ids=torch.cat([inputs["prompt_ids"], completion], 1),
                      attention_mask=torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)).last_hidden_state
        logits = (hidden @ model.lm_head.weight.double().T)[:, -cols - 1:-1]
    logprobs = torch.log_softmax(logits, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    old = inputs.get("old_per_token_logps")
    return {"logits": logits, "logprobs": logprobs, "old": logprobs if old is None else old.detach().double(),
            "mask": inputs["completion_mask"], "advantages": inputs["advantages"].reshape(-1, 1).double()}


def union(parts: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """The micro-batches' tensors as one batch: each right-padded (mask 0) to the longest completion."""
    cols = max(p["mask"].shape[1] for p in parts)

    def padded(x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == cols or (x.dim() == 2 and x.shape[1] == 1):
            return x
        return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, cols - x.shape[1]))

    return {k: torch.cat([padded(p[k]) for p in parts]) for k in parts[0]}


def make_trainer(out: Path, **changes: Any) -> Any:
    """tiny_grpo's trainer, made again as a Recording with gradient accumulation 2, two passes per
    generation and `changes` to its GRPOConfig."""
    base = make_grpo_trainer(str(out), STEPS, [])
    args = dataclasses.replace(base.args, gradient_accumulation_steps=2, num_iterations=2, disable_tqdm=True,
                               generation_batch_size=None, steps_per_generation=None, **changes)
    return Recording(model=base.model, reward_funcs=base.reward_funcs, args=args, train_dataset=base.train_dataset,
                     processing_class=base.processing_class)


class Reports(transformers.TrainerCallback):  # type: ignore[misc]
    """The attachment's report of every optimizer step."""

    def __init__(self, attachment: Any) -> None:
        self.attachment = attachment
        self.reports: List[Any] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.reports.append(self.attachment.last_report)


def train(trainer: Any, callback: GacCallback) -> List[Any]:
    """Trains `trainer` with `callback` installed (twice: a second install must not pool twice); the
    report of every optimizer step."""
    callback.install(trainer)
    callback.install(trainer)
    reports = Reports(callback.attachment)
    trainer.add_callback(reports)
    trainer.train()
    assert [r.step for r in reports.reports] == list(range(1, STEPS + 1))
    return reports.reports


def assert_report(report: Any, want: Dict[str, Any]) -> None:
    assert report.policy_tokens == want["tokens"] and not report.policy_invalid
    for name in SIGNALS:
        got = getattr(report, name)
        if name not in want:
            assert got is None, (report.step, name, got)
        else:
            assert math.isclose(got, want[name], rel_tol=1e-5, abs_tol=1e-5), (report.step, name, got, want[name])
    assert report.staleness_mean is None


# The GRPO variants and the bounds their losses clip and cap the ratio with (TRL 1.16's _compute_loss).
VARIANTS = [
    pytest.param({}, {"clip_low": 0.2, "clip_high": 0.2}, id="dapo"),
    pytest.param({"loss_type": "grpo", "epsilon": 0.1, "epsilon_high": 0.15, "delta": 1.25},
                 {"clip_low": 0.1, "clip_high": 0.15, "truncation": 1.25}, id="grpo-delta"),
    pytest.param({"importance_sampling_level": "sequence", "epsilon": 0.02, "epsilon_high": 0.03},
                 {"clip_low": 0.02, "clip_high": 0.03, "sequence_level": "mean"}, id="gspo"),
    pytest.param({"loss_type": "cispo", "epsilon_high": 1.1},
                 {"clip_low": None, "clip_high": None, "truncation": 1.1}, id="cispo"),
]


@pytest.mark.parametrize("changes, bounds", VARIANTS)
def test_every_step_carries_the_signals_of_its_micro_batches(tmp_path: Path, changes: Dict[str, Any],
                                                            bounds: Dict[str, Any]) -> None:
    trainer = make_trainer(tmp_path, **changes)
    callback = GacCallback()
    reports = train(trainer, callback)
    moved, clipped = 0, 0.0
    for report in reports:
        parts = trainer.seen[report.step]
        assert len(parts) == 2  # gradient accumulation 2: both micro-batches, not the last one alone
        t = union(parts)
        want = reference(t["logprobs"], t["old"], t["mask"], advantages=t["advantages"], logits=t["logits"],
                         **bounds)
        assert want["tokens"] > int(parts[-1]["mask"].sum())
        assert_report(report, want)
        moved += report.log_ratio_max > 1e-3
        clipped = max(clipped, report.clip_fraction_low or 0.0, report.clip_fraction_high or 0.0,
                      report.truncation_fraction or 0.0)
    assert moved >= 2 and clipped > 0  # the second pass over each generation: ratios off 1, some clipped
    # The logs of each step (the Trainer's history, what its report_to backends get) carry the report's values.
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert len(history) == STEPS
    for h, report in zip(history, reports):
        assert h["gac/policy_tokens"] == report.policy_tokens and h["gac/policy_invalid"] == 0
        for name in SIGNALS:
            value = getattr(report, name)
            assert h.get(f"gac/{name}") == value if value is not None else f"gac/{name}" not in h
    # The wrappers are the instance's; the classes are as they were.
    assert set(CLASS_METHODS) <= set(vars(trainer))
    assert {name: vars(trl.GRPOTrainer)[name] for name in CLASS_METHODS} == CLASS_METHODS
    assert "_get_per_token_logps_and_entropies" not in vars(Recording)


def test_gacds_record_carries_them(gacd: Gacd, tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path / "out")
    callback = GacCallback(address=gacd.address, run="grpo-policy", spool_dir=str(tmp_path / "spool"))
    reports = train(trainer, callback)
    callback.close()
    stored = {int(r["step"]): r for r in gacd.steps("grpo-policy")}
    assert sorted(stored) == list(range(1, STEPS + 1))
    for report in reports:
        record = stored[report.step]
        assert int(record["policy_tokens"]) == report.policy_tokens
        for name in ("ess_token", "ess_sequence", "kl_k3", "log_ratio_max", "entropy_mean"):
            assert float(record[name]) == pytest.approx(getattr(report, name), rel=1e-12)


class OtherShape(trl.GRPOTrainer):  # type: ignore[misc]
    """A GRPOTrainer whose log-probability method no longer takes compute_entropy."""

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: Any, attention_mask: Any,
                                           logits_to_keep: Any, batch_size: Optional[int] = None) -> Tuple[Any, ...]:
        return tuple(super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                                batch_size))


def test_a_grpo_trainer_of_another_shape_gets_no_wrapper(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    base = make_grpo_trainer(str(tmp_path), 1, [])
    trainer = OtherShape(model=base.model, reward_funcs=base.reward_funcs, args=base.args,
                         train_dataset=base.train_dataset, processing_class=base.processing_class)
    with caplog.at_level(logging.WARNING, logger="gac"):
        gac.attach(trainer)
    assert "not TRL 1.16's shape (_get_per_token_logps_and_entropies(compute_entropy))" in caplog.text
    assert "compute_loss" not in vars(trainer) and "_get_per_token_logps_and_entropies" not in vars(trainer)


def test_trls_methods_are_the_shape_the_wrappers_take() -> None:
    # What gac.integrations.trl calls through, in TRL itself: a change here is a change to make there.
    import inspect
    logps = inspect.signature(trl.GRPOTrainer._get_per_token_logps_and_entropies).parameters
    assert list(logps)[:5] == ["self", "model", "input_ids", "attention_mask", "logits_to_keep"]
    assert "compute_entropy" in logps
    assert list(inspect.signature(trl.GRPOTrainer.compute_loss).parameters)[:3] == ["self", "model", "inputs"]
    source = inspect.getsource(trl.GRPOTrainer._compute_loss)
    assert source.count("self._get_per_token_logps_and_entropies(") == 1 and "compute_entropy=True" in source
    for key in ('inputs["completion_mask"]', 'inputs["advantages"]', 'inputs.get("old_per_token_logps")'):
        assert key in source, key
