#include "agent/src/cuda/cuda_util.h"

#include <utility>

namespace gac::agent::cuda {

namespace {

// The driver's current-context calls, reached through the runtime (which
// loads libcuda itself): CUresult cuCtxGetCurrent(CUcontext*) and
// cuCtxSetCurrent(CUcontext). Absent where the runtime cannot give them.
struct ContextCalls {
  int (*get)(void**) = nullptr;
  int (*set)(void*) = nullptr;
};

const ContextCalls& Contexts() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess ||
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return c;
    }
    c.get = reinterpret_cast<int (*)(void**)>(get);
    c.set = reinterpret_cast<int (*)(void*)>(set);
    return c;
  }();
  return calls;
}

// Whether the calling thread has a current context; true when unknown (then
// the previous device is set back, as a runtime-only caller would).
bool ThreadHasContext() {
  const ContextCalls& c = Contexts();
  if (c.get == nullptr || c.set == nullptr) return true;
  void* context = nullptr;
  return c.get(&context) != 0 || context != nullptr;
}

}  // namespace

base::Status CudaStatus(const std::string& what, cudaError_t e) {
  (void)cudaGetLastError();  // the error is reported here; a later check should not see it again
  if (e == cudaErrorInsufficientDriver) {
    int driver = 0;
    if (cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0) {
      return base::Status::Unavailable(what + ": no NVIDIA driver found (libcuda.so.1 does not load)");
    }
  }
  std::string msg = what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  switch (e) {
    case cudaErrorMemoryAllocation: return base::Status(base::StatusCode::kResourceExhausted, std::move(msg));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable: return base::Status::Unavailable(std::move(msg));
    // A GPU the kernels carry no image for, or PTX newer than the driver.
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return base::Status::Unimplemented(msg + ": gac's kernels do not run on this GPU (python -m gac)");
    default: return base::Status::Internal(std::move(msg));
  }
}

base::Status DeviceScope::Enter(int device) {
  int current = -1;
  cudaError_t e = cudaGetDevice(&current);
  if (e != cudaSuccess) return CudaStatus("cudaGetDevice", e);
  if (current == device) return base::Status::Ok();
  const bool had_context = ThreadHasContext();
  e = cudaSetDevice(device);
  if (e != cudaSuccess) return CudaStatus("selecting CUDA device " + std::to_string(device), e);
  previous_ = current;
  restore_ = had_context ? Restore::kDevice : Restore::kNoContext;
  return base::Status::Ok();
}

base::Status DeviceScope::Exit() {
  const Restore restore = std::exchange(restore_, Restore::kNothing);
  if (restore == Restore::kDevice) {
    const cudaError_t e = cudaSetDevice(previous_);
    if (e != cudaSuccess) return CudaStatus("setting CUDA device " + std::to_string(previous_) + " back", e);
  } else if (restore == Restore::kNoContext) {
    const int r = Contexts().set(nullptr);
    if (r != 0) return base::Status::Internal("cuCtxSetCurrent(NULL) failed: CUresult " + std::to_string(r));
  }
  return base::Status::Ok();
}

base::Status CheckNotCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t e = cudaStreamIsCapturing(stream, &status);
  if (e == cudaErrorStreamCaptureImplicit) {
    (void)cudaGetLastError();
    return base::Status::FailedPrecondition(
        "another CUDA stream is capturing a graph, which the legacy default stream would join; call the agent's "
        "step outside the captured region");
  }
  if (e != cudaSuccess) return CudaStatus("cudaStreamIsCapturing", e);
  if (status == cudaStreamCaptureStatusActive) {
    return base::Status::FailedPrecondition(
        "the CUDA stream is capturing a graph: a step reads its statistics back once, a wait a graph cannot "
        "hold; call the agent's step outside the captured region");
  }
  if (status == cudaStreamCaptureStatusInvalidated) {
    return base::Status::FailedPrecondition("the CUDA stream's graph capture was invalidated; end it first");
  }
  return base::Status::Ok();
}

}  // namespace gac::agent::cuda
