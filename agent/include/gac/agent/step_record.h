// Builds the telemetry record of a step from the agent's report, for
// trainers that link both gac::agent and gac::agent_grpc:
//
//   auto report = agent->Step(step, params);
//   telemetry->Enqueue(gac::agent::MakeStepRecord(*report, identity, {{"reward", r}}));

#ifndef GAC_AGENT_STEP_RECORD_H_
#define GAC_AGENT_STEP_RECORD_H_

#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <string>

#include "gac/agent/agent.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::agent {

// Who reports: the same for every step of a rank.
struct RunIdentity {
  std::string run;              // run id ([A-Za-z0-9._:/-], 1-128 characters)
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
};

inline v1::Regime ToProtoRegime(Regime regime) {
  switch (regime) {
    case Regime::kSafe: return v1::REGIME_SAFE;
    case Regime::kProject: return v1::REGIME_PROJECT;
    case Regime::kSkip: return v1::REGIME_SKIP;
    case Regime::kInvalid: return v1::REGIME_INVALID;
  }
  return v1::REGIME_UNSPECIFIED;
}

inline v1::ControlMode ToProtoMode(Mode mode) {
  switch (mode) {
    case Mode::kMonitor: return v1::CONTROL_MODE_MONITOR;
    case Mode::kLocal: return v1::CONTROL_MODE_LOCAL;
    case Mode::kRemote: return v1::CONTROL_MODE_REMOTE;
  }
  return v1::CONTROL_MODE_UNSPECIFIED;
}

// `scalars`: trainer scalars (reward, loss, kl, entropy...); non-finite
// values are left out (gacd rejects them). `staleness`: policy versions
// behind, if the trainer knows it.
inline v1::StepRecord MakeStepRecord(const StepReport& report, const RunIdentity& who, Mode mode,
                                     const std::map<std::string, double>& scalars = {},
                                     std::optional<std::int64_t> staleness = std::nullopt) {
  v1::StepRecord r;
  r.set_run(who.run);
  r.set_rank(who.rank);
  r.set_world_size(who.world_size);
  r.set_step(report.step);
  const Decision& d = report.decision;
  if (d.cosine && std::isfinite(*d.cosine)) r.set_cosine(std::fmax(-1.0, std::fmin(1.0, *d.cosine)));
  if (d.cosine_after && std::isfinite(*d.cosine_after)) {
    r.set_cosine_after(std::fmax(-1.0, std::fmin(1.0, *d.cosine_after)));
  }
  r.set_grad_norm(std::isfinite(d.grad_norm) ? d.grad_norm : 0.0);
  r.set_ref_norm(std::isfinite(d.ref_norm) ? d.ref_norm : 0.0);
  r.set_regime(ToProtoRegime(d.regime));
  r.set_alpha(std::isfinite(d.alpha) ? std::fmax(0.0, std::fmin(1.0, d.alpha)) : 1.0);
  if (staleness && *staleness >= 0) r.set_staleness(*staleness);
  for (const auto& [name, value] : scalars) {
    if (std::isfinite(value)) (*r.mutable_scalars())[name] = value;
  }
  for (const GroupStats& g : report.groups) {
    v1::LayerRecord* l = r.add_layers();
    l->set_name(g.name);
    if (auto c = g.cosine(); c && std::isfinite(*c)) l->set_cosine(std::fmax(-1.0, std::fmin(1.0, *c)));
    l->set_grad_norm(std::isfinite(g.gg) && g.gg >= 0 ? std::sqrt(g.gg) : 0.0);
    l->set_ref_norm(std::isfinite(g.pp) && g.pp >= 0 ? std::sqrt(g.pp) : 0.0);
  }
  r.set_wall_time_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  const double overhead = report.stats_seconds + report.decide_seconds + report.apply_seconds;
  r.set_agent_overhead_seconds(std::isfinite(overhead) && overhead >= 0 ? overhead : 0.0);
  r.set_mode(ToProtoMode(mode));
  r.set_fallback(report.fallback);
  return r;
}

}  // namespace gac::agent

#endif  // GAC_AGENT_STEP_RECORD_H_
