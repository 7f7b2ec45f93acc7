// In-memory view of every run's controller settings: what Decide reads (never
// the disk) and what SetRunConfig changes before it persists the change. With
// several gacd replicas on one database, changes made through the others
// arrive by Install (server/src/settings_sync.h).
//
// Thread safety: safe for concurrent use (a reader-writer lock).

#ifndef GAC_SERVER_SRC_REGISTRY_H_
#define GAC_SERVER_SRC_REGISTRY_H_

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gac/controller/controller.h"
#include "gac/controller/spike.h"
#include "gac/controller/window.h"
#include "gac/base/mutex.h"
#include "gac/base/status.h"
#include "gac/v1/control.pb.h"

namespace gac::server {

class RunRegistry {
 public:
  // REQUIRES: the defaults are valid (ValidateConfig checked them).
  RunRegistry(const v1::Thresholds& default_thresholds, v1::ControlMode default_mode);

  // Installs settings loaded from the store at start-up.
  void Load(const std::vector<std::pair<std::string, v1::RunConfig>>& configs);

  // The run's settings: stored ones, or the defaults with version 0.
  v1::RunConfig Get(const std::string& run) const;

  // Decides with the run's settings; `used` (if not null) receives them.
  // `recent` are the asker's previous valid cosines, oldest first: the newest
  // W of them, and this step's cosine when it has one, are the window of m_t
  // (the newest W of those together; reported as
  // Decision::window_mean whatever the trigger; the windowed trigger decides
  // on it). Nothing about a run's steps is kept here, so every replica gives
  // the same answer to the same request. With the run's spike guard on, the
  // guard decides first (gac/controller/spike.h), on `recent_norms` and
  // `recent_losses` (the asker's accepted steps, oldest first; null: none)
  // and stats.loss: a spike is decided as controller::SpikeDecision, with
  // the window's mean without this step's cosine.
  controller::Decision Decide(const std::string& run, const controller::AlignmentStats& stats,
                              const google::protobuf::RepeatedField<double>& recent, v1::RunConfig* used,
                              const google::protobuf::RepeatedField<double>* recent_norms = nullptr,
                              const google::protobuf::RepeatedField<double>* recent_losses = nullptr) const;

  // Validates and installs a change of the settings `request` gives (the
  // others are kept; INVALID_ARGUMENT when it gives none). ABORTED when
  // expected_version is non-zero and differs from the current version. On
  // success returns the new settings (version + 1) and fills `before`.
  base::StatusOr<v1::RunConfig> Change(const v1::SetRunConfigRequest& request, const std::string& principal,
                                       std::int64_t now_ns, v1::RunConfig* before);

  // Puts `previous` back if the run's current version is still `failed`'s
  // (undoes a Change whose write failed, or replaces it with the settings
  // that another gacd sharing the store committed first).
  void Revert(const std::string& run, const v1::RunConfig& failed, const v1::RunConfig& previous);

  // Installs settings committed through another gacd sharing the store when
  // they are newer than the run's current ones (a higher version); returns
  // whether they were installed. Older or equal versions are ignored: they
  // are already here, or a local change of this version is being written.
  bool Install(const std::string& run, const v1::RunConfig& config);

 private:
  struct Entry {
    v1::RunConfig config;
    controller::Controller controller;         // of the per-step thresholds
    controller::TriggerSettings trigger;
    controller::Controller window_controller;  // of the window thresholds
    controller::SpikeSettings spike;           // off unless the config has one
  };
  Entry MakeEntry(const v1::RunConfig& config) const;

  const v1::Thresholds default_thresholds_;
  const Entry defaults_;
  mutable base::SharedMutex mu_;
  std::unordered_map<std::string, Entry> runs_ GAC_GUARDED_BY(mu_);
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_REGISTRY_H_
