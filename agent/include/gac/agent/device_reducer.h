// DeviceReducer: a Reducer that can also sum values that already live in GPU
// memory, without a trip through the host. When the gradients are on a GPU
// the agent computes the statistics into a small fp64 device buffer; given a
// DeviceReducer it all-reduces that buffer on the device, in stream order,
// and copies the global sums to the host once. Any other Reducer gets the
// local sums on the host (AllReduceSum) after that copy.
//
// Implementations: NcclReducer (a raw NCCL communicator). A c10d
// ProcessGroupReducer stays host-side, also over a NCCL process group (it
// stages the values through its own device buffer): simpler, and one more
// small round trip per step.
//
// Like every Reducer, used from the training thread only.
#ifndef GAC_AGENT_DEVICE_REDUCER_H_
#define GAC_AGENT_DEVICE_REDUCER_H_

#include <cstddef>

#include "gac/agent/reducer.h"

// The same opaque handle type as cuda_runtime_api.h declares.
typedef struct CUstream_st* cudaStream_t;

namespace gac::agent {

class DeviceReducer : public Reducer {
 public:
  // Enqueues the sum over all ranks of device_values[0, n) (fp64, memory of
  // the current CUDA device), in place: after the work enqueued on `stream`
  // so far, before the work enqueued on it later. Does not wait for it.
  // Collective: every rank calls it (or AllReduceSum with the same n), in the
  // same order. An error leaves the values unspecified.
  virtual base::Status AllReduceSumDevice(double* device_values, std::size_t n, cudaStream_t stream) = 0;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_DEVICE_REDUCER_H_
