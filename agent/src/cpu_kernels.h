// The agent's CPU passes over one contiguous run of gradient and snapshot
// elements. Raw pointers, no LibTorch: the caller splits tensors into chunks
// and runs chunks on threads. Each kernel is compiled once per instruction
// set (baseline, AVX2+FMA+F16C, AVX-512) and dispatched at run time.
//
// Numerics: products accumulate in fp32 over blocks of kBlock elements and
// the block sums in fp64, so the relative error stays near 1e-7 for any n.
// All functions are thread-safe on disjoint memory.
#ifndef GAC_AGENT_SRC_CPU_KERNELS_H_
#define GAC_AGENT_SRC_CPU_KERNELS_H_

#include <cstdint>

namespace gac::agent::cpu {

enum class ElemType : std::uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct Partial {
  double dot = 0.0;
  double gg = 0.0;
  double pp = 0.0;
};

struct Kernels {
  // dot = <g,p>, gg = |g|^2, pp = |p|^2 over n elements. p == nullptr: only gg.
  Partial (*stats)(const void* g, ElemType gt, const void* p, ElemType pt, std::int64_t n);
  // g <- g - coeff * p and p <- (snapshot_projected ? new g : old g), one pass.
  void (*project_snapshot)(void* g, ElemType gt, void* p, ElemType pt, std::int64_t n, float coeff,
                           bool snapshot_projected);
  // p <- g (converted to p's type, round-to-nearest-even).
  void (*snapshot)(const void* g, ElemType gt, void* p, ElemType pt, std::int64_t n);
  const char* isa;  // "avx512", "avx2" or "baseline"
};

// The best kernels this CPU supports (decided once).
const Kernels& BestKernels();
// Kernels for a named instruction set; null when the CPU lacks it or the
// build does not have it. Used by tests to cover every variant.
const Kernels* KernelsFor(const char* isa);

}  // namespace gac::agent::cpu

#endif  // GAC_AGENT_SRC_CPU_KERNELS_H_
