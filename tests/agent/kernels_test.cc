// The CPU kernels of every instruction set against fp64 references computed
// with ATen, for every gradient/snapshot dtype pair and awkward lengths.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "cpu_kernels.h"

namespace gac::agent::cpu {
namespace {

struct TypeCase {
  at::ScalarType scalar;
  ElemType elem;
};
const TypeCase kTypes[] = {{at::kFloat, ElemType::kF32}, {at::kBFloat16, ElemType::kBF16}, {at::kHalf, ElemType::kF16}};

// Spacing of floating-point numbers relative to their magnitude.
double Ulp(ElemType t) {
  switch (t) {
    case ElemType::kBF16: return std::ldexp(1.0, -7);
    case ElemType::kF16: return std::ldexp(1.0, -10);
    default: return std::ldexp(1.0, -23);
  }
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

double RelErr(double got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-300); }

class KernelsTest : public ::testing::TestWithParam<std::tuple<const char*, int, int, std::int64_t>> {
 protected:
  void SetUp() override {
    kernels_ = KernelsFor(std::get<0>(GetParam()));
    if (kernels_ == nullptr) GTEST_SKIP() << std::get<0>(GetParam()) << " not supported on this CPU";
    g_type_ = kTypes[std::get<1>(GetParam())];
    p_type_ = kTypes[std::get<2>(GetParam())];
    n_ = std::get<3>(GetParam());
    at::manual_seed(1234 + n_);
    // Correlated g and p with a non-zero mean, so dot is not near zero.
    const at::Tensor base = at::randn({n_}, at::kDouble) + 0.25;
    g_ = (base + 0.5 * at::randn({n_}, at::kDouble)).to(g_type_.scalar);
    p_ = (base * 2.0).to(p_type_.scalar);
  }
  const Kernels* kernels_ = nullptr;
  TypeCase g_type_{}, p_type_{};
  std::int64_t n_ = 0;
  at::Tensor g_, p_;
};

TEST_P(KernelsTest, StatsMatchFp64) {
  const at::Tensor g64 = g_.to(at::kDouble), p64 = p_.to(at::kDouble);
  const Partial got = kernels_->stats(g_.data_ptr(), g_type_.elem, p_.data_ptr(), p_type_.elem, n_);
  const double dot = (g64 * p64).sum().item<double>();
  const double gg = g64.square().sum().item<double>();
  const double pp = p64.square().sum().item<double>();
  if (n_ == 0) {
    EXPECT_EQ(got.dot, 0.0);
    EXPECT_EQ(got.gg, 0.0);
    EXPECT_EQ(got.pp, 0.0);
    return;
  }
  // Relative to the norms: a dot near zero is only accurate that far.
  EXPECT_LE(std::fabs(got.dot - dot) / std::sqrt(gg * pp), 1e-6);
  EXPECT_LE(RelErr(got.gg, gg), 1e-6);
  EXPECT_LE(RelErr(got.pp, pp), 1e-6);
  const Partial norm_only = kernels_->stats(g_.data_ptr(), g_type_.elem, nullptr, p_type_.elem, n_);
  EXPECT_EQ(norm_only.dot, 0.0);
  EXPECT_EQ(norm_only.pp, 0.0);
  EXPECT_LE(RelErr(norm_only.gg, gg), 1e-6);
}

TEST_P(KernelsTest, ProjectSnapshotMatchesReference) {
  for (bool snapshot_projected : {false, true}) {
    SCOPED_TRACE(snapshot_projected ? "applied-update snapshot" : "raw snapshot");
    at::Tensor g = g_.clone(), p = p_.clone();
    const float coeff = 0.37f;
    // Reference: fp32 arithmetic on the loaded values, rounded like a store.
    const at::Tensor expect_g = (g_.to(at::kFloat) - coeff * p_.to(at::kFloat)).to(g_type_.scalar);
    const at::Tensor expect_p = snapshot_projected ? expect_g.to(p_type_.scalar) : g_.to(p_type_.scalar);
    kernels_->project_snapshot(g.data_ptr(), g_type_.elem, p.data_ptr(), p_type_.elem, n_, coeff, snapshot_projected);
    if (n_ == 0) continue;
    // A fused multiply-add may differ from the reference by one fp32 rounding,
    // which can move a narrow store by one unit in its last place.
    const double scale = expect_g.to(at::kDouble).abs().max().item<double>() + 1e-30;
    EXPECT_LE(MaxAbsDiff(g, expect_g), scale * Ulp(g_type_.elem));
    EXPECT_LE(MaxAbsDiff(p, expect_p), scale * std::max(Ulp(g_type_.elem), Ulp(p_type_.elem)));
  }
}

TEST_P(KernelsTest, SnapshotConvertsLikeATen) {
  at::Tensor p = at::full({n_}, 7.0, at::TensorOptions().dtype(p_type_.scalar));
  kernels_->snapshot(g_.data_ptr(), g_type_.elem, p.data_ptr(), p_type_.elem, n_);
  // ATen rounds to nearest even, like the kernels: bit-exact.
  EXPECT_TRUE(at::equal(p, g_.to(p_type_.scalar)));
}

std::string CaseName(const ::testing::TestParamInfo<KernelsTest::ParamType>& info) {
  const char* names[] = {"f32", "bf16", "f16"};
  return std::string(std::get<0>(info.param)) + "_g" + names[std::get<1>(info.param)] + "_p" +
         names[std::get<2>(info.param)] + "_n" + std::to_string(std::get<3>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllIsasTypesLengths, KernelsTest,
                         ::testing::Combine(::testing::Values("baseline", "avx2", "avx512"),
                                            ::testing::Values(0, 1, 2), ::testing::Values(0, 1),
                                            ::testing::Values<std::int64_t>(0, 1, 15, 513, 100003)),
                         CaseName);

TEST(KernelsDispatch, BestIsSupportedAndNamed) {
  const Kernels& best = BestKernels();
  ASSERT_NE(KernelsFor(best.isa), nullptr);
  EXPECT_EQ(KernelsFor("no-such-isa"), nullptr);
}

TEST(KernelsNumerics, LongSumsStayWithinOneMicro) {
  // 2^24 + elements: a plain fp32 running sum would lose ~1e-3 here.
  const std::int64_t n = (std::int64_t{1} << 24) + 77;
  at::manual_seed(7);
  const at::Tensor g = at::rand({n}) + 1.0f;  // all positive: errors do not cancel
  const at::Tensor p = at::rand({n});
  const Partial got = BestKernels().stats(g.data_ptr(), ElemType::kF32, p.data_ptr(), ElemType::kF32, n);
  const at::Tensor g64 = g.to(at::kDouble), p64 = p.to(at::kDouble);
  EXPECT_LE(RelErr(got.dot, (g64 * p64).sum().item<double>()), 1e-6);
  EXPECT_LE(RelErr(got.gg, g64.square().sum().item<double>()), 1e-6);
  EXPECT_LE(RelErr(got.pp, p64.square().sum().item<double>()), 1e-6);
}

TEST(KernelsNumerics, NonFiniteInputsPropagate) {
  at::Tensor g = at::ones({1000});
  at::Tensor p = at::ones({1000});
  g[500] = std::nanf("");
  Partial got = BestKernels().stats(g.data_ptr(), ElemType::kF32, p.data_ptr(), ElemType::kF32, 1000);
  EXPECT_TRUE(std::isnan(got.dot));
  EXPECT_TRUE(std::isnan(got.gg));
  EXPECT_EQ(got.pp, 1000.0);
  g[500] = INFINITY;
  got = BestKernels().stats(g.data_ptr(), ElemType::kF32, p.data_ptr(), ElemType::kF32, 1000);
  EXPECT_TRUE(std::isinf(got.gg));
}

}  // namespace
}  // namespace gac::agent::cpu
