// The CUDA emulator (gac_cuda_emu/control.h): its execution model on toy
// kernels, the runtime's semantics (deferred streams, events, the legacy
// stream, capture, handles, contexts, faults, the block filter), and gac's
// kernels launched by name through kernel_library.cc against an fp64
// reference and bit-exact host computations, with the host code that drives
// them (MultiTensorPasses, the NCCL reducer at one rank, cuda_info.cc).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agent/src/cuda/chunk_table.h"
#include "agent/src/cuda/cuda_passes.h"
#include "agent/src/cuda/cuda_util.h"
#include "agent/src/cuda/kernels.h"
#include "gac/agent/cuda_info.h"
#include "gac/agent/nccl_reducer.h"
#include "gac_cuda_emu/control.h"
// Last: CUDA's device-side names as macros (threadIdx, __shared__, ...).
#include "gac_cuda_emu/device.h"

namespace gac_cuda_emu {
namespace {

using gac::agent::cuda::ChunkPartial;
using gac::agent::cuda::ChunkTable;
using gac::agent::cuda::DeviceTable;
using gac::agent::cuda::ElemType;
using gac::agent::cuda::InlineTable;
using gac::agent::cuda::PassArgs;
using gac::agent::cuda::TensorRef;
namespace kernels = gac::agent::cuda::kernels;

// ---- Toy kernels.

// Sums in[] over each block: a butterfly in every warp, the warps' sums
// through __shared__ storage, then warp 0's butterfly; thread 0 writes
// out[blockIdx.x].
template <typename T>
__global__ void ToyBlockSum(const T* in, T* out) {
  __shared__ T warp_sums[32];
  const unsigned int tid = threadIdx.x;
  T v = in[blockIdx.x * blockDim.x + tid];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  if (tid % 32 == 0) warp_sums[tid / 32] = v;
  __syncthreads();
  if (tid < 32) {
    v = tid < blockDim.x / 32 ? warp_sums[tid] : T(0);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if (tid == 0) out[blockIdx.x] = v;
  }
}

// Every lane's __shfl_xor_sync(lane_mask, width) of its index, in 4 types.
__global__ void ToyShuffleTypes(int lane_mask, int width, int* i, unsigned int* u, float* f, double* d) {
  const unsigned int t = threadIdx.x;
  i[t] = __shfl_xor_sync(0xFFFFFFFFu, static_cast<int>(t), lane_mask, width);
  u[t] = __shfl_xor_sync(0xFFFFFFFFu, t + 1000u, lane_mask, width);
  f[t] = __shfl_xor_sync(0xFFFFFFFFu, static_cast<float>(t) + 0.5f, lane_mask, width);
  d[t] = __shfl_xor_sync(0xFFFFFFFFu, static_cast<double>(t) + 0.25, lane_mask, width);
}

// Threads 0-15 leave before the barrier the others wait at.
__global__ void ToyEarlyExit(int* out) {
  if (threadIdx.x < 16) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// Odd lanes shuffle while even lanes wait at the block barrier.
__global__ void ToyMixedBarriers(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x % 2 == 1) {
    v = __shfl_xor_sync(0xFFFFFFFFu, v, 2);
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = v;
}

__global__ void ToyShuffleAll(int* out) { out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 1, 1); }

// A shuffle among half a warp, which the emulator does not take.
__global__ void ToyPartialMask(int* out) { out[threadIdx.x] = __shfl_xor_sync(0x0000FFFFu, 1, 1); }

struct Box {
  int value;
  char padding[60];
};
__global__ void ToyWriteParam(Box box, int* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = box.value;
}

// Thread 0 of block b writes b + 1 to out[b].
__global__ void ToyWriteBlock(int* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int>(blockIdx.x) + 1;
}

struct Huge {
  char bytes[4100];
};
__global__ void ToyHugeParam(Huge) {}

// One element past the end of `in`.
__global__ void ToyOverrun(const float* in, int n, float* out) {
  if (threadIdx.x == 0) out[0] = in[n];
}

__global__ void ToyCopy(const float* in, float* out) { out[threadIdx.x] = in[threadIdx.x]; }

// A 16-byte load 4 bytes past a 16-byte boundary.
__global__ void ToyMisalignedLoad(const float* in, float* out) {
  if (threadIdx.x == 0) out[0] = reinterpret_cast<const float4*>(in + 1)[0].x;
}

struct ToyKernels {
  cudaKernel_t sum_f64 = RegisterKernel("ToyBlockSum<double>", &ToyBlockSum<double>);
  cudaKernel_t sum_f32 = RegisterKernel("ToyBlockSum<float>", &ToyBlockSum<float>);
  cudaKernel_t shuffle_types = RegisterKernel("ToyShuffleTypes", &ToyShuffleTypes);
  cudaKernel_t early_exit = RegisterKernel("ToyEarlyExit", &ToyEarlyExit);
  cudaKernel_t mixed_barriers = RegisterKernel("ToyMixedBarriers", &ToyMixedBarriers);
  cudaKernel_t shuffle_all = RegisterKernel("ToyShuffleAll", &ToyShuffleAll);
  cudaKernel_t partial_mask = RegisterKernel("ToyPartialMask", &ToyPartialMask);
  cudaKernel_t write_param = RegisterKernel("ToyWriteParam", &ToyWriteParam);
  cudaKernel_t write_block = RegisterKernel("ToyWriteBlock", &ToyWriteBlock, 256);
  cudaKernel_t huge_param = RegisterKernel("ToyHugeParam", &ToyHugeParam);
  cudaKernel_t copy = RegisterKernel("ToyCopy", &ToyCopy);
  cudaKernel_t overrun = RegisterKernel("ToyOverrun", &ToyOverrun);
  cudaKernel_t misaligned_load = RegisterKernel("ToyMisalignedLoad", &ToyMisalignedLoad);
};
const ToyKernels& Toys() {
  static const ToyKernels toys;
  return toys;
}

// cudaLaunchKernel with the parameters' addresses.
template <typename... P>
cudaError_t Launch(cudaKernel_t kernel, dim3 grid, dim3 block, cudaStream_t stream, P... params) {
  void* args[] = {static_cast<void*>(&params)..., nullptr};
  return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, args, 0, stream);
}

// Device memory freed with the object.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  std::vector<T> Read() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  void Write(const std::vector<T>& v) {
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }

 private:
  std::size_t n_;
  T* p_ = nullptr;
};

class EmuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Toys();
    Reset();
  }
  void TearDown() override { Reset(); }
};

// ---- The execution model.

TEST_F(EmuTest, ToyReductionMatchesTheFp64Reference) {
  for (unsigned int threads : {32u, 256u, 1024u}) {
    SCOPED_TRACE(std::to_string(threads) + " threads per block");
    const unsigned int blocks = 5;
    std::vector<double> in(blocks * threads);
    std::mt19937 rng(threads);
    for (double& x : in) x = static_cast<double>(static_cast<int>(rng() % 2001) - 1000);  // exact sums
    DeviceArray<double> d_in(in.size()), d_out(blocks);
    d_in.Write(in);
    ASSERT_EQ(Launch(Toys().sum_f64, dim3(blocks), dim3(threads), nullptr, d_in.get(), d_out.get()), cudaSuccess);
    const std::vector<double> out = d_out.Read();
    std::vector<float> in_f(in.begin(), in.end());
    DeviceArray<float> f_in(in.size()), f_out(blocks);
    f_in.Write(in_f);
    ASSERT_EQ(Launch(Toys().sum_f32, dim3(blocks), dim3(threads), nullptr, f_in.get(), f_out.get()), cudaSuccess);
    const std::vector<float> out_f = f_out.Read();
    for (unsigned int b = 0; b < blocks; ++b) {
      double want = 0.0;
      for (unsigned int t = 0; t < threads; ++t) want += in[b * threads + t];
      EXPECT_EQ(out[b], want) << "block " << b;
      EXPECT_EQ(out_f[b], static_cast<float>(want)) << "block " << b;
    }
  }
  EXPECT_EQ(LaunchCount("ToyBlockSum<double>"), 3u);
  EXPECT_EQ(BlocksRun("ToyBlockSum<double>"), 15u);
}

