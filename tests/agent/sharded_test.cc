// Sharded gradients give the same GAC result as unsharded ones, across real
// processes joined by a Gloo process group over loopback.
//
// The binary is both the test driver and the worker. Each test spawns N
// copies of itself with `--worker <rank> <world> <store_file> <result_file>
// <variant>`; every worker joins a Gloo group through a FileStore, runs a
// sharded Agent (ProcessGroupReducer) over its shard of a deterministic model
// and, side by side, an unsharded Agent over the full gradients, and checks
// step by step that both agree with each other and with an fp64 reference:
// regime, step_optimizer, cosine, projected gradients. A worker writes its
// diagnostics to its result file and exits 0 only when every check passed.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gac/agent/agent.h"
#include "gac/agent/process_group_reducer.h"
#include "gac/controller/controller.h"

extern char** environ;

namespace {

using gac::controller::AlphaMode;
using gac::controller::Regime;
using gac::agent::Agent;
using gac::agent::AgentOptions;
using gac::agent::SnapshotDtype;

// ---------------------------------------------------------------------------
// The experiment: model, sharding, gradient sequence.

constexpr int kSteps = 40;
constexpr std::uint64_t kSeed = 20240611;
constexpr double kCosineTol = 1e-6;
constexpr double kRelTol = 1e-6;
// Thresholds of the test (not the defaults, to show they travel).
constexpr double kCLow = 0.08;
constexpr double kCHigh = 0.4;

struct ParamSpec {
  std::vector<std::int64_t> sizes;
  at::ScalarType grad_dtype;
  double scale;  // relative magnitude of its gradient elements
};

// Different shapes and sizes: a zero-size tensor, sizes not divisible by 2 or
// 4, one bf16 gradient, one large enough for several chunks and (unsharded)
// several tasks of the thread pool.
const std::vector<ParamSpec>& Model() {
  static const std::vector<ParamSpec> model = {
      {{33, 65}, at::kFloat, 1.0},       // 2145
      {{7}, at::kFloat, 0.1},            // 7
      {{0, 3}, at::kFloat, 1.0},         // 0
      {{600, 500}, at::kFloat, 0.02},    // 300000
      {{5, 7, 11}, at::kBFloat16, 0.5},  // 385, bf16 gradient
      {{2, 1025}, at::kFloat, 3.0},      // 2050, strided gradient (unsharded agent)
      {{1}, at::kFloat, 1.0},            // 1
  };
  return model;
}
constexpr std::size_t kStridedParam = 5;

// Target cosines with the previous raw gradient, cycled through in a
// scrambled order: three safe, three project, three skip, all well away from
// the thresholds so fp32/bf16 rounding cannot move a step across one.
constexpr std::array<double, 9> kTargets = {0.0, 0.03, -0.045, 0.15, -0.25, 0.33, 0.55, -0.8, 0.95};

enum class Sharding { kPerParam, kFlat };

struct Variant {
  std::string name;
  gac::controller::AlphaMode alpha_mode = gac::controller::AlphaMode::kPaper;
  SnapshotDtype snapshot = SnapshotDtype::kFloat32;
  Sharding sharding = Sharding::kPerParam;
};

std::optional<Variant> ParseVariant(const std::string& name) {
  for (const char* alpha : {"paper", "exact"}) {
    for (const char* snap : {"f32", "bf16"}) {
      for (const char* shard : {"perparam", "flat"}) {
        if (name == std::string(alpha) + "-" + snap + "-" + shard) {
          Variant v;
          v.name = name;
          v.alpha_mode = std::strcmp(alpha, "exact") == 0 ? gac::controller::AlphaMode::kExact : gac::controller::AlphaMode::kPaper;
          v.snapshot = std::strcmp(snap, "bf16") == 0 ? SnapshotDtype::kBFloat16 : SnapshotDtype::kFloat32;
          v.sharding = std::strcmp(shard, "flat") == 0 ? Sharding::kFlat : Sharding::kPerParam;
          return v;
        }
      }
    }
  }
  return std::nullopt;
}

struct Range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
};

