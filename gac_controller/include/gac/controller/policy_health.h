// PolicyHealth: the policy-health signals of one step's batch, as a trainer
// computes them from its policy-gradient loss's tensors (Python: gac.rl,
// which defines each signal; docs/PYTHON.md, "Policy-health signals"). The
// agent does not compute them: the trainer hands them over with the step
// (Python: agent.step(..., policy=...)) and they travel in the StepReport to
// the record (gac.v1.StepRecord fields 26-41).
//
// Over the batch's n masked tokens, with r = pi_learner / pi_behaviour per
// token: fractions of the n tokens, log-ratios, KL and entropy in nats,
// staleness in policy versions. A signal is absent when its input was not
// given (no entropies, no truncation bound, an unclipped side, no versions)
// or when the batch gave none (`invalid`).
//
// Thread safety: a value; not synchronised.
#ifndef GAC_CONTROLLER_POLICY_HEALTH_H_
#define GAC_CONTROLLER_POLICY_HEALTH_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace gac::controller {

struct PolicyHealth {
  std::int64_t tokens = 0;                    // n
  std::optional<double> ess_token;            // (sum r)^2 / (n sum r^2)
  std::optional<double> ess_sequence;         // the same over the sequences' weights
  std::optional<double> clip_fraction_low;    // clipped below 1 - eps_low (negative advantage)
  std::optional<double> clip_fraction_high;   // clipped above 1 + eps_high (positive advantage)
  std::optional<double> truncation_fraction;  // r above the truncation bound
  std::optional<double> log_ratio_max;        // before truncation
  std::optional<double> log_ratio_p99;
  std::optional<double> log_ratio_p1;
  std::optional<double> kl_k3;                // mean (r - 1) - log r
  std::optional<double> log_ratio_abs_mean;   // mean |log r|
  std::optional<double> entropy_mean;         // mean token entropy of the learner
  std::optional<double> staleness_min;        // over the batch's sequences
  std::optional<double> staleness_mean;
  std::optional<double> staleness_max;
  bool invalid = false;                       // the tensors gave no signal; every value absent
};

// The real-valued signals by their names (gac.rl.PolicySignals' attributes,
// the record's fields), for code that moves them all.
struct PolicyReal {
  const char* name;
  std::optional<double> PolicyHealth::*member;
};
inline constexpr PolicyReal kPolicyReals[] = {
    {"ess_token", &PolicyHealth::ess_token},
    {"ess_sequence", &PolicyHealth::ess_sequence},
    {"clip_fraction_low", &PolicyHealth::clip_fraction_low},
    {"clip_fraction_high", &PolicyHealth::clip_fraction_high},
    {"truncation_fraction", &PolicyHealth::truncation_fraction},
    {"log_ratio_max", &PolicyHealth::log_ratio_max},
    {"log_ratio_p99", &PolicyHealth::log_ratio_p99},
    {"log_ratio_p1", &PolicyHealth::log_ratio_p1},
    {"kl_k3", &PolicyHealth::kl_k3},
    {"log_ratio_abs_mean", &PolicyHealth::log_ratio_abs_mean},
    {"entropy_mean", &PolicyHealth::entropy_mean},
    {"staleness_min", &PolicyHealth::staleness_min},
    {"staleness_mean", &PolicyHealth::staleness_mean},
    {"staleness_max", &PolicyHealth::staleness_max},
};

// The baseline of the policy-health alerts GacPolicyEssLow and
// GacSamplerKlJump (dashboards/gac.rules.yml): the median of a series' first
// kEarlyValues values (the mean of the two middle ones), absent until that
// many were added. gacd's gauges (gac_ess_token_early_median_ratio,
// gac_kl_k3_early_median_nats) and gacctl backtest both keep it with this.
inline constexpr std::size_t kEarlyValues = 20;
class EarlyMedian {
 public:
  // Keeps `value` while fewer than kEarlyValues were added; the last of them
  // fixes the median.
  void Add(double value);
  const std::optional<double>& median() const { return median_; }

 private:
  std::vector<double> values_;
  std::optional<double> median_;
};

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_POLICY_HEALTH_H_
