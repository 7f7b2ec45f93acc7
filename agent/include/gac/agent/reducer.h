// Reducer: sums the agent's three statistics across the ranks that hold
// shards of one model's gradients (FSDP / ZeRO). Every rank calls
// AllReduceSum with its local (dot, grad_sq, ref_sq) and gets the global sums back, so
// every rank reaches the same decision.
//
// Implementations: none (unsharded: pass no reducer), ProcessGroupReducer
// (any c10d ProcessGroup: Gloo, NCCL, MPI) and NcclReducer (a raw NCCL
// communicator). A Reducer is used from the training thread only.
#ifndef GAC_AGENT_REDUCER_H_
#define GAC_AGENT_REDUCER_H_

#include <cstddef>

#include "gac/base/status.h"

namespace gac::agent {

class Reducer {
 public:
  virtual ~Reducer() = default;
  // Replaces values[0..n) by their sums over all ranks. Collective: every
  // rank must call it, in the same order. An error leaves values unspecified.
  virtual base::Status AllReduceSum(double* values, std::size_t n) = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_REDUCER_H_
