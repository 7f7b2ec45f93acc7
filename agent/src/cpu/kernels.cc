#include "agent/src/cpu/kernels.h"

#include <cstring>
#include <initializer_list>

#if defined(GAC_HAVE_X86_KERNELS) && defined(__clang__) && __clang_major__ < 15
#include <cpuid.h>
#endif

namespace gac::agent::cpu {

namespace baseline { extern const Kernels kKernels; }
#if defined(GAC_HAVE_X86_KERNELS)
namespace avx2 { extern const Kernels kKernels; }
namespace avx512 { extern const Kernels kKernels; }
#endif

#if defined(GAC_HAVE_X86_KERNELS)
namespace {

bool CpuHasF16c() {
#if defined(__clang__) && __clang_major__ < 15
  // Clang before 15 does not know "f16c" in __builtin_cpu_supports: CPUID
  // leaf 1, ECX bit 29.
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
#else
  return __builtin_cpu_supports("f16c");
#endif
}

}  // namespace
#endif

const Kernels* KernelsFor(const char* isa) {
#if defined(GAC_HAVE_X86_KERNELS)
  if (std::strcmp(isa, "avx512") == 0) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx2") && CpuHasF16c() && __builtin_cpu_supports("fma")
               ? &avx512::kKernels
               : nullptr;
  }
  if (std::strcmp(isa, "avx2") == 0) {
    return __builtin_cpu_supports("avx2") && CpuHasF16c() && __builtin_cpu_supports("fma")
               ? &avx2::kKernels
               : nullptr;
  }
#endif
  if (std::strcmp(isa, "baseline") == 0) return &baseline::kKernels;
  return nullptr;
}

const Kernels& BestKernels() {
  static const Kernels* best = [] {
    for (const char* isa : {"avx512", "avx2"}) {
      if (const Kernels* k = KernelsFor(isa)) return k;
    }
    return &baseline::kKernels;
  }();
  return *best;
}

}  // namespace gac::agent::cpu
