"""gac.Agent against the fp64 reference of gac_reference.py: decisions,
cosines and projected gradients on mixed dtypes, zero-size and
non-contiguous tensors, parameters without gradients, zero and non-finite
gradients, both alpha modes, both reference policies and both snapshot
dtypes; and what the binding promises: no copies, the GIL released during a
step, parameter lists converted once, nothing modified on error."""

from __future__ import annotations

import datetime
import math
import threading
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch
import torch.distributed as dist

import gac
from gac_reference import ReferenceGac, subnormal_spacing, ulp_tolerance

# Target cosines of consecutive raw gradients, chosen away from the
# thresholds (0.05, 0.3) so that rounding cannot flip a regime: safe,
# project, skip, negative project, safe...
RHOS = [0.0, 0.01, 0.15, 0.6, -0.2, 0.12, 0.95, 0.0, 0.25, -0.1, 0.08]
# For the windowed trigger (window 3, thresholds 0.1 and 0.4 of the mean):
# noise of alternating sign, a persistent alignment, a strong one, a
# negative one, noise again.
WINDOW_RHOS = [0.0, 0.35, -0.35, 0.35, -0.35, 0.35, 0.25, 0.25, 0.25, 0.25, 0.6, 0.6, 0.6, 0.6, -0.2, -0.2, -0.2,
               -0.2, 0.02, -0.02, 0.02]
WINDOW = {"trigger": "window", "window": 3, "window_c_low": 0.1, "window_c_high": 0.4}


class Model:
    """Parameters of mixed dtypes and layouts, and correlated raw gradients.

    Each parameter's gradient is drawn in float64 as g_t = rho g_{t-1} +
    sqrt(1 - rho^2) n (so cos(g_t, g_{t-1}) is about rho), rounded to the
    parameter's dtype, and handed to autograd's .grad in the parameter's
    layout: contiguous, transposed (dense, another layout) or strided (a
    view of every other element, which takes the agent's slow path)."""

    # (shape, dtype, layout)
    SPECS = [
        ((64, 48), torch.float32, "contiguous"),
        ((3000,), torch.bfloat16, "contiguous"),
        ((40, 30), torch.float16, "transposed"),
        ((0,), torch.float32, "contiguous"),
        ((2500,), torch.float32, "strided"),
        ((7, 0, 3), torch.bfloat16, "contiguous"),
        ((128, 33), torch.bfloat16, "transposed"),
        ((1000,), torch.float16, "strided"),
        ((70000,), torch.float32, "contiguous"),  # more than one chunk
        ((500,), torch.float32, "contiguous"),    # no gradient on some steps
        ((300,), torch.float16, "contiguous"),    # a zero gradient on some steps
    ]
    NO_GRAD = 9
    ZERO_GRAD = 10

    def __init__(self, seed: int = 0, device: str = "cpu") -> None:
        self.gen = torch.Generator().manual_seed(seed)  # values are drawn on the CPU, then moved
        self.device = torch.device(device)
        self.params = [torch.nn.Parameter(torch.zeros(shape, dtype=dtype, device=self.device))
                       for shape, dtype, _ in self.SPECS]
        self.raw: List[torch.Tensor] = [torch.randn(s, dtype=torch.float64, generator=self.gen) for s, _, _ in self.SPECS]

    def next_gradients(self, rho: float, step: int, poison: bool = False) -> List[Optional[torch.Tensor]]:
        """Sets every .grad and returns what the reference sees (float64 of
        the rounded values; None for a parameter without a gradient)."""
        seen: List[Optional[torch.Tensor]] = []
        for i, ((shape, dtype, layout), p) in enumerate(zip(self.SPECS, self.params)):
            noise = torch.randn(shape, dtype=torch.float64, generator=self.gen)
            self.raw[i] = rho * self.raw[i] + math.sqrt(1.0 - rho * rho) * noise
            g = self.raw[i].to(dtype)
            if i == self.ZERO_GRAD and step % 3 == 0:
                g = torch.zeros_like(g)
            if poison and i == 1:
                g = g.clone()
                g.view(-1)[17] = float("nan")
            if i == self.NO_GRAD and step in (1, 2, 5):
                p.grad = None
                seen.append(None)
                continue
            p.grad = self._in_layout(g, layout, self.device)
            seen.append(g.to(torch.float64))
        return seen

    @staticmethod
    def _in_layout(g: torch.Tensor, layout: str, device: torch.device) -> torch.Tensor:
        if layout == "transposed":
            t = torch.empty(tuple(reversed(g.shape)), dtype=g.dtype, device=device).t()
        elif layout == "strided":
            t = torch.empty((g.numel() * 2,), dtype=g.dtype, device=device)[::2].view(g.shape)
        else:
            t = torch.empty(g.shape, dtype=g.dtype, device=device)
        t.copy_(g)
        assert t.is_contiguous() == (layout == "contiguous")
        return t


