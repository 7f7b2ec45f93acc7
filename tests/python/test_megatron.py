"""gac.integrations.megatron against megatron-core 0.19.2's own classes, on
Gloo groups of 4 CPU processes (megatron_worker.py; megatron_model.py has
the model and its layouts; megatron_cpu.py answers the few calls of
Megatron's DDP and optimizers that name the GPU). scripts/trainers_check.sh
installs megatron-core into .venv-trainers and runs this file there;
without it each test skips, naming what is missing.

What runs is Megatron's: parallel_state with tensor, pipeline, expert and
data parallelism, its layers and experts, DistributedDataParallel,
finalize_model_grads (the data-parallel reduction, the tied embedding's
all-reduce), get_megatron_optimizer (FP32Optimizer, Float16OptimizerWith-
Float16Params, DistributedOptimizer, a ChainedOptimizer of the dense and the
expert ones) and its step(). Per update, every rank's c_t, ‖g‖, ‖p‖ and
regime equal fp64 over the full model's gradient (reassembled from the
ranks' parts, each value once; every copy of a value checked equal), and
for fp32 parameters, that gradient equals an fp64 forward and backward of
the full model from the ranks' weights; Megatron's own gradient norm
equals GAC's; in local mode the gradient the inner optimizer steps with is
the fp64 projection, and a skip is Megatron's unsuccessful update (step()
returns update_successful False, or True with skip_reported="successful";
weights and optimizer state unchanged). Layouts the plug-in cannot count
(generalized tensor parallelism; a tied copy no embedding group pairs with
the first stage) raise at attach on every rank. A stand-in of Megatron's
optimizer interface checks the gating itself without megatron-core.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from conftest import run_ranks
from gac_reference import ReferenceGac
from megatron_model import LAYOUTS, SHAPES, STEPS, join, local_name, names, reference_gradients
from test_trainers_pypi import trainer_module

C_LOW, C_HIGH = 0.2, 0.6
WORLD = 4


def run(tmp_path: Path, layout: str, mode: str, **options: Any) -> List[Dict[str, Any]]:
    trainer_module("megatron.core")
    return run_ranks(tmp_path, WORLD, "megatron_worker.py",
                     [layout, mode, json.dumps({"c_low": C_LOW, "c_high": C_HIGH, **options})],
                     env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})


def whole(ranks: List[Dict[str, Any]], step: int, key: str) -> Dict[str, torch.Tensor]:
    """The full model's tensors (key: weights, handed, stepped) at an update, from
    the ranks' parts; every copy of a value (data-parallel replicas, the
    tensor-parallel ranks' duplicates, the tied embedding's two copies) equal."""
    parts: Dict[str, Dict[int, torch.Tensor]] = {}
    for out in ranks:
        for local, t in out["steps"][step - 1][key].items():
            name = local_name(local, out["ep_rank"], 2)
            assert name is not None, local
            k = out["tp_rank"] if SHAPES[name][1] is not None else 0
            held = parts.setdefault(name, {})
            if k in held:
                assert torch.equal(held[k], t), (key, step, name, "copies differ")
            else:
                held[k] = t
    return {n: join([p[k] for k in sorted(p)], n) for n, p in parts.items()}


def close(got: float, want: float, rel: float = 1e-6) -> bool:
    return abs(got - want) <= rel * max(abs(want), 1e-12)


def near(got: torch.Tensor, want: torch.Tensor, rel: float, what: str) -> None:
    """Every element within rel of the tensor's largest (fp32 sums against fp64 ones)."""
    error = float((got.double() - want).abs().max())
    assert error <= rel * float(want.abs().max()), (what, error, float(want.abs().max()))


@pytest.mark.parametrize("layout, mode, skip_reported", [
    ("tp_pp", "local", "unsuccessful"), ("tp_dp_ep", "local", "unsuccessful"), ("tp_dp_ep", "monitor", "unsuccessful"),
    ("tp_dp_ep_distopt", "local", "unsuccessful"), ("dp_pp_distopt", "local", "successful"),
    ("tp_pp_bf16", "local", "unsuccessful")])
