// Agent::Step against the plain fp64 reference (reference_gac.h), and its
// contract: modes, first step, invalid input, changed parameter sets.
#include "gac/agent/agent.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <tuple>

#include "tests/agent/agent_checks.h"
#include "tests/agent/reference_gac.h"

namespace gac::agent {
namespace {

using gac::testing::MaxRelDiff;
using gac::testing::ReferenceGac;
using gac::testing::RefOptions;

// Parameters of awkward shapes and layouts: a zero-size tensor, one element,
// a tensor spanning many 1024-element chunks, a transposed (dense, not
// contiguous) gradient, a strided slice (not dense), and bf16/fp16 gradients.
struct Model {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> state;  // per parameter: the fp64 "direction" the gradients follow

  static Model Make() {
    Model m;
    const std::vector<std::vector<std::int64_t>> shapes = {{0}, {1}, {70001}, {33, 65}, {40, 50}, {7, 300}, {123}, {5, 0, 3}};
    for (const auto& shape : shapes) {
      m.params.push_back(at::zeros(shape).set_requires_grad(true));
      m.state.push_back(at::randn(shape, at::kDouble));
    }
    return m;
  }

  // Sets gradients g = a * previous + noise, in each parameter's layout.
  void NextGradients(double a, bool mixed_dtypes) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      state[i] = a * state[i] + at::randn(state[i].sizes(), at::kDouble);
      at::Tensor g;
      if (i == 3) {
        g = state[i].t().contiguous().t();  // transposed layout, dense
      } else if (i == 5) {
        g = at::zeros({7, 600}, at::kDouble).slice(1, 0, 600, 2);  // strided, not dense
        g.copy_(state[i]);
      } else {
        g = state[i].clone();
      }
      at::ScalarType t = at::kFloat;
      if (mixed_dtypes && i == 2) t = at::kBFloat16;
      if (mixed_dtypes && i == 6) t = at::kHalf;
      if (i == 5) {
        at::Tensor typed = at::zeros({7, 600}, at::TensorOptions().dtype(t)).slice(1, 0, 600, 2);
        typed.copy_(g);
        params[i].mutable_grad() = typed;
      } else if (i == 3) {
        params[i].mutable_grad() = g.to(t).t().contiguous().t();
      } else {
        params[i].mutable_grad() = g.to(t);
      }
    }
  }

  std::vector<at::Tensor> CloneGrads() const {
    std::vector<at::Tensor> out;
    for (const auto& p : params) out.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    return out;
  }
  void SetGrads(const std::vector<at::Tensor>& grads) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = grads[i].defined() ? grads[i].clone() : at::Tensor();
    }
  }
  // Clones that keep the odd layouts of the originals.
  std::vector<at::Tensor> CloneGradsKeepLayout() const {
    std::vector<at::Tensor> out;
    for (const auto& p : params) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) {
        out.emplace_back();
        continue;
      }
      at::Tensor c = at::empty_strided(g.sizes(), g.strides(), g.options());
      if (!g.is_non_overlapping_and_dense()) {
        c = at::zeros({g.size(0), g.size(1) * 2}, g.options()).slice(1, 0, g.size(1) * 2, 2);
      }
      c.copy_(g);
      out.push_back(c);
    }
    return out;
  }
};

// Alignment schedule that visits every regime with c_low 0.05, c_high 0.3.
const double kSchedule[] = {0.0, 0.1, 0.2, -0.15, 1.5, 0.0, -2.0, 0.25, 0.02, 0.12};

std::unique_ptr<Agent> MakeAgent(AgentOptions o) {
  auto agent = Agent::Create(std::move(o));
  EXPECT_TRUE(agent.ok()) << agent.status().ToString();
  return std::move(*agent);
}

class AgentVsReference
    : public ::testing::TestWithParam<std::tuple<SnapshotDtype, controller::AlphaMode, ReferencePolicy, int, bool>> {};

