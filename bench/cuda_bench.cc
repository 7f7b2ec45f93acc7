// cuda_bench: the agent's fused CUDA passes against baselines measured in the
// same process on the same GPU, reported as ratios (docs/BENCHMARKS.md,
// "CUDA passes"; targets in docs/BENCHMARKS.md). Needs a CUDA build of LibTorch.
//
//   cuda_bench [--quick] [--reps N]
//
// Workloads: (a) 50 M elements in 200 tensors, fp32 gradients with an fp32
// snapshot, bf16 gradients with an fp32 and with a bf16 snapshot; (b) 2,000
// tensors of 1,024 elements, fp32 and bf16 gradients (fp32 snapshot); and
// 2,000 tensors of 16 elements for the host overhead.
//
// Measured per workload (GPU times from CUDA events on the current stream,
// medians over --reps; the L2 cache is flushed by a 256 MiB memset before
// every timed operation, fused passes and baselines alike):
//   stats       MultiTensorPasses::EnqueueStatistics: the per-chunk kernel and
//               the fp64 reduction (2 launches); bytes = g + p read
//   stats+read  the same plus the copy of the sums to the host and the wait
//               (wall time of the step's synchronous part)
//   project     EnqueueProjectSnapshot: g and p read and written
//   snapshot    EnqueueSnapshot: g read, p written
//   cat+3dot    at::cat of the gradients and of the snapshots (as fp32), then
//               at::dot x3 and .item() each: what the passes replace
//   foreach     at::_foreach_mul(g, p) summed per tensor, at::_foreach_norm of
//               g and of p, stacked and summed, one copy to the host
//   agent step  Agent::Step on the CUDA parameters (local mode, every step in
//               the project regime, gradients restored untimed), wall time
// against the device-to-device copy bandwidth of the GPU (cudaMemcpyAsync of
// 256 MiB, bytes read + written). Host overhead: the CPU time to enqueue a
// step (SetTensors on an unchanged list + statistics + snapshot, no wait) and
// the wall time of Agent::Step, for 2,000 tensors.
//
// A benchmark, not a test: it asserts nothing about timing and exits
// non-zero only when a pass fails.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "agent/src/cuda/cuda_passes.h"
#include "gac/agent/agent.h"

namespace {

using Clock = std::chrono::steady_clock;
using gac::bench::Median;
using gac::bench::Seconds;
using gac::agent::Agent;
using gac::agent::AgentOptions;
using gac::agent::Mode;
using gac::agent::SnapshotDtype;
namespace cuda = gac::agent::cuda;

constexpr double kGB = 1e9;


[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "cuda_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Fail(std::string(what) + ": " + cudaGetErrorString(e));
}
void Check(const gac::base::Status& st, const char* what) {
  if (!st.ok()) Fail(std::string(what) + ": " + st.ToString());
}

struct Args {
  bool quick = false;
  int reps = 0;  // 0: 15, or 3 with --quick
};

[[noreturn]] void Usage(const char* argv0, int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: %s [--quick] [--reps N]\n"
               "  --quick   small sizes (smoke run; figures are not meaningful)\n"
               "  --reps N  timed repetitions per measurement, median reported (default 15; 3 with --quick)\n",
               argv0);
  std::exit(code);
}

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      args.quick = true;
    } else if (a == "--reps" && i + 1 < argc) {
      args.reps = std::atoi(argv[++i]);
      if (args.reps < 1 || args.reps > 100000) Usage(argv[0], 2);
    } else if (a == "--help" || a == "-h") {
      Usage(argv[0], 0);
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a.c_str());
      Usage(argv[0], 2);
    }
  }
  if (args.reps == 0) args.reps = args.quick ? 3 : 15;
  return args;
}

// ---------------------------------------------------------------------------
// GPU timing.

cudaStream_t CurrentStream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// Evicts the L2 cache (and leaves nothing of the next operation's data in it).
class L2Flush {
 public:
  L2Flush() : buf_(at::empty({256 << 20}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA))) {}
  void operator()() const {
    Check(cudaMemsetAsync(buf_.data_ptr(), 1, static_cast<std::size_t>(buf_.numel()), CurrentStream()), "flush");
  }

 private:
  at::Tensor buf_;
};

