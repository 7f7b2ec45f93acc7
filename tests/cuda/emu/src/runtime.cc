// The CUDA runtime API of cuda_runtime_api.h on the host, and the control
// API of gac_cuda_emu/control.h (which states the semantics).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "src/executor.h"
#include "src/gac_kernels.h"
#include "src/runtime.h"

namespace gac_cuda_emu::internal {
namespace {

constexpr std::size_t kMapThreshold = std::size_t{1} << 30;
constexpr std::size_t kAlignment = 256;
constexpr std::size_t kMaxParamBytes = 4096;

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorUnsupportedPtxVersion, "cudaErrorUnsupportedPtxVersion",
     "the provided PTX was compiled with an unsupported toolchain."},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not initiated in this stream"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* FindError(cudaError_t e) {
  for (const ErrorText& t : kErrors) {
    if (t.code == e) return &t;
  }
  return nullptr;
}

thread_local ThreadState tls_state;

// Runs `body` with the runtime locked and records its error as the
// thread's last.
template <typename Body>
cudaError_t Api(Body&& body) {
  Runtime& rt = Runtime::Get();
  gac::base::MutexLock lock(&rt.mu);
  return rt.Return(body(rt));
}

// Host memory for an allocation (see control.h): null when there is none.
void* AllocateHost(std::size_t size, unsigned char fill, std::size_t* mapped_bytes) {
  *mapped_bytes = 0;
  if (size >= kMapThreshold) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = (size + page - 1) / page * page + page;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    mprotect(static_cast<char*>(p) + bytes - page, page, PROT_NONE);  // an overrun faults
    *mapped_bytes = bytes;
    return p;
  }
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, size) != 0) return nullptr;
  std::memset(p, fill, size);
  return p;
}

void FreeHost(void* p, const Allocation& a) {
  if (a.mapped_bytes != 0) {
    munmap(p, a.mapped_bytes);
  } else {
    std::free(p);
  }
}

bool Dead(const CUstream_st* s) { return s == nullptr || s->destroyed; }

}  // namespace

Runtime& Runtime::Get() {
  static Runtime* runtime = new Runtime();  // never destroyed: used until the process ends
  return *runtime;
}

Runtime::Runtime() {
  for (const KernelInfo& k : GacKernels()) kernels.push_back(k);
  ResetState();
}

void Runtime::ResetState() {
  for (auto& [base, a] : allocations) FreeHost(reinterpret_cast<void*>(base), a);
  allocations.clear();
  streams.clear();
  events.clear();
  libraries.clear();
  graphs.clear();
  comms.clear();
  num_devices = 1;
  memory_bytes = std::size_t{64} << 30;
  driver = Driver::kPresent;
  driver_version = 12090;
  fill = 0xFF;
  devices.clear();
  devices.resize(static_cast<std::size_t>(num_devices));
  next_capture_id = 1;
  faults.clear();
  kernel_faults.clear();
  nccl_faults.clear();
  block_filter = nullptr;
  launches.clear();
  blocks_run.clear();
  last_kernel_failure.clear();
  ++generation;
}

ThreadState& Runtime::Thread() {
  if (tls_state.generation != generation) tls_state = ThreadState{generation, -1, cudaSuccess};
  return tls_state;
}

cudaError_t Runtime::Begin() {
  switch (driver) {
    case Driver::kMissing: return cudaErrorInsufficientDriver;
    case Driver::kNoDevice: return cudaErrorNoDevice;
    case Driver::kPresent: break;
  }
  return cudaSuccess;
}

cudaError_t Runtime::Begin(Call call) {
  if (const cudaError_t e = Begin(); e != cudaSuccess) return e;
  for (auto it = faults.begin(); it != faults.end(); ++it) {
    if (it->call == call && --it->remaining == 0) {
      const cudaError_t e = it->error;
      faults.erase(it);
      return e;
    }
  }
  return cudaSuccess;
}

cudaError_t Runtime::Return(cudaError_t e) {
  if (e != cudaSuccess) Thread().last_error = e;
  return e;
}

int Runtime::Selected() { return std::max(Thread().context, 0); }

cudaError_t Runtime::Bind(int* device) {
  *device = Selected();
  if (*device >= num_devices) return cudaErrorInvalidDevice;
  Thread().context = *device;
  return Context(*device).sticky;
}

Device& Runtime::Context(int d) {
  Device& dev = device(d);
  if (!dev.context) {
    dev.context = std::make_unique<CUctx_st>();
    dev.context->device = d;
    auto s = std::make_unique<CUstream_st>();
    s->device = d;
    s->legacy = true;
    dev.legacy = s.get();
    dev.streams.insert(dev.streams.begin(), s.get());
    streams.emplace(s.get(), std::move(s));
  }
  return dev;
}

cudaError_t Runtime::Resolve(cudaStream_t handle, bool enqueue, CUstream_st** stream) {
  int current = 0;
  CUstream_st* s = nullptr;
  if (handle == nullptr || handle == cudaStreamLegacy) {
    if (const cudaError_t e = Bind(&current); e != cudaSuccess) return e;
    s = device(current).legacy;
  } else {
    const auto it = streams.find(handle);
    if (it == streams.end() || it->second->legacy || Dead(it->second.get())) return cudaErrorInvalidResourceHandle;
    s = it->second.get();
    if (enqueue) {
      if (const cudaError_t e = Bind(&current); e != cudaSuccess) return e;
      if (s->device != current) return cudaErrorInvalidResourceHandle;
    }
  }
  *stream = s;
  return device(s->device).sticky;
}

