// The agent's CPU passes over one contiguous run of gradient and snapshot
// elements, or over a list of such runs (spans) in one call. Raw pointers, no
// LibTorch: the caller splits tensors into chunks and runs chunks on threads.
// Each kernel is compiled once per instruction set (baseline, AVX2+FMA+F16C,
// AVX-512) and dispatched at run time.
//
// Numerics: products accumulate in fp32 in 16 fixed lanes over blocks of 512
// elements, the lanes are summed pairwise and the block sums in fp64, so the
// relative error stays near 1e-7 for any n. The result for a run depends only
// on its data and length, not on how runs are grouped into calls.
// All functions are thread-safe on disjoint memory.
#ifndef GAC_AGENT_SRC_CPU_KERNELS_H_
#define GAC_AGENT_SRC_CPU_KERNELS_H_

#include <cstdint>

namespace gac::agent::cpu {

enum class ElemType : std::uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct Partial {
  double dot = 0.0;
  double grad_sq = 0.0;  // |g|^2
  double ref_sq = 0.0;   // |p|^2
};

// One run of a multi-span call: n elements of a gradient (type gt) and of its
// snapshot slice (the call's type pt).
struct Span {
  void* g = nullptr;  // null: the span is skipped (its result is zero)
  void* p = nullptr;
  std::int64_t n = 0;
  ElemType gt = ElemType::kF32;
  // False: the statistics passes skip the span (another rank counts the same
  // values); the apply passes do not.
  bool counted = true;
};

struct Kernels {
  // dot = <g,p>, grad_sq = |g|^2, ref_sq = |p|^2 over n elements. p == nullptr: only grad_sq.
  Partial (*stats)(const void* g, ElemType gt, const void* p, ElemType pt, std::int64_t n);
  // g <- g - coeff * p and p <- (snapshot_projected ? new g : old g), one pass.
  void (*project_snapshot)(void* g, ElemType gt, void* p, ElemType pt, std::int64_t n, float coeff,
                           bool snapshot_projected);
  // p <- g (converted to p's type, round-to-nearest-even).
  void (*snapshot)(const void* g, ElemType gt, void* p, ElemType pt, std::int64_t n);

  // The same passes over spans[0, count), in order; per span the arithmetic is
  // exactly that of the single-run function. These save the call and dispatch
  // per run when the runs are small (many small tensors).
  //
  // stats() of every span (with_p false: as p == nullptr; a skipped span
  // gives a zero Partial). When out is not null, out[i] gets span i's result;
  // when sum is not null, the results are added to *sum in span order. So
  // summing a list in one call, in several calls in order, or summing out[]
  // in order afterwards all give the same bits.
  void (*stats_spans)(const Span* spans, std::int64_t count, ElemType pt, bool with_p, Partial* out, Partial* sum);
  void (*project_snapshot_spans)(const Span* spans, std::int64_t count, ElemType pt, float coeff,
                                 bool snapshot_projected);
  void (*snapshot_spans)(const Span* spans, std::int64_t count, ElemType pt);

  const char* isa;  // "avx512", "avx2" or "baseline"
};

// The best kernels this CPU supports (decided once).
const Kernels& BestKernels();
// Kernels for a named instruction set; null when the CPU lacks it or the
// build does not have it. Used by tests to cover every variant.
const Kernels* KernelsFor(const char* isa);

}  // namespace gac::agent::cpu

#endif  // GAC_AGENT_SRC_CPU_KERNELS_H_
