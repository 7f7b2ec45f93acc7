// Compiled several times with GAC_KERNEL_ISA set to the instruction set's
// name and the matching -m flags (see agent/CMakeLists.txt).
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "agent/src/cpu/kernels.h"

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#ifndef GAC_KERNEL_ISA
#error "GAC_KERNEL_ISA must name the instruction set"
#endif

namespace gac::agent::cpu {
namespace GAC_KERNEL_ISA {
namespace {

// fp32 block length: short enough that a per-lane fp32 sum stays accurate.
constexpr std::int64_t kBlock = 512;
// Independent fp32 accumulators per sum: one AVX-512 register, two AVX2 ones.
constexpr int kLanes = 16;

struct BF16 {
  std::uint16_t bits;
};
#if defined(__clang__) && __clang_major__ < 15
// Clang before 15 has no _Float16 on x86 (Debian 12's clang 14 builds the
// sanitizer and fuzzing trees): fp16 is kept as its bits and converted with
// F16C where the instruction set has it, in software otherwise; both round
// to nearest even, as the _Float16 conversions of the GCC build do.
struct F16 {
  std::uint16_t bits;
};
#define GAC_F16_AS_BITS 1
#else
using F16 = _Float16;
#endif

inline float Load(float x) { return x; }
inline float Load(BF16 x) {
  const std::uint32_t b = static_cast<std::uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
#ifdef GAC_F16_AS_BITS
inline float Load(F16 x) {
#if defined(__F16C__)
  return _cvtsh_ss(x.bits);
#else
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  const std::uint32_t exp = (x.bits >> 10) & 0x1fu, mant = x.bits & 0x3ffu;
  std::uint32_t b;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&b, &f, sizeof b);
    b |= sign;
  } else if (exp == 31) {  // infinity, or NaN made quiet with its payload kept
    b = sign | 0x7f800000u | (mant != 0 ? 0x400000u : 0u) | (mant << 13);
  } else {
    b = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}
#else
inline float Load(F16 x) { return static_cast<float>(x); }
#endif

inline void Store(float* dst, float v) { *dst = v; }
inline void Store(BF16* dst, float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  // Round to nearest even; NaN stays a quiet NaN.
  const std::uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  dst->bits = static_cast<std::uint16_t>((b & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}
#ifdef GAC_F16_AS_BITS
inline void Store(F16* dst, float v) {
#if defined(__F16C__)
  dst->bits = static_cast<std::uint16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
#else
  std::uint32_t x;
  std::memcpy(&x, &v, sizeof x);
  const std::uint32_t sign = x & 0x80000000u;
  x ^= sign;
  std::uint32_t h;
  if (x >= 0x47800000u) {  // >= 65536, infinity or NaN
    h = x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u;
  } else if (x < 0x38800000u) {  // below 2^-14: subnormal or zero. Adding 0.5 aligns
    // the 10 bits at the bottom of the mantissa, rounded to nearest even by the FPU.
    constexpr std::uint32_t kMagic = 126u << 23;
    float f, magic;
    std::memcpy(&f, &x, sizeof f);
    std::memcpy(&magic, &kMagic, sizeof magic);
    f += magic;
    std::memcpy(&h, &f, sizeof h);
    h -= kMagic;
  } else {  // normal: rebias the exponent and round the 13 dropped bits to even
    h = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  }
  dst->bits = static_cast<std::uint16_t>(h | (sign >> 16));
#endif
}
#else
inline void Store(F16* dst, float v) { *dst = static_cast<F16>(v); }
#endif

#define GAC_INLINE inline __attribute__((always_inline))

// kLanes fp32 accumulators as kLanes / kWidth native vectors (GCC/Clang vector
// extensions), so that the lane layout and the order of the final sums are
// the same for every instruction set.
#if defined(__AVX512F__)
constexpr int kWidth = 16;
#elif defined(__AVX__)
constexpr int kWidth = 8;
#else
constexpr int kWidth = 4;
#endif
constexpr int kVecs = kLanes / kWidth;
typedef float Vec __attribute__((vector_size(kWidth * sizeof(float))));
typedef std::uint16_t Vec16 __attribute__((vector_size(kWidth * sizeof(std::uint16_t))));
typedef std::uint32_t Vec32 __attribute__((vector_size(kWidth * sizeof(std::uint32_t))));
typedef float Vec8 __attribute__((vector_size(8 * sizeof(float))));
typedef float Vec4 __attribute__((vector_size(4 * sizeof(float))));

struct Lanes {
  Vec v[kVecs];
};

GAC_INLINE Vec LoadVec(const float* src) {
  Vec v;
  std::memcpy(&v, src, sizeof v);
  return v;
}
GAC_INLINE Vec LoadVec(const BF16* src) {
#if defined(__AVX512F__)
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  return reinterpret_cast<Vec>(_mm512_slli_epi32(w, 16));
#elif defined(__AVX2__)
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  return reinterpret_cast<Vec>(_mm256_slli_epi32(w, 16));
#else
  Vec16 h;
  std::memcpy(&h, src, sizeof h);
  return reinterpret_cast<Vec>(__builtin_convertvector(h, Vec32) << 16);
#endif
}
GAC_INLINE Vec LoadVec(const F16* src) {
#if defined(__AVX512F__)
  return reinterpret_cast<Vec>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))));
#elif defined(__AVX2__) && defined(__F16C__)
  return reinterpret_cast<Vec>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
#else
  float f[kWidth];
  for (int j = 0; j < kWidth; ++j) f[j] = Load(src[j]);
  Vec v;
  std::memcpy(&v, f, sizeof v);
  return v;
#endif
}

// Loads the first m elements (0 < m < kWidth) into the first lanes; the other
// lanes are zero. Reads nothing beyond src[m - 1].
template <typename T>
GAC_INLINE Vec LoadPartial(const T* src, int m) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  const auto mask = static_cast<__mmask16>((1u << m) - 1u);
  if constexpr (std::is_same_v<T, float>) {
    return reinterpret_cast<Vec>(_mm512_maskz_loadu_ps(mask, src));
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, src);
    if constexpr (std::is_same_v<T, BF16>) {
      return reinterpret_cast<Vec>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return reinterpret_cast<Vec>(_mm512_cvtph_ps(h));
    }
  }
