#include "gac/proto/convert.h"

#include <cmath>

namespace gac::proto {

v1::Regime ToProto(Regime regime) {
  switch (regime) {
    case Regime::kSafe: return v1::REGIME_SAFE;
    case Regime::kProject: return v1::REGIME_PROJECT;
    case Regime::kSkip: return v1::REGIME_SKIP;
    case Regime::kInvalid: return v1::REGIME_INVALID;
  }
  return v1::REGIME_INVALID;  // unreachable: every regime is listed
}

StatusOr<Regime> FromProto(v1::Regime regime) {
  switch (regime) {
    case v1::REGIME_SAFE: return Regime::kSafe;
    case v1::REGIME_PROJECT: return Regime::kProject;
    case v1::REGIME_SKIP: return Regime::kSkip;
    case v1::REGIME_INVALID: return Regime::kInvalid;
    default: break;
  }
  return Status::InvalidArgument("regime must be SAFE, PROJECT, SKIP or INVALID, got " +
                                 std::to_string(static_cast<int>(regime)));
}

v1::AlphaMode ToProto(AlphaMode mode) {
  return mode == AlphaMode::kExact ? v1::ALPHA_MODE_EXACT : v1::ALPHA_MODE_PAPER;
}

StatusOr<AlphaMode> FromProto(v1::AlphaMode mode) {
  switch (mode) {
    case v1::ALPHA_MODE_UNSPECIFIED:
    case v1::ALPHA_MODE_PAPER: return AlphaMode::kPaper;
    case v1::ALPHA_MODE_EXACT: return AlphaMode::kExact;
    default: break;
  }
  return Status::InvalidArgument("unknown alpha_mode " + std::to_string(static_cast<int>(mode)));
}

v1::ControlMode ToProto(Mode mode) {
  switch (mode) {
    case Mode::kMonitor: return v1::CONTROL_MODE_MONITOR;
    case Mode::kLocal: return v1::CONTROL_MODE_LOCAL;
    case Mode::kRemote: return v1::CONTROL_MODE_REMOTE;
  }
  return v1::CONTROL_MODE_LOCAL;  // unreachable: every mode is listed
}

StatusOr<Mode> FromProto(v1::ControlMode mode) {
  switch (mode) {
    case v1::CONTROL_MODE_MONITOR: return Mode::kMonitor;
    case v1::CONTROL_MODE_LOCAL: return Mode::kLocal;
    case v1::CONTROL_MODE_REMOTE: return Mode::kRemote;
    default: break;
  }
  return Status::InvalidArgument("mode must be MONITOR, LOCAL or REMOTE");
}

v1::Thresholds ToProto(const Thresholds& thresholds, AlphaMode mode) {
  v1::Thresholds t;
  t.set_c_low(thresholds.c_low);
  t.set_c_high(thresholds.c_high);
  t.set_alpha_mode(ToProto(mode));
  return t;
}

StatusOr<Thresholds> ThresholdsFromProto(const v1::Thresholds& thresholds) {
  StatusOr<AlphaMode> mode = FromProto(thresholds.alpha_mode());
  if (!mode.ok()) return mode.status();
  const Thresholds t{thresholds.c_low(), thresholds.c_high()};
  GAC_RETURN_IF_ERROR(ValidateThresholds(t));
  return t;
}

StatusOr<Controller> ControllerFromProto(const v1::Thresholds& thresholds) {
  StatusOr<Thresholds> t = ThresholdsFromProto(thresholds);
  if (!t.ok()) return t.status();
  return Controller::Create(*t, *FromProto(thresholds.alpha_mode()));
}

v1::DecideRequest ToDecideRequest(const std::string& run, std::uint32_t rank, std::int64_t step,
                                  const AlignmentStats& stats) {
  v1::DecideRequest req;
  req.set_run(run);
  req.set_rank(rank);
  req.set_step(step);
  req.set_dot(stats.dot);
  req.set_grad_sq(stats.grad_sq);
  req.set_ref_sq(stats.ref_sq);
  req.set_has_reference(stats.has_reference);
  return req;
}

AlignmentStats StatsFromProto(const v1::DecideRequest& request) {
  return AlignmentStats{request.dot(), request.grad_sq(), request.ref_sq(), request.has_reference()};
}

void EncodeDecision(const Decision& decision, v1::DecideResponse* response) {
  response->set_regime(ToProto(decision.regime));
  if (decision.cosine) {
    response->set_cosine(*decision.cosine);
  } else {
    response->clear_cosine();
  }
  if (decision.cosine_after) {
    response->set_cosine_after(*decision.cosine_after);
  } else {
    response->clear_cosine_after();
  }
  response->set_alpha(decision.alpha);
  response->set_projection_coeff(decision.projection_coeff);
  response->set_apply_update(decision.apply_update);
}

namespace {

Status CheckCosine(const char* field, double c) {
  // A cosine computed in floating point may exceed 1 by rounding (and by the
  // 1e-8 of the denominator the other way); allow 1e-6.
  if (!std::isfinite(c) || std::fabs(c) > 1.0 + 1e-6) {
    return Status::InvalidArgument(std::string(field) + " must be in [-1, 1], got " + std::to_string(c));
  }
  return Status::Ok();
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

}  // namespace

StatusOr<Decision> DecodeDecision(const v1::DecideResponse& response, const AlignmentStats& stats) {
  StatusOr<Regime> regime = FromProto(response.regime());
  if (!regime.ok()) return regime.status();
  Decision d;
  d.regime = *regime;
  if (!std::isfinite(response.alpha()) || response.alpha() < 0.0 || response.alpha() > 1.0) {
    return Status::InvalidArgument("alpha must be in [0, 1], got " + std::to_string(response.alpha()));
  }
  const double coeff = response.projection_coeff();
  if (!std::isfinite(coeff)) {
    return Status::InvalidArgument("projection_coeff must be finite, got " + std::to_string(coeff));
  }
  if (d.regime != Regime::kProject && coeff != 0.0) {
    return Status::InvalidArgument(std::string("projection_coeff must be 0 for regime ") + RegimeName(d.regime) +
                                   ", got " + std::to_string(coeff));
  }
  if (d.regime == Regime::kProject) {
    if (!stats.has_reference || !(stats.ref_sq > 0.0) || !std::isfinite(stats.dot) || !std::isfinite(stats.ref_sq)) {
      return Status::InvalidArgument("regime PROJECT for statistics without a usable reference");
    }
    const double expected = (1.0 - response.alpha()) * stats.dot / stats.ref_sq;
    if (std::fabs(coeff - expected) > 1e-6 * std::fabs(expected) + 1e-300) {
      return Status::InvalidArgument("projection_coeff " + std::to_string(coeff) + " is not (1 - alpha) * dot / pp = " +
                                     std::to_string(expected));
    }
  }
  const bool should_apply = d.regime == Regime::kSafe || d.regime == Regime::kProject;
  if (response.apply_update() != should_apply) {
    return Status::InvalidArgument(std::string("apply_update must be ") + (should_apply ? "true" : "false") +
                                   " for regime " + RegimeName(d.regime));
  }
  if (response.has_cosine()) {
    GAC_RETURN_IF_ERROR(CheckCosine("cosine", response.cosine()));
    d.cosine = response.cosine();
  }
  if (response.has_cosine_after()) {
    GAC_RETURN_IF_ERROR(CheckCosine("cosine_after", response.cosine_after()));
    d.cosine_after = response.cosine_after();
  }
  d.alpha = response.alpha();
  d.projection_coeff = coeff;
  d.apply_update = response.apply_update();
  d.grad_norm = std::sqrt(stats.grad_sq);
  d.ref_norm = std::sqrt(stats.ref_sq);
  return d;
}

void EncodeDecideResponse(const v1::DecideRequest& request, const Decision& decision,
                          v1::DecideResponse* response) {
  EncodeDecision(decision, response);
  response->set_run(request.run());
  response->set_step(request.step());
}

StatusOr<Decision> DecodeDecideResponse(const v1::DecideRequest& request, const v1::DecideResponse& response) {
  // A run id is never empty, so an empty one is an answer that does not say.
  if (response.run() != request.run() || response.step() != request.step()) {
    return Status::InvalidArgument("answer for run '" + Printable(response.run()) + "' step " +
                                   std::to_string(response.step()) + ", asked for run '" + request.run() +
                                   "' step " + std::to_string(request.step()));
  }
  return DecodeDecision(response, StatsFromProto(request));
}

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

Status FromGrpcStatus(const grpc::Status& status, const std::string& prefix) {
  if (status.ok()) return Status::Ok();
  const int code = static_cast<int>(status.error_code());
  const StatusCode mapped = code >= 1 && code <= 16 ? static_cast<StatusCode>(code) : StatusCode::kUnknown;
  return Status(mapped, prefix.empty() ? status.error_message() : prefix + ": " + status.error_message());
}

int ToHttpStatus(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange: return 400;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kAborted:
    case StatusCode::kAlreadyExists: return 409;
    case StatusCode::kResourceExhausted: return 413;
    case StatusCode::kCancelled: return 499;
    case StatusCode::kUnimplemented: return 501;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    case StatusCode::kUnknown:
    case StatusCode::kInternal:
    case StatusCode::kDataLoss: break;
  }
  return 500;
}

}  // namespace gac::proto
