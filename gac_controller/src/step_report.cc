#include "gac/controller/step_report.h"

#include <cmath>

namespace gac {

std::optional<double> GroupStats::cosine() const {
  if (!(pp > 0.0) || !std::isfinite(dot) || !std::isfinite(gg) || !std::isfinite(pp) || gg < 0.0) {
    return std::nullopt;
  }
  return dot / (std::sqrt(gg) * std::sqrt(pp) + kCosineEpsilon);
}

}  // namespace gac
