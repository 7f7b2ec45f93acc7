// agent_bench: the agent's CPU passes against baselines measured in the same
// process, reported as ratios (see docs/BENCHMARKS.md and the "Performance
// Targets" of docs/BENCHMARKS.md).
//
//   agent_bench [--quick] [--threads N] [--reps N] [--only a,b,overhead]
//
// Workloads: (a) 50 M parameters in 200 tensors, (b) 2,000 tensors of 1,024
// elements, each with fp32 and bf16 gradients (fp32 snapshot; (a) also with a
// bf16 snapshot), and 2,000 tensors of 16 elements for the host overhead.
//
// Method. Two gradient sets A and B with cosine ~0.29 are generated per
// workload; before every agent step the parameters' gradients are restored
// from A or B alternately (untimed), so each step compares A with the
// snapshot of B or the other way round, and with thresholds c_low = 1e-3,
// c_high = 1 the decision is `project` at every step. The agent times its own
// passes (StepReport::stats_seconds: gather + statistics + decision;
// apply_seconds: projection + snapshot in local mode, snapshot only in monitor
// mode). The caches are flushed (by reading a 64 MiB buffer) before every
// timed operation, agent and baselines alike, except for the host-overhead
// workload.
//
// The memory bandwidth of a shared VM drifts by up to 2x within a run, so
// every baseline is sampled just before each timed agent step and each ratio
// is the median over the steps of (agent step / the samples taken just before
// it). Bandwidth baselines use the agent's thread count and split the arrays
// into blocks that the threads claim dynamically, as the agent's pool does;
// LibTorch baselines run with at::set_num_threads(threads).
//
// This is a benchmark, not a test: it asserts nothing about timing and exits
// non-zero only when the agent fails.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "gac/agent/agent.h"

namespace {

using Clock = std::chrono::steady_clock;
using gac::bench::CpuModel;
using gac::bench::FlagValue;
using gac::bench::Median;
using gac::bench::Seconds;
using gac::controller::Regime;
using gac::agent::Agent;
using gac::agent::AgentOptions;
using gac::agent::Mode;
using gac::agent::SnapshotDtype;

constexpr double kGB = 1e9;
constexpr double kMiB = 1024.0 * 1024.0;

// ---------------------------------------------------------------------------
// Command line.

struct Args {
  bool quick = false;
  int threads = 0;  // 0: hardware threads, at most 8 (the agent's default)
  int reps = 0;     // 0: 9, or 3 with --quick
  // --only: which parts run (default all); the memory check runs with (a).
  bool a = true, b = true, overhead = true;
};

[[noreturn]] void Usage(const char* argv0, int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: %s [--quick] [--threads N] [--reps N] [--only LIST]\n"
               "  --quick      small sizes (smoke run; figures are not meaningful)\n"
               "  --threads N  threads for the agent and the baselines (default: hardware threads, <= 8)\n"
               "  --reps N     timed repetitions per measurement, median reported (default 9; 3 with --quick)\n"
               "  --only LIST  run only these parts, comma-separated: a (50 M / 200 tensors, and the\n"
               "               memory check), b (2,000 x 1,024), overhead (2,000 x 16); default all\n",
               argv0);
  std::exit(code);
}

int ParsePositive(const char* argv0, const char* flag, const char* value) {
  if (value == nullptr) Usage(argv0, 2);
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || v < 1 || v > 100000) {
    std::fprintf(stderr, "%s: %s needs a positive integer, got '%s'\n", argv0, flag, value);
    std::exit(2);
  }
  return static_cast<int>(v);
}

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* value = nullptr;
    if (a == "--quick") {
      args.quick = true;
    } else if (FlagValue(argc, argv, &i, "--threads", &value)) {
      args.threads = ParsePositive(argv[0], "--threads", value);
    } else if (FlagValue(argc, argv, &i, "--reps", &value)) {
      args.reps = ParsePositive(argv[0], "--reps", value);
    } else if (FlagValue(argc, argv, &i, "--only", &value)) {
      const char* list = value;
      if (list == nullptr) Usage(argv[0], 2);
      args.a = args.b = args.overhead = false;
      std::string item;
      for (const char* c = list;; ++c) {
        if (*c != ',' && *c != '\0') {
          item += *c;
          continue;
        }
        if (item == "a") {
          args.a = true;
        } else if (item == "b") {
          args.b = true;
        } else if (item == "overhead") {
          args.overhead = true;
        } else {
          std::fprintf(stderr, "%s: --only takes a comma-separated list of a, b, overhead; got '%s'\n", argv[0],
                       list);
          std::exit(2);
        }
        item.clear();
        if (*c == '\0') break;
      }
    } else if (a == "--help" || a == "-h") {
      Usage(argv[0], 0);
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a.c_str());
      Usage(argv[0], 2);
    }
  }
  if (args.reps == 0) args.reps = args.quick ? 3 : 9;
  return args;
}

// ---------------------------------------------------------------------------
// Machine and process facts.

double CurrentRssMiB() {
  std::ifstream in("/proc/self/statm");
  long size = 0, resident = 0;
  if (!(in >> size >> resident)) return std::nan("");
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / kMiB;
}

double PeakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // KiB on Linux
}

// ---------------------------------------------------------------------------
// Multi-threaded bandwidth baselines.

