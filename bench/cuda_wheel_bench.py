#!/usr/bin/env python3
"""cuda_wheel_bench: the installed gac wheel's CUDA passes (its NVRTC 12.9
kernels, through gac.Agent on torch tensors) against baselines measured in
the same process on the same GPU: the device-to-device copy bandwidth,
torch._foreach_norm and torch.nn.utils.clip_grad_norm_(foreach=True). The
counterpart of bench/cuda_bench.cc that needs no build: cuda_bench links
LibTorch and compiles the kernels with nvcc, so it times other kernels than
the wheel ships and needs a C++ build on the GPU machine; this one needs the
wheel and torch only (scripts/gpu_lease.sh runs it on a GPU lease).

Workloads (cuda_bench's): (a) 50 M elements in 200 tensors, gradient/snapshot
f32/f32, bf16/f32, bf16/bf16; (b) 2,000 tensors of 1,024, f32/f32 and
bf16/f32; (c) the 291 parameter shapes of Llama-3-8B (8,030,261,248
elements) in bf16 with a bf16 snapshot (--workloads leaves it out; skipped
with a line saying so when the GPU lacks the memory, about 70 GB); and the
host overhead on 2,000 tensors of 16.

Rows per workload (medians over --reps; the L2 cache flushed by a 256 MiB
fill before every timed operation):
  stats         the statistics kernels of a step (gac_stats_*, then
                gac_finalize: from the first's start to the second's end), as
                the CUDA profiler (torch.profiler, CUPTI) times them; bytes:
                g + p read
  project       the projection + snapshot kernel of a local step in the
                project regime (g and p read and written)
  snapshot      the snapshot kernel of a monitor step (g read, p written)
  stats+read    report.stats_seconds of a monitor step: the host's planning,
                the statistics, the copy of the sums to the host and the wait
  monitor step  agent.step in monitor mode until its GPU work is done
                (statistics + snapshot: what gac.attach costs by default)
  local step    agent.step in local mode until its GPU work is done
                (statistics + projection, every step in the project regime)
  foreach_norm  torch._foreach_norm of the gradients and the norm of the
                norms, GPU time (the norm every trainer computes)
  clip          clip_grad_norm_(params, 1e30, foreach=True), GPU time (and
                "clip wall", until its GPU work is done, beside the steps)
Ratios: "of copy" is the row's GB/s over the device-to-device copy's
(cudaMemcpyAsync of 256 MiB through tensor.copy_, bytes read + written);
"vs norm" and "vs clip" are foreach_norm's and clip's time over the row's
(wall rows against clip wall). Targets (docs/BENCHMARKS.md): stats >= 80 %
of copy and faster than clip; monitor step <= 1.0x clip wall.

Before timing, each workload checks the wheel's result against torch in
fp64 (cosine and norm of two gradient sets, relative error <= 1e-6 asserted):
the bench exits 1 when a check fails, 77 when --device cuda finds no GPU.

    python bench/cuda_wheel_bench.py [--reps N] [--workloads a,b,c,o] [--quick] [--device cuda|cpu]

--quick (smoke sizes; the Llama shapes divided by 16,384) with --device cpu
runs every line of it without a GPU (scripts/gpu_lease.sh --dry-run):
the figures are then meaningless and the kernel rows absent.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

import gac

GB = 1e9
FLUSH_BYTES = 256 << 20


def llama3_8b_sizes() -> List[int]:
    """Llama-3-8B's parameters in state-dict order: vocabulary 128,256,
    hidden 4,096, 32 layers, MLP 14,336, 8 key/value heads of 128, RMSNorm
    weights, an untied lm_head (as bench/cuda_bench.cc)."""
    vocab, hidden, mlp, kv = 128256, 4096, 14336, 8 * 128
    sizes = [vocab * hidden]
    for _ in range(32):
        sizes += [hidden * hidden, kv * hidden, kv * hidden, hidden * hidden, mlp * hidden, mlp * hidden,
                  hidden * mlp, hidden, hidden]
    return sizes + [hidden, vocab * hidden]


assert len(llama3_8b_sizes()) == 291 and sum(llama3_8b_sizes()) == 8_030_261_248

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
COPY_GBS = [0.0]  # the device-to-device copy's GB/s, measured first (main)


class Timer:
    """GPU times from CUDA events on the current stream (wall times on the
    CPU), and wall times up to the completion of the device's work."""

    def __init__(self, device: torch.device, flush_bytes: int) -> None:
        self.cuda = device.type == "cuda"
        self.buf = torch.empty(flush_bytes, dtype=torch.uint8, device=device)

    def flush(self) -> None:
        self.buf.fill_(1)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def gpu(self, op: Callable[[], object], reps: int, prepare: Optional[Callable[[], None]] = None,
            warmup: int = 2) -> float:
        for _ in range(warmup):
            if prepare:
                prepare()
            op()
        times = []
        for _ in range(reps):
            if prepare:
                prepare()
            self.flush()
            if self.cuda:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                op()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop) * 1e-3)
            else:
                t0 = time.perf_counter()
                op()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def wall(self, op: Callable[[], object], reps: int, prepare: Optional[Callable[[], None]] = None,
             warmup: int = 2, flush: bool = True) -> Tuple[float, List[object]]:
        """Median wall seconds of op() and the wait for its GPU work, and
        what op returned each time."""
        results: List[object] = []
        for _ in range(warmup):
            if prepare:
                prepare()
            op()
            self.sync()
        times = []
        for _ in range(reps):
            if prepare:
                prepare()
            if flush:
                self.flush()
            self.sync()
            t0 = time.perf_counter()
            results.append(op())
            self.sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), results


