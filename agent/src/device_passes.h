// DevicePasses: the hook between the agent core (core.cc), which gathers the
// gradients, decides and reports, and the passes over gradients that live on
// a GPU. The CUDA implementation (cuda/cuda_device_passes.cc) is compiled
// when the CUDA kernels are (GAC_AGENT_CUDA); without it the core reports
// CUDA gradients as Unimplemented. No LibTorch: the front names the stream.
// Used from the training thread only.
#ifndef GAC_AGENT_SRC_DEVICE_PASSES_H_
#define GAC_AGENT_SRC_DEVICE_PASSES_H_

#include <memory>
#include <vector>

#include "agent/src/cuda/multi_tensor.h"
#include "gac/agent/reducer.h"
#include "gac/base/status.h"

namespace gac::agent {

// A gradient the kernels cannot read in place: not dense in its snapshot
// slice's layout (a strided view, or a layout that changed since the first
// step). The pointers stay valid until the step's Apply() returns.
struct StridedTensor {
  void* g = nullptr;
  cuda::ElemType gt = cuda::ElemType::kF32;
  void* p = nullptr;  // the snapshot slice
  std::int64_t n = 0;
  std::int32_t segment = -1;
  bool counted = true;
  int ndim = 0;
  const std::int64_t* sizes = nullptr;
  const std::int64_t* g_strides = nullptr;
  const std::int64_t* p_strides = nullptr;  // the slice's layout
  bool p_row_major = false;                 // p_strides are the row-major strides of sizes
};

class DevicePasses {
 public:
  virtual ~DevicePasses() = default;

  // Sums the statistics of `tensors` and `strided` (dot, |g|^2, |p|^2 with
  // with_p, else |g|^2 only) on the device, per segment (= parameter group)
  // too, and writes them to out[0, cuda::ResultSize(num_groups)) on the host.
  // When `reducer` can reduce device memory the sums are all-reduced there
  // first and *all_reduced is set; otherwise they are local and the caller
  // reduces. Waits for the device only for the copy of the sums. Runs on
  // `stream` (a cudaStream_t; null: the default stream).
  virtual base::Status Statistics(const std::vector<cuda::TensorRef>& tensors,
                                  const std::vector<StridedTensor>& strided, bool with_p, Reducer* reducer,
                                  double* out, bool* all_reduced, void* stream) = 0;

  // Enqueues, over the tensors of the last Statistics(): with `project`,
  // g <- g - coeff * p and p <- (snapshot_projected ? new g : old g);
  // otherwise p <- g. Does not wait.
  virtual base::Status Apply(bool project, float coeff, bool snapshot_projected, void* stream) = 0;

  // Zeroed device memory for the snapshot, freed with this object.
  virtual base::StatusOr<char*> AllocateSnapshot(std::size_t bytes) = 0;
};

#ifdef GAC_AGENT_CUDA
// Passes for gradients on CUDA device `device`, snapshots of bf16 or fp32,
// statistics per group for num_groups groups.
base::StatusOr<std::unique_ptr<DevicePasses>> CreateCudaPasses(int device, bool bf16_snapshot, int num_groups);
#endif

}  // namespace gac::agent

#endif  // GAC_AGENT_SRC_DEVICE_PASSES_H_