def assert_close_rel(actual: Optional[float], expected: Optional[float], rel: float = 1e-6, what: str = "",
                     floor: float = 1e-12) -> None:
    """|actual - expected| <= rel * max(|expected|, floor); both None or neither."""
    if expected is None:
        assert actual is None, f"{what}: expected None, got {actual}"
        return
    assert actual is not None, f"{what}: expected {expected}, got None"
    assert abs(actual - expected) <= rel * max(abs(expected), floor), f"{what}: {actual} vs {expected}"


def assert_cosine(actual: Optional[float], expected: Optional[float], what: str) -> None:
    """Within 1e-6 relative, or 1e-8 absolute for cosines near 0 (where
    <g,p> is a sum that cancels: its rounding error is relative to
    |g||p|, not to <g,p>)."""
    assert_close_rel(actual, expected, 1e-6, what, floor=1e-2)


def assert_gradients(model: Model, ref_grads: Sequence[Optional[torch.Tensor]], seen: Sequence[Optional[torch.Tensor]],
                     coeff: float, snapshot_before: Sequence[Optional[torch.Tensor]]) -> None:
    """Each .grad after the step against the reference's, within one unit
    in the last place of its dtype (relative to the magnitudes involved)."""
    for i, (p, r, g) in enumerate(zip(model.params, ref_grads, seen)):
        if r is None:
            assert p.grad is None
            continue
        assert g is not None
        actual = p.grad.to(device="cpu", dtype=torch.float64)
        p_ref = snapshot_before[i]
        scale = g.abs() + r.abs() + (abs(coeff) * p_ref.abs() if p_ref is not None else 0.0)
        tol = ulp_tolerance(p.dtype) * scale + subnormal_spacing(p.dtype)
        bad = (actual - r).abs() > tol
        assert not bool(bad.any()), (
            f"parameter {i} ({p.dtype}): {int(bad.sum())} elements off, max error "
            f"{float((actual - r).abs().max())}")


def run_parity(mode: str, alpha_mode: str, reference: str = "raw_gradient",
               snapshot_dtype: torch.dtype = torch.float32, poison_at: Tuple[int, ...] = (),
               rhos: Sequence[float] = RHOS, device: str = "cpu", passes: str = "auto",
               **trigger: Any) -> List[str]:
    """Steps gac.Agent and the reference over `rhos`, with the parameters
    and gradients on `device`, through `passes`; `trigger`: the trigger's
    options for both (trigger, window, window_c_low, ...)."""
    model = Model(seed=zlib.crc32(f"{mode} {alpha_mode} {reference} {snapshot_dtype}".encode()) % 1000,
                  device=device)
    agent = gac.Agent(0.05, 0.3, mode=mode, alpha_mode=alpha_mode, reference=reference,
                      snapshot_dtype=snapshot_dtype, num_threads=2, chunk_elements=4096, passes=passes, **trigger)
    ref = ReferenceGac(0.05, 0.3, alpha_mode, mode, reference, snapshot_dtype, **trigger)
    regimes = []
    for step, rho in enumerate(rhos, start=1):
        seen = model.next_gradients(rho, step, poison=step in poison_at)
        snapshot_before = [s.clone() if s is not None else None for s in (ref.snapshot or [None] * len(seen))]
        expected = ref.step(seen, [p.dtype for p in model.params])
        report = agent.step(step, model.params)
        regimes.append(report.regime)
        what = f"step {step}"
        assert report.regime == expected.regime, f"{what}: {report.regime} vs {expected.regime} (c={expected.cosine})"
        assert report.step == step and report.mode == mode
        assert_cosine(report.cosine, expected.cosine, what + " cosine")
        assert_cosine(report.window_mean, expected.window_mean, what + " window_mean")
        assert report.decision.window_mean == report.window_mean
        assert_close_rel(report.alpha, expected.alpha, 1e-6, what + " alpha")
        assert report.step_optimizer == expected.step_optimizer
        assert report.gradient_modified == (mode != "monitor" and expected.regime == "project")
        if expected.regime != "invalid":
            assert_close_rel(report.grad_norm, math.sqrt(expected.gg), 1e-6, what + " grad_norm")
            assert_close_rel(report.ref_norm, math.sqrt(expected.pp), 1e-6, what + " ref_norm")
        assert report.tensors == sum(1 for g in seen if g is not None)
        assert report.elements == sum(g.numel() for g in seen if g is not None)
        # The torch-ops path reads every layout in place.
        assert report.strided_tensors == (0 if passes == "torch" else sum(
            1 for (s, _, layout), g in zip(Model.SPECS, seen) if g is not None and layout == "strided"))
        assert report.passes == ("torch" if passes == "torch" else device.split(":")[0])
        if expected.regime == "project" and mode != "monitor":
            d = report.decision
            assert_close_rel(d.projection_coeff, expected.coeff, 1e-6, what + " coeff")
            assert_close_rel(d.cosine_after, gac.cosine_after_projection(expected.cosine, expected.alpha), 1e-6)
        assert_gradients(model, expected.grads, seen, expected.coeff, snapshot_before)
        if reference == "applied_update":
            ref.adopt_applied([p.grad.cpu() if p.grad is not None else None for p in model.params])
    return regimes


