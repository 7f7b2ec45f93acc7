// The agent core (gac/agent/core.h) on emulated GPU gradients: the CUDA
// passes, the kernels and the host code that drives them run on the host
// emulation of CUDA (gac_cuda_emu/control.h), so what the GPU path decides
// is checked in every test run against the CPU path and an fp64 reference:
//  - one rule on every device: a sequence with projected, skipped, spiking
//    and non-finite steps gives the same c_t and regimes on the CPU (with and
//    without layers) and the GPU, in monitor, local and remote mode, and
//    c_t is always against the last accepted gradient;
//  - faults (a failed launch, allocation or copy, a kernel that faults, a
//    destroyed stream, a stream of another device) are errors from Step
//    that name them, and change nothing: the gradients keep their bytes, a
//    retry decides what an agent that never saw the fault decides;
//  - a CUDA graph capture is refused before anything is enqueued, and the
//    trainer's capture survives;
//  - work on device 1 creates no context on device 0, and the thread is
//    left as it was found;
//  - gradients that are not dense in their snapshot's layout (strided,
//    another layout than at the first step) and misaligned ones give the
//    CPU path's results; ones whose elements share memory are refused;
//  - many layers, and a chunk table beyond the inline limit;
//  - the first-contact check against the front's passes: agreeing kernels
//    stay, disagreeing ones are set aside with one warning.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gac/agent/core.h"
#include "gac/agent/front_passes.h"
#include "gac/agent/nccl_reducer.h"
#include "gac/controller/controller.h"
#include "gac_cuda_emu/control.h"
#include "tests/cuda/host_codecs.h"

namespace gac::agent {
namespace {

using cuda::ElemType;
using cuda::Load;
using cuda::Store;

// A parameter's gradient: its sizes, its layout in storage (strides in
// elements, and an offset in bytes from a 256-byte boundary), its type.
struct Layout {
  std::vector<std::int64_t> sizes;
  ElemType type = ElemType::kF32;
  std::vector<std::int64_t> strides;  // empty: row-major
  int offset_bytes = 0;

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t s : sizes) n *= s;
    return n;
  }
  std::vector<std::int64_t> RowMajor() const {
    std::vector<std::int64_t> st(sizes.size());
    std::int64_t s = 1;
    for (std::size_t d = sizes.size(); d-- > 0;) {
      st[d] = s;
      s *= std::max<std::int64_t>(sizes[d], 1);
    }
    return st;
  }
  const std::vector<std::int64_t> Strides() const { return strides.empty() ? RowMajor() : strides; }
  // Storage element of row-major index i.
  std::int64_t Element(std::int64_t i) const {
    const std::vector<std::int64_t> st = Strides();
    std::int64_t e = 0;
    for (std::size_t d = sizes.size(); d-- > 0;) {
      e += i % sizes[d] * st[d];
      i /= sizes[d];
    }
    return e;
  }
  std::size_t StorageBytes() const {
    std::int64_t last = 0;
    const std::vector<std::int64_t> st = Strides();
    for (std::size_t d = 0; d < sizes.size(); ++d) last += (sizes[d] - 1) * st[d];
    return static_cast<std::size_t>(offset_bytes) + static_cast<std::size_t>(last + 1) * cuda::Size(type);
  }
};

DType ToDType(ElemType t) {
  return t == ElemType::kF32 ? DType::kF32 : t == ElemType::kBF16 ? DType::kBF16 : DType::kF16;
}

// Gradients of a list of parameters in host memory (the CPU path) or in
// emulated device memory (the GPU path), written and read through their
// layouts.
class Gradients : public GradientSource {
 public:
  Gradients(std::vector<Layout> layouts, DeviceId device) : layouts_(std::move(layouts)), device_(device) {
    for (const Layout& l : layouts_) {
      const std::size_t bytes = l.StorageBytes() + 256;
      if (device_.kind == DeviceId::Kind::kCpu) {
        host_.emplace_back(bytes, 0);
        base_.push_back(host_.back().data());
      } else {
        void* p = nullptr;
        SetDevice();
        EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
        EXPECT_EQ(cudaMemset(p, 0, bytes), cudaSuccess);
        base_.push_back(static_cast<std::uint8_t*>(p));
      }
    }
    present_.assign(layouts_.size(), true);
  }
  ~Gradients() override {
    if (device_.kind != DeviceId::Kind::kCpu) {
      for (std::uint8_t* p : base_) cudaFree(p);
    }
  }
  Gradients(const Gradients&) = delete;
  Gradients& operator=(const Gradients&) = delete;