cudaError_t Runtime::Resolve(cudaEvent_t handle, CUevent_st** event) {
  const auto it = events.find(handle);
  if (it == events.end() || it->second->destroyed) return cudaErrorInvalidResourceHandle;
  *event = it->second.get();
  return cudaSuccess;
}

cudaError_t Runtime::Enqueue(CUstream_st* s, std::function<cudaError_t()> run,
                             std::vector<std::pair<CUstream_st*, std::uint64_t>> after, std::uint64_t* seq) {
  *seq = 0;
  if (s->capturing) return cudaSuccess;  // discarded
  Device& dev = device(s->device);
  // The legacy stream and the blocking streams wait for each other's work.
  if (s->legacy) {
    for (CUstream_st* b : dev.streams) {
      if (b == s || !b->blocking) continue;
      if (b->capturing) {
        b->capture_invalidated = true;
        return cudaErrorStreamCaptureImplicit;
      }
      if (b->enqueued > b->done) after.emplace_back(b, b->enqueued);
    }
  } else if (s->blocking && dev.legacy->enqueued > dev.legacy->done) {
    after.emplace_back(dev.legacy, dev.legacy->enqueued);
  }
  s->queue.push_back(Op{++s->enqueued, std::move(after), std::move(run)});
  *seq = s->enqueued;
  return cudaSuccess;
}

cudaError_t Runtime::RunUntil(CUstream_st* s, std::uint64_t seq) {
  Device& dev = device(s->device);
  if (s->done >= seq) return dev.sticky;
  if (s->running) {
    std::fprintf(stderr, "gac_cuda_emu: internal error: a cycle between streams\n");
    std::abort();
  }
  s->running = true;
  while (s->done < seq) {
    Op op = std::move(s->queue.front());
    s->queue.pop_front();
    for (const auto& [other, other_seq] : op.after) RunUntil(other, other_seq);
    if (dev.sticky == cudaSuccess) {
      const cudaError_t e = op.run();
      if (e != cudaSuccess) dev.sticky = e;
    }
    ++s->done;
  }
  s->running = false;
  return dev.sticky;
}

cudaError_t Runtime::SynchronizeDevice(int d) {
  Device& dev = device(d);
  for (CUstream_st* s : dev.streams) RunUntil(s, s->enqueued);
  return dev.sticky;
}

cudaError_t Runtime::ForbidCapture(CUstream_st* s) {
  if (!s->capturing) return cudaSuccess;
  s->capture_invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

cudaError_t Runtime::ForbidCapture(int d) {
  cudaError_t e = cudaSuccess;
  for (CUstream_st* s : device(d).streams) {
    if (ForbidCapture(s) != cudaSuccess) e = cudaErrorStreamCaptureUnsupported;
  }
  return e;
}

const Allocation* Runtime::Find(const void* p, std::uintptr_t* base) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return nullptr;
  --it;
  if (address >= it->first + it->second.size) return nullptr;
  *base = it->first;
  return &it->second;
}

bool Runtime::IsDeviceRange(const void* p, std::size_t bytes) {
  std::uintptr_t base = 0;
  const Allocation* a = Find(p, &base);
  return a != nullptr && !a->pinned && bytes <= a->size &&
         reinterpret_cast<std::uintptr_t>(p) - base <= a->size - bytes;
}

namespace {

// Where one side of a copy lies.
enum class Memory { kDevice, kPinned, kPageable };

// Where [p, p + bytes) lies; false when it overruns its allocation.
bool Locate(Runtime& rt, const void* p, std::size_t bytes, Memory* memory) {
  std::uintptr_t base = 0;
  const Allocation* a = rt.Find(p, &base);
  if (a == nullptr) {
    *memory = Memory::kPageable;
    return p != nullptr;
  }
  *memory = a->pinned ? Memory::kPinned : Memory::kDevice;
  return bytes <= a->size && reinterpret_cast<std::uintptr_t>(p) - base <= a->size - bytes;
}

// Checks a copy's two sides, and their kinds against `kind`.
cudaError_t CheckCopy(Runtime& rt, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                      Memory* dst_memory, Memory* src_memory) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
  if (!Locate(rt, dst, bytes, dst_memory) || !Locate(rt, src, bytes, src_memory)) return cudaErrorInvalidValue;
  if (kind == cudaMemcpyDefault) return cudaSuccess;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((*dst_memory == Memory::kDevice) != dst_device || (*src_memory == Memory::kDevice) != src_device) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

// A copy as stream work. A staged source is read now, as the CUDA runtime
// stages pageable memory at the call.
std::function<cudaError_t()> CopyOp(void* dst, const void* src, std::size_t bytes, bool stage_source) {
  if (stage_source) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                                static_cast<const unsigned char*>(src) + bytes);
    return [dst, staged] {
      std::memcpy(dst, staged->data(), staged->size());
      return cudaSuccess;
    };
  }
  return [dst, src, bytes] {
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  };
}