@pytest.mark.parametrize("alpha_mode", ["paper", "exact"])
def test_local_mode_matches_fp64_reference(alpha_mode: str) -> None:
    regimes = run_parity("local", alpha_mode)
    # The sequence reaches every regime but invalid, so the test can tell them apart.
    assert {"safe", "project", "skip"} <= set(regimes), regimes


@pytest.mark.parametrize("mode", ["local", "monitor"])
@pytest.mark.parametrize("reference", ["raw_gradient", "applied_update"])
@pytest.mark.parametrize("snapshot_dtype", [torch.float32, torch.bfloat16])
def test_torch_ops_path_matches_fp64_reference(mode: str, reference: str, snapshot_dtype: torch.dtype) -> None:
    # The portable path, forced on CPU tensors: the same regimes, cosines,
    # norms and projected gradients as fp64 (and so as gac's kernels), on
    # mixed dtypes, layouts, absent, zero and non-finite gradients.
    regimes = run_parity(mode, "paper", reference, snapshot_dtype, poison_at=(5,), passes="torch")
    assert {"safe", "project", "skip", "invalid"} <= set(regimes), regimes


def test_torch_ops_path_and_kernels_agree_step_by_step() -> None:
    # Two agents, one per path, on the same gradients with layers: the same
    # decisions and, within rounding, the same sums per layer and the same
    # projected gradients.
    shapes = [(300, 20), (4096,), (7,), (65, 65)]
    gen = torch.Generator().manual_seed(11)
    sets = [[torch.nn.Parameter(torch.zeros(s)) for s in shapes] for _ in range(2)]
    agents = [gac.Agent(0.05, 0.3, passes=passes, layers={"a": ps[:2], "b": ps[2:]})
              for passes, ps in zip(("kernels", "torch"), sets)]
    assert [a.passes for a in agents] == ["kernels", "torch"]
    raw = [torch.randn(s, generator=gen) for s in shapes]
    for step, rho in enumerate(RHOS, start=1):
        raw = [rho * r + math.sqrt(1 - rho * rho) * torch.randn(r.shape, generator=gen) for r in raw]
        for ps in sets:
            for p, r in zip(ps, raw):
                p.grad = r.clone()
        native, ops = (a.step(step, ps) for a, ps in zip(agents, sets))
        assert (native.passes, ops.passes) == ("cpu", "torch")
        assert native.regime == ops.regime, f"step {step}"
        assert_cosine(ops.cosine, native.cosine, f"step {step}")
        assert_close_rel(ops.grad_norm, native.grad_norm, 1e-6)
        for name in ("a", "b"):
            assert_cosine(ops.layers[name].cosine, native.layers[name].cosine, f"step {step} layer {name}")
            assert_close_rel(ops.layers[name].grad_sq, native.layers[name].grad_sq, 1e-6)
        for p, q in zip(*sets):
            assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=1e-7), f"step {step}"


