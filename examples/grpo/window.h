// The windowed signed mean of c_t, as a detector and as GAC's trigger.
//
// c_t of a small model is mostly sampling noise (docs/RESULTS.md: the noise
// floor): a single |c_t| above c_low says little. Its signed mean over the
// last W steps averages that noise out (zero-mean, spread shrinking as
// 1/sqrt(W)) while a persistent alignment stays. WindowedDecisionSource
// applies the paper's rule to that mean m_t instead of c_t:
//   fewer than W values, or |m| <= c_low  -> safe
//   c_low < |m| < c_high                  -> project this step's gradient
//                                            with alpha(|m|) (paper or exact)
//   |m| >= c_high                         -> skip
// Invalid statistics (non-finite) are passed through as the controller
// decides them and do not enter the window. It is a gac::agent::
// DecisionSource so the agent applies its decisions (remote mode with an
// in-process source); it never fails.
//
// Not synchronised: one training thread.
#ifndef GAC_EXAMPLES_GRPO_WINDOW_H_
#define GAC_EXAMPLES_GRPO_WINDOW_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "gac/controller/decision_source.h"
#include "gac/controller/controller.h"

namespace gac::grpo {

// Mean of the last `size` values added.
class SignedWindow {
 public:
  explicit SignedWindow(int size);  // REQUIRES: size >= 1
  void Add(double value);
  bool full() const { return count_ >= values_.size(); }
  // Mean of the values held (fewer than size() until full); absent when empty.
  std::optional<double> mean() const;
  int size() const { return static_cast<int>(values_.size()); }

 private:
  std::vector<double> values_;
  std::size_t next_ = 0, count_ = 0;
  double sum_ = 0.0;
};

class WindowedDecisionSource : public gac::controller::DecisionSource {
 public:
  // REQUIRES: thresholds valid (gac::ValidateThresholds), window >= 1.
  WindowedDecisionSource(controller::Thresholds thresholds, controller::AlphaMode mode, int window);

  base::StatusOr<controller::Decision> Decide(std::int64_t step, const controller::AlignmentStats& stats) override;
  // m_t after the last Decide (absent until the window is full).
  std::optional<double> last_mean() const { return last_mean_; }

 private:
  controller::Controller controller_;
  SignedWindow window_;
  std::optional<double> last_mean_;
};

}  // namespace gac::grpo

#endif  // GAC_EXAMPLES_GRPO_WINDOW_H_