const KernelInfo* FindKernel(Runtime& rt, const void* handle) {
  for (const KernelInfo& k : rt.kernels) {
    if (static_cast<const void*>(&k) == handle) return &k;
  }
  return nullptr;
}

cudaError_t CheckLaunch(const KernelInfo& k, dim3 grid, dim3 block, void** args, std::size_t shared_mem) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
      grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535 || block.x > 1024 || block.y > 1024 ||
      block.z > 64) {
    return cudaErrorInvalidConfiguration;
  }
  const std::uint64_t threads = std::uint64_t{block.x} * block.y * block.z;
  if (threads > 1024) return cudaErrorInvalidConfiguration;
  if (threads > static_cast<std::uint64_t>(k.max_threads)) return cudaErrorInvalidValue;
  if (shared_mem != 0) return cudaErrorNotSupported;  // no extern __shared__ here
  if (k.param_bytes > kMaxParamBytes || (k.param_bytes > 0 && args == nullptr)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

// The driver's cuCtxGetCurrent and cuCtxSetCurrent, as the runtime hands them
// out (CUresult 0: success, 1: CUDA_ERROR_INVALID_VALUE, 201:
// CUDA_ERROR_INVALID_CONTEXT).
int CtxGetCurrent(void** context) {
  Runtime& rt = Runtime::Get();
  gac::base::MutexLock lock(&rt.mu);
  if (context == nullptr) return 1;
  const int d = rt.Thread().context;
  *context = d >= 0 ? rt.device(d).context.get() : nullptr;
  return 0;
}

int CtxSetCurrent(void* context) {
  Runtime& rt = Runtime::Get();
  gac::base::MutexLock lock(&rt.mu);
  if (context == nullptr) {
    rt.Thread().context = -1;
    return 0;
  }
  for (const Device& dev : rt.devices) {
    if (dev.context.get() == context) {
      rt.Thread().context = dev.context->device;
      return 0;
    }
  }
  return 201;
}

// The event was last recorded into a capture that is still going on.
bool Captured(const CUevent_st* ev) {
  return ev->capture_id != 0 && ev->stream->capturing && ev->stream->capture_id == ev->capture_id;
}

// cudaMemset (`wait`: on the legacy stream, waited for) and cudaMemsetAsync.
cudaError_t Memset(Runtime& rt, Call call, void* ptr, int value, std::size_t count, cudaStream_t stream,
                   bool wait) {
  CUstream_st* s = nullptr;
  cudaError_t e = rt.Begin(call);
  if (e == cudaSuccess) e = rt.Resolve(stream, true, &s);
  if (e != cudaSuccess || count == 0) return e;
  if (!rt.IsDeviceRange(ptr, count)) return cudaErrorInvalidValue;
  if (wait && (e = rt.ForbidCapture(s->device)) != cudaSuccess) return e;
  std::uint64_t seq = 0;
  e = rt.Enqueue(
      s,
      [ptr, value, count] {
        std::memset(ptr, value, count);
        return cudaSuccess;
      },
      {}, &seq);
  return e == cudaSuccess && wait ? rt.RunUntil(s, seq) : e;
}

// The thread's last error; a sticky error of its device comes first and
// stays.
cudaError_t LastError(bool clear) {
  Runtime& rt = Runtime::Get();
  gac::base::MutexLock lock(&rt.mu);
  const int d = rt.Selected();
  if (d < rt.num_devices && rt.device(d).sticky != cudaSuccess) {
    return rt.device(d).sticky;
  }
  return clear ? std::exchange(rt.Thread().last_error, cudaSuccess) : rt.Thread().last_error;
}

}  // namespace
}  // namespace gac_cuda_emu::internal

using gac_cuda_emu::Call;
using gac_cuda_emu::Driver;
using gac_cuda_emu::KernelInfo;
using gac_cuda_emu::BoundKernel;
using gac_cuda_emu::internal::AllocateHost;
using gac_cuda_emu::internal::Allocation;
using gac_cuda_emu::internal::Api;
using gac_cuda_emu::internal::Captured;
using gac_cuda_emu::internal::CheckCopy;
using gac_cuda_emu::internal::CheckLaunch;
using gac_cuda_emu::internal::CopyOp;
using gac_cuda_emu::internal::CtxGetCurrent;
using gac_cuda_emu::internal::CtxSetCurrent;
using gac_cuda_emu::internal::Device;
using gac_cuda_emu::internal::FindError;
using gac_cuda_emu::internal::FindKernel;
using gac_cuda_emu::internal::FreeHost;
using gac_cuda_emu::internal::LastError;
using gac_cuda_emu::internal::Memory;
using gac_cuda_emu::internal::Memset;
using gac_cuda_emu::internal::RunKernel;
using gac_cuda_emu::internal::Runtime;

