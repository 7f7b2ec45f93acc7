// Measurements of gac_grpo's gradients that say how much of c_t is sampling
// noise and what staleness does to the gradient (docs/RESULTS.md):
//
//   - BackwardInHalves: the noise floor. The minibatch's gradient is computed
//     as the sum of the gradients of its two halves (whole prompt groups),
//     and the cosine of the two halves is reported: two independent
//     estimates of the same gradient, so their cosine is what c_t would be
//     with no change of the gradient between steps. Costs one more backward.
//   - MeasureEffectiveDimension: the participation ratio (sum l)^2 / sum l^2
//     of the eigenvalues l of the per-sample gradients' covariance, from the
//     Gram matrix of n per-sequence gradients. Two estimates: the sample PR
//     of the centred Gram matrix (at most n - 1), and tr(S)^2 / tr(S^2) with
//     tr(S) from the diagonal and tr(S^2) from the off-diagonal squares
//     (unbiased parts, not capped by n). For two independent noise vectors
//     with covariance S, E[cos^2] = tr(S^2) / tr(S)^2 = 1 / PR, which ties
//     the PR to the spread of the noise floor.
//   - MeasureStalenessBias: the paper's b_t, measured. A fresh batch is
//     sampled from the current policy and its gradient g_on taken at the
//     same parameters as the stale gradient g; b = g - g_on, lambda =
//     cos(b, g_prev), and the parts of b along g_prev before and after GAC's
//     projection of g. b holds both batches' sampling noise too; at s = 0 it
//     is noise only, which is the reference for the stale runs.
//
// All functions leave the parameters' .grad() as documented and use only the
// generators they are given (a run's sampling is the same with or without
// the probes).
#ifndef GAC_EXAMPLES_GRPO_PROBES_H_
#define GAC_EXAMPLES_GRPO_PROBES_H_

#include <ATen/ATen.h>

#include <random>
#include <vector>

#include "examples/grpo/grpo.h"

namespace gac::grpo {

// One tensor per parameter, in the order of Policy::params.
using GradList = std::vector<at::Tensor>;

// Clones of the parameters' gradients (zeros where a gradient is undefined).
GradList CopyGrads(const std::vector<at::Tensor>& params);
// Sum over all tensors, accumulated in double.
double Dot(const GradList& a, const GradList& b);
// Dot(a, b) / (|a| |b|); NaN when a norm is zero.
double Cosine(const GradList& a, const GradList& b);

// Backward of the loss on `batch` (whose per-token losses are `token_loss`)
// as two halves: the first half of the prompt groups, then the rest. Leaves
// .grad() = the gradient of token_loss.mean() (previous gradients are
// replaced) and returns the cosine of the two halves' gradients (NaN for a
// batch of one prompt, which then gets one plain backward).
double BackwardInHalves(const std::vector<at::Tensor>& params, const at::Tensor& token_loss, int prompts, int group);

struct EffectiveDimension {
  int samples = 0;
  double pr_sample = 0.0;  // centred Gram: tr(K)^2 / |K|_F^2, at most samples - 1
  double pr_pop = 0.0;     // tr(S)^2 / tr(S^2) from diagonal / off-diagonal terms
  double mean_pair_cos2 = 0.0;  // mean cos^2 of two centred per-sample gradients
};

// Both estimates from per-sample gradients, one per row of `per_sample` (n,
// parameters); rows are centred here. n < 3 gives samples = 0.
EffectiveDimension ParticipationRatio(const at::Tensor& per_sample);

// Per-sequence gradients of the loss on the first `groups` prompt groups of
// `batch` (recomputed on that sub-batch; M2PO's mask and BAPO's bounds are
// then those of the sub-batch). Does not touch .grad().
EffectiveDimension MeasureEffectiveDimension(const Policy& policy, const Policy& reference, const Rollouts& batch,
                                             int groups, const LossOptions& options);

struct StalenessBias {
  double bias_rel = 0.0;      // |b| / |g_on|
  double lambda = 0.0;        // cos(b, g_prev)
  double on_align = 0.0;      // cos(g_on, g_prev)
  double aligned_before = 0.0;  // <b, u> / |g_on|, u = g_prev / |g_prev|
  double aligned_after = 0.0;   // <g' - g_on, u> / |g_on|, g' = GAC's update
  double bias_after_rel = 0.0;  // |g' - g_on| / |g_on|
};

// `stale` is the raw gradient of this step at the policy's current
// parameters, `prev` the previous raw gradient; GAC's update is g' = alpha
// g_par + beta g_perp (alpha = beta = 1: untouched). The fresh batch has
// `prompts` prompts from `rng` and is sampled with `generator`. Does not
// touch .grad().
StalenessBias MeasureStalenessBias(const Policy& policy, const Policy& reference, const DigitTasks& tasks,
                                   int prompts, int group, const LossOptions& options, const GradList& stale,
                                   const GradList& prev, double alpha, double beta, std::mt19937_64& rng,
                                   at::Generator generator);

// GAC's update g' = alpha g_par + beta g_perp (the paper's Eq. 3) for a
// gradient the agent has already projected in place to g_a = g - (1 - alpha)
// (dot/pp) p, where `prev` holds p and `decision` is the agent's (regime
// project): g' = beta g_a + alpha (1 - beta) (dot/pp) p. The agent's kernels
// implement beta = 1 only; this is the (alpha, beta) ablation.
void ApplyOrthogonalGain(const std::vector<at::Tensor>& params, const GradList& prev, double alpha,
                         double dot_over_pp, double beta);

}  // namespace gac::grpo

#endif  // GAC_EXAMPLES_GRPO_PROBES_H_
