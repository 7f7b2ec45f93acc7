// The emulated GPU threads: runs a launch's blocks on the calling host
// thread (gac_cuda_emu/control.h states the model).
#ifndef GAC_CUDA_EMU_SRC_EXECUTOR_H_
#define GAC_CUDA_EMU_SRC_EXECUTOR_H_

#include <cstdint>
#include <string>

#include "gac_cuda_emu/control.h"
#include "gac_cuda_emu/kernel.h"

namespace gac_cuda_emu::internal {

// Runs the blocks of a launch that `run_block` (null: all) lets run, one
// after the other, every thread of a block on a fiber. Returns "" or why
// the launch failed, naming the kernel and block; *blocks_run counts the
// blocks started.
std::string RunKernel(const KernelInfo& kernel, const BoundKernel& params, dim3 grid, dim3 block,
                      const BlockFilter& run_block, std::uint64_t* blocks_run);

}  // namespace gac_cuda_emu::internal

#endif  // GAC_CUDA_EMU_SRC_EXECUTOR_H_