// Runs body(rank) on `threads` threads, the caller being rank 0, and returns
// the seconds from a common start to the last finish (thread creation is not
// timed).
double RunTeam(int threads, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<Clock::time_point> end(static_cast<std::size_t>(threads));
  std::vector<std::thread> team;
  for (int r = 1; r < threads; ++r) {
    team.emplace_back([&, r] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      body(r);
      end[static_cast<std::size_t>(r)] = Clock::now();
    });
  }
  while (ready.load() != threads - 1) std::this_thread::yield();
  const auto start = Clock::now();
  go.store(true, std::memory_order_release);
  body(0);
  end[0] = Clock::now();
  for (auto& t : team) t.join();
  return Seconds(start, *std::max_element(end.begin(), end.end()));
}

// Splits [0, n) into blocks of 1 Mi elements that the threads claim from a
// shared counter (as the agent's pool does), calls body(rank, begin, end) for
// each and returns the seconds the whole loop took.
double RunBlocks(int threads, std::int64_t n, const std::function<void(int, std::int64_t, std::int64_t)>& body) {
  constexpr std::int64_t kBlockElems = std::int64_t{1} << 20;
  std::atomic<std::int64_t> next{0};
  return RunTeam(threads, [&](int rank) {
    for (std::int64_t b = next.fetch_add(kBlockElems); b < n; b = next.fetch_add(kBlockElems)) {
      body(rank, b, std::min(n, b + kBlockElems));
    }
  });
}

#if defined(__x86_64__) && defined(__GNUC__)
#define GAC_BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GAC_BENCH_CLONES
#endif

// Sum of two float streams with 16 independent lanes (vectorised without
// -ffast-math; one clone per instruction set).
GAC_BENCH_CLONES double SumTwo(const float* __restrict x, const float* __restrict y, std::int64_t n) {
  float acc[16] = {};
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j] + y[i + j];
  }
  double s = 0.0;
  for (; i < n; ++i) s += static_cast<double>(x[i]) + y[i];
  for (float a : acc) s += a;
  return s;
}

// x <- x - c*y and y <- old x: the access pattern of the projection pass
// (read two streams, write both back in place), as a plain loop.
GAC_BENCH_CLONES void UpdateTwo(float* __restrict x, float* __restrict y, std::int64_t n, float c) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = v - c * y[i];
    y[i] = v;
  }
}

// Evicts the caches by reading a buffer twice the size of a large L3. Reads
// only, so that no dirty lines are left to be written back during the timed
// operation that follows.
class CacheFlusher {
 public:
  explicit CacheFlusher(std::size_t bytes) : buf_(bytes / sizeof(float), 1.0f) {}
  void Flush() {
    const std::int64_t half = static_cast<std::int64_t>(buf_.size() / 2);
    sink_ = sink_ + SumTwo(buf_.data(), buf_.data() + half, half);
  }

 private:
  std::vector<float> buf_;
  volatile double sink_ = 0.0;
};

struct AlignedFloats {
  explicit AlignedFloats(std::int64_t n) : n(n) {
    const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(float) + 63) / 64 * 64;
    p = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (p == nullptr) {
      std::fprintf(stderr, "out of memory\n");
      std::exit(1);
    }
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i % 1000) * 1e-3f;
  }
  ~AlignedFloats() { std::free(p); }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* p = nullptr;
  std::int64_t n = 0;
};

// One sample of each bandwidth baseline, in GB/s; NaN where not measured.
struct BwSample {
  double read2 = std::nan("");    // two-stream read: bytes read per second
  double memcpy = std::nan("");   // memcpy: bytes read + written per second
  double update2 = std::nan("");  // in-place two-stream update: bytes read + written per second
};

BwSample SampleBandwidth(AlignedFloats& x, AlignedFloats& y, int threads, CacheFlusher& flusher) {
  const std::int64_t n = x.n;
  std::vector<double> sums(static_cast<std::size_t>(threads), 0.0);
  const double bytes = static_cast<double>(n) * sizeof(float);
  BwSample s;
  flusher.Flush();
  s.read2 = 2.0 * bytes / kGB / RunBlocks(threads, n, [&](int rank, std::int64_t b, std::int64_t e) {
              sums[static_cast<std::size_t>(rank)] += SumTwo(x.p + b, y.p + b, e - b);
            });
  flusher.Flush();
  s.memcpy = 2.0 * bytes / kGB / RunBlocks(threads, n, [&](int, std::int64_t b, std::int64_t e) {
               std::memcpy(y.p + b, x.p + b, static_cast<std::size_t>(e - b) * sizeof(float));
             });
  flusher.Flush();
  s.update2 = 4.0 * bytes / kGB / RunBlocks(threads, n, [&](int, std::int64_t b, std::int64_t e) {
                UpdateTwo(x.p + b, y.p + b, e - b, 1e-3f);
              });
  volatile double sink = sums[0];
  (void)sink;
  return s;
}

// ---------------------------------------------------------------------------
// Workloads.

struct Workload {
  std::string name;
  std::int64_t tensors = 0;
  std::int64_t per_tensor = 0;
  at::ScalarType grad_dtype = at::kFloat;
  std::vector<at::Tensor> params;  // leaves; .grad() is the gradient the agent reads
  std::vector<at::Tensor> grads;   // the parameters' gradients (same tensors)
  std::vector<at::Tensor> a, b;    // the two gradient sets, cosine ~0.29
  std::int64_t numel() const { return tensors * per_tensor; }
  std::int64_t grad_bytes() const { return numel() * static_cast<std::int64_t>(at::elementSize(grad_dtype)); }
};

