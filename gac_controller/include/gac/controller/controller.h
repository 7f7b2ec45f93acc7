// The Gradient Alignment Control decision, from three scalars.
//
// Given dot = <g,p>, grad_sq = |g|^2 and ref_sq = |p|^2 of the current raw
// gradient g and the previous one p (summed over every trainable parameter,
// after any all-reduce), Decide() returns the regime and the projection
// coefficients:
//
//   c = dot / (sqrt(grad_sq * ref_sq) + 1e-8)
//   no reference (first step or ref_sq == 0) -> safe, cosine absent
//   project, but (1-alpha)(dot/ref_sq) not
//   finite (ref_sq so small, e.g. subnormal,
//   that the quotient overflows)             -> safe, cosine absent, as ref_sq == 0
//   any of dot, grad_sq, ref_sq non-finite,
//   or grad_sq/ref_sq negative               -> invalid: skip, keep the snapshot
//   |c| <= c_low                             -> safe: gradient untouched
//   c_low < |c| < c_high                     -> project: g' = g - (1-alpha)(dot/ref_sq) p
//   |c| >= c_high                            -> skip: do not step the optimizer
//
// alpha is c_low/|c| in kPaper mode (Algorithm 1 of the paper) and
// c_low*sqrt(1-c^2) / (|c|*sqrt(1-c_low^2)) in kExact mode, the gain that puts
// the cosine of g' with p at exactly c_low.
//
// Controller is immutable after Create(): safe for concurrent use.
#ifndef GAC_CONTROLLER_CONTROLLER_H_
#define GAC_CONTROLLER_CONTROLLER_H_

#include <cstdint>
#include <optional>

#include "gac/base/status.h"
#include "gac/controller/spike_verdict.h"

namespace gac::controller {

// Added to the denominator of the cosine, as in the paper.
inline constexpr double kCosineEpsilon = 1e-8;

// kSpike is the spike guard's (gac/controller/spike.h), decided before GAC:
// the update is skipped and the step enters neither window nor snapshot.
enum class Regime : std::uint8_t { kSafe = 0, kProject = 1, kSkip = 2, kInvalid = 3, kSpike = 4 };
inline constexpr Regime kAllRegimes[] = {Regime::kSafe, Regime::kProject, Regime::kSkip, Regime::kInvalid,
                                         Regime::kSpike};
enum class AlphaMode : std::uint8_t { kPaper = 0, kExact = 1 };
// How a decision is used: where it is made and whether it changes the update.
enum class Mode : std::uint8_t {
  kMonitor = 0,  // measure and report; never change the update
  kLocal = 1,    // decide in-process and apply the decision
  kRemote = 2,   // ask a decision source (gacd); on an error use the local
                 // decision and report the fallback
};
inline constexpr Mode kAllModes[] = {Mode::kMonitor, Mode::kLocal, Mode::kRemote};

// "safe", "project", "skip", "invalid", "spike".
const char* RegimeName(Regime regime);
// "paper", "exact".
const char* AlphaModeName(AlphaMode mode);
// "monitor", "local", "remote".
const char* ModeName(Mode mode);
// Parse the names above; InvalidArgument otherwise.
base::StatusOr<Regime> ParseRegime(const char* name);
base::StatusOr<AlphaMode> ParseAlphaMode(const char* name);
base::StatusOr<Mode> ParseMode(const char* name);

struct Thresholds {
  double c_low = 0.05;   // |c| at or below: safe
  double c_high = 0.3;   // |c| at or above: skip
};

// OK iff 0 < c_low < c_high <= 1 and both are finite; otherwise
// InvalidArgument with a message that names the offending value.
base::Status ValidateThresholds(const Thresholds& t);

// Sums over all trainable parameters (after the all-reduce when sharded).
struct AlignmentStats {
  double dot = 0.0;  // <g, p>
  double grad_sq = 0.0;  // |g|^2 (formerly `gg`)
  double ref_sq = 0.0;   // |p|^2 (formerly `pp`)
  bool has_reference = false;  // false on the first step / after a reset
  // The step's training loss when the trainer gave one (all ranks' mean):
  // read by the spike guard only (gac/controller/spike.h).
  std::optional<double> loss = std::nullopt;
};

// True for the statistics Decide calls invalid: a non-finite sum, or a
// negative sum of squares.
bool StatsInvalid(const AlignmentStats& stats);

struct Decision {
  Regime regime = Regime::kSafe;
  // Cosine c; absent when there is no reference or the inputs are non-finite.
  std::optional<double> cosine;
  // Cosine of the update that is applied with p: equal to cosine for safe,
  // the post-projection cosine for project; absent for skip/invalid/no ref.
  std::optional<double> cosine_after;
  double alpha = 1.0;        // gain on the parallel component (1 = untouched)
  // g' = g - projection_coeff * p; (1 - alpha) * dot / ref_sq, 0 unless project.
  double projection_coeff = 0.0;
  double grad_norm = 0.0;    // sqrt(grad_sq); not finite if grad_sq is not finite
  double ref_norm = 0.0;     // sqrt(ref_sq)
  // False for skip and invalid: the trainer must not call optimizer.step().
  bool apply_update = true;
  // The signed mean of the last W cosines, this step's included (the
  // windowed trigger, gac/controller/window.h); absent while fewer than W
  // are held. Reported with the per-step trigger too, where it is not used.
  std::optional<double> window_mean;
  // The spike guard's verdict (its z-scores and bounds, absent when its
  // z-score is off or warming up), set where the guard judged the step. In
  // remote mode gacd's answer carries its call (regime spike) and the
  // z-scores, not the bounds.
  SpikeVerdict spike_verdict;
};

// Cosine after g' = g - (1-alpha)(dot/ref_sq) p, from the scalars alone.
double CosineAfterProjection(double cosine, double alpha);

class Controller {
 public:
  // Validates the thresholds (see ValidateThresholds).
  static base::StatusOr<Controller> Create(Thresholds thresholds, AlphaMode mode = AlphaMode::kPaper);

  Decision Decide(const AlignmentStats& stats) const;
  // Decide with the regime and alpha taken from `statistic` instead of the
  // step's own cosine (absent: safe); the cosine, the projection coefficient
  // and the rest as Decide. The windowed trigger decides on the window's mean
  // this way (gac/controller/window.h: DecideOnMean).
  Decision DecideOn(const AlignmentStats& stats, std::optional<double> statistic) const;
  // The regime Decide chooses for a step with a reference and finite
  // statistics whose cosine is `cosine`: it depends on |cosine| and the
  // thresholds alone (safe, project or skip). Replaying a recorded c_t
  // through it gives exactly the regime these thresholds would have chosen.
  Regime RegimeForCosine(double cosine) const;
  // alpha for a cosine in the projection band, per mode().
  double Alpha(double cosine) const;

  const Thresholds& thresholds() const { return thresholds_; }
  AlphaMode mode() const { return mode_; }

 private:
  Controller(Thresholds t, AlphaMode m) : thresholds_(t), mode_(m) {}
  // Decide (statistic null) and DecideOn.
  Decision DecideWith(const AlignmentStats& stats, const std::optional<double>* statistic) const;

  Thresholds thresholds_;
  AlphaMode mode_;
};

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_CONTROLLER_H_
