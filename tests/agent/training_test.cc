// Trains a small MLP for a few hundred steps twice from the same start: once
// with the agent in local mode, once with the plain fp64 reference GAC
// (concatenate, fp64 arithmetic). Decisions must agree at every step and the
// parameters must end up within tolerance.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <map>

#include "gac/agent/agent.h"
#include "tests/agent/reference_gac.h"

namespace gac::agent {
namespace {

struct Mlp {
  std::vector<at::Tensor> params;  // w1, b1, w2, b2
  std::vector<at::Tensor> momentum;

  Mlp(const std::vector<at::Tensor>& init) {
    for (const auto& t : init) {
      params.push_back(t.clone().set_requires_grad(true));
      momentum.push_back(at::zeros_like(t));
    }
  }
  at::Tensor Loss(const at::Tensor& x, const at::Tensor& y) const {
    const at::Tensor h = at::tanh(at::addmm(params[1], x, params[0]));
    const at::Tensor out = at::addmm(params[3], h, params[2]);
    return (out - y).square().mean();
  }
  void Backward(const at::Tensor& x, const at::Tensor& y) {
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    Loss(x, y).backward();
  }
  // SGD with momentum 0.9, learning rate 0.05.
  void Update() {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      momentum[i].mul_(0.9).add_(params[i].grad());
      params[i].sub_(momentum[i] * 0.05);
    }
  }
};

TEST(TrainingTest, AgentMatchesPlainReferenceOverTraining) {
  at::manual_seed(11);
  const std::int64_t in = 16, hidden = 64, out = 4, n = 4096;
  const at::Tensor teacher = at::randn({in, out});
  const at::Tensor data_x = at::randn({n, in});
  const at::Tensor data_y = at::tanh(data_x.mm(teacher)) + 0.1 * at::randn({n, out});
  const std::vector<at::Tensor> init = {at::randn({in, hidden}) * 0.3, at::zeros({hidden}),
                                        at::randn({hidden, out}) * 0.1, at::zeros({out})};
  Mlp with_agent(init), with_reference(init);

  AgentOptions o;
  o.thresholds = {0.1, 0.5};
  o.mode = controller::Mode::kLocal;
  o.chunk_elements = 1024;
  auto agent = Agent::Create(o);
  ASSERT_TRUE(agent.ok());
  gac::testing::RefOptions ro;
  ro.c_low = 0.1;
  ro.c_high = 0.5;
  gac::testing::ReferenceGac reference(ro);

  std::map<std::string, int> seen;
  const int steps = 300;
  for (int step = 1; step <= steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const at::Tensor idx = at::randint(n, {32}, at::kLong);
    const at::Tensor x = data_x.index_select(0, idx), y = data_y.index_select(0, idx);
    with_agent.Backward(x, y);
    with_reference.Backward(x, y);

    auto r = (*agent)->Step(step, with_agent.params);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto want = reference.Step(with_reference.params);
    ASSERT_EQ(controller::RegimeName(r->decision.regime), want.regime);
    ASSERT_EQ(r->step_optimizer, want.step_optimizer);
    if (want.cosine) {
      ASSERT_TRUE(r->decision.cosine.has_value());
      EXPECT_NEAR(*r->decision.cosine, *want.cosine, 1e-5);
    }
    ++seen[want.regime];
    if (r->step_optimizer) with_agent.Update();
    if (want.step_optimizer) with_reference.Update();
  }
  for (std::size_t i = 0; i < init.size(); ++i) {
    const at::Tensor a = with_agent.params[i].detach().to(at::kDouble);
    const at::Tensor b = with_reference.params[i].detach().to(at::kDouble);
    const double scale = std::max(b.abs().max().item<double>(), 1e-12);
    EXPECT_LE((a - b).abs().max().item<double>() / scale, 1e-4) << "parameter " << i;
  }
  // Training with GAC still learns, and every regime was exercised.
  const double final_loss = with_agent.Loss(data_x, data_y).item<double>();
  const double initial_loss = Mlp(init).Loss(data_x, data_y).item<double>();
  EXPECT_LT(final_loss, 0.5 * initial_loss);
  for (const char* regime : {"safe", "project", "skip"}) {
    EXPECT_GE(seen[regime], 10) << regime << " happened " << seen[regime] << " times in " << steps << " steps";
  }
}

}  // namespace
}  // namespace gac::agent