TEST_P(AgentVsReference, SameDecisionsCosinesAndUpdates) {
  const auto [snap, alpha_mode, policy, threads, mixed] = GetParam();
  at::manual_seed(42);
  Model agent_model = Model::Make();

  AgentOptions o;
  o.snapshot_dtype = snap;
  o.alpha_mode = alpha_mode;
  o.reference = policy;
  o.num_threads = threads;
  o.chunk_elements = 1024;
  auto agent = MakeAgent(o);

  RefOptions ro;
  ro.exact_alpha = alpha_mode == controller::AlphaMode::kExact;
  ro.snapshot_bf16 = snap == SnapshotDtype::kBFloat16;
  ro.applied_update_reference = policy == ReferencePolicy::kAppliedUpdate;
  ReferenceGac reference(ro);
  Model ref_model = Model::Make();  // same shapes; gradients copied below

  std::map<controller::Regime, int> seen;
  for (int step = 1; step <= 40; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    agent_model.NextGradients(kSchedule[step % 10], mixed);
    ref_model.SetGrads(agent_model.CloneGradsKeepLayout());

    base::StatusOr<controller::StepReport> r = agent->Step(step, agent_model.params);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto want = reference.Step(ref_model.params);

    ASSERT_NO_FATAL_FAILURE(gac::testing::ExpectSameDecision(*r, want, /*strided_tensors=*/1));
    ++seen[r->decision.regime];
    for (std::size_t i = 0; i < agent_model.params.size(); ++i) {
      if (agent_model.params[i].numel() == 0) continue;
      const double tol = agent_model.params[i].grad().scalar_type() == at::kFloat ? 1e-6 : 1e-2;
      EXPECT_LE(MaxRelDiff(agent_model.params[i].grad(), ref_model.params[i].grad()), tol) << "parameter " << i;
    }
  }
  // The schedule must really exercise every regime, or the test proves little.
  EXPECT_GE(seen[controller::Regime::kSafe], 4);
  EXPECT_GE(seen[controller::Regime::kProject], 8);
  EXPECT_GE(seen[controller::Regime::kSkip], 4);
}

INSTANTIATE_TEST_SUITE_P(
    Options, AgentVsReference,
    ::testing::Values(std::make_tuple(SnapshotDtype::kFloat32, controller::AlphaMode::kPaper, ReferencePolicy::kRawGradient, 1, false),
                      std::make_tuple(SnapshotDtype::kFloat32, controller::AlphaMode::kExact, ReferencePolicy::kRawGradient, 2, false),
                      std::make_tuple(SnapshotDtype::kBFloat16, controller::AlphaMode::kPaper, ReferencePolicy::kRawGradient, 2, false),
                      std::make_tuple(SnapshotDtype::kFloat32, controller::AlphaMode::kPaper, ReferencePolicy::kAppliedUpdate, 2, false),
                      std::make_tuple(SnapshotDtype::kFloat32, controller::AlphaMode::kPaper, ReferencePolicy::kRawGradient, 2, true),
                      std::make_tuple(SnapshotDtype::kBFloat16, controller::AlphaMode::kExact, ReferencePolicy::kRawGradient, 1, true)));

// A single fp32 parameter with gradients we set by hand.
struct One {
  at::Tensor param = at::zeros({4096}).set_requires_grad(true);
  std::vector<at::Tensor> params{param};
  void Set(const at::Tensor& g) { param.mutable_grad() = g.clone(); }
};

TEST(AgentStep, FirstStepHasNoCosineAndSnapshotsTheGradient) {
  One m;
  auto agent = MakeAgent({});
  m.Set(at::randn({4096}));
  auto r = agent->Step(1, m.params);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->decision.regime, controller::Regime::kSafe);
  EXPECT_FALSE(r->decision.cosine.has_value());
  EXPECT_TRUE(r->step_optimizer);
  EXPECT_NEAR(r->decision.grad_norm, m.param.grad().norm().item<double>(), 1e-4);
  // Second step with the same gradient: cosine 1, skip.
  r = agent->Step(2, m.params);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->decision.cosine.has_value());
  EXPECT_NEAR(*r->decision.cosine, 1.0, 1e-6);
  EXPECT_EQ(r->decision.regime, controller::Regime::kSkip);
  EXPECT_FALSE(r->step_optimizer);
  EXPECT_EQ(agent->snapshot_bytes(), 4096 * 4);
}