Workload MakeWorkload(std::string name, std::int64_t tensors, std::int64_t per_tensor, at::ScalarType dtype) {
  at::manual_seed(20240917);
  Workload w;
  w.name = std::move(name);
  w.tensors = tensors;
  w.per_tensor = per_tensor;
  w.grad_dtype = dtype;
  for (std::int64_t i = 0; i < tensors; ++i) {
    // Generated tensor by tensor: no temporary proportional to the model.
    const at::Tensor x = at::randn({per_tensor});
    const at::Tensor y = 0.3 * x + at::randn({per_tensor});
    w.a.push_back(x.to(dtype).contiguous());
    w.b.push_back(y.to(dtype).contiguous());
    at::Tensor p = at::empty({per_tensor});  // never touched: not resident
    p.set_requires_grad(true);
    p.mutable_grad() = w.a.back().clone();
    w.grads.push_back(p.grad());
    w.params.push_back(std::move(p));
  }
  return w;
}

void Restore(Workload& w, const std::vector<at::Tensor>& from) {
  for (std::size_t i = 0; i < w.grads.size(); ++i) {
    std::memcpy(w.grads[i].data_ptr(), from[i].data_ptr(), from[i].nbytes());
  }
}

std::vector<at::Tensor> ConvertAll(const std::vector<at::Tensor>& v, at::ScalarType t) {
  std::vector<at::Tensor> out;
  out.reserve(v.size());
  for (const auto& x : v) out.push_back(x.to(t).contiguous());
  return out;
}

// fp64 reference of the statistics of g against the snapshot of p.
struct Stats3 {
  double dot = 0.0, grad_sq = 0.0, ref_sq = 0.0;
  double cosine() const { return dot / (std::sqrt(grad_sq * ref_sq) + gac::controller::kCosineEpsilon); }
};

Stats3 Reference(const std::vector<at::Tensor>& g, const std::vector<at::Tensor>& p, at::ScalarType snap) {
  Stats3 s;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const at::Tensor x = g[i].to(at::kDouble);
    const at::Tensor y = p[i].to(snap).to(at::kDouble);
    s.dot += (x * y).sum().item<double>();
    s.grad_sq += (x * x).sum().item<double>();
    s.ref_sq += (y * y).sum().item<double>();
  }
  return s;
}

double RelErr(double x, double ref) { return std::fabs(x - ref) / std::max(std::fabs(ref), 1e-300); }

// ---------------------------------------------------------------------------
// The agent.

gac::agent::AgentOptions BenchOptions(gac::controller::Mode mode, SnapshotDtype snap, int threads) {
  AgentOptions o;
  o.thresholds.c_low = 1e-3;
  o.thresholds.c_high = 1.0;
  o.mode = mode;
  o.snapshot_dtype = snap;
  o.num_threads = threads;
  return o;
}

