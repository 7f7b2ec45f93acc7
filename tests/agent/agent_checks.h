// Checks shared by the agent's tests on the CPU (agent_test) and on CUDA
// (agent_cuda_test): an agent step against the fp64 reference's.
#ifndef GAC_TESTS_AGENT_AGENT_CHECKS_H_
#define GAC_TESTS_AGENT_AGENT_CHECKS_H_

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "gac/agent/agent.h"
#include "tests/agent/reference_gac.h"

namespace gac::testing {

// max |a - b| / max |b|, on the CPU in fp64 (either tensor may be on a GPU).
inline double MaxRelDiff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.cpu().to(at::kDouble), b64 = b.cpu().to(at::kDouble);
  const double scale = std::max(b64.abs().max().item<double>(), 1e-30);
  return (a64 - b64).abs().max().item<double>() / scale;
}

// The agent's decision is the reference's: regime, whether to step, cosine
// (1e-6), and the report agrees with it. Call through ASSERT_NO_FATAL_FAILURE.
inline void ExpectSameDecision(const agent::StepReport& r, const RefDecision& want, int strided_tensors) {
  ASSERT_EQ(controller::RegimeName(r.decision.regime), want.regime);
  ASSERT_EQ(r.step_optimizer, want.step_optimizer);
  ASSERT_EQ(r.decision.cosine.has_value(), want.cosine.has_value());
  if (want.cosine) {
    EXPECT_NEAR(*r.decision.cosine, *want.cosine, 1e-6);
  }
  EXPECT_EQ(r.gradient_modified, r.decision.regime == controller::Regime::kProject);
  EXPECT_EQ(r.strided_tensors, strided_tensors);
}

}  // namespace gac::testing

#endif  // GAC_TESTS_AGENT_AGENT_CHECKS_H_
