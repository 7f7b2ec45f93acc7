// The element types of gac's passes on the host, written independently of
// the kernels' codecs (device_util.cuh) and of the CPU kernels': bf16 by the
// remainder of the fp32 bits, fp16 from the value's exponent and a
// round-half-even of its mantissa; both round to nearest even. Shared by the
// CUDA passes' tests and the agent's tests on the CUDA emulator.
#ifndef GAC_TESTS_CUDA_HOST_CODECS_H_
#define GAC_TESTS_CUDA_HOST_CODECS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "agent/src/cuda/multi_tensor.h"

namespace gac::agent::cuda {

inline std::uint16_t HostBf16Bits(float f) {
  if (std::isnan(f)) return 0x7FC0;
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  std::uint32_t upper = b >> 16;
  const std::uint32_t rest = b & 0xFFFFu;
  if (rest > 0x8000u || (rest == 0x8000u && (upper & 1u) != 0)) ++upper;
  return static_cast<std::uint16_t>(upper);
}
inline float HostBf16ToFloat(std::uint16_t h) {
  const std::uint32_t b = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
// Finite inputs only; portable (clang 14 has no _Float16 on x86-64).
inline std::uint16_t HostF16Bits(float f) {
  const int sign = std::signbit(f) ? 0x8000 : 0;
  const double v = std::fabs(static_cast<double>(f));
  if (v < std::ldexp(1.0, -14)) {  // subnormal (or the smallest normal, by rounding)
    return static_cast<std::uint16_t>(sign | static_cast<int>(std::nearbyint(std::ldexp(v, 24))));
  }
  int e = 0;
  const double m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  double q = std::nearbyint((2.0 * m - 1.0) * 1024.0);
  e -= 1;
  if (q == 1024.0) {
    q = 0.0;
    ++e;
  }
  if (e > 15) return static_cast<std::uint16_t>(sign | 0x7C00);
  return static_cast<std::uint16_t>(sign | ((e + 15) << 10) | static_cast<int>(q));
}
inline float HostF16ToFloat(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  const double v = exponent == 0    ? std::ldexp(mantissa, -24)
                   : exponent == 31 ? (mantissa == 0 ? HUGE_VAL : std::nan(""))
                                    : std::ldexp(1024 + mantissa, exponent - 25);
  return static_cast<float>((bits & 0x8000) != 0 ? -v : v);
}

inline std::size_t Size(ElemType t) { return static_cast<std::size_t>(ElemSize(t)); }

// Raw bits of element i (fp32 bits, or the 16-bit pattern).
inline std::uint32_t Bits(ElemType t, const std::uint8_t* base, std::int64_t i) {
  if (t == ElemType::kF32) {
    std::uint32_t b;
    std::memcpy(&b, base + 4 * i, 4);
    return b;
  }
  std::uint16_t h;
  std::memcpy(&h, base + 2 * i, 2);
  return h;
}
inline float Load(ElemType t, const std::uint8_t* base, std::int64_t i) {
  const std::uint32_t b = Bits(t, base, i);
  switch (t) {
    case ElemType::kBF16: return HostBf16ToFloat(static_cast<std::uint16_t>(b));
    case ElemType::kF16: return HostF16ToFloat(static_cast<std::uint16_t>(b));
    default: {
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
  }
}
// The bits of v stored as t.
inline std::uint32_t Encode(ElemType t, float v) {
  switch (t) {
    case ElemType::kBF16: return HostBf16Bits(v);
    case ElemType::kF16: return HostF16Bits(v);
    default: {
      std::uint32_t b;
      std::memcpy(&b, &v, 4);
      return b;
    }
  }
}
inline void Store(ElemType t, std::uint8_t* base, std::int64_t i, float v) {
  const std::uint32_t b = Encode(t, v);
  if (t == ElemType::kF32) {
    std::memcpy(base + 4 * i, &b, 4);
  } else {
    const std::uint16_t h = static_cast<std::uint16_t>(b);
    std::memcpy(base + 2 * i, &h, 2);
  }
}
inline const char* Name(ElemType t) {
  switch (t) {
    case ElemType::kBF16: return "bf16";
    case ElemType::kF16: return "f16";
    default: return "f32";
  }
}

}  // namespace gac::agent::cuda

#endif  // GAC_TESTS_CUDA_HOST_CODECS_H_
