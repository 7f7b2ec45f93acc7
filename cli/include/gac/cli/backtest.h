// Offline backtest of gac's alerts on recorded runs: when would the
// alignment alerts GacAlignmentSpike and GacAlignmentElevated, and the
// policy-health alerts GacPolicyEssLow, GacPolicyClipped and
// GacSamplerKlJump (dashboards/gac.rules.yml) have fired on a run, did the
// run collapse, and how far ahead was the alarm.
//
// A run is one CSV of the example trainer (examples/grpo, one row per step;
// the columns step, cosine and heldout_acc are read (the spike guard's
// replay needs no cosine), and regime when present; the policy-health
// columns ess_token, clip_fraction_low, clip_fraction_high and kl_k3 when
// present) with its log beside it
// (RUN.log: the held-out accuracy after the warm-up, and the "summary:" line
// of a finished run).
//
// The alerts, evaluated once per step (a step is one evaluation of the rule):
//   spike     fires at a step with |c_t| >= c_high (a step decided in the skip
//             regime with these thresholds is exactly such a step).
//   elevated  |m_t| > window_c_low, m_t the signed mean of the last W cosines
//             (controller::AlignmentWindow: steps without a cosine leave m_t
//             as it was, as gacd's gauge does; absent until W are held),
//             held for `for_steps` further steps: pending at the first step
//             of a stretch where the condition holds, firing from the
//             for_steps-th step after it (0: at once). Prometheus' `for: D`
//             at r steps per second is for_steps = ceil(D r).
//   ess low   ess_token < kEssLowRatio x its early median, the median of the
//             run's first controller::kEarlyValues present ess_token values
//             (absent until they are seen), held for `for_steps` further steps.
//   clipped   clip_fraction_low + clip_fraction_high > kClippedFraction (a
//             side without a value counts as 0; absent when both are), held
//             for `for_steps` further steps.
//   KL jump   kl_k3 > kKlJumpRatio x its early median (the same rule) and
//             kl_k3 > kKlJumpFloor, held for `for_steps` further steps.
// The policy columns are read as gacd's gauges show them: a step without a
// value (an empty or non-finite cell) leaves the last one. A policy alert is
// not evaluated on a run without a value of its input (no such column, or
// only empty cells: an unclipped loss has no clip fractions); such runs are
// in no count of that alert but its not_evaluated.
// Alarms count from the first step > warmup (the first eligible step); an
// alert that is firing there alarms there. An alarm at the first eligible
// step of a run that is stale from its start says only that it is stale.
//
// Outcome of a run (the experiment's pre-registered rule, examples/grpo/
// analyze.py): held-out evaluations e_0 (from the log; e_1 without one) and
// e_1..e_n (the non-empty heldout_acc cells), running peak
// P_i = max(e_0..e_i). The run collapsed at the first i >= 1 with
// e_i < 0.7 P_i and e_j < 0.7 P_i for every later j (the last evaluation can
// be it). Otherwise it never learned when max(e_1..e_n) < e_0 + 0.05, else
// it learned.
//
// Scoring (per alert, over the runs it was evaluated on): an alarm at or before the collapse step
// is a true positive with lead = collapse step - alarm step; a collapsed run
// with no alarm or a later one is missed (false negative); any alarm in a
// run that did not collapse is false.
//
// Thresholds calibrated on synchronous runs (the experiment's rule), pooled
// over those runs' steps > warmup: c_low = q0.9 |c_t|, c_high =
// min(3 max |c_t|, 0.95), and the same of |m_t| for window_c_low and
// window_c_high; quantiles interpolate linearly between order statistics.
// The policy-health alerts have the rules' constants (below), no calibration.
//
// Everything here is a value or a pure function; nothing is synchronised.
#ifndef GAC_CLI_BACKTEST_H_
#define GAC_CLI_BACKTEST_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gac/base/status.h"
#include "gac/controller/policy_health.h"
#include "gac/controller/spike.h"