  // Writes the values (row-major, one vector per parameter), rounded to each
  // type, and returns them as read back (the values the agent reads).
  std::vector<std::vector<double>> Write(const std::vector<std::vector<double>>& values) {
    for (std::size_t t = 0; t < layouts_.size(); ++t) {
      std::vector<std::uint8_t> bytes = Storage(t);
      for (std::int64_t i = 0; i < layouts_[t].numel(); ++i) {
        Store(layouts_[t].type, bytes.data() + layouts_[t].offset_bytes, layouts_[t].Element(i),
              static_cast<float>(values[t][static_cast<std::size_t>(i)]));
      }
      SetStorage(t, bytes);
    }
    return Read();
  }
  std::vector<std::vector<double>> Read() const {
    std::vector<std::vector<double>> out;
    for (std::size_t t = 0; t < layouts_.size(); ++t) {
      const std::vector<std::uint8_t> bytes = Storage(t);
      std::vector<double> v(static_cast<std::size_t>(layouts_[t].numel()));
      for (std::int64_t i = 0; i < layouts_[t].numel(); ++i) {
        v[static_cast<std::size_t>(i)] =
            Load(layouts_[t].type, bytes.data() + layouts_[t].offset_bytes, layouts_[t].Element(i));
      }
      out.push_back(std::move(v));
    }
    return out;
  }
  // Every byte of every gradient's storage.
  std::vector<std::vector<std::uint8_t>> Bytes() const {
    std::vector<std::vector<std::uint8_t>> out;
    for (std::size_t t = 0; t < layouts_.size(); ++t) out.push_back(Storage(t));
    return out;
  }
  void SetPresent(std::size_t t, bool present) { present_[t] = present; }
  void SetStream(cudaStream_t stream) { stream_ = stream; }
  // The layout the next steps read (same storage; e.g. another order).
  void SetLayout(std::size_t t, Layout l) { layouts_[t] = std::move(l); }
  std::size_t count() const { return layouts_.size(); }

  std::size_t size() const override { return layouts_.size(); }
  base::Status Describe(std::size_t i, const void** id, TensorView* param, TensorView* grad) override {
    *id = &layouts_[i];
    param_strides_.resize(layouts_.size());
    param_strides_[i] = layouts_[i].RowMajor();
    *param = View(i, param_strides_[i]);
    param->data = nullptr;
    if (present_[i]) *grad = GradView(i);
    return base::Status::Ok();
  }
  base::Status Gather(std::size_t begin, std::size_t end, const void** ids, TensorView* grads,
                      bool* absent) override {
    for (std::size_t i = begin; i < end; ++i) {
      ids[i - begin] = &layouts_[i];
      absent[i - begin] = !present_[i];
      if (present_[i]) grads[i - begin] = GradView(i);
    }
    return base::Status::Ok();
  }
  void* Stream(int) override { return stream_; }

