// Calibration of the GAC thresholds from a window of observed |c_t|.
//
// The paper anchors c_low to the on-policy (synchronous, s = 0) alignment range
// and sets c_high well above it (its Table 3 reports q0.9(|c|), max |c| and
// the fraction of steps with |c| <= c_low after a warm-up). CalibrationWindow
// keeps the last `capacity` values of |c| and reports the same statistics;
// SuggestThresholds turns them into thresholds by a documented rule.
//
// CalibrationWindow is not synchronised: one writer, or external locking.
#ifndef GAC_CONTROLLER_CALIBRATION_H_
#define GAC_CONTROLLER_CALIBRATION_H_

#include <cstddef>
#include <vector>

#include "gac/controller/controller.h"

namespace gac::controller {

struct CalibrationStats {
  std::size_t count = 0;     // finite values in the window
  double q90 = 0.0;          // 0.9 quantile of |c| (linear interpolation)
  double max = 0.0;          // max |c|
  double mean = 0.0;         // mean |c|
  double frac_le_c_low = 0.0;  // fraction of values with |c| <= c_low
};

// The q-quantile of ascending `sorted`, interpolating linearly between order
// statistics (numpy's default). REQUIRES: !sorted.empty(), 0 <= q <= 1.
double SortedQuantile(const std::vector<double>& sorted, double q);

// Statistics of |values| (the sign of each value is ignored; NaN and Inf are
// not counted). The quantile interpolates linearly between order statistics
// (numpy's default). An empty input gives count == 0 and zeros elsewhere.
CalibrationStats ComputeCalibration(const std::vector<double>& values, double c_low);

// Suggested thresholds from on-policy statistics:
//   c_low  = q90, rounded up to 3 significant digits, at least 1e-3;
//   c_high = max(3 * max, 2 * c_low), capped at 1: well above every
//            on-policy value (the paper's 0.3 is 3.2x Qwen3-1.7B's max).
// With the paper's Qwen3-1.7B figures (q90 0.0471, max 0.0924) this gives
// (0.0471, 0.2772), next to the paper's (0.05, 0.3). FailedPrecondition when
// count < min_count (too few steps to calibrate on) or when c_low would not
// be below c_high.
base::StatusOr<Thresholds> SuggestThresholds(const CalibrationStats& stats, std::size_t min_count = 20);

class CalibrationWindow {
 public:
  // REQUIRES: capacity > 0. skip_first values are ignored (warm-up transient;
  // the paper skips the first 50 steps).
  explicit CalibrationWindow(std::size_t capacity, std::size_t skip_first = 0);

  // Adds one c_t (its absolute value is kept). Non-finite values are counted
  // in seen() but not stored.
  void Add(double cosine);
  CalibrationStats Stats(double c_low) const;

  std::size_t seen() const { return seen_; }
  std::size_t size() const { return values_.size(); }

 private:
  const std::size_t capacity_;
  const std::size_t skip_first_;
  std::size_t seen_ = 0;
  std::size_t next_ = 0;  // ring position once full
  std::vector<double> values_;
};

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_CALIBRATION_H_