// Rank `rank`'s contiguous range of each parameter's flattened elements.
// kPerParam: every parameter split in ceil(n/world) pieces (later ranks may
// get less or nothing). kFlat: FSDP's flat parameter, the concatenation of
// all parameters split in ceil(total/world) pieces, intersected with each.
std::vector<Range> ShardRanges(const std::vector<std::int64_t>& numels, int rank, int world, Sharding sharding) {
  std::vector<Range> out(numels.size());
  if (sharding == Sharding::kPerParam) {
    for (std::size_t i = 0; i < numels.size(); ++i) {
      const std::int64_t n = numels[i];
      const std::int64_t chunk = (n + world - 1) / world;
      const std::int64_t b = std::min(n, rank * chunk);
      out[i] = {b, std::min(n, b + chunk)};
    }
    return out;
  }
  std::int64_t total = 0;
  for (std::int64_t n : numels) total += n;
  const std::int64_t chunk = (total + world - 1) / world;
  const std::int64_t lo = std::min(total, rank * chunk);
  const std::int64_t hi = std::min(total, lo + chunk);
  std::int64_t off = 0;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    const std::int64_t b = std::clamp(lo - off, std::int64_t{0}, numels[i]);
    const std::int64_t e = std::clamp(hi - off, std::int64_t{0}, numels[i]);
    out[i] = {b, std::max(b, e)};
    off += numels[i];
  }
  return out;
}

at::Tensor F64(const at::Tensor& t) { return t.to(at::kDouble).contiguous().reshape({-1}); }

double MaxAbs(const at::Tensor& t) { return t.numel() == 0 ? 0.0 : t.abs().max().item<double>(); }

// max |a-b| / max(|ref|_inf, tiny), a and b flattened fp64.
double RelMaxErr(const at::Tensor& a, const at::Tensor& b, const at::Tensor& ref) {
  if (a.numel() == 0) return 0.0;
  return MaxAbs(a - b) / std::max(MaxAbs(ref), 1e-30);
}

// Largest |a-b| in units of one bf16 ulp of max(|a|,|b|) (elementwise).
double Bf16UlpErr(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0.0;
  const at::Tensor mag = at::maximum(a.abs(), b.abs()).clamp_min(1e-30);
  const at::Tensor ulp = at::exp2(at::floor(at::log2(mag)) - 7);
  return ((a - b).abs() / ulp).max().item<double>();
}

// ---------------------------------------------------------------------------
// Worker.

class Checker {
 public:
  void Fail(const std::string& msg) {
    ++failures_;
    if (failures_ <= 40) log_ << "FAIL " << msg << "\n";
  }
  void Check(bool ok, const std::string& msg) {
    if (!ok) Fail(msg);
  }
  void Note(const std::string& msg) { log_ << msg << "\n"; }
  int failures() const { return failures_; }
  std::string text() const { return log_.str(); }

 private:
  int failures_ = 0;
  std::ostringstream log_;
};

std::string Fmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