class Workload:
    """Gradient sets A and B (cosine about 0.61: a shared N(0, 1) part and
    N(0, 0.8^2) noise each), the gradients the agent reads (a copy of A or
    B, restored before each step), and parameters of the same shapes that
    cost no memory (zero-stride views: the agent and clip_grad_norm_ read
    only .grad)."""

    def __init__(self, name: str, sizes: Sequence[int], grad: torch.dtype, snap: torch.dtype,
                 device: torch.device, seed: int) -> None:
        self.name, self.sizes, self.grad, self.snap = name, list(sizes), grad, snap
        gen = torch.Generator(device=device).manual_seed(seed)
        self.a: List[torch.Tensor] = []
        self.b: List[torch.Tensor] = []
        for n in self.sizes:
            base = torch.randn(n, device=device, generator=gen)
            for bucket in (self.a, self.b):
                noise = torch.randn(n, device=device, generator=gen)
                bucket.append(noise.mul_(0.8).add_(base).to(grad))
                del noise
            del base
        self.grads = [x.clone() for x in self.a]
        zero = torch.zeros((), dtype=grad, device=device)
        self.params = [torch.nn.Parameter(zero.expand(n)) for n in self.sizes]
        for p, g in zip(self.params, self.grads):
            p.grad = g
        self.elements = sum(self.sizes)
        self.bytes_g = self.elements * torch.finfo(grad).bits // 8
        self.bytes_p = self.elements * torch.finfo(snap).bits // 8

    def restore(self, k: int) -> None:
        src = self.a if k % 2 else self.b
        if hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(self.grads, src)
        else:
            for g, s in zip(self.grads, src):
                g.copy_(s)


def needed_bytes(sizes: Sequence[int], grad: torch.dtype, snap: torch.dtype) -> int:
    """Peak device memory of a workload: A, B and the gradients, one agent's
    snapshot, 16 bytes per element of the largest tensor (its fp32
    temporaries while generating it, or its two fp64 copies in the
    reference), and 2 GiB of headroom (the agent's tables, the allocator's
    rounding, the profiler's buffers)."""
    n, m = sum(sizes), max(sizes)
    g, p = torch.finfo(grad).bits // 8, torch.finfo(snap).bits // 8
    return 3 * g * n + p * n + 16 * m + (2 << 30)


def fp64_reference(w: Workload) -> Tuple[float, float, float]:
    """cos(A, B), |A|, |B| in fp64, tensor by tensor."""
    dot = aa = bb = 0.0
    for x, y in zip(w.a, w.b):
        xd, yd = x.double(), y.double()
        dot += float(torch.dot(xd, yd))
        aa += float(torch.dot(xd, xd))
        bb += float(torch.dot(yd, yd))
        del xd, yd
    return dot / math.sqrt(aa * bb), math.sqrt(aa), math.sqrt(bb)


