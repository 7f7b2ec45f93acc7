"""GacCallback in transformers' Trainer with gradient accumulation 4 on the
CPU: exactly one GAC decision per optimizer step (none on the micro-steps),
each c_t and |g| equal to an fp64 recomputation from the accumulated
gradients the Trainer hands its optimizer; gac/* values in the logs every
later callback (a report_to backend) gets and in the log history (no
policy-health keys: no RL loss gave signals); under
control a skipped update moves no weight and holds the LR schedule; bad
arguments to GacCallback and install() raise and change nothing."""

from __future__ import annotations

import logging
import math
import os
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

import gac

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
from gac.integrations.transformers import GacCallback  # noqa: E402

ACCUMULATION = 4
UPDATES = 6
# The report's policy-health fields under their log names (gac.rl's signals; test_trl_policy.py has them).
POLICY_KEYS = {"gac/" + name for name in ("policy_tokens", "ess_token", "ess_sequence", "clip_fraction_low",
                                          "clip_fraction_high", "log_ratio_max", "kl_k3", "entropy_mean",
                                          "policy_invalid")}


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)}


class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 6, generator=gen)
        self.y = self.x[:, 0] * 2 - self.x[:, 1] + 0.1 * torch.randn(64, generator=gen)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i]}


class Recorder(transformers.TrainerCallback):  # type: ignore[misc]
    """Runs after GacCallback: what the optimizer is handed, what it did, what a logger gets."""

    def __init__(self) -> None:
        self.att: Optional[gac.Attachment] = None
        self.grads: List[List[torch.Tensor]] = []
        self.reports: List[Any] = []
        self.moved: List[bool] = []
        self.substeps = 0
        self.logs: List[Dict[str, Any]] = []
        self.lr_steps: List[int] = []
        self._before: List[torch.Tensor] = []

    def on_substep_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.substeps += 1

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.grads.append([p.grad.detach().double().clone() for p in model.parameters()])
        self._before = [p.detach().clone() for p in model.parameters()]

    def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        assert self.att is not None
        self.reports.append(self.att.last_report)
        self.moved.append(any(not torch.equal(b, p) for b, p in zip(self._before, model.parameters())))

    def on_step_end(self, args: Any, state: Any, control: Any, lr_scheduler: Any = None, **kw: Any) -> None:
        self.lr_steps.append(lr_scheduler._step_count)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.logs.append(dict(logs))


def make_trainer(tmp_path: Any, rec: Recorder, callbacks: Optional[List[Any]] = None) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUMULATION, max_steps=UPDATES, logging_steps=1, report_to="none",
        save_strategy="no", learning_rate=0.05, dataloader_num_workers=0, seed=0, max_grad_norm=1.0,
        disable_tqdm=True)
    torch.manual_seed(0)
    return transformers.Trainer(model=Regressor(), args=args, train_dataset=Data(),
                                callbacks=[rec] + (callbacks or []))


def fp64(g: List[torch.Tensor], p: Optional[List[torch.Tensor]]) -> Tuple[float, float, float]:
    gg = sum(float((a * a).sum()) for a in g)
    if p is None:
        return 0.0, gg, 0.0
    return sum(float((a * b).sum()) for a, b in zip(g, p)), gg, sum(float((b * b).sum()) for b in p)


def test_one_decision_per_optimizer_step_against_fp64(tmp_path: Any) -> None:
    rec = Recorder()
    trainer = make_trainer(tmp_path, rec)
    att = gac.attach(trainer)  # observes
    rec.att = att
    assert isinstance(trainer.callback_handler.callbacks[0], GacCallback)
    trainer.train()
    assert att.agent.mode == "monitor"
    assert att.reports == UPDATES == len(rec.grads) == len(rec.reports)
    assert rec.substeps == UPDATES * (ACCUMULATION - 1)
    assert [r.step for r in rec.reports] == list(range(1, UPDATES + 1))
    assert all(rec.moved)
    prev = None
    for g, r in zip(rec.grads, rec.reports):
        dot, gg, pp = fp64(g, prev)
        assert r.grad_norm == pytest.approx(math.sqrt(gg), rel=1e-6)
        if prev is None:
            assert r.cosine is None
        else:
            assert r.cosine == pytest.approx(dot / math.sqrt(gg * pp), rel=1e-6, abs=1e-9)
            assert r.regime == gac.Controller().decide(dot, gg, pp).regime
        prev = g
    # The logs every later callback gets, and the Trainer's history, carry the step's values.
    step_logs = [log for log in rec.logs if "loss" in log]
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert len(step_logs) == len(history) == UPDATES
    for log, h, r in zip(step_logs, history, rec.reports):
        for d in (log, h):
            assert d["gac/regime"] == gac.REGIMES.index(r.regime)
            assert d["gac/grad_norm"] == r.grad_norm and d["gac/alpha"] == r.alpha
            assert d["gac/skipped"] == 0 and d["gac/skip_fraction"] == 0.0 and d["gac/skipped_total"] == 0
            assert not [k for k in d if k in POLICY_KEYS]  # no RL loss, no policy-health signal (not even zeros)
            if r.cosine is None:
                assert "gac/cosine" not in d and "gac/cosine_max" not in d
            else:
                assert d["gac/cosine"] == r.cosine and d["gac/cosine_max"] == abs(r.cosine)
    assert "gac/regime" not in trainer.state.log_history[-1]  # the run's summary: no new step
    assert not hasattr(trainer.optimizer.step, "__gac_attachment__")  # detached when training ended


