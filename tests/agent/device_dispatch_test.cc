// Where the agent sends gradients that are not on the CPU. The meta device
// stands in for a GPU here: a build without the CUDA passes (or a device
// they do not cover) reports Unimplemented, a list that mixes devices is
// refused, and neither leaves a plan behind.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "gac/agent/agent.h"

namespace gac::agent {
namespace {

at::Tensor ParamWithGrad(at::IntArrayRef shape, at::Device device) {
  at::Tensor p = at::zeros(shape, at::TensorOptions().device(device)).set_requires_grad(true);
  p.mutable_grad() = at::ones(shape, at::TensorOptions().device(device));
  return p;
}

std::unique_ptr<Agent> MakeAgent() {
  base::StatusOr<std::unique_ptr<Agent>> agent = Agent::Create(AgentOptions{});
  EXPECT_TRUE(agent.ok()) << agent.status().ToString();
  return agent.ok() ? std::move(*agent) : nullptr;
}

TEST(DeviceDispatchTest, GradientsOnAnUnsupportedDeviceAreUnimplemented) {
  std::unique_ptr<Agent> agent = MakeAgent();
  ASSERT_NE(agent, nullptr);
  const std::vector<at::Tensor> params = {ParamWithGrad({4, 5}, at::kMeta), ParamWithGrad({7}, at::kMeta)};
  for (int attempt = 0; attempt < 2; ++attempt) {
    base::StatusOr<controller::StepReport> r = agent->Step(1 + attempt, params);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), base::StatusCode::kUnimplemented) << r.status().ToString();
    EXPECT_NE(r.status().message().find("meta"), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(agent->snapshot_bytes(), 0) << "no plan is kept after a refused step";
}

TEST(DeviceDispatchTest, MixedDeviceListsAreRefused) {
  std::unique_ptr<Agent> agent = MakeAgent();
  ASSERT_NE(agent, nullptr);
  const std::vector<at::Tensor> mixed = {ParamWithGrad({3}, at::kCPU), ParamWithGrad({3}, at::kMeta),
                                         ParamWithGrad({2}, at::kCPU)};
  base::StatusOr<controller::StepReport> r = agent->Step(1, mixed);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), base::StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("one device"), std::string::npos) << r.status().ToString();

  // The CPU path is unaffected afterwards.
  const std::vector<at::Tensor> cpu = {ParamWithGrad({3}, at::kCPU), ParamWithGrad({2}, at::kCPU)};
  base::StatusOr<controller::StepReport> ok = agent->Step(2, cpu);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->tensors, 2);
  EXPECT_EQ(ok->elements, 5);
}

}  // namespace
}  // namespace gac::agent