#else
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return reinterpret_cast<Vec>(_mm256_maskload_ps(src, mask));
  }
#endif
  float f[kWidth] = {};
  for (int j = 0; j < m; ++j) f[j] = Load(src[j]);
  Vec v;
  std::memcpy(&v, f, sizeof v);
  return v;
#endif
}

// Loads kLanes elements as fp32.
template <typename T>
GAC_INLINE Lanes LoadLanes(const T* src) {
  Lanes l;
  for (int k = 0; k < kVecs; ++k) l.v[k] = LoadVec(src + k * kWidth);
  return l;
}
// Loads n < kLanes elements into the first lanes; the other lanes are zero.
template <typename T>
GAC_INLINE Lanes LoadTail(const T* src, int n) {
  Lanes l;
  for (int k = 0; k < kVecs; ++k) {
    const int m = std::clamp(n - k * kWidth, 0, kWidth);
    l.v[k] = m == kWidth ? LoadVec(src + k * kWidth) : m == 0 ? Vec{} : LoadPartial(src + k * kWidth, m);
  }
  return l;
}

// acc += x * y, lane by lane.
GAC_INLINE void Fma(Lanes& acc, const Lanes& x, const Lanes& y) {
  for (int k = 0; k < kVecs; ++k) acc.v[k] += x.v[k] * y.v[k];
}

