// ProcessGroupReducer: a Reducer over a c10d ProcessGroup (what
// torch.distributed's groups are: Gloo, NCCL, MPI behind it), or over one
// c10d Backend (a ProcessGroupGloo or ProcessGroupNCCL made in C++).
// The statistics travel as one fp64 tensor of 3 elements on `device` (CPU for
// Gloo, the rank's GPU for NCCL); the buffer is allocated once.
// Not thread-safe: the training thread owns it.
#ifndef GAC_AGENT_PROCESS_GROUP_REDUCER_H_
#define GAC_AGENT_PROCESS_GROUP_REDUCER_H_

#include <c10/util/intrusive_ptr.h>
#include <c10/core/Device.h>

#include <memory>

#include "gac/agent/reducer.h"

namespace c10d {
class Backend;
class ProcessGroup;
}

namespace gac::agent {

class ProcessGroupReducer final : public Reducer {
 public:
  explicit ProcessGroupReducer(c10::intrusive_ptr<c10d::ProcessGroup> group,
                               c10::Device device = c10::Device(c10::kCPU));
  explicit ProcessGroupReducer(c10::intrusive_ptr<c10d::Backend> backend,
                               c10::Device device = c10::Device(c10::kCPU));
  ~ProcessGroupReducer() override;

  base::Status AllReduceSum(double* values, std::size_t n) override;
  int rank() const override;
  int world_size() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_PROCESS_GROUP_REDUCER_H_
