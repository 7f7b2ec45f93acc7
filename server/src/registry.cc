#include "server/src/registry.h"

#include "gac/proto/convert.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace gac::server {
namespace {

v1::RunConfig DefaultConfig(const v1::Thresholds& t, v1::ControlMode mode) {
  v1::RunConfig c;
  *c.mutable_thresholds() = t;
  if (c.thresholds().alpha_mode() == v1::ALPHA_MODE_UNSPECIFIED) {
    c.mutable_thresholds()->set_alpha_mode(v1::ALPHA_MODE_PAPER);
  }
  c.set_mode(mode);
  c.set_trigger(v1::TRIGGER_PER_STEP);
  c.set_window(static_cast<std::uint32_t>(controller::TriggerSettings{}.window));
  *c.mutable_window_thresholds() = c.thresholds();
  return c;
}

controller::Controller MakeController(const v1::Thresholds& t) {
  base::StatusOr<controller::Controller> c = proto::ControllerFromProto(t);
  return c.ok() ? *c : *controller::Controller::Create(controller::Thresholds{});
}

// Thresholds as stored: an unspecified alpha mode is the paper's.
v1::Thresholds Normalized(v1::Thresholds t) {
  if (t.alpha_mode() == v1::ALPHA_MODE_UNSPECIFIED) t.set_alpha_mode(v1::ALPHA_MODE_PAPER);
  return t;
}

}  // namespace

RunRegistry::Entry RunRegistry::MakeEntry(const v1::RunConfig& config) const {
  // Stored settings were validated when set; fall back to the paper's values
  // (and the per-step trigger) rather than crash on a hand-edited database.
  const v1::Thresholds& window = config.has_window_thresholds() ? config.window_thresholds() : default_thresholds_;
  base::StatusOr<controller::TriggerSettings> t = proto::TriggerFromProto(config, default_thresholds_);
  base::StatusOr<controller::SpikeSettings> spike = proto::SpikeFromProto(config.spike());
  return Entry{config, MakeController(config.thresholds()), t.ok() ? *t : controller::TriggerSettings{},
               MakeController(window), spike.ok() ? *spike : controller::SpikeSettings{}};
}

RunRegistry::RunRegistry(const v1::Thresholds& default_thresholds, v1::ControlMode default_mode)
    : default_thresholds_(Normalized(default_thresholds)),
      defaults_(MakeEntry(DefaultConfig(default_thresholds_, default_mode))) {}

void RunRegistry::Load(const std::vector<std::pair<std::string, v1::RunConfig>>& configs) {
  base::WriterMutexLock lock(&mu_);
  for (const auto& [run, config] : configs) runs_.insert_or_assign(run, MakeEntry(config));
}

v1::RunConfig RunRegistry::Get(const std::string& run) const {
  base::ReaderMutexLock lock(&mu_);
  auto it = runs_.find(run);
  return it == runs_.end() ? defaults_.config : it->second.config;
}

controller::Decision RunRegistry::Decide(const std::string& run, const controller::AlignmentStats& stats,
                                         const google::protobuf::RepeatedField<double>& recent,
                                         v1::RunConfig* used,
                                         const google::protobuf::RepeatedField<double>* recent_norms,
                                         const google::protobuf::RepeatedField<double>* recent_losses) const {
  base::ReaderMutexLock lock(&mu_);
  auto it = runs_.find(run);
  const Entry& e = it == runs_.end() ? defaults_ : it->second;
  if (used != nullptr) *used = e.config;
  // The newest W of the asker's cosines, and this step's when it has one (a
  // step without a cosine leaves the window as it was), by the library's
  // definition of a step's cosine, as the agent's window has it.
  controller::AlignmentWindow window(e.trigger.window);
  const int n = recent.size();
  for (int i = std::max(0, n - e.trigger.window); i < n; ++i) window.Add(recent.Get(i));
  std::optional<controller::SpikeVerdict> verdict;
  if (e.spike.enabled() && !controller::StatsInvalid(stats)) {
    const auto values = [](const google::protobuf::RepeatedField<double>* f) {
      return f == nullptr ? std::vector<double>() : std::vector<double>(f->begin(), f->end());
    };
    verdict = controller::JudgeSpike(e.spike, std::sqrt(stats.grad_sq), stats.loss, values(recent_norms),
                                     values(recent_losses));
    if (verdict->spike) return controller::SpikeDecision(stats, *verdict, window.mean());
  }
  controller::Decision d = e.controller.Decide(stats);
  if (const std::optional<double> c = controller::StepCosine(stats)) window.Add(*c);
  const std::optional<double> mean = window.mean();
  if (e.trigger.trigger == controller::Trigger::kWindow) d = controller::DecideOnMean(e.window_controller, stats, mean);
  d.window_mean = mean;
  if (verdict) d.spike_verdict = *verdict;
  return d;
}