std::unique_ptr<Agent> MakeAgent(const AgentOptions& o) {
  auto agent = Agent::Create(o);
  if (!agent.ok()) {
    std::fprintf(stderr, "Agent::Create failed: %s\n", agent.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*agent);
}

gac::agent::StepReport MustStep(Agent& agent, std::int64_t step, const std::vector<at::Tensor>& params) {
  auto r = agent.Step(step, params);
  if (!r.ok()) {
    std::fprintf(stderr, "Agent::Step(%lld) failed: %s\n", static_cast<long long>(step),
                 r.status().ToString().c_str());
    std::exit(1);
  }
  return *r;
}

struct AgentRun {
  std::vector<double> stats;  // StepReport::stats_seconds per timed step
  std::vector<double> apply;  // StepReport::apply_seconds per timed step
  std::vector<double> step;   // wall time of Agent::Step per timed step
  double c_err = 0.0;         // max relative error of c_t against fp64
  double norm_err = 0.0;      // max relative error of |g| and |p| against fp64
  int off_regime = 0;         // timed steps whose regime was not `project`
  int strided = 0;            // tensors that took the strided path
};

// Steps 1 (no reference) and 2 warm up; then `reps` timed steps, each
// preceded by `before()` (the paired baselines). Gradients alternate between
// A and B, restored before each step (untimed).
AgentRun RunAgent(Workload& w, const AgentOptions& options, int reps, CacheFlusher* flusher, const Stats3* ref_ab,
                  const Stats3* ref_ba, const std::function<void()>& before = {}) {
  auto agent = MakeAgent(options);
  AgentRun out;
  for (std::int64_t s = 1; s <= 2 + reps; ++s) {
    const bool odd = s % 2 != 0;
    if (s > 2 && before) before();
    Restore(w, odd ? w.a : w.b);
    if (flusher != nullptr) flusher->Flush();
    const auto t0 = Clock::now();
    const gac::agent::StepReport r = MustStep(*agent, s, w.params);
    const auto t1 = Clock::now();
    if (s <= 2) continue;
    out.stats.push_back(r.stats_seconds);
    out.apply.push_back(r.apply_seconds);
    out.step.push_back(Seconds(t0, t1));
    out.strided = std::max(out.strided, static_cast<int>(r.strided_tensors));
    if (r.decision.regime != gac::controller::Regime::kProject) ++out.off_regime;
    const Stats3* ref = odd ? ref_ab : ref_ba;
    if (ref != nullptr) {
      const double c = r.decision.cosine.value_or(std::nan(""));
      out.c_err = std::max(out.c_err, RelErr(c, ref->cosine()));
      out.norm_err = std::max({out.norm_err, RelErr(r.decision.grad_norm, std::sqrt(ref->grad_sq)),
                               RelErr(r.decision.ref_norm, std::sqrt(ref->ref_sq))});
    }
  }
  return out;
}

struct MemoryRun {
  double snapshot_mib = 0.0;
  double rss_after_first = 0.0;
  double rss_growth = 0.0;   // max current RSS over the steps minus RSS after step 1
  double peak_growth = 0.0;  // ru_maxrss growth over the steps
  int steps = 0;
};

MemoryRun RunMemory(Workload& w, int threads, int steps) {
  auto agent = MakeAgent(BenchOptions(gac::controller::Mode::kLocal, SnapshotDtype::kFloat32, threads));
  Restore(w, w.a);
  MustStep(*agent, 1, w.params);  // allocates the snapshot
  MemoryRun m;
  m.steps = steps;
  m.snapshot_mib = static_cast<double>(agent->snapshot_bytes()) / kMiB;
  m.rss_after_first = CurrentRssMiB();
  const double peak0 = PeakRssMiB();
  double rss_max = m.rss_after_first;
  for (int s = 2; s <= steps + 1; ++s) {
    Restore(w, s % 2 != 0 ? w.a : w.b);
    MustStep(*agent, s, w.params);
    rss_max = std::max(rss_max, CurrentRssMiB());
  }
  m.rss_growth = rss_max - m.rss_after_first;
  m.peak_growth = PeakRssMiB() - peak0;
  return m;
}

// ---------------------------------------------------------------------------
// LibTorch baselines: the naive ways of getting dot, |g|^2 and |p|^2.

// Times one run of fn after a cache flush: seconds, or NaN when it throws
// (the first message is kept in *error). Tracks the worst c_t error.
template <typename F>
double TimeOnce(CacheFlusher& flusher, const Stats3& ref, double* c_err, std::string* error, F&& fn) {
  try {
    flusher.Flush();
    const auto t0 = Clock::now();
    const Stats3 s = fn();
    const double t = Seconds(t0, Clock::now());
    *c_err = std::max(*c_err, RelErr(s.cosine(), ref.cosine()));
    return t;
  } catch (const std::exception& e) {
    if (error->empty()) {
      *error = e.what();
      const auto nl = error->find('\n');
      if (nl != std::string::npos) error->resize(nl);
    }
    return std::nan("");
  }
}

// at::cat of every gradient and every snapshot, converted to fp32, then 3x at::dot.
Stats3 CatDot(const std::vector<at::Tensor>& g, const std::vector<at::Tensor>& p) {
  at::Tensor G = at::cat(g);
  at::Tensor P = at::cat(p);
  if (G.scalar_type() != at::kFloat) G = G.to(at::kFloat);
  if (P.scalar_type() != at::kFloat) P = P.to(at::kFloat);
  Stats3 s;
  s.dot = at::dot(G, P).item<double>();
  s.grad_sq = at::dot(G, G).item<double>();
  s.ref_sq = at::dot(P, P).item<double>();
  return s;
}

// _foreach_mul(g, p) summed per tensor, _foreach_norm of g and of p.
Stats3 Foreach(const std::vector<at::Tensor>& g, const std::vector<at::Tensor>& p) {
  const std::vector<at::Tensor> prods = at::_foreach_mul(g, p);
  std::vector<at::Tensor> sums;
  sums.reserve(prods.size());
  for (const auto& t : prods) sums.push_back(t.sum());
  const std::vector<at::Tensor> ng = at::_foreach_norm(g);
  const std::vector<at::Tensor> np = at::_foreach_norm(p);
  Stats3 s;
  s.dot = at::stack(sums).to(at::kDouble).sum().item<double>();
  s.grad_sq = at::stack(ng).to(at::kDouble).square().sum().item<double>();
  s.ref_sq = at::stack(np).to(at::kDouble).square().sum().item<double>();
  return s;
}

// The tensors' p side laid out as the agent lays out its snapshot: one
// buffer, 2 MiB-aligned and in huge pages where the kernel allows, each
// tensor's slice on a 64-byte boundary.
class PackedSnapshot {
 public:
  explicit PackedSnapshot(const std::vector<at::Tensor>& p) {
    for (const at::Tensor& t : p) {
      offsets_.push_back(elems_);
      elems_ += (t.numel() + 15) / 16 * 16;
    }
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    bytes_ = (static_cast<std::size_t>(elems_) * sizeof(float) + kHuge - 1) / kHuge * kHuge + kHuge;
    void* m = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "out of memory\n");
      std::exit(1);
    }
    map_ = static_cast<char*>(m);
    base_ = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(map_) + kHuge - 1) & ~(kHuge - 1));
    madvise(base_, static_cast<std::size_t>(elems_) * sizeof(float), MADV_HUGEPAGE);
    for (std::size_t i = 0; i < p.size(); ++i) {
      std::memcpy(slice(i), p[i].data_ptr<float>(), static_cast<std::size_t>(p[i].numel()) * sizeof(float));
    }
  }
  ~PackedSnapshot() { munmap(map_, bytes_); }
  PackedSnapshot(const PackedSnapshot&) = delete;
  PackedSnapshot& operator=(const PackedSnapshot&) = delete;
  const float* slice(std::size_t i) const { return base_ + offsets_[i]; }
  float* slice(std::size_t i) { return base_ + offsets_[i]; }

 private:
  std::vector<std::int64_t> offsets_;
  std::int64_t elems_ = 0;
  std::size_t bytes_ = 0;
  char* map_ = nullptr;
  float* base_ = nullptr;
};

