// Tests of the spike guard (gac/controller/spike.h).
//
// The expected verdicts come from a reference written here from the rule's
// definition: a plain list of the held values, mean and sample standard
// deviation of its last `window` entries in long double, z = (x - mean) / sd,
// a spike above sigma once `warmup` values are held, or above max_grad_norm;
// a step let through is held as it is, a spike as min(x, mean + sigma * sd).
// Nothing of the implementation is reused.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gac/base/status.h"
#include "gac/controller/controller.h"
#include "gac/controller/spike.h"
#include "gac/controller/window.h"

namespace gac {
namespace {

using controller::AlignmentStats;
using controller::Regime;
using controller::SpikeGuard;
using controller::SpikeSettings;
using controller::SpikeVerdict;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct RefScore {
  double z;
  double bound;  // mean + sigma * sd
};

// z of x against the last `window` of `held` and the bound mean + sigma * sd,
// or nullopt with fewer than `warmup` (or 2) of them.
std::optional<RefScore> ReferenceScore(double x, const std::vector<double>& held, int window, int warmup,
                                       double sigma) {
  const std::size_t n = std::min(held.size(), static_cast<std::size_t>(window));
  if (n < static_cast<std::size_t>(std::max(warmup, 2))) return std::nullopt;
  const std::size_t first = held.size() - n;
  long double sum = 0;
  for (std::size_t i = first; i < held.size(); ++i) sum += held[i];
  const long double mean = sum / n;
  long double ss = 0;
  for (std::size_t i = first; i < held.size(); ++i) ss += (held[i] - mean) * (held[i] - mean);
  const long double sd = std::sqrt(ss / (n - 1));
  return RefScore{static_cast<double>((x - mean) / sd), static_cast<double>(mean + sigma * sd)};
}


TEST(SpikeSettingsTest, BadSettingsAreRefusedNamingTheSetting) {
  SpikeSettings base;
  base.zscore = true;
  // Each case changes the valid `base` in one way.
  struct Case {
    void (*change)(SpikeSettings&);
    const char* names;
  };
  const Case cases[] = {
      {[](SpikeSettings& s) { s.max_grad_norm = -1.0; }, "max_grad_norm"},
      {[](SpikeSettings& s) { s.max_grad_norm = kInf; }, "max_grad_norm"},
      {[](SpikeSettings& s) { s.sigma = 0.0; }, "spike_sigma"},
      {[](SpikeSettings& s) { s.sigma = -3.0; }, "spike_sigma"},
      {[](SpikeSettings& s) { s.sigma = kNaN; }, "spike_sigma"},
      {[](SpikeSettings& s) { s.window = 1; }, "spike_window"},
      {[](SpikeSettings& s) { s.window = controller::kMaxSpikeWindow + 1; }, "spike_window"},
      {[](SpikeSettings& s) { s.warmup = 1; }, "spike_warmup"},
      {[](SpikeSettings& s) {
         s.window = 16;
         s.warmup = 17;
       },
       "spike_warmup"},
  };
  for (const Case& c : cases) {
    SpikeSettings changed = base;
    c.change(changed);
    const base::Status st = controller::ValidateSpikeSettings(changed);
    EXPECT_TRUE(st.IsInvalidArgument()) << c.names;
    EXPECT_NE(st.message().find(c.names), std::string::npos) << st.message();
  }
  EXPECT_TRUE(controller::ValidateSpikeSettings(SpikeSettings{}).ok());
  EXPECT_TRUE(controller::ValidateSpikeSettings(base).ok());
  EXPECT_FALSE(SpikeSettings{}.enabled());
  EXPECT_EQ(base.effective_warmup(), 64);
}

// A random stream of norms with spikes: the guard's verdicts, z-scores and
// windows follow the reference at every step, spikes staying out of it.
TEST(SpikeGuardTest, FollowsTheReferenceOnARandomStreamWithSpikes) {
  for (const int window : {2, 5, 32}) {
    for (const int warmup : {0, 2, 4}) {
      SpikeSettings s;
      s.zscore = true;
      s.window = window;
      s.sigma = 3.0;
      s.warmup = warmup > window ? window : warmup;
      ASSERT_TRUE(controller::ValidateSpikeSettings(s).ok());
      SpikeGuard guard(s);
      std::mt19937_64 rng(1234 + window * 10 + warmup);
      std::normal_distribution<double> noise(10.0, 1.0);
      std::normal_distribution<double> loss_noise(-0.5, 0.1);
      std::vector<double> norms;
      std::vector<double> losses;
      int spikes = 0;
      for (int step = 0; step < 400; ++step) {
        double norm = std::fabs(noise(rng));
        double loss = loss_noise(rng);
        if (step % 37 == 36) norm *= 1000.0;
        if (step % 53 == 52) loss += 100.0;
        const std::optional<double> loss_given = step % 3 == 0 ? std::nullopt : std::optional<double>(loss);
        const std::optional<RefScore> zs = ReferenceScore(norm, norms, window, s.effective_warmup(), s.sigma);
        std::optional<RefScore> lzs;
        if (loss_given) lzs = ReferenceScore(loss, losses, window, s.effective_warmup(), s.sigma);
        const bool spike = (zs && zs->z > s.sigma) || (lzs && lzs->z > s.sigma);
        const SpikeVerdict v = guard.Step(norm, loss_given);
        ASSERT_EQ(v.spike, spike) << "window " << window << " step " << step;
        ASSERT_EQ(v.grad_norm.has_value(), zs.has_value());
        if (zs && v.grad_norm) {
          EXPECT_NEAR(v.grad_norm->z, std::clamp(zs->z, -controller::kMaxSpikeZ, controller::kMaxSpikeZ),
                      1e-9 * std::max(1.0, std::fabs(zs->z)));
        }
        ASSERT_EQ(v.loss.has_value(), lzs.has_value());
        if (lzs && v.loss) {
          EXPECT_NEAR(v.loss->z, lzs->z, 1e-9 * std::max(1.0, std::fabs(lzs->z)));
        }
        if (!spike) {
          norms.push_back(norm);
          if (loss_given) losses.push_back(*loss_given);
        } else {
          if (zs) norms.push_back(std::min(norm, zs->bound));
          if (lzs) losses.push_back(std::min(loss, lzs->bound));
        }
        spikes += spike;
      }
      // The planted spikes after the warm-up were found; the windows hold spikes at their bounds.
      EXPECT_GE(spikes, 400 / 37 - 2) << "window " << window;
      std::vector<double> tail(norms.end() - std::min<std::ptrdiff_t>(window, norms.size()), norms.end());
      ASSERT_EQ(guard.norms().size(), tail.size());
      for (std::size_t i = 0; i < tail.size(); ++i) EXPECT_NEAR(guard.norms()[i], tail[i], 1e-9 * tail[i]);
    }
  }
}

// A level that persists (|g| x 2, x 10, x 1000 from step 200 on) is skipped
// for a run of steps, each entering the history at its bound, then followed:
// every step after the run is let through. The run's length is the
// reference's; without the clamped entries it would never end.
TEST(SpikeGuardTest, APersistentLevelIsFollowedAfterARunOfSkips) {
  for (const double factor : {2.0, 10.0, 1000.0}) {
    SpikeSettings s;
    s.zscore = true;
    SpikeGuard guard(s);
    std::mt19937_64 rng(7);
    std::normal_distribution<double> noise(1.0, 0.05);
    std::vector<double> held;
    int run = 0;  // consecutive spikes from step 200
    bool followed = false;
    for (int step = 0; step < 600; ++step) {
      const double norm = std::fabs(noise(rng)) * (step >= 200 ? factor : 1.0);
      const std::optional<RefScore> ref = ReferenceScore(norm, held, s.window, s.effective_warmup(), s.sigma);
      const bool ref_spike = ref && ref->z > s.sigma;
      held.push_back(ref_spike ? std::min(norm, ref->bound) : norm);
      if (held.size() > static_cast<std::size_t>(s.window)) held.erase(held.begin());
      const bool spike = guard.Step(norm, std::nullopt).spike;
      ASSERT_EQ(spike, ref_spike) << "x" << factor << " step " << step;
      if (step < 200) continue;
      if (!followed && spike) ++run;
      if (!spike) followed = true;
      if (followed) {
        EXPECT_FALSE(spike) << "x" << factor << " step " << step << ": skipped again after following";
      }
    }
    std::cout << "x" << factor << ": followed after " << run << " skips\n";
    EXPECT_TRUE(followed) << "x" << factor;
    EXPECT_GT(run, 0) << "x" << factor;
    EXPECT_LT(run, s.window) << "x" << factor;
  }
}

// One spike enters at its bound, mean + sigma * sd of the held values: it
// moves the next step's statistics by that much and no more. Before the
// warm-up a spike (by max_grad_norm) adds nothing; with sd 0, the value itself.
TEST(SpikeGuardTest, ASpikeEntersAtTheBoundItBroke) {
  SpikeSettings s;
  s.zscore = true;
  s.window = 8;
  s.sigma = 2.0;
  s.max_grad_norm = 50.0;
  SpikeGuard guard(s);
  EXPECT_TRUE(guard.Step(60.0, std::nullopt).spike);  // no z yet: nothing held
  EXPECT_TRUE(guard.norms().empty());
  const std::vector<double> base = {1.0, 2.0, 3.0, 4.0, 5.0};
  for (double x : base) EXPECT_FALSE(guard.Step(x, 0.5 * x).spike);
  const SpikeVerdict v = guard.Step(1000.0, 0.5);  // mean 3, sd sqrt(2.5)
  EXPECT_TRUE(v.spike);
  ASSERT_TRUE(v.grad_norm && v.grad_norm->bound.has_value());
  EXPECT_DOUBLE_EQ(*v.grad_norm->bound, 3.0 + 2.0 * std::sqrt(2.5));
  EXPECT_DOUBLE_EQ(guard.norms().back(), 3.0 + 2.0 * std::sqrt(2.5));
  EXPECT_DOUBLE_EQ(guard.losses().back(), 0.5);  // its loss was in range: held as it is
  // A spike by max_grad_norm alone, in range for the z-score: held as it is.
  SpikeSettings wide = s;
  wide.sigma = 100.0;
  SpikeGuard bounded(wide);
  for (double x : {40.0, 45.0, 50.0, 42.0}) EXPECT_FALSE(bounded.Step(x, std::nullopt).spike);
  EXPECT_TRUE(bounded.Step(55.0, std::nullopt).spike);
  EXPECT_EQ(bounded.norms().back(), 55.0);
  // Equal values (sd 0): the spike is held as it is, so the guard is not stuck.
  SpikeGuard flat(s);
  for (int i = 0; i < 4; ++i) flat.Step(2.0, std::nullopt);
  const SpikeVerdict up = flat.Step(3.0, std::nullopt);
  EXPECT_TRUE(up.spike);
  ASSERT_TRUE(up.grad_norm.has_value());
  EXPECT_FALSE(up.grad_norm->bound.has_value());
  EXPECT_EQ(flat.norms().back(), 3.0);
  EXPECT_FALSE(flat.Step(2.5, std::nullopt).spike);
  // A non-finite loss: the norm is held, the loss is not.
  const std::size_t losses = guard.losses().size();
  EXPECT_TRUE(guard.Step(3.0, std::numeric_limits<double>::quiet_NaN()).spike);
  EXPECT_EQ(guard.norms().back(), 3.0);
  EXPECT_EQ(guard.losses().size(), losses);
}

TEST(SpikeGuardTest, MaxGradNormAloneNeedsNoHistory) {
  SpikeSettings s;
  s.max_grad_norm = 5.0;
  SpikeGuard guard(s);
  EXPECT_FALSE(guard.Step(5.0, std::nullopt).spike);  // at the bound: not above it
  const SpikeVerdict v = guard.Step(5.000001, 1.0);
  EXPECT_TRUE(v.spike);
  EXPECT_FALSE(v.grad_norm.has_value());  // the z-score is off
  EXPECT_FALSE(v.loss.has_value());
  EXPECT_EQ(guard.norms(), std::vector<double>{5.0});
}

TEST(SpikeGuardTest, EqualValuesGiveAClampedZAndANonFiniteLossIsASpike) {
  SpikeSettings s;
  s.zscore = true;
  s.window = 4;
  SpikeGuard guard(s);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(guard.Step(2.0, 1.0).spike);
  SpikeVerdict same = guard.Judge(2.0, 1.0);
  EXPECT_FALSE(same.spike);
  EXPECT_EQ(same.grad_norm->z, 0.0);
  SpikeVerdict above = guard.Judge(2.5, 1.0);
  EXPECT_TRUE(above.spike);
  EXPECT_EQ(above.grad_norm->z, controller::kMaxSpikeZ);
  SpikeVerdict below = guard.Judge(1.0, 1.0);
  EXPECT_FALSE(below.spike);  // one-sided
  EXPECT_EQ(below.grad_norm->z, -controller::kMaxSpikeZ);
  EXPECT_TRUE(guard.Judge(2.0, kNaN).spike);
  EXPECT_TRUE(guard.Judge(2.0, kInf).spike);
  guard.Clear();
  EXPECT_TRUE(guard.norms().empty());
  EXPECT_FALSE(guard.Judge(1e30, 1.0).spike);  // no history: warming up
}

TEST(SpikeGuardTest, JudgeSpikeUsesTheNewestWindowOfTheGivenValues) {
  SpikeSettings s;
  s.zscore = true;
  s.window = 3;
  s.sigma = 2.0;
  // The old 100s are outside the window of 3.
  const std::vector<double> norms = {100.0, 100.0, 1.0, 2.0, 3.0};
  const SpikeVerdict v = controller::JudgeSpike(s, 5.0, std::nullopt, norms, {});
  ASSERT_TRUE(v.grad_norm.has_value());
  EXPECT_DOUBLE_EQ(v.grad_norm->z, 3.0);  // mean 2, sd 1
  EXPECT_TRUE(v.spike);
}

TEST(SpikeDecisionTest, SkipsWithTheStepsCosineAndKeepsNoProjection) {
  const AlignmentStats stats{1.0, 4.0, 1.0, true};
  SpikeVerdict v;
  v.spike = true;
  v.grad_norm = controller::SpikeScore{7.5, 9.0};
  const controller::Decision d = controller::SpikeDecision(stats, v, 0.25);
  EXPECT_EQ(d.regime, Regime::kSpike);
  EXPECT_FALSE(d.apply_update);
  EXPECT_EQ(d.alpha, 1.0);
  EXPECT_EQ(d.projection_coeff, 0.0);
  EXPECT_FALSE(d.cosine_after.has_value());
  ASSERT_TRUE(d.cosine.has_value());
  EXPECT_NEAR(*d.cosine, 0.5, 1e-8);
  EXPECT_EQ(d.grad_norm, 2.0);
  EXPECT_EQ(*d.window_mean, 0.25);
  ASSERT_TRUE(d.spike_verdict.grad_norm.has_value());
  EXPECT_EQ(d.spike_verdict.grad_norm->z, 7.5);
  EXPECT_EQ(d.spike_verdict.grad_norm->bound, 9.0);
  EXPECT_STREQ(controller::RegimeName(Regime::kSpike), "spike");
  EXPECT_EQ(*controller::ParseRegime("spike"), Regime::kSpike);
}

}  // namespace
}  // namespace gac
