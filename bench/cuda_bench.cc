// cuda_bench: the agent's fused CUDA passes against baselines measured in the
// same process on the same GPU, reported as ratios (docs/BENCHMARKS.md,
// "CUDA passes"; targets in docs/BENCHMARKS.md). Needs a CUDA build of LibTorch.
//
//   cuda_bench [--quick] [--reps N] [--model llama3-8b|none]
//
// Workloads: (a) 50 M elements in 200 tensors, fp32 gradients with an fp32
// snapshot, bf16 gradients with an fp32 and with a bf16 snapshot; (b) 2,000
// tensors of 1,024 elements, fp32 and bf16 gradients (fp32 snapshot); (c) the
// parameter shapes of Llama-3-8B (291 tensors, 8,030,261,248 elements, as
// flat tensors), bf16 gradients with a bf16 snapshot (--model; on by default,
// off with --quick); and 2,000 tensors of 16 elements for the host overhead.
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
//   clip        torch.nn.utils.clip_grad_norm_ as torch 2.x runs it with
//               foreach (TimeClip), the cost every trainer already pays
//   agent step  Agent::Step on the CUDA parameters (local mode, every step in
//               the project regime, gradients restored untimed), wall time
// against the device-to-device copy bandwidth of the GPU (cudaMemcpyAsync of
// 256 MiB, bytes read + written). Host overhead: the CPU time to enqueue a
// step (SetTensors on an unchanged list + statistics + snapshot, no wait) and
// the wall time of Agent::Step, for 2,000 tensors.
//
// Device memory: a workload holds gradient sets A and B and a snapshot (3 x
// 16 GB for (c) in bf16); a workload, a baseline or the agent step whose peak
// (see the *Bytes functions) does not fit the free device memory is skipped,
// with a line that says so. On an 80 GB GPU that should skip cat+3dot and foreach
// for (c).
//
// A benchmark, not a test: it asserts nothing about timing and exits
// non-zero only when a pass fails.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
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
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "agent/src/cuda/cuda_passes.h"
#include "gac/agent/agent.h"

namespace {

using Clock = std::chrono::steady_clock;
using gac::bench::FlagValue;
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
  int reps = 0;       // 0: 15, or 3 with --quick
  std::string model;  // workload (c): "llama3-8b" or "none"; "": llama3-8b, or none with --quick
};

[[noreturn]] void Usage(const char* argv0, int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: %s [--quick] [--reps N] [--model llama3-8b|none]\n"
               "  --quick   small sizes (smoke run; figures are not meaningful)\n"
               "  --reps N  timed repetitions per measurement, median reported (default 15; 3 with --quick)\n"
               "  --model   the model-shaped workload (c): Llama-3-8B's parameter shapes in bf16 (48 GB of\n"
               "            device memory), or none (default llama3-8b; none with --quick)\n",
               argv0);
  std::exit(code);
}

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* value = nullptr;
    if (FlagValue(argc, argv, &i, "--model", &value)) {
      if (value == nullptr || (std::strcmp(value, "llama3-8b") != 0 && std::strcmp(value, "none") != 0)) {
        std::fprintf(stderr, "%s: --model takes llama3-8b or none\n", argv[0]);
        Usage(argv[0], 2);
      }
      args.model = value;
    } else if (a == "--quick") {
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
  if (args.model.empty()) args.model = args.quick ? "none" : "llama3-8b";
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

// The tensors of a workload: one flat tensor per entry of `sizes`.
struct Spec {
  std::string name;
  std::vector<std::int64_t> sizes;  // elements of each tensor, in order
  at::ScalarType grad;
  at::ScalarType snap;

  std::int64_t elements() const {
    std::int64_t n = 0;
    for (const std::int64_t e : sizes) n += e;
    return n;
  }
  std::int64_t largest() const { return sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end()); }
};

const char* DtypeName(at::ScalarType t) { return t == at::kFloat ? "f32" : t == at::kBFloat16 ? "bf16" : "f16"; }

// "<label> <grad>/<snap>", e.g. "(a) 200 x 250000 bf16/f32".
std::string WorkloadName(const std::string& label, at::ScalarType grad, at::ScalarType snap) {
  return label + " " + DtypeName(grad) + "/" + DtypeName(snap);
}

