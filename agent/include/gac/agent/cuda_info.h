// What the agent's CUDA passes carry (the runtime, the architectures of their
// kernels) and what they find on this machine (the driver, the GPUs, and
// whether the kernels run on each): for `python -m gac` and bug reports.
// No LibTorch. Thread-safe; nothing here fails or throws: an absent driver or
// GPU is an answer.
#ifndef GAC_AGENT_CUDA_INFO_H_
#define GAC_AGENT_CUDA_INFO_H_

#include <string>
#include <vector>

namespace gac::agent {

struct CudaBuildInfo {
  bool kernels = false;         // built with the CUDA passes (gac::agent_cuda)
  int runtime_version = 0;      // the CUDA runtime built against: 12090 for 12.9; 0 without the passes
  bool static_runtime = false;  // that runtime is linked in (the wheel)
  std::string compiler;         // of the kernels: "NVRTC 12.9", "nvcc 13.2.86"
  int compiler_version = 0;     // its CUDA release, 12090: what a driver needs to compile its PTX
  std::vector<std::string> archs;  // the kernels' images: "sm_80" (cubin), "compute_120" (PTX)
};

CudaBuildInfo GetCudaBuildInfo();

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int major = 0;  // compute capability
  int minor = 0;
  std::string image;  // the image of the kernels that runs on it (ImageFor); "" none
};

struct CudaEnvironment {
  int driver_version = 0;  // cudaDriverGetVersion: 12080 for 12.8; 0 without a driver
  std::string error;       // why no device was listed; "" when the runtime answered
  std::vector<CudaDeviceInfo> devices;
};

// Asks the CUDA runtime for the driver and the devices (no context is
// created). Without the CUDA passes, `error` says so.
CudaEnvironment QueryCudaEnvironment();

// The image of `archs` (CudaBuildInfo::archs) that the driver runs on a GPU of
// compute capability major.minor: the cubin of its major version with the
// largest minor version not above its own; else, when `ptx_jit` (the driver
// is at least as new as the kernels' compiler), the PTX of the largest
// architecture not above its own, compiled by the driver; "" when none.
// Architecture-specific cubins ("sm_90a") run on their own architecture only.
std::string ImageFor(const std::vector<std::string>& archs, int major, int minor, bool ptx_jit);

}  // namespace gac::agent

#endif  // GAC_AGENT_CUDA_INFO_H_
