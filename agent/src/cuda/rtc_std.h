// NVRTC, which compiles the kernels of the wheel (kernel_library.cc), has no
// C++ standard library: the few std names the kernels use come from libcu++
// (CCCL's cuda::std, made for NVRTC), seen as std. Included under
// __CUDACC_RTC__ only, in place of <cstddef>, <cstdint> and <type_traits>.
#ifndef GAC_AGENT_SRC_CUDA_RTC_STD_H_
#define GAC_AGENT_SRC_CUDA_RTC_STD_H_

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>

namespace std {
using namespace ::cuda::std;
}  // namespace std

#endif  // GAC_AGENT_SRC_CUDA_RTC_STD_H_