def check_numerics(w: Workload) -> Tuple[bool, str]:
    """Two monitor steps (A, then B) against the fp64 reference."""
    want_cos, norm_a, norm_b = fp64_reference(w)
    agent = gac.Agent(1e-3, 1.0, mode="monitor", snapshot_dtype=w.snap)
    w.restore(1)
    r1 = agent.step(1, w.params)
    w.restore(2)
    r2 = agent.step(2, w.params)
    del agent
    if r2.cosine is None:
        return False, "no cosine on the second step"
    errs = {"cosine": abs(r2.cosine - want_cos), "|g| step 1": abs(r1.grad_norm - norm_a) / norm_a,
            "|g| step 2": abs(r2.grad_norm - norm_b) / norm_b, "|p| step 2": abs(r2.ref_norm - norm_a) / norm_a}
    # A bf16 snapshot of an f32 gradient is rounded: its norm and the cosine
    # are those of the rounded values (the agent's documented behaviour).
    exact = {k: v for k, v in errs.items() if w.snap == torch.float32 or w.grad == w.snap or k.startswith("|g|")}
    ok = all(v <= 1e-6 for v in exact.values()) and r2.regime != "invalid"
    text = ", ".join(f"{k} {v:.1e}" for k, v in errs.items())
    return ok, f"cosine {r2.cosine:.6f} (fp64 {want_cos:.6f}); errors: {text}"


def kernel_times(w: Workload, timer: Timer, reps: int) -> Dict[str, float]:
    """Median device times of the agent's kernels, by name, from the CUDA
    profiler: monitor steps (statistics + snapshot), then local steps
    (statistics + projection). Empty when the profiler saw none of them."""
    from torch.profiler import ProfilerActivity, profile

    spans: Dict[str, List[float]] = {"stats": [], "project": [], "snapshot": []}
    step = 0
    for mode in ("monitor", "local"):  # one agent (one snapshot) at a time
        agent = gac.Agent(1e-3, 1.0, mode=mode, snapshot_dtype=w.snap)
        for k in range(2):  # the plan and the snapshot, outside the profile
            w.restore(k)
            step += 1
            agent.step(step, w.params)
        timer.sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for k in range(reps):
                w.restore(k)
                timer.flush()
                step += 1
                agent.step(step, w.params)
            timer.sync()
        del agent
        # Times in microseconds from this profile's start.
        events = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                        if str(e.device_type).endswith("CUDA") and e.name.startswith("gac_"))
        pending: Optional[float] = None
        for start, end, name in events:
            if name.startswith("gac_stats_"):
                pending = start
            elif name.startswith("gac_finalize") and pending is not None:
                spans["stats"].append((end - pending) * 1e-6)
                pending = None
            elif name.startswith("gac_project_"):
                spans["project"].append((end - start) * 1e-6)
            elif name.startswith("gac_snapshot_"):
                spans["snapshot"].append((end - start) * 1e-6)
    return {k: statistics.median(v) for k, v in spans.items() if v}


class Row:
    def __init__(self, workload: str, op: str, seconds: float, nbytes: float = 0.0,
                 vs_norm: Optional[float] = None, vs_clip: Optional[float] = None) -> None:
        self.workload, self.op, self.seconds, self.nbytes = workload, op, seconds, nbytes
        self.vs_norm, self.vs_clip = vs_norm, vs_clip


