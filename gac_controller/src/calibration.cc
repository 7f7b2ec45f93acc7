#include "gac/controller/calibration.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace gac::controller {

namespace {

double RoundUpSignificant(double x, int digits) {
  if (x <= 0.0) return x;
  const double scale = std::pow(10.0, digits - 1 - static_cast<int>(std::floor(std::log10(x))));
  // The small slack keeps values already on the grid (0.0471) from moving up.
  return std::ceil(x * scale - 1e-9) / scale;
}

}  // namespace

double SortedQuantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + frac * (sorted[hi] - sorted[lo]);
}

CalibrationStats ComputeCalibration(const std::vector<double>& values, double c_low) {
  std::vector<double> abs_values;
  abs_values.reserve(values.size());
  for (double v : values) {
    if (std::isfinite(v)) abs_values.push_back(std::fabs(v));
  }
  CalibrationStats st;
  st.count = abs_values.size();
  if (abs_values.empty()) return st;
  std::sort(abs_values.begin(), abs_values.end());
  st.q90 = SortedQuantile(abs_values, 0.9);
  st.max = abs_values.back();
  double sum = 0.0;
  std::size_t low = 0;
  for (double v : abs_values) {
    sum += v;
    if (v <= c_low) ++low;
  }
  st.mean = sum / static_cast<double>(st.count);
  st.frac_le_c_low = static_cast<double>(low) / static_cast<double>(st.count);
  return st;
}

base::StatusOr<Thresholds> SuggestThresholds(const CalibrationStats& stats, std::size_t min_count) {
  if (stats.count < min_count || stats.count == 0) {
    return base::Status::FailedPrecondition("calibration needs at least " + std::to_string(std::max<std::size_t>(min_count, 1)) +
                                      " finite values of c_t, have " + std::to_string(stats.count));
  }
  Thresholds t;
  t.c_low = std::max(1e-3, RoundUpSignificant(stats.q90, 3));
  t.c_high = std::min(1.0, std::max(3.0 * stats.max, 2.0 * t.c_low));
  if (t.c_low >= t.c_high) {
    return base::Status::FailedPrecondition("on-policy |c_t| is too high to calibrate (q0.9 = " +
                                      std::to_string(stats.q90) + "): the run is not in an on-policy regime");
  }
  return t;
}

CalibrationWindow::CalibrationWindow(std::size_t capacity, std::size_t skip_first)
    : capacity_(capacity == 0 ? 1 : capacity), skip_first_(skip_first) {
  values_.reserve(capacity_);
}

void CalibrationWindow::Add(double cosine) {
  ++seen_;
  if (seen_ <= skip_first_ || !std::isfinite(cosine)) return;
  const double v = std::fabs(cosine);
  if (values_.size() < capacity_) {
    values_.push_back(v);
  } else {
    values_[next_] = v;
    next_ = (next_ + 1) % capacity_;
  }
}

CalibrationStats CalibrationWindow::Stats(double c_low) const { return ComputeCalibration(values_, c_low); }

}  // namespace gac::controller