TEST_F(EmuTest, ShuffleXorAsCudaDefinesIt) {
  struct Case {
    int lane_mask, width;
  };
  for (const Case& c : {Case{1, 32}, Case{16, 32}, Case{5, 32}, Case{4, 8}, Case{16, 8}, Case{40, 32}}) {
    SCOPED_TRACE("lane mask " + std::to_string(c.lane_mask) + ", width " + std::to_string(c.width));
    DeviceArray<int> i(64);
    DeviceArray<unsigned int> u(64);
    DeviceArray<float> f(64);
    DeviceArray<double> d(64);
    ASSERT_EQ(Launch(Toys().shuffle_types, dim3(1), dim3(64), nullptr, c.lane_mask, c.width, i.get(), u.get(),
                     f.get(), d.get()),
              cudaSuccess);
    const std::vector<int> vi = i.Read();
    const std::vector<unsigned int> vu = u.Read();
    const std::vector<float> vf = f.Read();
    const std::vector<double> vd = d.Read();
    for (unsigned int t = 0; t < 64; ++t) {
      // A source lane in a later group of `width` lanes: the lane's own value.
      const unsigned int lane = t % 32;
      unsigned int source = lane ^ static_cast<unsigned int>(c.lane_mask);
      if (source >= (lane / c.width + 1) * c.width) source = lane;
      const unsigned int want = t - lane + source;
      EXPECT_EQ(vi[t], static_cast<int>(want)) << "thread " << t;
      EXPECT_EQ(vu[t], want + 1000u);
      EXPECT_EQ(vf[t], static_cast<float>(want) + 0.5f);
      EXPECT_EQ(vd[t], static_cast<double>(want) + 0.25);
    }
  }
}

// A barrier that cannot complete fails the launch, stickily, with the kernel
// and block named; Reset() clears the device.
TEST_F(EmuTest, BarrierDivergenceIsALaunchFailureNotAHang) {
  struct Case {
    cudaKernel_t kernel;
    const char* name;
    unsigned int threads;
    const char* says;
  };
  for (const Case& c : {Case{Toys().early_exit, "ToyEarlyExit", 64, "16 have exited"},
                        Case{Toys().mixed_barriers, "ToyMixedBarriers", 64, "32 at __shfl_xor_sync()"},
                        Case{Toys().shuffle_all, "ToyShuffleAll", 48, "fewer than 32 threads"},
                        Case{Toys().partial_mask, "ToyPartialMask", 32, "mask 0xFFFFFFFF only"}}) {
    SCOPED_TRACE(c.name);
    Reset();
    DeviceArray<int> out(64);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    ASSERT_EQ(Launch(c.kernel, dim3(3), dim3(c.threads), s, out.get()), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
    const std::string failure = LastKernelFailure();
    EXPECT_NE(failure.find(std::string("kernel ") + c.name + ", block (0,0,0)"), std::string::npos) << failure;
    EXPECT_NE(failure.find(c.says), std::string::npos) << failure;
    EXPECT_EQ(BlocksRun(c.name), 1u);  // the first block failed; the others never ran
    // Sticky: every later call on the device, and the last error, say so.
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  }
  Reset();
  // The fibers of the failed blocks were unwound and serve the next launch.
  DeviceArray<double> in(256), out(1);
  in.Write(std::vector<double>(256, 2.0));
  ASSERT_EQ(Launch(Toys().sum_f64, dim3(1), dim3(256), nullptr, in.get(), out.get()), cudaSuccess);
  EXPECT_EQ(out.Read()[0], 512.0);
}

TEST_F(EmuTest, ParametersAreCopiedAtTheLaunch) {
  DeviceArray<int> out(2);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  Box box{7, {}};
  void* args[] = {&box, nullptr};
  int* out_ptr = out.get();
  args[1] = &out_ptr;
  ASSERT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(Toys().write_param), dim3(2), dim3(32), args, 0, s),
            cudaSuccess);
  box.value = 8;  // after the launch, before it runs
  out_ptr = nullptr;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(out.Read(), (std::vector<int>{7, 7}));
  cudaStreamDestroy(s);
}

TEST_F(EmuTest, LaunchConfigurationsTheRuntimeRejects) {
  DeviceArray<int> out(8);
  const cudaKernel_t k = Toys().write_block;  // __launch_bounds__ 256
  EXPECT_EQ(Launch(k, dim3(1), dim3(1025), nullptr, out.get()), cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch(k, dim3(1), dim3(32, 32, 2), nullptr, out.get()), cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch(k, dim3(0), dim3(32), nullptr, out.get()), cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch(k, dim3(1, 70000), dim3(32), nullptr, out.get()), cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch(k, dim3(1), dim3(512), nullptr, out.get()), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  EXPECT_EQ(Launch(Toys().huge_param, dim3(1), dim3(32), nullptr, Huge{}), cudaErrorInvalidValue);
  int dummy = 0;
  EXPECT_EQ(cudaLaunchKernel(&dummy, dim3(1), dim3(32), nullptr, 0, nullptr), cudaErrorInvalidDeviceFunction);
  void* args[] = {nullptr};
  EXPECT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(1), dim3(32), args, 128, nullptr),
            cudaErrorNotSupported);
  // gac's kernels carry their bounds: the statistics kernel takes 256 threads.
  cudaLibrary_t lib = nullptr;
  cudaKernel_t stats = nullptr;
  ASSERT_EQ(cudaLibraryLoadData(&lib, "x", nullptr, nullptr, 0, nullptr, nullptr, 0), cudaSuccess);
  ASSERT_EQ(cudaLibraryGetKernel(&stats, lib, "gac_stats_f32_inline"), cudaSuccess);
  EXPECT_EQ(cudaLibraryGetKernel(&stats, lib, "gac_no_such_kernel"), cudaErrorSymbolNotFound);
  InlineTable table{};
  PassArgs pass{};
  void* stats_args[] = {&table, &pass};
  EXPECT_EQ(cudaLaunchKernel(reinterpret_cast<const void*>(stats), dim3(1), dim3(512), stats_args, 0, nullptr),
            cudaErrorInvalidValue);
}

// The sanitizers see the emulated threads' accesses: an overrun of device
// memory (AddressSanitizer), a misaligned vector load, which a GPU reports
// as a misaligned address (UndefinedBehaviorSanitizer), a host thread's
// write to pinned memory that a kernel reads, unordered (ThreadSanitizer).
TEST_F(EmuTest, SanitizersCatchKernelBugs) {
#if !defined(GAC_EMU_TEST_ASAN) && !defined(GAC_EMU_TEST_UBSAN) && !defined(GAC_EMU_TEST_TSAN)
  GTEST_SKIP() << "not a sanitizer build";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceArray<float> in(8), out(1);
  in.Write(std::vector<float>(8, 1.0f));
#ifdef GAC_EMU_TEST_ASAN
  EXPECT_DEATH(
      {
        Launch(Toys().overrun, dim3(1), dim3(32), nullptr, static_cast<const float*>(in.get()), 8, out.get());
        cudaDeviceSynchronize();
      },
      "heap-buffer-overflow");
#endif
#ifdef GAC_EMU_TEST_UBSAN
  EXPECT_DEATH(
      {
        Launch(Toys().misaligned_load, dim3(1), dim3(32), nullptr, static_cast<const float*>(in.get()), out.get());
        cudaDeviceSynchronize();
      },
      "misaligned address");
#endif
#ifdef GAC_EMU_TEST_TSAN
  EXPECT_DEATH(
      {
        float* pinned = nullptr;
        cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(float));
        Launch(Toys().copy, dim3(1), dim3(8), nullptr, static_cast<const float*>(pinned), out.get());
        std::thread writer([pinned] { pinned[0] = 2.0f; });  // nothing orders it with the kernel
        cudaDeviceSynchronize();
        writer.join();
      },
      "data race");