extern "C" {

cudaError_t cudaGetLastError(void) { return LastError(true); }

cudaError_t cudaPeekAtLastError(void) { return LastError(false); }

const char* cudaGetErrorName(cudaError_t error) {
  const auto* t = FindError(error);
  return t != nullptr ? t->name : "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  const auto* t = FindError(error);
  return t != nullptr ? t->text : "unrecognized error code";
}

cudaError_t cudaDriverGetVersion(int* version) {
  return Api([&](Runtime& rt) {
    if (version == nullptr) return cudaErrorInvalidValue;
    *version = rt.driver == Driver::kMissing ? 0 : rt.driver_version;
    return cudaSuccess;
  });
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return cudaErrorInvalidValue;
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  return Api([&](Runtime& rt) {
    if (const cudaError_t e = rt.Begin(); e != cudaSuccess) return e;
    if (symbol == nullptr || function == nullptr) return cudaErrorInvalidValue;
    *function = nullptr;
    if (std::strcmp(symbol, "cuCtxGetCurrent") == 0) *function = reinterpret_cast<void*>(&CtxGetCurrent);
    if (std::strcmp(symbol, "cuCtxSetCurrent") == 0) *function = reinterpret_cast<void*>(&CtxSetCurrent);
    if (status != nullptr) {
      *status = *function != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    }
    return cudaSuccess;
  });
}

cudaError_t cudaGetDeviceCount(int* count) {
  return Api([&](Runtime& rt) {
    if (count == nullptr) return cudaErrorInvalidValue;
    *count = 0;
    if (const cudaError_t e = rt.Begin(Call::kGetDeviceCount); e != cudaSuccess) return e;
    *count = rt.num_devices;
    return cudaSuccess;
  });
}

cudaError_t cudaGetDevice(int* device) {
  return Api([&](Runtime& rt) {
    if (const cudaError_t e = rt.Begin(Call::kGetDevice); e != cudaSuccess) return e;
    if (device == nullptr) return cudaErrorInvalidValue;
    *device = rt.Selected();
    return cudaSuccess;
  });
}

cudaError_t cudaSetDevice(int device) {
  return Api([&](Runtime& rt) {
    if (const cudaError_t e = rt.Begin(Call::kSetDevice); e != cudaSuccess) return e;
    if (device < 0 || device >= rt.num_devices) return cudaErrorInvalidDevice;
    rt.Context(device);  // CUDA 12: cudaSetDevice initializes the primary context
    rt.Thread().context = device;
    return cudaSuccess;
  });
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  return Api([&](Runtime& rt) {
    if (const cudaError_t e = rt.Begin(); e != cudaSuccess) return e;
    if (prop == nullptr) return cudaErrorInvalidValue;
    if (device < 0 || device >= rt.num_devices) return cudaErrorInvalidDevice;
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof prop->name, "gac emulated GPU");
    prop->totalGlobalMem = rt.memory_bytes;
    prop->sharedMemPerBlock = 48 << 10;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7FFFFFFF;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->pciBusID = device;
    return cudaSuccess;
  });
}

cudaError_t cudaDeviceSynchronize(void) {
  return Api([&](Runtime& rt) {
    int d = 0;
    cudaError_t e = rt.Begin(Call::kDeviceSynchronize);
    if (e == cudaSuccess) e = rt.Bind(&d);
    if (e != cudaSuccess) return e;
    if (e = rt.ForbidCapture(d); e != cudaSuccess) return e;
    return rt.SynchronizeDevice(d);
  });
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  return Api([&](Runtime& rt) {
    int d = 0;
    cudaError_t e = rt.Begin();
    if (e == cudaSuccess) e = rt.Bind(&d);
    if (e != cudaSuccess) return e;
    if (free == nullptr || total == nullptr) return cudaErrorInvalidValue;
    const Device& dev = rt.device(d);
    *total = rt.memory_bytes;
    *free = rt.memory_bytes - std::min(rt.memory_bytes, dev.allocated);
    return cudaSuccess;
  });
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  return Api([&](Runtime& rt) {
    int d = 0;
    cudaError_t e = rt.Begin(Call::kMalloc);
    if (e == cudaSuccess) e = rt.Bind(&d);
    if (e != cudaSuccess) return e;
    if (ptr == nullptr) return cudaErrorInvalidValue;
    *ptr = nullptr;
    Device& dev = rt.device(d);
    if (size == 0) return cudaSuccess;
    if (size > rt.memory_bytes - std::min(rt.memory_bytes, dev.allocated)) return cudaErrorMemoryAllocation;
    Allocation a{size, d, false, 0};
    void* p = AllocateHost(size, rt.fill, &a.mapped_bytes);
    if (p == nullptr) return cudaErrorMemoryAllocation;
    rt.allocations.emplace(reinterpret_cast<std::uintptr_t>(p), a);
    dev.allocated += size;
    *ptr = p;
    return cudaSuccess;
  });
}