// Snapshots from 2 MiB on are mapped separately (huge pages on Linux): around
// that size, and across Reset() (which frees and maps again), the agent must
// still agree with the fp64 reference.
TEST(AgentStep, LargeSnapshotsAgreeWithTheReference) {
  const std::int64_t kMiB = 1 << 20;
  // fp32 snapshot bytes: just below 2 MiB (after the slice padding), exactly
  // 2 MiB, 5 MiB + 4 bytes; bf16: exactly 2 MiB.
  const std::vector<std::pair<std::int64_t, SnapshotDtype>> cases = {
      {kMiB / 2 - 64, SnapshotDtype::kFloat32},
      {kMiB / 2, SnapshotDtype::kFloat32},
      {5 * kMiB / 4 + 1, SnapshotDtype::kFloat32},
      {kMiB, SnapshotDtype::kBFloat16}};
  for (const auto& [numel, snap] : cases) {
    SCOPED_TRACE("numel " + std::to_string(numel));
    at::manual_seed(7);
    at::Tensor param = at::zeros({numel}).set_requires_grad(true);
    at::Tensor ref_param = at::zeros({numel}).set_requires_grad(true);
    AgentOptions o;
    o.snapshot_dtype = snap;
    o.num_threads = 2;
    auto agent = MakeAgent(o);
    RefOptions ro;
    ro.snapshot_bf16 = snap == SnapshotDtype::kBFloat16;
    ReferenceGac reference(ro);
    at::Tensor state = at::randn({numel}, at::kDouble);
    for (int step = 1; step <= 12; ++step) {
      if (step == 7) {  // a fresh plan and snapshot; the reference starts over too
        agent->Reset();
        reference = ReferenceGac(ro);
      }
      state = kSchedule[step % 10] * state + at::randn({numel}, at::kDouble);
      param.mutable_grad() = state.to(at::kFloat);
      ref_param.mutable_grad() = state.to(at::kFloat);
      base::StatusOr<controller::StepReport> r = agent->Step(step, {param});
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      const auto want = reference.Step({ref_param});
      ASSERT_EQ(controller::RegimeName(r->decision.regime), want.regime) << "step " << step;
      ASSERT_EQ(r->decision.cosine.has_value(), want.cosine.has_value());
      if (want.cosine) {
        EXPECT_NEAR(*r->decision.cosine, *want.cosine, 1e-6);
      }
      EXPECT_LE(MaxRelDiff(param.grad(), ref_param.grad()), 1e-6) << "step " << step;
    }
    // One slice, padded to a multiple of 32 elements.
    const std::int64_t elem = snap == SnapshotDtype::kBFloat16 ? 2 : 4;
    EXPECT_EQ(agent->snapshot_bytes(), (numel + 31) / 32 * 32 * elem);
  }
}

TEST(AgentStep, MonitorModeNeverChangesTheUpdate) {
  One m;
  AgentOptions o;
  o.mode = controller::Mode::kMonitor;
  auto agent = MakeAgent(o);
  const at::Tensor base = at::randn({4096});
  for (int step = 1; step <= 6; ++step) {
    const at::Tensor g = base * (step % 2 ? 1.0 : 0.2) + 0.3 * at::randn({4096});
    m.Set(g);
    auto r = agent->Step(step, m.params);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->step_optimizer);
    EXPECT_FALSE(r->gradient_modified);
    EXPECT_TRUE(at::equal(m.param.grad(), g));
    if (step > 1) {
      EXPECT_NE(r->decision.regime, controller::Regime::kSafe) << "the schedule is aligned: GAC would act";
    }
  }
}

TEST(AgentStep, NonFiniteGradientIsInvalidAndKeepsTheSnapshot) {
  One m;
  auto agent = MakeAgent({});
  const at::Tensor g1 = at::randn({4096});
  m.Set(g1);
  ASSERT_TRUE(agent->Step(1, m.params).ok());
  at::Tensor bad = at::randn({4096});
  bad[17] = std::nanf("");
  m.Set(bad);
  auto r = agent->Step(2, m.params);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->decision.regime, controller::Regime::kInvalid);
  EXPECT_FALSE(r->step_optimizer);
  EXPECT_FALSE(r->decision.cosine.has_value());
  // The next step is compared with g1, not with the NaN gradient.
  const at::Tensor g3 = 0.1 * g1 + at::randn({4096});
  m.Set(g3);
  r = agent->Step(3, m.params);
  ASSERT_TRUE(r.ok());
  const double want = (g3.to(at::kDouble) * g1.to(at::kDouble)).sum().item<double>() /
                      (g3.to(at::kDouble).norm().item<double>() * g1.to(at::kDouble).norm().item<double>());
  ASSERT_TRUE(r->decision.cosine.has_value());
  EXPECT_NEAR(*r->decision.cosine, want, 1e-6);
}

