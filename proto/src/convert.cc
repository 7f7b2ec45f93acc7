#include "gac/proto/convert.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "gac/proto/wire_rules.h"

namespace gac::proto {

v1::Regime ToProto(controller::Regime regime) {
  switch (regime) {
    case controller::Regime::kSafe: return v1::REGIME_SAFE;
    case controller::Regime::kProject: return v1::REGIME_PROJECT;
    case controller::Regime::kSkip: return v1::REGIME_SKIP;
    case controller::Regime::kInvalid: return v1::REGIME_INVALID;
    case controller::Regime::kSpike: return v1::REGIME_SPIKE;
  }
  return v1::REGIME_INVALID;  // unreachable: every regime is listed
}

base::StatusOr<controller::Regime> FromProto(v1::Regime regime) {
  switch (regime) {
    case v1::REGIME_SAFE: return controller::Regime::kSafe;
    case v1::REGIME_PROJECT: return controller::Regime::kProject;
    case v1::REGIME_SKIP: return controller::Regime::kSkip;
    case v1::REGIME_INVALID: return controller::Regime::kInvalid;
    case v1::REGIME_SPIKE: return controller::Regime::kSpike;
    default: break;
  }
  return base::Status::InvalidArgument("regime must be SAFE, PROJECT, SKIP, INVALID or SPIKE, got " +
                                 std::to_string(static_cast<int>(regime)));
}

v1::AlphaMode ToProto(controller::AlphaMode mode) {
  return mode == controller::AlphaMode::kExact ? v1::ALPHA_MODE_EXACT : v1::ALPHA_MODE_PAPER;
}

base::StatusOr<controller::AlphaMode> FromProto(v1::AlphaMode mode) {
  switch (mode) {
    case v1::ALPHA_MODE_UNSPECIFIED:
    case v1::ALPHA_MODE_PAPER: return controller::AlphaMode::kPaper;
    case v1::ALPHA_MODE_EXACT: return controller::AlphaMode::kExact;
    default: break;
  }
  return base::Status::InvalidArgument("unknown alpha_mode " + std::to_string(static_cast<int>(mode)));
}

v1::ControlMode ToProto(controller::Mode mode) {
  switch (mode) {
    case controller::Mode::kMonitor: return v1::CONTROL_MODE_MONITOR;
    case controller::Mode::kLocal: return v1::CONTROL_MODE_LOCAL;
    case controller::Mode::kRemote: return v1::CONTROL_MODE_REMOTE;
  }
  return v1::CONTROL_MODE_LOCAL;  // unreachable: every mode is listed
}

base::StatusOr<controller::Mode> FromProto(v1::ControlMode mode) {
  switch (mode) {
    case v1::CONTROL_MODE_MONITOR: return controller::Mode::kMonitor;
    case v1::CONTROL_MODE_LOCAL: return controller::Mode::kLocal;
    case v1::CONTROL_MODE_REMOTE: return controller::Mode::kRemote;
    default: break;
  }
  return base::Status::InvalidArgument("mode must be MONITOR, LOCAL or REMOTE");
}

v1::Trigger ToProto(controller::Trigger trigger) {
  return trigger == controller::Trigger::kWindow ? v1::TRIGGER_WINDOW : v1::TRIGGER_PER_STEP;
}

base::StatusOr<controller::Trigger> FromProto(v1::Trigger trigger) {
  switch (trigger) {
    case v1::TRIGGER_UNSPECIFIED:
    case v1::TRIGGER_PER_STEP: return controller::Trigger::kPerStep;
    case v1::TRIGGER_WINDOW: return controller::Trigger::kWindow;
    default: break;
  }
  return base::Status::InvalidArgument("unknown trigger " + std::to_string(static_cast<int>(trigger)));
}

int WindowFromProto(std::uint32_t window) {
  if (window == 0) return controller::TriggerSettings{}.window;
  return window > static_cast<std::uint32_t>(controller::kMaxWindow) + 1 ? controller::kMaxWindow + 1
                                                                         : static_cast<int>(window);
}

base::StatusOr<controller::TriggerSettings> TriggerFromProto(const v1::RunConfig& config,
                                                             const v1::Thresholds& default_window) {
  controller::TriggerSettings t;
  GAC_ASSIGN_OR_RETURN(t.trigger, FromProto(config.trigger()));
  t.window = WindowFromProto(config.window());
  base::StatusOr<controller::Thresholds> w =
      ThresholdsFromProto(config.has_window_thresholds() ? config.window_thresholds() : default_window);
  if (!w.ok()) return base::Status::InvalidArgument("window thresholds: " + w.status().message());
  t.window_thresholds = *w;
  GAC_RETURN_IF_ERROR(controller::ValidateTriggerSettings(t));
  return t;
}

v1::RunConfig DecidedWith(const v1::RunConfig& config, const v1::StepRecord& record) {
  v1::RunConfig out = config;
  if (record.has_c_low() && record.has_c_high()) {
    out.mutable_thresholds()->set_c_low(record.c_low());
    out.mutable_thresholds()->set_c_high(record.c_high());
  }
  if (record.has_trigger()) out.set_trigger(record.trigger());
  if (record.has_window()) out.set_window(record.window());
  if (record.has_window_c_low() && record.has_window_c_high()) {
    v1::Thresholds* w = out.mutable_window_thresholds();
    if (!config.has_window_thresholds()) w->set_alpha_mode(config.thresholds().alpha_mode());
    w->set_c_low(record.window_c_low());
    w->set_c_high(record.window_c_high());
  }
  return out;
}

v1::Thresholds ToProto(const controller::Thresholds& thresholds, controller::AlphaMode mode) {
  v1::Thresholds t;
  t.set_c_low(thresholds.c_low);
  t.set_c_high(thresholds.c_high);
  t.set_alpha_mode(ToProto(mode));
  return t;
}

base::StatusOr<controller::Thresholds> ThresholdsFromProto(const v1::Thresholds& thresholds) {
  GAC_RETURN_IF_ERROR(FromProto(thresholds.alpha_mode()).status());  // a known alpha mode
  const controller::Thresholds t{thresholds.c_low(), thresholds.c_high()};
  GAC_RETURN_IF_ERROR(controller::ValidateThresholds(t));
  return t;
}

base::StatusOr<controller::Controller> ControllerFromProto(const v1::Thresholds& thresholds) {
  GAC_ASSIGN_OR_RETURN(controller::Thresholds t, ThresholdsFromProto(thresholds));
  return controller::Controller::Create(t, *FromProto(thresholds.alpha_mode()));
}

base::StatusOr<controller::SpikeSettings> SpikeFromProto(const v1::SpikeGuard& spike) {
  controller::SpikeSettings s;
  s.max_grad_norm = spike.max_grad_norm();
  s.zscore = spike.zscore();
  if (spike.window() != 0) s.window = static_cast<int>(std::min<std::uint32_t>(spike.window(), 1u << 30));
  if (spike.sigma() != 0.0) s.sigma = spike.sigma();
  s.warmup = static_cast<int>(std::min<std::uint32_t>(spike.warmup(), 1u << 30));
  GAC_RETURN_IF_ERROR(controller::ValidateSpikeSettings(s));
  return s;
}

v1::SpikeGuard ToProto(const controller::SpikeSettings& spike) {
  v1::SpikeGuard out;
  out.set_max_grad_norm(spike.max_grad_norm);
  out.set_zscore(spike.zscore);
  out.set_window(static_cast<std::uint32_t>(spike.window));
  out.set_sigma(spike.sigma);
  out.set_warmup(static_cast<std::uint32_t>(spike.warmup));
  return out;
}

v1::DecideRequest ToDecideRequest(const std::string& run, std::uint32_t rank, std::int64_t step,
                                  const controller::AlignmentStats& stats, const std::vector<double>& recent,
                                  const std::vector<double>& recent_norms, const std::vector<double>& recent_losses) {
  v1::DecideRequest req;
  req.set_run(run);
  req.set_rank(rank);
  req.set_step(step);
  req.set_dot(stats.dot);
  req.set_grad_sq(stats.grad_sq);
  req.set_ref_sq(stats.ref_sq);
  req.set_has_reference(stats.has_reference);
  const std::size_t keep = std::min(recent.size(), static_cast<std::size_t>(controller::kMaxWindow));
  req.mutable_recent_cosines()->Add(recent.end() - static_cast<std::ptrdiff_t>(keep), recent.end());
  const auto newest = [](const std::vector<double>& v) {
    return v.end() - static_cast<std::ptrdiff_t>(std::min(v.size(), static_cast<std::size_t>(controller::kMaxSpikeWindow)));
  };
  req.mutable_recent_grad_norms()->Add(newest(recent_norms), recent_norms.end());
  req.mutable_recent_losses()->Add(newest(recent_losses), recent_losses.end());
  if (stats.loss) req.set_loss(*stats.loss);
  return req;
}

controller::AlignmentStats StatsFromProto(const v1::DecideRequest& request) {
  controller::AlignmentStats stats{request.dot(), request.grad_sq(), request.ref_sq(), request.has_reference()};
  if (request.has_loss()) stats.loss = request.loss();
  return stats;
}

namespace {

// A spike score's z, the part of it the wire carries: a remote verdict's
// score is its z only.
std::optional<double> Z(const std::optional<controller::SpikeScore>& score) {
  return score ? std::optional<double>(score->z) : std::nullopt;
}
controller::SpikeScore ScoreOfZ(double z) { return controller::SpikeScore{z, std::nullopt}; }

// The remote decision's optional reals, written once: where a Decision holds
// each and its optional double of DecideResponse, both named in C++ (a test
// checks that no optional double of the response is left out).
struct DecidedReal {
  const char* name;  // the response's field
  bool cosine;       // in [-1, 1] up to kCosineSlack; else any finite value
  std::optional<double> (*from_decision)(const controller::Decision& d);
  void (*to_decision)(double value, controller::Decision* d);
  std::optional<double> (*from_wire)(const v1::DecideResponse& r);
  void (*to_wire)(const std::optional<double>& value, v1::DecideResponse* r);
};

// A row for the response's optional double `f`: its name, whether it is a
// cosine, where a Decision holds it (`get`, `set`), the response's reader
// and writer.
#define GAC_DECIDED_REAL(f, is_cosine, get, set)                                                      \
  {                                                                                                   \
    #f, is_cosine, get, set,                                                                          \
        [](const v1::DecideResponse& r) { return r.has_##f() ? std::optional<double>(r.f()) : std::nullopt; }, \
        [](const std::optional<double>& v, v1::DecideResponse* r) {                                   \
          if (v) {                                                                                    \
            r->set_##f(*v);                                                                           \
          } else {                                                                                    \
            r->clear_##f();                                                                           \
          }                                                                                           \
        }                                                                                             \
  }

using D = controller::Decision;

const DecidedReal kDecidedReals[] = {
    GAC_DECIDED_REAL(cosine, true, [](const D& d) { return d.cosine; }, [](double v, D* d) { d->cosine = v; }),
    GAC_DECIDED_REAL(cosine_after, true, [](const D& d) { return d.cosine_after; },
                     [](double v, D* d) { d->cosine_after = v; }),
    GAC_DECIDED_REAL(window_mean, true, [](const D& d) { return d.window_mean; },
                     [](double v, D* d) { d->window_mean = v; }),
    GAC_DECIDED_REAL(grad_norm_z, false, [](const D& d) { return Z(d.spike_verdict.grad_norm); },
                     [](double v, D* d) { d->spike_verdict.grad_norm = ScoreOfZ(v); }),
    GAC_DECIDED_REAL(loss_z, false, [](const D& d) { return Z(d.spike_verdict.loss); },
                     [](double v, D* d) { d->spike_verdict.loss = ScoreOfZ(v); }),
};

#undef GAC_DECIDED_REAL

}  // namespace

void EncodeDecision(const controller::Decision& decision, v1::DecideResponse* response) {
  response->set_regime(ToProto(decision.regime));
  response->set_alpha(decision.alpha);
  response->set_projection_coeff(decision.projection_coeff);
  response->set_apply_update(decision.apply_update);
  for (const DecidedReal& real : kDecidedReals) real.to_wire(real.from_decision(decision), response);
}

namespace {

base::Status CheckCosine(const char* field, double c) {
  if (!std::isfinite(c) || std::fabs(c) > 1.0 + kCosineSlack) {
    return base::Status::InvalidArgument(std::string(field) + " must be in [-1, 1], got " + std::to_string(c));
  }
  return base::Status::Ok();
}

// What the other side sent, fit for an error message: at most 128
// characters, anything but printable ASCII as '?'.
std::string Printable(const std::string& text) {
  std::string out = text.substr(0, 128);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  if (text.size() > out.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

// The answer's optional reals into `d`, each checked: a cosine in [-1, 1]
// (up to rounding), anything else finite.
base::Status DecodeDecidedReals(const v1::DecideResponse& response, controller::Decision* d) {
  for (const DecidedReal& real : kDecidedReals) {
    const std::optional<double> value = real.from_wire(response);
    if (!value) continue;
    if (real.cosine) {
      GAC_RETURN_IF_ERROR(CheckCosine(real.name, *value));
    } else if (!std::isfinite(*value)) {
      return base::Status::InvalidArgument(std::string(real.name) + " must be finite, got " + std::to_string(*value));
    }
    real.to_decision(*value, d);
  }
  return base::Status::Ok();
}

}  // namespace

base::StatusOr<controller::Decision> DecodeDecision(const v1::DecideResponse& response, const controller::AlignmentStats& stats) {
  GAC_ASSIGN_OR_RETURN(controller::Regime regime, FromProto(response.regime()));
  controller::Decision d;
  d.regime = regime;
  d.spike_verdict.spike = regime == controller::Regime::kSpike;  // gacd's guard called it
  if (!std::isfinite(response.alpha()) || response.alpha() < 0.0 || response.alpha() > 1.0) {
    return base::Status::InvalidArgument("alpha must be in [0, 1], got " + std::to_string(response.alpha()));
  }
  const double coeff = response.projection_coeff();
  if (!std::isfinite(coeff)) {
    return base::Status::InvalidArgument("projection_coeff must be finite, got " + std::to_string(coeff));
  }
  if (d.regime != controller::Regime::kProject && coeff != 0.0) {
    return base::Status::InvalidArgument(std::string("projection_coeff must be 0 for regime ") + controller::RegimeName(d.regime) +
                                   ", got " + std::to_string(coeff));
  }
  if (d.regime == controller::Regime::kProject) {
    if (!stats.has_reference || !(stats.ref_sq > 0.0) || !std::isfinite(stats.dot) || !std::isfinite(stats.ref_sq)) {
      return base::Status::InvalidArgument("regime PROJECT for statistics without a usable reference");
    }
    const double expected = (1.0 - response.alpha()) * stats.dot / stats.ref_sq;
    if (std::fabs(coeff - expected) > 1e-6 * std::fabs(expected) + 1e-300) {
      return base::Status::InvalidArgument("projection_coeff " + std::to_string(coeff) + " is not (1 - alpha) * dot / pp = " +
                                     std::to_string(expected));
    }
  }
  const bool should_apply = d.regime == controller::Regime::kSafe || d.regime == controller::Regime::kProject;
  if (response.apply_update() != should_apply) {
    return base::Status::InvalidArgument(std::string("apply_update must be ") + (should_apply ? "true" : "false") +
                                   " for regime " + controller::RegimeName(d.regime));
  }
  GAC_RETURN_IF_ERROR(DecodeDecidedReals(response, &d));
  d.alpha = response.alpha();
  d.projection_coeff = coeff;
  d.apply_update = response.apply_update();
  d.grad_norm = std::sqrt(stats.grad_sq);
  d.ref_norm = std::sqrt(stats.ref_sq);
  return d;
}

void EncodeDecideResponse(const v1::DecideRequest& request, const controller::Decision& decision,
                          v1::DecideResponse* response) {
  EncodeDecision(decision, response);
  response->set_run(request.run());
  response->set_step(request.step());
}

base::StatusOr<controller::Decision> DecodeDecideResponse(const v1::DecideRequest& request, const v1::DecideResponse& response) {
  // A run id is never empty, so an empty one is an answer that does not say.
  if (response.run() != request.run() || response.step() != request.step()) {
    return base::Status::InvalidArgument("answer for run '" + Printable(response.run()) + "' step " +
                                   std::to_string(response.step()) + ", asked for run '" + request.run() +
                                   "' step " + std::to_string(request.step()));
  }
  return DecodeDecision(response, StatsFromProto(request));
}

grpc::Status ToGrpcStatus(const base::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

base::Status FromGrpcStatus(const grpc::Status& status, const std::string& prefix) {
  if (status.ok()) return base::Status::Ok();
  const int code = static_cast<int>(status.error_code());
  const base::StatusCode mapped = code >= 1 && code <= 16 ? static_cast<base::StatusCode>(code) : base::StatusCode::kUnknown;
  return base::Status(mapped, prefix.empty() ? status.error_message() : prefix + ": " + status.error_message());
}

int ToHttpStatus(base::StatusCode code) {
  switch (code) {
    case base::StatusCode::kOk: return 200;
    case base::StatusCode::kInvalidArgument:
    case base::StatusCode::kFailedPrecondition:
    case base::StatusCode::kOutOfRange: return 400;
    case base::StatusCode::kUnauthenticated: return 401;
    case base::StatusCode::kPermissionDenied: return 403;
    case base::StatusCode::kNotFound: return 404;
    case base::StatusCode::kAborted:
    case base::StatusCode::kAlreadyExists: return 409;
    case base::StatusCode::kResourceExhausted: return 413;
    case base::StatusCode::kCancelled: return 499;
    case base::StatusCode::kUnimplemented: return 501;
    case base::StatusCode::kUnavailable: return 503;
    case base::StatusCode::kDeadlineExceeded: return 504;
    case base::StatusCode::kUnknown:
    case base::StatusCode::kInternal:
    case base::StatusCode::kDataLoss: break;
  }
  return 500;
}

}  // namespace gac::proto