#endif
}

// ---- Streams, events, the legacy stream.

// Pinned memory is read when the copy runs: a host write after the enqueue
// and before the wait is what the copy sees. Pageable memory is staged at
// the call, and a copy into it returns done.
TEST_F(EmuTest, StreamsRunOnlyWhenWaitedFor) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DeviceArray<int> d(4);
  int* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 4 * sizeof(int)), cudaSuccess);
  pinned[0] = 1;
  ASSERT_EQ(cudaMemcpyAsync(d.get(), pinned, sizeof(int), cudaMemcpyHostToDevice, s), cudaSuccess);
  EXPECT_EQ(PendingOperations(), 1u);
  pinned[0] = 42;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(PendingOperations(), 0u);
  EXPECT_EQ(d.Read()[0], 42);

  std::vector<int> pageable = {5};
  ASSERT_EQ(cudaMemcpyAsync(d.get(), pageable.data(), sizeof(int), cudaMemcpyHostToDevice, s), cudaSuccess);
  pageable[0] = 6;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(d.Read()[0], 5);

  // A result read before the wait is the old one.
  ASSERT_EQ(cudaMemsetAsync(d.get(), 0x11, sizeof(int), s), cudaSuccess);
  pinned[1] = 0;
  ASSERT_EQ(cudaMemcpyAsync(pinned + 1, d.get(), sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(pinned[1], 0);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(pinned[1], 0x11111111);
  ASSERT_EQ(cudaMemsetAsync(d.get(), 0x22, sizeof(int), s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pageable.data(), d.get(), sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(pageable[0], 0x22222222);
  EXPECT_EQ(PendingOperations(), 0u);

  // A query says "not ready" once, then runs the work.
  ASSERT_EQ(cudaMemsetAsync(d.get(), 0, sizeof(int), s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  EXPECT_EQ(PendingOperations(), 0u);
  cudaFreeHost(pinned);
  cudaStreamDestroy(s);
}

TEST_F(EmuTest, EventsOrderStreams) {
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e = nullptr, start = nullptr, untimed = nullptr;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  DeviceArray<unsigned char> d(4);
  unsigned char* h = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&h), 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(d.get(), 0, 4), cudaSuccess);

  // b waits for a's work through the event: waiting for b runs a first.
  ASSERT_EQ(cudaEventRecord(start, a), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d.get(), 7, 4, a), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, d.get(), 4, cudaMemcpyDeviceToHost, b), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(h[0], 7);
  float ms = -1.0f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, e), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);

  // Without the event, b does not wait: it reads what a has not written yet.
  ASSERT_EQ(cudaMemsetAsync(d.get(), 9, 4, a), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h, d.get(), 4, cudaMemcpyDeviceToHost, b), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(h[0], 7);
  // A record's wait runs its stream up to the record only.
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d.get(), 11, 4, a), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(d.Read()[0], 9);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, e), cudaSuccess);
  EXPECT_EQ(PendingOperations(), 1u);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d.Read()[0], 11);
  for (cudaEvent_t ev : {e, start, untimed}) cudaEventDestroy(ev);
  cudaFreeHost(h);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// The legacy stream and the blocking streams wait for each other; a
// non-blocking stream waits for neither.
TEST_F(EmuTest, LegacyStreamOrdering) {
  cudaStream_t blocking = nullptr, non_blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking), cudaSuccess);
  DeviceArray<unsigned char> d(1);
  unsigned char h = 0;
  ASSERT_EQ(cudaMemset(d.get(), 0, 1), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d.get(), 1, 1, blocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&h, d.get(), 1, cudaMemcpyDeviceToHost), cudaSuccess);  // the legacy stream
  EXPECT_EQ(h, 1);
  ASSERT_EQ(cudaMemsetAsync(d.get(), 2, 1, non_blocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&h, d.get(), 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h, 1) << "a synchronous copy waited for a non-blocking stream";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&h, d.get(), 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h, 2);
  // Legacy work first, then a blocking stream's: the stream waits for it.
  unsigned char* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 1), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d.get(), 3, 1, cudaStreamLegacy), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned, d.get(), 1, cudaMemcpyDeviceToHost, blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  EXPECT_EQ(pinned[0], 3);
  ASSERT_EQ(cudaMemsetAsync(d.get(), 4, 1, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned, d.get(), 1, cudaMemcpyDeviceToHost, non_blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(non_blocking), cudaSuccess);
  EXPECT_EQ(pinned[0], 3);
  cudaFreeHost(pinned);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(non_blocking);
}

// ---- Stream capture.

TEST_F(EmuTest, CaptureDiscardsWorkAndASyncInvalidatesIt) {
  cudaStream_t s = nullptr, other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  DeviceArray<int> out(8);
  ASSERT_EQ(cudaMemset(out.get(), 0, 8 * sizeof(int)), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;

  // A clean capture: the work is recorded (here: discarded), not run.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  ASSERT_EQ(Launch(Toys().write_block, dim3(8), dim3(32), s, out.get()), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);  // allowed
  EXPECT_EQ(PendingOperations(), 0u);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_NE(graph, nullptr);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(out.Read(), std::vector<int>(8, 0));
  EXPECT_EQ(LaunchCount("ToyWriteBlock"), 1u);
  EXPECT_EQ(cudaFree(p), cudaSuccess);

  // Each call that would wait for the capturing stream fails and invalidates it.
  const std::vector<std::pair<const char*, std::function<cudaError_t()>>> waits = {
      {"cudaStreamSynchronize", [&] { return cudaStreamSynchronize(s); }},
      {"cudaDeviceSynchronize", [] { return cudaDeviceSynchronize(); }},
      {"cudaMemcpy", [&] {
         int h = 0;
         return cudaMemcpy(&h, out.get(), sizeof h, cudaMemcpyDeviceToHost);
       }},
      {"cudaMemset", [&] { return cudaMemset(out.get(), 0, 4); }},
      {"cudaEventSynchronize", [&] {
         cudaEvent_t e = nullptr;
         cudaEventCreate(&e);
         cudaEventRecord(e, s);
         const cudaError_t r = cudaEventSynchronize(e);
         cudaEventDestroy(e);
         return r;
       }},
  };
  for (const auto& [what, wait] : waits) {
    SCOPED_TRACE(what);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(wait(), cudaErrorStreamCaptureUnsupported);
    ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
    ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  }

  // A captured wait on work outside the capture.
  cudaEvent_t outside = nullptr;
  ASSERT_EQ(cudaEventCreate(&outside), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(outside, other), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s, outside, 0), cudaErrorStreamCaptureIsolation);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated);
  cudaEventDestroy(outside);

  // A blocking stream's capture and the legacy stream: gac's step refuses
  // to start (cuda_util.cc), legacy work invalidates the capture.
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamIsCapturing(nullptr, &status), cudaErrorStreamCaptureImplicit);
  EXPECT_EQ(gac::agent::cuda::CheckNotCapturing(nullptr).code(), gac::base::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gac::agent::cuda::CheckNotCapturing(blocking).code(), gac::base::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cudaMemsetAsync(out.get(), 0, 4, nullptr), cudaErrorStreamCaptureImplicit);
  EXPECT_EQ(cudaStreamEndCapture(blocking, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaErrorIllegalState);
  (void)cudaGetLastError();
  for (cudaStream_t x : {s, other, blocking}) cudaStreamDestroy(x);
}

// ---- Handles, memory, contexts.