 private:
  TensorView View(std::size_t i, const std::vector<std::int64_t>& strides) const {
    const Layout& l = layouts_[i];
    TensorView v;
    v.sizes = l.sizes.data();
    v.strides = strides.data();
    v.ndim = static_cast<int>(l.sizes.size());
    v.numel = l.numel();
    v.dtype = ToDType(l.type);
    v.device = device_;
    v.contiguous = IsContiguous(v.sizes, v.strides, v.ndim);
    v.non_overlapping_and_dense = NonOverlappingAndDense(v.sizes, v.strides, v.ndim);
    return v;
  }
  TensorView GradView(std::size_t i) {
    grad_strides_.resize(layouts_.size());
    grad_strides_[i] = layouts_[i].Strides();
    TensorView v = View(i, grad_strides_[i]);
    v.data = base_[i] + layouts_[i].offset_bytes;
    return v;
  }
  void SetDevice() const {
    if (device_.kind != DeviceId::Kind::kCpu) {
      EXPECT_EQ(cudaSetDevice(device_.index), cudaSuccess);
    }
  }
  std::vector<std::uint8_t> Storage(std::size_t t) const {
    std::vector<std::uint8_t> bytes(layouts_[t].StorageBytes());
    if (bytes.empty()) return bytes;
    if (device_.kind == DeviceId::Kind::kCpu) {
      std::memcpy(bytes.data(), base_[t], bytes.size());
    } else {
      SetDevice();
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(bytes.data(), base_[t], bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return bytes;
  }
  void SetStorage(std::size_t t, const std::vector<std::uint8_t>& bytes) {
    if (bytes.empty()) return;
    if (device_.kind == DeviceId::Kind::kCpu) {
      std::memcpy(base_[t], bytes.data(), bytes.size());
    } else {
      SetDevice();
      EXPECT_EQ(cudaMemcpy(base_[t], bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }

  std::vector<Layout> layouts_;
  DeviceId device_;
  std::vector<std::vector<std::uint8_t>> host_;
  std::vector<std::uint8_t*> base_;
  std::vector<bool> present_;
  std::vector<std::vector<std::int64_t>> param_strides_, grad_strides_;
  cudaStream_t stream_ = nullptr;
};

DeviceId Cpu() { return DeviceId{}; }
DeviceId Gpu(int index = 0) {
  DeviceId d;
  d.kind = DeviceId::Kind::kCuda;
  d.index = index;
  return d;
}

// Decides as a local agent would: what a remote source that agrees gives.
class AgreeingSource final : public controller::DecisionSource {
 public:
  base::StatusOr<controller::Decision> Decide(std::int64_t, const controller::AlignmentStats& stats) override {
    return controller_.Decide(stats);
  }

 private:
  controller::Controller controller_ = *controller::Controller::Create(controller::Thresholds{0.05, 0.3});
};

AgentOptions Options(controller::Mode mode, int layers = 0, std::size_t count = 0) {
  AgentOptions o;
  o.thresholds = controller::Thresholds{0.05, 0.3};
  o.mode = mode;
  o.num_threads = 2;
  o.chunk_elements = 4096;
  o.spike.max_grad_norm = 500.0;
  if (mode == controller::Mode::kRemote) o.decision_source = std::make_shared<AgreeingSource>();
  for (int k = 0; k < layers; ++k) {
    AgentOptions::LayerSpec spec{"layer" + std::to_string(k), {}};
    for (std::size_t i = static_cast<std::size_t>(k); i < count; i += static_cast<std::size_t>(layers)) {
      spec.parameters.push_back(static_cast<int>(i));
    }
    o.layers.push_back(spec);
  }
  return o;
}

std::unique_ptr<AgentCore> MakeAgent(AgentOptions options) {
  base::StatusOr<std::unique_ptr<AgentCore>> a = AgentCore::Create(std::move(options));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? std::move(*a) : nullptr;
}

// Raw gradients with consecutive cosines near `rho`: g' = rho g + sqrt(1 -
// rho^2) n, per parameter, in fp64.
class Draws {
 public:
  Draws(const std::vector<Layout>& layouts, std::uint64_t seed) : rng_(seed) {
    for (const Layout& l : layouts) raw_.push_back(Normal(l.numel(), 1.0));
  }
  std::vector<std::vector<double>> Next(double rho, double scale = 1.0) {
    for (std::vector<double>& r : raw_) {
      const std::vector<double> n = Normal(static_cast<std::int64_t>(r.size()), 1.0);
      for (std::size_t i = 0; i < r.size(); ++i) r[i] = rho * r[i] + std::sqrt(1.0 - rho * rho) * n[i];
    }
    std::vector<std::vector<double>> out = raw_;
    for (std::vector<double>& v : out) {
      for (double& x : v) x *= scale;
    }
    return out;
  }

 private:
  std::vector<double> Normal(std::int64_t n, double sd) {
    std::normal_distribution<double> normal(0.0, sd);
    std::vector<double> v(static_cast<std::size_t>(n));
    for (double& x : v) x = normal(rng_);
    return v;
  }
  std::mt19937_64 rng_;
  std::vector<std::vector<double>> raw_;
};

double Dot(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double s = 0.0;
  for (std::size_t t = 0; t < a.size(); ++t) {
    for (std::size_t i = 0; i < a[t].size(); ++i) s += a[t][i] * b[t][i];
  }
  return s;
}

// The snapshot as stored: fp32 of the values read.
std::vector<std::vector<double>> AsSnapshot(std::vector<std::vector<double>> v) {
  for (auto& t : v) {
    for (double& x : t) x = static_cast<float>(x);
  }
  return v;
}

void ExpectNear(double got, double want, double rel, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), rel * std::max(std::fabs(want), 1e-2)) << what << ": " << got << " vs " << want;
}

class EmulatedGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { gac_cuda_emu::Reset(); }
  void TearDown() override { gac_cuda_emu::Reset(); }
};

// Mixed types and lengths, a transposed (dense) gradient, a tensor of more
// than one chunk, an empty one.
std::vector<Layout> MixedLayouts() {
  return {Layout{{64, 48}, ElemType::kF32, {}, 0}, Layout{{3000}, ElemType::kBF16, {}, 0},
          Layout{{40, 30}, ElemType::kF16, {1, 40}, 0}, Layout{{0}, ElemType::kF32, {}, 0},
          Layout{{20000}, ElemType::kF32, {}, 0}, Layout{{129}, ElemType::kBF16, {}, 0}};
}

// The spike and NaN sequence: cosines near rho, step 3 a spike (norm far
// above max_grad_norm), step 5 a NaN, the rest projected, skipped or safe.
struct Step {
  double rho;
  double scale;
  bool nan;
};
const std::vector<Step> kSequence = {{0.0, 1.0, false},  {0.15, 1.0, false}, {0.0, 50.0, false},
                                     {0.7, 1.0, false},  {0.1, 1.0, true},   {0.0, 1.0, false},
                                     {0.2, 1.0, false},  {0.9, 1.0, false},  {0.0, 60.0, false},
                                     {0.12, 1.0, false}, {0.02, 1.0, false}};

class OneRule : public EmulatedGpuTest, public ::testing::WithParamInterface<controller::Mode> {};

TEST_P(OneRule, SpikeAndNanSequenceIsTheSameOnCpuAndGpu) {
  const controller::Mode mode = GetParam();
  const std::vector<Layout> layouts = MixedLayouts();
  struct Path {
    const char* name;
    std::unique_ptr<Gradients> grads;
    std::unique_ptr<AgentCore> agent;
  };
  std::vector<Path> paths;
  paths.push_back({"cpu", std::make_unique<Gradients>(layouts, Cpu()), MakeAgent(Options(mode))});
  paths.push_back({"cpu, layers", std::make_unique<Gradients>(layouts, Cpu()), MakeAgent(Options(mode, 2, 6))});
  paths.push_back({"gpu", std::make_unique<Gradients>(layouts, Gpu()), MakeAgent(Options(mode))});
  paths.push_back({"gpu, layers", std::make_unique<Gradients>(layouts, Gpu()), MakeAgent(Options(mode, 2, 6))});
  Draws draws(layouts, 17);
  std::optional<std::vector<std::vector<double>>> accepted;  // the last accepted gradient, as the snapshot holds it
  std::vector<std::string> regimes;
  for (std::size_t s = 0; s < kSequence.size(); ++s) {
    const std::int64_t step = static_cast<std::int64_t>(s) + 1;
    std::vector<std::vector<double>> values = draws.Next(kSequence[s].rho, kSequence[s].scale);
    if (kSequence[s].nan) values[1][17] = std::nan("");
    std::vector<std::vector<double>> read;
    std::vector<controller::StepReport> reports;
    for (Path& p : paths) {
      read = p.grads->Write(values);
      base::StatusOr<controller::StepReport> r = p.agent->Step(step, *p.grads);
      ASSERT_TRUE(r.ok()) << p.name << " step " << step << ": " << r.status().ToString();
      reports.push_back(*r);
    }
    const controller::StepReport& first = reports[0];
    regimes.push_back(controller::RegimeName(first.decision.regime));
    for (std::size_t k = 0; k < paths.size(); ++k) {
      const std::string what = std::string(paths[k].name) + " step " + std::to_string(step);
      const controller::Decision& d = reports[k].decision;
      EXPECT_EQ(d.regime, first.decision.regime) << what;
      EXPECT_EQ(reports[k].passes, k < 2 ? "cpu" : "cuda") << what;
      ASSERT_EQ(d.cosine.has_value(), first.decision.cosine.has_value()) << what;
      // c_t against the last accepted gradient, in fp64.
      if (d.cosine && accepted) {
        const double dot = Dot(read, *accepted), gg = Dot(read, read), pp = Dot(*accepted, *accepted);
        ExpectNear(*d.cosine, dot / (std::sqrt(gg * pp) + 1e-8), 1e-6, what + " cosine");
      }
    }
    const controller::Regime regime = first.decision.regime;
    if (regime != controller::Regime::kInvalid && regime != controller::Regime::kSpike) accepted = AsSnapshot(read);
    // After the step the gradients agree across the paths (projected in
    // local and remote mode alike).
    const std::vector<std::vector<double>> after = paths[0].grads->Read();
    for (std::size_t k = 1; k < paths.size(); ++k) {
      const std::vector<std::vector<double>> other = paths[k].grads->Read();
      for (std::size_t t = 0; t < after.size(); ++t) {
        for (std::size_t i = 0; i < after[t].size(); ++i) {
          if (std::isnan(after[t][i])) {
            ASSERT_TRUE(std::isnan(other[t][i]));
            continue;
          }
          ASSERT_LE(std::fabs(other[t][i] - after[t][i]), 1e-2 * std::fabs(after[t][i]) + 1e-6)
              << paths[k].name << " step " << step << " tensor " << t << " element " << i;
        }
      }
    }
  }
  // The sequence reaches every regime, so the paths can differ where it
  // matters (in remote mode the source decides spikes: this one has no guard).
  for (const char* r : {"safe", "project", "skip", "invalid", "spike"}) {
    if (mode == controller::Mode::kRemote && std::string(r) == "spike") continue;
    EXPECT_NE(std::find(regimes.begin(), regimes.end(), r), regimes.end()) << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, OneRule,
                         ::testing::Values(controller::Mode::kMonitor, controller::Mode::kLocal,
                                           controller::Mode::kRemote),
                         [](const ::testing::TestParamInfo<controller::Mode>& info) {
                           return std::string(controller::ModeName(info.param));
                         });

// The steps of `sequence` on a GPU agent whose step `faulty` fails first
// (the fault set by `inject` before it) and is then retried, against a twin
// that never saw the fault: the same reports, and the failed step left the
// gradients' bytes as they were.
void ExpectFaultChangesNothing(const std::function<void(Gradients&)>& inject, std::int64_t faulty,
                               const std::string& message, const std::function<void(Gradients&)>& repair = {}) {
  const std::vector<Layout> layouts = MixedLayouts();
  Gradients grads(layouts, Gpu()), twin_grads(layouts, Gpu());
  std::unique_ptr<AgentCore> agent = MakeAgent(Options(controller::Mode::kLocal));
  std::unique_ptr<AgentCore> twin = MakeAgent(Options(controller::Mode::kLocal));
  Draws draws(layouts, 5);
  for (std::int64_t step = 1; step <= 6; ++step) {
    const std::vector<std::vector<double>> values = draws.Next(step % 2 == 0 ? 0.15 : 0.02);
    grads.Write(values);
    twin_grads.Write(values);
    if (step == faulty) {
      const std::vector<std::vector<std::uint8_t>> before = grads.Bytes();
      inject(grads);
      base::StatusOr<controller::StepReport> failed = agent->Step(step, grads);
      ASSERT_FALSE(failed.ok()) << "step " << step << " did not fail";
      EXPECT_NE(failed.status().message().find(message), std::string::npos) << failed.status().ToString();
      gac_cuda_emu::ClearFaults();
      if (repair) repair(grads);
      EXPECT_EQ(grads.Bytes(), before) << "the failed step changed the gradients";
    }
    base::StatusOr<controller::StepReport> r = agent->Step(step, grads);
    base::StatusOr<controller::StepReport> want = twin->Step(step, twin_grads);
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status().ToString();
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(r->decision.regime, want->decision.regime) << "step " << step;
    EXPECT_EQ(r->decision.cosine.has_value(), want->decision.cosine.has_value());
    if (r->decision.cosine) {
      EXPECT_EQ(*r->decision.cosine, *want->decision.cosine) << "step " << step;
    }
    EXPECT_EQ(r->decision.grad_norm, want->decision.grad_norm);
    EXPECT_EQ(grads.Bytes(), twin_grads.Bytes()) << "step " << step;
  }
}

TEST_F(EmulatedGpuTest, AFailedLaunchIsAnErrorAndChangesNothing) {
  // The statistics kernel's launch at step 3, and the projection's at step 4.
  ExpectFaultChangesNothing(
      [](Gradients&) { gac_cuda_emu::InjectFault(gac_cuda_emu::Call::kLaunchKernel, cudaErrorLaunchOutOfResources); },
      3, "cudaErrorLaunchOutOfResources");
  gac_cuda_emu::Reset();
  ExpectFaultChangesNothing(
      [](Gradients&) {
        gac_cuda_emu::InjectFault(gac_cuda_emu::Call::kLaunchKernel, cudaErrorLaunchOutOfResources, 3);
      },
      4, "launching the projection kernel");
}

TEST_F(EmulatedGpuTest, AFailedAllocationIsAnErrorAndChangesNothing) {
  ExpectFaultChangesNothing(
      [](Gradients&) { gac_cuda_emu::InjectFault(gac_cuda_emu::Call::kMalloc, cudaErrorMemoryAllocation); }, 1,
      "cudaErrorMemoryAllocation");
}

TEST_F(EmulatedGpuTest, AFailedCopyOfTheSumsIsAnErrorAndChangesNothing) {
  ExpectFaultChangesNothing(
      [](Gradients&) { gac_cuda_emu::InjectFault(gac_cuda_emu::Call::kMemcpyAsync, cudaErrorIllegalAddress); }, 2,
      "reading the statistics back");
}

TEST_F(EmulatedGpuTest, ADestroyedStreamIsAnErrorAndChangesNothing) {
  ExpectFaultChangesNothing(
      [](Gradients& g) {
        cudaStream_t s = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
        ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
        g.SetStream(s);
      },
      3, "cudaErrorInvalidResourceHandle", [](Gradients& g) { g.SetStream(nullptr); });
}

TEST_F(EmulatedGpuTest, AStreamOfAnotherDeviceIsAnErrorAndChangesNothing) {
  gac_cuda_emu::SetDeviceCount(2);
  cudaStream_t other = nullptr;
  ExpectFaultChangesNothing(
      [&](Gradients& g) {
        ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
        ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
        ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
        g.SetStream(other);
      },
      2, "cudaErrorInvalidResourceHandle", [](Gradients& g) { g.SetStream(nullptr); });
}

TEST_F(EmulatedGpuTest, AKernelThatFaultsIsAnErrorThatNamesIt) {
  const std::vector<Layout> layouts = MixedLayouts();
  Gradients grads(layouts, Gpu());
  std::unique_ptr<AgentCore> agent = MakeAgent(Options(controller::Mode::kLocal));
  Draws draws(layouts, 9);
  grads.Write(draws.Next(0.0));
  ASSERT_TRUE(agent->Step(1, grads).ok());
  grads.Write(draws.Next(0.15));
  const std::uint64_t applied = gac_cuda_emu::LaunchCount("gac_project_f32_inline") +
                                gac_cuda_emu::LaunchCount("gac_snapshot_f32_inline");
  gac_cuda_emu::InjectKernelFault("gac_stats_f32_inline", cudaErrorIllegalAddress);
  base::StatusOr<controller::StepReport> r = agent->Step(2, grads);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cudaErrorIllegalAddress"), std::string::npos) << r.status().ToString();
  // Nothing was applied after the statistics failed (the context is lost,
  // as on a GPU: its errors are sticky).
  EXPECT_EQ(gac_cuda_emu::LaunchCount("gac_project_f32_inline") + gac_cuda_emu::LaunchCount("gac_snapshot_f32_inline"),
            applied);
}

TEST_F(EmulatedGpuTest, AGraphCaptureIsRefusedAndSurvives) {
  const std::vector<Layout> layouts = MixedLayouts();
  Gradients grads(layouts, Gpu());
  std::unique_ptr<AgentCore> agent = MakeAgent(Options(controller::Mode::kLocal));
  Draws draws(layouts, 3);
  grads.Write(draws.Next(0.0));
  ASSERT_TRUE(agent->Step(1, grads).ok());
  grads.Write(draws.Next(0.15));
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  grads.SetStream(s);
  const std::uint64_t launches = gac_cuda_emu::LaunchCount("gac_stats_f32_device");
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  base::StatusOr<controller::StepReport> r = agent->Step(2, grads);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), base::StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("capturing a graph"), std::string::npos);
  EXPECT_EQ(gac_cuda_emu::LaunchCount("gac_stats_f32_device"), launches) << "work was enqueued into the capture";
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess) << "the trainer's capture was invalidated";
  if (graph != nullptr) cudaGraphDestroy(graph);
  // Outside the capture the same step runs.
  r = agent->Step(2, grads);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->decision.regime, controller::Regime::kProject);
  cudaStreamDestroy(s);
}