def test_every_rank_matches_fp64_over_the_full_model(tmp_path: Path, layout: str, mode: str,
                                                     skip_reported: str) -> None:
    ranks = run(tmp_path, layout, mode, skip_reported=skip_reported)
    spec = LAYOUTS[layout]
    ref = ReferenceGac(C_LOW, C_HIGH, mode=mode)
    recomputed = ReferenceGac(C_LOW, C_HIGH, mode=mode)
    regimes = []
    for out in ranks:
        assert out["error"] is None, out["error"]
    for step in range(1, STEPS + 1):
        handed = whole(ranks, step, "handed")
        assert sorted(handed) == sorted(names(spec))
        e = ref.step([handed[n].double() for n in names(spec)])
        regimes.append(e.regime)
        weights = whole(ranks, step, "weights")
        if not spec.bf16:
            # Megatron's layout is the model's: the gradient the optimizer is handed is the full model's.
            full = reference_gradients(spec, weights, step)
            for n in names(spec):
                near(handed[n], full[n], 1e-5, f"{n} step {step}")
            f = recomputed.step([full[n] for n in names(spec)])
            assert f.regime == e.regime
        for rank, out in enumerate(ranks):
            s = out["steps"][step - 1]
            r = s["report"]
            where = f"{layout} {mode} rank {rank} step {step}"
            assert r["regime"] == e.regime, where
            assert close(r["grad_norm"], math.sqrt(e.gg)), (where, r["grad_norm"], math.sqrt(e.gg))
            # Megatron's own norm of the gradients it hands the inner optimizer (fp32 sums).
            assert close(s["megatron_grad_norm"], r["grad_norm"], 1e-5), (where, s["megatron_grad_norm"])
            if e.cosine is None:
                assert r["cosine"] is None, where
            else:
                assert abs(r["cosine"] - e.cosine) <= 1e-6, (where, r["cosine"], e.cosine)
                assert close(r["ref_norm"], math.sqrt(e.pp)), where
                if not spec.bf16:
                    assert abs(r["cosine"] - f.cosine) <= 1e-6, (where, r["cosine"], f.cosine)
            # A skip is Megatron's unsuccessful update (or, skip_reported="successful", reported taken).
            taken = e.step_optimizer
            assert s["successful"] == (taken or skip_reported == "successful"), where
            assert s["state_unchanged"] == (not taken), where
        stepped = whole(ranks, step, "stepped")
        for n, want in zip(names(spec), e.grads):
            near(stepped[n], want, 1e-6, f"{n} step {step} after the step")
        if step < STEPS:
            after = whole(ranks, step + 1, "weights")
            moved = [not torch.equal(weights[n], after[n]) for n in names(spec)]
            assert any(moved) if e.step_optimizer else not any(moved), (layout, step)
    if mode == "local":
        assert {"safe", "project", "skip"} <= set(regimes), regimes
    counters = ranks[0]["counters"]
    assert counters["reports"] == STEPS and counters["skipped"] == (regimes.count("skip") if mode == "local" else 0)
    for out in ranks:
        assert out["counters"] == counters and out["attachment"].startswith("<gac.Attachment optimizer=StepWithReadyGrads")
        assert out["detached"] == {"successful": True, "reports": STEPS}


@pytest.mark.parametrize("layout, options, message", [
    # Megatron's generalized tensor parallelism (weights rematerialised over a group of 2)
    ("dp_pp_distopt", {"gtp_remat_size": 2}, "NotImplementedError: gac.integrations.megatron: generalized tensor"),
    # An embedding group of the first stage only: the last stage's tied copy, which Megatron's
    # norm leaves to the first stage, has no rank in a group with it to count it.
    ("tp_pp", {"first_stage_embedding_group": True}, "is marked shared"),
])
def test_layouts_the_plugin_cannot_count_raise_on_every_rank_at_attach(tmp_path: Path, layout: str,
                                                                      options: Dict[str, Any], message: str) -> None:
    ranks = run(tmp_path, layout, "local", **options)
    errors = [out["error"] for out in ranks]
    assert all(e is not None for e in errors) and any(message in e for e in errors), errors
    assert all(message in e or "another rank cannot count its parameters" in e for e in errors), errors
    assert all(out["steps"] == [] for out in ranks)


class FP32Optimizer:
    """A stand-in of Megatron's interface (the class name is what the plug-in recognises):
    step() as ChainedOptimizer.step ends, update_successful from step_with_ready_grads."""

    def __init__(self, params: List[torch.nn.Parameter]) -> None:
        self.optimizer = torch.optim.SGD(params, lr=0.1)
        self.inner_steps = 0

    def get_parameters(self) -> List[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def step_with_ready_grads(self) -> bool:
        self.optimizer.step()
        self.inner_steps += 1
        return True

    def step(self) -> Any:
        return self.step_with_ready_grads(), 1.0, None


@pytest.mark.parametrize("skip_reported", ["unsuccessful", "successful"])
def test_a_skip_is_what_step_with_ready_grads_returns_and_detach_restores_megatrons(skip_reported: str) -> None:
    import gac
    from gac.integrations import megatron as gac_megatron

    p = torch.nn.Parameter(torch.zeros(3))
    opt = FP32Optimizer([p])
    # No process group (one process), no parallel_state: an empty group collection.
    att = gac_megatron.attach(opt, control=True, c_low=0.2, c_high=0.6, pg_collection=object(),
                              skip_reported=skip_reported)
    results = []
    for g in ([1.0, 0.0, 0.0], [1.0, 0.1, 0.0], [0.0, 1.0, 0.0]):
        p.grad = torch.tensor(g)
        results.append(opt.step()[0])
    assert [r.regime for r in [att.last_report]] == ["safe"] and att.skipped == 1
    assert results == [True, skip_reported == "successful", True] and opt.inner_steps == 2
    with pytest.raises(ValueError, match="already gated"):
        gac_megatron.attach(opt, pg_collection=object())
    att.detach()
    assert opt.step()[0] is True and att.reports == 3 and opt.inner_steps == 3
    with pytest.raises(TypeError, match="needs a Megatron-Core optimizer"):
        gac_megatron.attach(torch.optim.SGD([p], lr=0.1))
    with pytest.raises(ValueError, match="skip_reported"):
        gac_megatron.attach(opt, pg_collection=object(), skip_reported="maybe")  # type: ignore[arg-type]
    assert isinstance(att, gac.Attachment)
