// The policy-health signals of one batch (gac::controller::PolicyHealth),
// computed by the example trainer from its loss's own tensors with the
// definitions of the Python reference, python/gac/rl.py's `signals` (docs/
// PYTHON.md, "Policy-health signals: gac.rl"): over the n masked tokens,
// with r = exp(log pi_learner - log pi_behaviour),
//
//   ess_token            (sum r)^2 / (n sum r^2), in log space: shifted by
//                        the largest log r, so log-ratios of +-1000 neither
//                        overflow nor vanish; ess_sequence the same over the
//                        sequences' weights exp(sum of their log-ratios)
//   clip_fraction_high   r > 1 + clip_high and, with advantages, A > 0
//   clip_fraction_low    r < 1 - clip_low and, with advantages, A < 0
//   truncation_fraction  r > truncation
//   log_ratio_max/p99/p1 of the masked log r (quantiles interpolate linearly
//                        between order statistics, numpy's default)
//   kl_k3                mean (r - 1) - log r, summed as sum expm1(log r) -
//                        sum log r; the largest double where it overflows
//   log_ratio_abs_mean   mean |log r|
//   entropy_mean         mean of the given per-token entropies
//   staleness_*          current_version - version over the sequences with
//                        a masked token
//
// Everything in fp64 (the log-ratio is the fp64 difference of the inputs:
// exact for bf16 and fp16), with ATen ops on the tensors' device and one
// device-to-host transfer of the ~20 results. Padding (mask 0) contributes
// nothing, whatever it holds (NaN included). Data that gives no signal is
// no error: no masked token, or a non-finite value at a masked token in
// either log-probability, the advantages or the entropies, gives `invalid`
// with every value absent; no value is ever NaN.
//
// Thread safety: pure functions of their arguments.
#ifndef GAC_EXAMPLES_GRPO_POLICY_SIGNALS_H_
#define GAC_EXAMPLES_GRPO_POLICY_SIGNALS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "examples/grpo/grpo.h"
#include "gac/controller/policy_health.h"

namespace gac::grpo {

// The tensors and bounds of one batch, (B, T) = (sequences, tokens). An
// undefined tensor is an input not given.
struct SignalInputs {
  at::Tensor logprobs;      // (B, T) floating: the learner's log pi(y_t)
  at::Tensor old_logprobs;  // (B, T) floating: the behaviour policy's
  at::Tensor mask;          // (B, T) bool, integer or float, counted where != 0; undefined: every token
  at::Tensor advantages;    // (B, T) or (B,) floating; undefined: the clip sides ignore the sign
  // The loss's ratio range [1 - clip_low, 1 + clip_high] (epsilons >= 0);
  // nullopt: that side is not clipped (its fraction absent).
  std::optional<double> clip_low, clip_high;
  std::optional<double> truncation;  // C > 0 of truncated importance sampling; nullopt: none
  at::Tensor entropies;              // (B, T) floating; undefined: entropy_mean absent
  at::Tensor versions;               // (B,) integer policy versions; undefined: staleness absent
  std::int64_t current_version = 0;  // the version being trained (read with versions)
};

// The signals of `in` (see the file comment). Throws c10::Error (TORCH_CHECK)
// for programming errors: shapes that do not match, non-floating
// log-probabilities, advantages or entropies, integer-typed checks failed, a
// bad bound (negative or NaN epsilon, truncation <= 0), tensors on other
// devices, or a counted sequence whose version is ahead of current_version.
controller::PolicyHealth ComputePolicySignals(const SignalInputs& in);

// The inputs of a trainer batch and its loss: (B, T) = (sequences,
// kAnswerDigits), every token counted, the advantages per token, the
// learner's log-probabilities and entropies from `loss` (LossResult::logp,
// token_entropy), and the loss's effective bounds: GRPO's [1 - clip_eps,
// 1 + clip_eps], BAPO's adapted [bapo_lo, bapo_hi] of this batch, no clip
// sides for M2PO, IS and TIS, and TIS's truncation at tis_cap. The trainer
// knows the behaviour version of the whole batch, not of each sequence:
// every sequence gets `behaviour_version`.
SignalInputs BatchSignalInputs(const Rollouts& batch, const LossResult& loss, const LossOptions& options,
                               std::int64_t behaviour_version, std::int64_t current_version);

}  // namespace gac::grpo

#endif  // GAC_EXAMPLES_GRPO_POLICY_SIGNALS_H_