// A thread with no CUDA context steps gradients on device 1: device 0 gets no
// context, and the thread has none afterwards; a thread on device 0 is left
// on device 0.
TEST_F(EmulatedGpuTest, WorkOnDevice1CreatesNoContextOnDevice0) {
  gac_cuda_emu::SetDeviceCount(2);
  const std::vector<Layout> layouts = MixedLayouts();
  std::unique_ptr<Gradients> grads;
  std::thread([&] { grads = std::make_unique<Gradients>(layouts, Gpu(1)); }).join();
  std::unique_ptr<AgentCore> agent = MakeAgent(Options(controller::Mode::kLocal));
  Draws draws(layouts, 4);
  for (std::int64_t step = 1; step <= 3; ++step) {
    std::thread([&] { grads->Write(draws.Next(0.15)); }).join();
    std::thread([&] {
      base::StatusOr<controller::StepReport> r = agent->Step(step, *grads);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      void* get = nullptr;
      cudaDriverEntryPointQueryResult found;
      ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault, &found),
                cudaSuccess);
      void* context = reinterpret_cast<void*>(1);
      reinterpret_cast<int (*)(void**)>(get)(&context);
      EXPECT_EQ(context, nullptr) << "the step left a context current on a thread that had none";
    }).join();
  }
  EXPECT_TRUE(gac_cuda_emu::ContextCreated(1));
  EXPECT_FALSE(gac_cuda_emu::ContextCreated(0));
  std::thread([&] { grads->Write(draws.Next(0.15)); }).join();
  std::thread([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_TRUE(agent->Step(4, *grads).ok());
    int device = -1;
    ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
    EXPECT_EQ(device, 0);
  }).join();
  std::thread([&] { agent.reset(); grads.reset(); }).join();
}

