// The agent core's passes for gradients on a CUDA device: gac::agent_cuda's
// multi-tensor passes on the stream the front names (the trainer's current
// stream), and the snapshot's device memory. CUDA runtime only, no LibTorch.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>

#include "agent/src/cuda/cuda_passes.h"
#include "agent/src/device_passes.h"
#include "gac/agent/device_reducer.h"

namespace gac::agent {

namespace {

base::Status CudaError(const char* what, cudaError_t e) {
  return base::Status::Unavailable(std::string(what) + " failed: " + cudaGetErrorString(e));
}

// Makes `device` current for a scope, as it was afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

class CudaDevicePasses final : public DevicePasses {
 public:
  CudaDevicePasses(int device, std::unique_ptr<cuda::MultiTensorPasses> passes)
      : device_(device), passes_(std::move(passes)) {}
  ~CudaDevicePasses() override {
    if (snapshot_ != nullptr) {
      const DeviceScope scope(device_);
      (void)cudaFree(snapshot_);
    }
  }

  base::Status Statistics(const std::vector<cuda::TensorRef>& tensors, bool with_p, Reducer* reducer, double* out,
                          bool* all_reduced, void* stream_handle) override {
    *all_reduced = false;
    const DeviceScope scope(device_);
    const auto stream = static_cast<cudaStream_t>(stream_handle);
    base::Status st = passes_->SetTensors(tensors.data(), tensors.size(), stream);
    if (st.ok()) st = passes_->EnqueueStatistics(with_p, stream);
    if (!st.ok()) return st;
    // The one all-reduce of the step, on the device, before the one copy to
    // the host. Other reducers (c10d process groups, torch.distributed from
    // Python) sum on the host.
    if (auto* device_reducer = dynamic_cast<DeviceReducer*>(reducer)) {
      st = device_reducer->AllReduceSumDevice(passes_->device_result(), passes_->result_size(), stream);
      if (!st.ok()) return base::Status::Unavailable("all-reduce of the GAC statistics failed: " + st.ToString());
      *all_reduced = true;
    }
    GAC_ASSIGN_OR_RETURN(cuda::StatsView sums, passes_->ReadResult(stream));
    std::copy(sums.values, sums.values + passes_->result_size(), out);
    return base::Status::Ok();
  }

  base::Status Apply(bool project, float coeff, bool snapshot_projected, void* stream_handle) override {
    const DeviceScope scope(device_);
    const auto stream = static_cast<cudaStream_t>(stream_handle);
    return project ? passes_->EnqueueProjectSnapshot(coeff, snapshot_projected, stream)
                   : passes_->EnqueueSnapshot(stream);
  }

  base::StatusOr<char*> AllocateSnapshot(std::size_t bytes) override {
    if (snapshot_ != nullptr) return base::Status::FailedPrecondition("the snapshot is allocated already");
    const DeviceScope scope(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) return CudaError("cudaMalloc of the snapshot", e);
    e = cudaMemset(p, 0, bytes);
    // Done before any stream of the trainer's (maybe non-blocking) uses it.
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      (void)cudaFree(p);
      return CudaError("cudaMemset of the snapshot", e);
    }
    snapshot_ = p;
    return static_cast<char*>(p);
  }

 private:
  const int device_;
  const std::unique_ptr<cuda::MultiTensorPasses> passes_;
  void* snapshot_ = nullptr;
};

}  // namespace

base::StatusOr<std::unique_ptr<DevicePasses>> CreateCudaPasses(int device, bool bf16_snapshot, int num_groups) {
  if (device < 0) return base::Status::InvalidArgument("CUDA passes need a CUDA device ordinal");
  const DeviceScope scope(device);
  base::StatusOr<std::unique_ptr<cuda::MultiTensorPasses>> passes =
      cuda::MultiTensorPasses::Create(bf16_snapshot ? cuda::ElemType::kBF16 : cuda::ElemType::kF32, num_groups);
  if (!passes.ok()) return passes.status();
  return std::unique_ptr<DevicePasses>(new CudaDevicePasses(device, std::move(*passes)));
}

}  // namespace gac::agent
