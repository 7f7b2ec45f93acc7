// The agent core's passes for gradients on a CUDA device: gac::agent_cuda's
// multi-tensor passes on the stream the front names (the trainer's current
// stream), and the snapshot's device memory. CUDA runtime only, no LibTorch.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>

#include "agent/src/cuda/cuda_passes.h"
#include "agent/src/cuda/cuda_util.h"
#include "agent/src/device_passes.h"
#include "gac/agent/device_reducer.h"

namespace gac::agent {

namespace {

using cuda::CudaStatus;
using cuda::DeviceScope;

constexpr std::size_t kScratchAlign = 256;

std::size_t AlignUp(std::size_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// A copy between a strided tensor and its row-major copy in scratch memory.
cuda::StridedCopyArgs CopyArgs(const StridedTensor& t, const void* src, void* dst, const std::int64_t* src_strides,
                               const std::int64_t* dst_strides, int elem_bytes) {
  cuda::StridedCopyArgs a{};
  a.src = src;
  a.dst = dst;
  a.n = t.n;
  a.ndim = t.ndim;
  a.elem_bytes = elem_bytes;
  for (int d = 0; d < t.ndim; ++d) {
    a.sizes[d] = t.sizes[d];
    a.src_strides[d] = src_strides[d];
    a.dst_strides[d] = dst_strides[d];
  }
  return a;
}

class CudaDevicePasses final : public DevicePasses {
 public:
  CudaDevicePasses(int device, std::unique_ptr<cuda::MultiTensorPasses> passes)
      : device_(device), passes_(std::move(passes)) {}
  ~CudaDevicePasses() override {
    DeviceScope scope;
    (void)scope.Enter(device_);
    (void)cudaFree(snapshot_);  // waits for the device
    (void)cudaFree(scratch_);
  }

  base::Status Statistics(const std::vector<cuda::TensorRef>& tensors, const std::vector<StridedTensor>& strided,
                          bool with_p, Reducer* reducer, double* out, bool* all_reduced, void* stream_handle) override {
    *all_reduced = false;
    DeviceScope scope;
    GAC_RETURN_IF_ERROR(scope.Enter(device_));
    const auto stream = static_cast<cudaStream_t>(stream_handle);
    const std::vector<cuda::TensorRef>* list = &tensors;
    copy_back_.clear();
    if (!strided.empty()) {
      GAC_RETURN_IF_ERROR(CopyStridedIn(tensors, strided, stream));
      list = &with_strided_;
    }
    GAC_RETURN_IF_ERROR(passes_->SetTensors(list->data(), list->size(), stream));
    GAC_RETURN_IF_ERROR(passes_->EnqueueStatistics(with_p, stream));
    // The one all-reduce of the step, on the device, before the one copy to
    // the host. Other reducers (c10d process groups, torch.distributed from
    // Python) sum on the host.
    if (auto* device_reducer = dynamic_cast<DeviceReducer*>(reducer)) {
      base::Status st = device_reducer->AllReduceSumDevice(passes_->device_result(), passes_->result_size(), stream);
      if (!st.ok()) return base::Status::Unavailable("all-reduce of the GAC statistics failed: " + st.ToString());
      *all_reduced = true;
    }
    GAC_ASSIGN_OR_RETURN(cuda::StatsView sums, passes_->ReadResult(stream));
    std::copy(sums.values, sums.values + passes_->result_size(), out);
    return scope.Exit();
  }

  base::Status Apply(bool project, float coeff, bool snapshot_projected, void* stream_handle) override {
    DeviceScope scope;
    GAC_RETURN_IF_ERROR(scope.Enter(device_));
    const auto stream = static_cast<cudaStream_t>(stream_handle);
    GAC_RETURN_IF_ERROR(project ? passes_->EnqueueProjectSnapshot(coeff, snapshot_projected, stream)
                                : passes_->EnqueueSnapshot(stream));
    // The strided tensors' copies back: the snapshot slices the pass wrote,
    // and the gradients it projected.
    for (const CopyBack& c : copy_back_) {
      if (c.gradient && !project) continue;
      GAC_RETURN_IF_ERROR(passes_->EnqueueStridedCopy(c.args, stream));
    }
    return scope.Exit();
  }

  base::StatusOr<char*> AllocateSnapshot(std::size_t bytes) override {
    if (snapshot_ != nullptr) return base::Status::FailedPrecondition("the snapshot is allocated already");
    DeviceScope scope;
    GAC_RETURN_IF_ERROR(scope.Enter(device_));
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) return CudaStatus("cudaMalloc of the snapshot", e);
    e = cudaMemset(p, 0, bytes);
    // Done before any stream of the trainer's (maybe non-blocking) uses it.
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      (void)cudaFree(p);
      return CudaStatus("cudaMemset of the snapshot", e);
    }
    snapshot_ = p;
    GAC_RETURN_IF_ERROR(scope.Exit());
    return static_cast<char*>(p);
  }