base::StatusOr<v1::RunConfig> RunRegistry::Change(const v1::SetRunConfigRequest& request, const std::string& principal,
                                                  std::int64_t now_ns, v1::RunConfig* before) {
  if (!request.has_thresholds() && request.mode() == v1::CONTROL_MODE_UNSPECIFIED &&
      request.trigger() == v1::TRIGGER_UNSPECIFIED && request.window() == 0 && !request.has_window_thresholds() &&
      !request.has_spike()) {
    return base::Status::InvalidArgument(
        "nothing to change: give thresholds, mode, trigger, window, window thresholds or the spike guard");
  }
  if (request.has_spike()) {
    base::StatusOr<controller::SpikeSettings> s = proto::SpikeFromProto(request.spike());
    if (!s.ok()) return base::Status::InvalidArgument("spike guard: " + s.status().message());
  }
  if (request.has_thresholds()) {
    base::StatusOr<controller::Thresholds> t = proto::ThresholdsFromProto(request.thresholds());
    if (!t.ok()) return base::Status::InvalidArgument("thresholds: " + t.status().message());
  }
  if (request.has_window_thresholds()) {
    base::StatusOr<controller::Thresholds> t = proto::ThresholdsFromProto(request.window_thresholds());
    if (!t.ok()) return base::Status::InvalidArgument("window thresholds: " + t.status().message());
  }
  // UNSPECIFIED keeps the run's current mode / trigger (a partial change).
  if (request.mode() != v1::CONTROL_MODE_UNSPECIFIED) {
    if (base::StatusOr<controller::Mode> m = proto::FromProto(request.mode()); !m.ok()) return m.status();
  }
  if (request.trigger() != v1::TRIGGER_UNSPECIFIED) {
    if (base::StatusOr<controller::Trigger> t = proto::FromProto(request.trigger()); !t.ok()) return t.status();
  }
  if (request.window() != 0) {
    const base::Status w = controller::ValidateWindow(proto::WindowFromProto(request.window()));
    if (!w.ok()) return base::Status::InvalidArgument(w.message());
  }
  base::WriterMutexLock lock(&mu_);
  auto it = runs_.find(request.run());
  const v1::RunConfig current = it == runs_.end() ? defaults_.config : it->second.config;
  if (request.expected_version() != 0 && request.expected_version() != current.version()) {
    return base::Status(base::StatusCode::kAborted, "run '" + request.run() + "' is at version " +
                                                        std::to_string(current.version()) + ", not the expected " +
                                                        std::to_string(request.expected_version()));
  }
  // Every setting is written out, so a stored version reads the same whatever
  // the server's defaults are later.
  const Entry& now = it == runs_.end() ? defaults_ : it->second;
  v1::RunConfig next;
  *next.mutable_thresholds() = Normalized(request.has_thresholds() ? request.thresholds() : current.thresholds());
  next.set_mode(request.mode() != v1::CONTROL_MODE_UNSPECIFIED ? request.mode() : current.mode());
  next.set_trigger(request.trigger() != v1::TRIGGER_UNSPECIFIED ? request.trigger() : proto::ToProto(now.trigger.trigger));
  next.set_window(request.window() != 0 ? request.window() : static_cast<std::uint32_t>(now.trigger.window));
  *next.mutable_window_thresholds() = Normalized(request.has_window_thresholds() ? request.window_thresholds()
                                                 : current.has_window_thresholds() ? current.window_thresholds()
                                                                                   : default_thresholds_);
  if (request.has_spike()) {
    base::StatusOr<controller::SpikeSettings> s = proto::SpikeFromProto(request.spike());
    if (s->enabled()) *next.mutable_spike() = proto::ToProto(*s);  // off: absent
  } else if (current.has_spike()) {
    *next.mutable_spike() = current.spike();
  }
  next.set_version(current.version() + 1);
  next.set_updated_ns(now_ns);
  next.set_updated_by(principal);
  runs_.insert_or_assign(request.run(), MakeEntry(next));
  if (before != nullptr) *before = current;
  return next;
}

void RunRegistry::Revert(const std::string& run, const v1::RunConfig& failed, const v1::RunConfig& previous) {
  base::WriterMutexLock lock(&mu_);
  auto it = runs_.find(run);
  if (it == runs_.end() || it->second.config.version() != failed.version()) return;
  if (previous.version() == 0) {
    runs_.erase(it);
  } else {
    it->second = MakeEntry(previous);
  }
}

bool RunRegistry::Install(const std::string& run, const v1::RunConfig& config) {
  if (config.version() == 0) return false;  // never stored: the defaults apply
  base::WriterMutexLock lock(&mu_);
  auto it = runs_.find(run);
  if (it != runs_.end() && it->second.config.version() >= config.version()) return false;
  runs_.insert_or_assign(run, MakeEntry(config));
  return true;
}

}  // namespace gac::server