// A device switch that fails is the step's error, and the step changes nothing.
TEST_F(EmulatedGpuTest, AFailedDeviceSwitchIsAnErrorAndChangesNothing) {
  gac_cuda_emu::SetDeviceCount(2);
  const std::vector<Layout> layouts = MixedLayouts();
  Gradients grads(layouts, Gpu(1));
  std::unique_ptr<AgentCore> agent = MakeAgent(Options(controller::Mode::kLocal));
  Draws draws(layouts, 6);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // the trainer's thread works on another device
  grads.Write(draws.Next(0.0));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_TRUE(agent->Step(1, grads).ok());
  grads.Write(draws.Next(0.15));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const std::vector<std::vector<std::uint8_t>> before = grads.Bytes();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  gac_cuda_emu::InjectFault(gac_cuda_emu::Call::kSetDevice, cudaErrorDevicesUnavailable);
  base::StatusOr<controller::StepReport> r = agent->Step(2, grads);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("selecting CUDA device 1"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(r.status().code(), base::StatusCode::kUnavailable);
  gac_cuda_emu::ClearFaults();
  EXPECT_EQ(grads.Bytes(), before);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  r = agent->Step(2, grads);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->decision.regime, controller::Regime::kProject);
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 0) << "the thread's device was not put back";
}

