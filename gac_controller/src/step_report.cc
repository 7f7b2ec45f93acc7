#include "gac/controller/step_report.h"

#include <cmath>

namespace gac::controller {

std::optional<double> LayerStats::cosine() const {
  if (!(ref_sq > 0.0) || !std::isfinite(dot) || !std::isfinite(grad_sq) || !std::isfinite(ref_sq) || grad_sq < 0.0) {
    return std::nullopt;
  }
  return dot / (std::sqrt(grad_sq) * std::sqrt(ref_sq) + kCosineEpsilon);
}

}  // namespace gac::controller
