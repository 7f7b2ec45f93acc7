// The agent with the windowed trigger (AgentOptions::trigger) over a scripted
// gradient sequence whose consecutive cosines are chosen, against a
// reference written here from the rule's definition: the mean of the last W
// chosen cosines, the regime of that mean by the window thresholds, and the
// projection g' = g - (1 - alpha) (dot/|p|^2) p it implies.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gac/agent/agent.h"

namespace gac::agent {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int kDim = 256;

// Unit gradients whose cosine with the previous valid one (the agent's
// snapshot) is the scripted value: g = c * g_prev + sqrt(1 - c^2) e_k with
// e_k a basis vector no earlier gradient touches. NaN scripts an invalid step
// (a non-finite gradient, which the agent does not snapshot).
class ScriptedGradients {
 public:
  at::Tensor Next(double c) {
    at::Tensor e = at::zeros({kDim}, at::kDouble);
    e[next_basis_++].fill_(1.0);
    if (std::isnan(c)) {
      e[kDim - 1].fill_(kNaN);
      return e;
    }
    prev_ = prev_.defined() ? c * prev_ + std::sqrt(1.0 - c * c) * e : e;
    return prev_;
  }
  // Starts over: the next gradient is the first of a sequence.
  void Restart() { prev_ = at::Tensor(); }
  const at::Tensor& prev() const { return prev_; }

