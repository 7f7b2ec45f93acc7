#include "gac/controller/report_fields.h"

#include <cstring>

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

// Views of a field: a Python property and a logger key.
constexpr unsigned kAll = kViewPython | kViewLogger;

using R = StepReport;

// The Decision's optional reals that the remote decision carries.
std::optional<double> Z(const std::optional<SpikeScore>& score) {
  return score ? std::optional<double>(score->z) : std::nullopt;
}
constexpr DecisionSlot kCosine{[](const Decision& d) { return d.cosine; },
                               [](Decision& d, double v) { d.cosine = v; }, true};
constexpr DecisionSlot kCosineAfter{[](const Decision& d) { return d.cosine_after; },
                                    [](Decision& d, double v) { d.cosine_after = v; }, true};
constexpr DecisionSlot kWindowMean{[](const Decision& d) { return d.window_mean; },
                                   [](Decision& d, double v) { d.window_mean = v; }, true};
// A remote verdict's score carries its z only.
constexpr DecisionSlot kGradNormZ{[](const Decision& d) { return Z(d.spike_verdict.grad_norm); },
                                  [](Decision& d, double v) { d.spike_verdict.grad_norm = SpikeScore{v, std::nullopt}; },
                                  false};
constexpr DecisionSlot kLossZ{[](const Decision& d) { return Z(d.spike_verdict.loss); },
                              [](Decision& d, double v) { d.spike_verdict.loss = SpikeScore{v, std::nullopt}; }, false};

// A decision slot's value in the report.
template <const DecisionSlot& slot>
ReportValue Decided(const R& r) {
  return OptReal(slot.get(r.decision));
}

}  // namespace

