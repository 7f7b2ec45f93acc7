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
     [](const R& r) { return OptReal(Z(r.decision.spike_verdict.loss)); }},
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
