// Launchers of the CUDA passes' kernels, one call = one launch. Between the
// host code (cuda_passes.cc, C++ compiler) and the kernels (*.cu, nvcc).
// `table` is the inline table to pass in the kernel arguments, or null to
// read `device_table`. Each returns cudaGetLastError() after its launch.
#ifndef GAC_AGENT_SRC_CUDA_KERNELS_H_
#define GAC_AGENT_SRC_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include "agent/src/cuda/multi_tensor.h"

namespace gac::agent::cuda::kernels {

// Statistics of every chunk into args.partials[chunk] (args.flag: read p;
// otherwise only |g|^2). pt: the snapshot type, kF32 or kBF16.
cudaError_t LaunchStats(ElemType pt, const InlineTable* table, const DeviceTable& device_table, const PassArgs& args,
                        int num_chunks, cudaStream_t stream);

// Sums partials[0, num_chunks) in fp64 into out[0, ResultSize(num_segments))
// (see multi_tensor.h). num_chunks may be 0 (all sums zero).
cudaError_t LaunchFinalize(const ChunkPartial* partials, int num_chunks, int num_segments, double* out,
                           cudaStream_t stream);

// g <- g - args.coeff * p; p <- (args.flag ? the new g : the old g).
cudaError_t LaunchProjectSnapshot(ElemType pt, const InlineTable* table, const DeviceTable& device_table,
                                  const PassArgs& args, int num_chunks, cudaStream_t stream);

// p <- g, converted with round-to-nearest-even.
cudaError_t LaunchSnapshot(ElemType pt, const InlineTable* table, const DeviceTable& device_table, const PassArgs& args,
                           int num_chunks, cudaStream_t stream);

// The element-by-element copy of StridedCopyArgs (args.n > 0).
cudaError_t LaunchStridedCopy(const StridedCopyArgs& args, cudaStream_t stream);

}  // namespace gac::agent::cuda::kernels

#endif  // GAC_AGENT_SRC_CUDA_KERNELS_H_
