"""gac.attach inside a real trainer: TRL's GRPOTrainer (PyPI) on a tiny
Qwen2 model on the CPU, nothing from the hub, and on a plain optimizer.

Checked: attached with thresholds that never intervene, training is
bit-for-bit the run without gac; the cosine of every step against an fp64
reference computed from the gradients the trainer hands its optimizer; a
skipped step leaves every weight, the optimizer's state and the learning
rate schedule where they were."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

import gac
from tiny_grpo import make_grpo_trainer


def test_plain_optimizer_skip_keeps_weights_and_state() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # |c_t| above 1e-9 skips: every step after the first (which has no
    # previous gradient) is skipped.
    att = gac.attach(opt, control=True, c_low=1e-9, c_high=2e-9)
    x = torch.randn(16, 8)
    for step in range(1, 4):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        before = [p.detach().clone() for p in model.parameters()]
        state_before = {k: v["step"].clone() for k, v in opt.state.items()} if opt.state else {}
        opt.step()
        changed = [not torch.equal(b, p) for b, p in zip(before, model.parameters())]
        if step == 1:
            assert att.last_report.step_optimizer and all(changed)
        else:
            assert not att.last_report.step_optimizer and not any(changed)
            assert {k: v["step"] for k, v in opt.state.items()} == state_before
    assert att.reports == 3 and att.skipped == 2
    att.detach()
    assert "step" not in vars(opt)


def _tiny_grpo(rec: Optional["_Recorder"], steps: int, attach_opts: Optional[Dict[str, Any]] = None,
               out: str = "/tmp") -> Tuple[Any, Optional[gac.Attachment]]:
    trainer = make_grpo_trainer(out, steps, [rec.callback()] if rec is not None else [])
    att = gac.attach(trainer, **attach_opts) if attach_opts is not None else None
    if rec is not None:
        rec.att = att
    trainer.train()
    return trainer, att


class _Recorder:
    """Gradients as the trainer hands them to its optimizer, the reports
    gac made of them, the weights and the schedule after each step."""

    def __init__(self) -> None:
        self.att: Optional[gac.Attachment] = None
        self.grads: List[List[torch.Tensor]] = []
        self.reports: List[Any] = []
        self.changed: List[int] = []
        self.lr_steps: List[int] = []
        self._before: List[torch.Tensor] = []

    def callback(self) -> Any:
        from transformers import TrainerCallback
        rec = self

        class Cb(TrainerCallback):  # type: ignore[misc]
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                                      **kw: Any) -> None:
                params = [p for p in model.parameters() if p.requires_grad]
                rec.grads.append([p.grad.detach().double().clone() for p in params])
                rec._before = [p.detach().clone() for p in params]

            def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                                  **kw: Any) -> None:
                params = [p for p in model.parameters() if p.requires_grad]
                rec.changed.append(sum(int(not torch.equal(b, p)) for b, p in zip(rec._before, params)))
                if rec.att is not None:
                    rec.reports.append(rec.att.last_report)

            def on_step_end(self, args: Any, state: Any, control: Any, lr_scheduler: Any = None,
                            **kw: Any) -> None:
                rec.lr_steps.append(lr_scheduler.scheduler._step_count if hasattr(lr_scheduler, "scheduler")
                                    else lr_scheduler._step_count)

        return Cb()


def test_grpo_trainer_attached_without_intervening_is_the_same_run(tmp_path: Any) -> None:
    plain, _ = _tiny_grpo(None, steps=4, out=str(tmp_path / "a"))
    attached, att = _tiny_grpo(None, steps=4, attach_opts={"control": True, "c_low": 0.999999, "c_high": 1.0},
                                 out=str(tmp_path / "b"))
    assert att is not None and att.reports == 4 and att.skipped == 0
    for (name, a), b in zip(plain.model.named_parameters(), attached.model.parameters()):
        assert torch.equal(a, b), name


def test_grpo_trainer_cosines_against_fp64(tmp_path: Any) -> None:
    # Thresholds above any |c|: the agent only measures, so each step's
    # reference is the previous step's gradient as the trainer gave it.
    rec = _Recorder()
    _, att = _tiny_grpo(rec, steps=5, attach_opts={"control": True, "c_low": 0.999999, "c_high": 1.0},
                        out=str(tmp_path / "c"))
    assert att is not None and att.reports == 5 and len(rec.grads) == 5 and len(rec.reports) == 5
    prev: Optional[List[torch.Tensor]] = None
    checked = 0
    for g, report in zip(rec.grads, rec.reports):
        gg = sum(float((a * a).sum()) for a in g)
        assert report.grad_norm == pytest.approx(math.sqrt(gg), rel=1e-5)
        if prev is not None and gg > 0:
            dot = sum(float((a * b).sum()) for a, b in zip(g, prev))
            pp = sum(float((b * b).sum()) for b in prev)
            assert report.cosine == pytest.approx(dot / math.sqrt(gg * pp), rel=1e-5, abs=1e-6)
            checked += 1
        prev = g
    assert checked >= 3


def test_grpo_trainer_skip_keeps_weights_and_the_schedule(tmp_path: Any) -> None:
    rec = _Recorder()
    _, att = _tiny_grpo(rec, steps=4, attach_opts={"control": True, "c_low": 1e-9, "c_high": 2e-9},
                        out=str(tmp_path / "d"))
    assert att is not None and att.reports == 4
    # The first step has no previous gradient and is taken; every later one
    # with a nonzero gradient is skipped: no weight moves, and the schedule
    # stays where it was.
    assert rec.changed[0] > 0
    skipped_steps = [i for i in range(1, 4) if rec.changed[i] == 0]
    assert len(skipped_steps) == att.skipped and att.skipped >= 2
    for i in skipped_steps:
        assert rec.lr_steps[i] == rec.lr_steps[i - 1]