// `tensors` tensors of `elements` elements each.
Spec Uniform(const std::string& label, int tensors, std::int64_t elements, at::ScalarType grad, at::ScalarType snap) {
  return {WorkloadName(label + " " + std::to_string(tensors) + " x " + std::to_string(elements), grad, snap),
          std::vector<std::int64_t>(static_cast<std::size_t>(tensors), elements), grad, snap};
}

// The parameters of Llama-3-8B in the order of its state dict: vocabulary
// 128,256, hidden size 4,096, 32 layers, MLP size 14,336, 8 key/value heads
// of 128 (32 query heads), RMSNorm weights, an lm_head not tied to the
// embedding. 291 tensors, 8,030,261,248 elements.
std::vector<std::int64_t> Llama3_8BSizes() {
  constexpr std::int64_t kVocab = 128256, kHidden = 4096, kMlp = 14336, kKv = 8 * 128;
  constexpr int kLayers = 32;
  std::vector<std::int64_t> sizes = {kVocab * kHidden};  // embed_tokens
  for (int layer = 0; layer < kLayers; ++layer) {
    sizes.insert(sizes.end(), {
        kHidden * kHidden,  // q_proj
        kKv * kHidden,      // k_proj
        kKv * kHidden,      // v_proj
        kHidden * kHidden,  // o_proj
        kMlp * kHidden,     // gate_proj
        kMlp * kHidden,     // up_proj
        kHidden * kMlp,     // down_proj
        kHidden,            // input_layernorm
        kHidden,            // post_attention_layernorm
    });
  }
  sizes.push_back(kHidden);           // norm
  sizes.push_back(kVocab * kHidden);  // lm_head
  return sizes;
}

cuda::ElemType ToElem(at::ScalarType t) {
  return t == at::kFloat ? cuda::ElemType::kF32 : t == at::kBFloat16 ? cuda::ElemType::kBF16 : cuda::ElemType::kF16;
}

// Gradient sets A and B (cosine ~0.61: a shared N(0, 1) part plus N(0, 0.8^2)
// noise each) and a snapshot (a copy of B) per tensor, separate allocations as
// a trainer's gradients are. Generated tensor by tensor: the fp32
// temporaries are those of one tensor.
struct Data {
  std::vector<at::Tensor> a, b, p;
  double bytes_g = 0.0, bytes_p = 0.0;

