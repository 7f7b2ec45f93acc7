"""GAC inside the trainers' own code from PyPI, on CPU (the pins:
tests/python/requirements-trainers.txt; scripts/trainers_check.sh installs
them into .venv-trainers and runs this file there). Without them each test
skips, naming what is missing.

verl 0.9.1: its Hydra config (verl/trainer/config/ppo_trainer.yaml) composed
with the override lines gac.integrations.verl documents, turned into its
FSDPOptimizerConfig by verl.utils.config.omega_conf_to_dataclass; the
optimizer and the LR scheduler made by its FSDP engine's _build_optimizer
(verl.workers.config.optimizer.build_optimizer) and _build_lr_scheduler; each
update made by the engine's optimizer_step (clip, then step) and
lr_scheduler_step. The engine runs without its __init__ (see CpuEngine).
Its policy loss "gac" (the plug-in registers it): verl's own ppo_loss with
its actor config (loss_mode=gac, gac_policy_loss naming vanilla, gspo, cispo
or sapo) gives the loss the named one gives, and each update of two
micro-batches of different lengths (plus a forward-only pass and a dropped
update's micro-batch, not counted) reports the policy-health signals of their union, against test_rl's
float64 reference with the bounds each loss clips with, written here.

torchtitan 0.3.0: an OptimizersContainer built from its Config for two model
parts (pipeline stages) and two kinds of optimizer (Adam for the biases, AdamW
for the rest: four inner optimizers), its LRSchedulersContainer, and each
update as its Trainer.train_step makes it (torchtitan.distributed.utils
.clip_grad_norm_, optimizers.step(), lr_schedulers.step()), gated by
gac.attach on the container.

Both are checked against the fp64 reference (gac_reference.ReferenceGac) fed
the gradients the optimizer is handed: the regime and c_t of every step, the
projected gradient the inner optimizers step with, weights and optimizer
state unchanged on a skip (the state through the trainer's own state_dict),
while the LR schedule advances. A repeated batch makes one update a skip.

What does not run here: verl's engine itself (FSDPEngine.__init__ and
initialize) needs torch.distributed initialised, a Hugging Face checkpoint on
disk and FSDP wrapping; its training loop needs Ray workers and vLLM or
SGLang. torchtitan's Trainer needs a model spec, a tokenizer and a dataset.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any, Dict, Final, List, Sequence, Tuple

import pytest
import torch

import gac
from gac_reference import ReferenceGac

C_LOW, C_HIGH = 0.2, 0.5
ALPHA: Final = "exact"


def trainer_module(name: str) -> Any:
    """`name` imported, or the test skipped saying what did not import. GAC_TRAINERS=required
    (scripts/trainers_check.sh) makes that a failure."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if os.environ.get("GAC_TRAINERS") == "required":
            raise
        pytest.skip(f"{name} does not import ({e}): scripts/trainers_check.sh installs "
                    "tests/python/requirements-trainers.txt into .venv-trainers and runs this file there")


def batch(step: int) -> Tuple[torch.Tensor, torch.Tensor]:
    # Update 6 repeats update 5's batch: its gradient points where the last one did (a skip).
    gen = torch.Generator().manual_seed(100 + (5 if step == 6 else step))
    return torch.randn(32, 8, generator=gen), torch.randn(32, 2, generator=gen)


def grads64(params: Sequence[torch.nn.Parameter]) -> List[torch.Tensor]:
    return [p.grad.detach().double().clone() for p in params]  # type: ignore[union-attr]


def check_step(report: Any, ref: Any, params: Sequence[torch.nn.Parameter], before: List[torch.Tensor]) -> None:
    """One update against the fp64 reference: regime, c_t, the gradient stepped with, the weights."""
    assert report.regime == ref.regime
    if ref.cosine is None:
        assert report.cosine is None
    else:
        assert report.cosine == pytest.approx(ref.cosine, rel=1e-5, abs=1e-7)
    for p, g in zip(params, ref.grads):
        torch.testing.assert_close(p.grad.double(), g, rtol=1e-5, atol=1e-7)  # type: ignore[union-attr]
    unchanged = [torch.equal(b, p) for b, p in zip(before, params)]
    assert all(unchanged) if ref.regime == "skip" else not any(unchanged)


def copied(state: Dict[Any, Any]) -> Dict[Any, Any]:
    """An optimizer state (nested dicts of tensors and numbers), copied: the optimizer updates its tensors in place."""
    return {k: copied(v) if isinstance(v, dict) else v.clone() if isinstance(v, torch.Tensor) else v
            for k, v in state.items()}


