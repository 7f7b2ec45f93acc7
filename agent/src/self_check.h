// The first-contact check of gac's GPU kernels: on the first steps on a
// device, the kernels' statistics of the trainer's own gradients are
// compared with the front's passes (the torch-ops path) on the same step;
// a difference beyond the tolerance sets the kernels aside for that device,
// in every agent of the process, with one warning. The verdict is kept per
// device for the life of the process.
//
// Thread safety: the registry functions are thread-safe; Compare is pure.
#ifndef GAC_AGENT_SRC_SELF_CHECK_H_
#define GAC_AGENT_SRC_SELF_CHECK_H_

#include <cstddef>
#include <string>

namespace gac::agent {

// Both paths read the same fp32/bf16/fp16 values and accumulate in fp32 per
// piece and fp64 across pieces, in different orders: they differ by about
// 1e-6 relative at most (docs/BENCHMARKS.md). A broken kernel is off by far
// more; 1e-4 leaves room for long tensors without hiding one.
inline constexpr double kSelfCheckTolerance = 1e-4;

enum class SelfCheckState { kUnchecked, kPassed, kFailed };

// The verdict so far for CUDA device `device`.
SelfCheckState SelfCheckStateOf(int device);
void RecordSelfCheck(int device, bool passed);

// The comparison of one step's local sums (the layout of Plan::reduced:
// dot, |g|^2, |p|^2, then three per group).
struct SelfCheckResult {
  bool conclusive = false;   // finite sums with a reference: a verdict can be given
  double max_difference = 0;  // relative: |g|^2 and |p|^2 to themselves, <g,p> to |g||p|
  std::string worst;          // which sum differed most, e.g. "|g|^2 of layer 2"
};
SelfCheckResult CompareSums(const double* kernels, const double* reference, std::size_t num_groups, bool with_p);

}  // namespace gac::agent

#endif  // GAC_AGENT_SRC_SELF_CHECK_H_