TEST_F(EmuTest, StaleAndUnknownHandles) {
  DeviceArray<int> d(4);
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d.get(), 0x33, 4 * sizeof(int), s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(d.Read()[0], 0x33333333) << "a destroyed stream's work still completes";
  const auto bogus = reinterpret_cast<cudaStream_t>(std::uintptr_t{0x1234});
  for (cudaStream_t x : {s, bogus}) {
    EXPECT_EQ(cudaStreamSynchronize(x), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaStreamQuery(x), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaMemsetAsync(d.get(), 0, 4, x), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(Launch(Toys().write_block, dim3(1), dim3(32), x, d.get()), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaEventRecord(e, x), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaStreamWaitEvent(x, e, 0), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaStreamDestroy(x), cudaErrorInvalidResourceHandle);
  }
  EXPECT_EQ(cudaStreamDestroy(nullptr), cudaErrorInvalidResourceHandle);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(e, nullptr), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventSynchronize(e), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventDestroy(e), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

TEST_F(EmuTest, MemoryChecks) {
  DeviceArray<int> d(4);
  int h[8] = {};
  EXPECT_EQ(cudaMemcpyAsync(d.get() + 2, h, 3 * sizeof(int), cudaMemcpyHostToDevice, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h, d.get(), 5 * sizeof(int), cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.get(), h, 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);  // wrong direction
  EXPECT_EQ(cudaMemset(d.get() + 4, 0, 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(h, 0, 4), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(h), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d.get() + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(d.get()), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.get() + 1, h, 3 * sizeof(int), cudaMemcpyDefault), cudaSuccess);
  // 256-byte aligned; new memory reads as NaN until written (fill 0xFF).
  float* f = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&f), 3 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(f) % 256, 0u);
  float back = 0.0f;
  ASSERT_EQ(cudaMemcpy(&back, f, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::isnan(back));
  // The device's memory is counted; more than is free fails.
  std::size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(total, std::size_t{64} << 30);
  EXPECT_EQ(total - free_bytes, 3 * sizeof(float) + 4 * sizeof(int));
  void* big = nullptr;
  EXPECT_EQ(cudaMalloc(&big, free_bytes + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(LiveAllocations(), 2u);
  EXPECT_EQ(cudaFree(f), cudaSuccess);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  (void)cudaGetLastError();
}

TEST_F(EmuTest, ContextsAreCreatedWhereTheRuntimeCreatesThem) {
  SetDeviceCount(2);
  std::thread([] {
    int device = -1;
    ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
    EXPECT_EQ(device, 0);
    EXPECT_FALSE(ContextCreated(0)) << "cudaGetDevice creates no context";
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    EXPECT_TRUE(ContextCreated(1));
    cudaStream_t s1 = nullptr;
    ASSERT_EQ(cudaStreamCreate(&s1), cudaSuccess);
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, 64), cudaSuccess);
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
    EXPECT_STREQ(prop.name, "gac emulated GPU");
    EXPECT_EQ(prop.major * 10 + prop.minor, 90);
    EXPECT_FALSE(ContextCreated(0));
    EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
    EXPECT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
    // Device 1's stream while device 0 is current: no work may go there.
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(p, 0, 64, s1), cudaErrorInvalidResourceHandle);
    EXPECT_EQ(Launch(Toys().write_block, dim3(1), dim3(32), s1, static_cast<int*>(p)),
              cudaErrorInvalidResourceHandle);
    EXPECT_EQ(cudaStreamSynchronize(s1), cudaSuccess);  // waiting is allowed
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    EXPECT_EQ(cudaFree(p), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(s1), cudaSuccess);
    (void)cudaGetLastError();
  }).join();
}

// gac's objects on device 1, used from a thread that had no context
// (cuda_util.cc's DeviceScope): no context appears on device 0.
TEST_F(EmuTest, GacCreatesNoContextOnDevice0ForWorkOnDevice1) {
  SetDeviceCount(2);
  std::unique_ptr<gac::agent::cuda::MultiTensorPasses> passes;
  cudaStream_t stream = nullptr;
  void* g = nullptr;
  void* p = nullptr;
  std::thread([&] {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    auto created = gac::agent::cuda::MultiTensorPasses::Create(ElemType::kF32, 0);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    passes = std::move(*created);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&g, 4096), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
    ASSERT_EQ(cudaMemset(g, 0, 4096), cudaSuccess);
    ASSERT_EQ(cudaMemset(p, 0, 4096), cudaSuccess);
  }).join();
  ASSERT_NE(passes, nullptr);
  std::thread([&] {
    TensorRef ref;
    ref.g = g;
    ref.p = p;
    ref.n = 1024;
    ASSERT_TRUE(passes->SetTensors(&ref, 1, stream).ok());
    ASSERT_TRUE(passes->EnqueueStatistics(true, stream).ok());
    auto stats = passes->ReadResult(stream);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->gg(), 0.0);
    passes.reset();
  }).join();
  EXPECT_TRUE(ContextCreated(1));
  EXPECT_FALSE(ContextCreated(0));
}

// ---- Faults and the driver settings.

TEST_F(EmuTest, EveryInjectedFaultKind) {
  DeviceArray<int> d(4);
  int h = 0;
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  cudaLibrary_t lib = nullptr;
  ASSERT_EQ(cudaLibraryLoadData(&lib, "x", nullptr, nullptr, 0, nullptr, nullptr, 0), cudaSuccess);
  const std::vector<std::pair<Call, std::function<cudaError_t()>>> calls = {
      {Call::kSetDevice, [] { return cudaSetDevice(0); }},
      {Call::kGetDevice, [] {
         int x;
         return cudaGetDevice(&x);
       }},
      {Call::kGetDeviceCount, [] {
         int x;
         return cudaGetDeviceCount(&x);
       }},
      {Call::kMalloc, [] {
         void* p = nullptr;
         const cudaError_t r = cudaMalloc(&p, 64);
         cudaFree(p);
         return r;
       }},
      {Call::kMallocHost, [] {
         void* p = nullptr;
         const cudaError_t r = cudaMallocHost(&p, 64);
         cudaFreeHost(p);
         return r;
       }},
      {Call::kFree, [] {
         void* p = nullptr;
         cudaMalloc(&p, 64);
         const cudaError_t r = cudaFree(p);
         if (r != cudaSuccess) cudaFree(p);
         return r;
       }},
      {Call::kMemcpy, [&] { return cudaMemcpy(d.get(), &h, sizeof h, cudaMemcpyHostToDevice); }},
      {Call::kMemcpyAsync, [&] { return cudaMemcpyAsync(d.get(), &h, sizeof h, cudaMemcpyHostToDevice, s); }},
      {Call::kMemset, [&] { return cudaMemset(d.get(), 0, 4); }},
      {Call::kMemsetAsync, [&] { return cudaMemsetAsync(d.get(), 0, 4, s); }},
      {Call::kStreamCreate, [] {
         cudaStream_t x = nullptr;
         const cudaError_t r = cudaStreamCreate(&x);
         if (r == cudaSuccess) cudaStreamDestroy(x);
         return r;
       }},
      {Call::kStreamSynchronize, [&] { return cudaStreamSynchronize(s); }},
      {Call::kStreamWaitEvent, [&] { return cudaStreamWaitEvent(s, e, 0); }},
      {Call::kEventCreate, [] {
         cudaEvent_t x = nullptr;
         const cudaError_t r = cudaEventCreate(&x);
         if (r == cudaSuccess) cudaEventDestroy(x);
         return r;
       }},
      {Call::kEventRecord, [&] { return cudaEventRecord(e, s); }},
      {Call::kEventSynchronize, [&] { return cudaEventSynchronize(e); }},
      {Call::kDeviceSynchronize, [] { return cudaDeviceSynchronize(); }},
      {Call::kLibraryLoadData, [] {
         cudaLibrary_t x = nullptr;
         return cudaLibraryLoadData(&x, "x", nullptr, nullptr, 0, nullptr, nullptr, 0);
       }},
      {Call::kLibraryGetKernel, [&] {
         cudaKernel_t k = nullptr;
         return cudaLibraryGetKernel(&k, lib, "gac_finalize");
       }},
      {Call::kLaunchKernel, [&] { return Launch(Toys().write_block, dim3(1), dim3(32), s, d.get()); }},
  };
  for (const auto& [call, invoke] : calls) {
    SCOPED_TRACE("call " + std::to_string(static_cast<int>(call)));
    InjectFault(call, cudaErrorDevicesUnavailable, 2);
    EXPECT_EQ(invoke(), cudaSuccess);
    EXPECT_EQ(invoke(), cudaErrorDevicesUnavailable);
    EXPECT_EQ(invoke(), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaErrorDevicesUnavailable);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }

  // A kernel that faults when it runs: accepted, then sticky.
  InjectKernelFault("ToyWriteBlock", cudaErrorIllegalAddress);
  ASSERT_EQ(Launch(Toys().write_block, dim3(4), dim3(32), s, d.get()), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
  // The two launches of the loop ran; the faulting one's blocks do not.
  EXPECT_EQ(BlocksRun("ToyWriteBlock"), 2u);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 4), cudaErrorIllegalAddress);
  Reset();

  // NCCL.
  DeviceArray<double> v(4);
  ncclComm_t comm = nullptr;
  int device = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &device), ncclSuccess);
  InjectNcclFault(ncclSystemError);
  EXPECT_EQ(ncclAllReduce(v.get(), v.get(), 4, ncclFloat64, ncclSum, comm, nullptr), ncclSystemError);
  EXPECT_EQ(ncclAllReduce(v.get(), v.get(), 4, ncclFloat64, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);

  // Cleared.
  InjectFault(Call::kMalloc, cudaErrorMemoryAllocation);
  ClearFaults();
  EXPECT_EQ(cudaMalloc(&p, 4), cudaSuccess);
  cudaFree(p);
}

