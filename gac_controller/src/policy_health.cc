#include "gac/controller/policy_health.h"

#include <algorithm>

namespace gac::controller {

void EarlyMedian::Add(double value) {
  if (values_.size() == kEarlyValues) return;
  values_.push_back(value);
  if (values_.size() < kEarlyValues) return;
  std::vector<double> sorted = values_;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t mid = sorted.size() / 2;
  median_ = sorted.size() % 2 == 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0;
}

}  // namespace gac::controller