def run_workload(w: Workload, timer: Timer, reps: int, rows: List[Row], verdicts: List[str]) -> bool:
    ok, text = check_numerics(w)
    print(f"  numerics against fp64: {'ok' if ok else 'FAILED'}: {text}", flush=True)
    kernels: Dict[str, float] = {}
    if timer.cuda:
        try:
            kernels = kernel_times(w, timer, reps)
        except Exception as e:  # no CUPTI (e.g. under gVisor): the wall rows remain
            print(f"  kernel times: the CUDA profiler failed: {type(e).__name__}: {e}", flush=True)
        if not kernels:
            print("  kernel times: the CUDA profiler recorded none of gac's kernels (stats/project/snapshot rows "
                  "left out)", flush=True)

    def norm_op() -> object:
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(w.grads)))

    def clip_op() -> object:
        return torch.nn.utils.clip_grad_norm_(w.params, 1e30, foreach=True)

    t_norm = timer.gpu(norm_op, reps)
    t_clip = timer.gpu(clip_op, reps)
    t_clip_wall, _ = timer.wall(clip_op, reps)

    state = {"k": 0, "step": 0}

    def prepare() -> None:
        state["k"] += 1
        w.restore(state["k"])

    def agent_op(agent: "gac.Agent") -> Callable[[], object]:
        def op() -> object:
            state["step"] += 1
            return agent.step(state["step"], w.params)
        return op

    monitor = gac.Agent(1e-3, 1.0, mode="monitor", snapshot_dtype=w.snap)
    t_monitor, reports = timer.wall(agent_op(monitor), reps, prepare)
    t_read = statistics.median(r.stats_seconds for r in reports)  # type: ignore[attr-defined]
    del monitor
    local = gac.Agent(1e-3, 1.0, mode="local", snapshot_dtype=w.snap)
    t_local, reports = timer.wall(agent_op(local), reps, prepare)
    regimes = {r.regime for r in reports}  # type: ignore[attr-defined]
    del local
    if regimes != {"project"}:
        print(f"  note: local steps' regimes {sorted(regimes)} (expected project only)")

    g, gp = w.bytes_g, w.bytes_g + w.bytes_p
    name = w.name
    if "stats" in kernels:
        t = kernels["stats"]
        rows.append(Row(name, "stats", t, gp, t_norm / t, t_clip / t))
    rows.append(Row(name, "stats+read", t_read, gp, t_norm / t_read, t_clip / t_read))
    if "project" in kernels:
        rows.append(Row(name, "project", kernels["project"], 2 * gp))
    if "snapshot" in kernels:
        rows.append(Row(name, "snapshot", kernels["snapshot"], gp))
    rows.append(Row(name, "monitor step", t_monitor, 2 * gp, None, t_clip_wall / t_monitor))
    rows.append(Row(name, "local step", t_local, 3 * gp, None, t_clip_wall / t_local))
    rows.append(Row(name, "foreach_norm", t_norm, g))
    rows.append(Row(name, "clip", t_clip, 3 * g))
    rows.append(Row(name, "clip wall", t_clip_wall, 3 * g))
    if "stats" in kernels:
        verdicts.append(f"{name}: stats {100 * gp / kernels['stats'] / GB / COPY_GBS[0]:.0f} % of copy "
                        f"(>= 80 %), {t_clip / kernels['stats']:.2f}x clip's speed (> 1)")
    verdicts.append(f"{name}: monitor step {t_monitor / t_clip_wall:.2f}x clip wall (<= 1.0)")
    return ok


def print_rows(rows: List[Row], copy_gbs: float) -> None:
    print(f"{'workload':32s} {'op':13s} | {'time':>11s} {'GB/s':>7s} {'of copy':>8s} | {'vs norm':>8s} "
          f"{'vs clip':>8s}")
    for r in rows:
        gbs = r.nbytes / r.seconds / GB if r.nbytes and r.seconds > 0 else 0.0
        rate = f"{gbs:.0f}" if gbs else "-"
        of_copy = f"{100 * gbs / copy_gbs:.0f} %" if gbs and copy_gbs else "-"
        vs_norm = f"{r.vs_norm:.2f}x" if r.vs_norm else "-"
        vs_clip = f"{r.vs_clip:.2f}x" if r.vs_clip else "-"
        print(f"{r.workload:32s} {r.op:13s} | {r.seconds * 1e6:8.1f} us {rate:>7s} {of_copy:>8s} | "
              f"{vs_norm:>8s} {vs_clip:>8s}")


