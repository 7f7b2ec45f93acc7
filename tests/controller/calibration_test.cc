// Tests of the threshold calibration: ComputeCalibration, CalibrationWindow
// and SuggestThresholds, against references written here from the header's
// documented definitions (numpy's "linear" quantile, the rounding rule).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gac/controller/calibration.h"
#include "gac/controller/controller.h"

namespace gac {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Reference statistics. The quantile is numpy.quantile(x, q) with the default
// method "linear": the q-quantile sits at virtual index h = (n-1) q of the
// sorted values and interpolates between the two order statistics around it.
// It is written as a walk over the segments [i/(n-1), (i+1)/(n-1)] rather
// than by flooring h, so that it does not share the implementation's shape.
double ReferenceQuantile(std::vector<double> x, double q) {
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  if (n == 1) return x[0];
  const double h = q * static_cast<double>(n - 1);
  for (std::size_t i = 0; i + 1 < n; ++i) {
    const double left = static_cast<double>(i);
    if (h >= left && h <= left + 1.0) {
      const double t = h - left;
      return (1.0 - t) * x[i] + t * x[i + 1];
    }
  }
  return x[n - 1];
}

controller::CalibrationStats ReferenceStats(const std::vector<double>& values, double c_low) {
  std::vector<double> a;
  for (double v : values) {
    if (std::isfinite(v)) a.push_back(std::fabs(v));
  }
  controller::CalibrationStats st;
  st.count = a.size();
  if (a.empty()) return st;
  st.q90 = ReferenceQuantile(a, 0.9);
  st.max = *std::max_element(a.begin(), a.end());
  long double sum = 0.0L;
  std::size_t low = 0;
  for (double v : a) {
    sum += v;
    low += v <= c_low ? 1 : 0;
  }
  st.mean = static_cast<double>(sum / static_cast<long double>(a.size()));
  st.frac_le_c_low = static_cast<double>(low) / static_cast<double>(a.size());
  return st;
}

void ExpectStatsNear(const controller::CalibrationStats& got, const controller::CalibrationStats& want) {
  EXPECT_EQ(got.count, want.count);
  EXPECT_NEAR(got.q90, want.q90, 1e-12 * std::max(1.0, want.q90));
  EXPECT_EQ(got.max, want.max);  // max is a selection: exact
  EXPECT_NEAR(got.mean, want.mean, 1e-12 * std::max(1.0, want.mean));
  EXPECT_EQ(got.frac_le_c_low, want.frac_le_c_low);  // same integer ratio
}

// ---------------------------------------------------------------------------
// ComputeCalibration
// ---------------------------------------------------------------------------

TEST(ComputeCalibrationTest, EmptyInput) {
  const controller::CalibrationStats st = controller::ComputeCalibration({}, 0.05);
  EXPECT_EQ(st.count, 0u);
  EXPECT_EQ(st.q90, 0.0);
  EXPECT_EQ(st.max, 0.0);
  EXPECT_EQ(st.mean, 0.0);
  EXPECT_EQ(st.frac_le_c_low, 0.0);
}

TEST(ComputeCalibrationTest, OnlyNonFiniteIsEmpty) {
  const controller::CalibrationStats st = controller::ComputeCalibration({kNaN, kInf, -kInf, kNaN}, 0.05);
  EXPECT_EQ(st.count, 0u);
  EXPECT_EQ(st.q90, 0.0);
  EXPECT_EQ(st.max, 0.0);
  EXPECT_EQ(st.mean, 0.0);
  EXPECT_EQ(st.frac_le_c_low, 0.0);
}

TEST(ComputeCalibrationTest, HandCheckedNumpyQuantiles) {
  // numpy.quantile(x, 0.9) for each x, worked by hand.
  struct Case {
    std::vector<double> values;
    double q90;
  };
  const Case cases[] = {
      {{0.3}, 0.3},
      {{0.0, 1.0}, 0.9},                                       // h = 0.9
      {{0.1, 0.2, 0.3}, 0.28},                                 // h = 1.8
      {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 9.1},                  // h = 8.1
      {{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 9.1},                  // order does not matter
      {{-1, 2, -3, 4, -5, 6, -7, 8, -9, 10}, 9.1},             // nor the sign
      {{0.5, 0.5, 0.5, 0.5}, 0.5},
      {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0}, 0.0},              // h = 9: x[9] = 0
      {{0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0}, 0.1},                 // h = 8.1
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.values));
    const controller::CalibrationStats st = controller::ComputeCalibration(c.values, 0.05);
    EXPECT_EQ(st.count, c.values.size());
    EXPECT_NEAR(st.q90, c.q90, 1e-12);
  }
}

