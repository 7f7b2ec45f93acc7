// gac_cuda_emu: a host emulation of CUDA, so that gac's kernels and the host
// code that drives them run in every test run, on machines without a GPU
// and under the sanitizers. The stand-in headers (cuda_runtime_api.h,
// cuda_runtime.h, cuda_fp16.h, cuda/std/*, nccl.h) replace the toolkit's;
// the kernels' sources (agent/src/cuda/*.cu) are compiled unmodified by the
// host compiler, as device code only (__CUDACC_RTC__, as NVRTC compiles them
// for the wheel), and launched by name as kernel_library.cc launches them.
// This header is the tests' control over the emulator.
//
// What is emulated:
//  - Threads. Every thread of a block runs its own copy of the kernel, on a
//    fiber of the host thread that runs the stream's work; the threads of a
//    block run in turn (thread 0 first) until each reaches a barrier or
//    exits; blocks run one after the other (x, then y, then z), so the
//    static storage that __shared__ becomes serves every block.
//    __syncthreads() completes when every thread of the block waits at a
//    __syncthreads(); __shfl_xor_sync() when all 32 lanes of the warp wait
//    at one with the same lane mask and width (mask 0xFFFFFFFF only). A
//    block that cannot go on (a thread waits at a barrier that another
//    thread has left by exiting, or waits at a different kind of barrier;
//    a warp of fewer than 32 threads shuffles) fails its launch: the error
//    goes to stderr and LastKernelFailure(), naming the kernel and block,
//    and the device's work fails from then on with cudaErrorLaunchFailure,
//    sticky, as after a GPU fault. Stricter than the hardware, on which such
//    a barrier may complete: CUDA leaves it undefined.
//    The arithmetic is the host's IEEE fp32 and fp64, no flush to zero, as
//    NVRTC compiles without fast math; fmaf is fused.
//  - Launches: the parameters are copied at cudaLaunchKernel; at most 4096
//    bytes of them (cudaErrorInvalidValue), at most 1024 threads per block
//    and no empty grid (cudaErrorInvalidConfiguration), no more threads than
//    the kernel's __launch_bounds__ (cudaErrorInvalidValue).
//  - Streams are ordered queues that run only when something waits for
//    them: cudaStreamSynchronize, cudaEventSynchronize (up to the event's
//    record), cudaDeviceSynchronize, cudaMemcpy, cudaMemset, cudaFree,
//    cudaFreeHost, a second query, or a stream that reaches a
//    cudaStreamWaitEvent on that work. So a host write into a buffer that an
//    enqueued copy still reads is what the copy sees, and a read of a result
//    before the wait sees the old value. cudaMemcpyAsync from pageable host
//    memory copies the source at the call, to pageable memory it waits for
//    the copy, as the CUDA runtime does; pinned memory (cudaMallocHost) is
//    read and written when the copy runs. The legacy default stream (0,
//    cudaStreamLegacy) waits for the device's blocking streams and they for
//    it; cudaStreamNonBlocking streams do not. A query of unfinished work
//    answers cudaErrorNotReady once, the next query runs the work.
//  - Devices and contexts: SetDeviceCount() devices ("gac emulated GPU",
//    compute capability 9.0), each with a primary context that
//    cudaSetDevice() or the first call that needs the device creates
//    (ContextCreated() tells). A host thread's current device is that of its
//    current context, 0 without one, so cudaGetDevice() creates none; a call
//    that needs a context makes the current device's current. The driver's
//    cuCtxGetCurrent and cuCtxSetCurrent (cudaGetDriverEntryPointByVersion)
//    read and set the thread's context; cuCtxSetCurrent(NULL) leaves it
//    without one. A stream belongs to the device current at its creation;
//    work enqueued on it while another device is current fails with
//    cudaErrorInvalidResourceHandle. Destroyed or unknown streams, events,
//    libraries and graphs: cudaErrorInvalidResourceHandle (communicators:
//    ncclInvalidArgument).
//  - Memory: host memory, 256-byte aligned, tracked with its size and
//    device. Below 1 GiB it comes from the heap, filled with
//    SetAllocationFill()'s byte (0xFF: NaN in fp32, bf16 and fp16, so that
//    reading memory nothing wrote shows), and AddressSanitizer sees overruns
//    past its exact size; from 1 GiB on it is mapped MAP_NORESERVE and reads
//    as zero, so a test can describe a 4 GiB tensor and touch a window of
//    it. Copies and memsets check that device ranges lie inside one
//    allocation (cudaErrorInvalidValue). cudaMemGetInfo counts the
//    allocations against SetDeviceMemory().
//  - Stream capture records that a stream captures and discards its work.
//    While it captures, cudaStreamSynchronize of it, cudaEventSynchronize or
//    cudaEventQuery of an event recorded in it, and the device-wide waits
//    (cudaDeviceSynchronize, cudaMemcpy, cudaMemset, cudaFree, cudaFreeHost)
//    fail with cudaErrorStreamCaptureUnsupported and invalidate the capture,
//    which cudaStreamEndCapture then reports (cudaErrorStreamCaptureInvalidated);
//    a captured wait on an event recorded outside the capture fails with
//    cudaErrorStreamCaptureIsolation, work on the legacy stream while a
//    blocking stream captures with cudaErrorStreamCaptureImplicit (and so
//    does cudaStreamIsCapturing of the legacy stream). The capture modes are
//    not told apart; cudaMalloc is allowed.
//  - Errors: cudaGetLastError()/cudaPeekAtLastError() per host thread, the
//    CUDA names and messages; SetDriver() without a driver (every call
//    fails with cudaErrorInsufficientDriver, cudaDriverGetVersion says 0)
//    or without a device (cudaErrorNoDevice); injected faults (InjectFault).
//  - NCCL: communicators of one rank, whose all-reduce is a stream-ordered
//    copy.
//
// What is not: a memory model (an emulated thread's writes are visible to
// the others at once; blocks never run concurrently, so races between
// blocks, or within a warp between barriers, go unseen); warp-synchronous
// code without shuffles (the lanes of a warp do not run in lock step);
// shuffles with partial masks, other warp intrinsics, atomics, dynamic
// shared memory (cudaErrorNotSupported), cooperative launches; the
// compiler's contraction of a * b + c into a fused multiply-add (nvcc's and
// NVRTC's default; gac's kernels call fmaf where they fuse); cudaMemset's
// asynchrony (CUDA's may return before it is done; here it is done);
// graphs (captured work is discarded), cross-stream capture, peer access,
// memory pools, cudaStreamPerThread; NCCL with more than one rank.
//
// Thread safety: any host thread may call the runtime; one mutex serializes
// the calls, and the work a call waits for runs on the calling thread
// (fibers of its own). The control functions below take the same mutex. A
// block filter runs under it and must not call the runtime.
#ifndef GAC_CUDA_EMU_CONTROL_H_
#define GAC_CUDA_EMU_CONTROL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "cuda_runtime_api.h"
#include "gac_cuda_emu/kernel.h"
#include "nccl.h"

