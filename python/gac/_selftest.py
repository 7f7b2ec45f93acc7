"""``python -m gac --selftest``: gac's passes run on every device this process
sees, against an fp64 reference.

For each device (the CPU, every CUDA GPU torch lists, an XPU or MPS device
when torch has one) and each path that can run there (gac's kernels: the
CPU's, or the CUDA kernels on a GPU they carry an image for; the torch-ops
path everywhere), two steps of ``gac.Agent`` on synthetic gradients of
awkward lengths (fp32, bf16 and fp16; fp32 and bf16 snapshots): the second
step's c_t, ‖g‖ and ‖p‖ against fp64 sums of the very values the agent read,
and its projected gradient against the fp64 projection, in units of one
rounding of the gradient's type. Then the median time of a step of each path
on a larger list. Needs torch; a machine without a GPU checks its CPU paths
and says so.
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Literal, Tuple

import gac

# A statistic (c_t, ‖g‖, ‖p‖) is off by at most this, relative (docs/ALGORITHM.md: 1e-6).
STATS_TOLERANCE = 1e-6
# A projected element is off by at most this many roundings of its type,
# relative to its operands (the coefficient rounded to fp32, one fused
# multiply-add or two roundings in torch, then the store).
PROJECTION_ULPS = 2.0

Path = Literal["kernels", "torch"]
_SHAPES: List[Tuple[int, ...]] = [(1000,), (37, 3), (4096,), (129, 65), (1,), (65537,), (3, 5, 7)]
_TIMING_TENSORS, _TIMING_ELEMENTS = 64, 1 << 17


def _devices(torch: Any) -> List[Any]:
    found = [torch.device("cpu")]
    found += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        found += [torch.device("xpu", i) for i in range(xpu.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append(torch.device("mps"))
    return found


def _paths(device: Any, gpus: Dict[int, Any]) -> List[Path]:
    if device.type == "cpu":
        return ["kernels", "torch"]
    if device.type == "cuda" and gpus.get(device.index, {}).get("kernels"):
        return ["kernels", "torch"]
    return ["torch"]


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check(torch: Any, device: Any, path: Path, gdtype: Any, sdtype: Any) -> Dict[str, Any]:
    """Two steps on the synthetic list; the errors of the second one."""
    gen = torch.Generator().manual_seed(7)
    base = [torch.randn(s, generator=gen, dtype=torch.float64) for s in _SHAPES]
    grads = [[b + 0.8 * torch.randn(s, generator=gen, dtype=torch.float64) for b, s in zip(base, _SHAPES)]
             for _ in range(2)]
    params = [torch.nn.Parameter(torch.zeros(s, dtype=gdtype, device=device)) for s in _SHAPES]
    agent = gac.Agent(1e-3, 0.999, passes=path, snapshot_dtype=sdtype, num_threads=1)
    for p, g in zip(params, grads[0]):
        p.grad = g.to(gdtype).to(device)
    agent.step(1, params)
    # What the agent read: the gradients as stored, the snapshot as stored.
    ref = [p.grad.detach().double().cpu().to(sdtype).double() for p in params]
    for p, g in zip(params, grads[1]):
        p.grad = g.to(gdtype).to(device)
    read = [p.grad.detach().double().cpu() for p in params]
    report = agent.step(2, params)
    _sync(torch, device)
    dot = sum(float((g * r).sum()) for g, r in zip(read, ref))
    gg = sum(float((g * g).sum()) for g in read)
    pp = sum(float((r * r).sum()) for r in ref)
    cos = dot / (math.sqrt(gg * pp) + 1e-8)
    stats_error = max(abs(report.grad_norm - math.sqrt(gg)) / math.sqrt(gg),
                      abs(report.ref_norm - math.sqrt(pp)) / math.sqrt(pp),
                      abs((report.cosine or 0.0) - cos))
    # The projection the agent applied, with its own coefficient.
    eps = torch.finfo(gdtype).eps
    worst = 0.0
    if report.regime == "project":
        for p, g, r in zip(params, read, ref):
            want = g - report.projection_coeff * r
            got = p.grad.detach().double().cpu()
            # Relative to the operands: where they cancel, |want| says nothing of the rounding.
            ulp = eps * torch.clamp(torch.maximum(g.abs(), (report.projection_coeff * r).abs()),
                                    min=torch.finfo(gdtype).tiny)
            worst = max(worst, float(((got - want).abs() / ulp).max()))
    ok = stats_error <= STATS_TOLERANCE and report.regime == "project" and worst <= PROJECTION_ULPS
    return {"device": str(device), "path": path, "passes": report.passes, "grad_dtype": str(gdtype)[6:],
            "snapshot_dtype": str(sdtype)[6:], "regime": report.regime, "stats_relative_error": stats_error,
            "projection_error_ulps": worst, "ok": ok}


def _time(torch: Any, device: Any, path: Path, reps: int = 5) -> float:
    """Median seconds of a local-mode step over _TIMING_TENSORS fp32 tensors."""
    params = [torch.nn.Parameter(torch.zeros(_TIMING_ELEMENTS, device=device)) for _ in range(_TIMING_TENSORS)]
    for p in params:
        p.grad = torch.randn(_TIMING_ELEMENTS, device=device)
    agent = gac.Agent(0.05, 0.3, mode="monitor", passes=path)
    times = []
    for step in range(1, reps + 2):
        _sync(torch, device)
        t0 = time.perf_counter()
        agent.step(step, params)
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    times = sorted(times[1:])  # the first step builds the plan
    return times[len(times) // 2]


def run() -> Dict[str, Any]:
    """Every device and path: {"devices", "gpu", "results", "timings", "problems"}."""
    import torch

    from gac import _agent

    gpus = {d["index"]: d for d in _agent.cuda_devices()["devices"]}
    devices = _devices(torch)
    out: Dict[str, Any] = {"devices": [str(d) for d in devices], "gpu": len(devices) > 1, "results": [],
                           "timings": [], "problems": []}
    for device in devices:
        for path in _paths(device, gpus):
            for gdtype in (torch.float32, torch.bfloat16, torch.float16):
                for sdtype in (torch.float32, torch.bfloat16):
                    try:
                        r = _check(torch, device, path, gdtype, sdtype)
                    except Exception as e:  # a path that does not run here is a finding, not a crash
                        r = {"device": str(device), "path": path, "grad_dtype": str(gdtype)[6:],
                             "snapshot_dtype": str(sdtype)[6:], "error": f"{type(e).__name__}: {e}", "ok": False}
                    out["results"].append(r)
                    if not r["ok"]:
                        out["problems"].append(f"{r['device']} {path} {r['grad_dtype']}/{r['snapshot_dtype']}: "
                                               + r.get("error", f"statistics off by {r['stats_relative_error']:.2e}, "
                                                       f"projection off by {r['projection_error_ulps']:.2f} ulp"))
            try:
                out["timings"].append({"device": str(device), "path": path, "step_seconds": _time(torch, device, path),
                                       "elements": _TIMING_TENSORS * _TIMING_ELEMENTS})
            except Exception as e:
                out["problems"].append(f"{device} {path}: timing failed: {type(e).__name__}: {e}")
    return out


def report_lines(out: Dict[str, Any]) -> List[str]:
    lines = []
    if not out["gpu"]:
        lines.append("no GPU found: the CPU's paths are checked")
    lines.append(f"{'device':<8} {'path':<8} {'grad':<9} {'snapshot':<9} {'stats rel. error':>17} "
                 f"{'projection (ulp)':>17}  ok")
    for r in out["results"]:
        if "error" in r:
            lines.append(f"{r['device']:<8} {r['path']:<8} {r['grad_dtype']:<9} {r['snapshot_dtype']:<9} "
                         f"ERROR: {r['error']}")
            continue
        lines.append(f"{r['device']:<8} {r['path']:<8} {r['grad_dtype']:<9} {r['snapshot_dtype']:<9} "
                     f"{r['stats_relative_error']:>17.2e} {r['projection_error_ulps']:>17.2f}  "
                     + ("yes" if r["ok"] else "NO"))
    for t in out["timings"]:
        lines.append(f"{t['device']} {t['path']}: a monitor-mode step over {t['elements']:,} fp32 elements "
                     f"takes {1e3 * t['step_seconds']:.2f} ms (median)")
    return lines