 private:
  struct CopyBack {
    cuda::StridedCopyArgs args;
    bool gradient;  // the projected gradient (else the snapshot slice)
  };

  // Copies each strided gradient, and its snapshot slice unless that is
  // row-major already, into scratch memory in row-major order; the list the
  // passes then read (with_strided_) names the copies.
  base::Status CopyStridedIn(const std::vector<cuda::TensorRef>& tensors, const std::vector<StridedTensor>& strided,
                             cudaStream_t stream) {
    const int p_bytes = passes_->snapshot_type() == cuda::ElemType::kF32 ? 4 : 2;
    std::size_t bytes = 0;
    for (const StridedTensor& t : strided) {
      if (t.ndim > cuda::kMaxStridedDims) {
        return base::Status::Unimplemented("a gradient of " + std::to_string(t.ndim) +
                                           " dimensions that is not dense in its snapshot's layout; the GPU path "
                                           "copies such gradients with up to " +
                                           std::to_string(cuda::kMaxStridedDims));
      }
      bytes += AlignUp(static_cast<std::size_t>(t.n) * static_cast<std::size_t>(cuda::ElemSize(t.gt)));
      if (!t.p_row_major) bytes += AlignUp(static_cast<std::size_t>(t.n) * static_cast<std::size_t>(p_bytes));
    }
    GAC_RETURN_IF_ERROR(ReserveScratch(bytes, stream));
    with_strided_ = tensors;
    char* next = static_cast<char*>(scratch_);
    std::int64_t row_major[cuda::kMaxStridedDims];
    for (const StridedTensor& t : strided) {
      std::int64_t stride = 1;
      for (int d = t.ndim - 1; d >= 0; --d) {
        row_major[d] = stride;
        stride *= std::max<std::int64_t>(t.sizes[d], 1);
      }
      const int g_bytes = cuda::ElemSize(t.gt);
      cuda::TensorRef ref;
      ref.g = next;
      ref.n = t.n;
      ref.gt = t.gt;
      ref.segment = t.segment;
      ref.counted = t.counted;
      next += AlignUp(static_cast<std::size_t>(t.n) * static_cast<std::size_t>(g_bytes));
      GAC_RETURN_IF_ERROR(passes_->EnqueueStridedCopy(CopyArgs(t, t.g, ref.g, t.g_strides, row_major, g_bytes), stream));
      copy_back_.push_back(CopyBack{CopyArgs(t, ref.g, t.g, row_major, t.g_strides, g_bytes), true});
      if (t.p_row_major) {
        ref.p = t.p;
      } else {
        ref.p = next;
        next += AlignUp(static_cast<std::size_t>(t.n) * static_cast<std::size_t>(p_bytes));
        GAC_RETURN_IF_ERROR(
            passes_->EnqueueStridedCopy(CopyArgs(t, t.p, ref.p, t.p_strides, row_major, p_bytes), stream));
        copy_back_.push_back(CopyBack{CopyArgs(t, ref.p, t.p, row_major, t.p_strides, p_bytes), false});
      }
      with_strided_.push_back(ref);
    }
    return base::Status::Ok();
  }

  base::Status ReserveScratch(std::size_t bytes, cudaStream_t stream) {
    if (bytes <= scratch_bytes_) return base::Status::Ok();
    // Work enqueued earlier may still use the old buffer.
    cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return CudaStatus("cudaStreamSynchronize", e);
    (void)cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    e = cudaMalloc(&scratch_, bytes);
    if (e != cudaSuccess) return CudaStatus("cudaMalloc of the strided gradients' scratch", e);
    scratch_bytes_ = bytes;
    return base::Status::Ok();
  }

  const int device_;
  const std::unique_ptr<cuda::MultiTensorPasses> passes_;
  void* snapshot_ = nullptr;
  void* scratch_ = nullptr;  // the strided tensors' row-major copies
  std::size_t scratch_bytes_ = 0;
  std::vector<cuda::TensorRef> with_strided_;  // the step's list with the copies appended
  std::vector<CopyBack> copy_back_;            // the step's copies back, after Apply's pass
};

}  // namespace

base::StatusOr<std::unique_ptr<DevicePasses>> CreateCudaPasses(int device, bool bf16_snapshot, int num_groups) {
  if (device < 0) return base::Status::InvalidArgument("CUDA passes need a CUDA device ordinal");
  DeviceScope scope;
  GAC_RETURN_IF_ERROR(scope.Enter(device));
  base::StatusOr<std::unique_ptr<cuda::MultiTensorPasses>> passes =
      cuda::MultiTensorPasses::Create(bf16_snapshot ? cuda::ElemType::kBF16 : cuda::ElemType::kF32, num_groups);
  if (!passes.ok()) return passes.status();
  GAC_RETURN_IF_ERROR(scope.Exit());
  return std::unique_ptr<DevicePasses>(new CudaDevicePasses(device, std::move(*passes)));
}

}  // namespace gac::agent
