"""gac.attach on the wrappers trainers put around their optimizers:
accelerate's AcceleratedOptimizer under gradient accumulation (one GAC step
per real update, c_t from the accumulated gradient against an fp64
recomputation; a skip reported to accelerate as not taken), a container of
optimizers shaped like torchtitan's OptimizersContainer (one GAC step over
every inner optimizer's parameters, a skip skips all of them), a
GradScaler's overflow left to the scaler, and an LR scheduler made after
attaching."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, List, Optional

import pytest
import torch

import gac


def cosine64(g: List[torch.Tensor], p: List[torch.Tensor]) -> float:
    dot = sum(float((a * b).sum()) for a, b in zip(g, p))
    return dot / math.sqrt(sum(float((a * a).sum()) for a in g) * sum(float((b * b).sum()) for b in p))


def snapshot(params: List[torch.nn.Parameter]) -> List[torch.Tensor]:
    return [p.detach().clone() for p in params]


def same(a: List[torch.Tensor], params: List[torch.nn.Parameter]) -> bool:
    return all(torch.equal(x, p) for x, p in zip(a, params))


@pytest.fixture
def accelerate_state() -> Iterator[None]:
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_accelerated_optimizer_one_step_per_update_after_accumulation(accelerate_state: None) -> None:
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    accumulation, updates = 4, 5
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, opt = accelerator.prepare(model, opt)
    assert isinstance(opt, AcceleratedOptimizer)
    params = list(model.parameters())
    # |c| above 0.3 skips; every update is a GAC decision, none of the micro-steps is.
    att = gac.attach(opt, control=True, c_low=0.05, c_high=0.3)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(3, 6, generator=gen), torch.randn(3, 2, generator=gen))
               for _ in range(accumulation * updates)]
    seen: List[List[torch.Tensor]] = []
    expected: List[List[torch.Tensor]] = []
    reports: List[Any] = []
    for i, (x, y) in enumerate(batches):
        if i % accumulation == 0:
            # The accumulated gradient, in fp64, from the weights this update starts from.
            ref = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()
            ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
            for xb, yb in batches[i:i + accumulation]:
                (torch.nn.functional.mse_loss(ref(xb.double()), yb.double()) / accumulation).backward()
            expected.append([p.grad.clone() for p in ref.parameters()])  # type: ignore[union-attr]
            before = snapshot(params)
            state_steps = {id(p): float(s["step"]) for p, s in opt.optimizer.state.items()}
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            if accelerator.sync_gradients:
                seen.append([p.grad.detach().double().clone() for p in params])  # type: ignore[union-attr]
            opt.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            r = att.last_report
            reports.append(r)
            assert r.step == len(reports)
            assert opt.step_was_skipped == (not r.step_optimizer)
            assert same(before, params) == (not r.step_optimizer)
            if not r.step_optimizer:
                assert {id(p): float(s["step"]) for p, s in opt.optimizer.state.items()} == state_steps
    assert att.reports == updates == len(seen)
    for k in range(updates):
        for a, b in zip(seen[k], expected[k]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)  # the gradient GAC saw is the accumulated one
        assert reports[k].grad_norm == pytest.approx(math.sqrt(sum(float((g * g).sum()) for g in expected[k])),
                                                     rel=1e-5)
        if k > 0:
            assert reports[k].cosine == pytest.approx(cosine64(expected[k], expected[k - 1]), rel=1e-5, abs=1e-7)
    assert {r.regime for r in reports[1:]} & {"project", "skip"}, [r.cosine for r in reports]


class Container(torch.optim.Optimizer):
    """torchtitan's OptimizersContainer in miniature (components/optimizer/optimizer.py, 0.2.2): a
    torch Optimizer over every parameter whose step() steps each optimizer of `optimizers` in turn."""

    def __init__(self, optimizers: List[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers
        all_params = [p for o in optimizers for g in o.param_groups for p in g["params"]]
        torch.optim.Optimizer.__init__(self, all_params, {})

    def step(self, closure: Optional[Callable[[], float]] = None) -> None:  # type: ignore[override]
        assert closure is None
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)


class PlainContainer:
    """An optimizer container that is no torch Optimizer: only `optimizers` and step()."""

    def __init__(self, optimizers: List[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    def step(self) -> None:
        for o in self.optimizers:
            o.step()


@pytest.mark.parametrize("kind", [Container, PlainContainer])
def test_a_container_of_optimizers_is_one_step(kind: Any) -> None:
    torch.manual_seed(0)
    parts = [torch.nn.Linear(5, 4), torch.nn.Linear(4, 3)]  # two model parts (pipeline stages)
    weights = [p for m in parts for p in m.parameters() if p.dim() == 2]
    biases = [p for m in parts for p in m.parameters() if p.dim() == 1]
    inner: List[torch.optim.Optimizer] = [torch.optim.AdamW(weights, lr=0.1), torch.optim.SGD(biases, lr=0.1)]
    container = kind(inner)
    hook_calls = []
    if kind is Container:
        container.register_step_pre_hook(lambda *a: hook_calls.append(1))  # as torchtitan's MoE balancing hook
    params = weights + biases
    att = gac.attach(container, control=True, c_low=0.05, c_high=0.3)
    gen = torch.Generator().manual_seed(3)
    prev: Optional[List[torch.Tensor]] = None
    regimes = []
    for step in range(1, 9):
        x = torch.randn(8, 5, generator=gen)
        for p in params:
            p.grad = None
        parts[1](parts[0](x)).pow(2).mean().backward()
        g = [p.grad.detach().double().clone() for p in params]  # type: ignore[union-attr]
        before = snapshot(params)
        adam_steps = {id(p): float(s["step"]) for p, s in inner[0].state.items()}
        container.step()
        r = att.last_report
        assert r.step == step and r.tensors == len(params) == 4
        assert r.elements == sum(p.numel() for p in params)
        if prev is not None:
            assert r.cosine == pytest.approx(cosine64(g, prev), rel=1e-5, abs=1e-7)
        if r.step_optimizer:
            assert not any(torch.equal(b, p) for b, p in zip(before, params))  # every inner optimizer stepped
        else:
            assert same(before, params)  # none did
            assert {id(p): float(s["step"]) for p, s in inner[0].state.items()} == adam_steps
        regimes.append(r.regime)
        prev = g
    assert "skip" in regimes and "safe" in regimes
    if kind is Container:
        assert len(hook_calls) == regimes.count("safe") + regimes.count("project")
    att.detach()
    assert "step" not in vars(container)


class ScaledOptimizer:
    """accelerate's AcceleratedOptimizer with a GradScaler, in miniature: step() is the scaler's."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: Any) -> None:
        self.optimizer, self.scaler, self._is_overflow = optimizer, scaler, False

    @property
    def param_groups(self) -> List[Any]:
        return self.optimizer.param_groups

    def step(self) -> None:
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._is_overflow = self.scaler.get_scale() < scale