TEST_F(EmuTest, NoDriverAndNoDevice) {
  SetDriver(Driver::kMissing);
  int n = -1, version = -1;
  EXPECT_EQ(cudaGetDeviceCount(&n), cudaErrorInsufficientDriver);
  EXPECT_EQ(n, 0);
  EXPECT_EQ(cudaDriverGetVersion(&version), cudaSuccess);
  EXPECT_EQ(version, 0);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 4), cudaErrorInsufficientDriver);
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInsufficientDriver), "cudaErrorInsufficientDriver");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInsufficientDriver),
               "CUDA driver version is insufficient for CUDA runtime version");
  gac::agent::CudaEnvironment env = gac::agent::QueryCudaEnvironment();
  EXPECT_EQ(env.driver_version, 0);
  EXPECT_TRUE(env.devices.empty());
  EXPECT_FALSE(env.error.empty());
  auto passes = gac::agent::cuda::MultiTensorPasses::Create(ElemType::kF32, 0);
  ASSERT_FALSE(passes.ok());
  EXPECT_EQ(passes.status().code(), gac::base::StatusCode::kUnavailable) << passes.status().ToString();

  SetDriver(Driver::kNoDevice);
  EXPECT_EQ(cudaGetDeviceCount(&n), cudaErrorNoDevice);
  EXPECT_EQ(cudaDriverGetVersion(&version), cudaSuccess);
  EXPECT_EQ(version, 12090);
  env = gac::agent::QueryCudaEnvironment();
  EXPECT_NE(env.error.find("cudaErrorNoDevice"), std::string::npos) << env.error;

  SetDriver(Driver::kPresent);
  SetDeviceCount(2);
  env = gac::agent::QueryCudaEnvironment();
  ASSERT_EQ(env.devices.size(), 2u);
  EXPECT_EQ(env.devices[1].name, "gac emulated GPU");
  EXPECT_EQ(env.devices[1].image, "sm_90");
  EXPECT_STREQ(cudaGetErrorName(static_cast<cudaError_t>(1000)), "unrecognized error code");
}

// ---- The block filter.

TEST_F(EmuTest, BlockFilterSkipsBlocks) {
  DeviceArray<int> out(8);
  ASSERT_EQ(cudaMemset(out.get(), 0, 8 * sizeof(int)), cudaSuccess);
  SetBlockFilter(
      [](const std::string& kernel, unsigned int x) { return kernel != "ToyWriteBlock" || x == 2 || x == 5; });
  ASSERT_EQ(Launch(Toys().write_block, dim3(8), dim3(64), nullptr, out.get()), cudaSuccess);
  EXPECT_EQ(out.Read(), (std::vector<int>{0, 0, 3, 0, 0, 6, 0, 0}));
  EXPECT_EQ(BlocksRun("ToyWriteBlock"), 2u);
}

// ---- gac's kernels, launched by name through kernel_library.cc.

// Host codecs, independent of the emulator's: bf16 by the remainder, fp16
// by scaling to the format's grid.
std::uint32_t FloatBits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
float BitsFloat(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
std::uint16_t HostBf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  std::uint32_t upper = FloatBits(f) >> 16;
  const std::uint32_t rest = FloatBits(f) & 0xFFFFu;
  if (rest > 0x8000u || (rest == 0x8000u && (upper & 1u) != 0)) ++upper;
  return static_cast<std::uint16_t>(upper);
}
float HostFromHalf(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  double v;
  if (exponent == 31) {
    v = mantissa != 0 ? std::nan("") : INFINITY;
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return static_cast<float>((h & 0x8000) != 0 ? -v : v);
}
std::uint16_t HostHalf(float f) {
  if (std::isnan(f)) return 0x7FFF;
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;
  if (a == 0.0) return sign;
  int e = 0;
  std::frexp(a, &e);
  const int exponent = std::max(e - 1, -14);
  const double ulp = std::ldexp(1.0, exponent - 10);
  const double q = std::nearbyint(a / ulp);  // to nearest even
  if (q < 1024 && exponent == -14) return static_cast<std::uint16_t>(sign | static_cast<int>(q));  // subnormal
  const double v = q * ulp;
  const double m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  return static_cast<std::uint16_t>(sign | (e - 1 + 15) << 10 | static_cast<int>((2 * m - 1) * 1024));
}

TEST(EmuHalfTest, ConversionsMatchAnIndependentCodec) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float got = __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
    const float want = HostFromHalf(static_cast<std::uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(FloatBits(got), FloatBits(want)) << std::hex << h;
    }
  }
  // Every float exponent with sampled mantissas, and the ties of the
  // subnormal and normal ranges.
  std::vector<std::uint32_t> bits;
  for (std::uint32_t b = 0; b < 0xFFFFFFFFu - 4099; b += 4099) bits.push_back(b);
  for (int exponent = -26; exponent <= 16; ++exponent) {
    for (int k = 0; k < 2048; ++k) {
      const float tie = static_cast<float>(std::ldexp(2 * k + 1, exponent - 11));  // halfway on some grid
      bits.push_back(FloatBits(tie));
      bits.push_back(FloatBits(std::nextafter(tie, 0.0f)));
      bits.push_back(FloatBits(std::nextafter(tie, INFINITY)));
    }
  }
  for (std::uint32_t b : {0x7F800000u, 0xFF800000u, 0x477FEFFFu, 0x477FF000u, 0x33000000u, 0x33000001u}) {
    bits.push_back(b);
  }
  for (std::uint32_t b : bits) {
    const float f = BitsFloat(b);
    ASSERT_EQ(__half_as_ushort(__float2half_rn(f)), HostHalf(f)) << std::hex << b << " " << f;
  }
}

// Tensors laid out in two arenas (gradients, snapshots), each starting
// `shift` elements past a 256-byte boundary, on the device and the host.
struct Spec {
  std::int64_t n;
  ElemType gt;
  int g_shift;
  int p_shift;
  std::int32_t segment;
};

std::size_t Size(ElemType t) { return t == ElemType::kF32 ? 4 : 2; }