def test_passes_option_is_checked() -> None:
    with pytest.raises(ValueError, match="passes must be 'auto', 'kernels' or 'torch'"):
        gac.Agent(passes="gpu")
    assert gac.Agent().passes == "auto"


@pytest.mark.parametrize("alpha_mode", ["paper", "exact"])
def test_windowed_trigger_matches_fp64_reference(alpha_mode: str) -> None:
    regimes = run_parity("local", alpha_mode, rhos=WINDOW_RHOS, poison_at=(9,), **WINDOW)
    assert {"safe", "project", "skip", "invalid"} <= set(regimes), regimes
    # Safe while the window fills, although |c_t| = 0.35 is above the per-step c_high.
    assert regimes[:3] == ["safe"] * 3


def test_per_step_trigger_reports_the_window_mean() -> None:
    # The default trigger decides on |c_t|; the mean of the last `window` cosines is reported all the same.
    regimes = run_parity("local", "paper", rhos=WINDOW_RHOS, window=3)
    assert regimes[1:4] == ["skip", "skip", "skip"], regimes


def test_windowed_trigger_in_monitor_mode_reports_what_it_would_do() -> None:
    regimes = run_parity("monitor", "paper", rhos=WINDOW_RHOS, **WINDOW)
    assert "project" in regimes and "skip" in regimes


def test_windowed_trigger_options_and_reset() -> None:
    agent = gac.Agent(trigger="window", window=2, window_c_low=0.1, window_c_high=0.4)
    assert (agent.trigger, agent.window, agent.window_c_low, agent.window_c_high) == ("window", 2, 0.1, 0.4)
    assert "trigger='window', window=2" in repr(agent)
    default = gac.Agent()
    assert (default.trigger, default.window, default.window_c_low, default.window_c_high) == ("per_step", 20, 0.05, 0.3)
    assert "trigger" not in repr(default)
    p = torch.nn.Parameter(torch.zeros(64))
    base = torch.randn(64, generator=torch.Generator().manual_seed(3))
    reports = []
    for step in range(1, 5):
        p.grad = base.clone()  # cosine 1 from the second step on
        reports.append(agent.step(step, [p]))
    assert [r.window_mean is None for r in reports] == [True, True, False, False]
    assert [r.regime for r in reports] == ["safe", "safe", "skip", "skip"]
    assert reports[2].window_mean == pytest.approx(1.0, abs=1e-6)
    assert agent.window_held == 2
    agent.reset()
    assert agent.window_held == 0
    for step in range(5, 7):  # a new reference, then one cosine: not full
        p.grad = base.clone()
        r = agent.step(step, [p])
        assert r.window_mean is None and r.regime == "safe"
    p.grad = base.clone()
    assert agent.step(7, [p]).regime == "skip"


