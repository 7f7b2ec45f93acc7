"""The package on CUDA tensors: gac.Agent against the fp64 reference with
the parameters and gradients on the GPU (test_agent's parity run, every
dtype and layout), through gac's kernels and through the torch-ops path, the
kernels' first-contact check, the passes on the caller's current stream, and
gac.attach on a CUDA model trained on a side stream.

Every test here needs a CUDA device and skips without one (this machine's
CI has none; scripts/gpu_lease.sh runs them on a GPU against the wheel).
The parity run's plumbing for a device is the one test_agent runs on the
CPU."""

from __future__ import annotations

import math
from typing import Any, Dict, List

import pytest
import torch

import gac
from test_agent import WINDOW, WINDOW_RHOS, run_parity

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("mode, alpha_mode, options", [
    ("local", "paper", {}),
    ("local", "exact", {}),
    ("monitor", "paper", {}),
    ("local", "exact", {"snapshot_dtype": torch.bfloat16}),
    ("local", "paper", {"reference": "applied_update"}),
    ("local", "paper", {"poison_at": (4, 8)}),
])
def test_parity_on_cuda(mode: str, alpha_mode: str, options: Dict[str, Any]) -> None:
    regimes = run_parity(mode, alpha_mode, device="cuda", **options)
    assert "project" in regimes and "skip" in regimes, regimes
    if "poison_at" in options:
        assert regimes[3] == "invalid" and regimes[7] == "invalid"


def test_windowed_trigger_on_cuda() -> None:
    regimes = run_parity("local", "paper", rhos=WINDOW_RHOS, poison_at=(9,), device="cuda", **WINDOW)
    assert {"safe", "project", "skip", "invalid"} <= set(regimes), regimes


@pytest.mark.parametrize("mode", ["local", "monitor"])
def test_torch_ops_path_on_cuda(mode: str) -> None:
    # The portable path on CUDA tensors: fp64's results, as on the CPU.
    regimes = run_parity(mode, "paper", poison_at=(5,), device="cuda", passes="torch")
    assert {"project", "skip", "invalid"} <= set(regimes), regimes


def test_the_kernels_pass_their_first_contact_check_here() -> None:
    # gac's CUDA kernels against the torch-ops path on this GPU's first steps:
    # no warning, and the kernels keep running (a disagreement would make
    # report.passes "torch" with a RuntimeWarning).
    import warnings

    params = [torch.nn.Parameter(torch.zeros(n, device="cuda")) for n in (4096, 123_457, 7)]
    agent = gac.Agent()
    gen = torch.Generator(device="cuda").manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for step in range(1, 4):
            for p in params:
                p.grad = torch.randn(p.shape, device="cuda", generator=gen)
            assert agent.step(step, params).passes == "cuda"


def _cosine64(a: List[torch.Tensor], b: List[torch.Tensor]) -> float:
    dot = sum(float((x * y).sum()) for x, y in zip(a, b))
    na = math.sqrt(sum(float((x * x).sum()) for x in a))
    nb = math.sqrt(sum(float((y * y).sum()) for y in b))
    return dot / (na * nb)


def test_a_step_runs_on_the_callers_current_stream() -> None:
    # The gradients are written on a side stream behind a long sleep on that
    # stream, and the step is called under it without any synchronisation: a
    # step on another stream would read the gradients before they are
    # written (all zeros) and report an invalid (zero-norm) gradient.
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(n, device="cuda")) for n in (1 << 20, 4096, 333)]
    for p in params:
        p.grad = torch.zeros_like(p)
    grads = [[torch.randn(p.shape, device="cuda") for p in params] for _ in range(3)]
    grads[2] = [0.6 * a + 0.8 * torch.randn_like(a) for a in grads[1]]  # cosine about 0.6 with step 2's
    torch.cuda.synchronize()
    agent = gac.Agent(0.05, 0.3, mode="monitor")
    side = torch.cuda.Stream()
    reports = []
    with torch.cuda.stream(side):
        for step, gs in enumerate(grads, start=1):
            torch.cuda._sleep(50_000_000)  # tens of milliseconds of GPU time on this stream
            for p, g in zip(params, gs):
                p.grad.copy_(g)
            reports.append(agent.step(step, params))
    torch.cuda.synchronize()
    want = [_cosine64([a.double().cpu() for a in grads[i]], [b.double().cpu() for b in grads[i - 1]]) for i in (1, 2)]
    assert reports[0].regime == "safe" and reports[0].cosine is None
    for r, w in zip(reports[1:], want):
        assert r.regime != "invalid"
        assert r.cosine == pytest.approx(w, rel=1e-5, abs=1e-6)
    assert reports[2].grad_norm == pytest.approx(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads[2])),
                                                 rel=1e-5)


