// Offline replay: what GAC would have chosen on a recorded run with other
// thresholds. The regime of a step depends only on its c_t and the thresholds
// (gac::Controller::RegimeForCosine), and alpha only on c_t, c_low and the
// alpha mode (Controller::Alpha), so replaying the recorded c_t is exact: it
// gives the very decision an agent with those thresholds would have made on
// the same gradients. (What the run would have done afterwards, with other
// updates applied, is not knowable from the record.)
//
// Steps without a c_t (the first step, a reset) are safe under any
// thresholds; steps recorded as invalid (non-finite statistics) stay
// invalid, and steps the spike guard skipped (spike) stay spike: neither is
// the thresholds' doing.
//
// Replayer is a value fed one step at a time (a run is read page by page, and
// a grid feeds every step to one Replayer per threshold pair); it is not
// synchronised.
#ifndef GAC_CLI_REPLAY_H_
#define GAC_CLI_REPLAY_H_

#include <array>
#include <cstddef>
#include <iterator>
#include <cstdint>
#include <optional>
#include <vector>

#include "gac/controller/controller.h"
#include "gac/base/status.h"

namespace gac::cli {

// One stored step of one rank, as replay needs it.
struct RecordedStep {
  std::int64_t step = 0;
  std::optional<double> cosine;     // c_t; absent without a reference or when invalid
  controller::Regime regime = controller::Regime::kSafe;    // the recorded regime
  double alpha = 1.0;               // the recorded alpha
};

// The decision replayed for one step.
struct ReplayedDecision {
  controller::Regime regime = controller::Regime::kSafe;
  double alpha = 1.0;  // 1 unless the regime is project
};

// What `controller` decides for `step` (see the file comment).
ReplayedDecision ReplayStep(const controller::Controller& controller, const RecordedStep& step);

// Statistics of a sequence of regimes in step order: counts, the first
// project and the first skip step, and the longest run of skip steps with
// consecutive step numbers (a missing step ends a run).
class RegimeSeries {
 public:
  // REQUIRES: steps in increasing order.
  void Add(std::int64_t step, controller::Regime regime);

  std::uint64_t count(controller::Regime regime) const { return counts_[static_cast<std::size_t>(regime)]; }
  std::uint64_t total() const;
  std::optional<std::int64_t> first_project() const { return first_project_; }
  std::optional<std::int64_t> first_skip() const { return first_skip_; }
  // Length of the longest skip run and its first step (absent when no skip).
  std::uint64_t longest_skip() const { return longest_skip_; }
  std::optional<std::int64_t> longest_skip_first() const { return longest_skip_first_; }

 private:
  std::array<std::uint64_t, std::size(controller::kAllRegimes)> counts_{};
  std::optional<std::int64_t> first_project_, first_skip_;
  std::uint64_t longest_skip_ = 0;
  std::optional<std::int64_t> longest_skip_first_;
  std::uint64_t run_length_ = 0;  // the skip run ending at the last step
  std::int64_t run_first_ = 0;
  std::optional<std::int64_t> last_step_;
};

// A step whose replayed regime differs from the recorded one.
struct DifferingStep {
  std::int64_t step = 0;
  std::optional<double> cosine;
  controller::Regime recorded = controller::Regime::kSafe;
  controller::Regime replayed = controller::Regime::kSafe;
  double recorded_alpha = 1.0;
  double replayed_alpha = 1.0;
};

// Replays a run's steps (one rank, in step order) with one controller.
class Replayer {
 public:
  // Keeps the first `max_differing_kept` differing steps (all are counted).
  explicit Replayer(controller::Controller controller, std::size_t max_differing_kept = SIZE_MAX)
      : controller_(controller), max_kept_(max_differing_kept) {}

  // REQUIRES: steps in increasing step order. Returns the replayed decision.
  ReplayedDecision Add(const RecordedStep& step);

  const controller::Controller& controller() const { return controller_; }
  const RegimeSeries& recorded() const { return recorded_; }
  const RegimeSeries& replayed() const { return replayed_; }
  std::uint64_t steps() const { return replayed_.total(); }
  std::uint64_t differing_count() const { return differing_count_; }
  const std::vector<DifferingStep>& differing() const { return differing_; }
  // Mean alpha over the replayed project steps (absent without any), and
  // the same of the recorded ones.
  std::optional<double> mean_project_alpha() const;
  std::optional<double> mean_recorded_project_alpha() const;

 private:
  controller::Controller controller_;
  std::size_t max_kept_;
  RegimeSeries recorded_, replayed_;
  std::uint64_t differing_count_ = 0;
  std::vector<DifferingStep> differing_;
  double project_alpha_sum_ = 0.0;
  double recorded_project_alpha_sum_ = 0.0;
};

// The pairs of a threshold grid: every (c_low, c_high) of the two lists, in
// the order given (c_low outer), leaving out the pairs with c_low >= c_high.
// InvalidArgument, naming the value, for a value outside (0, 1] or not
// finite, or when no pair is left.
base::StatusOr<std::vector<controller::Thresholds>> ThresholdGrid(const std::vector<double>& c_lows, const std::vector<double>& c_highs);

}  // namespace gac::cli

#endif  // GAC_CLI_REPLAY_H_
