#include "gac/transport/step_record.h"

#include <chrono>
#include <cmath>

#include "gac/proto/convert.h"

namespace gac::transport {
namespace {

double ClampCosine(double c) { return std::fmax(-1.0, std::fmin(1.0, c)); }
double FiniteNorm(double v) { return std::isfinite(v) && v >= 0.0 ? v : 0.0; }

}  // namespace

v1::StepRecord MakeStepRecord(const StepReport& report, const RunIdentity& who, Mode mode,
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
  for (const GroupStats& g : report.groups) {
    v1::LayerRecord* l = r.add_layers();
    l->set_name(g.name);
    if (auto c = g.cosine(); c && std::isfinite(*c)) l->set_cosine(ClampCosine(*c));
    l->set_grad_norm(std::isfinite(g.gg) && g.gg >= 0 ? std::sqrt(g.gg) : 0.0);
    l->set_ref_norm(std::isfinite(g.pp) && g.pp >= 0 ? std::sqrt(g.pp) : 0.0);
  }
  r.set_wall_time_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  r.set_agent_overhead_seconds(FiniteNorm(report.stats_seconds + report.decide_seconds + report.apply_seconds));
  r.set_mode(proto::ToProto(mode));
  r.set_fallback(report.fallback);
  return r;
}

}  // namespace gac::transport
