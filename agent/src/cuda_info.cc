#include "gac/agent/cuda_info.h"

#ifdef GAC_AGENT_CUDA
#include <cuda_runtime_api.h>
#endif

#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>

namespace gac::agent {

namespace {

struct Arch {
  bool cubin = false;   // sm_XY, else compute_XY (PTX)
  int number = 0;       // 10 * major + minor
  bool exact = false;   // an architecture-specific ("a") or family ("f") image
};

// "sm_86" -> {cubin, 86}; false for anything else ("native", ...).
bool ParseArch(const std::string& name, Arch* arch) {
  const bool cubin = name.rfind("sm_", 0) == 0;
  if (!cubin && name.rfind("compute_", 0) != 0) return false;
  const char* digits = name.c_str() + (cubin ? 3 : 8);
  char* end = nullptr;
  const long number = std::strtol(digits, &end, 10);
  if (end == digits || number < 10) return false;
  *arch = Arch{cubin, static_cast<int>(number), *end != '\0'};
  return true;
}

}  // namespace

std::string ImageFor(const std::vector<std::string>& archs, int major, int minor, bool ptx_jit) {
  const int device = 10 * major + minor;
  const std::string* cubin = nullptr;
  const std::string* ptx = nullptr;
  int best_cubin = -1;
  int best_ptx = -1;
  for (const std::string& name : archs) {
    Arch a;
    if (!ParseArch(name, &a)) continue;
    if (a.cubin) {
      const bool runs = a.exact ? a.number == device : a.number / 10 == major && a.number % 10 <= minor;
      if (runs && a.number > best_cubin) {
        best_cubin = a.number;
        cubin = &name;
      }
    } else if (ptx_jit && !a.exact && a.number <= device && a.number > best_ptx) {
      best_ptx = a.number;
      ptx = &name;
    }
  }
  if (cubin != nullptr) return *cubin;
  return ptx != nullptr ? *ptx : "";
}

CudaBuildInfo GetCudaBuildInfo() {
  CudaBuildInfo info;
#ifdef GAC_AGENT_CUDA
  info.kernels = true;
  info.runtime_version = CUDART_VERSION;
#ifdef GAC_CUDA_STATIC_RUNTIME
  info.static_runtime = true;
#endif
  info.compiler = GAC_CUDA_KERNEL_COMPILER;
  info.compiler_version = GAC_CUDA_KERNEL_TOOLKIT;
  std::istringstream names(GAC_CUDA_ARCH_NAMES);
  for (std::string name; std::getline(names, name, ',');) {
    if (!name.empty()) info.archs.push_back(name);
  }
#endif
  return info;
}

CudaEnvironment QueryCudaEnvironment() {
  CudaEnvironment env;
#ifdef GAC_AGENT_CUDA
  // 0 and success without a driver.
  if (cudaDriverGetVersion(&env.driver_version) != cudaSuccess) env.driver_version = 0;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // Without libcuda at all the runtime says the driver is too old, which
    // reads as "upgrade it".
    env.error = e == cudaErrorInsufficientDriver && env.driver_version == 0
                    ? "no NVIDIA driver found (libcuda.so.1 does not load)"
                    : std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    (void)cudaGetLastError();
    return env;
  }
  const CudaBuildInfo build = GetCudaBuildInfo();
  const bool ptx_jit = env.driver_version >= build.compiler_version;
  for (int i = 0; i < count; ++i) {
    CudaDeviceInfo d;
    d.index = i;
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, i);
    if (e != cudaSuccess) {
      d.name = std::string("(") + cudaGetErrorName(e) + ")";
      (void)cudaGetLastError();
    } else {
      d.name = prop.name;
      d.major = prop.major;
      d.minor = prop.minor;
      d.image = ImageFor(build.archs, d.major, d.minor, ptx_jit);
    }
    env.devices.push_back(std::move(d));
  }
#else
  env.error = "gac was built without its CUDA kernels";
#endif
  return env;
}

}  // namespace gac::agent