@pytest.mark.parametrize("kwargs, match", [
    ({"trigger": "windowed"}, "trigger must be 'per_step' or 'window', got 'windowed'"),
    ({"trigger": "step"}, "trigger must be"),
    ({"trigger": "window", "window": 0}, "window must be in \\[1, 1000\\], got 0"),
    ({"window": 1001}, "got 1001"),
    ({"trigger": "window", "window_c_low": 0.5, "window_c_high": 0.4}, "window_c_low, window_c_high"),
    ({"window_c_low": 0.0}, "window_c_low, window_c_high: c_low must be > 0"),
    ({"window_c_high": 1.5}, "c_high must be <= 1"),
])
def test_bad_trigger_options_raise_value_error(kwargs: Dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gac.Agent(**kwargs)


def test_exact_alpha_puts_the_cosine_at_c_low() -> None:
    c = gac.Controller(0.05, 0.3, "exact").decide(0.15, 1.0, 1.0)
    assert c.regime == "project"
    assert c.cosine_after == pytest.approx(0.05, rel=1e-6)


def test_monitor_mode_measures_and_never_changes_the_update() -> None:
    regimes = run_parity("monitor", "paper")
    assert "project" in regimes and "skip" in regimes


def test_applied_update_reference_matches() -> None:
    run_parity("local", "paper", reference="applied_update")


def test_bf16_snapshot_matches_rounded_reference() -> None:
    run_parity("local", "exact", snapshot_dtype=torch.bfloat16)


def test_non_finite_gradient_is_invalid_and_keeps_the_snapshot() -> None:
    regimes = run_parity("local", "paper", poison_at=(4, 8))
    assert regimes[3] == "invalid" and regimes[7] == "invalid"


def test_monitor_mode_keeps_the_last_accepted_gradient_after_a_non_finite_or_spiking_one() -> None:
    # The rule of every mode and device: an invalid step and a spike leave
    # the snapshot as it was, so the next step is compared with the last
    # accepted gradient (step 1's here), not with the rejected one.
    torch.manual_seed(5)
    p = torch.nn.Parameter(torch.zeros(100_000))
    g = torch.randn(100_000)
    agent = gac.Agent(0.05, 0.3, mode="monitor", max_grad_norm=1e3)
    p.grad = g.clone()
    assert agent.step(1, [p]).regime == "safe"
    p.grad = g.clone()
    p.grad[70_000] = float("inf")
    poisoned = p.grad.clone()
    r = agent.step(2, [p])
    assert r.regime == "invalid" and r.step_optimizer and torch.equal(p.grad, poisoned)
    p.grad = 1e4 * torch.randn(100_000)  # far above max_grad_norm
    r = agent.step(3, [p])
    assert r.regime == "spike" and r.step_optimizer
    p.grad = 0.5 * g
    r = agent.step(4, [p])
    assert r.cosine == pytest.approx(1.0, abs=1e-6) and r.regime == "skip" and r.step_optimizer


def test_gradients_are_projected_in_place_without_copies() -> None:
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.zeros(4096)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn(4096)
    agent = gac.Agent(0.05, 0.9)
    agent.step(1, params)
    raw = []
    for p in params:
        p.grad.mul_(0.3).add_(torch.randn(4096))  # cosine about 0.29: project
        raw.append(p.grad.clone())
    storages = [p.grad.data_ptr() for p in params]
    grads = [p.grad for p in params]
    report = agent.step(2, params)
    assert report.regime == "project" and report.gradient_modified
    for p, g, ptr, r in zip(params, grads, storages, raw):
        assert p.grad is g and p.grad.data_ptr() == ptr  # the same tensor and memory
        assert not torch.equal(p.grad, r)               # changed there
    assert agent.snapshot_bytes == 3 * 4096 * 4


def test_generator_and_list_give_the_same_steps() -> None:
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5))
    agents = [gac.Agent(0.05, 0.3), gac.Agent(0.05, 0.3)]
    for step in range(1, 8):
        x = torch.randn(16, 20)
        model.zero_grad()
        model(x).square().mean().backward()
        saved = [p.grad.clone() for p in model.parameters()]
        a = agents[0].step(step, model.parameters())
        projected = [p.grad.clone() for p in model.parameters()]
        for p, s in zip(model.parameters(), saved):
            p.grad.copy_(s)
        b = agents[1].step(step, list(model.parameters()))
        assert (a.regime, a.cosine) == (b.regime, b.cosine)
        for p, q in zip(model.parameters(), projected):
            assert torch.equal(p.grad, q)


def test_a_new_list_of_the_same_tensors_is_the_same_parameter_set() -> None:
    params = [torch.nn.Parameter(torch.zeros(10)) for _ in range(3)]
    for p in params:
        p.grad = torch.ones(10)
    agent = gac.Agent()
    agent.step(1, params)
    agent.step(2, list(params))
    agent.step(3, tuple(params))
    agent.step(4, iter(params))
    assert agent.step(5, params).cosine == pytest.approx(1.0, rel=1e-6)