cudaError_t cudaFree(void* ptr) {
  return Api([&](Runtime& rt) {
    int d = 0;
    cudaError_t e = rt.Begin(Call::kFree);
    if (e == cudaSuccess) e = rt.Bind(&d);
    if (e != cudaSuccess) return e;
    if (ptr == nullptr) return cudaSuccess;  // cudaFree(0): the idiom that creates the context
    const auto it = rt.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == rt.allocations.end() || it->second.pinned) return cudaErrorInvalidValue;
    const Allocation a = it->second;
    // It waits for the device, so no enqueued work still uses the memory.
    if (e = rt.ForbidCapture(a.device); e != cudaSuccess) return e;
    if (e = rt.SynchronizeDevice(a.device); e != cudaSuccess) return e;
    FreeHost(ptr, a);
    rt.device(a.device).allocated -= a.size;
    rt.allocations.erase(it);
    return cudaSuccess;
  });
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return Api([&](Runtime& rt) {
    int d = 0;
    cudaError_t e = rt.Begin(Call::kMallocHost);
    if (e == cudaSuccess) e = rt.Bind(&d);
    if (e != cudaSuccess) return e;
    if (ptr == nullptr) return cudaErrorInvalidValue;
    *ptr = nullptr;
    if (size == 0) return cudaSuccess;
    Allocation a{size, d, true, 0};
    void* p = AllocateHost(size, rt.fill, &a.mapped_bytes);
    if (p == nullptr) return cudaErrorMemoryAllocation;
    rt.allocations.emplace(reinterpret_cast<std::uintptr_t>(p), a);
    *ptr = p;
    return cudaSuccess;
  });
}

