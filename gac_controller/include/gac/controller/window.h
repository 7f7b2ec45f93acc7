// The windowed alignment trigger: GAC's rule applied to the signed mean of
// the last W cosines instead of the step's own c_t.
//
// c_t of a small model sits at its sampling-noise floor: a single |c_t|
// above c_low says little, and a per-step threshold fires on noise. The
// signed mean m_t of the last W valid c_t averages zero-mean noise out (its
// spread shrinks as 1/sqrt(W)) while a persistent alignment stays. The
// windowed rule is the paper's rule on |m_t| with its own thresholds:
//
//   fewer than W cosines held, or |m| <= c_low -> safe: gradient untouched
//   c_low < |m| < c_high                       -> project this step's gradient
//                                                 with alpha(|m|)
//   |m| >= c_high                              -> skip
//
// Invalid steps (non-finite statistics) and steps without a reference are
// decided as Controller::Decide decides them and never enter the window.
//
// AlignmentWindow and TriggeredController are values with no
// synchronisation: one per run, used by one thread. The functions are pure.
#ifndef GAC_CONTROLLER_WINDOW_H_
#define GAC_CONTROLLER_WINDOW_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "gac/base/status.h"
#include "gac/controller/controller.h"

namespace gac::controller {

// What the regime is decided on: the step's |c_t| (the paper's rule) or the
// window's |m_t|.
enum class Trigger : std::uint8_t { kPerStep = 0, kWindow = 1 };
inline constexpr Trigger kAllTriggers[] = {Trigger::kPerStep, Trigger::kWindow};

// "per_step", "window".
const char* TriggerName(Trigger t);
// Parses the names above; InvalidArgument naming the value otherwise.
base::StatusOr<Trigger> ParseTrigger(const char* name);

inline constexpr int kMaxWindow = 1000;
// OK iff 1 <= window <= kMaxWindow; otherwise InvalidArgument with the value.
base::Status ValidateWindow(int window);

// The cosine c_t that Controller::Decide reports for `stats`: absent for
// non-finite or negative sums and without a reference (has_reference false
// or ref_sq == 0). These are the cosines a window holds.
std::optional<double> StepCosine(const AlignmentStats& stats);

// The signed mean of the last size() cosines added. The mean is recomputed
// from the values held when they change (no running-sum drift, however many
// values were added).
class AlignmentWindow {
 public:
  // REQUIRES: ValidateWindow(size).ok()
  explicit AlignmentWindow(int size);

  // Adds a cosine, dropping the oldest when full. REQUIRES: finite (a
  // non-finite value is ignored).
  void Add(double cosine);
  // Forgets every value held; size() stays.
  void Clear();
  // Changes size(), keeping the most recent min(size, held()) values.
  // REQUIRES: ValidateWindow(size).ok()
  void Resize(int size);

  int size() const { return static_cast<int>(ring_.size()); }
  int held() const { return held_; }
  bool full() const { return held_ == size(); }
  // The mean of the values held; absent until full.
  std::optional<double> mean() const { return full() ? std::optional<double>(mean_) : std::nullopt; }
  // The values held, oldest first.
  std::vector<double> values() const;

 private:
  void Recompute();

  std::vector<double> ring_;  // size() slots; the oldest held at begin_
  int begin_ = 0;
  int held_ = 0;
  double mean_ = 0.0;  // of the values held (0 when none)
};

// The windowed rule for one step. `stats` are the step's statistics, `mean`
// the window's mean including this step's cosine (absent while the window is
// not full); `controller` holds the windowed thresholds and alpha mode.
//   non-finite statistics                -> invalid, exactly as Controller::Decide
//   no reference                         -> safe, no cosine, as Controller::Decide
//   mean absent or |mean| <= c_low       -> safe: cosine = cosine_after = c_t
//   c_low < |mean| < c_high              -> project: alpha = controller.Alpha(|mean|),
//                                           projection_coeff = (1 - alpha) dot / ref_sq,
//                                           cosine_after = CosineAfterProjection(c_t, alpha)
//                                           (c_t without the 1e-8, as Controller::Decide; a
//                                           coefficient that is not finite: safe with no
//                                           cosine, as Controller::Decide)
//   |mean| >= c_high                     -> skip
// Decision::window_mean is `mean` in every case.
Decision DecideOnMean(const Controller& controller, const AlignmentStats& stats, std::optional<double> mean);

struct TriggerSettings {
  Trigger trigger = Trigger::kPerStep;
  int window = 20;               // W, the cosines the mean is over
  Thresholds window_thresholds;  // the thresholds of |m_t|
};

// OK iff the window and the window thresholds are valid (ValidateWindow,
// ValidateThresholds); otherwise InvalidArgument naming the setting.
base::Status ValidateTriggerSettings(const TriggerSettings& s);

// One run's decisions, per step or windowed; keeps the window (stateful: one
// per run). Every valid cosine (StepCosine) enters the window whatever the
// trigger, so Decision::window_mean is reported in both modes; invalid steps
// and steps without a reference never enter it.
class TriggeredController {
 public:
  // Validates the per-step thresholds and the trigger settings.
  static base::StatusOr<TriggeredController> Create(Thresholds per_step, AlphaMode mode, TriggerSettings trigger);

  // Adds the step's cosine to the window, then decides: kPerStep as
  // Controller::Decide with the per-step thresholds, kWindow as DecideOnMean
  // with the window thresholds. window_mean is set in both.
  Decision Decide(const AlignmentStats& stats);
  // Empties the window (a new reference, e.g. after the agent's reset).
  void Reset() { window_.Clear(); }

  const TriggerSettings& trigger() const { return trigger_; }
  const AlignmentWindow& window() const { return window_; }
  const Controller& per_step() const { return per_step_; }
  const Controller& windowed() const { return windowed_; }

 private:
  TriggeredController(Controller per_step, Controller windowed, TriggerSettings trigger);

  Controller per_step_;
  Controller windowed_;  // the window thresholds, the same alpha mode
  TriggerSettings trigger_;
  AlignmentWindow window_;
};

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_WINDOW_H_
