// What the CUDA host code of the agent shares (cuda_passes.cc,
// cuda_device_passes.cc, the NCCL reducer): CUDA errors as Status, a device
// switch that puts back exactly what it found, and the refusal of a step
// inside a CUDA graph capture. CUDA runtime only; target gac::agent_cuda.
#ifndef GAC_AGENT_SRC_CUDA_CUDA_UTIL_H_
#define GAC_AGENT_SRC_CUDA_CUDA_UTIL_H_

#include <cuda_runtime_api.h>

#include <string>

#include "gac/base/status.h"

namespace gac::agent::cuda {

// "what: cudaErrorX (its message)" with the code that says what to do:
// ResourceExhausted for memory, Unavailable without a usable driver or GPU
// ("no NVIDIA driver found" where the runtime only says the driver is too
// old), Unimplemented for a GPU the kernels carry no image for, Internal
// otherwise.
base::Status CudaStatus(const std::string& what, cudaError_t e);

// Makes a device current for a scope and then puts back what was current:
// the previous device, or no context at all when the thread had none. (A
// thread without a context reads device 0 from cudaGetDevice; setting 0
// back would create a context on GPU 0, on every rank of a job.) Nothing is
// switched when the device is current already, the usual case.
//
//   DeviceScope scope;
//   GAC_RETURN_IF_ERROR(scope.Enter(device));
//   ... work ...
//   return scope.Exit();   // or let the destructor restore, errors ignored
class DeviceScope {
 public:
  DeviceScope() = default;
  ~DeviceScope() { (void)Exit(); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  // Errors: those of cudaGetDevice and cudaSetDevice (nothing switched).
  base::Status Enter(int device);
  // Restores; idempotent.
  base::Status Exit();

 private:
  enum class Restore { kNothing, kDevice, kNoContext };
  Restore restore_ = Restore::kNothing;
  int previous_ = -1;
};

// FailedPrecondition when `stream` is capturing a CUDA graph (or a capture it
// took part in was invalidated): a step waits once for its statistics,
// which a capture cannot contain, so it is refused before anything is
// enqueued and the trainer's capture is left intact.
base::Status CheckNotCapturing(cudaStream_t stream);

}  // namespace gac::agent::cuda

#endif  // GAC_AGENT_SRC_CUDA_CUDA_UTIL_H_
