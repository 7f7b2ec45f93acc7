// __half and its conversions as gac's kernels use them, for the host
// compiler. float -> half rounds to nearest even, with subnormals, overflow
// to infinity, and every NaN becoming 0x7FFF (the GPU's canonical NaN);
// half -> float is exact (NaNs keep their payload, quieted).
#ifndef GAC_CUDA_EMU_CUDA_FP16_H_
#define GAC_CUDA_EMU_CUDA_FP16_H_

#include <cstdint>
#include <cstring>

struct __half {
  unsigned short bits;
};

inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }

inline float __half2float(__half h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (h.bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h.bits & 0x3FFu;
  std::uint32_t bits;
  if (exponent == 0x1F) {  // infinity, NaN
    bits = sign | 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {  // zero, subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    std::memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline __half __float2half_rn(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const unsigned short sign = static_cast<unsigned short>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return __half{0x7FFF};
  // 65520 (0x477FF000) is the midpoint between the largest half, 65504, and
  // 2^16: it and everything above round to infinity.
  if (a >= 0x477FF000u) return __half{static_cast<unsigned short>(sign | 0x7C00u)};
  // Keep `shift` low bits of `m` rounded to nearest even.
  const auto round = [](std::uint32_t m, int shift) {
    const std::uint32_t kept = m >> shift;
    const std::uint32_t rest = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    return kept + ((rest > half || (rest == half && (kept & 1u) != 0)) ? 1u : 0u);
  };
  std::uint32_t h;
  if (a >= 0x38800000u) {  // a normal half (>= 2^-14); a carry may reach the exponent
    h = round(((a >> 23) - 112) << 23 | (a & 0x7FFFFFu), 13);
  } else if (a > 0x33000000u) {  // a half subnormal: units of 2^-24
    h = round((a & 0x7FFFFFu) | 0x800000u, 126 - static_cast<int>(a >> 23));
  } else {  // at most 2^-25: rounds to zero (2^-25 itself is the even tie)
    h = 0;
  }
  return __half{static_cast<unsigned short>(sign | h)};
}

inline __half __float2half(float f) { return __float2half_rn(f); }

#endif  // GAC_CUDA_EMU_CUDA_FP16_H_