namespace gac_cuda_emu {

// Back to the start: one device with 64 GiB, a CUDA 12.9 driver, fill 0xFF,
// no contexts, allocations, streams, events, libraries or communicators
// (all freed; their handles become unknown), no faults, counters, block
// filter or sticky error; every thread's current device 0 and last error
// cudaSuccess. Registered kernels stay.
void Reset();

void SetDeviceCount(int count);           // default 1
void SetDeviceMemory(std::size_t bytes);  // what cudaMemGetInfo reports as total; default 64 GiB
enum class Driver {
  kPresent,   // SetDeviceCount() devices
  kMissing,   // no driver: cudaErrorInsufficientDriver everywhere
  kNoDevice,  // a driver without a GPU: cudaErrorNoDevice everywhere
};
void SetDriver(Driver driver);
void SetDriverVersion(int version);  // cudaDriverGetVersion; default 12090
// The byte that fills new heap allocations (device and pinned); default 0xFF.
void SetAllocationFill(unsigned char byte);

// Whether `device`'s primary context was created since Reset().
bool ContextCreated(int device);

// Kernel launches accepted by cudaLaunchKernel (captured ones included), and
// blocks run, by kernel name, since Reset().
std::uint64_t LaunchCount(const std::string& kernel);
std::uint64_t BlocksRun(const std::string& kernel);
// Operations enqueued on any stream and not run yet.
std::size_t PendingOperations();
// Allocations (device and pinned) not freed yet.
std::size_t LiveAllocations();
// The last kernel failure's message ("" if none since Reset()).
std::string LastKernelFailure();

// Runtime calls that InjectFault can fail.
enum class Call {
  kSetDevice,
  kGetDevice,
  kGetDeviceCount,
  kMalloc,
  kMallocHost,
  kFree,
  kMemcpy,
  kMemcpyAsync,
  kMemset,
  kMemsetAsync,
  kStreamCreate,
  kStreamSynchronize,
  kStreamWaitEvent,
  kEventCreate,
  kEventRecord,
  kEventSynchronize,
  kDeviceSynchronize,
  kLibraryLoadData,
  kLibraryGetKernel,
  kLaunchKernel,
};
// The nth call of `call` from now on (1: the next) returns `error` and does
// nothing else (the thread's last error is set, nothing becomes sticky).
void InjectFault(Call call, cudaError_t error, int nth = 1);
// The nth launch of `kernel` from now on is accepted, and fails when it
// runs: its blocks do not run and the device's error becomes `error`,
// sticky (e.g. cudaErrorIllegalAddress).
void InjectKernelFault(const std::string& kernel, cudaError_t error, int nth = 1);
// The nth ncclAllReduce from now on returns `result` and enqueues nothing.
void InjectNcclFault(ncclResult_t result, int nth = 1);
void ClearFaults();

// Which blocks run: blocks for which run_block(kernel name, blockIdx.x) is
// false are skipped (their threads never start). Null runs every block. For
// tests that describe more memory than they touch: simulate the indexing,
// not the memory.
using BlockFilter = std::function<bool(const std::string& kernel, unsigned int block_x)>;
void SetBlockFilter(BlockFilter run_block);

}  // namespace gac_cuda_emu

#endif  // GAC_CUDA_EMU_CONTROL_H_
