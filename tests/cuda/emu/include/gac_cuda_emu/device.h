// Device-side CUDA for the host compiler: the qualifiers, built-in variables
// and intrinsics that gac's kernels (agent/src/cuda/*.cu) use, so that their
// unmodified sources compile as host C++ and run on the emulator's threads
// (gac_cuda_emu/control.h says how). Force-included (-include) first into
// the translation unit that compiles the kernels (src/gac_kernels.cc); a
// test that writes kernels of its own includes it. It defines macros named
// like CUDA's built-ins (threadIdx, __shared__, ...): include it after the
// headers that could use those names.
#ifndef GAC_CUDA_EMU_DEVICE_H_
#define GAC_CUDA_EMU_DEVICE_H_

#include <math.h>  // ::fmaf and ::isfinite, global as in device code

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_fp16.h"
#include "gac_cuda_emu/vector_types.h"

// Every function is a host function here. The launch bound cannot be read
// back from a declaration: the registry states each kernel's
// (src/gac_kernels.cc, RegisterKernel).
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
// Blocks run one at a time: one static instance serves every block.
#define __shared__ static

namespace gac_cuda_emu::device {

// The calling emulated thread's coordinates. Outside a kernel: fatal.
uint3 ThreadIdx();
uint3 BlockIdx();
dim3 BlockDim();
dim3 GridDim();
// The block barrier and the warp exchange (executor.cc).
void SyncThreads();
std::uint64_t ShuffleXor(unsigned int mask, std::uint64_t value, int bytes, int lane_mask, int width);

}  // namespace gac_cuda_emu::device

#define threadIdx (::gac_cuda_emu::device::ThreadIdx())
#define blockIdx (::gac_cuda_emu::device::BlockIdx())
#define blockDim (::gac_cuda_emu::device::BlockDim())
#define gridDim (::gac_cuda_emu::device::GridDim())

inline void __syncthreads() { ::gac_cuda_emu::device::SyncThreads(); }

// float, double, int, unsigned and the other 32- and 64-bit arithmetic types.
template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = 32) {
  static_assert(std::is_arithmetic_v<T> && (sizeof(T) == 4 || sizeof(T) == 8), "32- and 64-bit values only");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = ::gac_cuda_emu::device::ShuffleXor(mask, bits, static_cast<int>(sizeof(T)), lane_mask, width);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

inline float __uint_as_float(unsigned int x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int x;
  std::memcpy(&x, &f, sizeof x);
  return x;
}

#endif  // GAC_CUDA_EMU_DEVICE_H_
