#include "gac/transport/step_record.h"

#include <chrono>
#include <cmath>

#include "gac/proto/convert.h"
#include "gac/proto/record_schema.h"

namespace gac::transport {
namespace {

double ClampCosine(double c) { return std::fmax(-1.0, std::fmin(1.0, c)); }
double FiniteNorm(double v) { return std::isfinite(v) && v >= 0.0 ? v : 0.0; }

// Makes the record's fields valid by the ranges of the record schema
// (gac/proto/record_schema.h), which gacd checks, rather than dropping the
// step: a negative count from the report is left out when the field is
// optional, else 0; a non-finite real is left out when the field is optional; else a
// cosine is clamped to [-1, 1], a value in [0, 1] clamped (non-finite: 1,
// alpha's "untouched"), a non-negative one that is not made 0.
void MakeValid(v1::StepRecord* r) {
  for (const proto::StepField& f : proto::kStepFields) {
    proto::FieldValue v = f.get(*r);
    if (!v.present) continue;
    if (f.type == proto::FieldType::kInteger && f.from_report != nullptr && f.range == proto::FieldRange::kNonNegative &&
        v.integer < 0) {
      // A count the report got wrong (the policy signals' tokens, a window): 0, or absent when optional.
      v = f.optional ? proto::FieldValue{false, 0, 0} : proto::FieldValue{true, 0, 0};
      f.set(v, r);
      continue;
    }
    if (f.type != proto::FieldType::kReal) continue;
    const bool finite = std::isfinite(v.real);
    if (!finite && f.optional) {
      v.present = false;
    } else {
      switch (f.range) {
        case proto::FieldRange::kCosine:
          v.real = finite ? ClampCosine(v.real) : 0.0;
          break;
        case proto::FieldRange::kUnit:
          v.real = finite ? std::fmax(0.0, std::fmin(1.0, v.real)) : 1.0;
          break;
        case proto::FieldRange::kNonNegative:
          v.real = FiniteNorm(v.real);
          break;
        case proto::FieldRange::kAny:
          if (!finite) v.real = 0.0;
          break;
      }
    }
    f.set(v, r);
  }
}

}  // namespace

v1::StepRecord MakeStepRecord(const controller::StepReport& report, const RunIdentity& who,
                              const std::map<std::string, double>& scalars, std::optional<std::int64_t> staleness) {
  v1::StepRecord r;
  r.set_run(who.run);
  r.set_rank(who.rank);
  r.set_world_size(who.world_size);
  for (const proto::StepField& f : proto::kStepFields) {
    if (f.from_report != nullptr) f.set(f.from_report(report), &r);
  }
  if (staleness && *staleness >= 0) r.set_staleness(*staleness);
  for (const auto& [name, value] : scalars) {
    if (std::isfinite(value)) (*r.mutable_scalars())[name] = value;
  }
  for (const controller::LayerStats& layer : report.layers) {
    v1::LayerRecord* l = r.add_layers();
    l->set_name(layer.name);
    if (auto c = layer.cosine(); c && std::isfinite(*c)) l->set_cosine(ClampCosine(*c));
    l->set_grad_norm(std::isfinite(layer.grad_sq) && layer.grad_sq >= 0 ? std::sqrt(layer.grad_sq) : 0.0);
    l->set_ref_norm(std::isfinite(layer.ref_sq) && layer.ref_sq >= 0 ? std::sqrt(layer.ref_sq) : 0.0);
  }
  r.set_wall_time_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  MakeValid(&r);
  return r;
}

v1::StepRecord MakeStepRecord(const controller::StepReport& report, const RunIdentity& who, controller::Mode mode,
                              const std::map<std::string, double>& scalars, std::optional<std::int64_t> staleness) {
  v1::StepRecord r = MakeStepRecord(report, who, scalars, staleness);
  r.set_mode(proto::ToProto(mode));
  return r;
}

}  // namespace gac::transport
