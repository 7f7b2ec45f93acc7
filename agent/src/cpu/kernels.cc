#include "agent/src/cpu/kernels.h"

#include <cstring>
#include <initializer_list>

namespace gac::agent::cpu {

namespace baseline { extern const Kernels kKernels; }
#if defined(GAC_HAVE_X86_KERNELS)
namespace avx2 { extern const Kernels kKernels; }
namespace avx512 { extern const Kernels kKernels; }
#endif

const Kernels* KernelsFor(const char* isa) {
#if defined(GAC_HAVE_X86_KERNELS)
  if (std::strcmp(isa, "avx512") == 0) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                   __builtin_cpu_supports("fma")
               ? &avx512::kKernels
               : nullptr;
  }
  if (std::strcmp(isa, "avx2") == 0) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma")
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
