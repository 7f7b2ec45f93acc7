// Tests of the windowed trigger (gac/controller/window.h): AlignmentWindow,
// DecideOnMean and TriggeredController.
//
// The expected decisions come from a reference written here from the rule's
// definition (docs/ALGORITHM.md, "The windowed trigger"): a plain list of the
// valid cosines so far, the mean of its last W entries, and the regime of
// that mean by the thresholds. Nothing of the implementation is reused.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gac/base/status.h"
#include "gac/controller/controller.h"
#include "gac/controller/window.h"

namespace gac {
namespace {

using controller::AlignmentStats;
using controller::AlignmentWindow;
using controller::AlphaMode;
using controller::Decision;
using controller::Regime;
using controller::Thresholds;
using controller::Trigger;
using controller::TriggeredController;
using controller::TriggerSettings;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------
// The reference
// ---------------------------------------------------------------------------

// One scripted step: its statistics, built from a cosine, or invalid, or
// without a reference.
enum class Kind { kValid, kInvalid, kNoReference, kZeroReference };

// |g| = 2, |p| = 1: dot = 2 c gives the cosine 2c / (2 + 1e-8).
AlignmentStats StatsFor(Kind kind, double c) {
  switch (kind) {
    case Kind::kValid: return AlignmentStats{2.0 * c, 4.0, 1.0, true};
    case Kind::kInvalid: return AlignmentStats{kNaN, 4.0, 1.0, true};
    case Kind::kNoReference: return AlignmentStats{0.0, 4.0, 0.0, false};
    case Kind::kZeroReference: return AlignmentStats{0.0, 4.0, 0.0, true};
  }
  return {};
}

// The cosine of the definition: dot / (sqrt(gg) sqrt(pp) + 1e-8).
double DefinedCosine(const AlignmentStats& s) { return s.dot / (std::sqrt(s.grad_sq) * std::sqrt(s.ref_sq) + 1e-8); }

struct Expected {
  Regime regime = Regime::kSafe;
  std::optional<double> cosine;
  std::optional<double> mean;
  double alpha = 1.0;
  double coeff = 0.0;
};

// Decides every step of `steps` by the windowed rule from scratch: the mean
// of the last `window` valid cosines up to and including the step.
std::vector<Expected> Reference(const std::vector<AlignmentStats>& steps, int window, Thresholds t, bool windowed,
                                AlphaMode mode = AlphaMode::kPaper) {
  std::vector<double> valid;
  std::vector<Expected> out;
  for (const AlignmentStats& s : steps) {
    Expected e;
    const bool finite = std::isfinite(s.dot) && std::isfinite(s.grad_sq) && std::isfinite(s.ref_sq);
    if (!finite) {
      e.regime = Regime::kInvalid;
    } else if (s.has_reference && s.ref_sq > 0.0) {
      e.cosine = DefinedCosine(s);
      valid.push_back(*e.cosine);
    }
    if (static_cast<int>(valid.size()) >= window) {
      long double sum = 0.0L;
      for (std::size_t i = valid.size() - static_cast<std::size_t>(window); i < valid.size(); ++i) sum += valid[i];
      e.mean = static_cast<double>(sum / window);
    }
    if (e.cosine) {
      const std::optional<double> on = windowed ? e.mean : e.cosine;
      const double a = on ? std::fabs(*on) : 0.0;
      if (!on || a <= t.c_low) {
        e.regime = Regime::kSafe;
      } else if (a >= t.c_high) {
        e.regime = Regime::kSkip;
      } else {
        e.regime = Regime::kProject;
        e.alpha = mode == AlphaMode::kPaper
                      ? t.c_low / a
                      : t.c_low * std::sqrt(1.0 - a * a) / (a * std::sqrt(1.0 - t.c_low * t.c_low));
        e.coeff = (1.0 - e.alpha) * s.dot / s.ref_sq;
      }
    }
    out.push_back(e);
  }
  return out;
}

// The cosine of g' = g - coeff p with p, measured on explicit 2-vectors with
// the step's norms and cosine.
double MeasuredCosineAfter(const AlignmentStats& s, double coeff) {
  const double gn = std::sqrt(s.grad_sq), pn = std::sqrt(s.ref_sq);
  const double c = s.dot / (gn * pn);
  const double g[2] = {gn * c, gn * std::sqrt(1.0 - c * c)};
  const double p[2] = {pn, 0.0};
  const double h[2] = {g[0] - coeff * p[0], g[1] - coeff * p[1]};
  return (h[0] * p[0] + h[1] * p[1]) / (std::hypot(h[0], h[1]) * pn);
}

TriggeredController MakeTriggered(Trigger trigger, int window, Thresholds window_t, Thresholds per_step = {},
                                  AlphaMode mode = AlphaMode::kPaper) {
  TriggerSettings s;
  s.trigger = trigger;
  s.window = window;
  s.window_thresholds = window_t;
  base::StatusOr<TriggeredController> c = TriggeredController::Create(per_step, mode, s);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

void ExpectMatches(const Expected& e, const Decision& d, const AlignmentStats& s, std::size_t step) {
  SCOPED_TRACE("step " + std::to_string(step));
  EXPECT_EQ(d.regime, e.regime);
  ASSERT_EQ(d.cosine.has_value(), e.cosine.has_value());
  if (e.cosine) {
    EXPECT_NEAR(*d.cosine, *e.cosine, 1e-15);
  }
  ASSERT_EQ(d.window_mean.has_value(), e.mean.has_value());
  if (e.mean) {
    EXPECT_NEAR(*d.window_mean, *e.mean, 1e-15);
  }
  EXPECT_NEAR(d.alpha, e.alpha, 1e-12);
  EXPECT_NEAR(d.projection_coeff, e.coeff, 1e-12);
  EXPECT_EQ(d.apply_update, e.regime == Regime::kSafe || e.regime == Regime::kProject);
  switch (e.regime) {
    case Regime::kSafe:
      EXPECT_EQ(d.cosine_after, d.cosine);
      break;
    case Regime::kProject:
      ASSERT_TRUE(d.cosine_after);
      EXPECT_NEAR(*d.cosine_after, MeasuredCosineAfter(s, e.coeff), 1e-9);
      break;
    default:
      EXPECT_FALSE(d.cosine_after);
  }
}

// ---------------------------------------------------------------------------
// Names and settings
// ---------------------------------------------------------------------------

TEST(Trigger, NamesRoundTrip) {
  EXPECT_STREQ(controller::TriggerName(Trigger::kPerStep), "per_step");
  EXPECT_STREQ(controller::TriggerName(Trigger::kWindow), "window");
  for (Trigger t : {Trigger::kPerStep, Trigger::kWindow}) {
    base::StatusOr<Trigger> parsed = controller::ParseTrigger(controller::TriggerName(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
  for (const char* bad : {"step", "Window", "", "windowed"}) {
    base::StatusOr<Trigger> parsed = controller::ParseTrigger(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_TRUE(parsed.status().IsInvalidArgument());
    EXPECT_NE(parsed.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << parsed.status().message();
  }
  EXPECT_FALSE(controller::ParseTrigger(nullptr).ok());
}

TEST(Trigger, ValidateWindowRange) {
  EXPECT_TRUE(controller::ValidateWindow(1).ok());
  EXPECT_TRUE(controller::ValidateWindow(controller::kMaxWindow).ok());
  for (int bad : {0, -3, controller::kMaxWindow + 1}) {
    base::Status s = controller::ValidateWindow(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(s.IsInvalidArgument());
    EXPECT_NE(s.message().find(std::to_string(bad)), std::string::npos) << s.message();
  }
}

TEST(Trigger, ValidateSettingsAndCreate) {
  TriggerSettings s;
  EXPECT_EQ(s.trigger, Trigger::kPerStep);  // the paper's rule by default
  EXPECT_EQ(s.window, 20);
  EXPECT_EQ(s.window_thresholds.c_low, Thresholds{}.c_low);
  EXPECT_EQ(s.window_thresholds.c_high, Thresholds{}.c_high);
  EXPECT_TRUE(controller::ValidateTriggerSettings(s).ok());
  s.window = 0;
  EXPECT_TRUE(controller::ValidateTriggerSettings(s).IsInvalidArgument());
  s.window = 5;
  s.window_thresholds = {0.3, 0.2};
  base::Status bad = controller::ValidateTriggerSettings(s);
  EXPECT_TRUE(bad.IsInvalidArgument());
  EXPECT_NE(bad.message().find("window"), std::string::npos) << bad.message();
  EXPECT_FALSE(TriggeredController::Create({}, AlphaMode::kPaper, s).ok());
  s.window_thresholds = {0.01, 0.1};
  EXPECT_TRUE(TriggeredController::Create({}, AlphaMode::kPaper, s).ok());
  EXPECT_FALSE(TriggeredController::Create({0.5, 0.4}, AlphaMode::kPaper, s).ok());  // per-step thresholds too
}

// ---------------------------------------------------------------------------
// AlignmentWindow
// ---------------------------------------------------------------------------

TEST(AlignmentWindow, MeanAbsentUntilFull) {
  AlignmentWindow w(3);
  EXPECT_EQ(w.size(), 3);
  EXPECT_EQ(w.held(), 0);
  EXPECT_FALSE(w.mean());
  w.Add(0.5);
  w.Add(-0.25);
  EXPECT_EQ(w.held(), 2);
  EXPECT_FALSE(w.full());
  EXPECT_FALSE(w.mean());
  w.Add(1.0);
  ASSERT_TRUE(w.mean());
  EXPECT_DOUBLE_EQ(*w.mean(), 1.25 / 3.0);
  w.Add(0.75);  // drops 0.5
  EXPECT_EQ(w.held(), 3);
  EXPECT_EQ(w.values(), (std::vector<double>{-0.25, 1.0, 0.75}));
  EXPECT_DOUBLE_EQ(*w.mean(), 0.5);
}

TEST(AlignmentWindow, NonFiniteValuesAreIgnored) {
  AlignmentWindow w(2);
  w.Add(kNaN);
  w.Add(std::numeric_limits<double>::infinity());
  EXPECT_EQ(w.held(), 0);
}

TEST(AlignmentWindow, ResizeKeepsTheMostRecent) {
  AlignmentWindow w(5);
  for (int i = 1; i <= 7; ++i) w.Add(i);
  EXPECT_EQ(w.values(), (std::vector<double>{3, 4, 5, 6, 7}));
  w.Resize(3);
  EXPECT_EQ(w.size(), 3);
  EXPECT_EQ(w.values(), (std::vector<double>{5, 6, 7}));
  ASSERT_TRUE(w.mean());
  EXPECT_EQ(*w.mean(), 6.0);
  w.Resize(6);  // larger: nothing new, not full
  EXPECT_EQ(w.values(), (std::vector<double>{5, 6, 7}));
  EXPECT_FALSE(w.mean());
  for (int i = 8; i <= 10; ++i) w.Add(i);
  ASSERT_TRUE(w.mean());
  EXPECT_EQ(*w.mean(), 7.5);
  w.Add(11);
  EXPECT_EQ(w.values(), (std::vector<double>{6, 7, 8, 9, 10, 11}));
  w.Resize(1);
  EXPECT_EQ(*w.mean(), 11.0);
}

TEST(AlignmentWindow, ClearEmptiesAndKeepsTheSize) {
  AlignmentWindow w(2);
  w.Add(0.5);
  w.Add(0.5);
  ASSERT_TRUE(w.mean());
  w.Clear();
  EXPECT_EQ(w.held(), 0);
  EXPECT_EQ(w.size(), 2);
  EXPECT_FALSE(w.mean());
  EXPECT_TRUE(w.values().empty());
  w.Add(-0.5);
  w.Add(0.25);
  EXPECT_EQ(*w.mean(), -0.125);
}

// A million values of alternating large magnitude: the mean stays the mean
// of the values held (a running sum would carry the rounding of every value
// ever added and removed).
TEST(AlignmentWindow, MeanDoesNotDriftOverAMillionAdds) {
  constexpr int kWindow = 20;
  AlignmentWindow w(kWindow);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> noise(-1e-3, 1e-3);
  std::vector<double> all;
  all.reserve(1000000);
  for (int i = 0; i < 1000000; ++i) {
    const double v = (i % 2 == 0 ? 0.999 : -0.999) + noise(rng) * (i % 7);
    all.push_back(v);
    w.Add(v);
  }
  long double sum = 0.0L;
  for (std::size_t i = all.size() - kWindow; i < all.size(); ++i) sum += all[i];
  const double expected = static_cast<double>(sum / kWindow);
  ASSERT_TRUE(w.mean());
  EXPECT_NEAR(*w.mean(), expected, 1e-17);
  const std::vector<double> held = w.values();
  EXPECT_EQ(held, std::vector<double>(all.end() - kWindow, all.end()));
}

// ---------------------------------------------------------------------------
// DecideOnMean
// ---------------------------------------------------------------------------

controller::Controller MakeController(double lo, double hi, AlphaMode mode = AlphaMode::kPaper) {
  base::StatusOr<controller::Controller> c = controller::Controller::Create({lo, hi}, mode);
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

// Thresholds and means that are exact binary fractions: the boundaries are
// hit exactly.
TEST(DecideOnMean, ThresholdBoundaries) {
  const controller::Controller c = MakeController(0.125, 0.5);
  const AlignmentStats s = StatsFor(Kind::kValid, 0.9);  // the step's own cosine would skip
  EXPECT_EQ(controller::DecideOnMean(c, s, std::nullopt).regime, Regime::kSafe);
  EXPECT_EQ(controller::DecideOnMean(c, s, 0.125).regime, Regime::kSafe);
  EXPECT_EQ(controller::DecideOnMean(c, s, -0.125).regime, Regime::kSafe);
  EXPECT_EQ(controller::DecideOnMean(c, s, std::nextafter(0.125, 1.0)).regime, Regime::kProject);
  EXPECT_EQ(controller::DecideOnMean(c, s, std::nextafter(0.5, 0.0)).regime, Regime::kProject);
  EXPECT_EQ(controller::DecideOnMean(c, s, -0.25).regime, Regime::kProject);
  EXPECT_EQ(controller::DecideOnMean(c, s, 0.5).regime, Regime::kSkip);
  EXPECT_EQ(controller::DecideOnMean(c, s, -0.5).regime, Regime::kSkip);
  const Decision safe = controller::DecideOnMean(c, s, 0.125);
  ASSERT_TRUE(safe.cosine);
  EXPECT_NEAR(*safe.cosine, DefinedCosine(s), 1e-15);
  EXPECT_EQ(safe.cosine_after, safe.cosine);
  EXPECT_EQ(safe.alpha, 1.0);
  EXPECT_EQ(safe.projection_coeff, 0.0);
  EXPECT_TRUE(safe.apply_update);
  EXPECT_EQ(safe.window_mean, std::optional<double>(0.125));
  const Decision skip = controller::DecideOnMean(c, s, -0.5);
  EXPECT_FALSE(skip.apply_update);
  EXPECT_FALSE(skip.cosine_after);
  EXPECT_EQ(skip.window_mean, std::optional<double>(-0.5));
  EXPECT_EQ(skip.grad_norm, 2.0);
  EXPECT_EQ(skip.ref_norm, 1.0);
}

TEST(DecideOnMean, ProjectsWithTheAlphaOfTheMean) {
  for (AlphaMode mode : {AlphaMode::kPaper, AlphaMode::kExact}) {
    const controller::Controller c = MakeController(0.1, 0.6, mode);
    const AlignmentStats s = StatsFor(Kind::kValid, -0.05);  // the sign of c_t need not be the mean's
    const double m = 0.4;
    const Decision d = controller::DecideOnMean(c, s, -m);
    ASSERT_EQ(d.regime, Regime::kProject);
    const double alpha = mode == AlphaMode::kPaper ? 0.1 / m : 0.1 * std::sqrt(1 - m * m) / (m * std::sqrt(1 - 0.01));
    EXPECT_NEAR(d.alpha, alpha, 1e-15);
    EXPECT_NEAR(d.projection_coeff, (1.0 - alpha) * s.dot / s.ref_sq, 1e-15);
    ASSERT_TRUE(d.cosine_after);
    EXPECT_NEAR(*d.cosine_after, MeasuredCosineAfter(s, d.projection_coeff), 1e-9);
    EXPECT_TRUE(d.apply_update);
  }
}

TEST(DecideOnMean, InvalidAndNoReferenceAsTheController) {
  const controller::Controller c = MakeController(0.05, 0.3);
  for (const AlignmentStats& s :
       {AlignmentStats{kNaN, 1, 1, true}, AlignmentStats{0.1, kNaN, 1, true}, AlignmentStats{0.1, 1, -1, true},
        AlignmentStats{0.1, 1, 0, true}, AlignmentStats{0.0, 1, 0, false}, AlignmentStats{0.5, 1, 1, false},
        AlignmentStats{1e-300, 1.0, 1e-310, true}}) {
    const Decision per_step = c.Decide(s);
    for (std::optional<double> m : {std::optional<double>(), std::optional<double>(0.2)}) {
      const Decision d = controller::DecideOnMean(c, s, m);
      if (per_step.regime == Regime::kInvalid || !per_step.cosine) {
        EXPECT_EQ(d.regime, per_step.regime);
        EXPECT_FALSE(d.cosine);
        EXPECT_FALSE(d.cosine_after);
        EXPECT_EQ(d.apply_update, per_step.apply_update);
        EXPECT_EQ(d.projection_coeff, 0.0);
      }
      EXPECT_EQ(d.window_mean, m);
    }
  }
  // A subnormal reference whose coefficient overflows: safe with no cosine.
  const AlignmentStats tiny{1e-10, 1.0, 4.9e-324, true};
  const Decision d = controller::DecideOnMean(c, tiny, 0.2);
  EXPECT_EQ(d.regime, Regime::kSafe);
  EXPECT_FALSE(d.cosine);
  EXPECT_EQ(d.projection_coeff, 0.0);
  EXPECT_EQ(d.window_mean, std::optional<double>(0.2));
}

// ---------------------------------------------------------------------------
// TriggeredController against the reference
// ---------------------------------------------------------------------------

TEST(TriggeredController, WindowNotFullIsSafe) {
  TriggeredController t = MakeTriggered(Trigger::kWindow, 4, {0.05, 0.3});
  EXPECT_EQ(t.Decide(StatsFor(Kind::kNoReference, 0)).regime, Regime::kSafe);
  for (int i = 0; i < 3; ++i) {
    const Decision d = t.Decide(StatsFor(Kind::kValid, 0.95));
    EXPECT_EQ(d.regime, Regime::kSafe) << i;
    EXPECT_FALSE(d.window_mean);
    EXPECT_TRUE(d.apply_update);
  }
  const Decision d = t.Decide(StatsFor(Kind::kValid, 0.95));
  EXPECT_EQ(d.regime, Regime::kSkip);
  ASSERT_TRUE(d.window_mean);
  EXPECT_NEAR(*d.window_mean, 0.95, 1e-7);
}

TEST(TriggeredController, AlternatingSignsAverageOut) {
  TriggeredController windowed = MakeTriggered(Trigger::kWindow, 6, {0.05, 0.3});
  TriggeredController per_step = MakeTriggered(Trigger::kPerStep, 6, {0.05, 0.3});
  for (int i = 0; i < 60; ++i) {
    const AlignmentStats s = StatsFor(Kind::kValid, i % 2 == 0 ? 0.5 : -0.5);
    const Decision w = windowed.Decide(s);
    const Decision p = per_step.Decide(s);
    EXPECT_EQ(w.regime, Regime::kSafe) << i;
    EXPECT_EQ(p.regime, Regime::kSkip) << i;  // |c_t| = 0.5 >= c_high every step
    if (i >= 5) {
      ASSERT_TRUE(w.window_mean);
      EXPECT_NEAR(*w.window_mean, 0.0, 1e-15);
      EXPECT_EQ(p.window_mean, w.window_mean);  // reported with the per-step trigger too
    }
  }
}

TEST(TriggeredController, InvalidAndNoReferenceStepsDoNotEnter) {
  TriggeredController t = MakeTriggered(Trigger::kWindow, 2, {0.05, 0.3});
  t.Decide(StatsFor(Kind::kValid, 0.2));
  EXPECT_EQ(t.Decide(StatsFor(Kind::kInvalid, 0)).regime, Regime::kInvalid);
  EXPECT_EQ(t.Decide(StatsFor(Kind::kNoReference, 0)).regime, Regime::kSafe);
  EXPECT_EQ(t.Decide(StatsFor(Kind::kZeroReference, 0)).regime, Regime::kSafe);
  EXPECT_EQ(t.window().held(), 1);
  const Decision d = t.Decide(StatsFor(Kind::kValid, 0.4));
  EXPECT_EQ(t.window().held(), 2);
  ASSERT_TRUE(d.window_mean);
  EXPECT_NEAR(*d.window_mean, 0.3 / (1 + 0.5e-8), 1e-15);
  EXPECT_EQ(d.regime, Regime::kProject);
  // An invalid step reports the mean it leaves untouched, and no cosine.
  const Decision invalid = t.Decide(StatsFor(Kind::kInvalid, 0));
  EXPECT_EQ(invalid.regime, Regime::kInvalid);
  EXPECT_FALSE(invalid.cosine);
  EXPECT_EQ(invalid.window_mean, d.window_mean);
}

TEST(TriggeredController, ResetEmptiesTheWindow) {
  TriggeredController t = MakeTriggered(Trigger::kWindow, 3, {0.05, 0.3});
  for (int i = 0; i < 5; ++i) t.Decide(StatsFor(Kind::kValid, 0.9));
  EXPECT_TRUE(t.window().full());
  t.Reset();
  EXPECT_EQ(t.window().held(), 0);
  EXPECT_EQ(t.window().size(), 3);
  EXPECT_EQ(t.Decide(StatsFor(Kind::kValid, 0.9)).regime, Regime::kSafe);
  EXPECT_EQ(t.trigger().window, 3);
}

// Window 1: the mean is the step's cosine, so the windowed rule with the
// per-step thresholds is the per-step rule.
TEST(TriggeredController, WindowOfOneIsThePerStepRule) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  for (AlphaMode mode : {AlphaMode::kPaper, AlphaMode::kExact}) {
    const Thresholds th{0.07, 0.4};
    TriggeredController t = MakeTriggered(Trigger::kWindow, 1, th, th, mode);
    const controller::Controller c = MakeController(th.c_low, th.c_high, mode);
    for (int i = 0; i < 2000; ++i) {
      const double gn = 0.5 + std::fabs(unit(rng)), pn = 0.5 + std::fabs(unit(rng));
      const AlignmentStats s{unit(rng) * 0.6 * gn * pn, gn * gn, pn * pn, i % 50 != 0};
      const Decision w = t.Decide(s);
      const Decision p = c.Decide(s);
      ASSERT_EQ(w.regime, p.regime) << i;
      EXPECT_EQ(w.cosine, p.cosine);
      EXPECT_EQ(w.cosine_after, p.cosine_after);
      EXPECT_EQ(w.alpha, p.alpha);
      EXPECT_EQ(w.projection_coeff, p.projection_coeff);
      EXPECT_EQ(w.apply_update, p.apply_update);
      if (p.cosine) {
        EXPECT_EQ(w.window_mean, p.cosine);  // a step without a cosine leaves the window as it was
      }
    }
  }
}

// A long scripted run (drifting alignment, invalid and reference-less steps)
// against the reference, in both modes and both alpha modes.
TEST(TriggeredController, MatchesTheReferenceOverAScriptedRun) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(0.0, 0.08);
  std::uniform_int_distribution<int> kind(0, 39);
  std::vector<AlignmentStats> steps;
  for (int i = 0; i < 3000; ++i) {
    const double drift = 0.35 * std::sin(i / 90.0);  // sweeps every regime of the mean
    const int k = kind(rng);
    const Kind what = k == 0 ? Kind::kInvalid : k == 1 ? Kind::kNoReference : k == 2 ? Kind::kZeroReference : Kind::kValid;
    steps.push_back(StatsFor(what, std::clamp(drift + noise(rng), -0.99, 0.99)));
  }
  const Thresholds per_step{0.05, 0.3};
  const Thresholds window_t{0.04, 0.2};
  for (AlphaMode mode : {AlphaMode::kPaper, AlphaMode::kExact}) {
    for (bool windowed : {true, false}) {
      constexpr int kWindow = 9;
      TriggeredController t =
          MakeTriggered(windowed ? Trigger::kWindow : Trigger::kPerStep, kWindow, window_t, per_step, mode);
      const std::vector<Expected> expected = Reference(steps, kWindow, windowed ? window_t : per_step, windowed, mode);
      int seen[4] = {0, 0, 0, 0};
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const Decision d = t.Decide(steps[i]);
        ExpectMatches(expected[i], d, steps[i], i);
        ++seen[static_cast<int>(d.regime)];
        if (HasFatalFailure()) return;
      }
      for (int r = 0; r < 4; ++r) EXPECT_GT(seen[r], 20) << "regime " << r << " windowed " << windowed;
    }
  }
}

}  // namespace
}  // namespace gac