// Each step on a stream of its own that the trainer destroys after it (as a
// torch ExternalStream may be): gac orders later work through an event it
// recorded when it enqueued, never on a stream that may be gone.
TEST_F(EmulatedGpuTest, AStreamDestroyedBetweenStepsIsNoError) {
  const std::vector<Layout> layouts = MixedLayouts();
  Gradients grads(layouts, Gpu());
  std::unique_ptr<AgentCore> agent = MakeAgent(Options(controller::Mode::kLocal));
  Draws draws(layouts, 10);
  std::vector<std::string> regimes;
  for (std::int64_t step = 1; step <= 5; ++step) {
    grads.Write(draws.Next(step % 2 == 0 ? 0.15 : 0.02));
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    grads.SetStream(s);
    base::StatusOr<controller::StepReport> r = agent->Step(step, grads);
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status().ToString();
    regimes.push_back(controller::RegimeName(r->decision.regime));
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);  // the projection may still be pending on it
    grads.SetStream(nullptr);
  }
  EXPECT_NE(std::find(regimes.begin(), regimes.end(), "project"), regimes.end());
}

// The NCCL reducer's buffer and event live on its communicator's device,
// whatever the thread's current device.
TEST_F(EmulatedGpuTest, TheNcclReducerWorksOnItsCommunicatorsDevice) {
  gac_cuda_emu::SetDeviceCount(2);
  std::thread([] {
    int device = 1;
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitAll(&comm, 1, &device), ncclSuccess);
    base::StatusOr<std::unique_ptr<NcclReducer>> reducer = NcclReducer::Create(comm, nullptr);
    ASSERT_TRUE(reducer.ok()) << reducer.status().ToString();
    double values[3] = {1.0, 2.0, 3.0};
    ASSERT_TRUE((*reducer)->AllReduceSum(values, 3).ok());
    EXPECT_EQ(values[2], 3.0);
    reducer->reset();
    ncclCommDestroy(comm);
  }).join();
  EXPECT_FALSE(gac_cuda_emu::ContextCreated(0));
}

// Gradients not dense in their snapshot's layout, through the device's
// strided path, against the CPU's.
TEST_F(EmulatedGpuTest, StridedAndRelaidGradientsAreTheCpuPathsOnTheGpu) {
  std::vector<Layout> layouts = {
      Layout{{50, 40}, ElemType::kF32, {}, 0},
      Layout{{2500}, ElemType::kBF16, {2}, 0},      // every other element
      Layout{{30, 20}, ElemType::kF16, {40, 2}, 0},  // a slice with gaps
      Layout{{64, 33}, ElemType::kF32, {}, 0},       // re-laid transposed from step 3 on
  };
  const std::vector<Layout> start = layouts;
  Gradients cpu(layouts, Cpu()), gpu(layouts, Gpu());
  std::unique_ptr<AgentCore> a = MakeAgent(Options(controller::Mode::kLocal, 2, layouts.size()));
  std::unique_ptr<AgentCore> b = MakeAgent(Options(controller::Mode::kLocal, 2, layouts.size()));
  Draws draws(layouts, 21);
  std::vector<std::string> regimes;
  for (std::int64_t step = 1; step <= 8; ++step) {
    if (step == 3) {
      Layout transposed{{64, 33}, ElemType::kF32, {1, 64}, 0};
      cpu.SetLayout(3, transposed);
      gpu.SetLayout(3, transposed);
    }
    const auto values = draws.Next(kSequence[static_cast<std::size_t>(step)].rho);
    cpu.Write(values);
    gpu.Write(values);
    base::StatusOr<controller::StepReport> x = a->Step(step, cpu), y = b->Step(step, gpu);
    ASSERT_TRUE(x.ok()) << x.status().ToString();
    ASSERT_TRUE(y.ok()) << y.status().ToString();
    EXPECT_EQ(y->strided_tensors, x->strided_tensors) << "step " << step;
    EXPECT_GE(y->strided_tensors, 2);
    EXPECT_EQ(x->decision.regime, y->decision.regime) << "step " << step;
    if (x->decision.cosine) ExpectNear(*y->decision.cosine, *x->decision.cosine, 1e-6, "cosine");
    for (std::size_t l = 0; l < x->layers.size(); ++l) {
      ExpectNear(y->layers[l].grad_sq, x->layers[l].grad_sq, 1e-6, "layer |g|^2");
      ExpectNear(y->layers[l].dot, x->layers[l].dot, 1e-5, "layer dot");
    }
    const auto xs = cpu.Read(), ys = gpu.Read();
    for (std::size_t t = 0; t < xs.size(); ++t) {
      for (std::size_t i = 0; i < xs[t].size(); ++i) {
        ASSERT_LE(std::fabs(ys[t][i] - xs[t][i]), 1e-2 * std::fabs(xs[t][i]) + 1e-6) << "tensor " << t;
      }
    }
    // Storage outside the strided views is never written.
    if (step == 1) {
      const auto bytes = gpu.Bytes();
      for (std::size_t i = 2; i < bytes[1].size(); i += 4) ASSERT_EQ(bytes[1][i], 0) << i;
    }
    regimes.push_back(controller::RegimeName(x->decision.regime));
  }
  EXPECT_NE(std::find(regimes.begin(), regimes.end(), "project"), regimes.end());
  (void)start;
}