int RunWorker(int rank, int world, const std::string& store_file, const std::string& result_file,
              const std::string& variant_name) {
  Checker chk;
  auto finish = [&](int code) {
    std::ofstream out(result_file);
    out << "rank " << rank << "/" << world << " variant " << variant_name << "\n" << chk.text();
    if (chk.failures() > 0) out << chk.failures() << " failure(s)\n";
    return code != 0 ? code : (chk.failures() == 0 ? 0 : 1);
  };
  try {
    const std::optional<Variant> variant = ParseVariant(variant_name);
    if (!variant) {
      chk.Fail("unknown variant " + variant_name);
      return finish(2);
    }
    at::set_num_threads(1);
    const auto t_start = std::chrono::steady_clock::now();

    // Process group and reducer.
    auto store = c10::make_intrusive<c10d::FileStore>(store_file, world);
    auto pg_options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
    pg_options->devices = {c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")};
    // A ProcessGroup with the Gloo backend for CPU tensors, as
    // torch.distributed builds it (the consumer of tests/install passes a
    // bare Backend).
    c10::intrusive_ptr<c10d::Backend> gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, pg_options);
    auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
    group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    auto reducer = std::make_shared<gac::agent::ProcessGroupReducer>(group);
    chk.Check(reducer->rank() == rank && reducer->world_size() == world, "reducer rank/world");

    AgentOptions opts;
    opts.thresholds = gac::controller::Thresholds{kCLow, kCHigh};
    opts.alpha_mode = variant->alpha_mode;
    opts.mode = gac::agent::Mode::kLocal;
    opts.snapshot_dtype = variant->snapshot;
    opts.num_threads = 2;
    opts.chunk_elements = 1024;
    auto full_agent_or = Agent::Create(opts);
    opts.reducer = reducer;
    auto shard_agent_or = Agent::Create(opts);
    if (!full_agent_or.ok() || !shard_agent_or.ok()) {
      chk.Fail("Agent::Create failed");
      return finish(2);
    }
    Agent& full_agent = **full_agent_or;
    Agent& shard_agent = **shard_agent_or;
    auto reference_controller = gac::controller::Controller::Create(opts.thresholds, opts.alpha_mode);
    if (!reference_controller.ok()) {
      chk.Fail("Controller::Create failed");
      return finish(2);
    }

    // Model: full parameters and this rank's shards.
    const std::vector<ParamSpec>& model = Model();
    const std::size_t np = model.size();
    std::vector<std::int64_t> numels, offsets;
    std::int64_t total = 0;
    for (const ParamSpec& s : model) {
      std::int64_t n = 1;
      for (std::int64_t d : s.sizes) n *= d;
      numels.push_back(n);
      offsets.push_back(total);
      total += n;
    }
    const std::vector<Range> ranges = ShardRanges(numels, rank, world, variant->sharding);
    std::vector<at::Tensor> full_params, shard_params;
    for (std::size_t i = 0; i < np; ++i) {
      full_params.push_back(at::zeros(model[i].sizes, at::kFloat));
      shard_params.push_back(at::zeros({ranges[i].size()}, at::kFloat));
    }
    // Per-element scale of the generated gradients.
    at::Tensor weights = at::empty({total}, at::kDouble);
    for (std::size_t i = 0; i < np; ++i) weights.narrow(0, offsets[i], numels[i]).fill_(model[i].scale);
    {
      std::ostringstream os;
      os << "shard ranges:";
      for (const Range& r : ranges) os << " [" << r.begin << "," << r.end << ")";
      chk.Note(os.str());
    }

    const auto t_setup = std::chrono::steady_clock::now();
    // Identical on every rank: same seed, same library.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(kSeed);
    at::Tensor prev_raw;  // previous raw gradient, fp64 flat, as the gradients held it
    int counts[4] = {0, 0, 0, 0};
    double max_cos_err = 0, max_ref_err = 0, max_shard_err = 0, max_full_err = 0, max_after_err = 0;
    double max_bf16_ulp = 0;

    for (int t = 1; t <= kSteps; ++t) {
      // --- Generate the full gradient g (fp64 flat) with a chosen cosine.
      const at::Tensor noise = at::randn({total}, gen, at::kDouble) * weights;
      const double norm = std::exp(0.7 * at::randn({1}, gen, at::kDouble).item<double>());
      at::Tensor g;
      const double target = kTargets[(t * 4) % kTargets.size()];
      if (!prev_raw.defined()) {
        g = noise * (norm / noise.norm().item<double>());
      } else {
        const at::Tensor u = prev_raw / prev_raw.norm().item<double>();
        at::Tensor perp = noise - u * noise.dot(u).item<double>();
        perp = perp / perp.norm().item<double>();
        g = (u * target + perp * std::sqrt(1.0 - target * target)) * norm;
      }

      // --- Set the gradients: full tensors (one strided) and shard slices.
      std::vector<at::Tensor> full_grads(np), shard_grads_raw(np);
      for (std::size_t i = 0; i < np; ++i) {
        const at::Tensor gi = g.narrow(0, offsets[i], numels[i]).view(model[i].sizes).to(model[i].grad_dtype);
        if (i == kStridedParam) {
          // A non-dense gradient: every other column of a wider buffer.
          std::vector<std::int64_t> wide = model[i].sizes;
          wide.back() *= 2;
          at::Tensor buf = at::full(wide, 7.0, at::TensorOptions().dtype(model[i].grad_dtype));
          at::Tensor view = buf.slice(-1, 0, wide.back(), 2);
          view.copy_(gi);
          full_params[i].mutable_grad() = view;
        } else {
          full_params[i].mutable_grad() = gi.clone();
        }
        full_grads[i] = full_params[i].grad();
        const at::Tensor slice = gi.reshape({-1}).slice(0, ranges[i].begin, ranges[i].end).clone();
        shard_grads_raw[i] = slice.clone();
        if (ranges[i].size() == 0 && (rank + static_cast<int>(i) + t) % 2 == 0) {
          shard_params[i].mutable_grad() = at::Tensor();  // no gradient on this rank this step
        } else {
          shard_params[i].mutable_grad() = slice;
        }
      }
      // The raw gradient as the agent reads it (after the dtype rounding).
      std::vector<at::Tensor> raw64(np);
      for (std::size_t i = 0; i < np; ++i) raw64[i] = F64(full_grads[i]);
      const at::Tensor raw = at::cat(raw64);

      // --- fp64 reference: statistics against the snapshot the agent holds.
      gac::controller::AlignmentStats ref_stats;
      at::Tensor ref_p;
      if (prev_raw.defined()) {
        ref_p = variant->snapshot == SnapshotDtype::kBFloat16 ? prev_raw.to(at::kBFloat16).to(at::kDouble)
                                                                : prev_raw.to(at::kFloat).to(at::kDouble);
        ref_stats = {raw.dot(ref_p).item<double>(), raw.dot(raw).item<double>(), ref_p.dot(ref_p).item<double>(),
                     true};
      } else {
        ref_stats = {0.0, raw.dot(raw).item<double>(), 0.0, false};
      }
      const gac::controller::Decision ref = reference_controller->Decide(ref_stats);

      // --- Both agents.
      auto rf = full_agent.Step(t, full_params);
      auto rs = shard_agent.Step(t, shard_params);
      if (!rf.ok() || !rs.ok()) {
        chk.Fail(Fmt("step %d: Step failed: full=%s shard=%s", t, rf.status().ToString().c_str(),
                     rs.status().ToString().c_str()));
        return finish(3);  // the collective sequence is broken: stop here
      }
      const gac::controller::Decision& df = rf->decision;
      const gac::controller::Decision& ds = rs->decision;
      const std::string at_step = Fmt("step %d (target %.3f, ref c %.6f, regime %s)", t, target,
                                      ref.cosine.value_or(NAN), gac::controller::RegimeName(ref.regime));
      ++counts[static_cast<int>(ds.regime)];

      chk.Check(df.regime == ref.regime, at_step + ": full regime " + gac::controller::RegimeName(df.regime));
      chk.Check(ds.regime == ref.regime, at_step + ": sharded regime " + gac::controller::RegimeName(ds.regime));
      chk.Check(rf->step_optimizer == rs->step_optimizer, at_step + ": step_optimizer differs");
      chk.Check(rs->step_optimizer == (ref.regime == gac::controller::Regime::kSafe || ref.regime == gac::controller::Regime::kProject),
                at_step + ": step_optimizer does not match the regime");
      chk.Check(rf->gradient_modified == rs->gradient_modified, at_step + ": gradient_modified differs");
      chk.Check(rf->gradient_modified == (ref.regime == gac::controller::Regime::kProject), at_step + ": gradient_modified");
      chk.Check(rf->strided_tensors == 1, at_step + Fmt(": full strided_tensors %d", rf->strided_tensors));
      chk.Check(rs->strided_tensors == 0, at_step + Fmt(": shard strided_tensors %d", rs->strided_tensors));
      std::int64_t shard_elems = 0;
      for (const Range& r : ranges) shard_elems += r.size();
      chk.Check(rs->elements == shard_elems && rf->elements == total, at_step + ": elements read");

      if (t == 1) {
        chk.Check(!df.cosine && !ds.cosine, at_step + ": cosine present on the first step");
      } else {
        if (!df.cosine || !ds.cosine || !ref.cosine) {
          chk.Fail(at_step + ": cosine absent");
        } else {
          const double e = std::abs(*df.cosine - *ds.cosine);
          const double er = std::max(std::abs(*ref.cosine - *ds.cosine), std::abs(*ref.cosine - *df.cosine));
          max_cos_err = std::max(max_cos_err, e);
          max_ref_err = std::max(max_ref_err, er);
          chk.Check(e <= kCosineTol, at_step + Fmt(": |c_full - c_shard| = %.3g", e));
          chk.Check(er <= kCosineTol, at_step + Fmt(": |c_ref - c| = %.3g", er));
          const double ea = std::abs(ds.alpha - ref.alpha);
          chk.Check(ea <= 1e-5 * std::abs(ref.alpha), at_step + Fmt(": alpha %.9g vs ref %.9g", ds.alpha, ref.alpha));
          chk.Check(std::abs(ds.grad_norm - ref.grad_norm) <= 1e-6 * ref.grad_norm &&
                        std::abs(ds.ref_norm - ref.ref_norm) <= 1e-6 * ref.ref_norm,
                    at_step + ": norms differ from the fp64 reference");
        }
      }

      // --- Gradients after the step.
      at::Tensor ref_projected;  // fp64 reference of g'
      if (ref.regime == gac::controller::Regime::kProject) {
        ref_projected = raw - ref_p * ref.projection_coeff;
        const double c_after =
            ref_projected.dot(ref_p).item<double>() /
            (ref_projected.norm().item<double>() * ref_p.norm().item<double>() + gac::controller::kCosineEpsilon);
        if (!ds.cosine_after) {
          chk.Fail(at_step + ": cosine_after absent on project");
        } else {
          const double e = std::abs(*ds.cosine_after - c_after);
          max_after_err = std::max(max_after_err, e);
          chk.Check(e <= kCosineTol, at_step + Fmt(": cosine_after %.9f vs fp64 %.9f", *ds.cosine_after, c_after));
        }
        if (variant->alpha_mode == gac::controller::AlphaMode::kExact) {
          chk.Check(std::abs(std::abs(c_after) - kCLow) <= kCosineTol,
                    at_step + Fmt(": exact alpha leaves |c'| = %.9f, not c_low", std::abs(c_after)));
        } else {
          // alpha = c_low/|c| leaves |c'| = c_low / sqrt(1 - c^2 (1 - alpha^2)) > c_low.
          chk.Check(std::abs(c_after) > kCLow + 1e-5,
                    at_step + Fmt(": paper alpha left |c'| = %.9f, not above c_low", std::abs(c_after)));
        }
      }
      for (std::size_t i = 0; i < np; ++i) {
        const bool bf16 = model[i].grad_dtype == at::kBFloat16;
        const std::string what = at_step + Fmt(": param %zu", i);
        const at::Tensor full_after = F64(full_grads[i]);
        const at::Tensor full_slice = full_after.slice(0, ranges[i].begin, ranges[i].end);
        const at::Tensor shard_grad = shard_params[i].grad();
        const at::Tensor shard_after = shard_grad.defined() ? F64(shard_grad) : at::zeros({0}, at::kDouble);
        chk.Check(shard_after.numel() == ranges[i].size(), what + ": shard gradient size");
        if (ref.regime != gac::controller::Regime::kProject) {
          // Untouched, bit for bit.
          chk.Check(at::equal(full_after, raw64[i]), what + ": full gradient modified outside project");
          chk.Check(at::equal(shard_after, F64(shard_grads_raw[i])), what + ": shard gradient modified outside project");
          continue;
        }
        // Sharded vs unsharded projection.
        const at::Tensor ref_i = ref_projected.narrow(0, offsets[i], numels[i]);
        if (bf16) {
          const double u1 = Bf16UlpErr(shard_after, full_slice);
          const double u2 = Bf16UlpErr(full_after, ref_i);
          max_bf16_ulp = std::max({max_bf16_ulp, u1, u2});
          chk.Check(u1 <= 1.0, what + Fmt(": bf16 shard vs full %.3g ulp", u1));
          chk.Check(u2 <= 1.0, what + Fmt(": bf16 full vs fp64 %.3g ulp", u2));
        } else {
          const double e1 = RelMaxErr(shard_after, full_slice, full_slice);
          const double e2 = RelMaxErr(full_after, ref_i, ref_i);
          max_shard_err = std::max(max_shard_err, e1);
          max_full_err = std::max(max_full_err, e2);
          chk.Check(e1 <= kRelTol, what + Fmt(": shard vs full projection rel err %.3g", e1));
          chk.Check(e2 <= kRelTol, what + Fmt(": full projection vs fp64 rel err %.3g", e2));
        }
      }
      // The strided gradient's padding columns are left alone.
      {
        const at::Tensor& gs = full_grads[kStridedParam];
        const at::Tensor pad = at::as_strided(gs, gs.sizes(), gs.strides(), gs.storage_offset() + 1);
        chk.Check(at::all(pad == 7.0).item<bool>(), at_step + ": strided gradient padding overwritten");
      }
      prev_raw = raw;
    }

    const auto t_end = std::chrono::steady_clock::now();
    chk.Note(Fmt("time: setup %.3f s, %d steps %.3f s", std::chrono::duration<double>(t_setup - t_start).count(),
                 kSteps, std::chrono::duration<double>(t_end - t_setup).count()));
    chk.Note(Fmt("regimes: safe=%d project=%d skip=%d invalid=%d", counts[0], counts[1], counts[2], counts[3]));
    chk.Note(Fmt("max errors: |c_full-c_shard|=%.3g |c_ref-c|=%.3g c_after=%.3g shard-vs-full=%.3g "
                 "full-vs-fp64=%.3g bf16=%.3g ulp",
                 max_cos_err, max_ref_err, max_after_err, max_shard_err, max_full_err, max_bf16_ulp));
    chk.Check(counts[0] >= 5 && counts[1] >= 5 && counts[2] >= 5 && counts[3] == 0,
              "every regime must occur at least 5 times (and invalid never)");
    group->barrier()->wait();
    return finish(0);
  } catch (const std::exception& e) {
    chk.Fail(std::string("exception: ") + e.what());
    return finish(4);
  }
}

