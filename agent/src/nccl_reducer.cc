#include "gac/agent/nccl_reducer.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

namespace gac::agent {

StatusOr<std::unique_ptr<NcclReducer>> NcclReducer::Create(ncclComm_t comm, cudaStream_t stream) {
  int rank = 0;
  int size = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &size) != ncclSuccess) {
    return Status::InvalidArgument("NCCL communicator is not valid");
  }
  void* buf = nullptr;
  const cudaError_t err = cudaMalloc(&buf, kMaxValues * sizeof(double));
  if (err != cudaSuccess) {
    return Status::Unavailable(std::string("cudaMalloc for the NCCL reducer failed: ") + cudaGetErrorString(err));
  }
  return std::unique_ptr<NcclReducer>(new NcclReducer(comm, stream, static_cast<double*>(buf), rank, size));
}

NcclReducer::~NcclReducer() { cudaFree(device_buf_); }

Status NcclReducer::AllReduceSum(double* values, std::size_t n) {
  if (n > kMaxValues) return Status::InvalidArgument("NcclReducer sums at most 8 values");
  const std::size_t bytes = n * sizeof(double);
  cudaError_t err = cudaMemcpyAsync(device_buf_, values, bytes, cudaMemcpyHostToDevice, stream_);
  if (err != cudaSuccess) return Status::Unavailable(std::string("cudaMemcpyAsync: ") + cudaGetErrorString(err));
  const ncclResult_t r = ncclAllReduce(device_buf_, device_buf_, n, ncclFloat64, ncclSum, comm_, stream_);
  if (r != ncclSuccess) return Status::Unavailable(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
  err = cudaMemcpyAsync(values, device_buf_, bytes, cudaMemcpyDeviceToHost, stream_);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
  if (err != cudaSuccess) return Status::Unavailable(std::string("NCCL reducer copy-back: ") + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace gac::agent
