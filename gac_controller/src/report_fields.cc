#include "gac/controller/report_fields.h"

#include <cstddef>
#include <cstring>
#include <optional>

namespace gac::controller {
namespace {

ReportValue Int(std::int64_t v) {
  ReportValue out;
  out.integer = v;
  return out;
}
ReportValue Real(double v) {
  ReportValue out;
  out.real = v;
  return out;
}
ReportValue OptReal(const std::optional<double>& v) {
  ReportValue out;
  out.present = v.has_value();
  out.real = v.value_or(0.0);
  return out;
}
ReportValue Absent() {
  ReportValue out;
  out.present = false;
  return out;
}

using R = StepReport;

// A spike score's z, the part of it the report shows.
std::optional<double> Z(const std::optional<SpikeScore>& score) {
  return score ? std::optional<double>(score->z) : std::nullopt;
}

// A policy-health signal of the report (None without signals).
template <std::optional<double> PolicyHealth::*kMember>
ReportValue Signal(const R& r) {
  return r.policy ? OptReal((*r.policy).*kMember) : Absent();
}
// The name of `value` when it is the number of one of `all`, else "unknown".
template <typename Enum, std::size_t N>
const char* NameIn(const Enum (&all)[N], const char* (*name)(Enum), std::int64_t value) {
  for (Enum e : all) {
    if (static_cast<std::int64_t>(e) == value) return name(e);
  }
  return "unknown";
}

}  // namespace

// Order: the order of the Python properties and of to_dict()'s keys.
const ReportField kReportFields[kReportFieldCount] = {
    {"step", ReportType::kInteger, false, "steps", "The optimiser step index the agent was given.",
     [](const R& r) { return Int(r.step); }},
    {"loss", ReportType::kReal, true, "",
     "The loss the trainer gave with the step (with a process group: the ranks' mean), or None.",
     [](const R& r) { return OptReal(r.loss); }},
    {"mode", ReportType::kMode, false, "",
     "The agent's mode for this step: 'local', 'monitor' or 'remote' (in monitor mode the regime is what GAC "
     "would have done).",
     [](const R& r) { return Int(static_cast<std::int64_t>(r.mode)); }},
    {"regime", ReportType::kRegime, false, "",
     "'safe', 'project', 'skip', 'invalid' or 'spike' (monitor mode: what local mode would do).",
     [](const R& r) { return Int(static_cast<std::int64_t>(r.decision.regime)); }},
    {"cosine", ReportType::kReal, true, "",
     "c_t = cos(g, p); None on the first step, after a reset and with non-finite gradients.",
     [](const R& r) { return OptReal(r.decision.cosine); }},
    {"cosine_after", ReportType::kReal, true, "",
     "The cosine of the applied update with p; None for skip, invalid and no reference.",
     [](const R& r) { return OptReal(r.decision.cosine_after); }},
    {"window_mean", ReportType::kReal, true, "",
     "m_t, the signed mean of the agent's last `window` cosines, this one included; None until that many are "
     "held. trigger='window' decides on it.",
     [](const R& r) { return OptReal(r.decision.window_mean); }},
    {"grad_norm_z", ReportType::kReal, true, "",
     "The spike guard's z-score of |g| against the run's recent steps; None when its z-score is off or "
     "warming up.",
     [](const R& r) { return OptReal(Z(r.decision.spike_verdict.grad_norm)); }},
    {"loss_z", ReportType::kReal, true, "",
     "The spike guard's z-score of the loss against the run's recent steps; None without a loss.",
     [](const R& r) { return OptReal(Z(r.decision.spike_verdict.loss)); }},
    {"alpha", ReportType::kReal, false, "", "The gain on the gradient's component along p (1 = untouched).",
     [](const R& r) { return Real(r.decision.alpha); }},
    {"projection_coeff", ReportType::kReal, false, "",
     "g' = g - projection_coeff * p: (1 - alpha) <g,p> / |p|^2 when projecting, else 0.",
     [](const R& r) { return Real(r.decision.projection_coeff); }},
    {"grad_norm", ReportType::kReal, false, "", "|g| before projection (all ranks).",
     [](const R& r) { return Real(r.decision.grad_norm); }},
    {"ref_norm", ReportType::kReal, false, "", "|p|, the reference's norm (all ranks).",
     [](const R& r) { return Real(r.decision.ref_norm); }},
    {"step_optimizer", ReportType::kBool, false, "", "Call optimizer.step()? Always True in monitor mode.",
     [](const R& r) { return Int(r.step_optimizer ? 1 : 0); }},
    {"skipped", ReportType::kBool, false, "", "not step_optimizer: the update is skipped.",
     [](const R& r) { return Int(r.step_optimizer ? 0 : 1); }},
    {"gradient_modified", ReportType::kBool, false, "", "True when the gradients were projected in place.",
     [](const R& r) { return Int(r.gradient_modified ? 1 : 0); }},
    {"fallback", ReportType::kBool, false, "",
     "Remote mode: the decision source failed here or on another rank; the local decision was used.",
     [](const R& r) { return Int(r.fallback ? 1 : 0); }},
    {"remote_error", ReportType::kText, true, "",
     "Why the remote decision was not used, or None (text: not in numeric dicts).",
     [](const R& r) {
       ReportValue v;
       v.present = !r.remote_error.empty();
       v.text = r.remote_error;
       return v;
     }},
    {"elements", ReportType::kInteger, false, "", "Gradient elements read on this rank.",
     [](const R& r) { return Int(r.elements); }},
    {"tensors", ReportType::kInteger, false, "", "Parameters with a gradient this step.",
     [](const R& r) { return Int(r.tensors); }},
    {"strided_tensors", ReportType::kInteger, false, "", "Gradients that took the slower strided path (not dense).",
     [](const R& r) { return Int(r.strided_tensors); }},
    {"passes", ReportType::kText, false, "",
     "Which passes read the gradients: 'cpu' or 'cuda' (gac's kernels) or 'torch' (torch operations); text: not "
     "in numeric dicts.",
     [](const R& r) {
       ReportValue v;
       v.text = r.passes;
       return v;
     }},
    {"stats_seconds", ReportType::kReal, false, "s", "Statistics pass, all-reduce and local decision.",
     [](const R& r) { return Real(r.stats_seconds); }},
    {"decide_seconds", ReportType::kReal, false, "s", "Remote decision (remote mode).",
     [](const R& r) { return Real(r.decide_seconds); }},
    {"apply_seconds", ReportType::kReal, false, "s", "Projection and snapshot pass.",
     [](const R& r) { return Real(r.apply_seconds); }},
    {"agent_overhead_seconds", ReportType::kReal, false, "s", "The agent's time in this step (stats + decide + apply).",
     [](const R& r) { return Real(r.agent_overhead_seconds()); }},
    // The rule the agent decided with; None when the decision source decided.
    {"c_low", ReportType::kReal, true, "", "The c_low the agent decided with; None when gacd decided.",
     [](const R& r) { return r.rule ? Real(r.rule->thresholds.c_low) : Absent(); }},
    {"c_high", ReportType::kReal, true, "", "The c_high the agent decided with; None when gacd decided.",
     [](const R& r) { return r.rule ? Real(r.rule->thresholds.c_high) : Absent(); }},
    {"trigger", ReportType::kTrigger, true, "",
     "What the agent's thresholds applied to, 'per_step' or 'window'; None when gacd decided.",
     [](const R& r) { return r.rule ? Int(static_cast<std::int64_t>(r.rule->trigger.trigger)) : Absent(); }},
    {"window", ReportType::kInteger, true, "steps", "The agent's window W of m_t; None when gacd decided.",
     [](const R& r) { return r.rule ? Int(r.rule->trigger.window) : Absent(); }},
    {"window_c_low", ReportType::kReal, true, "", "The agent's c_low for |m_t|; None when gacd decided.",
     [](const R& r) { return r.rule ? Real(r.rule->trigger.window_thresholds.c_low) : Absent(); }},
    {"window_c_high", ReportType::kReal, true, "", "The agent's c_high for |m_t|; None when gacd decided.",
     [](const R& r) { return r.rule ? Real(r.rule->trigger.window_thresholds.c_high) : Absent(); }},    // The policy-health signals the trainer gave with the step (gac.rl; None without).
    {"policy_tokens", ReportType::kInteger, true, "tokens", "The masked tokens the policy-health signals count (n); None without signals.",
     [](const R& r) { return r.policy ? Int(r.policy->tokens) : Absent(); }},
    {"ess_token", ReportType::kReal, true, "", "Normalised Kish ESS of the tokens' importance weights, (sum r)^2 / (n sum r^2); None without signals.",
     &Signal<&PolicyHealth::ess_token>},
    {"ess_sequence", ReportType::kReal, true, "", "Normalised Kish ESS of the sequences' importance weights (exp of their summed log-ratios); None without signals.",
     &Signal<&PolicyHealth::ess_sequence>},
    {"clip_fraction_low", ReportType::kReal, true, "", "The fraction of tokens the loss clipped below 1 - eps_low; None without signals or a low bound.",
     &Signal<&PolicyHealth::clip_fraction_low>},
    {"clip_fraction_high", ReportType::kReal, true, "", "The fraction of tokens the loss clipped above 1 + eps_high; None without signals or a high bound.",
     &Signal<&PolicyHealth::clip_fraction_high>},
    {"truncation_fraction", ReportType::kReal, true, "", "The fraction of tokens whose ratio exceeds the truncation bound; None without signals or a bound.",
     &Signal<&PolicyHealth::truncation_fraction>},
    {"log_ratio_max", ReportType::kReal, true, "nats", "The batch's largest log r = log pi_learner - log pi_behaviour, before truncation; None without signals.",
     &Signal<&PolicyHealth::log_ratio_max>},
    {"log_ratio_p99", ReportType::kReal, true, "nats", "The 99th percentile of the batch's log-ratios; None without signals.",
     &Signal<&PolicyHealth::log_ratio_p99>},
    {"log_ratio_p1", ReportType::kReal, true, "nats", "The 1st percentile of the batch's log-ratios; None without signals.",
     &Signal<&PolicyHealth::log_ratio_p1>},
    {"kl_k3", ReportType::kReal, true, "nats", "The mean over tokens of k3 = (r - 1) - log r, an estimate of KL(behaviour || learner); None without signals.",
     &Signal<&PolicyHealth::kl_k3>},
    {"log_ratio_abs_mean", ReportType::kReal, true, "nats", "The mean over tokens of |log r|; None without signals.",
     &Signal<&PolicyHealth::log_ratio_abs_mean>},
    {"entropy_mean", ReportType::kReal, true, "nats", "The mean over tokens of the learner's entropy; None without signals or entropies.",
     &Signal<&PolicyHealth::entropy_mean>},
    {"staleness_min", ReportType::kReal, true, "versions", "The fewest policy versions a sequence of the batch is behind; None without signals or versions.",
     &Signal<&PolicyHealth::staleness_min>},
    {"staleness_mean", ReportType::kReal, true, "versions", "The mean policy versions the batch's sequences are behind; None without signals or versions.",
     &Signal<&PolicyHealth::staleness_mean>},
    {"staleness_max", ReportType::kReal, true, "versions", "The most policy versions a sequence of the batch is behind; None without signals or versions.",
     &Signal<&PolicyHealth::staleness_max>},
    {"policy_invalid", ReportType::kBool, true, "",
     "True when the trainer's tensors gave no policy-health signal (no token, non-finite log-probabilities); "
     "None without signals.",
     [](const R& r) { return r.policy ? Int(r.policy->invalid ? 1 : 0) : Absent(); }},
};

const ReportField* FindReportField(const char* name) {
  for (const ReportField& f : kReportFields) {
    if (name != nullptr && std::strcmp(name, f.name) == 0) return &f;
  }
  return nullptr;
}

const char* ReportEnumName(ReportType type, std::int64_t value) {
  switch (type) {
    case ReportType::kRegime: return NameIn(kAllRegimes, &RegimeName, value);
    case ReportType::kMode: return NameIn(kAllModes, &ModeName, value);
    case ReportType::kTrigger: return NameIn(kAllTriggers, &TriggerName, value);
    default: return nullptr;
  }
}

}  // namespace gac::controller