TEST_F(EmulatedGpuTest, GradientsWhoseElementsShareMemoryAreRefused) {
  std::vector<Layout> layouts = {Layout{{16, 8}, ElemType::kF32, {0, 1}, 0}};  // expand()ed rows
  Gradients gpu(layouts, Gpu());
  std::unique_ptr<AgentCore> agent = MakeAgent(Options(controller::Mode::kLocal));
  Draws draws(layouts, 1);
  gpu.Write(draws.Next(0.0));
  base::StatusOr<controller::StepReport> r = agent->Step(1, gpu);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), base::StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("share memory"), std::string::npos) << r.status().ToString();
}

// Gradients 2 to 14 bytes past a 16-byte boundary (views into flat buffers):
// the snapshot slices take the same misalignment, so the vector path runs
// after a prologue (a misaligned 16-byte load would be UndefinedBehavior-
// Sanitizer's report in the checking build), with the CPU path's results.
TEST_F(EmulatedGpuTest, MisalignedGradientsGiveTheCpuPathsResults) {
  std::vector<Layout> layouts;
  for (int offset : {2, 4, 6, 8, 10, 12, 14}) {
    layouts.push_back(Layout{{5000 + offset}, ElemType::kBF16, {}, offset});
    if (offset % 4 == 0) layouts.push_back(Layout{{7001}, ElemType::kF32, {}, offset});
  }
  for (bool bf16_snapshot : {false, true}) {
    Gradients cpu(layouts, Cpu()), gpu(layouts, Gpu());
    AgentOptions options = Options(controller::Mode::kLocal);
    options.snapshot_dtype = bf16_snapshot ? SnapshotDtype::kBFloat16 : SnapshotDtype::kFloat32;
    std::unique_ptr<AgentCore> a = MakeAgent(options), b = MakeAgent(options);
    Draws draws(layouts, 8);
    for (std::int64_t step = 1; step <= 5; ++step) {
      const auto values = draws.Next(step == 3 ? 0.15 : 0.5);
      cpu.Write(values);
      gpu.Write(values);
      base::StatusOr<controller::StepReport> x = a->Step(step, cpu), y = b->Step(step, gpu);
      ASSERT_TRUE(x.ok() && y.ok());
      EXPECT_EQ(y->strided_tensors, 0);
      EXPECT_EQ(x->decision.regime, y->decision.regime);
      if (x->decision.cosine) ExpectNear(*y->decision.cosine, *x->decision.cosine, 1e-6, "cosine");
      ExpectNear(y->decision.grad_norm, x->decision.grad_norm, 1e-6, "grad_norm");
      const auto xs = cpu.Read(), ys = gpu.Read();
      for (std::size_t t = 0; t < xs.size(); ++t) {
        for (std::size_t i = 0; i < xs[t].size(); ++i) {
          ASSERT_LE(std::fabs(ys[t][i] - xs[t][i]), 1e-2 * std::fabs(xs[t][i]) + 1e-6) << "tensor " << t;
        }
      }
    }
  }
}

// 300 layers (one tensor each: more tensors than the inline table holds, and
// a finalize block per layer), against the CPU.
TEST_F(EmulatedGpuTest, ManyLayersAndADeviceChunkTable) {
  std::vector<Layout> layouts;
  for (int i = 0; i < 300; ++i) layouts.push_back(Layout{{100 + 37 * (i % 20)}, static_cast<ElemType>(i % 3), {}, 0});
  Gradients cpu(layouts, Cpu()), gpu(layouts, Gpu());
  std::unique_ptr<AgentCore> a = MakeAgent(Options(controller::Mode::kMonitor, 300, 300));
  std::unique_ptr<AgentCore> b = MakeAgent(Options(controller::Mode::kMonitor, 300, 300));
  Draws draws(layouts, 12);
  for (std::int64_t step = 1; step <= 3; ++step) {
    const auto values = draws.Next(0.4);
    cpu.Write(values);
    gpu.Write(values);
    base::StatusOr<controller::StepReport> x = a->Step(step, cpu), y = b->Step(step, gpu);
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_EQ(y->layers.size(), 300u);
    for (std::size_t l = 0; l < 300; ++l) {
      ExpectNear(y->layers[l].grad_sq, x->layers[l].grad_sq, 1e-6, "layer " + std::to_string(l));
      ExpectNear(y->layers[l].ref_sq, x->layers[l].ref_sq, 1e-6, "layer " + std::to_string(l));
    }
  }
  EXPECT_EQ(gac_cuda_emu::BlocksRun("gac_finalize"), 3u * 301u);
}

