#include "server/src/validate.h"

#include "gac/controller/window.h"

#include "gac/proto/convert.h"
#include "gac/proto/record_schema.h"
#include "gac/proto/wire_rules.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <unordered_set>

namespace gac::server {
namespace {

base::Status Bad(const std::string& prefix, const std::string& msg) {
  return base::Status::InvalidArgument(prefix + msg);
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

base::Status CheckFinite(const std::string& prefix, const char* field, double v) {
  if (!std::isfinite(v)) return Bad(prefix, std::string(field) + " must be finite, got " + Num(v));
  return base::Status::Ok();
}

base::Status CheckNorm(const std::string& prefix, const char* field, double v) {
  if (!std::isfinite(v) || v < 0) {
    return Bad(prefix, std::string(field) + " must be finite and >= 0, got " + Num(v));
  }
  return base::Status::Ok();
}

base::Status CheckCosine(const std::string& prefix, const char* field, double v) {
  // A cosine computed in floating point may exceed 1 by rounding (kCosineSlack).
  if (!std::isfinite(v) || std::fabs(v) > 1.0 + proto::kCosineSlack) {
    return Bad(prefix, std::string(field) + " must be in [-1, 1], got " + Num(v));
  }
  return base::Status::Ok();
}

// Checks the range the schema gives `field` (record_schema.h), when present.
base::Status CheckField(const std::string& prefix, const proto::StepField& field, const v1::StepRecord& r) {
  const proto::FieldValue v = field.get(r);
  if (!v.present) return base::Status::Ok();
  const bool real = field.type == proto::FieldType::kReal;
  switch (field.range) {
    case proto::FieldRange::kAny:
      return real ? CheckFinite(prefix, field.name, v.real) : base::Status::Ok();
    case proto::FieldRange::kNonNegative:
      if (real) return CheckNorm(prefix, field.name, v.real);
      if (v.integer < 0) {
        return Bad(prefix, std::string(field.name) + " must be >= 0, got " + std::to_string(v.integer));
      }
      return base::Status::Ok();
    case proto::FieldRange::kUnit:
      if (!std::isfinite(v.real) || v.real < 0 || v.real > 1) {
        return Bad(prefix, std::string(field.name) + " must be in [0, 1], got " + Num(v.real));
      }
      return base::Status::Ok();
    case proto::FieldRange::kCosine:
      return CheckCosine(prefix, field.name, v.real);
  }
  return base::Status::Ok();
}

base::Status ValidateRecordWithPrefix(const v1::StepRecord& r, const Limits& limits, const std::string& p) {
  base::Status st = ValidateRunId(r.run());
  if (!st.ok()) return Bad(p, st.message());
  // The largest int64 is left out: queries end their step range before an
  // exclusive bound, so a record there could never be read back.
  if (r.step() < 0 || r.step() == INT64_MAX) {
    return Bad(p, "step must be in [0, 2^63 - 2], got " + std::to_string(r.step()));
  }
  const std::uint32_t world = r.world_size() == 0 ? 1 : r.world_size();
  if (r.rank() >= world) {
    return Bad(p, "rank " + std::to_string(r.rank()) + " must be < world_size " + std::to_string(world));
  }
  for (const proto::StepField& field : proto::kStepFields) GAC_RETURN_IF_ERROR(CheckField(p, field, r));
  if (base::StatusOr<controller::Regime> regime = proto::FromProto(r.regime()); !regime.ok()) return Bad(p, regime.status().message());
  // UNSPECIFIED is allowed here: older agents do not report their mode.
  if (!v1::ControlMode_IsValid(r.mode())) return Bad(p, "unknown mode " + std::to_string(r.mode()));
  // The agent's rule, when given, is one it could have decided with.
  if (r.has_trigger() && r.trigger() != v1::TRIGGER_PER_STEP && r.trigger() != v1::TRIGGER_WINDOW) {
    return Bad(p, "unknown trigger " + std::to_string(r.trigger()));
  }
  if (r.has_window() && (r.window() < 1 || r.window() > static_cast<std::uint32_t>(controller::kMaxWindow))) {
    return Bad(p, "window must be in [1, " + std::to_string(controller::kMaxWindow) + "], got " +
                      std::to_string(r.window()));
  }
  for (const auto& [has_low, low, has_high, high, what] :
       {std::make_tuple(r.has_c_low(), r.c_low(), r.has_c_high(), r.c_high(), "c_low/c_high"),
        std::make_tuple(r.has_window_c_low(), r.window_c_low(), r.has_window_c_high(), r.window_c_high(),
                        "window_c_low/window_c_high")}) {
    if (has_low != has_high) return Bad(p, std::string(what) + ": give both or neither");
    if (has_low) {
      st = controller::ValidateThresholds(controller::Thresholds{low, high});
      if (!st.ok()) return Bad(p, std::string(what) + ": " + st.message());
    }
  }
  if (static_cast<std::size_t>(r.scalars_size()) > limits.max_scalars_per_record) {
    return Bad(p, "too many scalars: " + std::to_string(r.scalars_size()) + " > " +
                      std::to_string(limits.max_scalars_per_record));
  }
  for (const auto& [name, value] : r.scalars()) {
    st = ValidateName("scalar name", name);
    if (!st.ok()) return Bad(p, st.message());
    GAC_RETURN_IF_ERROR(CheckFinite(p, ("scalar '" + name + "'").c_str(), value));
  }
  if (static_cast<std::size_t>(r.layers_size()) > limits.max_layers_per_record) {
    return Bad(p, "too many layers: " + std::to_string(r.layers_size()) + " > " +
                      std::to_string(limits.max_layers_per_record));
  }
  std::unordered_set<std::string_view> names;
  names.reserve(static_cast<std::size_t>(r.layers_size()));
  for (int i = 0; i < r.layers_size(); ++i) {
    const v1::LayerRecord& l = r.layers(i);
    const std::string lp = p + "layers[" + std::to_string(i) + "]: ";
    st = ValidateName("layer name", l.name());
    if (!st.ok()) return Bad(lp, st.message());
    if (!names.insert(l.name()).second) return Bad(lp, "duplicate layer name '" + l.name() + "'");
    if (l.has_cosine()) GAC_RETURN_IF_ERROR(CheckCosine(lp, "cosine", l.cosine()));
    GAC_RETURN_IF_ERROR(CheckNorm(lp, "grad_norm", l.grad_norm()));
    GAC_RETURN_IF_ERROR(CheckNorm(lp, "ref_norm", l.ref_norm()));
  }
  return base::Status::Ok();
}

}  // namespace

base::Status ValidateRunId(std::string_view run) { return proto::CheckRunId(run); }

base::Status ValidateName(std::string_view what, std::string_view name) { return proto::CheckName(what, name); }

base::Status ValidateStepRecord(const v1::StepRecord& record, const Limits& limits) {
  return ValidateRecordWithPrefix(record, limits, "");
}

base::Status ValidateIngestRequest(const v1::IngestRequest& request, const Limits& limits) {
  if (request.sequence() == 0) return base::Status::InvalidArgument("sequence must be >= 1");
  if (request.records_size() == 0) return base::Status::InvalidArgument("batch has no records");
  if (static_cast<std::size_t>(request.records_size()) > limits.max_records_per_batch) {
    return base::Status::InvalidArgument("batch has " + std::to_string(request.records_size()) +
                                   " records, more than " + std::to_string(limits.max_records_per_batch));
  }
  struct KeyHash {
    std::size_t operator()(const std::tuple<std::string_view, std::uint32_t, std::int64_t>& k) const {
      return std::hash<std::string_view>()(std::get<0>(k)) ^
             (std::hash<std::int64_t>()(std::get<2>(k)) * 31 + std::get<1>(k));
    }
  };
  std::unordered_set<std::tuple<std::string_view, std::uint32_t, std::int64_t>, KeyHash> keys;
  keys.reserve(static_cast<std::size_t>(request.records_size()));
  for (int i = 0; i < request.records_size(); ++i) {
    const v1::StepRecord& r = request.records(i);
    const std::string p = "records[" + std::to_string(i) + "]: ";
    GAC_RETURN_IF_ERROR(ValidateRecordWithPrefix(r, limits, p));
    if (!keys.emplace(r.run(), r.rank(), r.step()).second) {
      return Bad(p, "duplicate (run, rank, step) = (" + r.run() + ", " + std::to_string(r.rank()) +
                        ", " + std::to_string(r.step()) + ") within one batch");
    }
  }
  return base::Status::Ok();
}

base::Status ValidateDecideRequest(const v1::DecideRequest& request) {
  base::Status st = ValidateRunId(request.run());
  if (!st.ok()) return st;
  if (request.step() < 0) return base::Status::InvalidArgument("step must be >= 0");
  // Non-finite statistics are a valid input: they give REGIME_INVALID.
  if (request.grad_sq() < 0) return base::Status::InvalidArgument("grad_sq must be >= 0, got " + Num(request.grad_sq()));
  if (request.ref_sq() < 0) return base::Status::InvalidArgument("ref_sq must be >= 0, got " + Num(request.ref_sq()));
  // Sums of one g and one p obey Cauchy-Schwarz, |dot| <= |g| |p|: beyond
  // rounding (the tolerance of a cosine on the wire), no cosine in [-1, 1]
  // follows from them, and the agent would refuse the answer.
  if (request.has_reference() && request.ref_sq() > 0 && std::isfinite(request.dot()) &&
      std::isfinite(request.grad_sq()) && std::isfinite(request.ref_sq())) {
    const double c =
        request.dot() / (std::sqrt(request.grad_sq()) * std::sqrt(request.ref_sq()) + controller::kCosineEpsilon);
    if (std::fabs(c) > 1.0 + proto::kCosineSlack) {
      return base::Status::InvalidArgument("dot does not fit grad_sq and ref_sq: |dot| / sqrt(grad_sq * ref_sq) = " +
                                     Num(c) + ", above 1");
    }
  }
  if (request.recent_cosines_size() > controller::kMaxWindow) {
    return base::Status::InvalidArgument("recent_cosines: at most " + std::to_string(controller::kMaxWindow) +
                                         " values, got " + std::to_string(request.recent_cosines_size()));
  }
  for (int i = 0; i < request.recent_cosines_size(); ++i) {
    const double c = request.recent_cosines(i);
    if (!std::isfinite(c) || std::fabs(c) > 1.0 + proto::kCosineSlack) {
      return base::Status::InvalidArgument("recent_cosines[" + std::to_string(i) + "] must be in [-1, 1], got " + Num(c));
    }
  }
  for (const auto& [name, values, low] : {std::tuple{"recent_grad_norms", &request.recent_grad_norms(), 0.0},
                                          std::tuple{"recent_losses", &request.recent_losses(), -HUGE_VAL}}) {
    if (values->size() > controller::kMaxSpikeWindow) {
      return base::Status::InvalidArgument(std::string(name) + ": at most " + std::to_string(controller::kMaxSpikeWindow) +
                                           " values, got " + std::to_string(values->size()));
    }
    for (int i = 0; i < values->size(); ++i) {
      const double v = values->Get(i);
      if (!std::isfinite(v) || v < low) {
        return base::Status::InvalidArgument(std::string(name) + "[" + std::to_string(i) + "] must be finite" +
                                             (low == 0.0 ? " and >= 0" : "") + ", got " + Num(v));
      }
    }
  }
  return base::Status::Ok();
}

}  // namespace gac::server