def test_changed_parameters_raise_and_modify_nothing_until_reset() -> None:
    params = [torch.nn.Parameter(torch.zeros(100)) for _ in range(3)]
    torch.manual_seed(3)
    for p in params:
        p.grad = torch.randn(100)
    agent = gac.Agent(0.05, 0.9)
    agent.step(1, params)
    for p in params:
        p.grad.mul_(0.3).add_(torch.randn(100))
    before = [p.grad.clone() for p in params]
    other = [params[0], torch.nn.Parameter(torch.zeros(100)), params[2]]
    other[1].grad = params[1].grad.clone()
    for bad in (params[:2], other, params + [other[1]]):
        with pytest.raises(gac.FailedPreconditionError, match=r"agent\.reset\(\)") as e:
            agent.step(2, bad)
        assert e.value.code == gac.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ValueError, match="not after the previous step"):
        agent.step(1, params)
    for p, b in zip(params, before):
        assert torch.equal(p.grad, b)
    # The snapshot is intact: the next step compares with step 1's gradients.
    report = agent.step(2, params)
    assert report.regime == "project"
    agent.reset()
    assert agent.snapshot_bytes == 0
    first = agent.step(1, other)
    assert first.regime == "safe" and first.cosine is None


def test_a_parameter_that_changed_size_is_refused_until_reset() -> None:
    # What a reshard or a resume with another world size does to a local
    # shard, and `p.data = ...` to any parameter: the same object, another
    # size. Reading it with the first step's layout would read past it.
    p = torch.nn.Parameter(torch.zeros(64))
    q = torch.nn.Parameter(torch.zeros(8, 4))
    p.grad, q.grad = torch.ones(64), torch.ones(8, 4)
    agent = gac.Agent(0.05, 0.9)
    agent.step(1, [p, q])
    p.data = torch.zeros(32)
    p.grad = torch.ones(32)
    with pytest.raises(gac.FailedPreconditionError, match=r"parameter 0 changed size .*agent\.reset\(\)"):
        agent.step(2, [p, q])
    assert torch.equal(p.grad, torch.ones(32)) and torch.equal(q.grad, torch.ones(8, 4))
    # Same number of elements, another shape, not contiguous: read with its own sizes and strides.
    # The elements must meet their own snapshot whatever the memory order.
    values = torch.arange(32.0).reshape(8, 4)
    q.data = torch.zeros(4, 8).t()
    q.grad = values.t().contiguous().t()  # (8, 4) in column-major memory
    agent.reset()
    agent.step(1, [p, q])
    q.grad = values.clone()  # row-major now: another layout than the snapshot's, the copy path
    report = agent.step(2, [p, q])
    assert report.tensors == 2 and report.strided_tensors == 1
    assert report.cosine == pytest.approx(1.0, abs=1e-7)
    assert report.grad_norm == pytest.approx(float((32 + values.pow(2).sum()) ** 0.5))


def test_layers_report_each_layers_cosine() -> None:
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3))
    layers = {"first": list(model[0].parameters()), "second": model[1].parameters()}
    agent = gac.Agent(0.05, 0.99, layers=layers)
    ref: Dict[str, List[torch.Tensor]] = {}
    for step in range(1, 4):
        for p in model.parameters():
            p.grad = torch.randn(p.shape)
        raw = {name: [p.grad.to(torch.float64).clone() for p in (model[0] if name == "first" else model[1]).parameters()]
               for name in ("first", "second")}
        report = agent.step(step, model.parameters())
        assert list(report.layers) == ["first", "second"]
        for name, gs in raw.items():
            stats = report.layers[name]
            assert stats.name == name
            gg = sum(float((g * g).sum()) for g in gs)
            assert stats.grad_sq == pytest.approx(gg, rel=1e-6)
            if step > 1:
                dot = sum(float((g * p).sum()) for g, p in zip(gs, ref[name]))
                pp = sum(float((p * p).sum()) for p in ref[name])
                assert stats.dot == pytest.approx(dot, rel=1e-6, abs=1e-9)
                assert stats.cosine == pytest.approx(dot / (math.sqrt(gg * pp) + 1e-8), rel=1e-6, abs=1e-9)
            else:
                assert stats.cosine is None
        ref = raw
        assert set(report.to_dict(numeric=False)) >= {"gac/cosine/first", "gac/cosine/second"}


def test_a_layer_parameter_missing_from_step_raises() -> None:
    a, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))
    a.grad, b.grad = torch.ones(4), torch.ones(4)
    agent = gac.Agent(layers={"g": [b]})
    with pytest.raises(ValueError, match="not among the parameters"):
        agent.step(1, [a])
    assert agent.step(1, [a, b]).layers["g"].grad_sq == pytest.approx(4.0)


