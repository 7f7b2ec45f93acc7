// Remote mode (decision source, fallback, rank consensus) and the per-group
// statistics, against fp64 sums and hand-written fakes.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "gac/agent/agent.h"

namespace gac::agent {
namespace {

// Answers with a fixed decision, or fails.
class FakeSource final : public controller::DecisionSource {
 public:
  base::StatusOr<controller::Decision> Decide(std::int64_t step, const controller::AlignmentStats& stats) override {
    ++calls;
    last_step = step;
    last_stats = stats;
    if (!answer.ok()) return answer.status();
    return *answer;
  }
  base::StatusOr<controller::Decision> answer = base::Status::Unavailable("gacd down");
  int calls = 0;
  std::int64_t last_step = -1;
  controller::AlignmentStats last_stats;
};

// Adds `other` to the 1-scalar all-reduce (as if another rank fell back) and
// leaves the statistics as they are.
class FakeReducer final : public Reducer {
 public:
  base::Status AllReduceSum(double* values, std::size_t n) override {
    if (n == 1) values[0] += other;
    return base::Status::Ok();
  }
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  double other = 0.0;
};

struct Params {
  std::vector<at::Tensor> params;
  explicit Params(std::vector<std::int64_t> sizes) {
    for (auto n : sizes) params.push_back(at::zeros({n}).set_requires_grad(true));
  }
  void Set(const std::vector<at::Tensor>& grads) {
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].clone();
  }
};

std::unique_ptr<Agent> Make(AgentOptions o) {
  o.num_threads = 1;
  auto a = Agent::Create(std::move(o));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return std::move(*a);
}

TEST(RemoteMode, UsesTheSourcesDecision) {
  Params m({3000});
  auto source = std::make_shared<FakeSource>();
  controller::Decision skip;
  skip.regime = controller::Regime::kSkip;
  skip.apply_update = false;
  skip.cosine = 0.9;
  source->answer = skip;
  AgentOptions o;
  o.mode = controller::Mode::kRemote;
  o.decision_source = source;
  auto agent = Make(o);
  const at::Tensor g = at::randn({3000});
  m.Set({g});
  ASSERT_TRUE(agent->Step(1, m.params).ok());
  m.Set({g * 0.01 + at::randn({3000})});  // nearly orthogonal: local says safe
  auto r = agent->Step(2, m.params);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(source->last_step, 2);
  EXPECT_TRUE(source->last_stats.has_reference);
  EXPECT_NEAR(source->last_stats.ref_sq, g.square().sum().item<double>(), 1e-3 * source->last_stats.ref_sq);
  EXPECT_EQ(r->decision.regime, controller::Regime::kSkip);
  EXPECT_FALSE(r->step_optimizer);
  EXPECT_FALSE(r->fallback);
  EXPECT_EQ(agent->fallbacks(), 0u);
}

TEST(RemoteMode, ProjectsWithTheRemoteCoefficient) {
  Params m({2048});
  auto source = std::make_shared<FakeSource>();
  controller::Decision project;
  project.regime = controller::Regime::kProject;
  project.projection_coeff = 0.5;
  source->answer = project;
  AgentOptions o;
  o.mode = controller::Mode::kRemote;
  o.decision_source = source;
  auto agent = Make(o);
  const at::Tensor p = at::randn({2048}), g = at::randn({2048});
  m.Set({p});
  ASSERT_TRUE(agent->Step(1, m.params).ok());
  m.Set({g});
  auto r = agent->Step(2, m.params);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->gradient_modified);
  EXPECT_TRUE(at::allclose(m.params[0].grad(), g - 0.5 * p, 1e-5, 1e-5));
}

TEST(RemoteMode, FallsBackToTheLocalDecisionAndCounts) {
  Params m({4096});
  auto source = std::make_shared<FakeSource>();  // always fails
  AgentOptions o;
  o.mode = controller::Mode::kRemote;
  o.decision_source = source;
  auto agent = Make(o);
  AgentOptions lo;
  auto local = Make(lo);
  Params ml({4096});
  const at::Tensor base = at::randn({4096});
  for (int step = 1; step <= 5; ++step) {
    const at::Tensor g = base + 0.5 * at::randn({4096});
    m.Set({g});
    ml.Set({g});
    auto r = agent->Step(step, m.params);
    auto rl = local->Step(step, ml.params);
    ASSERT_TRUE(r.ok() && rl.ok());
    EXPECT_TRUE(r->fallback);
    EXPECT_NE(r->remote_error.find("gacd down"), std::string::npos);
    EXPECT_EQ(r->decision.regime, rl->decision.regime);
    EXPECT_TRUE(at::equal(m.params[0].grad(), ml.params[0].grad()));
  }
  EXPECT_EQ(agent->fallbacks(), 5u);
}

TEST(RemoteMode, AFallbackOnAnotherRankIsAFallbackHere) {
  Params m({1024});
  auto source = std::make_shared<FakeSource>();
  controller::Decision skip;
  skip.regime = controller::Regime::kSkip;
  skip.apply_update = false;
  source->answer = skip;
  auto reducer = std::make_shared<FakeReducer>();
  reducer->other = 1.0;
  AgentOptions o;
  o.mode = controller::Mode::kRemote;
  o.decision_source = source;
  o.reducer = reducer;
  auto agent = Make(o);
  m.Set({at::randn({1024})});
  auto r = agent->Step(1, m.params);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->fallback);
  EXPECT_EQ(r->remote_error, "another rank fell back");
  EXPECT_EQ(r->decision.regime, controller::Regime::kSafe);  // the local decision on a first step
}