def test_attach_on_a_cuda_model_trained_on_a_side_stream() -> None:
    # Monitor mode first: each step's cosine against fp64 of the gradients
    # the optimizer was given; then control with thresholds every step
    # exceeds: skipped steps leave the weights and AdamW's state alone.
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(128, 32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    att = gac.attach(opt)
    seen: List[List[torch.Tensor]] = []
    with torch.cuda.stream(side):
        for step in range(1, 5):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            seen.append([p.grad.detach().double().cpu() for p in model.parameters()])
            opt.step()
            r = att.last_report
            assert r.step_optimizer and not r.gradient_modified
            if step > 1:
                assert r.cosine == pytest.approx(_cosine64(seen[-1], seen[-2]), rel=1e-5, abs=1e-6)
    att.detach()

    att = gac.attach(opt, control=True, c_low=1e-9, c_high=2e-9)
    with torch.cuda.stream(side):
        for step in range(1, 4):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            before = [p.detach().clone() for p in model.parameters()]
            state_before = {k: v["exp_avg"].clone() for k, v in opt.state.items()}
            opt.step()
            side.synchronize()
            changed = [not torch.equal(b, p) for b, p in zip(before, model.parameters())]
            if step == 1:  # no previous gradient
                assert att.last_report.step_optimizer and all(changed)
            else:
                assert not att.last_report.step_optimizer and not any(changed)
                assert all(torch.equal(v["exp_avg"], state_before[k]) for k, v in opt.state.items())
    assert att.reports == 3 and att.skipped == 2
    att.detach()


def test_parameters_on_two_devices_are_refused() -> None:
    agent = gac.Agent()
    a = torch.nn.Parameter(torch.zeros(8))
    b = torch.nn.Parameter(torch.zeros(8, device="cuda"))
    a.grad, b.grad = torch.ones(8), torch.ones(8, device="cuda")
    with pytest.raises((ValueError, RuntimeError), match="device"):
        agent.step(1, [a, b])



def test_policy_signals_on_cuda_are_the_cpus_with_one_synchronisation() -> None:
    """gac.rl on CUDA tensors: the CPU's numbers (fp64 sums to 1e-12; the
    entropy from bf16 logits, fp32 per token, to 1e-6), one device-to-host
    synchronisation, and the signals carried by a CUDA step's report."""
    import warnings

    import gac.rl

    g = torch.Generator().manual_seed(11)
    b, t, v = 64, 256, 512
    old = (-torch.rand(b, t, generator=g) * 4).to(torch.bfloat16)
    new = (old.float() + 0.4 * torch.randn(b, t, generator=g)).to(torch.bfloat16)
    mask = torch.rand(b, t, generator=g) < 0.7
    inputs = dict(advantages=torch.randn(b, generator=g), clip_low=0.2, clip_high=0.28, truncation=2.0,
                  logits=torch.randn(b, t, v, generator=g).to(torch.bfloat16),
                  versions=torch.randint(0, 5, (b,), generator=g), current_version=5)
    on_cpu = gac.rl.signals(new, old, mask, **inputs)
    cuda_inputs = {k: x.cuda() if isinstance(x, torch.Tensor) else x for k, x in inputs.items()}
    args = [x.cuda() for x in (new, old, mask)]
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            on_cuda = gac.rl.signals(*args, **cuda_inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert len([w for w in caught if "synchroniz" in str(w.message)]) == 1
    assert on_cpu.invalid is None and on_cuda.invalid is None
    for key, want in on_cpu.to_dict().items():
        got = getattr(on_cuda, key)
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-6 if key == "entropy_mean" else 1e-12, abs=1e-15), key
        else:
            assert got == want, key
    p = torch.nn.Parameter(torch.zeros(1024, device="cuda"))
    p.grad = torch.randn(1024, device="cuda")
    report = gac.Agent(mode="monitor").step(1, [p], policy=on_cuda)
    assert report.ess_token == on_cuda.ess_token and report.policy_tokens == on_cuda.tokens