// Two-stream read over the agent's own layout (fp32 only): the gradients the
// agent reads and a packed snapshot, with the agent's prefetching (the first
// line of g and p eight tensors ahead, and g's last line when it is on another
// page) and no per-tensor work: what the memory system gives for this layout,
// e.g. 2,000 separate 4 KiB tensors, without the agent's gather and wake-up.
// Blocks of up to 32 tensors and about 1 Mi elements are claimed dynamically.
// Returns the seconds of one run.
double TimeLayoutRead(const std::vector<at::Tensor>& g, const PackedSnapshot& p, int threads, CacheFlusher& flusher) {
  constexpr std::int64_t kAhead = 8;
  const std::int64_t n = static_cast<std::int64_t>(g.size());
  const std::int64_t per = n > 0 ? std::max<std::int64_t>(g[0].numel(), 1) : 1;  // tensors of one size
  const std::int64_t block = std::clamp<std::int64_t>((std::int64_t{1} << 20) / per, 1, 32);
  // Pointers and lengths collected before the flush: the timed loop touches
  // no tensor metadata.
  std::vector<const float*> gp;
  std::vector<std::int64_t> len;
  for (const at::Tensor& t : g) {
    gp.push_back(t.data_ptr<float>());
    len.push_back(t.numel());
  }
  const auto prefetch = [&](std::int64_t i) {
    const auto k = static_cast<std::size_t>(i);
    const char* first = reinterpret_cast<const char*>(gp[k]);
    const char* last = first + len[k] * 4 - 1;
    __builtin_prefetch(first);
    if (((reinterpret_cast<std::uintptr_t>(first) ^ reinterpret_cast<std::uintptr_t>(last)) >> 12) != 0) {
      __builtin_prefetch(last);
    }
    __builtin_prefetch(p.slice(k));
  };
  std::vector<double> sums(static_cast<std::size_t>(threads), 0.0);
  flusher.Flush();
  std::atomic<std::int64_t> next{0};
  const double t = RunTeam(threads, [&](int rank) {
    for (std::int64_t b = next.fetch_add(block); b < n; b = next.fetch_add(block)) {
      const std::int64_t e = std::min(n, b + block);
      for (std::int64_t i = b; i < std::min(e, b + kAhead); ++i) prefetch(i);
      for (std::int64_t i = b; i < e; ++i) {
        if (i + kAhead < e) prefetch(i + kAhead);
        const auto k = static_cast<std::size_t>(i);
        sums[static_cast<std::size_t>(rank)] += SumTwo(gp[k], p.slice(k), len[k]);
      }
    }
  });
  volatile double sink = sums[0];
  (void)sink;
  return t;
}

// ---------------------------------------------------------------------------
// Results and printing.

// Median of num[i] / den[i] over the pairs where both are finite.
double MedianRatio(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r;
  for (std::size_t i = 0; i < num.size() && i < den.size(); ++i) {
    if (std::isfinite(num[i]) && std::isfinite(den[i]) && den[i] > 0.0) r.push_back(num[i] / den[i]);
  }
  return Median(r);
}

std::vector<double> Rates(double bytes, const std::vector<double>& seconds) {
  std::vector<double> out;
  for (double s : seconds) out.push_back(bytes / s / kGB);
  return out;
}

struct Row {
  std::string config;
  std::string grad, snap;
  double read_bytes = 0.0;   // statistics pass: g + p read once
  double apply_bytes = 0.0;  // projection + snapshot: read g, p; write g, p
  double snap_bytes = 0.0;   // snapshot only: read g, write p
  AgentRun local, monitor;
  // Baselines measured just before each timed step (same index).
  std::vector<BwSample> local_bw, monitor_bw;
  std::vector<double> cat, foreach_, layout;  // seconds; layout: fp32/fp32 rows only
  double cat_c_err = 0.0, foreach_c_err = 0.0;
  std::string cat_error, foreach_error;

  std::vector<double> Bw(const std::vector<BwSample>& v, double BwSample::*field) const {
    std::vector<double> out;
    for (const BwSample& s : v) out.push_back(s.*field);
    return out;
  }
  // Paired ratios (medians over the timed steps).
  double StatsVsRead2() const { return MedianRatio(Rates(read_bytes, local.stats), Bw(local_bw, &BwSample::read2)); }
  double StatsVsLayout() const { return MedianRatio(layout, local.stats); }
  double LayoutVsRead2() const { return MedianRatio(Rates(read_bytes, layout), Bw(local_bw, &BwSample::read2)); }
  double CatSpeedup() const { return MedianRatio(cat, local.stats); }
  double ForeachSpeedup() const { return MedianRatio(foreach_, local.stats); }
  double ApplyVsMemcpy() const {
    return MedianRatio(Rates(apply_bytes, local.apply), Bw(local_bw, &BwSample::memcpy));
  }
  double ApplyVsUpdate2() const {
    return MedianRatio(Rates(apply_bytes, local.apply), Bw(local_bw, &BwSample::update2));
  }
  double SnapVsMemcpy() const {
    return MedianRatio(Rates(snap_bytes, monitor.apply), Bw(monitor_bw, &BwSample::memcpy));
  }
};

const char* DtypeName(at::ScalarType t) { return t == at::kBFloat16 ? "bf16" : t == at::kHalf ? "fp16" : "fp32"; }