float Decode(ElemType t, const std::uint8_t* base, std::int64_t i) {
  if (t == ElemType::kF32) {
    float f;
    std::memcpy(&f, base + 4 * i, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, base + 2 * i, 2);
  return t == ElemType::kBF16 ? BitsFloat(static_cast<std::uint32_t>(h) << 16) : HostFromHalf(h);
}
std::uint32_t Encode(ElemType t, float v) {
  switch (t) {
    case ElemType::kBF16: return HostBf16(v);
    case ElemType::kF16: return HostHalf(v);
    default: return FloatBits(v);
  }
}
std::uint32_t RawBits(ElemType t, const std::uint8_t* base, std::int64_t i) {
  std::uint32_t b = 0;
  std::memcpy(&b, base + Size(t) * static_cast<std::size_t>(i), Size(t));
  return b;
}
void Put(ElemType t, std::uint8_t* base, std::int64_t i, float v) {
  const std::uint32_t b = Encode(t, v);
  std::memcpy(base + Size(t) * static_cast<std::size_t>(i), &b, Size(t));  // little-endian: the low bytes
}

class Arenas {
 public:
  Arenas(std::vector<Spec> specs, ElemType pt) : specs_(std::move(specs)), pt_(pt) {
    std::size_t g_bytes = 0, p_bytes = 0;
    for (const Spec& s : specs_) {
      g_off_.push_back(g_bytes + static_cast<std::size_t>(s.g_shift) * Size(s.gt));
      p_off_.push_back(p_bytes + static_cast<std::size_t>(s.p_shift) * Size(pt));
      g_bytes = (g_off_.back() + static_cast<std::size_t>(s.n) * Size(s.gt) + 255) / 256 * 256;
      p_bytes = (p_off_.back() + static_cast<std::size_t>(s.n) * Size(pt) + 255) / 256 * 256;
    }
    g_.assign(g_bytes, 0);
    p_.assign(p_bytes, 0);
    std::mt19937_64 rng(17);
    std::normal_distribution<double> normal;
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      for (std::int64_t i = 0; i < specs_[t].n; ++i) {
        const double base = normal(rng) + 0.25;
        Put(specs_[t].gt, g_.data() + g_off_[t], i, static_cast<float>(base + 0.5 * normal(rng)));
        Put(pt_, p_.data() + p_off_[t], i, static_cast<float>(2.0 * base));
      }
    }
    g_dev_ = std::make_unique<DeviceArray<std::uint8_t>>(g_.size());
    p_dev_ = std::make_unique<DeviceArray<std::uint8_t>>(p_.size());
    g_dev_->Write(g_);
    p_dev_->Write(p_);
  }

  std::vector<TensorRef> Refs() const {
    std::vector<TensorRef> refs;
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      TensorRef r;
      r.g = g_dev_->get() + g_off_[t];
      r.p = p_dev_->get() + p_off_[t];
      r.n = specs_[t].n;
      r.gt = specs_[t].gt;
      r.segment = specs_[t].segment;
      refs.push_back(r);
    }
    return refs;
  }
  // dot, gg, pp of the host data in fp64: all tensors, or segment s.
  std::vector<double> Reference(bool with_p, int s = -2) const {
    std::vector<double> sums(3, 0.0);
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      if (s != -2 && specs_[t].segment != s) continue;
      for (std::int64_t i = 0; i < specs_[t].n; ++i) {
        const double x = G(g_, t, i), y = with_p ? P(p_, t, i) : 0.0;
        sums[0] += x * y;
        sums[1] += x * x;
        sums[2] += y * y;
      }
    }
    return sums;
  }
  float G(const std::vector<std::uint8_t>& g, std::size_t t, std::int64_t i) const {
    return Decode(specs_[t].gt, g.data() + g_off_[t], i);
  }
  float P(const std::vector<std::uint8_t>& p, std::size_t t, std::int64_t i) const {
    return Decode(pt_, p.data() + p_off_[t], i);
  }
  std::uint32_t GBits(const std::vector<std::uint8_t>& g, std::size_t t, std::int64_t i) const {
    return RawBits(specs_[t].gt, g.data() + g_off_[t], i);
  }
  std::uint32_t PBits(const std::vector<std::uint8_t>& p, std::size_t t, std::int64_t i) const {
    return RawBits(pt_, p.data() + p_off_[t], i);
  }
  // Puts the original data back on the device.
  void Restore() {
    g_dev_->Write(g_);
    p_dev_->Write(p_);
  }

  const std::vector<Spec>& specs() const { return specs_; }
  const std::vector<std::uint8_t>& g() const { return g_; }
  const std::vector<std::uint8_t>& p() const { return p_; }
  const DeviceArray<std::uint8_t>& g_dev() const { return *g_dev_; }
  const DeviceArray<std::uint8_t>& p_dev() const { return *p_dev_; }
  ElemType pt() const { return pt_; }

 private:
  std::vector<Spec> specs_;
  ElemType pt_;
  std::vector<std::size_t> g_off_, p_off_;
  std::vector<std::uint8_t> g_, p_;
  std::unique_ptr<DeviceArray<std::uint8_t>> g_dev_, p_dev_;
};

// fp32, bf16 and fp16 gradients; tails; a gradient and snapshot 4 bytes
// past alignment (a scalar head, then vectors), and a bf16 gradient whose
// misalignment its snapshot does not share (the scalar path).
const std::vector<Spec> kFiveTensors = {
    {40000, ElemType::kF32, 0, 0, 0}, {16385, ElemType::kBF16, 0, 0, 1}, {1007, ElemType::kF16, 0, 0, -1},
    {20001, ElemType::kF32, 1, 1, 0}, {3333, ElemType::kBF16, 3, 0, 1},
};
constexpr int kSegments = 2;

// The passes' tables on the device or inline, and their buffers.
class GacLaunches {
 public:
  GacLaunches(const Arenas& arenas, bool inline_table) : table_(kSegments) {
    const std::vector<TensorRef> refs = arenas.Refs();
    auto change = table_.Update(refs.data(), refs.size());
    EXPECT_TRUE(change.ok());
    EXPECT_TRUE(table_.fits_inline());
    num_chunks_ = static_cast<int>(table_.num_chunks());
    if (inline_table) {
      inline_ = std::make_unique<InlineTable>();
      table_.FillInline(inline_.get());
    } else {
      device_ = std::make_unique<DeviceArray<std::uint8_t>>(table_.tensor_bytes() + table_.chunk_bytes());
      std::vector<std::uint8_t> bytes(table_.tensor_bytes() + table_.chunk_bytes());
      std::memcpy(bytes.data(), table_.tensors().data(), table_.tensor_bytes());
      std::memcpy(bytes.data() + table_.tensor_bytes(), table_.chunks().data(), table_.chunk_bytes());
      device_->Write(bytes);
      device_table_.tensors = reinterpret_cast<const gac::agent::cuda::TensorDesc*>(device_->get());
      device_table_.chunks =
          reinterpret_cast<const gac::agent::cuda::ChunkDesc*>(device_->get() + table_.tensor_bytes());
    }
    partials_ = std::make_unique<DeviceArray<ChunkPartial>>(static_cast<std::size_t>(num_chunks_));
    result_ = std::make_unique<DeviceArray<double>>(gac::agent::cuda::ResultSize(kSegments));
  }

  std::vector<double> Stats(ElemType pt, bool with_p) {
    const PassArgs args{partials_->get(), 0.0f, with_p ? 1 : 0};
    EXPECT_EQ(kernels::LaunchStats(pt, inline_.get(), device_table_, args, num_chunks_, nullptr), cudaSuccess);
    EXPECT_EQ(kernels::LaunchFinalize(partials_->get(), num_chunks_, kSegments, result_->get(), nullptr),
              cudaSuccess);
    return result_->Read();
  }
  void Project(ElemType pt, float coeff, bool snapshot_projected) {
    const PassArgs args{nullptr, coeff, snapshot_projected ? 1 : 0};
    EXPECT_EQ(kernels::LaunchProjectSnapshot(pt, inline_.get(), device_table_, args, num_chunks_, nullptr),
              cudaSuccess);
  }
  void Snapshot(ElemType pt) {
    EXPECT_EQ(kernels::LaunchSnapshot(pt, inline_.get(), device_table_, PassArgs{}, num_chunks_, nullptr),
              cudaSuccess);
  }