// A C++ stand-in for the front's passes: the sums computed on the host from
// the emulated device memory (the same values the kernels read), scaled by
// `error` to play a front that disagrees with the kernels.
class HostFront final : public FrontPasses {
 public:
  HostFront(Gradients* grads, double error, int* statistics_calls)
      : grads_(grads), error_(error), calls_(statistics_calls) {}
  base::Status Statistics(const std::vector<char>& present, bool with_p, double* out) override {
    ++*calls_;
    const auto g = grads_->Read();
    if (snapshot_.empty()) {
      snapshot_.resize(g.size());
      for (std::size_t t = 0; t < g.size(); ++t) snapshot_[t].assign(g[t].size(), 0.0);
    }
    double dot = 0.0, gg = 0.0, pp = 0.0;
    for (std::size_t t = 0; t < g.size(); ++t) {
      if (present[t] != 1) continue;
      for (std::size_t i = 0; i < g[t].size(); ++i) {
        gg += g[t][i] * g[t][i];
        dot += g[t][i] * snapshot_[t][i];
        pp += snapshot_[t][i] * snapshot_[t][i];
      }
    }
    out[0] = with_p ? dot * error_ : 0.0;
    out[1] = gg * error_;
    out[2] = with_p ? pp * error_ : 0.0;
    present_ = present;
    return base::Status::Ok();
  }
  base::Status Apply(bool project, float, bool) override {
    if (project) return base::Status::Unimplemented("the host front only keeps a snapshot");
    snapshot_ = AsSnapshot(grads_->Read());
    return base::Status::Ok();
  }
  std::int64_t snapshot_bytes() const override { return 0; }
  const char* name() const override { return "host"; }

 private:
  Gradients* grads_;
  double error_;
  int* calls_;
  std::vector<std::vector<double>> snapshot_;
  std::vector<char> present_;
};

AgentOptions CheckedOptions(Gradients* grads, double error, int* calls) {
  AgentOptions o = Options(controller::Mode::kMonitor);
  o.spike = controller::SpikeSettings{};
  o.front_passes = [grads, error, calls](const FrontPassesRequest&) -> base::StatusOr<std::unique_ptr<FrontPasses>> {
    return std::unique_ptr<FrontPasses>(new HostFront(grads, error, calls));
  };
  return o;
}

TEST_F(EmulatedGpuTest, AgreeingKernelsPassTheFirstContactCheckAndKeepRunning) {
  const std::vector<Layout> layouts = MixedLayouts();
  Gradients grads(layouts, Gpu());
  int calls = 0;
  std::unique_ptr<AgentCore> agent = MakeAgent(CheckedOptions(&grads, 1.0, &calls));
  Draws draws(layouts, 2);
  for (std::int64_t step = 1; step <= 4; ++step) {
    grads.Write(draws.Next(0.3));
    base::StatusOr<controller::StepReport> r = agent->Step(step, grads);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->passes, "cuda");
  }
  EXPECT_EQ(calls, 2) << "checked on the first step (|g|^2) and the first with a reference, then no more";
  EXPECT_TRUE(agent->TakeWarnings().empty());
}

TEST_F(EmulatedGpuTest, DisagreeingKernelsAreSetAsideWithOneWarning) {
  gac_cuda_emu::SetDeviceCount(3);
  const std::vector<Layout> layouts = MixedLayouts();
  Gradients grads(layouts, Gpu(2));  // a device of its own: the verdict holds for the process
  int calls = 0;
  std::unique_ptr<AgentCore> agent = MakeAgent(CheckedOptions(&grads, 1.01, &calls));
  Draws draws(layouts, 2);
  grads.Write(draws.Next(0.3));
  base::StatusOr<controller::StepReport> r = agent->Step(1, grads);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->passes, "host") << "the step uses the front's sums";
  std::vector<std::string> warnings = agent->TakeWarnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("cuda:2"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("gac_stats"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("0.0099"), std::string::npos) << warnings[0];
  const std::uint64_t launches = gac_cuda_emu::LaunchCount("gac_stats_f32_device") +
                                 gac_cuda_emu::LaunchCount("gac_stats_f32_inline");
  for (std::int64_t step = 2; step <= 3; ++step) {
    grads.Write(draws.Next(0.3));
    r = agent->Step(step, grads);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->passes, "host");
  }
  EXPECT_EQ(gac_cuda_emu::LaunchCount("gac_stats_f32_device") + gac_cuda_emu::LaunchCount("gac_stats_f32_inline"),
            launches)
      << "the kernels ran after they were set aside";
  EXPECT_TRUE(agent->TakeWarnings().empty()) << "one warning, not one per step";
  // Another agent on the device goes to the front's passes from its first step.
  int other_calls = 0;
  std::unique_ptr<AgentCore> other = MakeAgent(CheckedOptions(&grads, 1.0, &other_calls));
  r = other->Step(1, grads);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->passes, "host");
  EXPECT_TRUE(other->TakeWarnings().empty());
}

}  // namespace
}  // namespace gac::agent