std::string Fmt(const char* fmt, double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

const char* Verdict(bool ok) { return ok ? "MET" : "MISSED"; }

void PrintBwLine(const char* name, const std::vector<double>& v, const char* unit_note) {
  if (v.empty()) return;
  std::printf("  %-16s: median %5.1f GB/s, range %5.1f - %5.1f over %zu samples   [%s]\n", name, Median(v),
              *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()), v.size(), unit_note);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int threads = args.threads > 0 ? args.threads : static_cast<int>(std::min(hw, 8u));
  at::set_num_threads(threads);
  const int reps = args.reps;

  // Sizes.
  const std::int64_t big_tensors = 200;
  const std::int64_t big_per = args.quick ? 10'000 : 250'000;  // 50 M (quick: 2 M)
  const std::int64_t small_tensors = args.quick ? 200 : 2'000;
  const std::int64_t small_per = 1'024;
  const std::int64_t tiny_tensors = 2'000;
  const std::int64_t tiny_per = 16;
  const int overhead_steps = args.quick ? 50 : 2'000;
  const int memory_steps = 20;
  const std::int64_t bw_elems = args.quick ? (std::int64_t{4} << 20) : big_tensors * big_per;
  const std::size_t flush_bytes = std::size_t{64} << 20;

  auto probe = MakeAgent(BenchOptions(gac::controller::Mode::kLocal, SnapshotDtype::kFloat32, threads));
  std::printf("gac agent_bench%s\n", args.quick ? " --quick (smoke sizes; figures not meaningful)" : "");
  std::printf("cpu: %s, %u hardware threads\n", CpuModel().c_str(), hw);
  std::printf("agent: kernels %s, %d threads, chunk %lld elements; LibTorch baselines: %d intra-op threads\n",
              probe->kernel_isa(), probe->options().num_threads,
              static_cast<long long>(probe->options().chunk_elements), at::get_num_threads());
  std::printf("reps %d: medians; every baseline sample is taken just before the agent step it is paired with;\n"
              "caches flushed (%zu MiB read) before each timed operation except the host-overhead steps\n\n",
              reps, flush_bytes >> 20);
  probe.reset();
  std::fflush(stdout);

  CacheFlusher flusher(flush_bytes);

  MemoryRun mem;
  std::int64_t big_fp32_grad_bytes = 0;
  std::vector<Row> rows;
  std::unique_ptr<AlignedFloats> bx, by;

  struct Spec {
    std::string name;
    std::int64_t tensors, per;
    at::ScalarType grad;
    std::vector<at::ScalarType> snaps;
  };
  const std::string big_name = args.quick ? "(a) 2M / 200 tensors" : "(a) 50M / 200 tensors";
  const std::string small_name = args.quick ? "(b) 200 x 1024" : "(b) 2000 x 1024";
  std::vector<Spec> specs;
  if (args.a) {
    specs.push_back({big_name, big_tensors, big_per, at::kFloat, {at::kFloat}});
    specs.push_back({big_name, big_tensors, big_per, at::kBFloat16, {at::kFloat, at::kBFloat16}});
  }
  if (args.b) {
    specs.push_back({small_name, small_tensors, small_per, at::kFloat, {at::kFloat}});
    specs.push_back({small_name, small_tensors, small_per, at::kBFloat16, {at::kFloat}});
  }
  for (std::size_t si = 0; si < specs.size(); ++si) {
    const Spec& spec = specs[si];
    std::printf("workload %s, %s gradients...\n", spec.name.c_str(), DtypeName(spec.grad));
    std::fflush(stdout);
    Workload w = MakeWorkload(spec.name, spec.tensors, spec.per, spec.grad);
    if (si == 0) {
      // Memory first, so that ru_maxrss has not been raised by anything larger.
      if (args.a) {
        big_fp32_grad_bytes = w.grad_bytes();
        mem = RunMemory(w, threads, memory_steps);
      }
      bx = std::make_unique<AlignedFloats>(bw_elems);
      by = std::make_unique<AlignedFloats>(bw_elems);
    }
    for (at::ScalarType snap : spec.snaps) {
      const SnapshotDtype sd = snap == at::kBFloat16 ? SnapshotDtype::kBFloat16 : SnapshotDtype::kFloat32;
      Row row;
      row.config = spec.name;
      row.grad = DtypeName(spec.grad);
      row.snap = DtypeName(snap);
      const double gb = static_cast<double>(w.grad_bytes());
      const double pb = static_cast<double>(w.numel()) * static_cast<double>(at::elementSize(snap));
      row.read_bytes = gb + pb;
      row.apply_bytes = 2.0 * (gb + pb);
      row.snap_bytes = gb + pb;
      // Odd steps: g = A against the snapshot of B; even steps the other way.
      const Stats3 ref_ab = Reference(w.a, w.b, snap);
      const Stats3 ref_ba = Reference(w.b, w.a, snap);
      const std::vector<at::Tensor> snaps = ConvertAll(w.b, snap);  // baselines: g = A, p = B
      const bool layout = spec.grad == at::kFloat && snap == at::kFloat;
      std::unique_ptr<PackedSnapshot> packed;  // the layout read's p: B, packed as the agent packs its snapshot
      if (layout) packed = std::make_unique<PackedSnapshot>(snaps);
      row.local = RunAgent(w, BenchOptions(gac::controller::Mode::kLocal, sd, threads), reps, &flusher, &ref_ab, &ref_ba, [&] {
        row.cat.push_back(TimeOnce(flusher, ref_ab, &row.cat_c_err, &row.cat_error, [&] { return CatDot(w.a, snaps); }));
        row.foreach_.push_back(TimeOnce(flusher, ref_ab, &row.foreach_c_err, &row.foreach_error,
                                        [&] { return Foreach(w.a, snaps); }));
        row.local_bw.push_back(SampleBandwidth(*bx, *by, threads, flusher));
        row.layout.push_back(layout ? TimeLayoutRead(w.grads, *packed, threads, flusher) : std::nan(""));
      });
      row.monitor = RunAgent(w, BenchOptions(gac::controller::Mode::kMonitor, sd, threads), reps, &flusher, &ref_ab, &ref_ba,
                             [&] { row.monitor_bw.push_back(SampleBandwidth(*bx, *by, threads, flusher)); });
      rows.push_back(std::move(row));
    }
  }

  // Host overhead: 2,000 tiny tensors, caches warm (the data is 256 KiB).
  AgentRun ovh_local, ovh_monitor;
  if (args.overhead) {
    std::printf("workload 2000 x 16 (host overhead)...\n");
    std::fflush(stdout);
    Workload w = MakeWorkload("2000 x 16", tiny_tensors, tiny_per, at::kFloat);
    ovh_local = RunAgent(w, BenchOptions(gac::controller::Mode::kLocal, SnapshotDtype::kFloat32, threads), overhead_steps, nullptr,
                         nullptr, nullptr);
    ovh_monitor = RunAgent(w, BenchOptions(gac::controller::Mode::kMonitor, SnapshotDtype::kFloat32, threads), overhead_steps,
                           nullptr, nullptr, nullptr);
  }

  // ---- Report.
  std::vector<double> all_read2, all_memcpy, all_update2;
  for (const Row& r : rows) {
    for (const auto* v : {&r.local_bw, &r.monitor_bw}) {
      for (const BwSample& s : *v) {
        all_read2.push_back(s.read2);
        all_memcpy.push_back(s.memcpy);
        all_update2.push_back(s.update2);
      }
    }
  }
  if (!rows.empty()) {
    std::printf("\nBandwidth baselines (%d threads, %.0f MiB per array, blocks of 1 Mi elements claimed dynamically)\n",
                threads, static_cast<double>(bw_elems) * 4.0 / kMiB);
    PrintBwLine("two-stream read", all_read2, "bytes read");
    PrintBwLine("memcpy", all_memcpy, "bytes read + written");
    PrintBwLine("2-stream update", all_update2, "bytes read + written; x -= c*y, y = old x");
    std::printf("  (the ratios below pair each agent step with the samples taken just before it)\n\n");

    std::printf("1. Statistics pass (StepReport::stats_seconds: gather + statistics + decision; bytes = g + p)\n");
    std::printf("%-22s %-4s %-4s | %8s %6s %7s %7s | %10s %8s | %10s %8s | %9s %9s\n", "config", "grad", "snap",
                "ms", "GB/s", "%2-str", "%layout", "cat+3dot", "speedup", "foreach", "speedup", "c err", "naive err");
    for (const Row& r : rows) {
      const double ms = Median(r.local.stats) * 1e3;
      std::printf("%-22s %-4s %-4s | %8.3f %6.1f %7s %7s | %7s ms %7sx | %7s ms %7sx | %9.1e %9s\n",
                  r.config.c_str(), r.grad.c_str(), r.snap.c_str(), ms, r.read_bytes / ms / 1e6,
                  Fmt("%.0f%%", 100.0 * r.StatsVsRead2()).c_str(), Fmt("%.0f%%", 100.0 * r.StatsVsLayout()).c_str(),
                  Fmt("%.1f", Median(r.cat) * 1e3).c_str(), Fmt("%.1f", r.CatSpeedup()).c_str(),
                  Fmt("%.1f", Median(r.foreach_) * 1e3).c_str(), Fmt("%.1f", r.ForeachSpeedup()).c_str(),
                  r.local.c_err, r.cat_error.empty() ? Fmt("%.1e", r.cat_c_err).c_str() : "n/a");
    }
    for (const Row& r : rows) {
      if (!r.cat_error.empty()) {
        std::printf("  cat+3dot failed for %s %s/%s: %s\n", r.config.c_str(), r.grad.c_str(), r.snap.c_str(),
                    r.cat_error.c_str());
      }
      if (!r.foreach_error.empty()) {
        std::printf("  foreach failed for %s %s/%s: %s\n", r.config.c_str(), r.grad.c_str(), r.snap.c_str(),
                    r.foreach_error.c_str());
      }
    }
    std::printf("  %%2-str: against the two-stream read baseline (large arrays). %%layout: against a two-stream read\n"
                "  of the same gradients and a packed snapshot, prefetching as the agent does, with no per-tensor work\n"
                "  (fp32 rows only). c err: max relative error of the agent's c_t against fp64 over the timed steps;\n"
                "  naive err: the same for cat+3dot (at::dot, fp32).\n\n");

    std::printf("2. Apply pass (StepReport::apply_seconds)\n");
    std::printf("%-22s %-4s %-4s | %-32s | %-24s | %9s %9s\n", "", "", "", "project+snapshot (local)",
                "snapshot only (monitor)", "step ms", "step ms");
    std::printf("%-22s %-4s %-4s | %8s %6s %7s %8s | %8s %6s %8s | %9s %9s\n", "config", "grad", "snap", "ms", "GB/s",
                "%memcpy", "%update", "ms", "GB/s", "%memcpy", "local", "monitor");
    int off_regime = 0, strided = 0;
    for (const Row& r : rows) {
      const double pms = Median(r.local.apply) * 1e3;
      const double sms = Median(r.monitor.apply) * 1e3;
      std::printf("%-22s %-4s %-4s | %8.3f %6.1f %7s %8s | %8.3f %6.1f %8s | %9.3f %9.3f\n", r.config.c_str(),
                  r.grad.c_str(), r.snap.c_str(), pms, r.apply_bytes / pms / 1e6,
                  Fmt("%.0f%%", 100.0 * r.ApplyVsMemcpy()).c_str(), Fmt("%.0f%%", 100.0 * r.ApplyVsUpdate2()).c_str(),
                  sms, r.snap_bytes / sms / 1e6, Fmt("%.0f%%", 100.0 * r.SnapVsMemcpy()).c_str(),
                  Median(r.local.step) * 1e3, Median(r.monitor.step) * 1e3);
      off_regime += r.local.off_regime + r.monitor.off_regime;
      strided += r.local.strided + r.monitor.strided;
    }
    std::printf("  bytes: project+snapshot reads g, p and writes g, p; snapshot only reads g and writes p.\n"
                "  %%update: against the in-place 2-stream update loop (same access pattern; stricter than memcpy).\n");
    if (off_regime > 0) std::printf("  WARNING: %d timed steps were not in the `project` regime\n", off_regime);
    if (strided > 0) std::printf("  WARNING: %d tensors took the strided path\n", strided);
    std::printf("\n");
  }
  if (args.overhead) {
    std::printf("3. Host overhead, 2000 tensors x 16 fp32 elements (wall time of Agent::Step, %d steps, warm)\n",
                overhead_steps);
    std::printf("  local (project) : %8.1f us  (stats %.1f us, apply %.1f us)\n", Median(ovh_local.step) * 1e6,
                Median(ovh_local.stats) * 1e6, Median(ovh_local.apply) * 1e6);
    std::printf("  monitor         : %8.1f us  (stats %.1f us, apply %.1f us)\n\n", Median(ovh_monitor.step) * 1e6,
                Median(ovh_monitor.stats) * 1e6, Median(ovh_monitor.apply) * 1e6);
  }

  if (args.a) {
    std::printf("4. Memory, %s fp32, local mode, %d steps after the first\n", big_name.c_str(), mem.steps);
    std::printf("  snapshot %.1f MiB; RSS after step 1 %.1f MiB; current-RSS growth %.2f MiB; ru_maxrss growth "
                "%.2f MiB\n",
                mem.snapshot_mib, mem.rss_after_first, mem.rss_growth, mem.peak_growth);
    std::printf("  (one fp32 gradient copy: %.1f MiB)\n\n", static_cast<double>(big_fp32_grad_bytes) / kMiB);
  }

  // ---- Targets (docs/BENCHMARKS.md): on the fp32/fp32 rows of (a) and of (b).
  const double overhead_us = Median(ovh_local.step) * 1e6;
  double worst_c_err = 0.0;
  for (const Row& r : rows) worst_c_err = std::max({worst_c_err, r.local.c_err, r.monitor.c_err});
  const double growth = std::max(mem.rss_growth, mem.peak_growth);
  const double grad_mib = static_cast<double>(big_fp32_grad_bytes) / kMiB;
  std::printf("Targets (fp32 grads / fp32 snapshot unless stated)\n");
  for (const Row& r : rows) {
    if (r.grad != "fp32" || r.snap != "fp32") continue;
    const char* tag = r.config == big_name ? "(a)" : "(b)";
    std::printf("  %s stats pass vs 2-stream read  %6.0f%%   target >= 80%%     %s\n", tag, 100.0 * r.StatsVsRead2(),
                Verdict(r.StatsVsRead2() >= 0.8));
    std::printf("      (the layout read, no per-tensor work: %.0f%% of the 2-stream read; the pass: %.0f%% of it)\n",
                100.0 * r.LayoutVsRead2(), 100.0 * r.StatsVsLayout());
    std::printf("  %s stats pass vs cat+3dot       %6.1fx   target >= 10x     %s\n", tag, r.CatSpeedup(),
                Verdict(r.CatSpeedup() >= 10.0));
    std::printf("  %s project+snapshot vs memcpy   %6.0f%%   target >= 70%%     %s\n", tag, 100.0 * r.ApplyVsMemcpy(),
                Verdict(r.ApplyVsMemcpy() >= 0.7));
    std::printf("      (vs the 2-stream update loop: %4.0f%%)\n", 100.0 * r.ApplyVsUpdate2());
  }
  if (args.overhead) {
    std::printf("  host overhead, 2000 tensors      %6.1f us target <= 50 us   %s\n", overhead_us,
                Verdict(overhead_us <= 50.0));
  }
  if (!rows.empty()) {
    std::printf("  c_t rel. error vs fp64 (all)     %8.1e target <= 1e-6    %s\n", worst_c_err,
                Verdict(worst_c_err <= 1e-6));
  }
  if (args.a) {
    std::printf("  RSS growth over %d steps         %6.2f MiB (one grad copy %.0f MiB; target ~0)  %s\n", mem.steps,
                growth, grad_mib, Verdict(growth < 0.05 * grad_mib));
  }
  return 0;
}