 private:
  ChunkTable table_;
  int num_chunks_ = 0;
  std::unique_ptr<InlineTable> inline_;
  std::unique_ptr<DeviceArray<std::uint8_t>> device_;
  DeviceTable device_table_{nullptr, nullptr};
  std::unique_ptr<DeviceArray<ChunkPartial>> partials_;
  std::unique_ptr<DeviceArray<double>> result_;
};

void ExpectSums(const double* got, const std::vector<double>& want, bool with_p) {
  EXPECT_LE(std::fabs(got[1] - want[1]) / want[1], 1e-6) << "gg " << got[1] << " want " << want[1];
  if (!with_p) {
    EXPECT_EQ(got[0], 0.0);
    EXPECT_EQ(got[2], 0.0);
    return;
  }
  EXPECT_LE(std::fabs(got[2] - want[2]) / want[2], 1e-6) << "pp " << got[2] << " want " << want[2];
  EXPECT_LE(std::fabs(got[0] - want[0]) / std::sqrt(want[1] * want[2]), 1e-6) << "dot " << got[0];
}

class GacKernelsTest : public EmuTest, public ::testing::WithParamInterface<std::tuple<ElemType, bool>> {};

TEST_P(GacKernelsTest, FiveTensorsAgainstTheHostReference) {
  const auto [pt, inline_table] = GetParam();
  Arenas arenas(kFiveTensors, pt);
  GacLaunches launches(arenas, inline_table);
  for (bool with_p : {true, false}) {
    SCOPED_TRACE(with_p ? "with p" : "g only");
    const std::vector<double> got = launches.Stats(pt, with_p);
    ExpectSums(got.data(), arenas.Reference(with_p), with_p);
    for (int s = 0; s < kSegments; ++s) {
      SCOPED_TRACE("segment " + std::to_string(s));
      ExpectSums(got.data() + gac::agent::cuda::ResultSegment(s), arenas.Reference(with_p, s), with_p);
    }
    EXPECT_EQ(got[gac::agent::cuda::ResultNonFinite(kSegments)], 0.0);
  }
  const std::string suffix =
      std::string(pt == ElemType::kBF16 ? "_bf16" : "_f32") + (inline_table ? "_inline" : "_device");
  EXPECT_EQ(LaunchCount("gac_stats" + suffix), 2u);
  EXPECT_EQ(LaunchCount("gac_finalize"), 2u);

  // Projection: one fused multiply-add in fp32, stores rounded to nearest
  // even; the snapshot is the old g, or the stored new g converted.
  const float coeff = 0.37f;
  for (bool projected : {false, true}) {
    SCOPED_TRACE(projected ? "snapshot of the projected g" : "snapshot of the old g");
    arenas.Restore();
    launches.Project(pt, coeff, projected);
    const std::vector<std::uint8_t> g = arenas.g_dev().Read(), p = arenas.p_dev().Read();
    for (std::size_t t = 0; t < kFiveTensors.size(); ++t) {
      for (std::int64_t i = 0; i < kFiveTensors[t].n; ++i) {
        const float x = arenas.G(arenas.g(), t, i), y = arenas.P(arenas.p(), t, i);
        ASSERT_EQ(arenas.GBits(g, t, i), Encode(kFiveTensors[t].gt, std::fmaf(-coeff, y, x)))
            << "tensor " << t << " element " << i;
        ASSERT_EQ(arenas.PBits(p, t, i), Encode(pt, projected ? arenas.G(g, t, i) : x))
            << "tensor " << t << " element " << i;
      }
    }
  }
  // Snapshot: p <- g converted; g untouched.
  arenas.Restore();
  launches.Snapshot(pt);
  const std::vector<std::uint8_t> g = arenas.g_dev().Read(), p = arenas.p_dev().Read();
  EXPECT_EQ(g, arenas.g());
  for (std::size_t t = 0; t < kFiveTensors.size(); ++t) {
    for (std::int64_t i = 0; i < kFiveTensors[t].n; ++i) {
      ASSERT_EQ(arenas.PBits(p, t, i), Encode(pt, arenas.G(arenas.g(), t, i))) << "tensor " << t << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SnapshotTypesAndTables, GacKernelsTest,
                         ::testing::Combine(::testing::Values(ElemType::kF32, ElemType::kBF16),
                                            ::testing::Bool()));

TEST_F(EmuTest, GacStridedCopy) {
  for (int elem_bytes : {2, 4}) {
    // A 3 x 5 column-major source into a row-major destination.
    gac::agent::cuda::StridedCopyArgs args{};
    DeviceArray<std::uint8_t> src(15 * 4), dst(15 * 4);
    std::vector<std::uint8_t> data(15 * 4);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i);
    src.Write(data);
    args.src = src.get();
    args.dst = dst.get();
    args.n = 15;
    args.ndim = 2;
    args.elem_bytes = elem_bytes;
    args.sizes[0] = 3;
    args.sizes[1] = 5;
    args.src_strides[0] = 1;
    args.src_strides[1] = 3;
    args.dst_strides[0] = 5;
    args.dst_strides[1] = 1;
    ASSERT_EQ(kernels::LaunchStridedCopy(args, nullptr), cudaSuccess);
    const std::vector<std::uint8_t> out = dst.Read();
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 5; ++c) {
        const auto at = [&](int element) { return static_cast<std::size_t>(element * elem_bytes); };
        EXPECT_EQ(std::memcmp(&out[at(r * 5 + c)], &data[at(c * 3 + r)], static_cast<std::size_t>(elem_bytes)), 0)
            << r << "," << c;
      }
    }
  }
}

