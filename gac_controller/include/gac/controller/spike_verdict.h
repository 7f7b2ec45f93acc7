// The spike guard's verdict on one step (gac/controller/spike.h), in a header
// of its own so that a Decision (gac/controller/controller.h) carries it
// whole: the report's and the wire's z-scores are read from it.
//
// Thread safety: a plain value.
#ifndef GAC_CONTROLLER_SPIKE_VERDICT_H_
#define GAC_CONTROLLER_SPIKE_VERDICT_H_

#include <optional>

namespace gac::controller {

// One value's score against the held values: its z (clamped to
// +-kMaxSpikeZ) and the bound it was judged against, mean + sigma * std of
// the held values (absent where std is 0).
struct SpikeScore {
  double z = 0.0;
  std::optional<double> bound;
};

struct SpikeVerdict {
  bool spike = false;
  // The scores of the step's norm and of its loss; absent with the z-score
  // off, before the warm-up, and for the loss without one.
  std::optional<SpikeScore> grad_norm;
  std::optional<SpikeScore> loss;
};

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_SPIKE_VERDICT_H_