cudaError_t cudaFreeHost(void* ptr) {
  return Api([&](Runtime& rt) {
    if (const cudaError_t e = rt.Begin(); e != cudaSuccess) return e;
    if (ptr == nullptr) return cudaSuccess;
    const auto it = rt.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == rt.allocations.end() || !it->second.pinned) return cudaErrorInvalidValue;
    // Any device's copies may still use it: wait for them all.
    cudaError_t e = cudaSuccess;
    for (int d = 0; d < rt.num_devices; ++d) {
      if (rt.ForbidCapture(d) != cudaSuccess) e = cudaErrorStreamCaptureUnsupported;
    }
    if (e != cudaSuccess) return e;
    for (int d = 0; d < rt.num_devices; ++d) rt.SynchronizeDevice(d);
    FreeHost(ptr, it->second);
    rt.allocations.erase(it);
    return cudaSuccess;
  });
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    cudaError_t e = rt.Begin(Call::kMemcpy);
    if (e == cudaSuccess) e = rt.Resolve(nullptr, true, &s);
    if (e != cudaSuccess || count == 0) return e;
    Memory dst_memory, src_memory;
    if (e = CheckCopy(rt, dst, src, count, kind, &dst_memory, &src_memory); e != cudaSuccess) return e;
    if (e = rt.ForbidCapture(s->device); e != cudaSuccess) return e;
    // On the legacy stream, waited for at once.
    std::uint64_t seq = 0;
    e = rt.Enqueue(s, CopyOp(dst, src, count, false), {}, &seq);
    return e != cudaSuccess ? e : rt.RunUntil(s, seq);
  });
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    cudaError_t e = rt.Begin(Call::kMemcpyAsync);
    if (e == cudaSuccess) e = rt.Resolve(stream, true, &s);
    if (e != cudaSuccess || count == 0) return e;
    Memory dst_memory, src_memory;
    if (e = CheckCopy(rt, dst, src, count, kind, &dst_memory, &src_memory); e != cudaSuccess) return e;
    std::uint64_t seq = 0;
    e = rt.Enqueue(s, CopyOp(dst, src, count, src_memory == Memory::kPageable), {}, &seq);
    // Into pageable memory the call returns after the copy, as CUDA's does.
    if (e == cudaSuccess && seq != 0 && dst_memory == Memory::kPageable) e = rt.RunUntil(s, seq);
    return e;
  });
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  return Api([&](Runtime& rt) { return Memset(rt, Call::kMemset, ptr, value, count, nullptr, true); });
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  return Api([&](Runtime& rt) { return Memset(rt, Call::kMemsetAsync, ptr, value, count, stream, false); });
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return Api([&](Runtime& rt) {
    int d = 0;
    cudaError_t e = rt.Begin(Call::kStreamCreate);
    if (e == cudaSuccess) e = rt.Bind(&d);
    if (e != cudaSuccess) return e;
    if (stream == nullptr || (flags & ~static_cast<unsigned int>(cudaStreamNonBlocking)) != 0) {
      return cudaErrorInvalidValue;
    }
    Device& dev = rt.device(d);
    auto s = std::make_unique<CUstream_st>();
    s->device = d;
    s->blocking = (flags & cudaStreamNonBlocking) == 0;
    *stream = s.get();
    dev.streams.push_back(s.get());
    rt.streams.emplace(s.get(), std::move(s));
    return cudaSuccess;
  });
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    cudaError_t e = rt.Begin();
    if (e == cudaSuccess && (stream == nullptr || stream == cudaStreamLegacy)) e = cudaErrorInvalidResourceHandle;
    if (e == cudaSuccess) e = rt.Resolve(stream, false, &s);
    if (s == nullptr) return e;
    // Its work still completes (here: now), and a capture ends.
    s->capturing = false;
    rt.RunUntil(s, s->enqueued);
    s->destroyed = true;
    auto& list = rt.device(s->device).streams;
    list.erase(std::find(list.begin(), list.end(), s));
    return cudaSuccess;
  });
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    cudaError_t e = rt.Begin(Call::kStreamSynchronize);
    if (e == cudaSuccess) e = rt.Resolve(stream, false, &s);
    if (e != cudaSuccess) return e;
    if (e = rt.ForbidCapture(s); e != cudaSuccess) return e;
    if (s->legacy && (e = rt.ForbidCapture(s->device)) != cudaSuccess) return e;
    return rt.RunUntil(s, s->enqueued);
  });
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    cudaError_t e = rt.Begin();
    if (e == cudaSuccess) e = rt.Resolve(stream, false, &s);
    if (e != cudaSuccess) return e;
    if (e = rt.ForbidCapture(s); e != cudaSuccess) return e;
    if (s->done == s->enqueued) return cudaSuccess;
    if (s->not_ready_at != s->enqueued) {
      s->not_ready_at = s->enqueued;
      return cudaErrorNotReady;
    }
    return rt.RunUntil(s, s->enqueued);
  });
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    CUevent_st* ev = nullptr;
    cudaError_t e = rt.Begin(Call::kStreamWaitEvent);
    if (e == cudaSuccess) e = rt.Resolve(stream, true, &s);
    if (e == cudaSuccess) e = rt.Resolve(event, &ev);
    if (e != cudaSuccess) return e;
    if (flags != 0) return cudaErrorInvalidValue;
    if (ev->capture_id != 0 && ev->stream->capturing && ev->stream->capture_id == ev->capture_id) {
      if (s->capturing && s->capture_id == ev->capture_id) return cudaSuccess;  // within the capture
      // Joining a capture from another stream is not emulated.
      ev->stream->capture_invalidated = true;
      return cudaErrorNotSupported;
    }
    if (s->capturing) {
      if (ev->stream == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
      s->capture_invalidated = true;
      return cudaErrorStreamCaptureIsolation;
    }
    std::vector<std::pair<CUstream_st*, std::uint64_t>> after;
    if (ev->stream != nullptr && ev->capture_id == 0) after.emplace_back(ev->stream, ev->seq);
    std::uint64_t seq = 0;
    return rt.Enqueue(
        s, [] { return cudaSuccess; }, std::move(after), &seq);
  });
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  return Api([&](Runtime& rt) {
    int d = 0;
    cudaError_t e = rt.Begin(Call::kEventCreate);
    if (e == cudaSuccess) e = rt.Bind(&d);
    if (e != cudaSuccess) return e;
    if (event == nullptr ||
        (flags & ~static_cast<unsigned int>(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))) {
      return cudaErrorInvalidValue;
    }
    auto ev = std::make_unique<CUevent_st>();
    ev->device = d;
    ev->flags = flags;
    *event = ev.get();
    rt.events.emplace(ev.get(), std::move(ev));
    return cudaSuccess;
  });
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  return Api([&](Runtime& rt) {
    CUevent_st* ev = nullptr;
    cudaError_t e = rt.Begin();
    if (e == cudaSuccess) e = rt.Resolve(event, &ev);
    if (e != cudaSuccess) return e;
    ev->destroyed = true;  // a pending record still runs, harmlessly
    return cudaSuccess;
  });
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    CUevent_st* ev = nullptr;
    cudaError_t e = rt.Begin(Call::kEventRecord);
    if (e == cudaSuccess) e = rt.Resolve(stream, true, &s);
    if (e == cudaSuccess) e = rt.Resolve(event, &ev);
    if (e != cudaSuccess) return e;
    if (ev->device != s->device) return cudaErrorInvalidResourceHandle;
    const std::uint64_t seq = s->enqueued + 1;
    std::uint64_t enqueued = 0;
    e = rt.Enqueue(
        s,
        [ev, s, seq] {
          if (ev->stream == s && ev->seq == seq) {
            ev->timed = true;
            ev->time = std::chrono::steady_clock::now();
          }
          return cudaSuccess;
        },
        {}, &enqueued);
    if (e != cudaSuccess) return e;
    ev->stream = s;
    ev->seq = enqueued;
    ev->capture_id = s->capturing ? s->capture_id : 0;
    ev->answered_not_ready = false;
    ev->timed = false;
    return cudaSuccess;
  });
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return Api([&](Runtime& rt) {
    CUevent_st* ev = nullptr;
    cudaError_t e = rt.Begin(Call::kEventSynchronize);
    if (e == cudaSuccess) e = rt.Resolve(event, &ev);
    if (e != cudaSuccess) return e;
    if (ev->stream == nullptr || ev->capture_id != 0) {
      return Captured(ev) ? rt.ForbidCapture(ev->stream) : cudaSuccess;
    }
    return rt.RunUntil(ev->stream, ev->seq);
  });
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  return Api([&](Runtime& rt) {
    CUevent_st* ev = nullptr;
    cudaError_t e = rt.Begin();
    if (e == cudaSuccess) e = rt.Resolve(event, &ev);
    if (e != cudaSuccess) return e;
    if (ev->stream == nullptr || ev->capture_id != 0) {
      return Captured(ev) ? rt.ForbidCapture(ev->stream) : cudaSuccess;
    }
    if (ev->stream->done >= ev->seq) return rt.device(ev->stream->device).sticky;
    if (!ev->answered_not_ready) {
      ev->answered_not_ready = true;
      return cudaErrorNotReady;
    }
    return rt.RunUntil(ev->stream, ev->seq);
  });
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  return Api([&](Runtime& rt) {
    CUevent_st* a = nullptr;
    CUevent_st* b = nullptr;
    cudaError_t e = rt.Begin();
    if (e == cudaSuccess) e = rt.Resolve(start, &a);
    if (e == cudaSuccess) e = rt.Resolve(end, &b);
    if (e != cudaSuccess) return e;
    if (ms == nullptr) return cudaErrorInvalidValue;
    if (((a->flags | b->flags) & cudaEventDisableTiming) != 0 || a->stream == nullptr || b->stream == nullptr) {
      return cudaErrorInvalidResourceHandle;
    }
    if (!a->timed || !b->timed) return cudaErrorNotReady;
    *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
    return cudaSuccess;
  });
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    cudaError_t e = rt.Begin();
    if (e == cudaSuccess) e = rt.Resolve(stream, true, &s);
    if (e != cudaSuccess) return e;
    if (s->legacy) return cudaErrorStreamCaptureUnsupported;
    if (s->capturing) return cudaErrorIllegalState;
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed) {
      return cudaErrorInvalidValue;
    }
    s->capturing = true;
    s->capture_invalidated = false;
    s->capture_id = rt.next_capture_id++;
    return cudaSuccess;
  });
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    cudaError_t e = rt.Begin();
    if (e == cudaSuccess) e = rt.Resolve(stream, false, &s);
    if (e != cudaSuccess) return e;
    if (graph == nullptr) return cudaErrorInvalidValue;
    *graph = nullptr;
    if (!s->capturing) return cudaErrorIllegalState;
    s->capturing = false;
    if (s->capture_invalidated) return cudaErrorStreamCaptureInvalidated;
    auto g = std::make_unique<CUgraph_st>();
    *graph = g.get();
    rt.graphs.emplace(g.get(), std::move(g));
    return cudaSuccess;
  });
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return cudaStreamGetCaptureInfo(stream, status, nullptr);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status, unsigned long long* id) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    cudaError_t e = rt.Begin();
    if (e == cudaSuccess) e = rt.Resolve(stream, false, &s);
    if (e != cudaSuccess) return e;
    if (status == nullptr) return cudaErrorInvalidValue;
    if (s->legacy) {
      // Work on it would have to join a blocking stream's capture.
      for (const CUstream_st* b : rt.device(s->device).streams) {
        if (b->blocking && b->capturing) return cudaErrorStreamCaptureImplicit;
      }
    }
    *status = !s->capturing              ? cudaStreamCaptureStatusNone
              : s->capture_invalidated ? cudaStreamCaptureStatusInvalidated
                                       : cudaStreamCaptureStatusActive;
    if (id != nullptr) *id = s->capturing ? s->capture_id : 0;
    return cudaSuccess;
  });
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  return Api([&](Runtime& rt) {
    const auto it = rt.graphs.find(graph);
    if (it == rt.graphs.end() || it->second->destroyed) return cudaErrorInvalidResourceHandle;
    it->second->destroyed = true;
    return cudaSuccess;
  });
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t* library, const void* code, cudaJitOption*, void**, unsigned int,
                                cudaLibraryOption*, void**, unsigned int) {
  return Api([&](Runtime& rt) {
    if (const cudaError_t e = rt.Begin(Call::kLibraryLoadData); e != cudaSuccess) return e;
    if (library == nullptr || code == nullptr) return cudaErrorInvalidValue;
    // The emulator's library holds every registered kernel, whatever the image.
    auto lib = std::make_unique<CUlib_st>();
    *library = lib.get();
    rt.libraries.emplace(lib.get(), std::move(lib));
    return cudaSuccess;
  });
}

