// NcclReducer: a Reducer over a raw NCCL communicator, on the trainer's
// stream. Host values are staged through a small device buffer (allocated
// once, grown when a call needs more: 3 values plus 3 per parameter group),
// summed with one ncclAllReduce, and copied back; the call returns
// after the stream has completed the copy. Device values (DeviceReducer, the
// agent's path for CUDA gradients) are summed in place on the trainer's
// stream, ordered after and before the caller's stream, without a wait.
// Built when NCCL is found (GAC_WITH_NCCL); target gac::agent_nccl. Not
// thread-safe.
#ifndef GAC_AGENT_NCCL_REDUCER_H_
#define GAC_AGENT_NCCL_REDUCER_H_

#include <memory>

#include "gac/agent/device_reducer.h"

// The same opaque handle types as nccl.h and cuda_runtime_api.h declare.
typedef struct ncclComm* ncclComm_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace gac::agent {

class NcclReducer final : public DeviceReducer {
 public:
  // Does not take ownership of comm or stream. Works on the communicator's
  // device (its buffer and event live there; each call makes it current and
  // puts back what was). Creation fails when the CUDA device buffer cannot
  // be allocated or the communicator is invalid.
  static base::StatusOr<std::unique_ptr<NcclReducer>> Create(ncclComm_t comm, cudaStream_t stream);
  ~NcclReducer() override;

  base::Status AllReduceSum(double* values, std::size_t n) override;
  base::Status AllReduceSumDevice(double* device_values, std::size_t n, cudaStream_t stream) override;
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

 private:
  NcclReducer(ncclComm_t comm, cudaStream_t stream, int device, double* device_buf, cudaEvent_t order, int rank,
              int world_size)
      : comm_(comm),
        stream_(stream),
        device_(device),
        device_buf_(device_buf),
        order_(order),
        rank_(rank),
        world_size_(world_size) {}

  static constexpr std::size_t kInitialValues = 8;

  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;  // the communicator's
  double* device_buf_;
  std::size_t capacity_ = kInitialValues;  // doubles in device_buf_
  cudaEvent_t order_;  // orders the caller's stream and stream_ (device path)
  int rank_;
  int world_size_;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_NCCL_REDUCER_H_
