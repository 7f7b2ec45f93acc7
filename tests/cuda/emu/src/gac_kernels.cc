// gac's kernels on the emulator: the translation unit that build_fatbin.py
// hands NVRTC for the wheel (both .cu files, device code only under
// __CUDACC_RTC__), compiled by the host compiler with gac_cuda_emu/device.h
// force-included (CMakeLists.txt), and each extern "C" kernel described for
// the registry: its name, its parameters' types (from its declaration) and
// its __launch_bounds__, restated here from the sources' constants. A kernel
// added to the sources needs its line here: without it kernel_library.cc's
// cudaLibraryGetKernel fails with cudaErrorSymbolNotFound, and so does every
// launch.
#include "agent/src/cuda/stats_kernels.cu"
#include "agent/src/cuda/apply_kernels.cu"

#include "src/gac_kernels.h"

namespace gac::agent::cuda {

// What kernel_library.cc loads with cudaLibraryLoadData. The emulator's
// library holds every registered kernel, whatever the bytes.
extern const unsigned char kKernelFatbin[] = "gac_cuda_emu kernels";
extern const std::size_t kKernelFatbinSize = sizeof(kKernelFatbin);

}  // namespace gac::agent::cuda

namespace gac_cuda_emu::internal {

std::vector<KernelInfo> GacKernels() {
  using gac::agent::cuda::kBlockThreads;
  using gac::agent::cuda::kFinalizeThreads;
  namespace k = gac::agent::cuda::kernels;
#define GAC_EMU_KERNEL(name, bound) DescribeKernel(#name, &k::name, bound)
  return {
      GAC_EMU_KERNEL(gac_stats_f32_inline, kBlockThreads),
      GAC_EMU_KERNEL(gac_stats_f32_device, kBlockThreads),
      GAC_EMU_KERNEL(gac_stats_bf16_inline, kBlockThreads),
      GAC_EMU_KERNEL(gac_stats_bf16_device, kBlockThreads),
      GAC_EMU_KERNEL(gac_project_f32_inline, kBlockThreads),
      GAC_EMU_KERNEL(gac_project_f32_device, kBlockThreads),
      GAC_EMU_KERNEL(gac_project_bf16_inline, kBlockThreads),
      GAC_EMU_KERNEL(gac_project_bf16_device, kBlockThreads),
      GAC_EMU_KERNEL(gac_snapshot_f32_inline, kBlockThreads),
      GAC_EMU_KERNEL(gac_snapshot_f32_device, kBlockThreads),
      GAC_EMU_KERNEL(gac_snapshot_bf16_inline, kBlockThreads),
      GAC_EMU_KERNEL(gac_snapshot_bf16_device, kBlockThreads),
      GAC_EMU_KERNEL(gac_finalize, kFinalizeThreads),
      GAC_EMU_KERNEL(gac_strided_copy, kBlockThreads),
  };
#undef GAC_EMU_KERNEL
}

}  // namespace gac_cuda_emu::internal
