// SettingsSync: keeps one gacd replica's run registry current with the
// settings changed through the other replicas that share its store.
//
// A thread listens for committed changes (Store::WaitForConfigChanges:
// LISTEN/NOTIFY on PostgreSQL) and installs each one that is newer than the
// registry's (RunRegistry::Install), so a SetRunConfig on any replica decides
// the next Decide on every other within milliseconds. Decide itself reads
// only the registry and never waits for the database. As a safety net for a
// missed notification, every run's settings are reloaded (LoadRunConfigs)
// every refresh interval and as soon as the store answers again after an
// outage. For a store that one process uses alone (SQLite, memory) the
// thread ends at once.
//
// Thread safety: Start and Stop from one thread; installed() from any.
#ifndef GAC_SERVER_SRC_SETTINGS_SYNC_H_
#define GAC_SERVER_SRC_SETTINGS_SYNC_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gac/base/mutex.h"
#include "gac/server/store.h"
#include "server/src/metrics.h"
#include "server/src/registry.h"

namespace gac::server {

class SettingsSync {
 public:
  // REQUIRES: the pointees outlive the sync.
  SettingsSync(Store* store, RunRegistry* registry, Metrics* metrics,
               std::chrono::milliseconds refresh_interval = std::chrono::seconds(5));
  ~SettingsSync();  // Stop()
  SettingsSync(const SettingsSync&) = delete;
  SettingsSync& operator=(const SettingsSync&) = delete;

  void Start();
  // Ends the thread within about a quarter of a second. Idempotent.
  void Stop() GAC_EXCLUDES(mu_);

  // Settings installed from the store since Start (changes made elsewhere).
  std::uint64_t installed() const { return installed_.load(); }

 private:
  void Run() GAC_EXCLUDES(mu_);
  void Install(const std::vector<std::pair<std::string, v1::RunConfig>>& configs);
  // Sleeps up to `d`; false when stopping.
  bool Sleep(std::chrono::milliseconds d) GAC_EXCLUDES(mu_);
  bool stopping() const GAC_EXCLUDES(mu_);

  Store* const store_;
  RunRegistry* const registry_;
  Metrics* const metrics_;
  const std::chrono::milliseconds refresh_interval_;
  std::atomic<std::uint64_t> installed_{0};

  mutable base::Mutex mu_;
  base::CondVar cv_;
  bool stop_ GAC_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_SETTINGS_SYNC_H_