def test_a_skipped_update_moves_nothing_and_holds_the_schedule(tmp_path: Any) -> None:
    rec = Recorder()
    trainer = make_trainer(tmp_path, rec)
    callback = GacCallback(control=True, c_low=1e-9, c_high=2e-9).install(trainer)
    rec.att = callback.attachment
    trainer.train()
    att = callback.attachment
    assert att.reports == UPDATES and att.skipped == UPDATES - 1  # every update after the first
    assert rec.moved == [True] + [False] * (UPDATES - 1)
    assert rec.lr_steps == [rec.lr_steps[0]] * UPDATES  # the schedule stepped once, after the first update
    skipped = [log["gac/skipped"] for log in rec.logs if "loss" in log]
    assert skipped == [0.0] + [1.0] * (UPDATES - 1)
    assert [log["gac/skipped_total"] for log in rec.logs if "loss" in log] == [float(k) for k in range(UPDATES)]


def test_given_in_callbacks_it_works_and_warns_about_the_order(tmp_path: Any,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder()
    callback = GacCallback()
    trainer = make_trainer(tmp_path, rec, callbacks=[callback])
    rec.att = callback.attachment
    trainer.train()
    assert callback.attachment.reports == UPDATES
    with caplog.at_level(logging.WARNING, logger="gac"):
        callback.on_log(SimpleNamespace(report_to=["wandb"]), trainer.state, trainer.control, logs={})
        callback.on_log(SimpleNamespace(report_to=["wandb"]), trainer.state, trainer.control, logs={})
    assert len(caplog.records) == 1 and "install(trainer)" in caplog.text


@pytest.mark.parametrize("kwargs, error, match", [
    ({"address": 7070}, TypeError, "address must be a str"),
    ({"address": "127.0.0.1:7070"}, ValueError, "address= needs run="),
    ({"run": "r"}, ValueError, "run= needs address="),
    ({"scalars": 3}, TypeError, "scalars must be a function"),
    ({"address": "127.0.0.1:7070", "run": "r", "telemetry": object()}, ValueError, "not both"),
    ({"all_ranks": 1}, TypeError, "all_ranks must be a bool"),
    ({"mode": "remote"}, ValueError, "mode='remote' needs address="),
    ({"control": "yes"}, TypeError, "control must be a bool"),
    ({"warmup": 3}, ValueError, "at least 21 steps"),
    ({"c_low": 2.0}, ValueError, "c_low"),
    ({"address": "127.0.0.1:7070", "run": "bad run id!"}, ValueError, "run"),
    ({"address": "", "run": "r"}, ValueError, "address must be host:port"),
    ({"mode": "remote", "address": "127.0.0.1:7070", "run": "r", "deadline": -1.0}, ValueError, "deadline"),
])
def test_bad_arguments(kwargs: Dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        GacCallback(**kwargs)


def test_install_refuses_what_it_cannot_take(tmp_path: Any) -> None:
    rec = Recorder()
    trainer = make_trainer(tmp_path, rec)
    before = list(trainer.callback_handler.callbacks)
    with pytest.raises(TypeError, match="install needs a transformers Trainer"):
        GacCallback().install(object())
    first = GacCallback().install(trainer)
    with pytest.raises(ValueError, match="already has a GacCallback"):
        GacCallback().install(trainer)
    with pytest.raises(ValueError, match="already has a GacCallback"):
        gac.attach(trainer, control=True)
    assert trainer.callback_handler.callbacks == [first] + before
    assert first.install(trainer) is first and trainer.callback_handler.callbacks == [first] + before