cudaError_t cudaLibraryUnload(cudaLibrary_t library) {
  return Api([&](Runtime& rt) {
    const auto it = rt.libraries.find(library);
    if (it == rt.libraries.end() || it->second->destroyed) return cudaErrorInvalidResourceHandle;
    it->second->destroyed = true;
    return cudaSuccess;
  });
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t* kernel, cudaLibrary_t library, const char* name) {
  return Api([&](Runtime& rt) {
    if (const cudaError_t e = rt.Begin(Call::kLibraryGetKernel); e != cudaSuccess) return e;
    if (kernel == nullptr || name == nullptr) return cudaErrorInvalidValue;
    const auto it = rt.libraries.find(library);
    if (it == rt.libraries.end() || it->second->destroyed) return cudaErrorInvalidResourceHandle;
    for (gac_cuda_emu::KernelInfo& k : rt.kernels) {
      if (std::strcmp(k.name, name) == 0) {
        *kernel = reinterpret_cast<cudaKernel_t>(&k);
        return cudaSuccess;
      }
    }
    return cudaErrorSymbolNotFound;
  });
}

cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared_mem,
                             cudaStream_t stream) {
  return Api([&](Runtime& rt) {
    CUstream_st* s = nullptr;
    cudaError_t e = rt.Begin(Call::kLaunchKernel);
    if (e != cudaSuccess) return e;
    const gac_cuda_emu::KernelInfo* k = FindKernel(rt, func);
    if (k == nullptr) return cudaErrorInvalidDeviceFunction;
    if (e = CheckLaunch(*k, grid, block, args, shared_mem); e != cudaSuccess) return e;
    if (e = rt.Resolve(stream, true, &s); e != cudaSuccess) return e;
    // The parameters are copied now, as the CUDA runtime copies them.
    std::shared_ptr<const gac_cuda_emu::BoundKernel> bound = k->bind(k->function, args);
    cudaError_t fault = cudaSuccess;
    for (auto it = rt.kernel_faults.begin(); it != rt.kernel_faults.end(); ++it) {
      if (it->kernel == k->name && --it->remaining == 0) {
        fault = it->error;
        rt.kernel_faults.erase(it);
        break;
      }
    }
    std::uint64_t seq = 0;
    e = rt.Enqueue(
        s,
        [&rt, k, bound, grid, block, fault]() -> cudaError_t {
          if (fault != cudaSuccess) return fault;
          std::uint64_t blocks = 0;
          std::string failure = RunKernel(*k, *bound, grid, block, rt.block_filter, &blocks);
          rt.blocks_run[k->name] += blocks;
          if (failure.empty()) return cudaSuccess;
          std::fprintf(stderr, "gac_cuda_emu: %s\n", failure.c_str());
          rt.last_kernel_failure = std::move(failure);
          return cudaErrorLaunchFailure;
        },
        {}, &seq);
    if (e == cudaSuccess) ++rt.launches[k->name];
    return e;
  });
}

}  // extern "C"

