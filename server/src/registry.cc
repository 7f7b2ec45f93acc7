#include "server/src/registry.h"

#include "gac/proto/convert.h"

namespace gac::server {
namespace {

v1::RunConfig DefaultConfig(const v1::Thresholds& t, v1::ControlMode mode) {
  v1::RunConfig c;
  *c.mutable_thresholds() = t;
  if (c.thresholds().alpha_mode() == v1::ALPHA_MODE_UNSPECIFIED) {
    c.mutable_thresholds()->set_alpha_mode(v1::ALPHA_MODE_PAPER);
  }
  c.set_mode(mode);
  return c;
}

}  // namespace

RunRegistry::Entry RunRegistry::MakeEntry(const v1::RunConfig& config) {
  // Stored settings were validated when set; fall back to the paper's values
  // rather than crash on a hand-edited database.
  base::StatusOr<controller::Controller> c = proto::ControllerFromProto(config.thresholds());
  return Entry{config, c.ok() ? *c : *controller::Controller::Create(controller::Thresholds{})};
}

RunRegistry::RunRegistry(const v1::Thresholds& default_thresholds, v1::ControlMode default_mode)
    : defaults_(MakeEntry(DefaultConfig(default_thresholds, default_mode))) {}

void RunRegistry::Load(const std::vector<std::pair<std::string, v1::RunConfig>>& configs) {
  base::WriterMutexLock lock(&mu_);
  for (const auto& [run, config] : configs) runs_.insert_or_assign(run, MakeEntry(config));
}

v1::RunConfig RunRegistry::Get(const std::string& run) const {
  base::ReaderMutexLock lock(&mu_);
  auto it = runs_.find(run);
  return it == runs_.end() ? defaults_.config : it->second.config;
}

controller::Decision RunRegistry::Decide(const std::string& run, const controller::AlignmentStats& stats, v1::RunConfig* used) const {
  base::ReaderMutexLock lock(&mu_);
  auto it = runs_.find(run);
  const Entry& e = it == runs_.end() ? defaults_ : it->second;
  if (used != nullptr) *used = e.config;
  return e.controller.Decide(stats);
}

base::StatusOr<v1::RunConfig> RunRegistry::Change(const std::string& run, const v1::Thresholds& thresholds,
                                            v1::ControlMode mode, std::uint64_t expected_version,
                                            const std::string& principal, std::int64_t now_ns,
                                            v1::RunConfig* before) {
  base::StatusOr<controller::Thresholds> t = proto::ThresholdsFromProto(thresholds);
  if (!t.ok()) return base::Status::InvalidArgument("thresholds: " + t.status().message());
  // UNSPECIFIED keeps the run's current mode (a thresholds-only change).
  if (mode != v1::CONTROL_MODE_UNSPECIFIED) {
    if (base::StatusOr<controller::Mode> m = proto::FromProto(mode); !m.ok()) return m.status();
  }
  base::WriterMutexLock lock(&mu_);
  auto it = runs_.find(run);
  const v1::RunConfig current = it == runs_.end() ? defaults_.config : it->second.config;
  if (mode == v1::CONTROL_MODE_UNSPECIFIED) mode = current.mode();
  if (expected_version != 0 && expected_version != current.version()) {
    return base::Status(base::StatusCode::kAborted, "run '" + run + "' is at version " + std::to_string(current.version()) +
                                            ", not the expected " + std::to_string(expected_version));
  }
  v1::RunConfig next;
  *next.mutable_thresholds() = thresholds;
  if (next.thresholds().alpha_mode() == v1::ALPHA_MODE_UNSPECIFIED) {
    next.mutable_thresholds()->set_alpha_mode(v1::ALPHA_MODE_PAPER);
  }
  next.set_mode(mode);
  next.set_version(current.version() + 1);
  next.set_updated_ns(now_ns);
  next.set_updated_by(principal);
  runs_.insert_or_assign(run, MakeEntry(next));
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