// A bf16 tensor of more than 2^31 elements in 4 GiB NORESERVE allocations:
// only the chunks around element 2^31 and the tail run, so only their pages
// are touched; the kernels' 64-bit indexing is what is tested.
TEST_F(EmuTest, GacKernelsBeyond32BitIndexingByTheBlockFilter) {
  const std::int64_t n = (std::int64_t{1} << 31) + 4099;
  const std::int64_t boundary = std::int64_t{1} << 31;
  const auto bytes = static_cast<std::size_t>(n) * 2;
  std::uint8_t* g = nullptr;
  std::uint8_t* p = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&g), bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), bytes), cudaSuccess);
  const int boundary_chunk = static_cast<int>(boundary / gac::agent::cuda::kChunkElements);  // starts at 2^31
  // Chunks boundary_chunk - 1 (below 2^31) and boundary_chunk (from 2^31 to
  // the end, 4099 elements): g = 1.5 (0x3FC0), p = 3 (0x4040), g[2^31] = -1.
  const std::size_t window = static_cast<std::size_t>(gac::agent::cuda::kChunkElements + 4099) * 2;
  const std::size_t first = static_cast<std::size_t>(boundary - gac::agent::cuda::kChunkElements) * 2;
  std::vector<std::uint16_t> gv(window / 2, 0x3FC0), pv(window / 2, 0x4040);
  gv[gac::agent::cuda::kChunkElements] = 0xBF80;
  ASSERT_EQ(cudaMemcpy(g + first, gv.data(), window, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(p + first, pv.data(), window, cudaMemcpyHostToDevice), cudaSuccess);

  TensorRef ref;
  ref.g = g;
  ref.p = p;
  ref.n = n;
  ref.gt = ElemType::kBF16;
  ChunkTable table(0);
  ASSERT_TRUE(table.Update(&ref, 1).ok());
  ASSERT_EQ(table.num_chunks(), boundary_chunk + 1);
  DeviceArray<std::uint8_t> table_dev(table.tensor_bytes() + table.chunk_bytes());
  ASSERT_EQ(cudaMemcpy(table_dev.get(), table.tensors().data(), table.tensor_bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(table_dev.get() + table.tensor_bytes(), table.chunks().data(), table.chunk_bytes(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  const DeviceTable device_table{reinterpret_cast<const gac::agent::cuda::TensorDesc*>(table_dev.get()),
                                 reinterpret_cast<const gac::agent::cuda::ChunkDesc*>(table_dev.get() +
                                                                                      table.tensor_bytes())};
  SetBlockFilter([&](const std::string& kernel, unsigned int x) {
    return kernel == "gac_finalize" || static_cast<int>(x) >= boundary_chunk - 1;
  });
  const int num_chunks = static_cast<int>(table.num_chunks());
  DeviceArray<ChunkPartial> partials(static_cast<std::size_t>(num_chunks));
  ASSERT_EQ(cudaMemset(partials.get(), 0, static_cast<std::size_t>(num_chunks) * sizeof(ChunkPartial)), cudaSuccess);
  DeviceArray<double> result(gac::agent::cuda::ResultSize(0));
  ASSERT_EQ(kernels::LaunchStats(ElemType::kBF16, nullptr, device_table, PassArgs{partials.get(), 0.0f, 1}, num_chunks,
                                 nullptr),
            cudaSuccess);
  ASSERT_EQ(kernels::LaunchFinalize(partials.get(), num_chunks, 0, result.get(), nullptr), cudaSuccess);
  const std::vector<double> sums = result.Read();
  const double elements = gac::agent::cuda::kChunkElements + 4099;
  EXPECT_EQ(sums[0], (elements - 1) * 1.5 * 3.0 - 3.0);
  EXPECT_EQ(sums[1], (elements - 1) * 2.25 + 1.0);
  EXPECT_EQ(sums[2], elements * 9.0);
  EXPECT_EQ(BlocksRun("gac_stats_bf16_device"), 2u);

  // Projection with coeff 0.5 and the old g kept: g[2^31] = -1 - 1.5 = -2.5.
  ASSERT_EQ(kernels::LaunchProjectSnapshot(ElemType::kBF16, nullptr, device_table, PassArgs{nullptr, 0.5f, 0},
                                           num_chunks, nullptr),
            cudaSuccess);
  std::uint16_t at[3] = {};
  for (int k = 0; k < 3; ++k) {
    const std::int64_t i = k == 0 ? boundary - 1 : k == 1 ? boundary : n - 1;
    ASSERT_EQ(cudaMemcpy(&at[k], g + 2 * i, 2, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  EXPECT_EQ(at[0], 0x0000);  // 1.5 - 0.5 * 3 = 0
  EXPECT_EQ(at[1], 0xC020);  // -2.5
  EXPECT_EQ(at[2], 0x0000);
  std::uint16_t old = 0;
  ASSERT_EQ(cudaMemcpy(&old, p + 2 * boundary, 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(old, 0xBF80);
  EXPECT_EQ(cudaFree(g), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// ---- gac's host code on the emulator.

TEST_F(EmuTest, MultiTensorPassesAndTheNcclReducerAtOneRank) {
  Arenas arenas(kFiveTensors, ElemType::kBF16);
  auto created = gac::agent::cuda::MultiTensorPasses::Create(ElemType::kBF16, kSegments);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto& passes = *created;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ncclComm_t comm = nullptr;
  int device = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &device), ncclSuccess);
  const std::vector<TensorRef> refs = arenas.Refs();
  ASSERT_TRUE(passes->SetTensors(refs.data(), refs.size(), stream).ok());
  ASSERT_TRUE(passes->EnqueueStatistics(true, stream).ok());
  ASSERT_TRUE(passes->EnqueueAllReduce(comm, stream).ok());
  auto stats = passes->ReadResult(stream);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  const std::vector<double> want = arenas.Reference(true);
  const double got[3] = {stats->dot(), stats->gg(), stats->pp()};
  ExpectSums(got, want, true);
  EXPECT_EQ(passes->launches(), 2u);

  // The reducer's host and device paths: one rank sums to the same values.
  auto reducer = gac::agent::NcclReducer::Create(comm, stream);
  ASSERT_TRUE(reducer.ok()) << reducer.status().ToString();
  std::vector<double> values(20);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5 * static_cast<double>(i);
  const std::vector<double> before = values;
  ASSERT_TRUE((*reducer)->AllReduceSum(values.data(), values.size()).ok());
  EXPECT_EQ(values, before);
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_TRUE((*reducer)->AllReduceSumDevice(passes->device_result(), passes->result_size(), other).ok());
  ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  reducer->reset();

  ASSERT_TRUE(passes->EnqueueProjectSnapshot(0.25f, true, stream).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<std::uint8_t> g = arenas.g_dev().Read();
  EXPECT_EQ(arenas.GBits(g, 0, 0), Encode(ElemType::kF32, std::fmaf(-0.25f, arenas.P(arenas.p(), 0, 0),
                                                                     arenas.G(arenas.g(), 0, 0))));
  passes.reset();
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaStreamDestroy(stream);
  cudaStreamDestroy(other);
  EXPECT_EQ(LiveAllocations(), 2u) << "gac's objects freed what they allocated";  // the two arenas
}

// ---- Scale and threads.

// About a thousand blocks of gac's statistics kernel (256 threads, a barrier
// and 30 shuffles each) in seconds.
TEST_F(EmuTest, AThousandBlocksInSeconds) {
  const std::int64_t n = std::int64_t{1000} * gac::agent::cuda::kChunkElements;
  DeviceArray<float> g(static_cast<std::size_t>(n)), p(static_cast<std::size_t>(n));
  ASSERT_EQ(cudaMemset(g.get(), 0x3F, static_cast<std::size_t>(n) * 4), cudaSuccess);  // 0.74803
  ASSERT_EQ(cudaMemset(p.get(), 0x40, static_cast<std::size_t>(n) * 4), cudaSuccess);  // 3.0039
  TensorRef ref;
  ref.g = g.get();
  ref.p = p.get();
  ref.n = n;
  auto created = gac::agent::cuda::MultiTensorPasses::Create(ElemType::kF32, 0);
  ASSERT_TRUE(created.ok());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE((*created)->SetTensors(&ref, 1, nullptr).ok());
  ASSERT_TRUE((*created)->EnqueueStatistics(true, nullptr).ok());
  auto stats = (*created)->ReadResult(nullptr);
  ASSERT_TRUE(stats.ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double x = BitsFloat(0x3F3F3F3Fu), y = BitsFloat(0x40404040u);
  const double count = static_cast<double>(n);
  ExpectSums(&stats->values[0], {count * x * y, count * x * x, count * y * y}, true);
  EXPECT_EQ(BlocksRun("gac_stats_f32_device"), 1000u);
  std::printf("1000 blocks of gac_stats_f32_device: %.2f s\n", seconds);
}

// Host threads calling the runtime at once, each running kernels on its
// own fibers.
TEST_F(EmuTest, SeveralHostThreads) {
  std::vector<std::thread> threads;
  for (int k = 0; k < 3; ++k) {
    threads.emplace_back([k] {
      cudaStream_t s = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      DeviceArray<double> in(512), out(2);
      in.Write(std::vector<double>(512, static_cast<double>(k + 1)));
      for (int round = 0; round < 5; ++round) {
        ASSERT_EQ(Launch(Toys().sum_f64, dim3(2), dim3(256), s, in.get(), out.get()), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        EXPECT_EQ(out.Read(), std::vector<double>(2, 256.0 * (k + 1)));
      }
      cudaStreamDestroy(s);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace
}  // namespace gac_cuda_emu
