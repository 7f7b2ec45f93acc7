#include "server/src/settings_sync.h"

#include <algorithm>
#include <cstdio>

namespace gac::server {
namespace {

using Clock = std::chrono::steady_clock;

// The longest single wait for a notification: how soon Stop is noticed.
constexpr std::chrono::milliseconds kMaxWait{200};
constexpr std::chrono::milliseconds kMaxBackoff{2000};

}  // namespace

SettingsSync::SettingsSync(Store* store, RunRegistry* registry, Metrics* metrics,
                           std::chrono::milliseconds refresh_interval)
    : store_(store), registry_(registry), metrics_(metrics), refresh_interval_(refresh_interval) {}

SettingsSync::~SettingsSync() { Stop(); }

void SettingsSync::Start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

void SettingsSync::Stop() {
  {
    base::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

bool SettingsSync::stopping() const {
  base::MutexLock lock(&mu_);
  return stop_;
}

bool SettingsSync::Sleep(std::chrono::milliseconds d) {
  base::MutexLock lock(&mu_);
  const auto deadline = Clock::now() + d;
  while (!stop_ && cv_.WaitUntil(&mu_, deadline)) {
  }
  return !stop_;
}

void SettingsSync::Install(const std::vector<std::pair<std::string, v1::RunConfig>>& configs) {
  const auto now = std::chrono::system_clock::now();
  for (const auto& [run, config] : configs) {
    if (!registry_->Install(run, config)) continue;
    installed_.fetch_add(1);
    if (metrics_ != nullptr) metrics_->ObserveConfig(run, config, now);
  }
}

void SettingsSync::Run() {
  // The first wait subscribes; the reload after it covers what was committed
  // before the subscription.
  bool reload = true;
  bool failing = false;
  auto backoff = std::chrono::milliseconds(100);
  auto next_reload = Clock::now();
  // After a failure: say so once, reload once the store answers, back off.
  const auto failed = [&](const base::Status& status) {
    if (!failing) std::fprintf(stderr, "gacd: settings of other replicas: %s (retrying)\n", status.ToString().c_str());
    failing = true;
    reload = true;
    const bool go_on = Sleep(backoff);
    backoff = std::min(backoff * 2, kMaxBackoff);
    return go_on;
  };
  while (!stopping()) {
    const auto now = Clock::now();
    const auto until_reload = std::chrono::duration_cast<std::chrono::milliseconds>(next_reload - now);
    const auto wait = reload ? std::chrono::milliseconds(0)
                             : std::clamp(until_reload, std::chrono::milliseconds(0), kMaxWait);
    base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> changes = store_->WaitForConfigChanges(wait);
    if (changes.status().code() == base::StatusCode::kUnimplemented) return;  // one process per store
    if (!changes.ok()) {
      if (!failed(changes.status())) return;
      continue;
    }
    Install(*changes);
    if (reload || Clock::now() >= next_reload) {
      base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> all = store_->LoadRunConfigs();
      if (!all.ok()) {
        if (!failed(all.status())) return;
        continue;
      }
      Install(*all);
      reload = false;
      next_reload = Clock::now() + refresh_interval_;
    }
    if (failing) std::fprintf(stderr, "gacd: settings of other replicas: listening again\n");
    failing = false;
    backoff = std::chrono::milliseconds(100);
  }
}

}  // namespace gac::server