// Sums the lanes pairwise in a fixed order: lane j with lane j + 8, then
// j + 4, j + 2, j + 1. A few vector additions and shuffles, not a chain of
// scalar additions.
GAC_INLINE float SumLanes(Lanes l) {
  static_assert(kLanes == 16, "the reduction below assumes 16 lanes");
  for (int half = kVecs / 2; half > 0; half /= 2) {
    for (int k = 0; k < half; ++k) l.v[k] += l.v[k + half];
  }
  Vec4 q;
#if defined(__AVX512F__)
  const Vec8 h = __builtin_shufflevector(l.v[0], l.v[0], 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(l.v[0], l.v[0], 8, 9, 10, 11, 12, 13, 14, 15);
  q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
#elif defined(__AVX__)
  q = __builtin_shufflevector(l.v[0], l.v[0], 0, 1, 2, 3) + __builtin_shufflevector(l.v[0], l.v[0], 4, 5, 6, 7);
#else
  q = l.v[0];
#endif
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// SumLanes of three accumulators at once: the same additions of the same
// pairs (so the same bits), with the three sums packed into shared vectors.
GAC_INLINE void SumLanes3(Lanes a, Lanes b, Lanes c, float* sa, float* sb, float* sc) {
#if defined(__AVX512F__)
  static_assert(kVecs == 1, "one 16-lane vector per accumulator");
  const Vec x = a.v[0], y = b.v[0], z = c.v[0];
  // Lane j + lane j + 8: a and b side by side, c alone.
  const Vec ab = __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                 __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const Vec8 c8 = __builtin_shufflevector(z, z, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(z, z, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec cc = __builtin_shufflevector(c8, c8, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
  // Lane j + lane j + 4: four-lane groups a, b, c (and c again).
  const Vec e = __builtin_shufflevector(ab, cc, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 16, 17, 18, 19) +
                __builtin_shufflevector(ab, cc, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 20, 21, 22, 23);
  // (q0 + q2) + (q1 + q3) in every group.
  const Vec f = e + __builtin_shufflevector(e, e, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  const Vec r = f + __builtin_shufflevector(f, f, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  *sa = r[0];
  *sb = r[4];
  *sc = r[8];
#elif defined(__AVX__)
  static_assert(kVecs == 2, "two 8-lane vectors per accumulator");
  // Lane j + lane j + 8.
  const Vec x = a.v[0] + a.v[1], y = b.v[0] + b.v[1], z = c.v[0] + c.v[1];
  // Lane j + lane j + 4: a and b side by side, c alone.
  const Vec e = __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15);
  const Vec4 q = __builtin_shufflevector(z, z, 0, 1, 2, 3) + __builtin_shufflevector(z, z, 4, 5, 6, 7);
  // (q0 + q2) + (q1 + q3) in every group.
  const Vec f = e + __builtin_shufflevector(e, e, 2, 3, 0, 1, 6, 7, 4, 5);
  const Vec r = f + __builtin_shufflevector(f, f, 1, 0, 3, 2, 5, 4, 7, 6);
  *sa = r[0];
  *sb = r[4];
  *sc = (q[0] + q[2]) + (q[1] + q[3]);
#else
  *sa = SumLanes(a);
  *sb = SumLanes(b);
  *sc = SumLanes(c);
#endif
}

// Element i of a block goes to lane i % kLanes (a tail shorter than kLanes
// to the first lanes); the lanes are summed per block (SumLanes) and the
// block sums in fp64.
// `out` carries a running sum: statistics of consecutive pieces that start
// on block boundaries add up to the bits of one call over them all.
template <typename G, typename P>
GAC_INLINE Partial StatsT(const G* __restrict g, const P* __restrict p, std::int64_t n, Partial out = {}) {
  for (std::int64_t b = 0; b < n; b += kBlock) {
    const std::int64_t e = std::min(n, b + kBlock);
    Lanes d = {}, x2 = {}, y2 = {};
    std::int64_t i = b;
    for (; i + kLanes <= e; i += kLanes) {
      const Lanes x = LoadLanes(g + i);
      const Lanes y = LoadLanes(p + i);
      Fma(d, x, y);
      Fma(x2, x, x);
      Fma(y2, y, y);
    }
    if (i < e) {
      const Lanes x = LoadTail(g + i, static_cast<int>(e - i));
      const Lanes y = LoadTail(p + i, static_cast<int>(e - i));
      Fma(d, x, y);
      Fma(x2, x, x);
      Fma(y2, y, y);
    }
    float sd, sx, sy;
    SumLanes3(d, x2, y2, &sd, &sx, &sy);
    out.dot += sd;
    out.grad_sq += sx;
    out.ref_sq += sy;
  }
  return out;
}

template <typename G>
GAC_INLINE Partial NormT(const G* __restrict g, std::int64_t n, Partial out = {}) {
  for (std::int64_t b = 0; b < n; b += kBlock) {
    const std::int64_t e = std::min(n, b + kBlock);
    Lanes x2 = {};
    std::int64_t i = b;
    for (; i + kLanes <= e; i += kLanes) {
      const Lanes x = LoadLanes(g + i);
      Fma(x2, x, x);
    }
    if (i < e) {
      const Lanes x = LoadTail(g + i, static_cast<int>(e - i));
      Fma(x2, x, x);
    }
    out.grad_sq += SumLanes(x2);
  }
  return out;
}

template <typename G, typename P>
GAC_INLINE void ProjectSnapshotT(G* __restrict g, P* __restrict p, std::int64_t n, float coeff,
                                 bool snapshot_projected) {
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
    // An empty tensor's data pointer may be null, which memcpy must not get.
    if (n > 0) std::memcpy(p, g, static_cast<std::size_t>(n) * sizeof(G));
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

// Spans are often small and scattered (e.g. separately allocated 4 KiB
// tensors), where the hardware prefetchers stop at every span and, after the
// caches and TLBs have been flushed, each span starts with a page walk for g
// and one for p. Asking for the first line of span i + kSpansAhead starts
// those walks and the first misses early; the streamers then cover the rest
// of the span. (Measured on 2,000 x 4 KiB tensors after a cache flush: -12 to
// -24 % for the statistics pass on one thread. Prefetching every line of the
// next spans, or line by line in step with the loads, was slower or no better.)
constexpr std::int64_t kSpansAhead = 8;
// Runs up to this many elements count as small (see SnapshotSpans).
constexpr std::int64_t kSmallSpan = 256;
// rw: 1 when the pass writes the span (the apply passes), 0 for reading only.
template <int rw>
GAC_INLINE void PrefetchSpan(const Span& s, bool with_p) {
  const char* g = static_cast<const char*>(s.g);
  __builtin_prefetch(g, rw);
  if (with_p) __builtin_prefetch(s.p, rw);
  // A gradient span that ends on another 4 KiB page (a 4 KiB tensor that
  // malloc did not align straddles two): that page's walk starts early too.
  // (-4 % for the pass over 2,000 x 4 KiB tensors on two threads; skipped
  // for small spans, where it would only add to the host overhead.)
  if (s.n > kSmallSpan && g != nullptr) {
    const char* g_last = g + s.n * (s.gt == ElemType::kF32 ? 4 : 2) - 1;
    if (((reinterpret_cast<std::uintptr_t>(g) ^ reinterpret_cast<std::uintptr_t>(g_last)) >> 12) != 0) {
      __builtin_prefetch(g_last, rw);
    }
  }
}
template <int rw>
GAC_INLINE void PrefetchAhead(const Span* spans, std::int64_t i, std::int64_t count, bool with_p = true) {
  if (i + kSpansAhead < count) PrefetchSpan<rw>(spans[i + kSpansAhead], with_p);
}

void StatsSpans(const Span* spans, std::int64_t count, ElemType pt, bool with_p, Partial* out, Partial* sum) {
  Partial total = sum != nullptr ? *sum : Partial{};
  // The first spans of the list: their walks and first misses start together.
  for (std::int64_t i = 0; i < std::min(count, kSpansAhead); ++i) PrefetchSpan<0>(spans[i], with_p);
  for (std::int64_t i = 0; i < count; ++i) {
    PrefetchAhead<0>(spans, i, count, with_p);
    const Span& s = spans[i];
    Partial r;  // zero for a skipped span
    if (s.g != nullptr && s.counted) {
      // fp32 with a snapshot, the common case, is inlined.
      r = s.gt == ElemType::kF32 && pt == ElemType::kF32 && with_p
              ? StatsT(static_cast<const float*>(s.g), static_cast<const float*>(s.p), s.n)
              : Stats(s.g, s.gt, with_p ? s.p : nullptr, pt, s.n);
    }
    if (out != nullptr) out[i] = r;
    total.dot += r.dot;
    total.grad_sq += r.grad_sq;
    total.ref_sq += r.ref_sq;
  }
  if (sum != nullptr) *sum = total;
}

void ProjectSnapshotSpans(const Span* spans, std::int64_t count, ElemType pt, float coeff, bool snapshot_projected) {
  for (std::int64_t i = 0; i < count; ++i) {
    PrefetchAhead<1>(spans, i, count);
    const Span& s = spans[i];
    if (s.g == nullptr) continue;
    if (s.gt == ElemType::kF32 && pt == ElemType::kF32) {  // the common case, inlined
      ProjectSnapshotT(static_cast<float*>(s.g), static_cast<float*>(s.p), s.n, coeff, snapshot_projected);
    } else {
      ProjectSnapshot(s.g, s.gt, s.p, pt, s.n, coeff, snapshot_projected);
    }
  }
}

void SnapshotSpans(const Span* spans, std::int64_t count, ElemType pt) {
  for (std::int64_t i = 0; i < count; ++i) {
    PrefetchAhead<1>(spans, i, count);
    const Span& s = spans[i];
    if (s.g == nullptr) continue;
    if (s.gt == ElemType::kF32 && pt == ElemType::kF32 && s.n <= kSmallSpan) {
      // Small fp32 runs, inlined: a library memcpy costs more than the copy.
      const float* g = static_cast<const float*>(s.g);
      float* p = static_cast<float*>(s.p);
      std::int64_t j = 0;
      for (; j + kWidth <= s.n; j += kWidth) std::memcpy(p + j, g + j, sizeof(Vec));
      for (; j < s.n; ++j) p[j] = g[j];
    } else {
      Snapshot(s.g, s.gt, s.p, pt, s.n);
    }
  }
}

}  // namespace

#define GAC_STR2(x) #x
#define GAC_STR(x) GAC_STR2(x)
extern const Kernels kKernels = {&Stats,      &ProjectSnapshot,      &Snapshot,
                                 &StatsSpans, &ProjectSnapshotSpans, &SnapshotSpans,
                                 GAC_STR(GAC_KERNEL_ISA)};

}  // namespace GAC_KERNEL_ISA
}  // namespace gac::agent::cpu
