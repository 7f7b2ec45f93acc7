// The LibTorch-CUDA glue of the agent: runs gac::agent_cuda's passes on the
// current CUDA stream of the gradients' device. Compiled only against a CUDA
// build of LibTorch (GAC_AGENT_TORCH_CUDA): c10_cuda gives the stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <string>
#include <utility>

#include "agent/src/cuda/cuda_passes.h"
#include "agent/src/device_passes.h"
#include "gac/agent/device_reducer.h"

namespace gac::agent {

namespace {

class TorchCudaPasses final : public DevicePasses {
 public:
  TorchCudaPasses(c10::Device device, std::unique_ptr<cuda::MultiTensorPasses> passes)
      : device_(device), passes_(std::move(passes)) {}

  base::Status Statistics(const std::vector<cuda::TensorRef>& tensors, bool with_p, Reducer* reducer, double* out,
                    bool* all_reduced) override {
    *all_reduced = false;
    const c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    base::Status st = passes_->SetTensors(tensors.data(), tensors.size(), stream);
    if (st.ok()) st = passes_->EnqueueStatistics(with_p, stream);
    if (!st.ok()) return st;
    // The one all-reduce of the step, on the device, before the one copy to
    // the host. Other reducers (c10d process groups) sum on the host.
    if (auto* device_reducer = dynamic_cast<DeviceReducer*>(reducer)) {
      st = device_reducer->AllReduceSumDevice(passes_->device_result(), passes_->result_size(), stream);
      if (!st.ok()) return base::Status::Unavailable("all-reduce of the GAC statistics failed: " + st.ToString());
      *all_reduced = true;
    }
    GAC_ASSIGN_OR_RETURN(cuda::StatsView sums, passes_->ReadResult(stream));
    std::copy(sums.values, sums.values + passes_->result_size(), out);
    return base::Status::Ok();
  }

  base::Status Apply(bool project, float coeff, bool snapshot_projected) override {
    const c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    return project ? passes_->EnqueueProjectSnapshot(coeff, snapshot_projected, stream)
                   : passes_->EnqueueSnapshot(stream);
  }

 private:
  const c10::Device device_;
  const std::unique_ptr<cuda::MultiTensorPasses> passes_;
};

}  // namespace

base::StatusOr<std::unique_ptr<DevicePasses>> CreateCudaPasses(c10::Device device, bool bf16_snapshot, int num_groups) {
  if (!device.is_cuda() || !device.has_index()) {
    return base::Status::InvalidArgument("CUDA passes need a CUDA device with an index, got " + device.str());
  }
  const c10::cuda::CUDAGuard guard(device);
  base::StatusOr<std::unique_ptr<cuda::MultiTensorPasses>> passes =
      cuda::MultiTensorPasses::Create(bf16_snapshot ? cuda::ElemType::kBF16 : cuda::ElemType::kF32, num_groups);
  if (!passes.ok()) return passes.status();
  return std::unique_ptr<DevicePasses>(new TorchCudaPasses(device, std::move(*passes)));
}

}  // namespace gac::agent