TEST(AgentStep, ParametersWithoutGradientsAreLeftOut) {
  at::Tensor a = at::zeros({1000}).set_requires_grad(true);
  at::Tensor b = at::zeros({1000}).set_requires_grad(true);
  std::vector<at::Tensor> params{a, b};
  auto agent = MakeAgent({});
  const at::Tensor ga = at::randn({1000});
  a.mutable_grad() = ga.clone();
  b.mutable_grad() = at::randn({1000});
  ASSERT_TRUE(agent->Step(1, params).ok());
  const at::Tensor ga2 = 0.05 * ga + at::randn({1000});
  a.mutable_grad() = ga2.clone();
  b.mutable_grad() = at::Tensor();
  auto r = agent->Step(2, params);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tensors, 1);
  EXPECT_EQ(r->elements, 1000);
  const at::Tensor x = ga2.to(at::kDouble), y = ga.to(at::kDouble);
  ASSERT_TRUE(r->decision.cosine.has_value());
  EXPECT_NEAR(*r->decision.cosine, (x * y).sum().item<double>() / (x.norm() * y.norm()).item<double>(), 1e-6);
}

TEST(AgentStep, ChangedParameterSetIsAnErrorUntilReset) {
  One m;
  auto agent = MakeAgent({});
  m.Set(at::randn({4096}));
  ASSERT_TRUE(agent->Step(1, m.params).ok());
  at::Tensor other = at::zeros({10}).set_requires_grad(true);
  other.mutable_grad() = at::ones({10});
  const at::Tensor before = m.param.grad().clone();
  auto r = agent->Step(2, {other});
  EXPECT_EQ(r.status().code(), base::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("Reset"), std::string::npos);
  r = agent->Step(2, {other, m.param});
  EXPECT_EQ(r.status().code(), base::StatusCode::kFailedPrecondition);
  agent->Reset();
  r = agent->Step(2, {other});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->decision.cosine.has_value());
  EXPECT_TRUE(at::equal(m.param.grad(), before));
}

TEST(AgentStep, StepIndexMustIncrease) {
  One m;
  auto agent = MakeAgent({});
  m.Set(at::randn({4096}));
  ASSERT_TRUE(agent->Step(5, m.params).ok());
  EXPECT_EQ(agent->Step(5, m.params).status().code(), base::StatusCode::kInvalidArgument);
  EXPECT_EQ(agent->Step(4, m.params).status().code(), base::StatusCode::kInvalidArgument);
  EXPECT_TRUE(agent->Step(6, m.params).ok());
}

TEST(AgentStep, UnsupportedDtypeIsRejectedWithoutSideEffects) {
  at::Tensor a = at::zeros({100}).set_requires_grad(true);
  at::Tensor d = at::zeros({100}, at::kDouble).set_requires_grad(true);
  auto agent = MakeAgent({});
  a.mutable_grad() = at::randn({100});
  d.mutable_grad() = at::randn({100}, at::kDouble);
  const at::Tensor before = a.grad().clone();
  auto r = agent->Step(1, {a, d});
  ASSERT_EQ(r.status().code(), base::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("Double"), std::string::npos) << r.status().message();
  EXPECT_TRUE(at::equal(a.grad(), before));
}