def test_groups_is_a_deprecated_alias_of_layers() -> None:
    a, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))
    a.grad, b.grad = torch.ones(4), torch.ones(4)
    removed = r"\. It will be removed in gac 0\.3\.0\.$"
    with pytest.warns(DeprecationWarning, match=r"Agent\(groups=\.\.\.\) is deprecated; use Agent\(layers=\.\.\.\)" + removed):
        agent = gac.Agent(groups={"g": [b]})
    report = agent.step(1, [a, b])
    assert report.layers["g"].grad_sq == pytest.approx(4.0)
    with pytest.warns(DeprecationWarning, match="StepReport.groups is deprecated; use StepReport.layers" + removed):
        assert report.groups["g"].grad_sq == pytest.approx(4.0)
    with pytest.warns(DeprecationWarning, match="gac.GroupStats is deprecated; use gac.LayerStats" + removed) as caught:
        assert gac.GroupStats is gac.LayerStats
    assert caught[0].filename == __file__  # the warning names the line that used the alias
    assert isinstance(report.layers["g"], gac.LayerStats)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="not both"):
        gac.Agent(layers={"g": [b]}, groups={"g": [b]})


def test_the_report_carries_the_agents_mode_and_time() -> None:
    p = torch.nn.Parameter(torch.zeros(8))
    p.grad = torch.ones(8)
    agent = gac.Agent(mode="monitor")
    r = agent.step(1, [p])
    assert r.mode == "monitor" and r.to_dict(numeric=False)["gac/mode"] == "monitor"
    assert r.agent_overhead_seconds == pytest.approx(r.stats_seconds + r.decide_seconds + r.apply_seconds)
    with pytest.warns(DeprecationWarning, match="StepReport.seconds is deprecated; use "
                      r"StepReport.agent_overhead_seconds\. It will be removed in gac 0\.3\.0\.") as caught:
        assert r.seconds == r.agent_overhead_seconds
    assert caught[0].filename == __file__
    agent.mode = "local"
    p.grad = torch.ones(8)
    assert agent.step(2, [p]).mode == "local"


def test_mode_switching_between_steps() -> None:
    params = [torch.nn.Parameter(torch.zeros(1000))]
    torch.manual_seed(5)
    params[0].grad = torch.randn(1000)
    agent = gac.Agent(0.05, 0.99)
    agent.step(1, params)
    agent.mode = "monitor"
    params[0].grad.mul_(0.3).add_(torch.randn(1000))
    g = params[0].grad.clone()
    r = agent.step(2, params)
    assert r.mode == "monitor" and r.regime == "project" and not r.gradient_modified
    assert torch.equal(params[0].grad, g)
    agent.mode = "local"
    params[0].grad.mul_(0.3).add_(torch.randn(1000))
    r = agent.step(3, params)
    assert r.mode == "local" and r.gradient_modified
    with pytest.raises(ValueError, match="decision_source"):
        agent.mode = "remote"
    assert agent.mode == "local"


def test_thresholds_and_the_process_group_change_in_place() -> None:
    params = [torch.nn.Parameter(torch.zeros(1000))]
    torch.manual_seed(6)
    agent = gac.Agent(mode="monitor", trigger="window", window=4)
    for step in (1, 2, 3):
        params[0].grad = torch.randn(1000)
        agent.step(step, params)
    assert agent.window_held == 2
    for bad in ((0.5, 0.1), (0.0, 0.3), (0.1, 1.5)):
        with pytest.raises(ValueError, match="c_low|c_high"):
            agent.set_thresholds(*bad)
        assert (agent.c_low, agent.c_high, agent.window_held) == (0.05, 0.3, 2)  # unchanged
    agent.set_thresholds(0.1, 0.6)
    agent.mode = "local"
    # As a new agent with them: no reference, an empty window; the other options kept.
    assert (agent.c_low, agent.c_high, agent.window_held, agent.window, agent.trigger) == (0.1, 0.6, 0, 4, "window")
    assert repr(agent).startswith("Agent(c_low=0.1, c_high=0.6, mode='local'")
    params[0].grad = torch.randn(1000)
    r = agent.step(4, params)
    assert r.cosine is None and r.c_low == 0.1 and r.c_high == 0.6 and r.mode == "local"
    regimes = []
    for step in (5, 6, 7, 8):
        params[0].grad = params[0].grad * 0.95 + 0.05 * torch.randn(1000)
        regimes.append(agent.step(step, params).regime)
    assert regimes == ["safe"] * 3 + ["skip"]  # the window of 4 cosines (~0.99 >= 0.6) fills at step 8
    # A process group set between steps: the next step sums over it (one rank here: the same sums).
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    agent.process_group = pg
    assert agent.process_group is pg
    params[0].grad = torch.randn(1000)
    r = agent.step(9, params)
    assert r.grad_norm == pytest.approx(float(params[0].grad.double().norm()), rel=1e-6)
    agent.process_group = None
    assert agent.process_group is None
    agent.step(10, params)


