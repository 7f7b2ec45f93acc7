#include "gac/transport/step_record.h"

#include <chrono>
#include <cmath>

#include "gac/proto/convert.h"

namespace gac::transport {
namespace {

double ClampCosine(double c) { return std::fmax(-1.0, std::fmin(1.0, c)); }
double FiniteNorm(double v) { return std::isfinite(v) && v >= 0.0 ? v : 0.0; }

}  // namespace

v1::StepRecord MakeStepRecord(const StepReport& report, const RunIdentity& who,
                              const std::map<std::string, double>& scalars, std::optional<std::int64_t> staleness) {
  v1::StepRecord r;
  r.set_run(who.run);
  r.set_rank(who.rank);
  r.set_world_size(who.world_size);
  r.set_step(report.step);
  const Decision& d = report.decision;
  if (d.cosine && std::isfinite(*d.cosine)) r.set_cosine(ClampCosine(*d.cosine));
  if (d.cosine_after && std::isfinite(*d.cosine_after)) r.set_cosine_after(ClampCosine(*d.cosine_after));
  r.set_grad_norm(FiniteNorm(d.grad_norm));
  r.set_ref_norm(FiniteNorm(d.ref_norm));
  r.set_regime(proto::ToProto(d.regime));
  r.set_alpha(std::isfinite(d.alpha) ? std::fmax(0.0, std::fmin(1.0, d.alpha)) : 1.0);
  if (staleness && *staleness >= 0) r.set_staleness(*staleness);
  for (const auto& [name, value] : scalars) {
    if (std::isfinite(value)) (*r.mutable_scalars())[name] = value;
  }
  for (const LayerStats& layer : report.layers) {
    v1::LayerRecord* l = r.add_layers();
    l->set_name(layer.name);
    if (auto c = layer.cosine(); c && std::isfinite(*c)) l->set_cosine(ClampCosine(*c));
    l->set_grad_norm(std::isfinite(layer.grad_sq) && layer.grad_sq >= 0 ? std::sqrt(layer.grad_sq) : 0.0);
    l->set_ref_norm(std::isfinite(layer.ref_sq) && layer.ref_sq >= 0 ? std::sqrt(layer.ref_sq) : 0.0);
  }
  r.set_wall_time_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  r.set_agent_overhead_seconds(FiniteNorm(report.agent_overhead_seconds()));
  r.set_mode(proto::ToProto(report.mode));
  r.set_fallback(report.fallback);
  return r;
}

v1::StepRecord MakeStepRecord(const StepReport& report, const RunIdentity& who, Mode mode,
                              const std::map<std::string, double>& scalars, std::optional<std::int64_t> staleness) {
  v1::StepRecord r = MakeStepRecord(report, who, scalars, staleness);
  r.set_mode(proto::ToProto(mode));
  return r;
}

}  // namespace gac::transport
