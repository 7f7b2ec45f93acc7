// The agent on CUDA gradients, end to end: against the fp64 reference
// (tests/agent/reference_gac.h) on CPU copies of the same gradients, and
// against the CPU agent (groups, monitor mode, streams, NCCL). Skipped
// without a CUDA device. Built with any LibTorch so that it keeps compiling;
// the stream and NCCL cases need a CUDA LibTorch (GAC_TEST_TORCH_CUDA).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#ifdef GAC_TEST_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#if defined(GAC_TEST_TORCH_CUDA) && defined(GAC_TEST_NCCL)
#include <nccl.h>

#include "gac/agent/nccl_reducer.h"
#endif

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gac/agent/agent.h"
#include "tests/agent/agent_checks.h"
#include "tests/agent/reference_gac.h"

namespace gac::agent {
namespace {

using gac::testing::MaxRelDiff;
using gac::testing::ReferenceGac;
using gac::testing::RefOptions;

bool HaveCuda() { return at::hasCUDA(); }

#define SKIP_WITHOUT_CUDA() \
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device (or a LibTorch without CUDA)"

// Twin parameter lists, on the GPU and on the CPU, with the same gradients:
// a zero-size tensor, one element, tensors over many 16K-element chunks, a
// transposed (dense, not contiguous) gradient, a strided one (not dense), a
// parameter without a gradient on some steps, and bf16/fp16 gradients.
struct Twins {
  std::vector<at::Tensor> gpu, cpu;
  std::vector<at::Tensor> state;  // fp64 directions the gradients follow

  static Twins Make() {
    Twins m;
    const std::vector<std::vector<std::int64_t>> shapes = {{0},      {1},   {70001},   {33, 65}, {40, 50},
                                                           {7, 300}, {123}, {5, 0, 3}, {300000}, {3 * 16384 + 1}};
    for (const auto& shape : shapes) {
      m.gpu.push_back(at::zeros(shape, at::TensorOptions().device(at::kCUDA)).set_requires_grad(true));
      m.cpu.push_back(at::zeros(shape).set_requires_grad(true));
      m.state.push_back(at::randn(shape, at::kDouble));
    }
    return m;
  }

