"""TRL's GRPOTrainer for real with GacCallback in remote mode against a real
gacd: a tiny Qwen2 from a config, a tokenizer built here, a rule-based
reward, 8 steps on the CPU. gacd decides with the run's thresholds; every
step is stored once; the stored c_t and |g| equal an independent fp64
recomputation from the gradients the optimizer was handed (captured here),
and the stored regime is what those thresholds give for it; a skipped step
leaves every weight and the AdamW state unchanged; the Trainer's logs of
each step ride along as scalars."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch

import gac
from conftest import Gacd
from tiny_grpo import make_grpo_trainer

transformers = pytest.importorskip("transformers")
from gac.integrations.transformers import GacCallback  # noqa: E402

STEPS = 8
# The tiny model's |c_t| are a few hundredths: these thresholds make gacd
# skip some steps and project or pass others.
C_LOW, C_HIGH = 0.01, 0.03


class Recorder(transformers.TrainerCallback):  # type: ignore[misc]
    """The gradients the optimizer is handed (before GAC: the raw ones), and what its step changed."""

    def __init__(self) -> None:
        self.grads: List[List[torch.Tensor]] = []
        self.moved: List[int] = []
        self.adam_steps: List[bool] = []
        self._before: List[torch.Tensor] = []
        self._state: Dict[int, float] = {}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                              optimizer: Any = None, **kw: Any) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        self.grads.append([p.grad.detach().double().clone() for p in params])
        self._before = [p.detach().clone() for p in params]
        self._state = {id(p): float(s["step"]) for p, s in optimizer.state.items()}

    def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                          **kw: Any) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        self.moved.append(sum(int(not torch.equal(b, p)) for b, p in zip(self._before, params)))
        self.adam_steps.append({id(p): float(s["step"]) for p, s in optimizer.state.items()} != self._state)


def by_step(records: List[Dict[str, Any]]) -> Dict[int, Dict[str, Any]]:
    steps: Dict[int, Dict[str, Any]] = {}
    for r in records:
        step = int(r.get("step", 0))
        assert step not in steps, f"step {step} stored twice"
        steps[step] = r
    return steps


def test_grpo_trainer_with_gacd_deciding(gacd: Gacd, tmp_path: Path) -> None:
    run = "grpo-remote"
    gac.RemoteController(gacd.address, run).set_thresholds(C_LOW, C_HIGH, reason="test", mode="remote")
    rec = Recorder()
    trainer = make_grpo_trainer(str(tmp_path / "out"), STEPS, [rec])
    callback = GacCallback(mode="remote", address=gacd.address, run=run, deadline=5.0,
                           spool_dir=tmp_path / "spool").install(trainer)
    trainer.train()
    att = callback.attachment
    assert callback.telemetry is not None and callback.telemetry.counters.records_acknowledged == STEPS
    callback.close()
    assert att.reports == STEPS and att.agent.mode == "remote" and att.agent.fallbacks == 0
    stored = by_step(gacd.steps(run))
    assert sorted(stored) == list(range(1, STEPS + 1))
    losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    controller = gac.Controller(C_LOW, C_HIGH)
    prev: Optional[List[torch.Tensor]] = None
    regimes = []
    for step in range(1, STEPS + 1):
        r, g = stored[step], rec.grads[step - 1]
        assert r["mode"] == "CONTROL_MODE_REMOTE" and not r.get("fallback", False)
        gg = sum(float((a * a).sum()) for a in g)
        assert float(r["grad_norm"]) == pytest.approx(math.sqrt(gg), rel=1e-6)
        regime = str(r["regime"]).removeprefix("REGIME_").lower()
        if prev is None:
            assert "cosine" not in r and regime == "safe"
        else:
            dot = sum(float((a * b).sum()) for a, b in zip(g, prev))
            pp = sum(float((b * b).sum()) for b in prev)
            assert float(r["cosine"]) == pytest.approx(dot / math.sqrt(gg * pp), rel=1e-5, abs=1e-7)
            assert regime == controller.decide(dot, gg, pp).regime
        # A skip changes no weight and no optimizer state; any other step moves the weights.
        assert (rec.moved[step - 1] == 0) == (regime == "skip")
        assert rec.adam_steps[step - 1] == (regime != "skip")
        assert r["scalars"]["loss"] == pytest.approx(losses[step], rel=1e-6)
        assert 0.0 <= r["scalars"].get("gac/skip_fraction", 0.0) <= 1.0
        regimes.append(regime)
        prev = g
    assert "skip" in regimes and ({"safe", "project"} & set(regimes[1:])), regimes
    assert att.skipped == regimes.count("skip")
