// The registry entries of gac's kernels (gac_kernels.cc, the translation
// unit that compiles agent/src/cuda/*.cu).
#ifndef GAC_CUDA_EMU_SRC_GAC_KERNELS_H_
#define GAC_CUDA_EMU_SRC_GAC_KERNELS_H_

#include <vector>

#include "gac_cuda_emu/kernel.h"

namespace gac_cuda_emu::internal {

std::vector<KernelInfo> GacKernels();

}  // namespace gac_cuda_emu::internal

#endif  // GAC_CUDA_EMU_SRC_GAC_KERNELS_H_
