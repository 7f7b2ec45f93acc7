// The emulator's state and the helpers that the CUDA runtime stand-in
// (runtime.cc) and the NCCL one (nccl.cc) share. One mutex, Runtime::mu,
// guards all of it: every entry point holds it for its whole call, the work
// that the call waits for included, so the members carry no annotations
// (the stream work is closures, which clang's analysis cannot follow).
#ifndef GAC_CUDA_EMU_SRC_RUNTIME_H_
#define GAC_CUDA_EMU_SRC_RUNTIME_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_runtime_api.h"
#include "gac/base/mutex.h"
#include "gac_cuda_emu/control.h"
#include "nccl.h"

namespace gac_cuda_emu::internal {

// One enqueued operation. `after` are the positions of other streams it
// waits for (an event wait, the legacy stream's implicit ordering), run
// first. An error from `run` becomes its device's sticky error.
struct Op {
  std::uint64_t seq = 0;
  std::vector<std::pair<CUstream_st*, std::uint64_t>> after;
  std::function<cudaError_t()> run;
};

}  // namespace gac_cuda_emu::internal

// The handle types of cuda_runtime_api.h and nccl.h. A destroyed object
// stays (destroyed = true) until Reset(), so that its address is never
// handed out again and a stale handle is told apart from a live one.
struct CUstream_st {
  int device = 0;
  bool legacy = false;
  bool blocking = true;
  bool destroyed = false;
  bool running = false;       // its work is being run (a cycle would be a bug here)
  std::uint64_t enqueued = 0; // operations enqueued; the k-th has seq k
  std::uint64_t done = 0;     // operations run
  std::deque<gac_cuda_emu::internal::Op> queue;
  std::uint64_t not_ready_at = 0;  // `enqueued` when cudaStreamQuery last said cudaErrorNotReady
  bool capturing = false;
  bool capture_invalidated = false;
  std::uint64_t capture_id = 0;
};

struct CUevent_st {
  int device = 0;
  unsigned int flags = 0;
  bool destroyed = false;
  CUstream_st* stream = nullptr;  // the last record (null: never recorded)
  std::uint64_t seq = 0;          // its position in `stream`
  std::uint64_t capture_id = 0;   // non-zero: it was recorded into that capture
  bool answered_not_ready = false;
  bool timed = false;  // the record has run, at `time`
  std::chrono::steady_clock::time_point time;
};

// A device's primary context (what cuCtxGetCurrent returns).
struct CUctx_st {
  int device = 0;
};
struct CUlib_st {
  bool destroyed = false;
};
struct CUgraph_st {
  bool destroyed = false;
};
struct ncclComm {
  int device = 0;
  bool destroyed = false;
};

namespace gac_cuda_emu::internal {

// Device memory and pinned host memory.
struct Allocation {
  std::size_t size = 0;
  int device = 0;
  bool pinned = false;
  std::size_t mapped_bytes = 0;  // non-zero: an mmap of that many bytes (the guard page included)
};

struct Device {
  std::unique_ptr<CUctx_st> context;  // the primary context, once created
  cudaError_t sticky = cudaSuccess;
  CUstream_st* legacy = nullptr;      // created with the context
  std::vector<CUstream_st*> streams;  // live, in creation order, the legacy one first
  std::size_t allocated = 0;          // device bytes
};

struct Fault {
  Call call;
  cudaError_t error;
  int remaining;
};
struct KernelFault {
  std::string kernel;
  cudaError_t error;
  int remaining;
};
struct NcclFault {
  ncclResult_t result;
  int remaining;
};

// The host thread's runtime state; reset lazily after Reset().
struct ThreadState {
  std::uint64_t generation = 0;
  int context = -1;  // the device whose primary context is current; -1: none
  cudaError_t last_error = cudaSuccess;
};

class Runtime {
 public:
  static Runtime& Get();

  // Guards every other member (and the thread's ThreadState).
  gac::base::Mutex mu;

  ThreadState& Thread();
  // The error a call fails with before doing anything: no driver or device,
  // an injected fault.
  cudaError_t Begin();
  cudaError_t Begin(Call call);
  // Records `e` as the thread's last error (when it is one) and returns it.
  cudaError_t Return(cudaError_t e);

  // The current device: the current context's, 0 without one (as
  // cudaGetDevice says).
  int Selected();
  // For a call that needs a context: makes the current device's primary
  // context current (creating it) and returns the device, and its sticky
  // error if it has one; cudaErrorInvalidDevice past the device count.
  cudaError_t Bind(int* device);
  // Device d, its primary context created if it has none.
  Device& Context(int d);
  Device& device(int d) { return devices[static_cast<std::size_t>(d)]; }
  // A stream handle (0 and cudaStreamLegacy: the current device's legacy
  // stream). For enqueueing, the stream must be of the current device (then
  // bound as for Bind()).
  // Returns the stream's device's sticky error, if any.
  cudaError_t Resolve(cudaStream_t handle, bool enqueue, CUstream_st** stream);
  cudaError_t Resolve(cudaEvent_t handle, CUevent_st** event);

  // Appends work to `s` (nothing while s captures: *seq = 0).
  cudaError_t Enqueue(CUstream_st* s, std::function<cudaError_t()> run,
                      std::vector<std::pair<CUstream_st*, std::uint64_t>> after, std::uint64_t* seq);
  // Runs s's work up to its operation `seq`; returns the device's sticky error.
  cudaError_t RunUntil(CUstream_st* s, std::uint64_t seq);
  cudaError_t SynchronizeDevice(int d);
  // cudaErrorStreamCaptureUnsupported, invalidating the capture, when s (or
  // any stream of device d) captures.
  cudaError_t ForbidCapture(CUstream_st* s);
  cudaError_t ForbidCapture(int d);

  // The allocation that holds address p, or null.
  const Allocation* Find(const void* p, std::uintptr_t* base);
  // [p, p + bytes) lies in one device allocation.
  bool IsDeviceRange(const void* p, std::size_t bytes);

  // Settings.
  int num_devices = 1;
  std::size_t memory_bytes = std::size_t{64} << 30;
  Driver driver = Driver::kPresent;
  int driver_version = 12090;
  unsigned char fill = 0xFF;

  std::uint64_t generation = 1;  // bumped by Reset()
  std::vector<Device> devices;
  std::map<std::uintptr_t, Allocation> allocations;  // by base address
  std::unordered_map<const void*, std::unique_ptr<CUstream_st>> streams;
  std::unordered_map<const void*, std::unique_ptr<CUevent_st>> events;
  std::unordered_map<const void*, std::unique_ptr<CUlib_st>> libraries;
  std::unordered_map<const void*, std::unique_ptr<CUgraph_st>> graphs;
  std::unordered_map<const void*, std::unique_ptr<ncclComm>> comms;
  std::uint64_t next_capture_id = 1;

  std::vector<Fault> faults;
  std::vector<KernelFault> kernel_faults;
  std::vector<NcclFault> nccl_faults;
  BlockFilter block_filter;
  std::map<std::string, std::uint64_t> launches;
  std::map<std::string, std::uint64_t> blocks_run;
  std::string last_kernel_failure;

  // Registered kernels: never reset (kernel_library.cc keeps their handles
  // for the process). A deque: the handles are their addresses.
  std::deque<KernelInfo> kernels;

  void ResetState();

 private:
  Runtime();
};

}  // namespace gac_cuda_emu::internal

#endif  // GAC_CUDA_EMU_SRC_RUNTIME_H_
