#include "gac/proto/record_schema.h"

#include <optional>

#include "gac/proto/convert.h"
#include "gac/proto/wire_rules.h"

namespace gac::proto {
namespace {

FieldValue Int(std::int64_t v) { return FieldValue{true, v, 0}; }
FieldValue Real(double v) { return FieldValue{true, 0, v}; }
FieldValue Absent() { return FieldValue{false, 0, 0}; }
FieldValue OptReal(const std::optional<double>& v) { return v ? Real(*v) : Absent(); }

const char* RegimeNamer(std::int64_t v) {
  return v1::Regime_IsValid(static_cast<int>(v)) ? EnumName(static_cast<v1::Regime>(v)) : kUnknownName;
}
const char* TriggerNamer(std::int64_t v) {
  return v1::Trigger_IsValid(static_cast<int>(v)) ? EnumName(static_cast<v1::Trigger>(v)) : kUnknownName;
}
const char* ModeNamer(std::int64_t v) {
  return v1::ControlMode_IsValid(static_cast<int>(v)) ? EnumName(static_cast<v1::ControlMode>(v)) : kUnknownName;
}

using R = controller::StepReport;

// A spike score's z, the part of it the record keeps.
std::optional<double> Z(const std::optional<controller::SpikeScore>& score) {
  return score ? std::optional<double>(score->z) : std::nullopt;
}

// A policy-health signal of the report (absent without signals).
template <std::optional<double> controller::PolicyHealth::*kMember>
FieldValue Signal(const R& r) {
  return r.policy ? OptReal((*r.policy).*kMember) : Absent();
}
// A non-optional integer field `f` of type T.
#define GAC_INT_FIELD(f, T)                                                             \
  [](const v1::StepRecord& r) { return Int(static_cast<std::int64_t>(r.f())); },       \
      [](const FieldValue& v, v1::StepRecord* r) { r->set_##f(static_cast<T>(v.integer)); }
// A non-optional real field `f`.
#define GAC_REAL_FIELD(f)                                  \
  [](const v1::StepRecord& r) { return Real(r.f()); },     \
      [](const FieldValue& v, v1::StepRecord* r) { r->set_##f(v.real); }
// An optional field `f`, read through `make` (Int or Real) from `member`.
#define GAC_OPT_FIELD(f, make, member)                                            \
  [](const v1::StepRecord& r) { return r.has_##f() ? make(r.f()) : Absent(); },    \
      [](const FieldValue& v, v1::StepRecord* r) {                                \
        if (v.present) {                                                          \
          r->set_##f(v.member);                                                   \
        } else {                                                                  \
          r->clear_##f();                                                         \
        }                                                                         \
      }
// A non-optional enum field `f` of wire type T.
#define GAC_ENUM_FIELD(f, T)                                         \
  [](const v1::StepRecord& r) { return Int(r.f()); },                \
      [](const FieldValue& v, v1::StepRecord* r) { r->set_##f(static_cast<T>(v.integer)); }
// An optional enum field `f` of wire type T.
#define GAC_OPT_ENUM_FIELD(f, T)                                                  \
  [](const v1::StepRecord& r) { return r.has_##f() ? Int(r.f()) : Absent(); },     \
      [](const FieldValue& v, v1::StepRecord* r) {                                \
        if (v.present) {                                                          \
          r->set_##f(static_cast<T>(v.integer));                                  \
        } else {                                                                  \
          r->clear_##f();                                                         \
        }                                                                         \
      }

}  // namespace

// Each row: name, column, type, optional, range, json_string, unit, help;
// the record's getter and setter; the enum's names; the report's value.
const StepField kStepFields[kStepFieldCount] = {
    {"step", "step", FieldType::kInteger, false, FieldRange::kAny, false, "steps", "optimiser step index, in [0, 2^63 - 2]",
     GAC_INT_FIELD(step, std::int64_t), nullptr, [](const R& r) { return Int(r.step); }},
    {"rank", "rank", FieldType::kInteger, false, FieldRange::kAny, false, "", "reporting rank, < world_size",
     GAC_INT_FIELD(rank, std::uint32_t), nullptr, nullptr},
    {"world_size", "world_size", FieldType::kInteger, false, FieldRange::kAny, false, "", "ranks of the run; 0 is read as 1",
     GAC_INT_FIELD(world_size, std::uint32_t), nullptr, nullptr},
    {"cosine", "cosine", FieldType::kReal, true, FieldRange::kCosine, false, "", "c_t = cos(g, p); absent without a reference",
     GAC_OPT_FIELD(cosine, Real, real), nullptr, [](const R& r) { return OptReal(r.decision.cosine); }},
    {"grad_norm", "grad_norm", FieldType::kReal, false, FieldRange::kNonNegative, false, "", "||g||",
     GAC_REAL_FIELD(grad_norm), nullptr, [](const R& r) { return Real(r.decision.grad_norm); }},
    {"ref_norm", "ref_norm", FieldType::kReal, false, FieldRange::kNonNegative, false, "", "||p||",
     GAC_REAL_FIELD(ref_norm), nullptr, [](const R& r) { return Real(r.decision.ref_norm); }},
    {"regime", "regime", FieldType::kEnum, false, FieldRange::kAny, false, "", "the controller's regime for the step",
     GAC_ENUM_FIELD(regime, v1::Regime), &RegimeNamer, [](const R& r) { return Int(ToProto(r.decision.regime)); }},
    {"alpha", "alpha", FieldType::kReal, false, FieldRange::kUnit, false, "", "gain on the parallel component, in [0, 1]",
     GAC_REAL_FIELD(alpha), nullptr, [](const R& r) { return Real(r.decision.alpha); }},
    {"cosine_after", "cosine_after", FieldType::kReal, true, FieldRange::kCosine, false, "",
     "cosine of the applied update with p", GAC_OPT_FIELD(cosine_after, Real, real), nullptr,
     [](const R& r) { return OptReal(r.decision.cosine_after); }},
    {"staleness", "staleness", FieldType::kInteger, true, FieldRange::kNonNegative, false, "versions",
     "policy versions behind the learner", GAC_OPT_FIELD(staleness, Int, integer), nullptr, nullptr},
    {"wall_time_ns", "wall_time_ns", FieldType::kInteger, false, FieldRange::kNonNegative, true, "ns",
     "when the step was decided, since the Unix epoch; 0 = unknown", GAC_INT_FIELD(wall_time_ns, std::int64_t),
     nullptr, nullptr},
    // The column keeps its first name: renaming it would break the replicas
    // of a rolling update that still write the old one to a shared database.
    {"agent_overhead_seconds", "overhead_s", FieldType::kReal, false, FieldRange::kNonNegative, false, "s",
     "agent time on the training thread this step", GAC_REAL_FIELD(agent_overhead_seconds), nullptr,
     [](const R& r) { return Real(r.agent_overhead_seconds()); }},
    {"mode", "mode", FieldType::kEnum, false, FieldRange::kAny, false, "", "the agent's mode for the step",
     GAC_ENUM_FIELD(mode, v1::ControlMode), &ModeNamer, [](const R& r) { return Int(ToProto(r.mode)); }},
    {"fallback", "fallback", FieldType::kBool, false, FieldRange::kAny, false, "", "remote mode: the local decision was used",
     [](const v1::StepRecord& r) { return Int(r.fallback() ? 1 : 0); },
     [](const FieldValue& v, v1::StepRecord* r) { r->set_fallback(v.integer != 0); }, nullptr,
     [](const R& r) { return Int(r.fallback ? 1 : 0); }},
    // The rule the agent decided with (absent when gacd decided).
    {"c_low", "c_low", FieldType::kReal, true, FieldRange::kUnit, false, "", "the agent's c_low, when it decided",
     GAC_OPT_FIELD(c_low, Real, real), nullptr,
     [](const R& r) { return r.rule ? Real(r.rule->thresholds.c_low) : Absent(); }},
    {"c_high", "c_high", FieldType::kReal, true, FieldRange::kUnit, false, "", "the agent's c_high, when it decided",
     GAC_OPT_FIELD(c_high, Real, real), nullptr,
     [](const R& r) { return r.rule ? Real(r.rule->thresholds.c_high) : Absent(); }},
    {"trigger", "trigger", FieldType::kEnum, true, FieldRange::kAny, false, "",
     "what the agent's thresholds applied to (per_step or window), when it decided",
     GAC_OPT_ENUM_FIELD(trigger, v1::Trigger), &TriggerNamer,
     [](const R& r) { return r.rule ? Int(ToProto(r.rule->trigger.trigger)) : Absent(); }},
    // The column is not `window`, a reserved word in PostgreSQL.
    {"window", "window_size", FieldType::kInteger, true, FieldRange::kNonNegative, false, "steps",
     "the agent's window W of m_t, when it decided", GAC_OPT_FIELD(window, Int, integer), nullptr,
     [](const R& r) { return r.rule ? Int(r.rule->trigger.window) : Absent(); }},
    {"window_c_low", "window_c_low", FieldType::kReal, true, FieldRange::kUnit, false, "",
     "the agent's c_low for |m_t|, when it decided", GAC_OPT_FIELD(window_c_low, Real, real), nullptr,
     [](const R& r) { return r.rule ? Real(r.rule->trigger.window_thresholds.c_low) : Absent(); }},
    {"window_c_high", "window_c_high", FieldType::kReal, true, FieldRange::kUnit, false, "",
     "the agent's c_high for |m_t|, when it decided", GAC_OPT_FIELD(window_c_high, Real, real), nullptr,
     [](const R& r) { return r.rule ? Real(r.rule->trigger.window_thresholds.c_high) : Absent(); }},
    // The spike guard's z-scores (absent when its z-score is off or warming up).
    {"grad_norm_z", "grad_norm_z", FieldType::kReal, true, FieldRange::kAny, false, "",
     "z-score of ||g|| against the run's recent steps", GAC_OPT_FIELD(grad_norm_z, Real, real), nullptr,
     [](const R& r) { return OptReal(Z(r.decision.spike_verdict.grad_norm)); }},
    {"loss_z", "loss_z", FieldType::kReal, true, FieldRange::kAny, false, "",
     "z-score of the loss against the run's recent accepted steps", GAC_OPT_FIELD(loss_z, Real, real), nullptr,
     [](const R& r) { return OptReal(Z(r.decision.spike_verdict.loss)); }},    // The policy-health signals the trainer gave with the step (absent without).
    {"policy_tokens", "policy_tokens", FieldType::kInteger, true, FieldRange::kNonNegative, false, "tokens", "masked tokens the policy-health signals count",
     GAC_OPT_FIELD(policy_tokens, Int, integer), nullptr,
     [](const R& r) { return r.policy ? Int(r.policy->tokens) : Absent(); }},
    {"ess_token", "ess_token", FieldType::kReal, true, FieldRange::kUnit, false, "", "normalised Kish ESS of the tokens' importance weights",
     GAC_OPT_FIELD(ess_token, Real, real), nullptr, &Signal<&controller::PolicyHealth::ess_token>},
    {"ess_sequence", "ess_sequence", FieldType::kReal, true, FieldRange::kUnit, false, "", "normalised Kish ESS of the sequences' importance weights",
     GAC_OPT_FIELD(ess_sequence, Real, real), nullptr, &Signal<&controller::PolicyHealth::ess_sequence>},
    {"clip_fraction_low", "clip_fraction_low", FieldType::kReal, true, FieldRange::kUnit, false, "", "fraction of tokens the loss clipped below 1 - eps_low",
     GAC_OPT_FIELD(clip_fraction_low, Real, real), nullptr, &Signal<&controller::PolicyHealth::clip_fraction_low>},
    {"clip_fraction_high", "clip_fraction_high", FieldType::kReal, true, FieldRange::kUnit, false, "", "fraction of tokens the loss clipped above 1 + eps_high",
     GAC_OPT_FIELD(clip_fraction_high, Real, real), nullptr, &Signal<&controller::PolicyHealth::clip_fraction_high>},
    {"truncation_fraction", "truncation_fraction", FieldType::kReal, true, FieldRange::kUnit, false, "", "fraction of tokens whose ratio exceeds the truncation bound",
     GAC_OPT_FIELD(truncation_fraction, Real, real), nullptr, &Signal<&controller::PolicyHealth::truncation_fraction>},
    {"log_ratio_max", "log_ratio_max", FieldType::kReal, true, FieldRange::kAny, false, "nats", "largest log-ratio of the batch, before truncation",
     GAC_OPT_FIELD(log_ratio_max, Real, real), nullptr, &Signal<&controller::PolicyHealth::log_ratio_max>},
    {"log_ratio_p99", "log_ratio_p99", FieldType::kReal, true, FieldRange::kAny, false, "nats", "99th percentile of the log-ratios",
     GAC_OPT_FIELD(log_ratio_p99, Real, real), nullptr, &Signal<&controller::PolicyHealth::log_ratio_p99>},
    {"log_ratio_p1", "log_ratio_p1", FieldType::kReal, true, FieldRange::kAny, false, "nats", "1st percentile of the log-ratios",
     GAC_OPT_FIELD(log_ratio_p1, Real, real), nullptr, &Signal<&controller::PolicyHealth::log_ratio_p1>},
    {"kl_k3", "kl_k3", FieldType::kReal, true, FieldRange::kNonNegative, false, "nats", "mean k3 = (r - 1) - log r: sampler-learner KL",
     GAC_OPT_FIELD(kl_k3, Real, real), nullptr, &Signal<&controller::PolicyHealth::kl_k3>},
    {"log_ratio_abs_mean", "log_ratio_abs_mean", FieldType::kReal, true, FieldRange::kNonNegative, false, "nats", "mean |log r| over the tokens",
     GAC_OPT_FIELD(log_ratio_abs_mean, Real, real), nullptr, &Signal<&controller::PolicyHealth::log_ratio_abs_mean>},
    {"entropy_mean", "entropy_mean", FieldType::kReal, true, FieldRange::kNonNegative, false, "nats", "mean token entropy of the learner",
     GAC_OPT_FIELD(entropy_mean, Real, real), nullptr, &Signal<&controller::PolicyHealth::entropy_mean>},
    {"staleness_min", "staleness_min", FieldType::kReal, true, FieldRange::kNonNegative, false, "versions", "fewest policy versions a sequence of the batch is behind",
     GAC_OPT_FIELD(staleness_min, Real, real), nullptr, &Signal<&controller::PolicyHealth::staleness_min>},
    {"staleness_mean", "staleness_mean", FieldType::kReal, true, FieldRange::kNonNegative, false, "versions", "mean policy versions the batch's sequences are behind",
     GAC_OPT_FIELD(staleness_mean, Real, real), nullptr, &Signal<&controller::PolicyHealth::staleness_mean>},
    {"staleness_max", "staleness_max", FieldType::kReal, true, FieldRange::kNonNegative, false, "versions", "most policy versions a sequence of the batch is behind",
     GAC_OPT_FIELD(staleness_max, Real, real), nullptr, &Signal<&controller::PolicyHealth::staleness_max>},
    {"policy_invalid", "policy_invalid", FieldType::kBool, true, FieldRange::kAny, false, "",
     "the trainer's tensors gave no policy-health signal", GAC_OPT_FIELD(policy_invalid, Int, integer), nullptr,
     [](const R& r) { return r.policy ? Int(r.policy->invalid ? 1 : 0) : Absent(); }},
};

#undef GAC_INT_FIELD
#undef GAC_REAL_FIELD
#undef GAC_OPT_FIELD
#undef GAC_ENUM_FIELD
#undef GAC_OPT_ENUM_FIELD

const StepField* FindStepField(std::string_view name) {
  for (const StepField& f : kStepFields) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

}  // namespace gac::proto