  // g = a * previous + noise, in each parameter's layout and dtype, on both
  // sides; parameter 6 has no gradient on every third step.
  void NextGradients(double a, bool mixed_dtypes, int step) {
    for (std::size_t i = 0; i < gpu.size(); ++i) {
      state[i] = a * state[i] + at::randn(state[i].sizes(), at::kDouble);
      if (i == 6 && step % 3 == 0) {
        gpu[i].mutable_grad() = at::Tensor();
        cpu[i].mutable_grad() = at::Tensor();
        continue;
      }
      at::ScalarType t = at::kFloat;
      if (mixed_dtypes && (i == 2 || i == 9)) t = at::kBFloat16;
      if (mixed_dtypes && (i == 6 || i == 8)) t = at::kHalf;
      at::Tensor g;
      if (i == 3) {
        g = state[i].to(t).t().contiguous().t();  // transposed layout, dense
      } else if (i == 5) {
        g = at::zeros({7, 600}, at::TensorOptions().dtype(t)).slice(1, 0, 600, 2);  // strided, not dense
        g.copy_(state[i]);
      } else {
        g = state[i].to(t);
      }
      cpu[i].mutable_grad() = g;
      if (i == 5) {
        at::Tensor d = at::zeros({7, 600}, at::TensorOptions().dtype(t).device(at::kCUDA)).slice(1, 0, 600, 2);
        d.copy_(g);
        gpu[i].mutable_grad() = d;
      } else {
        gpu[i].mutable_grad() = g.to(at::kCUDA);  // keeps the dense layout
      }
    }
  }
};

// Alignment schedule that visits every regime with c_low 0.05, c_high 0.3.
const double kSchedule[] = {0.0, 0.1, 0.2, -0.15, 1.5, 0.0, -2.0, 0.25, 0.02, 0.12};

std::unique_ptr<Agent> MakeAgent(AgentOptions o) {
  auto agent = Agent::Create(std::move(o));
  EXPECT_TRUE(agent.ok()) << agent.status().ToString();
  return agent.ok() ? std::move(*agent) : nullptr;
}

class CudaAgentVsReference : public ::testing::TestWithParam<std::tuple<SnapshotDtype, ReferencePolicy, bool>> {};

TEST_P(CudaAgentVsReference, SameDecisionsCosinesAndUpdates) {
  SKIP_WITHOUT_CUDA();
  const auto [snap, policy, mixed] = GetParam();
  at::manual_seed(42);
  Twins m = Twins::Make();
  AgentOptions o;
  o.snapshot_dtype = snap;
  o.reference = policy;
  auto agent = MakeAgent(o);
  ASSERT_NE(agent, nullptr);
  RefOptions ro;
  ro.snapshot_bf16 = snap == SnapshotDtype::kBFloat16;
  ro.applied_update_reference = policy == ReferencePolicy::kAppliedUpdate;
  ReferenceGac reference(ro);

  std::map<controller::Regime, int> seen;
  for (int step = 1; step <= 30; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    m.NextGradients(kSchedule[step % 10], mixed, step);
    base::StatusOr<controller::StepReport> r = agent->Step(step, m.gpu);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto want = reference.Step(m.cpu);

    ASSERT_NO_FATAL_FAILURE(gac::testing::ExpectSameDecision(*r, want, /*strided_tensors=*/1));
    ++seen[r->decision.regime];
    for (std::size_t i = 0; i < m.gpu.size(); ++i) {
      if (m.gpu[i].numel() == 0 || !m.gpu[i].grad().defined()) continue;
      ASSERT_TRUE(m.gpu[i].grad().is_cuda());
      const double tol = m.gpu[i].grad().scalar_type() == at::kFloat ? 1e-6 : 1e-2;
      EXPECT_LE(MaxRelDiff(m.gpu[i].grad(), m.cpu[i].grad()), tol) << "parameter " << i;
    }
  }
  EXPECT_GE(seen[controller::Regime::kSafe], 3);
  EXPECT_GE(seen[controller::Regime::kProject], 6);
  EXPECT_GE(seen[controller::Regime::kSkip], 3);
  EXPECT_GT(agent->snapshot_bytes(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Options, CudaAgentVsReference,
    ::testing::Values(std::make_tuple(SnapshotDtype::kFloat32, ReferencePolicy::kRawGradient, false),
                      std::make_tuple(SnapshotDtype::kBFloat16, ReferencePolicy::kRawGradient, false),
                      std::make_tuple(SnapshotDtype::kFloat32, ReferencePolicy::kAppliedUpdate, false),
                      std::make_tuple(SnapshotDtype::kFloat32, ReferencePolicy::kRawGradient, true),
                      std::make_tuple(SnapshotDtype::kBFloat16, ReferencePolicy::kAppliedUpdate, true)));

// Parameter groups and monitor mode: the GPU agent reports what the CPU
// agent reports on the same gradients, and monitor mode leaves them alone.
TEST(CudaAgentTest, GroupsAndMonitorModeMatchTheCpuAgent) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(7);
  Twins m = Twins::Make();
  for (controller::Mode mode : {controller::Mode::kLocal, controller::Mode::kMonitor}) {
    SCOPED_TRACE(controller::ModeName(mode));
    AgentOptions o;
    o.mode = mode;
    o.layers = {{"a", {0, 2, 3}}, {"b", {5, 8}}, {"c", {9}}};
    auto gpu_agent = MakeAgent(o);
    auto cpu_agent = MakeAgent(o);
    ASSERT_NE(gpu_agent, nullptr);
    ASSERT_NE(cpu_agent, nullptr);
    for (int step = 1; step <= 12; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      m.NextGradients(kSchedule[step % 10], true, step);
      std::vector<at::Tensor> before;
      for (const at::Tensor& p : m.gpu) before.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
      base::StatusOr<controller::StepReport> g = gpu_agent->Step(step, m.gpu);
      base::StatusOr<controller::StepReport> c = cpu_agent->Step(step, m.cpu);
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_EQ(g->decision.regime, c->decision.regime);
      ASSERT_EQ(g->decision.cosine.has_value(), c->decision.cosine.has_value());
      if (c->decision.cosine) {
        EXPECT_NEAR(*g->decision.cosine, *c->decision.cosine, 1e-6);
      }
      EXPECT_NEAR(g->decision.grad_norm, c->decision.grad_norm, 1e-6 * c->decision.grad_norm);
      EXPECT_EQ(g->elements, c->elements);
      EXPECT_EQ(g->tensors, c->tensors);
      ASSERT_EQ(g->layers.size(), 3u);
      for (std::size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(g->layers[k].name, c->layers[k].name);
        EXPECT_NEAR(g->layers[k].grad_sq, c->layers[k].grad_sq, 1e-6 * c->layers[k].grad_sq);
        EXPECT_NEAR(g->layers[k].ref_sq, c->layers[k].ref_sq, 1e-6 * c->layers[k].ref_sq + 1e-30);
        EXPECT_NEAR(g->layers[k].dot, c->layers[k].dot, 1e-6 * std::sqrt(c->layers[k].grad_sq * c->layers[k].ref_sq) + 1e-30);
      }
      if (mode == controller::Mode::kMonitor) {
        EXPECT_FALSE(g->gradient_modified);
        for (std::size_t i = 0; i < m.gpu.size(); ++i) {
          if (before[i].defined()) {
            EXPECT_TRUE(at::equal(m.gpu[i].grad(), before[i])) << "parameter " << i;
          }
        }
      }
    }
  }
}

TEST(CudaAgentTest, MixedCpuAndCudaParametersAreRefused) {
  SKIP_WITHOUT_CUDA();
  at::Tensor a = at::zeros({8}, at::TensorOptions().device(at::kCUDA)).set_requires_grad(true);
  at::Tensor b = at::zeros({8}).set_requires_grad(true);
  a.mutable_grad() = at::ones({8}, at::TensorOptions().device(at::kCUDA));
  b.mutable_grad() = at::ones({8});
  auto agent = MakeAgent({});
  ASSERT_NE(agent, nullptr);
  base::StatusOr<controller::StepReport> r = agent->Step(1, {a, b});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), base::StatusCode::kInvalidArgument) << r.status().ToString();
  r = agent->Step(1, {b, a});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), base::StatusCode::kInvalidArgument) << r.status().ToString();
}

