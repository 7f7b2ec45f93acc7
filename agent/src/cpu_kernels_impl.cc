// Compiled several times with GAC_KERNEL_ISA set to the instruction set's
// name and the matching -m flags (see agent/CMakeLists.txt).
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu_kernels.h"

#ifndef GAC_KERNEL_ISA
#error "GAC_KERNEL_ISA must name the instruction set"
#endif

namespace gac::agent::cpu {
namespace GAC_KERNEL_ISA {
namespace {

// fp32 block length: short enough that a per-lane fp32 sum stays accurate.
constexpr std::int64_t kBlock = 512;

struct BF16 {
  std::uint16_t bits;
};
using F16 = _Float16;

inline float Load(float x) { return x; }
inline float Load(BF16 x) {
  const std::uint32_t b = static_cast<std::uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
inline float Load(F16 x) { return static_cast<float>(x); }

inline void Store(float* dst, float v) { *dst = v; }
inline void Store(BF16* dst, float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  // Round to nearest even; NaN stays a quiet NaN.
  const std::uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  dst->bits = static_cast<std::uint16_t>((b & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}
inline void Store(F16* dst, float v) { *dst = static_cast<F16>(v); }

template <typename G, typename P>
Partial StatsT(const G* __restrict g, const P* __restrict p, std::int64_t n) {
  Partial out;
  for (std::int64_t b = 0; b < n; b += kBlock) {
    const std::int64_t e = std::min(n, b + kBlock);
    float d = 0.f, x2 = 0.f, y2 = 0.f;
#pragma omp simd reduction(+ : d, x2, y2)
    for (std::int64_t i = b; i < e; ++i) {
      const float x = Load(g[i]);
      const float y = Load(p[i]);
      d += x * y;
      x2 += x * x;
      y2 += y * y;
    }
    out.dot += d;
    out.gg += x2;
    out.pp += y2;
  }
  return out;
}

template <typename G>
Partial NormT(const G* __restrict g, std::int64_t n) {
  Partial out;
  for (std::int64_t b = 0; b < n; b += kBlock) {
    const std::int64_t e = std::min(n, b + kBlock);
    float x2 = 0.f;
#pragma omp simd reduction(+ : x2)
    for (std::int64_t i = b; i < e; ++i) {
      const float x = Load(g[i]);
      x2 += x * x;
    }
    out.gg += x2;
  }
  return out;
}

template <typename G, typename P>
void ProjectSnapshotT(G* __restrict g, P* __restrict p, std::int64_t n, float coeff, bool snapshot_projected) {
  if (snapshot_projected) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = Load(g[i]) - coeff * Load(p[i]);
      Store(&g[i], x);
      Store(&p[i], Load(g[i]));
    }
  } else {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = Load(g[i]);
      Store(&g[i], x - coeff * Load(p[i]));
      Store(&p[i], x);
    }
  }
}

template <typename G, typename P>
void SnapshotT(const G* __restrict g, P* __restrict p, std::int64_t n) {
  if constexpr (sizeof(G) == sizeof(P) && std::is_same_v<G, P>) {
    std::memcpy(p, g, static_cast<std::size_t>(n) * sizeof(G));
  } else {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) Store(&p[i], Load(g[i]));
  }
}

// Calls f with g and p cast to their element types.
template <typename F>
auto Dispatch2(ElemType gt, ElemType pt, F&& f) {
  auto with_p = [&](auto* gtag) {
    using G = std::remove_pointer_t<decltype(gtag)>;
    switch (pt) {
      case ElemType::kBF16: return f(static_cast<G*>(nullptr), static_cast<BF16*>(nullptr));
      case ElemType::kF16: return f(static_cast<G*>(nullptr), static_cast<F16*>(nullptr));
      default: return f(static_cast<G*>(nullptr), static_cast<float*>(nullptr));
    }
  };
  switch (gt) {
    case ElemType::kBF16: return with_p(static_cast<BF16*>(nullptr));
    case ElemType::kF16: return with_p(static_cast<F16*>(nullptr));
    default: return with_p(static_cast<float*>(nullptr));
  }
}

Partial Stats(const void* g, ElemType gt, const void* p, ElemType pt, std::int64_t n) {
  if (p == nullptr) {
    return Dispatch2(gt, ElemType::kF32, [&](auto* gtag, auto*) {
      using G = std::remove_pointer_t<decltype(gtag)>;
      return NormT(static_cast<const G*>(g), n);
    });
  }
  return Dispatch2(gt, pt, [&](auto* gtag, auto* ptag) {
    using G = std::remove_pointer_t<decltype(gtag)>;
    using P = std::remove_pointer_t<decltype(ptag)>;
    return StatsT(static_cast<const G*>(g), static_cast<const P*>(p), n);
  });
}

void ProjectSnapshot(void* g, ElemType gt, void* p, ElemType pt, std::int64_t n, float coeff,
                     bool snapshot_projected) {
  Dispatch2(gt, pt, [&](auto* gtag, auto* ptag) {
    using G = std::remove_pointer_t<decltype(gtag)>;
    using P = std::remove_pointer_t<decltype(ptag)>;
    ProjectSnapshotT(static_cast<G*>(g), static_cast<P*>(p), n, coeff, snapshot_projected);
  });
}

void Snapshot(const void* g, ElemType gt, void* p, ElemType pt, std::int64_t n) {
  Dispatch2(gt, pt, [&](auto* gtag, auto* ptag) {
    using G = std::remove_pointer_t<decltype(gtag)>;
    using P = std::remove_pointer_t<decltype(ptag)>;
    SnapshotT(static_cast<const G*>(g), static_cast<P*>(p), n);
  });
}

}  // namespace

#define GAC_STR2(x) #x
#define GAC_STR(x) GAC_STR2(x)
extern const Kernels kKernels = {&Stats, &ProjectSnapshot, &Snapshot, GAC_STR(GAC_KERNEL_ISA)};

}  // namespace GAC_KERNEL_ISA
}  // namespace gac::agent::cpu