// With two threads the statistics tasks run while the gradients are still
// being gathered. An error late in the gather must stop them cleanly: no
// hang, no change to any gradient or to the snapshot, and the next good step
// agrees with a one-thread agent.
TEST(AgentStep, ErrorLateInAParallelGatherLeavesEverythingUntouched) {
  at::manual_seed(11);
  std::vector<at::Tensor> p1, p2;
  for (int i = 0; i < 300; ++i) {  // 300 x 4,096 elements: a parallel plan
    p1.push_back(at::zeros({4096}).set_requires_grad(true));
    p2.push_back(at::zeros({4096}).set_requires_grad(true));
  }
  AgentOptions o1, o2;
  o1.num_threads = 1;
  o2.num_threads = 2;
  o1.thresholds = o2.thresholds = {0.05, 0.9};
  auto a1 = MakeAgent(o1), a2 = MakeAgent(o2);
  at::Tensor direction = at::randn({300, 4096});
  const auto set_grads = [&](double a) {
    direction = a * direction + at::randn({300, 4096});
    for (int i = 0; i < 300; ++i) {
      p1[i].mutable_grad() = direction[i].clone();
      p2[i].mutable_grad() = direction[i].clone();
    }
  };
  std::int64_t step = 0;
  for (int round = 0; round < 6; ++round) {
    set_grads(0.3);
    auto r1 = a1->Step(++step, p1), r2 = a2->Step(step, p2);
    ASSERT_TRUE(r1.ok() && r2.ok());
    ASSERT_EQ(r1->decision.regime, r2->decision.regime);

    // A bad gradient near the end, then a parameter set that changed there.
    set_grads(0.3);
    std::vector<at::Tensor> before;
    for (const auto& p : p2) before.push_back(p.grad().clone());
    const at::Tensor good = p2[290].grad();
    p2[290].mutable_grad() = good.to(at::kDouble);
    auto bad = a2->Step(++step, p2);
    ASSERT_EQ(bad.status().code(), base::StatusCode::kInvalidArgument) << bad.status().ToString();
    p2[290].mutable_grad() = good;
    std::vector<at::Tensor> swapped = p2;
    swapped[299] = at::zeros({4096}).set_requires_grad(true);
    swapped[299].mutable_grad() = at::randn({4096});
    EXPECT_EQ(a2->Step(++step, swapped).status().code(), base::StatusCode::kFailedPrecondition);
    // Errors early and late: the first in parameter order is the one
    // reported, as with one thread.
    p2[10].mutable_grad() = p2[10].grad().to(at::kDouble);
    p2[280].mutable_grad() = at::zeros({2, 2048});
    auto both = a2->Step(++step, p2);
    ASSERT_EQ(both.status().code(), base::StatusCode::kInvalidArgument);
    EXPECT_NE(both.status().message().find("parameter 10 "), std::string::npos) << both.status().message();
    p2[10].mutable_grad() = before[10].clone();
    p2[280].mutable_grad() = before[280].clone();
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(at::equal(p2[i].grad(), before[i])) << "parameter " << i;

    // The same gradients, now valid, on both agents: same decision and update.
    r1 = a1->Step(++step, p1);
    r2 = a2->Step(step, p2);
    ASSERT_TRUE(r1.ok() && r2.ok()) << r2.status().ToString();
    ASSERT_EQ(r1->decision.regime, r2->decision.regime);
    ASSERT_TRUE(r1->decision.cosine.has_value());
    EXPECT_EQ(*r1->decision.cosine, *r2->decision.cosine);  // same partials, same order: same bits
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(at::equal(p1[i].grad(), p2[i].grad())) << "parameter " << i;
  }
}

TEST(AgentStep, ResultsDoNotDependOnThreadCount) {
  at::manual_seed(3);
  std::vector<at::Tensor> grads1, grads2;
  std::vector<at::Tensor> p1, p2;
  for (std::int64_t n : {300000, 5, 70000, 1}) {
    p1.push_back(at::zeros({n}).set_requires_grad(true));
    p2.push_back(at::zeros({n}).set_requires_grad(true));
  }
  AgentOptions o1;
  o1.num_threads = 1;
  AgentOptions o2;
  o2.num_threads = 2;
  o2.chunk_elements = 4096;
  o1.chunk_elements = 4096;
  auto a1 = MakeAgent(o1), a2 = MakeAgent(o2);
  for (int step = 1; step <= 5; ++step) {
    for (std::size_t i = 0; i < p1.size(); ++i) {
      const at::Tensor g = at::randn({p1[i].numel()}) + 0.2;
      p1[i].mutable_grad() = g.clone();
      p2[i].mutable_grad() = g.clone();
    }
    auto r1 = a1->Step(step, p1), r2 = a2->Step(step, p2);
    ASSERT_TRUE(r1.ok() && r2.ok());
    EXPECT_EQ(r1->decision.cosine, r2->decision.cosine);  // bit-identical
    for (std::size_t i = 0; i < p1.size(); ++i) EXPECT_TRUE(at::equal(p1[i].grad(), p2[i].grad()));
  }
}

TEST(AgentCreate, RejectsBadOptions) {
  AgentOptions o;
  o.thresholds = {0.3, 0.05};
  EXPECT_EQ(Agent::Create(o).status().code(), base::StatusCode::kInvalidArgument);
  o = {};
  o.chunk_elements = 10;
  EXPECT_EQ(Agent::Create(o).status().code(), base::StatusCode::kInvalidArgument);
  o = {};
  o.num_threads = -1;
  EXPECT_EQ(Agent::Create(o).status().code(), base::StatusCode::kInvalidArgument);
  EXPECT_EQ(controller::ParseMode("remote-ish").status().code(), base::StatusCode::kInvalidArgument);
  EXPECT_EQ(*controller::ParseMode("monitor"), controller::Mode::kMonitor);
}

}  // namespace
}  // namespace gac::agent
