// FrontPasses: the statistics, projection and snapshot computed by the
// front with its own tensor library on the gradients' own device, for the
// devices gac has no kernels for (ROCm, XPU, MPS, an NVIDIA GPU without an
// image of gac's kernels), on request (AgentOptions::passes), and as the
// reference gac's CUDA kernels are checked against the first time they run
// on a device. The Python package's implementation is its torch-ops path
// (gac/_torch_ops.py). The core keeps everything else: the gather and its
// checks, the reduction across ranks, the spike guard, the decision and the
// report; so the rules are the same on every device.
//
// Used from the training thread only, like the agent that holds it.
#ifndef GAC_AGENT_FRONT_PASSES_H_
#define GAC_AGENT_FRONT_PASSES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gac/base/status.h"

namespace gac::agent {

class FrontPasses {
 public:
  virtual ~FrontPasses() = default;

  // This rank's sums over the gradients of the parameters i with present[i]
  // == 1 (the GradientSource's order; 0: no gradient this step, 2: a
  // gradient another rank counts, AgentOptions::uncounted, which Apply still
  // covers): out[0..3) = <g,p>, |g|^2, |p|^2 (<g,p> and
  // |p|^2 zero without with_p), then the same three per group for the
  // parameters with group_of[i] == group (FrontPassesRequest). Each
  // tensor's sums accumulate in fp32 or wider, the tensors' in fp64, as the
  // kernels do. Non-finite values propagate (the decision calls the step
  // invalid). An error leaves the snapshot as it was.
  virtual base::Status Statistics(const std::vector<char>& present, bool with_p, double* out) = 0;

  // Over the parameters of the last Statistics() with a gradient: with `project`,
  // g <- g - coeff * p (in fp32, stored rounded to nearest even in g's type)
  // and p <- (snapshot_projected ? the stored new g : the old g); otherwise
  // p <- g. Parameters without a gradient keep their snapshot.
  virtual base::Status Apply(bool project, float coeff, bool snapshot_projected) = 0;

  // Bytes the snapshot holds on the device.
  virtual std::int64_t snapshot_bytes() const = 0;
  // What the report's `passes` says when these run (e.g. "torch"); a
  // string that lives as long as the process.
  virtual const char* name() const = 0;
};

struct FrontPassesRequest {
  int device_index = -1;           // the device's ordinal (-1: the CPU or the only one)
  const char* device_name = "";    // "cpu", "cuda:0", "xpu:1", ...
  bool bf16_snapshot = false;      // else fp32
  std::vector<int> group_of;       // per parameter: its group (AgentOptions::layers), or -1
  int num_groups = 0;
};

// Makes the front's passes for a plan (the first step after the agent's
// creation or Reset()); Unimplemented where the front cannot.
using FrontPassesFactory =
    std::function<base::StatusOr<std::unique_ptr<FrontPasses>>(const FrontPassesRequest& request)>;

}  // namespace gac::agent

#endif  // GAC_AGENT_FRONT_PASSES_H_