#ifdef GAC_TEST_TORCH_CUDA
// The passes run on the caller's current stream: the projected gradients are
// there, in order, for the next kernel on that stream.
TEST(CudaAgentTest, RunsOnTheCurrentStream) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(3);
  at::Tensor p = at::zeros({1 << 20}, at::TensorOptions().device(at::kCUDA)).set_requires_grad(true);
  const at::Tensor g1 = at::randn({1 << 20}, at::TensorOptions().device(at::kCUDA));
  const at::Tensor noise = at::randn({1 << 20}, at::TensorOptions().device(at::kCUDA));
  // Made on the default stream; the pool stream below does not wait for it.
  c10::cuda::getCurrentCUDAStream().synchronize();
  AgentOptions o;
  o.thresholds.c_low = 1e-3;
  o.thresholds.c_high = 0.999;
  auto agent = MakeAgent(o);
  ASSERT_NE(agent, nullptr);
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(stream);
    p.mutable_grad() = g1.clone();
    ASSERT_TRUE(agent->Step(1, {p}).ok());
    p.mutable_grad() = g1 + noise;  // cosine with g1 ~0.7: project
    base::StatusOr<controller::StepReport> r = agent->Step(2, {p});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->decision.regime, controller::Regime::kProject);
    // Enqueued on `stream` after the projection, without a sync in between.
    const at::Tensor want = (g1 + noise) - static_cast<float>(r->decision.projection_coeff) * g1;
    EXPECT_LE(MaxRelDiff(p.grad(), want), 1e-6);
  }
}
#endif

#if defined(GAC_TEST_TORCH_CUDA) && defined(GAC_TEST_NCCL)
// A one-rank NcclReducer: the device all-reduce (dense gradients only) and
// the host route (with a strided gradient) give the reducer-less results
// bit for bit (a sum over one rank changes nothing).
TEST(CudaAgentTest, NcclReducerOnTheDeviceBuffer) {
  SKIP_WITHOUT_CUDA();
  int device = 0;
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &device), ncclSuccess);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(0).stream();
  for (bool with_strided : {false, true}) {
    SCOPED_TRACE(with_strided ? "host route" : "device route");
    base::StatusOr<std::unique_ptr<NcclReducer>> reducer = NcclReducer::Create(comm, stream);
    ASSERT_TRUE(reducer.ok()) << reducer.status().ToString();
    at::manual_seed(11);
    Twins plain_model = Twins::Make();
    at::manual_seed(11);
    Twins reduced_model = Twins::Make();
    for (Twins* m : {&plain_model, &reduced_model}) {
      if (!with_strided) {
        m->gpu.erase(m->gpu.begin() + 5);
        m->cpu.erase(m->cpu.begin() + 5);
        m->state.erase(m->state.begin() + 5);
      }
    }
    AgentOptions reduced_options;
    reduced_options.reducer = std::shared_ptr<Reducer>(std::move(*reducer));
    auto plain = MakeAgent(AgentOptions{});
    auto reduced = MakeAgent(reduced_options);
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(reduced, nullptr);
    for (int step = 1; step <= 6; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      at::manual_seed(100 + step);
      plain_model.NextGradients(kSchedule[step % 10], false, step);
      at::manual_seed(100 + step);
      reduced_model.NextGradients(kSchedule[step % 10], false, step);
      base::StatusOr<controller::StepReport> a = plain->Step(step, plain_model.gpu);
      base::StatusOr<controller::StepReport> b = reduced->Step(step, reduced_model.gpu);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      EXPECT_EQ(a->decision.regime, b->decision.regime);
      EXPECT_EQ(a->decision.grad_norm, b->decision.grad_norm);
      EXPECT_EQ(a->decision.ref_norm, b->decision.ref_norm);
      EXPECT_EQ(b->strided_tensors, with_strided ? 1 : 0);
    }
  }
  ncclCommDestroy(comm);
}
#endif

}  // namespace
}  // namespace gac::agent
