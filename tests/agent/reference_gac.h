// A plain GAC for tests: concatenates every gradient into one fp64 vector and
// applies docs/ALGORITHM.md's formulas directly, independently of gac::Controller and
// of the agent's kernels. Slow and simple on purpose: it is the oracle.
#ifndef GAC_TESTS_AGENT_REFERENCE_GAC_H_
#define GAC_TESTS_AGENT_REFERENCE_GAC_H_

#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace gac::testing {

struct RefDecision {
  std::string regime;  // "safe", "project", "skip", "invalid"
  std::optional<double> cosine;
  bool step_optimizer = true;
};

struct RefOptions {
  double c_low = 0.05;
  double c_high = 0.3;
  bool exact_alpha = false;
  bool local = true;                 // false: monitor
  bool snapshot_bf16 = false;
  bool applied_update_reference = false;
};

class ReferenceGac {
 public:
  explicit ReferenceGac(RefOptions o) : o_(o) {}

  // Reads the gradients of `params` (undefined ones are left out), decides,
  // and in local mode writes projected gradients back.
  RefDecision Step(const std::vector<at::Tensor>& params) {
    std::vector<at::Tensor> flat;
    std::vector<std::size_t> with_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad().defined()) {
        flat.push_back(params[i].grad().reshape({-1}).to(at::kDouble));
        with_grad.push_back(i);
      }
    }
    const at::Tensor g = flat.empty() ? at::zeros({0}, at::kDouble) : at::cat(flat);
    if (prev_.size() != params.size()) prev_.assign(params.size(), at::Tensor());
    // Previous values of the parameters that have a gradient now.
    std::vector<at::Tensor> prev_parts;
    for (std::size_t i : with_grad) {
      prev_parts.push_back(prev_[i].defined() ? prev_[i] : at::zeros({params[i].numel()}, at::kDouble));
    }
    const at::Tensor p = prev_parts.empty() ? at::zeros({0}, at::kDouble) : at::cat(prev_parts);
    const double dot = (g * p).sum().item<double>();
    const double gg = (g * g).sum().item<double>();
    const double pp = (p * p).sum().item<double>();

    RefDecision d;
    at::Tensor applied = g;
    if (!std::isfinite(dot) || !std::isfinite(gg) || !std::isfinite(pp)) {
      d.regime = "invalid";
      d.step_optimizer = !o_.local;
      return d;  // snapshot kept
    }
    if (!has_ref_ || pp == 0.0) {
      d.regime = "safe";
    } else {
      const double c = dot / (std::sqrt(gg * pp) + 1e-8);
      d.cosine = c;
      const double a = std::fabs(c);
      if (a <= o_.c_low) {
        d.regime = "safe";
      } else if (a >= o_.c_high) {
        d.regime = "skip";
        d.step_optimizer = !o_.local;
      } else {
        d.regime = "project";
        const double alpha = o_.exact_alpha
                                 ? o_.c_low * std::sqrt(1 - c * c) / (a * std::sqrt(1 - o_.c_low * o_.c_low))
                                 : o_.c_low / a;
        if (o_.local) applied = g - (1 - alpha) * (dot / pp) * p;
      }
    }
    // Write back the projected gradients and the snapshot.
    const bool write_snapshot = !o_.applied_update_reference || d.step_optimizer;
    std::int64_t off = 0;
    for (std::size_t i : with_grad) {
      const std::int64_t n = params[i].numel();
      at::Tensor grad = params[i].grad();
      if (d.regime == "project" && o_.local) {
        grad.copy_(applied.slice(0, off, off + n).view(grad.sizes()));
      }
      if (write_snapshot) {
        // The applied update is what was written back, in the gradient's dtype.
        const at::Tensor src = o_.applied_update_reference ? grad.reshape({-1}).to(at::kDouble)
                                                           : g.slice(0, off, off + n);
        prev_[i] = o_.snapshot_bf16 ? src.to(at::kFloat).to(at::kBFloat16).to(at::kDouble)
                                    : src.to(at::kFloat).to(at::kDouble);
      }
      off += n;
    }
    if (write_snapshot) has_ref_ = true;
    return d;
  }

 private:
  RefOptions o_;
  bool has_ref_ = false;
  std::vector<at::Tensor> prev_;  // fp64, flat, per parameter
};

}  // namespace gac::testing

#endif  // GAC_TESTS_AGENT_REFERENCE_GAC_H_
