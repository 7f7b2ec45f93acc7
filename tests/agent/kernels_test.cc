// The CPU kernels of every instruction set against fp64 references computed
// with ATen, for every gradient/snapshot dtype pair and awkward lengths.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "agent/src/cpu/kernels.h"

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
    EXPECT_EQ(got.grad_sq, 0.0);
    EXPECT_EQ(got.ref_sq, 0.0);
    return;
  }
  // Relative to the norms: a dot near zero is only accurate that far.
  EXPECT_LE(std::fabs(got.dot - dot) / std::sqrt(gg * pp), 1e-6);
  EXPECT_LE(RelErr(got.grad_sq, gg), 1e-6);
  EXPECT_LE(RelErr(got.ref_sq, pp), 1e-6);
  const Partial norm_only = kernels_->stats(g_.data_ptr(), g_type_.elem, nullptr, p_type_.elem, n_);
  EXPECT_EQ(norm_only.dot, 0.0);
  EXPECT_EQ(norm_only.ref_sq, 0.0);
  EXPECT_LE(RelErr(norm_only.grad_sq, gg), 1e-6);
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

// Splits [0, n) into runs of awkward lengths: empty, shorter than a vector,
// whole vectors, longer than a 512-element block, and the rest.
std::vector<std::pair<std::int64_t, std::int64_t>> Runs(std::int64_t n) {
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;
  std::int64_t begin = 0;
  for (std::int64_t len : {0, 1, 15, 16, 17, 0, 33, 700}) {
    if (begin + len > n) break;
    runs.push_back({begin, len});
    begin += len;
  }
  runs.push_back({begin, n - begin});
  return runs;
}