def same_state(a: Dict[Any, Any], b: Dict[Any, Any]) -> bool:
    return a.keys() == b.keys() and all(
        same_state(a[k], b[k]) if isinstance(a[k], dict) else
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


# ---------------------------------------------------------------- verl


def verl_actor_section(overrides: List[str], section: str) -> Any:
    """A section of the actor's config in verl's own ppo_trainer.yaml ("" for the whole actor),
    composed by Hydra with `overrides` (command-line syntax), as verl's dataclass."""
    verl = trainer_module("verl")
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    actor = cfg.actor_rollout_ref.actor
    return omega_conf_to_dataclass(actor[section] if section else actor)


def verl_optim_config(overrides: List[str]) -> Any:
    """The actor's optim section, as verl's FSDPOptimizerConfig."""
    trainer_module("verl")
    from verl.workers.config import FSDPOptimizerConfig

    optim = verl_actor_section(overrides, "optim")
    assert isinstance(optim, FSDPOptimizerConfig)
    return optim


def verl_engine(module: torch.nn.Module, optim: Any) -> Any:
    trainer_module("verl")
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    class CpuEngine(FSDPEngine):  # type: ignore[misc, unused-ignore]
        """verl's FSDP engine with a given module: its __init__ and initialize() need a process
        group, a Hugging Face checkpoint and FSDP; what optimizer_step reads is set here, and the
        optimizer and scheduler are made by the engine's own methods, as _build_model_optimizer does."""

        def __init__(self) -> None:
            self.module, self.optimizer_config, self.rank = module, optim, 0
            self.scaler, self._qat_enabled = None, False
            self.optimizer = self._build_optimizer(module)
            self.lr_scheduler = self._build_lr_scheduler(self.optimizer)

    return CpuEngine()


def small_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def test_verl_builds_gac_from_its_config_and_steps_it() -> None:
    optim = verl_optim_config([
        "actor_rollout_ref.actor.optim.optimizer_impl=gac.integrations.verl",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "+actor_rollout_ref.actor.optim.override_optimizer_config.gac_control=true",
        f"+actor_rollout_ref.actor.optim.override_optimizer_config.gac_c_low={C_LOW}",
        f"+actor_rollout_ref.actor.optim.override_optimizer_config.gac_c_high={C_HIGH}",
        f"+actor_rollout_ref.actor.optim.override_optimizer_config.gac_alpha_mode={ALPHA}",
        "+actor_rollout_ref.actor.optim.override_optimizer_config.eps=1e-6",
    ])
    assert optim.optimizer_impl == "gac.integrations.verl" and optim.clip_grad == 1.0
    model = small_model()
    engine = verl_engine(model, optim)
    opt = engine.optimizer
    assert type(opt).__module__ == "gac.integrations.verl" and isinstance(opt, torch.optim.AdamW)
    group = opt.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (0.01, 0.01, (0.9, 0.999), 1e-6)
    assert (opt.gac.agent.mode, opt.gac.agent.c_low, opt.gac.agent.c_high) == ("local", C_LOW, C_HIGH)
    params = list(model.parameters())
    ref = ReferenceGac(C_LOW, C_HIGH, ALPHA)
    expected: List[Any] = []
    gated_step = opt.step

    @functools.wraps(gated_step)  # the LR scheduler's mark on the step it wrapped, kept
    def handed(*args: Any, **kwargs: Any) -> Any:
        # What verl hands the optimizer (the gradient after its clipping) goes to the reference first.
        expected.append(ref.step(grads64(params)))
        return gated_step(*args, **kwargs)

    opt.step = handed
    regimes: List[str] = []
    for step in range(1, 11):
        engine.optimizer_zero_grad()
        x, y = batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        before = [p.detach().clone() for p in params]
        state = copied(opt.state_dict()["state"])
        grad_norm = engine.optimizer_step()
        lr = engine.lr_scheduler_step()
        r = opt.gac.last_report
        assert r.step == step == len(expected) and engine.lr_scheduler.last_epoch == step and lr == 0.01
        assert r.grad_norm == pytest.approx(min(grad_norm, optim.clip_grad), rel=1e-5)  # GAC saw it clipped
        check_step(r, expected[-1], params, before)
        if r.regime == "skip":
            assert same_state(opt.state_dict()["state"], state)
        regimes.append(r.regime)
    assert regimes[5] == "skip" and "project" in regimes and "safe" in regimes, regimes
    assert opt.gac.skipped == regimes.count("skip") and opt.gac.projected == regimes.count("project")


def test_verl_default_config_with_gac_only_observes() -> None:
    optim = verl_optim_config(["actor_rollout_ref.actor.optim.optimizer_impl=gac.integrations.verl",
                               "actor_rollout_ref.actor.optim.lr=0.01"])
    plain_optim = verl_optim_config(["actor_rollout_ref.actor.optim.lr=0.01"])
    assert plain_optim.optimizer_impl == "torch.optim"  # verl's default
    gac_model, plain_model = small_model(), small_model()
    gated, plain = verl_engine(gac_model, optim), verl_engine(plain_model, plain_optim)
    assert gated.optimizer.gac.agent.mode == "monitor" and type(plain.optimizer) is torch.optim.AdamW
    for step in range(1, 8):
        for engine, model in ((gated, gac_model), (plain, plain_model)):
            engine.optimizer_zero_grad()
            x, y = batch(step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            engine.optimizer_step()
            engine.lr_scheduler_step()
    assert gated.optimizer.gac.reports == 7
    for a, b in zip(gac_model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)  # bit for bit verl's own AdamW


def verl_micro_batch(model: torch.nn.Module, seed: int, rows: int, cols: int) -> Tuple[Any, Any, Dict[str, Any]]:
    """A micro-batch as verl's ppo_loss takes it (padded layout: prompts, right-padded responses,
    attention mask; the model's log-probs unpadded, one row per token of prompt and response) for a
    policy over two tokens (`model`'s two outputs), with old log-probs off the current ones; and the
    (B, T) tensors of it that the loss sees, for the reference."""
    trainer_module("verl")
    from verl.utils import tensordict_utils as tu

    gen = torch.Generator().manual_seed(seed)
    prompt = 2
    lengths = torch.randint(1, cols + 1, (rows,), generator=gen)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1)
    tokens = torch.randint(0, 2, (rows, cols), generator=gen)
    logp = torch.log_softmax(model(torch.randn(rows, cols, 8, generator=gen)), -1).gather(-1, tokens.unsqueeze(-1))
    logp = logp.squeeze(-1)
    old = logp.detach() + 0.4 * torch.randn(rows, cols, generator=gen)
    advantages = torch.randn(rows, 1, generator=gen).expand(rows, cols).contiguous()
    # Row i's log-probs sit at positions prompt - 1 ... prompt + length - 2 of its prompt + length tokens.
    values = torch.cat([torch.cat([logp.new_zeros(prompt - 1), logp[i, :n], logp.new_zeros(1)])
                        for i, n in enumerate(lengths.tolist())])
    data = tu.get_tensordict(
        {"prompts": torch.ones(rows, prompt, dtype=torch.long), "responses": tokens,
         "attention_mask": torch.cat([torch.ones(rows, prompt, dtype=torch.long), mask.long()], 1),
         "response_mask": mask.long(), "old_log_probs": old, "advantages": advantages},
        {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": rows})
    return {"log_probs": values}, data, {"logprobs": logp.detach(), "old": old, "mask": mask, "advantages": advantages}


POLICY_SIGNALS = ("ess_token", "ess_sequence", "clip_fraction_low", "clip_fraction_high", "truncation_fraction",
                  "log_ratio_max", "log_ratio_p99", "log_ratio_p1", "kl_k3", "log_ratio_abs_mean", "entropy_mean")


@pytest.mark.parametrize("loss, bounds", [
    ("vanilla", {"clip_low": 0.2, "clip_high": 0.28}),
    ("gspo", {"clip_low": 0.2, "clip_high": 0.28, "sequence_level": "mean"}),
    ("cispo", {"clip_low": 0.2, "clip_high": 0.28, "advantages": None}),
    ("sapo", {"clip_low": None, "clip_high": None}),
])
def test_verl_policy_loss_gac_records_the_updates_signals(loss: str, bounds: Dict[str, Any]) -> None:
    from test_rl import reference
    trainer_module("verl")
    from verl.workers.utils.losses import ppo_loss

    common = ["actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
              "actor_rollout_ref.actor.clip_ratio_high=0.28",
              "actor_rollout_ref.actor.optim.optimizer_impl=gac.integrations.verl"]
    # The two lines the plug-in's text gives.
    gac_loss = ["actor_rollout_ref.actor.policy_loss.loss_mode=gac",
                f"+actor_rollout_ref.actor.optim.override_optimizer_config.gac_policy_loss={loss}"]
    actor = verl_actor_section(common + gac_loss, "")
    plain = verl_actor_section(common + [f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}"], "")
    model = small_model()
    engine = verl_engine(model, actor.optim)
    for update in range(1, 4):
        # A micro-batch of an update verl dropped (a non-finite gradient: zero_grad, no step): not counted.
        output, data, _ = verl_micro_batch(model, 100 + update, 4, 3)
        ppo_loss(actor, output, data)
        engine.optimizer_zero_grad()
        seen = []
        for micro, cols in enumerate((5, 7)):  # two micro-batches of different lengths: one update
            output, data, tensors = verl_micro_batch(model, 10 * update + micro, 4, cols)
            with torch.no_grad():  # a forward-only pass (verl's infer_batch): not counted
                ppo_loss(actor, output, data)
            loss_value, metrics = ppo_loss(actor, output, data)
            want_value, want_metrics = ppo_loss(plain, output, data)  # "gac" is the loss it names, unchanged
            assert torch.equal(loss_value, want_value) and metrics.keys() == want_metrics.keys()
            loss_value.backward()
            seen.append(tensors)
        engine.optimizer_step()
        r = engine.optimizer.gac.last_report
        assert r.step == update
        cols = max(t["mask"].shape[1] for t in seen)
        union = {k: torch.cat([torch.nn.functional.pad(t[k], (0, cols - t[k].shape[1])) for t in seen])
                 for k in seen[0]}
        kwargs = {"advantages": union["advantages"], **bounds}
        want = reference(union["logprobs"], union["old"], union["mask"], **kwargs)
        assert r.policy_tokens == want["tokens"] == int(union["mask"].sum()) and not r.policy_invalid
        for name in POLICY_SIGNALS:
            got = getattr(r, name)
            assert got is None if name not in want else got == pytest.approx(want[name], rel=1e-6, abs=1e-12), name


# ---------------------------------------------------------------- torchtitan


def test_torchtitan_optimizers_container() -> None:
    trainer_module("torchtitan")
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, ParamGroupConfig
    from torchtitan.distributed import utils as dist_utils

    torch.manual_seed(0)
    parts = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh()), torch.nn.Linear(16, 2)]
    config = OptimizersContainer.Config(param_groups=[
        ParamGroupConfig(pattern=r"bias$", optimizer_name="Adam", optimizer_kwargs={"lr": 0.01}),
        ParamGroupConfig(pattern=r".*", optimizer_name="AdamW",
                         optimizer_kwargs={"lr": 0.01, "betas": (0.9, 0.95), "weight_decay": 0.1}),
    ])
    optimizers = config.build(model_parts=parts)
    assert isinstance(optimizers, OptimizersContainer)
    assert [type(o).__name__ for o in optimizers.optimizers] == ["Adam", "AdamW", "Adam", "AdamW"]
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers, training_steps=10)
    att = gac.attach(optimizers, control=True, c_low=C_LOW, c_high=C_HIGH, alpha_mode=ALPHA)
    params = [p for o in optimizers.optimizers for g in o.param_groups for p in g["params"]]
    assert len(params) == 4
    ref = ReferenceGac(C_LOW, C_HIGH, ALPHA)
    regimes: List[str] = []
    lrs: List[List[float]] = []
    for step in range(1, 11):
        optimizers.zero_grad()
        x, y = batch(step)
        torch.nn.functional.mse_loss(parts[1](parts[0](x)), y).backward()
        dist_utils.clip_grad_norm_([p for m in parts for p in m.parameters()], 1.0, foreach=True)
        expected = ref.step(grads64(params))
        before = [p.detach().clone() for p in params]
        state = copied(optimizers.state_dict())  # torchtitan's flat, name-keyed state of every inner optimizer
        optimizers.step()
        r = att.last_report
        assert r is not None and r.step == step and r.tensors == 4 and r.elements == sum(p.numel() for p in params)
        check_step(r, expected, params, before)
        if r.regime == "skip":
            assert same_state(optimizers.state_dict(), state)  # the moments, step counts and hyperparameters
        schedulers.step()
        assert all(s.last_epoch == step for s in schedulers.schedulers)
        lrs.append([s.get_last_lr()[0] for s in schedulers.schedulers])
        regimes.append(r.regime)
    assert regimes[5] == "skip" and "project" in regimes and "safe" in regimes, regimes
    # Warm-up (2 updates), 1 stable, then the linear decay of every inner optimizer's LR, the skipped update's too.
    assert all(lrs[4][k] > lrs[5][k] > lrs[6][k] for k in range(4)), lrs
    att.detach()
    assert "step" not in vars(optimizers)