// ---------------------------------------------------------------------------
// Driver.

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  buf[n] = '\0';
  return buf;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void RunRanks(int world, const std::string& variant) {
  char tmpl[] = "/tmp/gac_sharded_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr) << std::strerror(errno);
  const std::string dir = tmpl;
  const std::string store = dir + "/store";
  const std::string exe = SelfExe();

  std::vector<pid_t> pids(world, -1);
  std::vector<std::string> results(world);
  for (int r = 0; r < world; ++r) {
    results[r] = dir + "/rank" + std::to_string(r) + ".txt";
    std::vector<std::string> args = {exe, "--worker", std::to_string(r), std::to_string(world), store, results[r],
                                     variant};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pids[r], exe.c_str(), nullptr, nullptr, argv.data(), environ);
    ASSERT_EQ(rc, 0) << "posix_spawn: " << std::strerror(rc);
  }

  // Wait with a deadline. Once one rank fails the others may block in a
  // collective: they get a short grace period to write their reports, then
  // they are killed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::chrono::steady_clock::time_point kill_at = deadline;
  std::vector<int> status(world, -1);
  int running = world;
  bool failed = false, timed_out = false;
  while (running > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] < 0) continue;
      int st = 0;
      const pid_t w = waitpid(pids[r], &st, WNOHANG);
      if (w == pids[r]) {
        status[r] = st;
        pids[r] = -1;
        --running;
        if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && !failed) {
          failed = true;
          kill_at = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(5));
        }
      }
    }
    if (running == 0) break;
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) timed_out = true;
    if (now > kill_at) {
      for (int r = 0; r < world; ++r) {
        if (pids[r] > 0) kill(pids[r], SIGKILL);
      }
      for (int r = 0; r < world; ++r) {
        if (pids[r] > 0) {
          waitpid(pids[r], &status[r], 0);
          pids[r] = -1;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  EXPECT_FALSE(timed_out) << "workers did not finish within 120 s";
  for (int r = 0; r < world; ++r) {
    const int st = status[r];
    const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    EXPECT_TRUE(ok) << "rank " << r << " of " << world << " ("
                    << (WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                                      : WIFSIGNALED(st) ? "signal " + std::to_string(WTERMSIG(st)) : "?")
                    << "); its report:\n"
                    << ReadFile(results[r]);
  }
  if (!::testing::Test::HasFailure()) {
    // The summary of rank 0 (regime counts and the largest errors seen).
    std::istringstream in(ReadFile(results[0]));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("regimes:", 0) == 0 || line.rfind("max errors:", 0) == 0 ||
          line.rfind("time:", 0) == 0) std::cout << "  " << line << "\n";
    }
  }
  for (const std::string& f : results) std::remove(f.c_str());
  std::remove(store.c_str());
  rmdir(dir.c_str());
}