// Spans over the runs of g and p; the second one is skipped (g == nullptr)
// when skip_second.
std::vector<Span> MakeSpans(const at::Tensor& g, ElemType gt, const at::Tensor& p, bool skip_second) {
  std::vector<Span> spans;
  char* const gb = static_cast<char*>(g.data_ptr());
  char* const pb = static_cast<char*>(p.data_ptr());
  for (const auto& [begin, len] : Runs(g.numel())) {
    Span s;
    s.g = gb + begin * static_cast<std::int64_t>(g.element_size());
    s.p = pb + begin * static_cast<std::int64_t>(p.element_size());
    s.n = len;
    s.gt = gt;
    spans.push_back(s);
  }
  if (skip_second && spans.size() > 1) spans[1].g = nullptr;
  return spans;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_P(KernelsTest, StatsSpansMatchOneCallPerRun) {
  for (bool with_p : {true, false}) {
    SCOPED_TRACE(with_p ? "with snapshot" : "norm only");
    const std::vector<Span> spans = MakeSpans(g_, g_type_.elem, p_, /*skip_second=*/true);
    const auto count = static_cast<std::int64_t>(spans.size());
    std::vector<Partial> out(spans.size());
    Partial sum;
    kernels_->stats_spans(spans.data(), count, p_type_.elem, with_p, out.data(), &sum);
    Partial want_sum;
    for (std::size_t i = 0; i < spans.size(); ++i) {
      Partial want;
      if (spans[i].g != nullptr) {
        want = kernels_->stats(spans[i].g, spans[i].gt, with_p ? spans[i].p : nullptr, p_type_.elem, spans[i].n);
      }
      EXPECT_TRUE(SameBits(out[i].dot, want.dot) && SameBits(out[i].grad_sq, want.grad_sq) && SameBits(out[i].ref_sq, want.ref_sq))
          << "span " << i;
      want_sum.dot += want.dot;
      want_sum.grad_sq += want.grad_sq;
      want_sum.ref_sq += want.ref_sq;
    }
    EXPECT_TRUE(SameBits(sum.dot, want_sum.dot) && SameBits(sum.grad_sq, want_sum.grad_sq) && SameBits(sum.ref_sq, want_sum.ref_sq));
    // The same list in two calls, without out[]: the same bits.
    Partial split;
    const std::int64_t half = count / 2;
    kernels_->stats_spans(spans.data(), half, p_type_.elem, with_p, nullptr, &split);
    kernels_->stats_spans(spans.data() + half, count - half, p_type_.elem, with_p, nullptr, &split);
    EXPECT_TRUE(SameBits(split.dot, sum.dot) && SameBits(split.grad_sq, sum.grad_sq) && SameBits(split.ref_sq, sum.ref_sq));
  }
}

TEST_P(KernelsTest, ApplySpansMatchOneCallPerRun) {
  for (int pass = 0; pass < 3; ++pass) {
    const bool snapshot_only = pass == 2;
    const bool snapshot_projected = pass == 1;
    SCOPED_TRACE(snapshot_only ? "snapshot" : snapshot_projected ? "project, applied-update snapshot"
                                                                   : "project, raw snapshot");
    const float coeff = 0.37f;
    at::Tensor g = g_.clone(), p = p_.clone();
    at::Tensor want_g = g_.clone(), want_p = p_.clone();
    const std::vector<Span> spans = MakeSpans(g, g_type_.elem, p, /*skip_second=*/true);
    const std::vector<Span> want_spans = MakeSpans(want_g, g_type_.elem, want_p, /*skip_second=*/true);
    const auto count = static_cast<std::int64_t>(spans.size());
    if (snapshot_only) {
      kernels_->snapshot_spans(spans.data(), count, p_type_.elem);
    } else {
      kernels_->project_snapshot_spans(spans.data(), count, p_type_.elem, coeff, snapshot_projected);
    }
    for (const Span& s : want_spans) {
      if (s.g == nullptr) continue;  // skipped: left as it was
      if (snapshot_only) {
        kernels_->snapshot(s.g, s.gt, s.p, p_type_.elem, s.n);
      } else {
        kernels_->project_snapshot(s.g, s.gt, s.p, p_type_.elem, s.n, coeff, snapshot_projected);
      }
    }
    EXPECT_TRUE(at::equal(g, want_g));
    EXPECT_TRUE(at::equal(p, want_p));
  }
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

TEST(KernelsSpans, GradientTypesMayDifferPerSpan) {
  at::manual_seed(11);
  const at::Tensor base = at::randn({1000}, at::kDouble);
  at::Tensor g32 = base.to(at::kFloat), g16 = base.to(at::kBFloat16), gh = base.to(at::kHalf);
  at::Tensor p = (base * 0.5 + 0.1).to(at::kFloat);
  const Kernels& k = BestKernels();
  std::vector<Span> spans(3);
  spans[0] = {g32.data_ptr(), p.data_ptr(), 300, ElemType::kF32};
  spans[1] = {static_cast<char*>(g16.data_ptr()) + 300 * 2, static_cast<float*>(p.data_ptr()) + 300, 500,
              ElemType::kBF16};
  spans[2] = {static_cast<char*>(gh.data_ptr()) + 800 * 2, static_cast<float*>(p.data_ptr()) + 800, 200,
              ElemType::kF16};
  Partial out[3];
  Partial sum;
  k.stats_spans(spans.data(), 3, ElemType::kF32, true, out, &sum);
  double want_dot = 0.0;
  for (int i = 0; i < 3; ++i) {
    const Partial one = k.stats(spans[i].g, spans[i].gt, spans[i].p, ElemType::kF32, spans[i].n);
    EXPECT_EQ(out[i].dot, one.dot);
    EXPECT_EQ(out[i].grad_sq, one.grad_sq);
    EXPECT_EQ(out[i].ref_sq, one.ref_sq);
    want_dot += one.dot;
  }
  EXPECT_EQ(sum.dot, want_dot);
}

TEST(KernelsSpans, EmptyListLeavesTheSumAsItWas) {
  const Kernels& k = BestKernels();
  Partial sum{1.0, 2.0, 3.0};
  k.stats_spans(nullptr, 0, ElemType::kF32, true, nullptr, &sum);
  EXPECT_EQ(sum.dot, 1.0);
  EXPECT_EQ(sum.grad_sq, 2.0);
  EXPECT_EQ(sum.ref_sq, 3.0);
  k.project_snapshot_spans(nullptr, 0, ElemType::kF32, 0.5f, false);
  k.snapshot_spans(nullptr, 0, ElemType::kF32);
}

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
  EXPECT_LE(RelErr(got.grad_sq, g64.square().sum().item<double>()), 1e-6);
  EXPECT_LE(RelErr(got.ref_sq, p64.square().sum().item<double>()), 1e-6);
}

TEST(KernelsNumerics, NonFiniteInputsPropagate) {
  at::Tensor g = at::ones({1000});
  at::Tensor p = at::ones({1000});
  g[500] = std::nanf("");
  Partial got = BestKernels().stats(g.data_ptr(), ElemType::kF32, p.data_ptr(), ElemType::kF32, 1000);
  EXPECT_TRUE(std::isnan(got.dot));
  EXPECT_TRUE(std::isnan(got.grad_sq));
  EXPECT_EQ(got.ref_sq, 1000.0);
  g[500] = INFINITY;
  got = BestKernels().stats(g.data_ptr(), ElemType::kF32, p.data_ptr(), ElemType::kF32, 1000);
  EXPECT_TRUE(std::isinf(got.grad_sq));
}

}  // namespace
}  // namespace gac::agent::cpu
