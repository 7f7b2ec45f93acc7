// The spike guard's verdict on one step (gac/controller/spike.h), in a header
// of its own so that a Decision (gac/controller/controller.h) carries it
// whole: the report's and the wire's z-scores are read from it.
//
// Thread safety: a plain value.
#ifndef GAC_CONTROLLER_SPIKE_VERDICT_H_
#define GAC_CONTROLLER_SPIKE_VERDICT_H_

#include <optional>

namespace gac::controller {

struct SpikeVerdict {
  bool spike = false;
  // The z-scores of the step's norm and loss against the held steps'
  // (clamped to +-kMaxSpikeZ); absent with the z-score off, before the
  // warm-up, and for the loss without one.
  std::optional<double> grad_norm_z;
  std::optional<double> loss_z;
  // The bounds they were judged against, mean + sigma * std of the held
  // values; absent where the z-score is, and where std is 0.
  std::optional<double> grad_norm_bound;
  std::optional<double> loss_bound;
};

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_SPIKE_VERDICT_H_