 private:
  at::Tensor prev_;
  std::int64_t next_basis_ = 0;
};

struct Expected {
  controller::Regime regime = controller::Regime::kSafe;
  std::optional<double> mean;
  double alpha = 1.0;
};

// script[0] is the first step (no reference); NaN is an invalid step.
std::vector<Expected> Reference(const std::vector<double>& script, int window, controller::Thresholds t) {
  std::vector<double> cosines;
  std::vector<Expected> out;
  for (std::size_t i = 0; i < script.size(); ++i) {
    Expected e;
    const bool valid = i > 0 && !std::isnan(script[i]);
    if (i > 0 && std::isnan(script[i])) e.regime = controller::Regime::kInvalid;
    if (valid) cosines.push_back(script[i]);
    if (static_cast<int>(cosines.size()) >= window) {
      double sum = 0.0;
      for (int k = 1; k <= window; ++k) sum += cosines[cosines.size() - static_cast<std::size_t>(k)];
      e.mean = sum / window;
    }
    if (valid && e.mean) {
      const double a = std::fabs(*e.mean);
      if (a >= t.c_high) {
        e.regime = controller::Regime::kSkip;
      } else if (a > t.c_low) {
        e.regime = controller::Regime::kProject;
        e.alpha = t.c_low / a;
      }
    }
    out.push_back(e);
  }
  return out;
}

// Noise (alternating signs: the mean stays under c_low although |c_t| is
// above the per-step c_high), a persistent alignment (project), a strong
// one (skip), an invalid step, a negative alignment, noise again. Every mean
// is at least 0.01 from a threshold.
std::vector<double> Script() {
  std::vector<double> s = {0.0};
  for (int i = 0; i < 12; ++i) s.push_back(i % 2 == 0 ? 0.35 : -0.35);
  for (int i = 0; i < 10; ++i) s.push_back(0.25);
  s.push_back(kNaN);
  for (int i = 0; i < 3; ++i) s.push_back(0.25);
  for (int i = 0; i < 8; ++i) s.push_back(0.6);
  for (int i = 0; i < 12; ++i) s.push_back(-0.2);
  for (int i = 0; i < 10; ++i) s.push_back(i % 2 == 0 ? 0.02 : -0.02);
  return s;
}

constexpr int kWindow = 5;
const controller::Thresholds kWindowThresholds{0.1, 0.4};

AgentOptions WindowedOptions(controller::Mode mode) {
  AgentOptions o;
  o.mode = mode;
  o.num_threads = 1;
  o.trigger.trigger = controller::Trigger::kWindow;
  o.trigger.window = kWindow;
  o.trigger.window_thresholds = kWindowThresholds;
  return o;
}

std::unique_ptr<Agent> Make(AgentOptions o) {
  auto a = Agent::Create(std::move(o));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return std::move(*a);
}

struct Param {
  at::Tensor param = at::zeros({kDim}).set_requires_grad(true);
  std::vector<at::Tensor> params{param};
  void Set(const at::Tensor& g) { param.mutable_grad() = g.to(at::kFloat); }
};

TEST(WindowedTrigger, LocalModeFollowsTheReference) {
  const std::vector<double> script = Script();
  const std::vector<Expected> expected = Reference(script, kWindow, kWindowThresholds);
  auto agent = Make(WindowedOptions(controller::Mode::kLocal));
  ScriptedGradients grads;
  Param m;
  int seen[4] = {0, 0, 0, 0};
  for (std::size_t i = 0; i < script.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    const at::Tensor p = grads.prev().defined() ? grads.prev().clone() : at::Tensor();
    const at::Tensor g = grads.Next(script[i]);
    m.Set(g);
    auto r = agent->Step(static_cast<std::int64_t>(i + 1), m.params);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const Expected& e = expected[i];
    const controller::Decision& d = r->decision;
    ASSERT_EQ(d.regime, e.regime);
    ++seen[static_cast<int>(d.regime)];
    ASSERT_EQ(d.window_mean.has_value(), e.mean.has_value());
    if (e.mean) {
      EXPECT_NEAR(*d.window_mean, *e.mean, 1e-5);
    }
    if (i > 0 && !std::isnan(script[i])) {
      ASSERT_TRUE(d.cosine);
      EXPECT_NEAR(*d.cosine, script[i], 1e-5);
    }
    EXPECT_NEAR(d.alpha, e.alpha, 1e-4);
    EXPECT_EQ(r->step_optimizer,
              e.regime == controller::Regime::kSafe || e.regime == controller::Regime::kProject);
    const at::Tensor applied = m.param.grad().to(at::kDouble);
    if (e.regime == controller::Regime::kProject) {
      // |g| = |p| = 1: dot / |p|^2 is the cosine.
      const at::Tensor want = g - (1.0 - e.alpha) * script[i] * p;
      EXPECT_TRUE(at::allclose(applied, want, 1e-5, 1e-5));
      EXPECT_TRUE(r->gradient_modified);
    } else if (!std::isnan(script[i])) {
      EXPECT_TRUE(at::allclose(applied, g, 1e-6, 1e-6));
      EXPECT_FALSE(r->gradient_modified);
    }
  }
  for (int k = 0; k < 4; ++k) EXPECT_GT(seen[k], 0) << "regime " << k;
}

// The per-step rule stays the default: the same gradients give the regimes
// of |c_t| by the per-step thresholds, and the window's mean is reported.
TEST(WindowedTrigger, PerStepIsTheDefaultAndReportsTheMean) {
  AgentOptions o;
  o.num_threads = 1;
  o.trigger.window = kWindow;
  EXPECT_EQ(o.trigger.trigger, controller::Trigger::kPerStep);
  auto agent = Make(o);
  const std::vector<double> script = Script();
  const std::vector<Expected> expected = Reference(script, kWindow, kWindowThresholds);
  ScriptedGradients grads;
  Param m;
  for (std::size_t i = 0; i < script.size(); ++i) {
    m.Set(grads.Next(script[i]));
    auto r = agent->Step(static_cast<std::int64_t>(i + 1), m.params);
    ASSERT_TRUE(r.ok());
    const controller::Decision& d = r->decision;
    if (i > 0 && !std::isnan(script[i])) {
      EXPECT_EQ(d.regime, agent->controller().RegimeForCosine(script[i])) << i;
    }
    ASSERT_EQ(d.window_mean.has_value(), expected[i].mean.has_value()) << i;
    if (d.window_mean) {
      EXPECT_NEAR(*d.window_mean, *expected[i].mean, 1e-5) << i;
    }
  }
}

TEST(WindowedTrigger, MonitorModeReportsWithoutActing) {
  // Monitor mode keeps no reference after a non-finite gradient: the script without its invalid step.
  std::vector<double> script;
  for (double c : Script()) {
    if (!std::isnan(c)) script.push_back(c);
  }
  const std::vector<Expected> expected = Reference(script, kWindow, kWindowThresholds);
  auto agent = Make(WindowedOptions(controller::Mode::kMonitor));
  ScriptedGradients grads;
  Param m;
  for (std::size_t i = 0; i < script.size(); ++i) {
    const at::Tensor g = grads.Next(script[i]);
    m.Set(g);
    auto r = agent->Step(static_cast<std::int64_t>(i + 1), m.params);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->decision.regime, expected[i].regime) << i;
    EXPECT_TRUE(r->step_optimizer);
    EXPECT_FALSE(r->gradient_modified);
    EXPECT_TRUE(at::allclose(m.param.grad().to(at::kDouble), g, 1e-6, 1e-6));
  }
}