def host_overhead(device: torch.device, tensors: int, reps: int, timer: Timer) -> None:
    w = Workload(f"{tensors} x 16 f32", [16] * tensors, torch.float32, torch.float32, device, 5)
    for mode in ("monitor", "local"):
        agent = gac.Agent(1e-3, 1.0, mode=mode)
        state = {"step": 0}

        def op() -> object:
            state["step"] += 1
            return agent.step(state["step"], w.params)

        t, reports = timer.wall(op, reps, None, warmup=5, flush=False)
        core = statistics.median(r.agent_overhead_seconds for r in reports)  # type: ignore[attr-defined]
        print(f"  agent.step, {mode} mode, {w.name}: {t * 1e6:7.1f} us until done (the C++ core's own "
              f"{core * 1e6:.1f} us); targets: Python <= 1,300 us, the core's enqueue <= 50 us")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--reps", type=int, default=0, help="timed repetitions per figure (default 15, 3 with --quick)")
    ap.add_argument("--workloads", default="a,b,c,o", help="which of a, b, c (Llama-3-8B), o (host overhead)")
    ap.add_argument("--quick", action="store_true", help="smoke sizes: the figures mean nothing")
    args = ap.parse_args(argv)
    reps = args.reps or (3 if args.quick else 15)
    wanted = set(args.workloads.split(","))
    if not wanted <= {"a", "b", "c", "o"}:
        ap.error(f"--workloads: unknown {sorted(wanted - {'a', 'b', 'c', 'o'})}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cuda_wheel_bench: no CUDA device: nothing to measure", file=sys.stderr)
        return 77
    device = torch.device(args.device)
    from gac import _agent

    build = _agent.build_info()
    print(f"gac cuda_wheel_bench{' --quick (smoke sizes: figures not meaningful)' if args.quick else ''}: "
          f"gac {gac.__version__} ({gac.__file__}), kernels {build['cuda_compiler']} "
          f"{' '.join(build['cuda_archs'])}, runtime {build['cuda_runtime']}; torch {torch.__version__}")
    if device.type == "cuda":
        prop = torch.cuda.get_device_properties(0)
        found = _agent.cuda_devices()
        image = found["devices"][0]["kernels"] if found["devices"] else None
        print(f"gpu: {prop.name} (sm_{prop.major}{prop.minor}, {prop.multi_processor_count} SMs, "
              f"{prop.total_memory / 2**30:.0f} GiB), driver {found['driver']}, gac's image for it: {image}")
    else:
        print("device: cpu (the smoke run of --dry-run: no kernel rows)")
    print(f"reps {reps} (medians); L2 flushed before every timed operation but the host overhead\n", flush=True)

    timer = Timer(device, FLUSH_BYTES if not args.quick else 1 << 20)
    copy_bytes = (256 << 20) if not args.quick else (16 << 20)
    src = torch.ones(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t_copy = timer.gpu(lambda: dst.copy_(src), reps)
    COPY_GBS[0] = 2 * copy_bytes / t_copy / GB
    del src, dst
    print(f"device-to-device copy ({copy_bytes >> 20} MiB): {COPY_GBS[0]:.0f} GB/s (read + written)\n", flush=True)

    big, small, scale = (2500, 200, 16384) if args.quick else (250_000, 2000, 1)
    specs: List[Tuple[str, List[int], torch.dtype, torch.dtype]] = []
    if "a" in wanted:
        for g_name, p_name in (("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16")):
            specs.append((f"(a) 200 x {big} {g_name}/{p_name}", [big] * 200, DTYPES[g_name], DTYPES[p_name]))
    if "b" in wanted:
        for g_name, p_name in (("f32", "f32"), ("bf16", "f32")):
            specs.append((f"(b) {small} x 1024 {g_name}/{p_name}", [1024] * small, DTYPES[g_name], DTYPES[p_name]))
    if "c" in wanted:
        sizes = [max(n // scale, 1) for n in llama3_8b_sizes()]
        label = "(c) llama3-8b" + (f"/{scale}" if scale > 1 else "")
        specs.append((f"{label} bf16/bf16", sizes, torch.bfloat16, torch.bfloat16))
        print(f"(c) llama3-8b: {len(sizes)} tensors, {sum(sizes):,} parameters, largest {max(sizes):,}\n")

    rows: List[Row] = []
    verdicts: List[str] = []
    ok = True
    for seed, (name, sizes, gt, pt) in enumerate(specs):
        print(f"workload {name}...", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            free = torch.cuda.mem_get_info()[0]
            need = needed_bytes(sizes, gt, pt)
            if need > free:
                print(f"  skipped: needs {need / GB:.1f} GB of device memory, {free / GB:.1f} GB free", flush=True)
                continue
        t0 = time.perf_counter()
        w = Workload(name, sizes, gt, pt, device, seed)
        ok &= run_workload(w, timer, reps, rows, verdicts)
        del w
        print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    print()
    print_rows(rows, COPY_GBS[0])
    print("(stats, project, snapshot: the kernels' device time (CUDA profiler); stats+read: report.stats_seconds; "
          "monitor/local step and clip wall: until the GPU is done; foreach_norm, clip: GPU time. "
          "vs norm / vs clip: their time over the row's)")
    if "o" in wanted:
        print("\nHost overhead (warm, no L2 flush)")
        host_overhead(device, 200 if args.quick else 2000, reps * (10 if not args.quick else 1), timer)
    print("\nTargets:")
    for v in verdicts:
        print(f"  {v}")
    print(f"\ncuda_wheel_bench: {'numerics ok' if ok else 'a numerics check FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