namespace gac::cli {

inline constexpr double kCollapseFraction = 0.7;  // below this fraction of the running peak, for good
inline constexpr double kLearnMargin = 0.05;      // never learned: no evaluation reaches e_0 + this
inline constexpr double kHighRatio = 3.0;         // c_high = min(kHighRatio x calibration max, kHighCap)
inline constexpr double kHighCap = 0.95;

// The policy-health alerts' constants, as dashboards/gac.rules.yml states
// them (gacd and Prometheus use the same).
// GacPolicyEssLow and GacSamplerKlJump: the early median is that of the
// run's first controller::kEarlyValues present values
// (controller::EarlyMedian, gac/controller/policy_health.h, as gacd's).
inline constexpr double kEssLowRatio = 0.5;       // GacPolicyEssLow: ess_token < 0.5 x early median
inline constexpr double kClippedFraction = 0.2;   // GacPolicyClipped: clip_fraction_low + clip_fraction_high > 0.2
inline constexpr double kKlJumpRatio = 4.0;       // GacSamplerKlJump: kl_k3 > 4 x early median
inline constexpr double kKlJumpFloor = 0.001;     // GacSamplerKlJump: and kl_k3 > 0.001

struct Evaluation {
  std::int64_t step = 0;
  double accuracy = 0.0;
};

// One run, as the backtest needs it.
struct RecordedRun {
  std::string name;  // the file name without ".csv"
  std::string path;
  std::vector<std::int64_t> steps;             // strictly increasing
  std::vector<std::optional<double>> cosines;  // c_t per step; absent: empty cell, not finite, or regime invalid
  bool has_cosine = false;                     // the CSV has the column (the alerts need it, the spike guard not)
  // The spike guard's inputs, per step, when the CSV has the columns
  // (grad_norm: absent when empty or not finite, or the regime is invalid;
  // loss: absent when empty), and whether a fault was injected at the step
  // (column `injected`, 0/1; all false without it).
  std::vector<std::optional<double>> grad_norms;
  std::vector<std::optional<double>> losses;
  std::vector<bool> injected;
  bool has_grad_norm = false, has_loss = false, has_injected = false;
  // The policy-health signals per step: absent for an empty or non-finite
  // cell, and at every step without the column (ParseRunCsv fills one per
  // step; a shorter vector is absent at the steps it lacks).
  std::vector<std::optional<double>> ess_token, clip_fraction_low, clip_fraction_high, kl_k3;
  std::vector<Evaluation> evaluations;         // e_1..e_n
  std::optional<double> start_accuracy;        // e_0, from the log
  bool has_log = false;
  bool finished = true;  // false when the log has no "summary:" line
};

// Parses the text of a trainer's CSV. Errors (InvalidArgument) name `path`
// and the line: a missing column (step, cosine, heldout_acc), a row with
// another number of fields than the header, a value that is not a number
// (an empty cell is absent; "nan" and "inf" are absent cosines), steps that
// do not increase, no rows.
base::StatusOr<RecordedRun> ParseRunCsv(const std::string& text, const std::string& path);

// The facts of a trainer's log: whether it finished ("summary:"), and e_0
// (the held-out accuracy of the "supervised warm-up: ..." or "start:" line).
struct RunLog {
  bool finished = false;
  std::optional<double> start_accuracy;
};
RunLog ParseRunLog(const std::string& text);

// Reads `csv_path` and, when it exists, the log beside it (the path with
// ".csv" replaced by ".log"). NotFound / InvalidArgument naming the file.
base::StatusOr<RecordedRun> ReadRun(const std::string& csv_path);

enum class Outcome { kCollapsed, kNeverLearned, kLearned };
// "collapsed", "never learned", "learned".
const char* OutcomeName(Outcome outcome);

struct RunOutcome {
  Outcome outcome = Outcome::kLearned;
  std::optional<std::int64_t> collapse_step;  // set iff collapsed
};

// The outcome of a run (see the file comment). No evaluation: never learned.
RunOutcome ClassifyOutcome(std::optional<double> start_accuracy, const std::vector<Evaluation>& evaluations);

enum class Alert : std::size_t { kSpike = 0, kElevated = 1, kEssLow = 2, kClipped = 3, kKlJump = 4 };
inline constexpr std::size_t kAlertCount = 5;
inline constexpr std::array<Alert, kAlertCount> kAllAlerts = {Alert::kSpike, Alert::kElevated, Alert::kEssLow,
                                                              Alert::kClipped, Alert::kKlJump};
// "GacAlignmentSpike", "GacAlignmentElevated", "GacPolicyEssLow",
// "GacPolicyClipped", "GacSamplerKlJump".
const char* AlertName(Alert alert);
// Whether `run` has a value of the alert's input (the alignment alerts:
// always; a policy alert: a value in its column, or either clip column).
bool Evaluated(const RecordedRun& run, Alert alert);

struct AlertSettings {
  double c_high = 0.95;       // spike: |c_t| >= c_high
  double window_c_low = 0.3;  // elevated: |m_t| > window_c_low
  int window = 20;            // W
  int for_steps = 5;          // every alert's hold but the spike's, in steps
  std::int64_t warmup = 50;   // alarms count from the first step > warmup
};

// OK iff 0 < c_high <= 1, 0 < window_c_low <= 1, the window is valid
// (controller::ValidateWindow), for_steps >= 0 and warmup >= 0;
// InvalidArgument naming the setting otherwise.
base::Status ValidateAlertSettings(const AlertSettings& s);

// The alerts' state at one step.
struct AlertStep {
  std::int64_t step = 0;
  std::optional<double> window_mean;       // m_t (absent until W cosines are held)
  std::optional<double> ess_token_median;  // early medians (absent until controller::kEarlyValues values)
  std::optional<double> kl_k3_median;
  std::array<bool, kAlertCount> condition{};  // by Alert: the rule's expression holds at this step
  std::array<bool, kAlertCount> firing{};     // by Alert: the condition, held for its hold