TEST(WindowedTrigger, ResetEmptiesTheWindow) {
  auto agent = Make(WindowedOptions(controller::Mode::kLocal));
  ScriptedGradients grads;
  Param m;
  std::int64_t step = 0;
  for (int i = 0; i < kWindow + 3; ++i) {
    m.Set(grads.Next(0.6));
    ASSERT_TRUE(agent->Step(++step, m.params).ok());
  }
  EXPECT_TRUE(agent->triggered().window().full());
  agent->Reset();
  EXPECT_EQ(agent->triggered().window().held(), 0);
  grads.Restart();
  // A new reference, then W - 1 cosines: still safe however aligned.
  for (int i = 0; i < kWindow; ++i) {
    m.Set(grads.Next(0.6));
    auto r = agent->Step(++step, m.params);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->decision.regime, controller::Regime::kSafe) << i;
    EXPECT_FALSE(r->decision.window_mean) << i;
  }
  m.Set(grads.Next(0.6));
  auto r = agent->Step(++step, m.params);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->decision.regime, controller::Regime::kSkip);
  ASSERT_TRUE(r->decision.window_mean);
  EXPECT_NEAR(*r->decision.window_mean, 0.6, 1e-5);
}

class FailingSource final : public controller::DecisionSource {
 public:
  base::StatusOr<controller::Decision> Decide(std::int64_t, const controller::AlignmentStats&) override {
    return base::Status::Unavailable("gacd down");
  }
};

// Remote mode: on a fallback the local decision is the windowed one.
TEST(WindowedTrigger, RemoteFallbackUsesTheWindowedDecision) {
  AgentOptions o = WindowedOptions(controller::Mode::kRemote);
  o.decision_source = std::make_shared<FailingSource>();
  auto agent = Make(o);
  const std::vector<double> script = Script();
  const std::vector<Expected> expected = Reference(script, kWindow, kWindowThresholds);
  ScriptedGradients grads;
  Param m;
  for (std::size_t i = 0; i < script.size(); ++i) {
    m.Set(grads.Next(script[i]));
    auto r = agent->Step(static_cast<std::int64_t>(i + 1), m.params);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->fallback);
    EXPECT_EQ(r->decision.regime, expected[i].regime) << i;
  }
}

// The 1-scalar all-reduce of remote mode fails: the step fails and leaves
// the window as it was.
class FailingConsensus final : public Reducer {
 public:
  base::Status AllReduceSum(double*, std::size_t n) override {
    return n == 1 && fail ? base::Status::Unavailable("link down") : base::Status::Ok();
  }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  bool fail = false;
};

TEST(WindowedTrigger, AFailedStepLeavesTheWindow) {
  AgentOptions o = WindowedOptions(controller::Mode::kRemote);
  o.decision_source = std::make_shared<FailingSource>();
  auto consensus = std::make_shared<FailingConsensus>();
  o.reducer = consensus;
  auto agent = Make(o);
  ScriptedGradients grads;
  Param m;
  m.Set(grads.Next(0.0));
  ASSERT_TRUE(agent->Step(1, m.params).ok());
  m.Set(grads.Next(0.3));
  ASSERT_TRUE(agent->Step(2, m.params).ok());
  EXPECT_EQ(agent->triggered().window().values().size(), 1u);
  consensus->fail = true;
  m.Set(grads.Next(0.3));
  ASSERT_FALSE(agent->Step(3, m.params).ok());
  EXPECT_EQ(agent->triggered().window().held(), 1);
  consensus->fail = false;
  ASSERT_TRUE(agent->Step(4, m.params).ok());
  EXPECT_EQ(agent->triggered().window().held(), 2);
}

TEST(WindowedTrigger, CreateRejectsBadSettings) {
  for (int window : {0, -1, controller::kMaxWindow + 1}) {
    AgentOptions o = WindowedOptions(controller::Mode::kLocal);
    o.trigger.window = window;
    auto a = Agent::Create(o);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), base::StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("trigger"), std::string::npos) << a.status().message();
    EXPECT_NE(a.status().message().find(std::to_string(window)), std::string::npos) << a.status().message();
  }
  AgentOptions o = WindowedOptions(controller::Mode::kLocal);
  o.trigger.window_thresholds = {0.5, 0.2};
  EXPECT_EQ(Agent::Create(o).status().code(), base::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gac::agent
