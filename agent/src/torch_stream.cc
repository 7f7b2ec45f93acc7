#include "agent/src/torch_stream.h"

#ifdef GAC_AGENT_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace gac::agent {

void* CurrentCudaStream(int device_index) {
#ifdef GAC_AGENT_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)).stream();
#else
  (void)device_index;
  return nullptr;
#endif
}

}  // namespace gac::agent