  bool holds(Alert a) const { return condition[static_cast<std::size_t>(a)]; }
  bool fires(Alert a) const { return firing[static_cast<std::size_t>(a)]; }
};

// Every step of `run` through every alert (a policy alert without its input
// never holds). REQUIRES: ValidateAlertSettings(s).ok()
std::vector<AlertStep> ReplayAlerts(const RecordedRun& run, const AlertSettings& s);

struct Alarm {
  bool evaluated = true;             // false: the run has no input of the alert (Evaluated)
  std::optional<std::int64_t> step;  // the first step > warmup at which the alert fires
  bool at_first_eligible = false;    // that step is the run's first step > warmup
  std::int64_t firing_steps = 0;     // steps > warmup at which it fires
};

struct RunBacktest {
  std::string name;
  std::int64_t steps = 0;
  RunOutcome outcome;
  std::optional<std::int64_t> first_eligible;  // the first step > warmup (absent: none)
  std::array<Alarm, kAlertCount> alarms;       // by Alert
};

// One run through every alert. REQUIRES: ValidateAlertSettings(s).ok()
RunBacktest BacktestRun(const RecordedRun& run, const AlertSettings& s);

// The spike guard (gac/controller/spike.h) replayed on a run's grad_norm
// and loss columns, one step after the other, as the agent would have
// judged them: a spike enters neither of the guard's windows. With an
// `injected` column, the injected steps it caught and missed.
struct GuardReplay {
  std::int64_t judged = 0;            // steps with a grad_norm
  std::vector<std::int64_t> spikes;   // the steps it called spikes
  std::int64_t injected = 0;          // steps marked injected (and judged)
  std::int64_t caught = 0;            // of them, called spikes
};
// REQUIRES: controller::ValidateSpikeSettings(s).ok()
GuardReplay ReplayGuard(const RecordedRun& run, const controller::SpikeSettings& s);

// How one alarm of a run scores.
enum class Verdict { kWarned, kLate, kMissed, kFalseAlarm, kQuiet, kNotEvaluated };
// "warned" (alarm at or before the collapse), "late" (after it: missed),
// "missed" (collapsed, no alarm), "false alarm" (no collapse), "quiet"
// (neither), "not evaluated" (the run has no input of the alert).
const char* VerdictName(Verdict v);
Verdict Judge(const RunOutcome& outcome, const Alarm& alarm);

// The scores of one alert over many runs: the runs it was evaluated on
// (not_evaluated counts the others, which are in no other count).
struct AlertScore {
  std::int64_t not_evaluated = 0;
  std::int64_t runs = 0, collapsed = 0, never_learned = 0;
  std::int64_t alarmed = 0;
  std::int64_t at_first_eligible = 0, at_first_eligible_collapsed = 0;
  std::int64_t tp = 0, fp = 0, fn = 0, tn = 0;
  std::int64_t fp_never_learned = 0;  // of fp, in runs that never learned
  std::vector<std::int64_t> leads;    // of the true positives, sorted
  // The same when an alarm at the first eligible step counts as none.
  std::int64_t tp_later = 0, fp_later = 0;

  std::optional<double> precision() const;  // tp / (tp + fp)
  std::optional<double> recall() const;     // tp / (tp + fn)
  std::optional<double> precision_later() const;
  std::optional<double> recall_later() const;  // tp_later / collapsed
};

AlertScore ScoreAlert(const std::vector<RunBacktest>& runs, Alert alert);

// controller::SortedQuantile (linear between order statistics, numpy's
// default), absent for no values.
std::optional<double> SortedQuantile(const std::vector<double>& sorted, double q);

// Thresholds from synchronous runs (the rule in the file comment).
struct AlertCalibration {
  double c_low = 0.0, c_high = 0.0, window_c_low = 0.0, window_c_high = 0.0;
  double c_q90 = 0.0, c_max = 0.0, window_q90 = 0.0, window_max = 0.0;
  std::int64_t runs = 0;
  std::int64_t cosines = 0;       // |c_t| values pooled
  std::int64_t window_means = 0;  // |m_t| values pooled
};

// FailedPrecondition when no run has a c_t or an m_t after the warm-up, or
// when a cap leaves c_low >= c_high (or the same of the window).
// REQUIRES: controller::ValidateWindow(window).ok(), warmup >= 0
base::StatusOr<AlertCalibration> CalibrateAlerts(const std::vector<RecordedRun>& runs, int window,
                                                 std::int64_t warmup);

}  // namespace gac::cli

#endif  // GAC_CLI_BACKTEST_H_