  static Data Make(const Spec& s) {
    Data d;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
    for (const std::int64_t n : s.sizes) {
      const at::Tensor base = at::randn({n}, f32);
      at::Tensor noisy = at::empty({n}, f32);
      for (std::vector<at::Tensor>* set : {&d.a, &d.b}) {
        noisy.normal_(0.0, 0.8).add_(base);
        set->push_back(noisy.to(s.grad, /*non_blocking=*/false, /*copy=*/true));
      }
      d.p.push_back(d.b.back().to(s.snap, /*non_blocking=*/false, /*copy=*/true));
    }
    const double n = static_cast<double>(s.elements());
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

// Parameters for Agent::Step with the shapes of `grads`: zero-stride views of
// one zero element. The agent reads a parameter's sizes and its .grad, never
// its values, so the parameters cost no device memory.
std::vector<at::Tensor> ParamsFor(const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> params;
  if (grads.empty()) return params;
  const at::Tensor zero = at::zeros({}, grads.front().options());
  for (const at::Tensor& g : grads) params.push_back(zero.expand(g.sizes()).set_requires_grad(true));
  return params;
}

// ---------------------------------------------------------------------------
// Device memory.
//
// What each step allocates at its peak beyond what is held already, from the
// code below (n elements in all, m in the largest tensor, T tensors, G and P
// bytes per gradient and snapshot element), plus a margin: per allocation,
// the caching allocator's rounding (under 2 MiB, and under the allocation's
// own size, at most 4m), and 1 GiB of headroom (cuBLAS workspace, the passes'
// chunk tables and partials, fragmentation).

constexpr double kHeadroom = 1.0 * (1 << 30);

struct Counts {
  double n, m, tensors, g, p;
  explicit Counts(const Spec& s)
      : n(static_cast<double>(s.elements())),
        m(static_cast<double>(s.largest())),
        tensors(static_cast<double>(s.sizes.size())),
        g(static_cast<double>(c10::elementSize(s.grad))),
        p(static_cast<double>(c10::elementSize(s.snap))) {}

  double Margin(double allocations) const { return allocations * std::min(2.0 * (1 << 20), 4.0 * m) + kHeadroom; }
};

// Data::Make: A, B and the snapshot, (2G + P) n, and the two fp32
// temporaries of the largest tensor, 8m.
double DataBytes(const Spec& s) {
  const Counts c(s);
  return (2.0 * c.g + c.p) * c.n + 8.0 * c.m + c.Margin(3.0 * c.tensors + 2.0);
}

// cat+3dot: the concatenated gradients and their fp32 copy, G n + 4n (no
// copy of an fp32 concatenation); then that copy, the concatenated snapshot
// and its fp32 copy, 4n + P n + 4n (again none for fp32).
double CatBytes(const Spec& s) {
  const Counts c(s);
  const double first = c.g * c.n + (c.g != 4.0 ? 4.0 * c.n : 0.0);
  const double second = 4.0 * c.n + c.p * c.n + (c.p != 4.0 ? 4.0 * c.n : 0.0);
  return std::max(first, second) + c.Margin(3.0);
}

// foreach: the fp32 copies of the gradients and of the snapshot unless they
// are fp32, 4n each, and the products of _foreach_mul, 4n, all alive at once
// (the per-tensor sums and norms are scalars).
double ForeachBytes(const Spec& s) {
  const Counts c(s);
  const double copies = (c.g != 4.0 ? 4.0 * c.n : 0.0) + (c.p != 4.0 ? 4.0 * c.n : 0.0);
  return copies + 4.0 * c.n + c.Margin(4.0 * c.tensors);
}

// The agent step, once the workload's snapshot is released: the restored
// gradients, G n, plus one tensor while its clone replaces it, G m; the
// agent's snapshot (bf16 or fp32), P n; the parameters cost nothing
// (ParamsFor).
double AgentBytes(const Spec& s) {
  const Counts c(s);
  const double snap = s.snap == at::kBFloat16 ? 2.0 : 4.0;
  return c.g * (c.n + c.m) + snap * c.n + c.Margin(c.tensors + 2.0);
}

// Device memory free for new allocations, once the caching allocator has
// handed back its unused blocks (the agent's snapshot is a cudaMalloc of its
// own, outside that allocator).
double FreeDeviceBytes() {
  c10::cuda::CUDACachingAllocator::emptyCache();
  std::size_t free = 0, total = 0;
  Check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return static_cast<double>(free);
}

// Whether `bytes` fit the free device memory; if not, says that `what` is
// skipped and why.
bool Fits(const char* what, double bytes) {
  const double free = FreeDeviceBytes();
  if (bytes <= free) return true;
  std::printf("  %s skipped: needs %.1f GB of device memory, %.1f GB free\n", what, bytes / kGB, free / kGB);
  std::fflush(stdout);
  return false;
}

// ---------------------------------------------------------------------------
// Measurements.

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
  double vs_clip = 0.0;                   // speedup over clip_grad_norm_ (0: n/a)
};

void Print(const std::vector<Row>& rows, double copy_gbs) {
  std::printf("%-30s %-12s | %10s %9s %8s | %9s %10s %9s\n", "workload", "op", "time", "GB/s", "of copy", "vs cat",
              "vs foreach", "vs clip");
  for (const Row& r : rows) {
    const double gbs = r.bytes > 0.0 ? r.bytes / r.seconds / kGB : 0.0;
    char gb[16] = "-", of[16] = "-", cat[16] = "-", fe[16] = "-", clip[16] = "-";
    if (gbs > 0.0) {
      std::snprintf(gb, sizeof gb, "%.0f", gbs);
      std::snprintf(of, sizeof of, "%.0f %%", 100.0 * gbs / copy_gbs);
    }
    if (r.vs_cat > 0.0) std::snprintf(cat, sizeof cat, "%.1fx", r.vs_cat);
    if (r.vs_foreach > 0.0) std::snprintf(fe, sizeof fe, "%.1fx", r.vs_foreach);
    if (r.vs_clip > 0.0) std::snprintf(clip, sizeof clip, "%.2fx", r.vs_clip);
    std::printf("%-30s %-12s | %7.1f us %9s %8s | %9s %10s %9s\n", r.workload.c_str(), r.op.c_str(), r.seconds * 1e6,
                gb, of, cat, fe, clip);
  }
}

struct PassTimes {
  double stats = 0.0, read = 0.0, project = 0.0, snapshot = 0.0;
};

// The fused passes over A and the snapshot. They rewrite A and the snapshot:
// the data stays finite (coefficient 0.5 on a snapshot that is the previous
// gradient) and sizes do not change.
PassTimes TimePasses(const Spec& s, const Data& d, const L2Flush& flush, int reps) {
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

  PassTimes t;
  t.stats = GpuSeconds(flush, reps, [&] { Check(passes.EnqueueStatistics(true, stream), "stats"); });
  t.read = WallSeconds(flush, reps, [&] {
    Check(passes.SetTensors(refs.data(), refs.size(), stream), "SetTensors");
    Check(passes.EnqueueStatistics(true, stream), "stats");
    if (!passes.ReadResult(stream).ok()) Fail("ReadResult");
  });
  t.project = GpuSeconds(flush, reps, [&] { Check(passes.EnqueueProjectSnapshot(0.5f, false, stream), "project"); });
  t.snapshot = GpuSeconds(flush, reps, [&] { Check(passes.EnqueueSnapshot(stream), "snapshot"); });
  std::printf("  kernel launches per step: %llu; chunk table %s, %lld chunks\n",
              static_cast<unsigned long long>(step_launches), passes.inline_table() ? "inline" : "in device memory",
              static_cast<long long>(passes.num_chunks()));
  return t;
}

double TimeCat(const Data& d, const L2Flush& flush, int reps) {
  return WallSeconds(flush, reps, [&] {
    const at::Tensor g = at::cat(d.a).to(at::kFloat);
    const at::Tensor p = at::cat(d.p).to(at::kFloat);
    volatile double sink = at::dot(g, p).item<double>() + at::dot(g, g).item<double>() + at::dot(p, p).item<double>();
    (void)sink;
  });
}

double TimeForeach(const Spec& s, const Data& d, const L2Flush& flush, int reps) {
  return WallSeconds(flush, reps, [&] {
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
}

// torch.nn.utils.clip_grad_norm_(grads, max_norm) as torch 2.x runs it on
// the gradients of one device with foreach (its default there): the norm of
// each tensor, the norm of those norms, the clip coefficient clamped at 1,
// and every gradient scaled by it in place, with no wait for the host. The
// limit is far above the norm, so the scale is 1 and the values stay as they
// are, but the pass runs, as in a trainer whose norm is under its limit.
double TimeClip(const Data& d, const L2Flush& flush, int reps) {
  return GpuSeconds(flush, reps, [&] {
    const std::vector<at::Tensor> norms = at::_foreach_norm(d.a, 2);
    const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
    const at::Tensor coef = at::clamp_max(1e30 / (total + 1e-6), 1.0);
    at::_foreach_mul_(d.a, coef);
  });
}

struct AgentTimes {
  double step = 0.0;   // wall time of Agent::Step and its apply pass
  double stats = 0.0;  // the step's stats_seconds
};

// Agent::Step end to end: gradients restored from A or B before each step
// (untimed), thresholds such that every step projects.
AgentTimes TimeAgentStep(const Spec& s, const Data& d, const L2Flush& flush, int reps) {
  const cudaStream_t stream = CurrentStream();
  AgentOptions o;
  o.thresholds.c_low = 1e-3;
  o.thresholds.c_high = 1.0;
  o.snapshot_dtype = s.snap == at::kBFloat16 ? SnapshotDtype::kBFloat16 : SnapshotDtype::kFloat32;
  auto agent = Agent::Create(o);
  if (!agent.ok()) Fail("Agent::Create: " + agent.status().ToString());
  std::vector<at::Tensor> params = ParamsFor(d.a);
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
  return {Median(step_t), Median(stats_t)};
}

// One workload: the fused passes, the LibTorch baselines and an agent step,
// each skipped when its memory does not fit (rows only for what ran).
void RunWorkload(const Spec& s, const L2Flush& flush, int reps, std::vector<Row>* rows) {
  std::printf("workload %s...\n", s.name.c_str());
  std::fflush(stdout);
  if (!Fits("workload", DataBytes(s))) return;
  Data d = Data::Make(s);
  const PassTimes t = TimePasses(s, d, flush, reps);
  std::optional<double> t_cat, t_foreach;
  if (Fits("cat+3dot", CatBytes(s))) t_cat = TimeCat(d, flush, reps);
  if (Fits("foreach", ForeachBytes(s))) t_foreach = TimeForeach(s, d, flush, reps);
  const double t_clip = TimeClip(d, flush, reps);  // scalars only: no memory check
  d.p.clear();  // the agent keeps a snapshot of its own
  std::optional<AgentTimes> agent;
  if (Fits("agent step", AgentBytes(s))) agent = TimeAgentStep(s, d, flush, reps);

  const auto ratio = [](const std::optional<double>& baseline, double seconds) {
    return baseline ? *baseline / seconds : 0.0;
  };
  const double bytes_stats = d.bytes_g + d.bytes_p;
  const std::string& w = s.name;
  rows->push_back(
      {w, "stats", t.stats, bytes_stats, ratio(t_cat, t.stats), ratio(t_foreach, t.stats), t_clip / t.stats});
  rows->push_back(
      {w, "stats+read", t.read, bytes_stats, ratio(t_cat, t.read), ratio(t_foreach, t.read), t_clip / t.read});
  rows->push_back({w, "project", t.project, 2.0 * bytes_stats, 0.0, 0.0, 0.0});
  rows->push_back({w, "snapshot", t.snapshot, bytes_stats, 0.0, 0.0, 0.0});
  if (t_cat) rows->push_back({w, "cat+3dot", *t_cat, bytes_stats, 0.0, 0.0, 0.0});
  if (t_foreach) rows->push_back({w, "foreach", *t_foreach, bytes_stats, 0.0, 0.0, 0.0});
  rows->push_back({w, "clip", t_clip, 3.0 * d.bytes_g, 0.0, 0.0, 0.0});
  if (agent) {
    rows->push_back({w, "agent step", agent->step, 3.0 * bytes_stats, ratio(t_cat, agent->stats), 0.0, 0.0});
  }
}

// CPU time to enqueue a step (no wait), and Agent::Step wall time, 2,000 x 16.
void HostOverhead(int reps) {
  const int tensors = 2000;
  const std::int64_t elements = 16;
  std::printf("\nHost overhead, %d tensors x %lld fp32 elements (warm, no L2 flush)\n", tensors,
              static_cast<long long>(elements));
  const Spec s = Uniform("overhead", tensors, elements, at::kFloat, at::kFloat);
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
  std::vector<at::Tensor> params = ParamsFor(d.a);
  for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = d.a[i];
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

  const std::int64_t big = args.quick ? 2500 : 250000;
  const int small_tensors = args.quick ? 200 : 2000;
  std::vector<Spec> specs = {
      Uniform("(a)", 200, big, at::kFloat, at::kFloat),
      Uniform("(a)", 200, big, at::kBFloat16, at::kFloat),
      Uniform("(a)", 200, big, at::kBFloat16, at::kBFloat16),
      Uniform("(b)", small_tensors, 1024, at::kFloat, at::kFloat),
      Uniform("(b)", small_tensors, 1024, at::kBFloat16, at::kFloat),
  };
  if (args.model == "llama3-8b") {
    specs.push_back({WorkloadName("(c) llama3-8b", at::kBFloat16, at::kBFloat16), Llama3_8BSizes(), at::kBFloat16,
                     at::kBFloat16});
    const Spec& m = specs.back();
    std::printf("(c) llama3-8b: %zu tensors, %lld parameters (%.2f B), largest %lld elements\n\n", m.sizes.size(),
                static_cast<long long>(m.elements()), static_cast<double>(m.elements()) / 1e9,
                static_cast<long long>(m.largest()));
  }
  std::vector<Row> rows;
  for (const Spec& s : specs) RunWorkload(s, flush, args.reps, &rows);
  std::printf("\n");
  Print(rows, copy_gbs);
  std::printf(
      "(stats: GB/s of bytes read; project: read + written; snapshot: g read + p written; clip: g read twice +\n"
      " written; agent step: stats + projection, 3x (g + p) bytes; agent step \"vs cat\" compares its\n"
      " stats_seconds with cat+3dot; \"vs clip\" is clip's time over the row's. Targets: stats >= 80 %% of copy,\n"
      " >= 3x cat+3dot and faster than clip (vs clip > 1); host overhead <= 50 us for 2,000 tensors)\n");
  HostOverhead(args.reps);
  return 0;
}
