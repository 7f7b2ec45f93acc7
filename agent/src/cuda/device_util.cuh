// Device-side helpers of the CUDA passes: element conversions with the CPU
// kernels' rounding, 8-element vector loads and stores, block reductions.
// Included by the .cu files only.
#ifndef GAC_AGENT_SRC_CUDA_DEVICE_UTIL_CUH_
#define GAC_AGENT_SRC_CUDA_DEVICE_UTIL_CUH_

#include <cuda_fp16.h>
#ifdef __CUDACC_RTC__
#include "agent/src/cuda/rtc_std.h"
#else
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#endif

#include "agent/src/cuda/multi_tensor.h"

namespace gac::agent::cuda::device {

// Storage of the 2-byte types; the arithmetic is fp32.
struct Bf16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(Bf16 x) { return __uint_as_float(static_cast<unsigned>(x.bits) << 16); }
__device__ __forceinline__ float ToFloat(F16 x) { return __half2float(__ushort_as_half(x.bits)); }

// fp32 -> bf16 bits, round to nearest even; every NaN becomes the quiet NaN
// 0x7FC0. Bit-identical to the CPU kernels' conversion.
__device__ __forceinline__ unsigned Bf16Bits(float x) {
  const unsigned b = __float_as_uint(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}
// fp32 -> fp16 bits, round to nearest even.
__device__ __forceinline__ unsigned F16Bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ Bf16 FromFloat<Bf16>(float x) {
  return Bf16{static_cast<std::uint16_t>(Bf16Bits(x))};
}
template <>
__device__ __forceinline__ F16 FromFloat<F16>(float x) {
  return F16{static_cast<std::uint16_t>(F16Bits(x))};
}

// x as it reads back after a store as T.
template <typename T>
__device__ __forceinline__ float RoundTrip(float x) {
  return ToFloat(FromFloat<T>(x));
}

// Eight consecutive elements at a 16-byte aligned address, as fp32.
__device__ __forceinline__ void Load8(const float* src, float (&v)[kVecElements]) {
  const float4 a = reinterpret_cast<const float4*>(src)[0];
  const float4 b = reinterpret_cast<const float4*>(src)[1];
  v[0] = a.x;
  v[1] = a.y;
  v[2] = a.z;
  v[3] = a.w;
  v[4] = b.x;
  v[5] = b.y;
  v[6] = b.z;
  v[7] = b.w;
}
// Element 2k is the low half of word k (little-endian).
__device__ __forceinline__ void Load8(const Bf16* src, float (&v)[kVecElements]) {
  const uint4 w = *reinterpret_cast<const uint4*>(src);
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  GAC_UNROLL
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(words[k] << 16);
    v[2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
  }
}
__device__ __forceinline__ void Load8(const F16* src, float (&v)[kVecElements]) {
  const uint4 w = *reinterpret_cast<const uint4*>(src);
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  GAC_UNROLL
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[k] & 0xFFFFu)));
    v[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[k] >> 16)));
  }
}

__device__ __forceinline__ void Store8(float* dst, const float (&v)[kVecElements]) {
  reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void Store8(Bf16* dst, const float (&v)[kVecElements]) {
  unsigned words[4];
  GAC_UNROLL
  for (int k = 0; k < 4; ++k) words[k] = Bf16Bits(v[2 * k]) | (Bf16Bits(v[2 * k + 1]) << 16);
  *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
}
__device__ __forceinline__ void Store8(F16* dst, const float (&v)[kVecElements]) {
  unsigned words[4];
  GAC_UNROLL
  for (int k = 0; k < 4; ++k) words[k] = F16Bits(v[2 * k]) | (F16Bits(v[2 * k + 1]) << 16);
  *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
}

// Eight elements copied bit for bit (16-byte aligned).
template <typename T>
__device__ __forceinline__ void Copy8(const T* src, T* dst) {
  constexpr int kWords = kVecElements * static_cast<int>(sizeof(T)) / 16;
  GAC_UNROLL
  for (int k = 0; k < kWords; ++k) reinterpret_cast<uint4*>(dst)[k] = reinterpret_cast<const uint4*>(src)[k];
}

// The scalar prologue of a chunk before its vector path (VectorHead), or -1.
template <typename G, typename P>
__device__ __forceinline__ int Head(const G* g, const P* p, int len) {
  return VectorHead(reinterpret_cast<std::uintptr_t>(g), static_cast<int>(sizeof(G)),
                    reinterpret_cast<std::uintptr_t>(p), static_cast<int>(sizeof(P)), len);
}

// Sums v[0..N) over the block's kThreads threads (a multiple of 32, at most
// 1024) in a fixed order: a butterfly within each warp, then warp 0 over the
// warps' sums. The result is valid in thread 0. Every thread must call it.
template <int kThreads, typename T, int N>
__device__ __forceinline__ void BlockSum(T (&v)[N]) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  constexpr int kWarps = kThreads / 32;
  __shared__ T warp_sums[N][kWarps];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  GAC_UNROLL
  for (int k = 0; k < N; ++k) {
    GAC_UNROLL
    for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xFFFFFFFFu, v[k], o);
  }
  if (lane == 0) {
    GAC_UNROLL
    for (int k = 0; k < N; ++k) warp_sums[k][warp] = v[k];
  }
  __syncthreads();
  if (warp == 0) {
    GAC_UNROLL
    for (int k = 0; k < N; ++k) {
      v[k] = lane < kWarps ? warp_sums[k][lane] : T(0);
      GAC_UNROLL
      for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xFFFFFFFFu, v[k], o);
    }
  }
}

// Calls f(G*) with the gradient pointer cast to its element type.
template <typename F>
__device__ __forceinline__ void WithGradType(std::uint8_t gt, void* g, F&& f) {
  switch (static_cast<ElemType>(gt)) {
    case ElemType::kBF16: f(static_cast<Bf16*>(g)); break;
    case ElemType::kF16: f(static_cast<F16*>(g)); break;
    default: f(static_cast<float*>(g)); break;
  }
}

}  // namespace gac::agent::cuda::device

#endif  // GAC_AGENT_SRC_CUDA_DEVICE_UTIL_CUH_