// Median GPU seconds of op(), each run preceded by an L2 flush; `warmup`
// untimed runs first.
double GpuSeconds(const L2Flush& flush, int reps, const std::function<void()>& op, int warmup = 2) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  const cudaStream_t s = CurrentStream();
  for (int i = 0; i < warmup; ++i) op();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    flush();
    Check(cudaEventRecord(start, s), "cudaEventRecord");
    op();
    Check(cudaEventRecord(stop, s), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Median(t);
}

// Median wall seconds of op() (which must wait for its own results), each
// run preceded by an L2 flush that has completed.
double WallSeconds(const L2Flush& flush, int reps, const std::function<void()>& op, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) op();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    flush();
    Check(cudaStreamSynchronize(CurrentStream()), "cudaStreamSynchronize");
    const auto a = Clock::now();
    op();
    t.push_back(Seconds(a, Clock::now()));
  }
  return Median(t);
}

// ---------------------------------------------------------------------------
// Workloads.

struct Spec {
  std::string name;
  int tensors;
  std::int64_t elements;  // per tensor
  at::ScalarType grad;
  at::ScalarType snap;
};

const char* DtypeName(at::ScalarType t) { return t == at::kFloat ? "f32" : t == at::kBFloat16 ? "bf16" : "f16"; }

cuda::ElemType ToElem(at::ScalarType t) {
  return t == at::kFloat ? cuda::ElemType::kF32 : t == at::kBFloat16 ? cuda::ElemType::kBF16 : cuda::ElemType::kF16;
}

// Gradient sets A and B (cosine ~0.29) and a snapshot per tensor, separate
// allocations as a trainer's gradients are.
struct Data {
  std::vector<at::Tensor> a, b, p;
  double bytes_g = 0.0, bytes_p = 0.0;

  static Data Make(const Spec& s) {
    Data d;
    const auto opts = at::TensorOptions().device(at::kCUDA);
    for (int i = 0; i < s.tensors; ++i) {
      const at::Tensor base = at::randn({s.elements}, opts);
      d.a.push_back((base + 0.8 * at::randn({s.elements}, opts)).to(s.grad));
      d.b.push_back((base + 0.8 * at::randn({s.elements}, opts)).to(s.grad));
      d.p.push_back(d.b.back().to(s.snap));
    }
    const double n = static_cast<double>(s.tensors) * static_cast<double>(s.elements);
    d.bytes_g = n * static_cast<double>(c10::elementSize(s.grad));
    d.bytes_p = n * static_cast<double>(c10::elementSize(s.snap));
    return d;
  }

  std::vector<cuda::TensorRef> Refs(const std::vector<at::Tensor>& g) const {
    std::vector<cuda::TensorRef> refs(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      refs[i].g = g[i].data_ptr();
      refs[i].p = p[i].data_ptr();
      refs[i].n = g[i].numel();
      refs[i].gt = ToElem(g[i].scalar_type());
    }
    return refs;
  }
};

double CopyBandwidth(const L2Flush& flush, int reps, std::size_t bytes) {
  const auto opts = at::TensorOptions().dtype(at::kByte).device(at::kCUDA);
  const at::Tensor src = at::ones({static_cast<std::int64_t>(bytes)}, opts);
  at::Tensor dst = at::empty({static_cast<std::int64_t>(bytes)}, opts);
  const double t = GpuSeconds(flush, reps, [&] {
    Check(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToDevice, CurrentStream()),
          "cudaMemcpyAsync");
  });
  return 2.0 * static_cast<double>(bytes) / t / kGB;
}

struct Row {
  std::string workload, op;
  double seconds = 0.0;
  double bytes = 0.0;                     // moved by the op (0: not a bandwidth figure)
  double vs_cat = 0.0, vs_foreach = 0.0;  // speedups (0: n/a)
};

