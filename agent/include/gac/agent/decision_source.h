// Where the agent gets its decision in remote mode: an interface so the
// LibTorch core stays free of gRPC (gac::agent_grpc's RemoteController
// implements it against gacd).

#ifndef GAC_AGENT_DECISION_SOURCE_H_
#define GAC_AGENT_DECISION_SOURCE_H_

#include <cstdint>

#include "gac/controller/controller.h"
#include "gac/controller/status.h"

namespace gac::agent {

class DecisionSource {
 public:
  virtual ~DecisionSource() = default;

  // The decision for the statistics of `step`, within the source's own
  // deadline. Any error (deadline missed, server down, rejected) makes the
  // agent fall back to its local decision and count the fallback. Called on
  // the training thread; must not throw.
  virtual StatusOr<Decision> Decide(std::int64_t step, const AlignmentStats& stats) = 0;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_DECISION_SOURCE_H_
