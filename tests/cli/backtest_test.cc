// gacctl backtest's library (gac/cli/backtest.h) on small synthetic runs
// whose firing steps, outcomes and scores follow by construction. The
// program on recorded runs is checked against an independent computation by
// check_backtest.py.
#include "gac/cli/backtest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gac::cli {
namespace {

using Cosines = std::vector<std::optional<double>>;

// A run of steps 1..n with these cosines (nullopt: no c_t).
RecordedRun SyntheticRun(const Cosines& cosines, std::vector<Evaluation> evaluations = {},
                std::optional<double> start = std::nullopt) {
  RecordedRun run;
  run.name = "synthetic";
  for (std::size_t i = 0; i < cosines.size(); ++i) run.steps.push_back(static_cast<std::int64_t>(i) + 1);
  run.cosines = cosines;
  run.evaluations = std::move(evaluations);
  run.start_accuracy = start;
  return run;
}

AlertSettings Settings(int window, int for_steps, std::int64_t warmup, double c_high = 0.9,
                       double window_c_low = 0.3) {
  AlertSettings s;
  s.c_high = c_high;
  s.window_c_low = window_c_low;
  s.window = window;
  s.for_steps = for_steps;
  s.warmup = warmup;
  EXPECT_TRUE(ValidateAlertSettings(s).ok());
  return s;
}

std::vector<std::int64_t> ElevatedSteps(const std::vector<AlertStep>& steps) {
  std::vector<std::int64_t> out;
  for (const AlertStep& a : steps) {
    if (a.fires(Alert::kElevated)) out.push_back(a.step);
  }
  return out;
}

TEST(BacktestReplay, TheHoldSurvivesASignChangeOfTheMean) {
  // W 1: m_t = c_t. |m| > 0.3 at steps 3..7 although m flips sign each step;
  // held 3 further steps, the alert fires at steps 6 and 7 and not at 9,
  // where the condition holds again for one step only.
  const RecordedRun run = SyntheticRun({0.0, 0.1, 0.5, -0.5, 0.5, -0.5, 0.5, 0.0, -0.6, 0.0});
  const std::vector<AlertStep> steps = ReplayAlerts(run, Settings(1, 3, 0));
  EXPECT_EQ(ElevatedSteps(steps), (std::vector<std::int64_t>{6, 7}));
  ASSERT_TRUE(steps[3].window_mean.has_value());
  EXPECT_DOUBLE_EQ(*steps[3].window_mean, -0.5);
  EXPECT_TRUE(steps[8].holds(Alert::kElevated));
  const RunBacktest b = BacktestRun(run, Settings(1, 3, 0));
  EXPECT_EQ(b.alarms[static_cast<std::size_t>(Alert::kElevated)].step, 6);
  EXPECT_EQ(b.alarms[static_cast<std::size_t>(Alert::kElevated)].firing_steps, 2);
}

TEST(BacktestReplay, NoMeanUntilTheWindowIsFull) {
  // W 4, every c_t 0.9: m_t exists from the 4th cosine; with no hold the
  // alert fires from step 4, with a hold of 2 from step 6.
  const RecordedRun run = SyntheticRun(Cosines(8, 0.9));
  const std::vector<AlertStep> steps = ReplayAlerts(run, Settings(4, 0, 0));
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(steps[i].window_mean.has_value()) << i;
  ASSERT_TRUE(steps[3].window_mean.has_value());
  EXPECT_NEAR(*steps[3].window_mean, 0.9, 1e-15);
  EXPECT_EQ(ElevatedSteps(steps), (std::vector<std::int64_t>{4, 5, 6, 7, 8}));
  EXPECT_EQ(ElevatedSteps(ReplayAlerts(run, Settings(4, 2, 0))), (std::vector<std::int64_t>{6, 7, 8}));
}

TEST(BacktestReplay, StepsWithoutACosineKeepTheMeanAndTheHold) {
  // W 3. Step 2 has no c_t: the window is full at step 4 (the third c_t),
  // and step 6 (no c_t) keeps m_t and continues the hold.
  const RecordedRun run = SyntheticRun({0.6, std::nullopt, 0.6, 0.6, 0.6, std::nullopt, 0.6, 0.0});
  const std::vector<AlertStep> steps = ReplayAlerts(run, Settings(3, 2, 0));
  EXPECT_FALSE(steps[2].window_mean.has_value());
  ASSERT_TRUE(steps[3].window_mean.has_value());
  ASSERT_TRUE(steps[5].window_mean.has_value());
  EXPECT_NEAR(*steps[5].window_mean, 0.6, 1e-15);
  // Condition at 4, 5, 6, 7 (m at step 8 is 0.4 > 0.3 too): fires from 6.
  EXPECT_EQ(ElevatedSteps(steps), (std::vector<std::int64_t>{6, 7, 8}));
  EXPECT_NEAR(*steps[7].window_mean, 0.4, 1e-15);
  // A step without c_t is never a spike.
  for (const AlertStep& a : steps) EXPECT_FALSE(a.fires(Alert::kSpike));
}

TEST(BacktestReplay, SpikeAtOrAboveCHighInMagnitude) {
  const RecordedRun run = SyntheticRun({0.5, 0.9, -0.95, 0.89999, -0.2});
  const std::vector<AlertStep> steps = ReplayAlerts(run, Settings(20, 5, 0, 0.9));
  EXPECT_FALSE(steps[0].fires(Alert::kSpike));
  EXPECT_TRUE(steps[1].fires(Alert::kSpike));  // |c_t| == c_high fires
  EXPECT_TRUE(steps[2].fires(Alert::kSpike));
  EXPECT_FALSE(steps[3].fires(Alert::kSpike));
  EXPECT_FALSE(steps[4].fires(Alert::kSpike));
}

TEST(BacktestReplay, AlarmsCountFromTheFirstStepAfterTheWarmup) {
  // Elevated from step 2 on (W 1, held 1): already firing at step 6, the
  // first eligible step with warm-up 5. The spike at step 4 is in the
  // warm-up; the next one, step 8, is the spike's alarm.
  const RecordedRun run = SyntheticRun({0.1, 0.5, 0.5, 0.95, 0.5, 0.5, 0.5, 0.95, 0.5});
  const RunBacktest b = BacktestRun(run, Settings(1, 1, 5));
  ASSERT_TRUE(b.first_eligible.has_value());
  EXPECT_EQ(*b.first_eligible, 6);
  const Alarm& elevated = b.alarms[static_cast<std::size_t>(Alert::kElevated)];
  EXPECT_EQ(elevated.step, 6);
  EXPECT_TRUE(elevated.at_first_eligible);
  EXPECT_EQ(elevated.firing_steps, 4);
  const Alarm& spike = b.alarms[static_cast<std::size_t>(Alert::kSpike)];
  EXPECT_EQ(spike.step, 8);
  EXPECT_FALSE(spike.at_first_eligible);
  EXPECT_EQ(spike.firing_steps, 1);
}

TEST(BacktestOutcome, CollapseAtTheLastEvaluation) {
  // Peak 0.6: 0.41 < 0.42 at the last evaluation only.
  const RunOutcome o = ClassifyOutcome(0.5, {{20, 0.55}, {40, 0.6}, {60, 0.5}, {80, 0.41}});
  EXPECT_EQ(o.outcome, Outcome::kCollapsed);
  EXPECT_EQ(o.collapse_step, 80);
}

TEST(BacktestOutcome, ADipThatRecoversIsNoCollapse) {
  // 0.3 < 0.7 x 0.6 at step 40, but step 60 is back above the bar.
  const RunOutcome o = ClassifyOutcome(0.5, {{20, 0.6}, {40, 0.3}, {60, 0.45}});
  EXPECT_EQ(o.outcome, Outcome::kLearned);
  EXPECT_FALSE(o.collapse_step.has_value());
  // The collapse is the first evaluation below the bar for good.
  const RunOutcome c = ClassifyOutcome(0.5, {{20, 0.6}, {40, 0.3}, {60, 0.45}, {80, 0.4}, {100, 0.2}});
  EXPECT_EQ(c.outcome, Outcome::kCollapsed);
  EXPECT_EQ(c.collapse_step, 80);
}

TEST(BacktestOutcome, NeverLearned) {
  // No evaluation reaches e_0 + 0.05 = 0.55 and none falls below 0.35.
  EXPECT_EQ(ClassifyOutcome(0.5, {{20, 0.54}, {40, 0.5}, {60, 0.52}}).outcome, Outcome::kNeverLearned);
  EXPECT_EQ(ClassifyOutcome(0.5, {{20, 0.55}, {40, 0.5}}).outcome, Outcome::kLearned);
  // Without e_0, e_1 stands for it.
  EXPECT_EQ(ClassifyOutcome(std::nullopt, {{20, 0.3}, {40, 0.34}}).outcome, Outcome::kNeverLearned);
  EXPECT_EQ(ClassifyOutcome(std::nullopt, {{20, 0.3}, {40, 0.36}}).outcome, Outcome::kLearned);
  EXPECT_EQ(ClassifyOutcome(0.5, {}).outcome, Outcome::kNeverLearned);
  // A collapse from e_0's peak: every evaluation below 0.7 x 0.5.
  const RunOutcome o = ClassifyOutcome(0.5, {{20, 0.3}, {40, 0.2}});
  EXPECT_EQ(o.outcome, Outcome::kCollapsed);
  EXPECT_EQ(o.collapse_step, 20);
}

RunBacktest Scored(const std::string& name, RunOutcome outcome, std::optional<std::int64_t> alarm, bool at_first) {
  RunBacktest b;
  b.name = name;
  b.outcome = outcome;
  b.first_eligible = 51;
  Alarm& a = b.alarms[static_cast<std::size_t>(Alert::kSpike)];
  a.step = alarm;
  a.at_first_eligible = at_first;
  return b;
}

TEST(BacktestScore, CountsLeadsAndFirstEligibleAlarmsApart) {
  const RunOutcome collapsed100{Outcome::kCollapsed, 100};
  const RunOutcome collapsed200{Outcome::kCollapsed, 200};
  const RunOutcome learned{Outcome::kLearned, std::nullopt};
  const RunOutcome never{Outcome::kNeverLearned, std::nullopt};
  const std::vector<RunBacktest> runs = {
      Scored("a", collapsed100, 60, false),    // warned, lead 40
      Scored("b", collapsed200, 51, true),     // warned at the first eligible step, lead 149
      Scored("c", collapsed100, 100, false),   // warned at the collapse, lead 0
      Scored("d", collapsed100, 120, false),   // late: missed
      Scored("e", collapsed200, std::nullopt, false),  // missed
      Scored("f", learned, 51, true),          // false, at the first eligible step
      Scored("g", never, 300, false),          // false, never learned
      Scored("h", learned, std::nullopt, false),  // quiet
  };
  EXPECT_EQ(Judge(runs[3].outcome, runs[3].alarms[0]), Verdict::kLate);
  const AlertScore s = ScoreAlert(runs, Alert::kSpike);
  EXPECT_EQ(s.runs, 8);
  EXPECT_EQ(s.collapsed, 5);
  EXPECT_EQ(s.never_learned, 1);
  EXPECT_EQ(s.alarmed, 6);
  EXPECT_EQ(s.at_first_eligible, 2);
  EXPECT_EQ(s.at_first_eligible_collapsed, 1);
  EXPECT_EQ(s.tp, 3);
  EXPECT_EQ(s.fp, 2);
  EXPECT_EQ(s.fp_never_learned, 1);
  EXPECT_EQ(s.fn, 2);
  EXPECT_EQ(s.tn, 1);
  EXPECT_EQ(s.leads, (std::vector<std::int64_t>{0, 40, 149}));
  EXPECT_DOUBLE_EQ(*s.precision(), 3.0 / 5.0);
  EXPECT_DOUBLE_EQ(*s.recall(), 3.0 / 5.0);
  EXPECT_EQ(s.tp_later, 2);
  EXPECT_EQ(s.fp_later, 1);
  EXPECT_DOUBLE_EQ(*s.precision_later(), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(*s.recall_later(), 2.0 / 5.0);
  // The elevated alert never fired in these runs.
  const AlertScore e = ScoreAlert(runs, Alert::kElevated);
  EXPECT_EQ(e.tp + e.fp, 0);
  EXPECT_FALSE(e.precision().has_value());
  EXPECT_DOUBLE_EQ(*e.recall(), 0.0);
}

TEST(BacktestScore, QuantilesInterpolateLinearly) {
  EXPECT_FALSE(SortedQuantile({}, 0.5).has_value());
  EXPECT_DOUBLE_EQ(*SortedQuantile({7}, 0.25), 7.0);
  // numpy.quantile([0, 40, 149], [0.25, 0.5, 0.75]) = 20, 40, 94.5
  EXPECT_DOUBLE_EQ(*SortedQuantile({0, 40, 149}, 0.25), 20.0);
  EXPECT_DOUBLE_EQ(*SortedQuantile({0, 40, 149}, 0.5), 40.0);
  EXPECT_DOUBLE_EQ(*SortedQuantile({0, 40, 149}, 0.75), 94.5);
  EXPECT_DOUBLE_EQ(*SortedQuantile({1, 2, 3, 4}, 0.5), 2.5);
}

TEST(BacktestCalibration, TheExperimentsRuleOnStepsAfterTheWarmup) {
  // Warm-up 2: the 1.0 at step 1 is left out. |c_t| after it: 0.1..0.9 and
  // 0.2 (run b): q0.9 of the ten values, max 0.9 -> c_high min(2.7, 0.95).
  RecordedRun a = SyntheticRun({1.0, 0.5, 0.1, -0.2, 0.3, -0.4, 0.5, 0.6, -0.7, 0.8, 0.9});
  RecordedRun b = SyntheticRun({0.0, 0.0, 0.2});
  base::StatusOr<AlertCalibration> cal = CalibrateAlerts({a, b}, 1, 2);
  ASSERT_TRUE(cal.ok()) << cal.status().ToString();
  std::vector<double> c = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.2};
  std::sort(c.begin(), c.end());
  EXPECT_EQ(cal->cosines, 10);
  EXPECT_EQ(cal->runs, 2);
  EXPECT_DOUBLE_EQ(cal->c_q90, *SortedQuantile(c, 0.9));
  EXPECT_NEAR(cal->c_q90, 0.81, 1e-12);
  EXPECT_DOUBLE_EQ(cal->c_max, 0.9);
  EXPECT_DOUBLE_EQ(cal->c_high, 0.95);
  // W 1: m_t = c_t, the same statistics.
  EXPECT_DOUBLE_EQ(cal->window_c_low, cal->c_low);
  EXPECT_EQ(cal->window_means, 10);
  // W 3 on run a alone: m_t from step 3 on, all after the warm-up (9
  // values); the largest is step 3's (1.0 + 0.5 + 0.1) / 3, whose window
  // reaches into the warm-up, then step 11's (-0.7 + 0.8 + 0.9) / 3.
  cal = CalibrateAlerts({a}, 3, 2);
  ASSERT_TRUE(cal.ok());
  EXPECT_EQ(cal->window_means, 9);
  EXPECT_NEAR(cal->window_max, 1.6 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(cal->window_c_high, std::min(3.0 * cal->window_max, 0.95));
  // Nothing after the warm-up.
  EXPECT_TRUE(CalibrateAlerts({b}, 1, 5).status().IsFailedPrecondition());
}

TEST(BacktestCsv, ReadsTheColumnsItNeedsInAnyOrder) {
  const std::string text =
      "heldout_acc,regime,step,cosine,other\n"
      ",safe,1,,x\n"
      "0.5,project,2,-0.25,y\n"
      ",invalid,3,0.9,z\n"
      "0.25,safe,4,nan,w\n";
  base::StatusOr<RecordedRun> run = ParseRunCsv(text, "dir/grpo_s4_seed1.csv");
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->name, "grpo_s4_seed1");
  EXPECT_EQ(run->steps, (std::vector<std::int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(run->cosines, (Cosines{std::nullopt, -0.25, std::nullopt, std::nullopt}));
  ASSERT_EQ(run->evaluations.size(), 2u);
  EXPECT_EQ(run->evaluations[1].step, 4);
  EXPECT_DOUBLE_EQ(run->evaluations[1].accuracy, 0.25);
}

TEST(BacktestCsv, ErrorsNameTheFileAndLine) {
  struct Case {
    std::string text, has;
  };
  const std::vector<Case> cases = {
      {"cosine,heldout_acc\n0.1,\n", "f.csv:1: no column 'step'"},
      {"step,cosine\n1,0.1\n", "f.csv:1: no column 'heldout_acc'"},
      {"step,cosine,heldout_acc\n1,0.1,\n2,abc,\n", "f.csv:3: column cosine: 'abc' is not a number"},
      {"step,cosine,heldout_acc\n1,0.1,\n2,0.2\n", "f.csv:3: 2 fields, the header has 3"},
      {"step,cosine,heldout_acc\n2,0.1,\n2,0.2,\n", "f.csv:3: step 2 does not follow step 2"},
      {"step,cosine,heldout_acc\n1.5,0.1,\n", "f.csv:2: column step: '1.5' is not a step number"},
      {"step,cosine,heldout_acc\n1,0.1,0.5x\n", "f.csv:2: column heldout_acc: '0.5x' is not a number"},
      {"step,cosine,heldout_acc\n", "f.csv: no steps"},
      {"", "f.csv: empty"},
  };
  for (const Case& c : cases) {
    base::StatusOr<RecordedRun> run = ParseRunCsv(c.text, "f.csv");
    ASSERT_FALSE(run.ok()) << c.text;
    EXPECT_TRUE(run.status().IsInvalidArgument());
    EXPECT_NE(run.status().message().find(c.has), std::string::npos) << run.status().message();
  }
}

// The guard's inputs are read when present: grad_norm (an invalid step has
// none), loss, injected (0/1 only).
TEST(BacktestCsv, ReadsTheSpikeGuardsColumnsWhenPresent) {
  const std::string text =
      "step,cosine,heldout_acc,grad_norm,loss,injected,regime\n"
      "1,,,2.5,0.5,0,safe\n"
      "2,0.1,,inf,,1,safe\n"
      "3,0.1,,7,1.5,0,invalid\n";
  base::StatusOr<RecordedRun> run = ParseRunCsv(text, "r.csv");
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_TRUE(run->has_grad_norm && run->has_loss && run->has_injected);
  EXPECT_EQ(run->grad_norms, (Cosines{2.5, std::nullopt, std::nullopt}));
  EXPECT_EQ(run->losses, (Cosines{0.5, std::nullopt, 1.5}));
  EXPECT_EQ(run->injected, (std::vector<bool>{false, true, false}));
  base::StatusOr<RecordedRun> bad = ParseRunCsv("step,cosine,heldout_acc,injected\n1,,,yes\n", "r.csv");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("r.csv:2: column injected: 'yes' is not 0 or 1"), std::string::npos)
      << bad.status().message();
  base::StatusOr<RecordedRun> plain = ParseRunCsv("step,cosine,heldout_acc\n1,,\n", "r.csv");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->has_grad_norm);
}

// The replay judges the steps in order as the agent does: a constant norm
// with planted spikes; every planted spike after the warm-up is caught, the
// one inside it is not, and no other step is called one.
TEST(BacktestGuard, CatchesPlantedSpikesAfterTheWarmupAndNothingElse) {
  RecordedRun run;
  for (int i = 1; i <= 60; ++i) {
    run.steps.push_back(i);
    run.cosines.push_back(std::nullopt);
    const bool planted = i == 3 || i == 30 || i == 31 || i == 50;
    run.grad_norms.push_back(planted ? 1e3 : 1.0 + 0.01 * (i % 5));
    run.losses.push_back(std::nullopt);
    run.injected.push_back(planted);
  }
  run.has_grad_norm = run.has_injected = true;
  controller::SpikeSettings s;
  s.zscore = true;
  s.window = 16;
  s.sigma = 6;
  const GuardReplay g = ReplayGuard(run, s);
  EXPECT_EQ(g.judged, 60);
  EXPECT_EQ(g.spikes, (std::vector<std::int64_t>{30, 31, 50}));  // step 3: 2 accepted steps held, warming up
  EXPECT_EQ(g.injected, 4);
  EXPECT_EQ(g.caught, 3);
  // An absolute bound catches step 3 too, with no history.
  s.max_grad_norm = 100;
  EXPECT_EQ(ReplayGuard(run, s).spikes, (std::vector<std::int64_t>{3, 30, 31, 50}));
}

TEST(BacktestLog, StartAccuracyAndFinished) {
  RunLog log = ParseRunLog(
      "supervised warm-up: 600 steps, cross-entropy 0.4637, held-out accuracy 0.4400\nstep ...\nsummary: run=x\n");
  EXPECT_TRUE(log.finished);
  ASSERT_TRUE(log.start_accuracy.has_value());
  EXPECT_DOUBLE_EQ(*log.start_accuracy, 0.44);
  log = ParseRunLog("start: held-out accuracy 0.125\n");
  EXPECT_FALSE(log.finished);
  EXPECT_DOUBLE_EQ(*log.start_accuracy, 0.125);
  EXPECT_FALSE(ParseRunLog("nothing\n").start_accuracy.has_value());
}

TEST(BacktestSettings, Validation) {
  AlertSettings s;
  EXPECT_TRUE(ValidateAlertSettings(s).ok());
  s.c_high = 1.5;
  EXPECT_TRUE(ValidateAlertSettings(s).IsInvalidArgument());
  s = AlertSettings();
  s.window = 0;
  EXPECT_TRUE(ValidateAlertSettings(s).IsInvalidArgument());
  s = AlertSettings();
  s.for_steps = -1;
  EXPECT_TRUE(ValidateAlertSettings(s).IsInvalidArgument());
}


// ---- the policy-health alerts ----

// A run CSV of steps 1..n (n the longest column) with these policy columns
// (nullopt or a step past a column's end: an empty cell) and the held-out
// evaluations given.
std::string PolicyCsv(const std::vector<std::pair<std::string, Cosines>>& columns,
                      const std::vector<Evaluation>& evaluations = {}) {
  std::size_t n = 0;
  std::string text = "step,cosine,heldout_acc";
  for (const auto& [name, values] : columns) {
    text += "," + name;
    n = std::max(n, values.size());
  }
  text += "\n";
  for (std::size_t i = 0; i < n; ++i) {
    const auto step = static_cast<std::int64_t>(i) + 1;
    text += std::to_string(step) + ",,";
    for (const Evaluation& e : evaluations) {
      if (e.step == step) text += std::to_string(e.accuracy);
    }
    for (const auto& [name, values] : columns) {
      text += ",";
      if (i < values.size() && values[i]) {
        char cell[32];
        std::snprintf(cell, sizeof cell, "%.17g", *values[i]);
        text += cell;
      }
    }
    text += "\n";
  }
  return text;
}

RecordedRun ParsedRun(const std::string& text) {
  base::StatusOr<RecordedRun> run = ParseRunCsv(text, "policy.csv");
  EXPECT_TRUE(run.ok()) << run.status().ToString();
  return run.ok() ? *run : RecordedRun();
}

std::vector<std::int64_t> FiringSteps(const std::vector<AlertStep>& steps, Alert alert) {
  std::vector<std::int64_t> out;
  for (const AlertStep& a : steps) {
    if (a.fires(alert)) out.push_back(a.step);
  }
  return out;
}

// The first 20 ess_token values: one 0.1 (an early dip, before the median
// exists: no alarm), nine 0.8 and ten 0.9 (an empty cell between them is
// no value): the early median is (0.8 + 0.9) / 2 = 0.85, the bar 0.425.
Cosines EarlyEss() {
  Cosines v = {0.9, 0.9, 0.1};
  for (int i = 0; i < 9; ++i) v.push_back(0.8);
  v.push_back(std::nullopt);  // step 13
  for (int i = 0; i < 8; ++i) v.push_back(0.9);
  return v;  // 21 steps, 20 values: the median exists from step 21
}

TEST(BacktestPolicy, EssLowAgainstTheEarlyMedianHeldForSteps) {
  Cosines ess = EarlyEss();
  // Steps 22..: 0.5 (no), 0.42 x3 (below 0.425), 0.43 (no), then 0.3, an
  // empty cell (keeps 0.3), 0.3, 0.3, 0.9.
  for (double v : {0.5, 0.42, 0.42, 0.42, 0.43, 0.3}) ess.push_back(v);
  ess.push_back(std::nullopt);
  for (double v : {0.3, 0.3, 0.9}) ess.push_back(v);
  const RecordedRun run = ParsedRun(PolicyCsv({{"ess_token", ess}}));
  ASSERT_EQ(run.ess_token.size(), 31u);
  const std::vector<AlertStep> steps = ReplayAlerts(run, Settings(20, 2, 0));
  EXPECT_FALSE(steps[19].ess_token_median.has_value());  // step 20: 19 values
  ASSERT_TRUE(steps[20].ess_token_median.has_value());
  EXPECT_DOUBLE_EQ(*steps[20].ess_token_median, 0.85);
  EXPECT_DOUBLE_EQ(*steps[30].ess_token_median, 0.85);  // fixed once seen
  std::vector<std::int64_t> holds;
  for (const AlertStep& a : steps) {
    if (a.holds(Alert::kEssLow)) holds.push_back(a.step);
  }
  EXPECT_EQ(holds, (std::vector<std::int64_t>{23, 24, 25, 27, 28, 29, 30}));
  // Held 2 further steps: step 25 of the first stretch, 29 and 30 of the second.
  EXPECT_EQ(FiringSteps(steps, Alert::kEssLow), (std::vector<std::int64_t>{25, 29, 30}));
  EXPECT_EQ(FiringSteps(ReplayAlerts(run, Settings(20, 0, 0)), Alert::kEssLow), holds);
  EXPECT_EQ(FiringSteps(ReplayAlerts(run, Settings(20, 3, 0)), Alert::kEssLow), (std::vector<std::int64_t>{30}));
  // No other alert fires on this run; the alignment alerts have no cosine.
  for (Alert a : {Alert::kSpike, Alert::kElevated, Alert::kClipped, Alert::kKlJump}) {
    EXPECT_TRUE(FiringSteps(steps, a).empty()) << AlertName(a);
  }
  const RunBacktest b = BacktestRun(run, Settings(20, 2, 0));
  const Alarm& alarm = b.alarms[static_cast<std::size_t>(Alert::kEssLow)];
  EXPECT_TRUE(alarm.evaluated);
  EXPECT_EQ(alarm.step, 25);
  EXPECT_EQ(alarm.firing_steps, 3);
  EXPECT_FALSE(b.alarms[static_cast<std::size_t>(Alert::kClipped)].evaluated);
  EXPECT_FALSE(b.alarms[static_cast<std::size_t>(Alert::kKlJump)].evaluated);
}

TEST(BacktestPolicy, EssLowNeedsTwentyValues) {
  // 19 values, the last far below the others: no median, no alarm.
  Cosines ess(18, 0.9);
  ess.push_back(0.01);
  const RecordedRun run = ParsedRun(PolicyCsv({{"ess_token", ess}}));
  const RunBacktest b = BacktestRun(run, Settings(20, 0, 0));
  EXPECT_TRUE(b.alarms[static_cast<std::size_t>(Alert::kEssLow)].evaluated);
  EXPECT_FALSE(b.alarms[static_cast<std::size_t>(Alert::kEssLow)].step.has_value());
}

TEST(BacktestPolicy, ClippedSumsTheSidesAMissingSideCountsAsZero) {
  // Both sides: 0.1 + 0.05, 0.15 + 0.06 (> 0.2), 0.2 + 0, then an empty
  // low cell (keeps 0.2) with high 0.01, then 0.1 + 0.1 (= 0.2: no).
  const Cosines low = {0.1, 0.15, 0.2, std::nullopt, 0.1};
  const Cosines high = {0.05, 0.06, 0.0, 0.01, 0.1};
  RecordedRun run = ParsedRun(PolicyCsv({{"clip_fraction_low", low}, {"clip_fraction_high", high}}));
  std::vector<std::int64_t> holds;
  for (const AlertStep& a : ReplayAlerts(run, Settings(20, 0, 0))) {
    if (a.holds(Alert::kClipped)) holds.push_back(a.step);
  }
  EXPECT_EQ(holds, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(FiringSteps(ReplayAlerts(run, Settings(20, 1, 0)), Alert::kClipped), (std::vector<std::int64_t>{}));
  // The high side alone (a CSV without the low column): 0.25 > 0.2, held one step.
  run = ParsedRun(PolicyCsv({{"clip_fraction_high", {0.1, 0.25, 0.3, 0.15}}}));
  EXPECT_EQ(FiringSteps(ReplayAlerts(run, Settings(20, 1, 0)), Alert::kClipped), (std::vector<std::int64_t>{3}));
  EXPECT_TRUE(Evaluated(run, Alert::kClipped));
  // Both columns but no value (a loss that clips nothing): not evaluated, never held.
  run = ParsedRun(PolicyCsv({{"clip_fraction_low", Cosines(4)}, {"clip_fraction_high", Cosines(4)},
                             {"ess_token", Cosines(4, 1.0)}}));
  EXPECT_FALSE(Evaluated(run, Alert::kClipped));
  EXPECT_TRUE(FiringSteps(ReplayAlerts(run, Settings(20, 0, 0)), Alert::kClipped).empty());
}

TEST(BacktestPolicy, KlJumpNeedsFourTimesTheEarlyMedianAndTheFloor) {
  // Early median 0.0001 (20 values): 0.0009 is 9x but below the floor
  // 0.001; 0.002 is both.
  Cosines kl(20, 0.0001);
  for (double v : {0.0009, 0.002, 0.002, 0.0003}) kl.push_back(v);
  RecordedRun run = ParsedRun(PolicyCsv({{"kl_k3", kl}}));
  std::vector<AlertStep> steps = ReplayAlerts(run, Settings(20, 0, 0));
  ASSERT_TRUE(steps[19].kl_k3_median.has_value());
  EXPECT_DOUBLE_EQ(*steps[19].kl_k3_median, 0.0001);
  EXPECT_EQ(FiringSteps(steps, Alert::kKlJump), (std::vector<std::int64_t>{22, 23}));
  EXPECT_EQ(FiringSteps(ReplayAlerts(run, Settings(20, 1, 0)), Alert::kKlJump), (std::vector<std::int64_t>{23}));
  // Early median 0.01 (ten 0.008, ten 0.012): 0.03 is 3x (no), 0.05 is 5x.
  kl.clear();
  for (int i = 0; i < 10; ++i) kl.push_back(0.008);
  for (int i = 0; i < 10; ++i) kl.push_back(0.012);
  for (double v : {0.03, 0.05}) kl.push_back(v);
  run = ParsedRun(PolicyCsv({{"kl_k3", kl}}));
  steps = ReplayAlerts(run, Settings(20, 0, 0));
  EXPECT_DOUBLE_EQ(*steps[21].kl_k3_median, 0.01);
  EXPECT_EQ(FiringSteps(steps, Alert::kKlJump), (std::vector<std::int64_t>{22}));
}

// A CSV without the policy columns (gac_grpo's before it wrote them): the
// policy alerts are not evaluated, in no count but not_evaluated.
TEST(BacktestPolicy, WithoutTheColumnsThePolicyAlertsAreNotEvaluated) {
  const RecordedRun old = ParsedRun("step,cosine,heldout_acc\n1,0.1,0.5\n2,0.2,0.1\n3,0.1,0.1\n");
  EXPECT_TRUE(old.ess_token.size() == 3 && !old.ess_token[0].has_value());
  const RunBacktest b = BacktestRun(old, Settings(1, 0, 0));
  ASSERT_EQ(b.outcome.outcome, Outcome::kCollapsed);
  for (Alert a : {Alert::kEssLow, Alert::kClipped, Alert::kKlJump}) {
    const Alarm& alarm = b.alarms[static_cast<std::size_t>(a)];
    EXPECT_FALSE(alarm.evaluated) << AlertName(a);
    EXPECT_FALSE(alarm.step.has_value()) << AlertName(a);
    EXPECT_EQ(Judge(b.outcome, alarm), Verdict::kNotEvaluated) << AlertName(a);
  }
  EXPECT_STREQ(VerdictName(Verdict::kNotEvaluated), "not evaluated");
  EXPECT_EQ(Judge(b.outcome, b.alarms[static_cast<std::size_t>(Alert::kSpike)]), Verdict::kMissed);
  // Scored beside a collapsed run whose clipped alert warned at step 2: the
  // old run is in neither the runs nor the misses.
  Cosines low(6, 0.1);
  low[1] = 0.5;
  const RecordedRun clipped = ParsedRun(PolicyCsv({{"clip_fraction_low", low}}, {{3, 0.6}, {6, 0.1}}));
  const std::vector<RunBacktest> runs = {b, BacktestRun(clipped, Settings(1, 0, 0))};
  const AlertScore s = ScoreAlert(runs, Alert::kClipped);
  EXPECT_EQ(s.not_evaluated, 1);
  EXPECT_EQ(s.runs, 1);
  EXPECT_EQ(s.collapsed, 1);
  EXPECT_EQ(s.tp, 1);
  EXPECT_EQ(s.fn, 0);
  EXPECT_EQ(s.leads, (std::vector<std::int64_t>{4}));  // collapse at step 6, alarm at 2
  EXPECT_DOUBLE_EQ(*s.recall(), 1.0);
  const AlertScore e = ScoreAlert(runs, Alert::kEssLow);
  EXPECT_EQ(e.not_evaluated, 2);
  EXPECT_EQ(e.runs, 0);
  EXPECT_FALSE(e.recall().has_value());
  const AlertScore spike = ScoreAlert(runs, Alert::kSpike);
  EXPECT_EQ(spike.not_evaluated, 0);
  EXPECT_EQ(spike.runs, 2);
}

TEST(BacktestPolicy, PolicyCellsMustBeNumbersAndNonFiniteIsAbsent) {
  const RecordedRun run = ParsedRun("step,cosine,heldout_acc,kl_k3\n1,,,nan\n2,,,inf\n3,,,0.5\n");
  EXPECT_EQ(run.kl_k3, (Cosines{std::nullopt, std::nullopt, 0.5}));
  base::StatusOr<RecordedRun> bad = ParseRunCsv("step,cosine,heldout_acc,ess_token\n1,,,high\n", "p.csv");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("p.csv:2: column ess_token: 'high' is not a number"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace gac::cli