void Print(const std::vector<Row>& rows, double copy_gbs) {
  std::printf("%-30s %-12s | %10s %9s %8s | %9s %9s\n", "workload", "op", "time", "GB/s", "of copy", "vs cat",
              "vs foreach");
  for (const Row& r : rows) {
    const double gbs = r.bytes > 0.0 ? r.bytes / r.seconds / kGB : 0.0;
    char gb[16] = "-", of[16] = "-", cat[16] = "-", fe[16] = "-";
    if (gbs > 0.0) {
      std::snprintf(gb, sizeof gb, "%.0f", gbs);
      std::snprintf(of, sizeof of, "%.0f %%", 100.0 * gbs / copy_gbs);
    }
    if (r.vs_cat > 0.0) std::snprintf(cat, sizeof cat, "%.1fx", r.vs_cat);
    if (r.vs_foreach > 0.0) std::snprintf(fe, sizeof fe, "%.1fx", r.vs_foreach);
    std::printf("%-30s %-12s | %7.1f us %9s %8s | %9s %9s\n", r.workload.c_str(), r.op.c_str(), r.seconds * 1e6, gb, of,
                cat, fe);
  }
}

// One workload: the fused passes, the LibTorch baselines and an agent step.
void RunWorkload(const Spec& s, const L2Flush& flush, int reps, std::vector<Row>* rows) {
  std::printf("workload %s...\n", s.name.c_str());
  std::fflush(stdout);
  Data d = Data::Make(s);
  const cudaStream_t stream = CurrentStream();
  auto created = cuda::MultiTensorPasses::Create(ToElem(s.snap));
  if (!created.ok()) Fail("MultiTensorPasses::Create: " + created.status().ToString());
  cuda::MultiTensorPasses& passes = **created;
  const std::vector<cuda::TensorRef> refs = d.Refs(d.a);
  const std::uint64_t launches_before = passes.launches();
  Check(passes.SetTensors(refs.data(), refs.size(), stream), "SetTensors");
  Check(passes.EnqueueStatistics(true, stream), "stats");
  if (!passes.ReadResult(stream).ok()) Fail("ReadResult");
  Check(passes.EnqueueProjectSnapshot(0.5f, false, stream), "project");
  const std::uint64_t step_launches = passes.launches() - launches_before;

  const double t_stats = GpuSeconds(flush, reps, [&] { Check(passes.EnqueueStatistics(true, stream), "stats"); });
  const double t_read = WallSeconds(flush, reps, [&] {
    Check(passes.SetTensors(refs.data(), refs.size(), stream), "SetTensors");
    Check(passes.EnqueueStatistics(true, stream), "stats");
    if (!passes.ReadResult(stream).ok()) Fail("ReadResult");
  });
  // The apply passes rewrite a and p: the data stays finite (coefficient 0.5
  // on a snapshot that is the previous gradient) and sizes do not change.
  const double t_project =
      GpuSeconds(flush, reps, [&] { Check(passes.EnqueueProjectSnapshot(0.5f, false, stream), "project"); });
  const double t_snapshot = GpuSeconds(flush, reps, [&] { Check(passes.EnqueueSnapshot(stream), "snapshot"); });

  const double t_cat = WallSeconds(flush, reps, [&] {
    const at::Tensor g = at::cat(d.a).to(at::kFloat);
    const at::Tensor p = at::cat(d.p).to(at::kFloat);
    volatile double sink = at::dot(g, p).item<double>() + at::dot(g, g).item<double>() + at::dot(p, p).item<double>();
    (void)sink;
  });
  const double t_foreach = WallSeconds(flush, reps, [&] {
    std::vector<at::Tensor> g32, p32;
    if (s.grad != at::kFloat || s.snap != at::kFloat) {
      for (std::size_t i = 0; i < d.a.size(); ++i) {
        g32.push_back(d.a[i].to(at::kFloat));
        p32.push_back(d.p[i].to(at::kFloat));
      }
    }
    const std::vector<at::Tensor>& g = g32.empty() ? d.a : g32;
    const std::vector<at::Tensor>& p = p32.empty() ? d.p : p32;
    std::vector<at::Tensor> dots;
    for (const at::Tensor& prod : at::_foreach_mul(g, p)) dots.push_back(prod.sum());
    const at::Tensor gg = at::stack(at::_foreach_norm(g)).square().sum();
    const at::Tensor pp = at::stack(at::_foreach_norm(p)).square().sum();
    const at::Tensor all = at::stack({at::stack(dots).sum(), gg, pp}).cpu();
    (void)all;
  });

  // Agent::Step end to end: gradients restored from A or B before each step
  // (untimed), thresholds such that every step projects.
  AgentOptions o;
  o.thresholds.c_low = 1e-3;
  o.thresholds.c_high = 1.0;
  o.snapshot_dtype = s.snap == at::kBFloat16 ? SnapshotDtype::kBFloat16 : SnapshotDtype::kFloat32;
  auto agent = Agent::Create(o);
  if (!agent.ok()) Fail("Agent::Create: " + agent.status().ToString());
  std::vector<at::Tensor> params;
  for (const at::Tensor& g : d.a) params.push_back(at::zeros_like(g).set_requires_grad(true));
  std::vector<double> step_t, stats_t;
  for (int step = 1; step <= reps + 2; ++step) {
    const std::vector<at::Tensor>& src = step % 2 != 0 ? d.a : d.b;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = src[i].clone();
    flush();
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto a = Clock::now();
    auto r = (*agent)->Step(step, params);
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // the apply pass too
    const double wall = Seconds(a, Clock::now());
    if (!r.ok()) Fail("Agent::Step: " + r.status().ToString());
    if (step > 2) {
      step_t.push_back(wall);
      stats_t.push_back(r->stats_seconds);
    }
  }

  const double bytes_stats = d.bytes_g + d.bytes_p;
  const std::string w = s.name;
  rows->push_back({w, "stats", t_stats, bytes_stats, t_cat / t_stats, t_foreach / t_stats});
  rows->push_back({w, "stats+read", t_read, bytes_stats, t_cat / t_read, t_foreach / t_read});
  rows->push_back({w, "project", t_project, 2.0 * bytes_stats, 0.0, 0.0});
  rows->push_back({w, "snapshot", t_snapshot, bytes_stats, 0.0, 0.0});
  rows->push_back({w, "cat+3dot", t_cat, bytes_stats, 0.0, 0.0});
  rows->push_back({w, "foreach", t_foreach, bytes_stats, 0.0, 0.0});
  rows->push_back({w, "agent step", Median(step_t), 3.0 * bytes_stats, t_cat / Median(stats_t), 0.0});
  std::printf("  kernel launches per step: %llu; chunk table %s, %lld chunks\n",
              static_cast<unsigned long long>(step_launches), passes.inline_table() ? "inline" : "in device memory",
              static_cast<long long>(passes.num_chunks()));
}

