#include "gac/controller/controller.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>

namespace gac::controller {

const char* RegimeName(Regime regime) {
  switch (regime) {
    case Regime::kSafe: return "safe";
    case Regime::kProject: return "project";
    case Regime::kSkip: return "skip";
    case Regime::kInvalid: return "invalid";
    case Regime::kSpike: return "spike";
  }
  return "unknown";
}

const char* AlphaModeName(AlphaMode mode) {
  return mode == AlphaMode::kExact ? "exact" : "paper";
}

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kMonitor: return "monitor";
    case Mode::kLocal: return "local";
    case Mode::kRemote: return "remote";
  }
  return "unknown";
}

base::StatusOr<Regime> ParseRegime(const char* name) {
  for (Regime r : kAllRegimes) {
    if (name != nullptr && std::strcmp(name, RegimeName(r)) == 0) return r;
  }
  return base::Status::InvalidArgument(std::string("unknown regime '") + (name ? name : "") +
                                 "' (expected safe, project, skip, invalid or spike)");
}

base::StatusOr<AlphaMode> ParseAlphaMode(const char* name) {
  for (AlphaMode m : {AlphaMode::kPaper, AlphaMode::kExact}) {
    if (name != nullptr && std::strcmp(name, AlphaModeName(m)) == 0) return m;
  }
  return base::Status::InvalidArgument(std::string("unknown alpha mode '") + (name ? name : "") +
                                 "' (expected paper or exact)");
}

base::StatusOr<Mode> ParseMode(const char* name) {
  for (Mode m : {Mode::kMonitor, Mode::kLocal, Mode::kRemote}) {
    if (name != nullptr && std::strcmp(name, ModeName(m)) == 0) return m;
  }
  return base::Status::InvalidArgument(std::string("unknown mode '") + (name ? name : "") +
                                 "' (expected monitor, local or remote)");
}

base::Status ValidateThresholds(const Thresholds& t) {
  if (!std::isfinite(t.c_low) || !std::isfinite(t.c_high)) {
    return base::Status::InvalidArgument("thresholds must be finite (c_low=" + std::to_string(t.c_low) +
                                   ", c_high=" + std::to_string(t.c_high) + ")");
  }
  if (!(t.c_low > 0.0)) {
    return base::Status::InvalidArgument("c_low must be > 0, got " + std::to_string(t.c_low));
  }
  if (!(t.c_high <= 1.0)) {
    return base::Status::InvalidArgument("c_high must be <= 1, got " + std::to_string(t.c_high));
  }
  if (!(t.c_low < t.c_high)) {
    return base::Status::InvalidArgument("c_low must be < c_high, got c_low=" + std::to_string(t.c_low) +
                                   " c_high=" + std::to_string(t.c_high));
  }
  return base::Status::Ok();
}

bool StatsInvalid(const AlignmentStats& s) {
  return !std::isfinite(s.dot) || !std::isfinite(s.grad_sq) || !std::isfinite(s.ref_sq) || s.grad_sq < 0.0 ||
         s.ref_sq < 0.0;
}

double CosineAfterProjection(double cosine, double alpha) {
  const double ac = alpha * cosine;
  const double rest = std::max(0.0, 1.0 - cosine * cosine);
  const double denom = std::sqrt(ac * ac + rest);
  return denom > 0.0 ? ac / denom : 0.0;
}

base::StatusOr<Controller> Controller::Create(Thresholds thresholds, AlphaMode mode) {
  base::Status s = ValidateThresholds(thresholds);
  if (!s.ok()) return s;
  return Controller(thresholds, mode);
}

double Controller::Alpha(double cosine) const {
  const double a = std::fabs(cosine);
  const double lo = thresholds_.c_low;
  if (mode_ == AlphaMode::kPaper) return lo / a;
  const double rest = std::max(0.0, 1.0 - cosine * cosine);
  return lo * std::sqrt(rest) / (a * std::sqrt(1.0 - lo * lo));
}

Regime Controller::RegimeForCosine(double cosine) const {
  const double a = std::fabs(cosine);
  if (a <= thresholds_.c_low) return Regime::kSafe;
  if (a >= thresholds_.c_high) return Regime::kSkip;
  return Regime::kProject;
}

Decision Controller::Decide(const AlignmentStats& s) const { return DecideWith(s, nullptr); }

Decision Controller::DecideOn(const AlignmentStats& s, std::optional<double> statistic) const {
  return DecideWith(s, &statistic);
}

Decision Controller::DecideWith(const AlignmentStats& s, const std::optional<double>* statistic) const {
  Decision d;
  d.grad_norm = std::sqrt(s.grad_sq);
  d.ref_norm = std::sqrt(s.ref_sq);
  // grad_sq and ref_sq are sums of squares: a negative one is as corrupt as a NaN and
  // would otherwise give a NaN cosine that falls through every comparison
  // into the projection branch with NaN coefficients.
  if (StatsInvalid(s)) {
    d.regime = Regime::kInvalid;
    d.apply_update = false;
    return d;
  }
  if (!s.has_reference || s.ref_sq == 0.0) {
    return d;  // safe, no cosine
  }
  // |g|*|p|, not sqrt(grad_sq*ref_sq): the product of the squares can overflow.
  const double norms = d.grad_norm * d.ref_norm;
  const double c = s.dot / (norms + kCosineEpsilon);
  d.cosine = c;
  // What the regime and alpha are decided on: the cosine, or the statistic given.
  const std::optional<double> on = statistic == nullptr ? std::optional<double>(c) : *statistic;
  d.regime = on ? RegimeForCosine(*on) : Regime::kSafe;
  if (d.regime == Regime::kSafe) {
    d.cosine_after = c;
    return d;
  }
  if (d.regime == Regime::kSkip) {
    d.apply_update = false;
    return d;
  }
  d.alpha = Alpha(*on);
  d.projection_coeff = (1.0 - d.alpha) * s.dot / s.ref_sq;
  if (!std::isfinite(d.projection_coeff)) {
    // ref_sq is so small (subnormal) that dot / ref_sq overflows although
    // |coeff * p| <= |g| stays finite: the reference is numerically zero,
    // as ref_sq == 0 is, and an infinite coefficient would turn the update into
    // NaN. Found by fuzz_decide_request.
    Decision none;
    none.grad_norm = d.grad_norm;
    none.ref_norm = d.ref_norm;
    return none;
  }
  // The post-projection cosine follows from the exact cosine of g and p.
  const double exact_c = norms > 0.0 ? s.dot / norms : 0.0;
  d.cosine_after = CosineAfterProjection(exact_c, d.alpha);
  return d;
}

}  // namespace gac::controller