TEST(ComputeCalibrationTest, HandCheckedSmallExample) {
  // |values| = {0.01, 0.05, 0.05, 0.2} after dropping NaN and Inf.
  const std::vector<double> v = {0.05, -0.01, kNaN, -0.05, 0.2, kInf, -kInf};
  const controller::CalibrationStats st = controller::ComputeCalibration(v, 0.05);
  EXPECT_EQ(st.count, 4u);
  EXPECT_NEAR(st.q90, 0.05 + 0.7 * (0.2 - 0.05), 1e-15);  // h = 2.7
  EXPECT_EQ(st.max, 0.2);
  EXPECT_NEAR(st.mean, 0.31 / 4.0, 1e-15);
  // |c| <= c_low counts the values equal to c_low.
  EXPECT_EQ(st.frac_le_c_low, 0.75);
  EXPECT_EQ(controller::ComputeCalibration(v, 0.049).frac_le_c_low, 0.25);
  EXPECT_EQ(controller::ComputeCalibration(v, 0.2).frac_le_c_low, 1.0);
}

TEST(ComputeCalibrationTest, RandomAgainstReference) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 0.05);
  std::uniform_int_distribution<int> kind(0, 19);
  for (std::size_t n : {1u, 2u, 3u, 9u, 10u, 11u, 100u, 1001u, 5000u}) {
    for (int rep = 0; rep < 5; ++rep) {
      std::vector<double> v;
      for (std::size_t i = 0; i < n; ++i) {
        // About one value in ten is NaN or +-Inf; the rest are signed.
        switch (kind(rng)) {
          case 0: v.push_back(kNaN); break;
          case 1: v.push_back(rng() % 2 ? kInf : -kInf); break;
          default: v.push_back(normal(rng)); break;
        }
      }
      for (double c_low : {0.0, 0.03, 0.05, 1.0}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " rep=" + std::to_string(rep) + " c_low=" + std::to_string(c_low));
        ExpectStatsNear(controller::ComputeCalibration(v, c_low), ReferenceStats(v, c_low));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// CalibrationWindow
// ---------------------------------------------------------------------------

TEST(CalibrationWindowTest, SkipFirst) {
  controller::CalibrationWindow w(/*capacity=*/100, /*skip_first=*/3);
  for (double v : {0.9, -0.8, 0.7}) w.Add(v);  // warm-up transient, dropped
  EXPECT_EQ(w.seen(), 3u);
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(w.Stats(0.05).count, 0u);
  w.Add(-0.02);
  w.Add(0.04);
  EXPECT_EQ(w.seen(), 5u);
  EXPECT_EQ(w.size(), 2u);
  const controller::CalibrationStats st = w.Stats(0.05);
  ExpectStatsNear(st, ReferenceStats({0.02, 0.04}, 0.05));
  EXPECT_EQ(st.max, 0.04);  // none of the skipped values leaked in
}

TEST(CalibrationWindowTest, NonFiniteCountedButNotStored) {
  controller::CalibrationWindow w(10);
  w.Add(0.1);
  w.Add(kNaN);
  w.Add(kInf);
  w.Add(-kInf);
  w.Add(-0.3);
  EXPECT_EQ(w.seen(), 5u);
  EXPECT_EQ(w.size(), 2u);
  ExpectStatsNear(w.Stats(0.05), ReferenceStats({0.1, 0.3}, 0.05));
}

TEST(CalibrationWindowTest, RingKeepsTheLastCapacityValues) {
  controller::CalibrationWindow w(4);
  for (int i = 1; i <= 10; ++i) w.Add(i % 2 ? i / 100.0 : -i / 100.0);
  EXPECT_EQ(w.seen(), 10u);
  EXPECT_EQ(w.size(), 4u);
  const controller::CalibrationStats st = w.Stats(0.08);
  ExpectStatsNear(st, ReferenceStats({0.07, 0.08, 0.09, 0.10}, 0.08));
  EXPECT_EQ(st.max, 0.10);
  EXPECT_EQ(st.frac_le_c_low, 0.5);
}

TEST(CalibrationWindowTest, RandomStreamMatchesLastCapacityFiniteValues) {
  // Stream with warm-up and non-finite values through windows of several
  // capacities; after every Add the window's statistics must be those of
  // the last `capacity` finite values seen after the warm-up.
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal(0.0, 0.1);
  std::uniform_int_distribution<int> kind(0, 9);
  for (std::size_t capacity : {1u, 2u, 7u, 50u}) {
    for (std::size_t skip : {0u, 5u}) {
      SCOPED_TRACE("capacity=" + std::to_string(capacity) + " skip=" + std::to_string(skip));
      controller::CalibrationWindow w(capacity, skip);
      std::vector<double> kept;  // finite values after the warm-up, in order
      for (std::size_t i = 0; i < 300; ++i) {
        const int k = kind(rng);
        const double v = k == 0 ? kNaN : k == 1 ? -kInf : normal(rng);
        w.Add(v);
        if (i >= skip && std::isfinite(v)) kept.push_back(v);
        const std::size_t m = std::min(capacity, kept.size());
        const std::vector<double> last(kept.end() - static_cast<std::ptrdiff_t>(m), kept.end());
        ASSERT_EQ(w.seen(), i + 1);
        ASSERT_EQ(w.size(), m);
        const controller::CalibrationStats got = w.Stats(0.05);
        const controller::CalibrationStats want = ReferenceStats(last, 0.05);
        ASSERT_EQ(got.count, want.count) << "i=" << i;
        ASSERT_EQ(got.max, want.max) << "i=" << i;
        ASSERT_NEAR(got.q90, want.q90, 1e-12) << "i=" << i;
        ASSERT_NEAR(got.mean, want.mean, 1e-12) << "i=" << i;
        ASSERT_EQ(got.frac_le_c_low, want.frac_le_c_low) << "i=" << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// SuggestThresholds
// ---------------------------------------------------------------------------

controller::CalibrationStats Stats(double q90, double max, std::size_t count = 100) {
  controller::CalibrationStats st;
  st.count = count;
  st.q90 = q90;
  st.max = max;
  st.mean = q90 / 2;
  return st;
}

TEST(SuggestThresholdsTest, PaperTable3) {
  // Qwen3-1.7B on-policy: q0.9 = 0.0471, max = 0.0924.
  // c_low = 0.0471 (already 3 significant digits), c_high = max(3 * 0.0924, 0.0942).
  base::StatusOr<controller::Thresholds> t = controller::SuggestThresholds(Stats(0.0471, 0.0924));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_DOUBLE_EQ(t->c_low, 0.0471);
  EXPECT_NEAR(t->c_high, 0.2772, 1e-12);
  EXPECT_TRUE(controller::ValidateThresholds(*t).ok());
}

struct RuleCase {
  double q90;
  double max;
  double c_low;
  double c_high;
};

TEST(SuggestThresholdsTest, DocumentedRule) {
  // c_low = q90 rounded up to 3 significant digits, at least 1e-3;
  // c_high = min(1, max(3 max, 2 c_low)). Every row worked by hand.
  const RuleCase cases[] = {
      {0.04712, 0.0924, 0.0472, 0.2772},  // rounds up, 3 max wins
      {0.04701, 0.05, 0.0471, 0.15},
      {0.0471, 0.2, 0.0471, 0.6},
      {0.123401, 0.3, 0.124, 0.9},
      {0.1, 0.1, 0.1, 0.3},               // on the grid: unchanged
      {0.3, 0.4, 0.3, 1.0},               // 3 max = 1.2, capped at 1
      {0.1, 0.7, 0.1, 1.0},               // 3 max = 2.1, capped at 1
      {0.012341, 0.02, 0.0124, 0.06},
      {0.0099999, 0.01, 0.01, 0.03},      // rounds up across a decade
      {0.00123, 0.002, 0.00123, 0.006},
      {0.0001, 0.0002, 0.001, 0.002},     // floor of 1e-3; 2 c_low wins
      {0.0, 0.0, 0.001, 0.002},
      {0.999, 1.0, 0.999, 1.0},
  };
  for (const RuleCase& c : cases) {
    SCOPED_TRACE("q90=" + std::to_string(c.q90) + " max=" + std::to_string(c.max));
    base::StatusOr<controller::Thresholds> t = controller::SuggestThresholds(Stats(c.q90, c.max));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_NEAR(t->c_low, c.c_low, 1e-12);
    EXPECT_NEAR(t->c_high, c.c_high, 1e-12);
    EXPECT_TRUE(controller::ValidateThresholds(*t).ok());
  }
}

TEST(SuggestThresholdsTest, RandomStatsObeyTheRule) {
  // Invariants of "round up to 3 significant digits": never below q90, less
  // than one unit of the third digit above it, and on that digit's grid.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> log_q(-2.9, -0.1);
  std::uniform_real_distribution<double> ratio(1.0, 3.0);
  for (int trial = 0; trial < 5000; ++trial) {
    const double q90 = std::pow(10.0, log_q(rng));
    const double max = q90 * ratio(rng);
    SCOPED_TRACE("q90=" + std::to_string(q90) + " max=" + std::to_string(max));
    base::StatusOr<controller::Thresholds> t = controller::SuggestThresholds(Stats(q90, max));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const double unit = std::pow(10.0, std::floor(std::log10(q90)) - 2.0);
    EXPECT_GE(t->c_low, q90 * (1.0 - 1e-12));
    EXPECT_LT(t->c_low - q90, unit * (1.0 + 1e-9));
    const double digits = t->c_low / unit;
    // 3 significant digits (or 1000 when rounding reaches the next decade).
    EXPECT_NEAR(digits, std::round(digits), 1e-6);
    EXPECT_GE(std::round(digits), 100.0);
    EXPECT_LE(std::round(digits), 1000.0);
    EXPECT_NEAR(t->c_high, std::min(1.0, std::max(3.0 * max, 2.0 * t->c_low)), 1e-15);
    EXPECT_TRUE(controller::ValidateThresholds(*t).ok());
  }
}

TEST(SuggestThresholdsTest, TooFewValues) {
  for (std::size_t count : {0u, 1u, 19u}) {
    SCOPED_TRACE(count);
    base::StatusOr<controller::Thresholds> t = controller::SuggestThresholds(Stats(0.05, 0.09, count));
    EXPECT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), base::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(controller::SuggestThresholds(Stats(0.05, 0.09, 20)).ok());
  EXPECT_EQ(controller::SuggestThresholds(Stats(0.05, 0.09, 49), 50).status().code(), base::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(controller::SuggestThresholds(Stats(0.05, 0.09, 50), 50).ok());
  // Even with min_count = 0 there is nothing to calibrate on without values.
  EXPECT_EQ(controller::SuggestThresholds(Stats(0.0, 0.0, 0), 0).status().code(), base::StatusCode::kFailedPrecondition);
}

TEST(SuggestThresholdsTest, CosineTooHighToCalibrate) {
  // q90 rounds up to 1.0, so c_low = c_high = 1: no valid thresholds exist.
  for (double q90 : {0.9991, 0.9999, 1.0}) {
    SCOPED_TRACE(q90);
    base::StatusOr<controller::Thresholds> t = controller::SuggestThresholds(Stats(q90, 1.0));
    EXPECT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), base::StatusCode::kFailedPrecondition);
  }
}

TEST(SuggestThresholdsTest, FromAWindow) {
  // End to end: a window of synthetic on-policy cosines, thresholds from its
  // statistics, and a controller built from them.
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 0.02);
  controller::CalibrationWindow w(1000, 50);
  std::vector<double> all;
  for (int i = 0; i < 1200; ++i) {
    const double v = i < 50 ? 0.9 : normal(rng);  // large transient first
    w.Add(v);
    all.push_back(v);
  }
  const controller::CalibrationStats st = w.Stats(0.05);
  const std::vector<double> last(all.end() - 1000, all.end());
  ExpectStatsNear(st, ReferenceStats(last, 0.05));
  base::StatusOr<controller::Thresholds> t = controller::SuggestThresholds(st);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_GE(t->c_low, st.q90);
  EXPECT_LT(t->c_low, 0.1);  // the 0.9 transient was skipped
  EXPECT_TRUE(controller::Controller::Create(*t).ok());
}

}  // namespace
}  // namespace gac
