#include "gac/agent/nccl_reducer.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "agent/src/cuda/cuda_util.h"

namespace gac::agent {

using cuda::DeviceScope;

base::StatusOr<std::unique_ptr<NcclReducer>> NcclReducer::Create(ncclComm_t comm, cudaStream_t stream) {
  int rank = 0;
  int size = 0;
  int device = -1;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &size) != ncclSuccess ||
      ncclCommCuDevice(comm, &device) != ncclSuccess) {
    return base::Status::InvalidArgument("NCCL communicator is not valid");
  }
  // The buffer and the event on the communicator's device, whatever is current.
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(scope.Enter(device));
  void* buf = nullptr;
  cudaError_t err = cudaMalloc(&buf, kInitialValues * sizeof(double));
  if (err != cudaSuccess) {
    return base::Status::Unavailable(std::string("cudaMalloc for the NCCL reducer failed: ") + cudaGetErrorString(err));
  }
  cudaEvent_t order = nullptr;
  err = cudaEventCreateWithFlags(&order, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    cudaFree(buf);
    return base::Status::Unavailable(std::string("cudaEventCreate for the NCCL reducer failed: ") + cudaGetErrorString(err));
  }
  GAC_RETURN_IF_ERROR(scope.Exit());
  return std::unique_ptr<NcclReducer>(
      new NcclReducer(comm, stream, device, static_cast<double*>(buf), order, rank, size));
}

NcclReducer::~NcclReducer() {
  DeviceScope scope;
  (void)scope.Enter(device_);
  cudaFree(device_buf_);
  cudaEventDestroy(order_);
}

base::Status NcclReducer::AllReduceSum(double* values, std::size_t n) {
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(scope.Enter(device_));
  if (n > capacity_) {
    // Every call ends with a wait on stream_, so the old buffer is idle.
    void* buf = nullptr;
    cudaError_t err = cudaMalloc(&buf, n * sizeof(double));
    if (err != cudaSuccess) {
      return base::Status::Unavailable(std::string("cudaMalloc for the NCCL reducer failed: ") + cudaGetErrorString(err));
    }
    cudaFree(device_buf_);
    device_buf_ = static_cast<double*>(buf);
    capacity_ = n;
  }
  const std::size_t bytes = n * sizeof(double);
  cudaError_t err = cudaMemcpyAsync(device_buf_, values, bytes, cudaMemcpyHostToDevice, stream_);
  if (err != cudaSuccess) return base::Status::Unavailable(std::string("cudaMemcpyAsync: ") + cudaGetErrorString(err));
  const ncclResult_t r = ncclAllReduce(device_buf_, device_buf_, n, ncclFloat64, ncclSum, comm_, stream_);
  if (r != ncclSuccess) return base::Status::Unavailable(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
  err = cudaMemcpyAsync(values, device_buf_, bytes, cudaMemcpyDeviceToHost, stream_);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
  if (err != cudaSuccess) return base::Status::Unavailable(std::string("NCCL reducer copy-back: ") + cudaGetErrorString(err));
  return scope.Exit();
}

namespace {

// `later` waits for what `earlier` has enqueued so far.
base::Status Order(cudaEvent_t event, cudaStream_t earlier, cudaStream_t later) {
  cudaError_t err = cudaEventRecord(event, earlier);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(later, event, 0);
  if (err != cudaSuccess) return base::Status::Unavailable(std::string("NCCL reducer ordering: ") + cudaGetErrorString(err));
  return base::Status::Ok();
}

}  // namespace

base::Status NcclReducer::AllReduceSumDevice(double* device_values, std::size_t n, cudaStream_t stream) {
  // On the trainer's stream, as every collective of this communicator: after
  // what `stream` has enqueued (the values), and before what it enqueues next.
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(scope.Enter(device_));
  const bool other_stream = stream != stream_;
  if (other_stream) {
    base::Status st = Order(order_, stream, stream_);
    if (!st.ok()) return st;
  }
  const ncclResult_t r = ncclAllReduce(device_values, device_values, n, ncclFloat64, ncclSum, comm_, stream_);
  if (r != ncclSuccess) return base::Status::Unavailable(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
  if (other_stream) GAC_RETURN_IF_ERROR(Order(order_, stream_, stream));
  return scope.Exit();
}

}  // namespace gac::agent
