// DecisionSource: where the agent gets its decision in remote mode. An
// interface in the controller library so that the agent (LibTorch) and the
// transport (gRPC) need not know each other: gac::transport::RemoteController
// implements it against gacd, and a trainer may implement its own.
//
// Thread safety: implementations say; the agent calls Decide from its
// training thread only.
#ifndef GAC_CONTROLLER_DECISION_SOURCE_H_
#define GAC_CONTROLLER_DECISION_SOURCE_H_

#include <cstdint>

#include "gac/controller/controller.h"
#include "gac/base/status.h"

namespace gac::controller {

class DecisionSource {
 public:
  virtual ~DecisionSource() = default;

  // The decision for the statistics of `step`, within the source's own
  // deadline. Any error (deadline missed, server down, rejected, an answer
  // that does not make sense) makes the agent fall back to its local
  // decision and count the fallback. Called on the training thread; must
  // not throw.
  virtual base::StatusOr<Decision> Decide(std::int64_t step, const AlignmentStats& stats) = 0;
};

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_DECISION_SOURCE_H_