def test_an_overflow_is_left_to_the_grad_scaler() -> None:
    p = torch.nn.Parameter(torch.ones(4))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # as scaler.scale(loss) before backward: the scale exists
    opt = ScaledOptimizer(torch.optim.SGD([p], lr=0.1), scaler)
    att = gac.attach(opt, control=True)
    p.grad = torch.full((4,), 1024.0)
    opt.step()
    assert att.last_report.regime == "safe" and not torch.equal(p, torch.ones(4))
    before = p.detach().clone()
    p.grad = torch.tensor([1.0, float("inf"), 0.0, 0.0])
    opt.step()
    # GAC says invalid; the scaler sees the same overflow, skips the update and lowers its scale.
    assert att.last_report.regime == "invalid" and not att.last_report.step_optimizer
    assert torch.equal(p, before) and scaler.get_scale() == 512.0 and opt._is_overflow
    assert att.skipped == 0 and att.skip_fraction == 0.0  # the scaler's skip, not GAC's
    # Without a scaler an invalid step is GAC's skip.
    q = torch.nn.Parameter(torch.ones(4))
    plain = torch.optim.SGD([q], lr=0.1)
    att2 = gac.attach(plain, control=True)
    q.grad = torch.tensor([1.0, float("nan"), 0.0, 0.0])
    plain.step()
    assert att2.last_report.regime == "invalid" and att2.skipped == 1 and torch.equal(q, torch.ones(4))


def test_an_lr_scheduler_made_after_attaching() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    att = gac.attach(opt, control=True, c_low=1e-9, c_high=2e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)  # wraps opt.step again
    x = torch.randn(5, 4)
    for step in range(1, 4):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        before = snapshot(list(model.parameters()))
        opt.step()
        sched.step()
        assert same(before, list(model.parameters())) == (step > 1)
        # The scheduler advances on a skip too (the docs say so): the LR halves every step.
        assert opt.param_groups[0]["lr"] == 0.5 ** step
    assert att.reports == 3 and att.skipped == 2
    att.detach()
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    before = snapshot(list(model.parameters()))
    opt.step()  # the scheduler's wrapper stays; gac's inside it only passes the call on
    assert att.reports == 3 and not same(before, list(model.parameters()))