// CPU time to enqueue a step (no wait), and Agent::Step wall time, 2,000 x 16.
void HostOverhead(int reps) {
  const int tensors = 2000;
  const std::int64_t elements = 16;
  std::printf("\nHost overhead, %d tensors x %lld fp32 elements (warm, no L2 flush)\n", tensors,
              static_cast<long long>(elements));
  const Spec s{"overhead", tensors, elements, at::kFloat, at::kFloat};
  Data d = Data::Make(s);
  const cudaStream_t stream = CurrentStream();
  auto created = cuda::MultiTensorPasses::Create(cuda::ElemType::kF32);
  if (!created.ok()) Fail("MultiTensorPasses::Create: " + created.status().ToString());
  cuda::MultiTensorPasses& passes = **created;
  const std::vector<cuda::TensorRef> refs = d.Refs(d.a);
  std::vector<double> enqueue, read;
  for (int i = 0; i < reps + 5; ++i) {
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto a = Clock::now();
    Check(passes.SetTensors(refs.data(), refs.size(), stream), "SetTensors");
    Check(passes.EnqueueStatistics(true, stream), "stats");
    Check(passes.EnqueueSnapshot(stream), "snapshot");
    const auto b = Clock::now();
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto c = Clock::now();
    Check(passes.SetTensors(refs.data(), refs.size(), stream), "SetTensors");
    Check(passes.EnqueueStatistics(true, stream), "stats");
    if (!passes.ReadResult(stream).ok()) Fail("ReadResult");
    Check(passes.EnqueueSnapshot(stream), "snapshot");
    const auto e = Clock::now();
    if (i >= 5) {
      enqueue.push_back(Seconds(a, b));
      read.push_back(Seconds(c, e));
    }
  }
  AgentOptions o;
  o.mode = gac::controller::Mode::kMonitor;
  auto agent = Agent::Create(o);
  if (!agent.ok()) Fail("Agent::Create: " + agent.status().ToString());
  std::vector<at::Tensor> params;
  for (const at::Tensor& g : d.a) {
    params.push_back(at::zeros_like(g).set_requires_grad(true));
    params.back().mutable_grad() = g;
  }
  std::vector<double> step_t;
  for (int step = 1; step <= reps + 5; ++step) {
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto a = Clock::now();
    auto r = (*agent)->Step(step, params);
    const double wall = Seconds(a, Clock::now());
    if (!r.ok()) Fail("Agent::Step: " + r.status().ToString());
    if (step > 5) step_t.push_back(wall);
  }
  std::printf("  enqueue (SetTensors unchanged + statistics + snapshot, no wait): %6.1f us   [target <= 50 us]\n",
              Median(enqueue) * 1e6);
  std::printf("  synchronous step (the same + copy of the sums + wait):          %6.1f us\n", Median(read) * 1e6);
  std::printf("  Agent::Step, monitor mode (gather + the above):                 %6.1f us\n", Median(step_t) * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  if (!at::hasCUDA()) {
    // 77: "skipped" to ctest (the smoke test on a machine without a GPU).
    std::fprintf(stderr, "cuda_bench: no CUDA device: nothing to measure\n");
    return 77;
  }
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("gac cuda_bench%s\n", args.quick ? " --quick (smoke sizes; figures not meaningful)" : "");
  std::printf("gpu: %s (sm_%d%d, %d SMs, %.0f GiB), driver %d.%d, runtime %d.%d\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30), driver / 1000,
              (driver % 1000) / 10, runtime / 1000, (runtime % 1000) / 10);
  std::printf("reps %d (medians); L2 flushed (256 MiB memset) before every timed operation but the host overhead\n\n",
              args.reps);

  const L2Flush flush;
  const double copy_gbs =
      CopyBandwidth(flush, args.reps, args.quick ? (std::size_t{16} << 20) : (std::size_t{256} << 20));
  std::printf("device-to-device copy (cudaMemcpyAsync, %d MiB): %.0f GB/s (read + written)\n\n", args.quick ? 16 : 256,
              copy_gbs);

  const int big_tensors = 200;
  const std::int64_t big = args.quick ? 2500 : 250000;
  const int small_tensors = args.quick ? 200 : 2000;
  std::vector<Spec> specs = {
      {"(a) 200 x " + std::to_string(big) + " f32/f32", big_tensors, big, at::kFloat, at::kFloat},
      {"(a) 200 x " + std::to_string(big) + " bf16/f32", big_tensors, big, at::kBFloat16, at::kFloat},
      {"(a) 200 x " + std::to_string(big) + " bf16/bf16", big_tensors, big, at::kBFloat16, at::kBFloat16},
      {"(b) " + std::to_string(small_tensors) + " x 1024 f32/f32", small_tensors, 1024, at::kFloat, at::kFloat},
      {"(b) " + std::to_string(small_tensors) + " x 1024 bf16/f32", small_tensors, 1024, at::kBFloat16, at::kFloat},
  };
  std::vector<Row> rows;
  for (const Spec& s : specs) RunWorkload(s, flush, args.reps, &rows);
  std::printf("\n");
  Print(rows, copy_gbs);
  std::printf(
      "(stats: GB/s of bytes read; project: read + written; snapshot: g read + p written; agent step: stats +\n"
      " projection, 3x (g + p) bytes; agent step \"vs cat\" compares its stats_seconds with cat+3dot.\n"
      " Targets: stats >= 80 %% of copy, >= 3x cat+3dot; host overhead <= 50 us for 2,000 tensors)\n");
  HostOverhead(args.reps);
  return 0;
}