namespace gac_cuda_emu {

cudaKernel_t RegisterKernel(const KernelInfo& info) {
  Runtime& rt = Runtime::Get();
  gac::base::MutexLock lock(&rt.mu);
  for (KernelInfo& k : rt.kernels) {
    if (std::strcmp(k.name, info.name) != 0) continue;
    if (k.function != info.function) {
      std::fprintf(stderr, "gac_cuda_emu: two kernels named %s\n", info.name);
      std::abort();
    }
    return reinterpret_cast<cudaKernel_t>(&k);
  }
  rt.kernels.push_back(info);
  return reinterpret_cast<cudaKernel_t>(&rt.kernels.back());
}

namespace {

// Runs `f(runtime)` with the runtime locked.
template <typename F>
auto Locked(F&& f) {
  Runtime& rt = Runtime::Get();
  gac::base::MutexLock lock(&rt.mu);
  return f(rt);
}

}  // namespace

void Reset() {
  Locked([](Runtime& rt) { rt.ResetState(); });
}

void SetDeviceCount(int count) {
  Locked([&](Runtime& rt) {
    rt.num_devices = std::max(count, 0);
    rt.devices.resize(static_cast<std::size_t>(rt.num_devices));
  });
}

void SetDeviceMemory(std::size_t bytes) {
  Locked([&](Runtime& rt) { rt.memory_bytes = bytes; });
}

void SetDriver(Driver driver) {
  Locked([&](Runtime& rt) { rt.driver = driver; });
}

void SetDriverVersion(int version) {
  Locked([&](Runtime& rt) { rt.driver_version = version; });
}

void SetAllocationFill(unsigned char byte) {
  Locked([&](Runtime& rt) { rt.fill = byte; });
}

bool ContextCreated(int device) {
  return Locked([&](Runtime& rt) {
    return device >= 0 && device < rt.num_devices && rt.device(device).context;
  });
}

std::uint64_t LaunchCount(const std::string& kernel) {
  return Locked([&](Runtime& rt) {
    const auto it = rt.launches.find(kernel);
    return it == rt.launches.end() ? std::uint64_t{0} : it->second;
  });
}

std::uint64_t BlocksRun(const std::string& kernel) {
  return Locked([&](Runtime& rt) {
    const auto it = rt.blocks_run.find(kernel);
    return it == rt.blocks_run.end() ? std::uint64_t{0} : it->second;
  });
}

std::size_t PendingOperations() {
  return Locked([](Runtime& rt) {
    std::size_t n = 0;
    for (const auto& [handle, s] : rt.streams) n += s->queue.size();
    return n;
  });
}

std::size_t LiveAllocations() {
  return Locked([](Runtime& rt) { return rt.allocations.size(); });
}

std::string LastKernelFailure() {
  return Locked([](Runtime& rt) { return rt.last_kernel_failure; });
}

void InjectFault(Call call, cudaError_t error, int nth) {
  Locked([&](Runtime& rt) { rt.faults.push_back({call, error, std::max(nth, 1)}); });
}

void InjectKernelFault(const std::string& kernel, cudaError_t error, int nth) {
  Locked([&](Runtime& rt) { rt.kernel_faults.push_back({kernel, error, std::max(nth, 1)}); });
}

void InjectNcclFault(ncclResult_t result, int nth) {
  Locked([&](Runtime& rt) { rt.nccl_faults.push_back({result, std::max(nth, 1)}); });
}

void ClearFaults() {
  Locked([](Runtime& rt) {
    rt.faults.clear();
    rt.kernel_faults.clear();
    rt.nccl_faults.clear();
  });
}

void SetBlockFilter(BlockFilter run_block) {
  Locked([&](Runtime& rt) { rt.block_filter = std::move(run_block); });
}

}  // namespace gac_cuda_emu
