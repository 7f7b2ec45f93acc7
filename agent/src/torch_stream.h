// The current CUDA stream of a device, as LibTorch tracks it, for the core's
// device passes; null (the default stream) without a CUDA build of LibTorch.
#ifndef GAC_AGENT_SRC_TORCH_STREAM_H_
#define GAC_AGENT_SRC_TORCH_STREAM_H_

namespace gac::agent {

void* CurrentCudaStream(int device_index);

}  // namespace gac::agent

#endif  // GAC_AGENT_SRC_TORCH_STREAM_H_
