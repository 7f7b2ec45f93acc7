// StepReport: what one GAC step measured and decided, as the agent returns it
// from Agent::Step. A plain value (standard library only, no LibTorch), so
// the transport can turn it into a telemetry record (gac/transport/
// step_record.h) and the Python package can expose it, without the agent.
//
// Thread safety: a value; not synchronised.
#ifndef GAC_CONTROLLER_STEP_REPORT_H_
#define GAC_CONTROLLER_STEP_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gac/controller/controller.h"

namespace gac {

// One parameter group's statistics for a step (opt-in per-layer breakdown).
struct GroupStats {
  std::string name;
  double dot = 0.0, gg = 0.0, pp = 0.0;
  // cos(g_group, p_group); absent without a reference, with a zero norm, or
  // with non-finite sums.
  std::optional<double> cosine() const;
};

struct StepReport {
  std::int64_t step = 0;
  // The controller's verdict: regime, cosine, alpha, norms. In monitor mode it
  // says what local mode would have done.
  Decision decision;
  // Call optimizer.step()? Always true in monitor mode.
  bool step_optimizer = true;
  // True when the gradients were projected in place.
  bool gradient_modified = false;
  std::int64_t elements = 0;         // local gradient elements read
  std::int32_t tensors = 0;          // tensors with a gradient this step
  std::int32_t strided_tensors = 0;  // tensors that took the strided path
  double stats_seconds = 0.0;        // statistics pass and all-reduce
  double decide_seconds = 0.0;       // remote decision (remote mode)
  double apply_seconds = 0.0;        // projection / snapshot pass (CUDA: enqueueing it)
  // Remote mode: the decision source failed (or another rank's did) and the
  // local decision was used; remote_error says why.
  bool fallback = false;
  std::string remote_error;
  std::vector<GroupStats> groups;    // per parameter group, in order
};

}  // namespace gac

#endif  // GAC_CONTROLLER_STEP_REPORT_H_