TEST(RemoteMode, NeedsADecisionSource) {
  AgentOptions o;
  o.mode = controller::Mode::kRemote;
  EXPECT_EQ(Agent::Create(o).status().code(), base::StatusCode::kInvalidArgument);
  auto agent = Make({});
  EXPECT_EQ(agent->set_mode(controller::Mode::kRemote).code(), base::StatusCode::kInvalidArgument);
  EXPECT_EQ(agent->options().mode, controller::Mode::kLocal);
  EXPECT_TRUE(agent->set_mode(controller::Mode::kMonitor).ok());
  EXPECT_STREQ(controller::ModeName(controller::Mode::kRemote), "remote");
  EXPECT_EQ(*controller::ParseMode("remote"), controller::Mode::kRemote);
}

TEST(Layers, StatisticsMatchFp64PerLayer) {
  Params m({100, 5000, 70000, 3, 0});
  AgentOptions o;
  o.layers = {{"embed", {0, 2}}, {"mlp", {1}}, {"tiny", {3, 4}}};
  o.chunk_elements = 1024;
  auto agent = Make(o);
  std::vector<at::Tensor> p, g;
  for (auto& t : m.params) {
    p.push_back(at::randn(t.sizes()));
    g.push_back(at::randn(t.sizes()));
  }
  // A non-contiguous (strided-path) gradient in a layer as well.
  m.Set(p);
  ASSERT_TRUE(agent->Step(1, m.params).ok());
  m.Set(g);
  const at::Tensor strided = at::randn({2, 100}).select(0, 1);
  m.params[0].mutable_grad() = strided;
  g[0] = strided.clone();
  auto r = agent->Step(2, m.params);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->layers.size(), 3u);
  double total[3] = {0, 0, 0};
  for (std::size_t k = 0; k < 3; ++k) {
    double dot = 0, gg = 0, pp = 0;
    for (int i : o.layers[k].parameters) {
      const at::Tensor g64 = g[static_cast<std::size_t>(i)].to(at::kDouble);
      const at::Tensor p64 = p[static_cast<std::size_t>(i)].to(at::kDouble);
      dot += (g64 * p64).sum().item<double>();
      gg += g64.square().sum().item<double>();
      pp += p64.square().sum().item<double>();
    }
    const controller::LayerStats& s = r->layers[k];
    EXPECT_EQ(s.name, o.layers[k].name);
    EXPECT_NEAR(s.dot, dot, 1e-5 * std::sqrt(gg * pp) + 1e-9) << s.name;
    EXPECT_NEAR(s.grad_sq, gg, 1e-6 * gg + 1e-9) << s.name;
    EXPECT_NEAR(s.ref_sq, pp, 1e-6 * pp + 1e-9) << s.name;
    ASSERT_TRUE(s.cosine().has_value());
    EXPECT_NEAR(*s.cosine(), dot / std::sqrt(gg * pp), 1e-5);
    total[0] += s.dot;
    total[1] += s.grad_sq;
    total[2] += s.ref_sq;
  }
  // The layers partition every parameter: they add up to the whole.
  EXPECT_NEAR(total[1], r->decision.grad_norm * r->decision.grad_norm, 1e-6 * total[1]);
  EXPECT_NEAR(total[2], r->decision.ref_norm * r->decision.ref_norm, 1e-6 * total[2]);
}

TEST(Layers, BadLayersAreRejected) {
  AgentOptions o;
  o.layers = {{"a", {0, 1}}, {"b", {1}}};
  EXPECT_EQ(Agent::Create(o).status().code(), base::StatusCode::kInvalidArgument);
  o.layers = {{"", {0}}};
  EXPECT_EQ(Agent::Create(o).status().code(), base::StatusCode::kInvalidArgument);
  o.layers = {{"a", {-1}}};
  EXPECT_EQ(Agent::Create(o).status().code(), base::StatusCode::kInvalidArgument);
  o.layers = {{"a", {5}}};
  auto agent = Make(o);
  Params m({10});
  m.Set({at::randn({10})});
  EXPECT_EQ(agent->Step(1, m.params).status().code(), base::StatusCode::kInvalidArgument);
}

// AgentOptions::groups and ParameterGroup, the former names, still work
// (deprecated: the compiler warns where they are used).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST(Layers, DeprecatedGroupsAliasStillWorks) {
  Params m({10, 20});
  AgentOptions o;
  o.groups = {AgentOptions::ParameterGroup{"a", {0}}, {"b", {1}}};
  auto agent = Make(o);
  EXPECT_EQ(agent->options().layers.size(), 2u);
  EXPECT_TRUE(agent->options().groups.empty());
  m.Set({at::randn({10}), at::randn({20})});
  ASSERT_TRUE(agent->Step(1, m.params).ok());
  auto r = agent->Step(2, m.params);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->layers.size(), 2u);
  EXPECT_EQ(r->layers[1].name, "b");
  const controller::GroupStats& former = r->layers[0];
  EXPECT_EQ(former.name, "a");
  // Both names at once is ambiguous.
  o.layers = {{"c", {0}}};
  EXPECT_EQ(Agent::Create(o).status().code(), base::StatusCode::kInvalidArgument);
}
#pragma GCC diagnostic pop

TEST(Report, CarriesTheModeItRanIn) {
  Params m({10});
  auto agent = Make({});
  m.Set({at::randn({10})});
  auto r = agent->Step(1, m.params);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->mode, controller::Mode::kLocal);
  ASSERT_TRUE(agent->set_mode(controller::Mode::kMonitor).ok());
  m.Set({at::randn({10})});
  r = agent->Step(2, m.params);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->mode, controller::Mode::kMonitor);
  EXPECT_DOUBLE_EQ(r->agent_overhead_seconds(), r->stats_seconds + r->decide_seconds + r->apply_seconds);
}

}  // namespace
}  // namespace gac::agent