class FlakySource(gac.DecisionSource):
    """A Python decision source: gacd's decision with alpha 1 every other step, an error otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Tuple[int, float]] = []

    def decide(self, step: int, stats: gac.AlignmentStats) -> gac.Decision:
        self.calls.append((step, stats.grad_sq))
        if step % 2:
            raise RuntimeError("flaky")
        return gac.Decision("skip", cosine=0.5, grad_norm=math.sqrt(stats.grad_sq), ref_norm=math.sqrt(stats.ref_sq))


def test_python_decision_source_and_fallbacks() -> None:
    params = [torch.nn.Parameter(torch.zeros(100))]
    params[0].grad = torch.ones(100)
    source = FlakySource()
    agent = gac.Agent(mode="remote", decision_source=source)
    local = gac.Controller()
    for step in range(1, 5):
        params[0].grad = torch.full((100,), float(step))
        r = agent.step(step, params)
        if step % 2:
            assert r.fallback and r.remote_error == "UNAVAILABLE: decide() raised RuntimeError: flaky"
            expected = local.decide(r.decision.grad_norm * r.decision.ref_norm, r.grad_norm**2, r.ref_norm**2,
                                    has_reference=step > 1)
            assert r.regime == expected.regime
        else:
            assert not r.fallback and r.remote_error is None
            assert r.regime == "skip" and not r.step_optimizer and r.cosine == 0.5
    assert agent.fallbacks == 2
    assert [s for s, _ in source.calls] == [1, 2, 3, 4]
    assert source.calls[0][1] == pytest.approx(100.0)


def test_gil_is_released_while_a_step_runs() -> None:
    # Two ranks of one process group in two threads of this process: each
    # step waits in the all-reduce for the other thread's step, which can
    # only run if the first released the GIL (else gloo times out).
    store = dist.HashStore()
    results: Dict[int, List[float]] = {}
    errors: List[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            pg = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=30))
            p = torch.nn.Parameter(torch.zeros(50000))
            agent = gac.Agent(process_group=pg, num_threads=1)
            gen = torch.Generator().manual_seed(rank)
            out = []
            for step in range(1, 4):
                p.grad = torch.randn(50000, generator=gen)
                out.append(agent.step(step, [p]).grad_norm)
            results[rank] = out
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert results[0] == results[1] and len(results[0]) == 3


def test_zero_and_empty_parameter_lists() -> None:
    agent = gac.Agent()
    r = agent.step(1, [])
    assert r.regime == "safe" and r.tensors == 0 and r.elements == 0
    p = torch.nn.Parameter(torch.zeros(5))
    p.grad = torch.zeros(5)
    agent.reset()
    assert agent.step(1, [p]).regime == "safe"
    r = agent.step(2, [p])  # |p| == 0: no reference yet
    assert r.regime == "safe" and r.cosine is None


def test_report_fields_and_repr() -> None:
    p = torch.nn.Parameter(torch.zeros(10))
    p.grad = torch.ones(10)
    agent = gac.Agent(0.05, 0.3, num_threads=1)
    assert "Agent(c_low=0.05" in repr(agent)
    assert agent.num_threads == 1 and agent.kernel_isa in ("avx512", "avx2", "baseline")
    r = agent.step(1, [p])
    assert "StepReport(step=1" in repr(r)
    d = r.to_dict(numeric=False)
    assert d["gac/regime"] == "safe" and d["gac/step_optimizer"] is True and d["gac/cosine"] is None
    assert r.agent_overhead_seconds == pytest.approx(r.stats_seconds + r.decide_seconds + r.apply_seconds)
    assert r.remote_error is None and r.decision.apply_update