// Order: the order of the Python properties and of to_dict()'s keys.
const ReportField kReportFields[kReportFieldCount] = {
    {"step", ReportType::kInteger, false, "steps", "The optimiser step index the agent was given.", kAll, "step",
     [](const R& r) { return Int(r.step); }},
    {"loss", ReportType::kReal, true, "", "The loss the trainer gave with the step (with a process group: the ranks' mean), or None.", kAll, nullptr,
     [](const R& r) { return OptReal(r.loss); }},
    {"mode", ReportType::kMode, false, "",
     "The agent's mode for this step: 'local', 'monitor' or 'remote' (in monitor mode the regime is what GAC "
     "would have done).",
     kAll, "mode", [](const R& r) { return Int(static_cast<std::int64_t>(r.mode)); }},
    {"regime", ReportType::kRegime, false, "",
     "'safe', 'project', 'skip', 'invalid' or 'spike' (monitor mode: what local mode would do).", kAll, "regime",
     [](const R& r) { return Int(static_cast<std::int64_t>(r.decision.regime)); }},
    {"cosine", ReportType::kReal, true, "",
     "c_t = cos(g, p); None on the first step, after a reset and with non-finite gradients.", kAll, "cosine",
     Decided<kCosine>, &kCosine},
    {"cosine_after", ReportType::kReal, true, "",
     "The cosine of the applied update with p; None for skip, invalid and no reference.", kAll, "cosine_after",
     Decided<kCosineAfter>, &kCosineAfter},
    {"window_mean", ReportType::kReal, true, "",
     "m_t, the signed mean of the agent's last `window` cosines, this one included; None until that many are "
     "held. trigger='window' decides on it.",
     kAll, nullptr, Decided<kWindowMean>, &kWindowMean},
    {"grad_norm_z", ReportType::kReal, true, "",
     "The spike guard's z-score of |g| against the run's recent steps; None when its z-score is off or "
     "warming up.",
     kAll, "grad_norm_z", Decided<kGradNormZ>, &kGradNormZ},
    {"loss_z", ReportType::kReal, true, "",
     "The spike guard's z-score of the loss against the run's recent steps; None without a loss.", kAll,
     "loss_z", Decided<kLossZ>, &kLossZ},
    {"alpha", ReportType::kReal, false, "", "The gain on the gradient's component along p (1 = untouched).", kAll,
     "alpha", [](const R& r) { return Real(r.decision.alpha); }},
    {"projection_coeff", ReportType::kReal, false, "",
     "g' = g - projection_coeff * p: (1 - alpha) <g,p> / |p|^2 when projecting, else 0.", kAll, nullptr,
     [](const R& r) { return Real(r.decision.projection_coeff); }},
    {"grad_norm", ReportType::kReal, false, "", "|g| before projection (all ranks).", kAll, "grad_norm",
     [](const R& r) { return Real(r.decision.grad_norm); }},
    {"ref_norm", ReportType::kReal, false, "", "|p|, the reference's norm (all ranks).", kAll, "ref_norm",
     [](const R& r) { return Real(r.decision.ref_norm); }},
    {"step_optimizer", ReportType::kBool, false, "", "Call optimizer.step()? Always True in monitor mode.", kAll,
     nullptr, [](const R& r) { return Int(r.step_optimizer ? 1 : 0); }},
    {"skipped", ReportType::kBool, false, "", "not step_optimizer: the update is skipped.", kAll, nullptr,
     [](const R& r) { return Int(r.step_optimizer ? 0 : 1); }},
    {"gradient_modified", ReportType::kBool, false, "", "True when the gradients were projected in place.", kAll,
     nullptr, [](const R& r) { return Int(r.gradient_modified ? 1 : 0); }},
    {"fallback", ReportType::kBool, false, "",
     "Remote mode: the decision source failed here or on another rank; the local decision was used.", kAll,
     "fallback", [](const R& r) { return Int(r.fallback ? 1 : 0); }},
    {"remote_error", ReportType::kText, true, "", "Why the remote decision was not used, or None (text: not in numeric dicts).",
     kAll, nullptr,
     [](const R& r) {
       ReportValue v;
       v.present = !r.remote_error.empty();
       v.text = r.remote_error;
       return v;
     }},
    {"elements", ReportType::kInteger, false, "", "Gradient elements read on this rank.", kAll, nullptr,
     [](const R& r) { return Int(r.elements); }},
    {"tensors", ReportType::kInteger, false, "", "Parameters with a gradient this step.", kAll, nullptr,
     [](const R& r) { return Int(r.tensors); }},
    {"strided_tensors", ReportType::kInteger, false, "", "Gradients that took the slower strided path (not dense).",
     kAll, nullptr, [](const R& r) { return Int(r.strided_tensors); }},
    {"passes", ReportType::kText, false, "",
     "Which passes read the gradients: 'cpu' or 'cuda' (gac's kernels) or 'torch' (torch operations); text: not "
     "in numeric dicts.",
     kAll, nullptr,
     [](const R& r) {
       ReportValue v;
       v.text = r.passes;
       return v;
     }},
    {"stats_seconds", ReportType::kReal, false, "s", "Statistics pass, all-reduce and local decision.", kAll, nullptr,
     [](const R& r) { return Real(r.stats_seconds); }},
    {"decide_seconds", ReportType::kReal, false, "s", "Remote decision (remote mode).", kAll, nullptr,
     [](const R& r) { return Real(r.decide_seconds); }},
    {"apply_seconds", ReportType::kReal, false, "s", "Projection and snapshot pass.", kAll, nullptr,
     [](const R& r) { return Real(r.apply_seconds); }},
    {"agent_overhead_seconds", ReportType::kReal, false, "s",
     "The agent's time in this step (stats + decide + apply).", kAll, "agent_overhead_seconds",
     [](const R& r) { return Real(r.agent_overhead_seconds()); }},
    // The rule the agent decided with; None when the decision source decided.
    {"c_low", ReportType::kReal, true, "", "The c_low the agent decided with; None when gacd decided.", kAll, "c_low",
     [](const R& r) { return r.rule ? Real(r.rule->thresholds.c_low) : Absent(); }},
    {"c_high", ReportType::kReal, true, "", "The c_high the agent decided with; None when gacd decided.", kAll,
     "c_high", [](const R& r) { return r.rule ? Real(r.rule->thresholds.c_high) : Absent(); }},
    {"trigger", ReportType::kTrigger, true, "",
     "What the agent's thresholds applied to, 'per_step' or 'window'; None when gacd decided.", kAll, "trigger",
     [](const R& r) { return r.rule ? Int(static_cast<std::int64_t>(r.rule->trigger.trigger)) : Absent(); }},
    {"window", ReportType::kInteger, true, "steps", "The agent's window W of m_t; None when gacd decided.", kAll,
     "window", [](const R& r) { return r.rule ? Int(r.rule->trigger.window) : Absent(); }},
    {"window_c_low", ReportType::kReal, true, "", "The agent's c_low for |m_t|; None when gacd decided.", kAll,
     "window_c_low", [](const R& r) { return r.rule ? Real(r.rule->trigger.window_thresholds.c_low) : Absent(); }},
    {"window_c_high", ReportType::kReal, true, "", "The agent's c_high for |m_t|; None when gacd decided.", kAll,
     "window_c_high", [](const R& r) { return r.rule ? Real(r.rule->trigger.window_thresholds.c_high) : Absent(); }},
};

const ReportField* FindReportField(const char* name) {
  for (const ReportField& f : kReportFields) {
    if (name != nullptr && std::strcmp(name, f.name) == 0) return &f;
  }
  return nullptr;
}

const char* ReportEnumName(ReportType type, std::int64_t value) {
  switch (type) {
    case ReportType::kRegime:
      return value >= 0 && value <= 4 ? RegimeName(static_cast<Regime>(value)) : "unknown";
    case ReportType::kMode:
      return value >= 0 && value <= 2 ? ModeName(static_cast<Mode>(value)) : "unknown";
    case ReportType::kTrigger:
      return value >= 0 && value <= 1 ? TriggerName(static_cast<Trigger>(value)) : "unknown";
    default:
      return nullptr;
  }
}

}  // namespace gac::controller