TEST(ShardedTest, TwoRanks) { RunRanks(2, "paper-f32-perparam"); }
TEST(ShardedTest, FourRanks) { RunRanks(4, "paper-f32-perparam"); }
TEST(ShardedTest, FourRanksFlatParameter) { RunRanks(4, "paper-f32-flat"); }
TEST(ShardedTest, ThreeRanksExactAlphaBf16Snapshot) { RunRanks(3, "exact-bf16-perparam"); }

TEST(ShardedTest, ShardRangesCoverEveryElementOnce) {
  const std::vector<std::int64_t> numels = {2145, 7, 0, 300000, 385, 2050, 1};
  for (Sharding sharding : {Sharding::kPerParam, Sharding::kFlat}) {
    for (int world : {1, 2, 3, 4, 7}) {
      std::vector<std::int64_t> next(numels.size(), 0);
      for (int r = 0; r < world; ++r) {
        const std::vector<Range> ranges = ShardRanges(numels, r, world, sharding);
        for (std::size_t i = 0; i < numels.size(); ++i) {
          if (ranges[i].size() == 0) continue;
          EXPECT_EQ(ranges[i].begin, next[i]);
          next[i] = ranges[i].end;
        }
      }
      EXPECT_EQ(next, numels);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--worker") == 0) {
    if (argc != 6 && argc != 7) {
      std::fprintf(stderr, "usage: %s --worker <rank> <world> <store_file> <result_file> [<variant>]\n", argv[0]);
      return 2;
    }
    return RunWorker(std::atoi(argv[2]), std::atoi(argv[3]), argv[4], argv[5],
                     argc == 7 ? argv[6] : "paper-f32-perparam");
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
