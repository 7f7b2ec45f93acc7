// The in-memory Store: ordered maps behind one mutex. It is the test fake and
// the reference for the conformance suite, so it favours being obviously
// correct over being fast. See store.h for the contract.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gac/base/mutex.h"
#include "gac/server/store.h"

namespace gac::server {
namespace {

class MemoryStore final : public Store {
 public:
  base::Status Apply(std::vector<WriteOp>* ops) override {
    base::MutexLock lock(&mu_);
    for (WriteOp& op : *ops) {
      op.stored = 0;
      op.duplicates = 0;
      if (op.steps != nullptr) ApplySteps(&op);
      op.config_conflict = false;
      op.stored_config.Clear();
      if (op.config != nullptr) {
        auto it = configs_.find(op.config->run);
        const std::uint64_t stored = it == configs_.end() ? 0 : it->second.version();
        if (stored != op.config->change.before().version()) {
          op.config_conflict = true;
          if (it != configs_.end()) op.stored_config = it->second;
          continue;
        }
        configs_[op.config->run] = op.config->config;
        changes_[op.config->run].push_back(op.config->change);
      }
    }
    return base::Status();
  }

  base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> LoadRunConfigs() override {
    base::MutexLock lock(&mu_);
    std::vector<std::pair<std::string, v1::RunConfig>> out;
    for (const auto& [run, config] : configs_) {
      if (config.version() >= 1) out.emplace_back(run, config);
    }
    return out;
  }

  base::StatusOr<std::vector<v1::RunInfo>> ListRuns(const std::string& after_run,
                                              std::uint32_t limit) override {
    base::MutexLock lock(&mu_);
    std::vector<v1::RunInfo> out;
    for (auto it = runs_.upper_bound(after_run); it != runs_.end() && out.size() < limit; ++it) {
      out.push_back(it->second.info);
    }
    return out;
  }

  base::StatusOr<v1::RunInfo> GetRun(const std::string& run) override {
    base::MutexLock lock(&mu_);
    auto it = runs_.find(run);
    if (it == runs_.end()) return base::Status::NotFound("run \"" + run + "\" has no stored step");
    return it->second.info;
  }

  base::StatusOr<std::vector<v1::StepRecord>> GetSteps(const StepQuery& query) override {
    base::MutexLock lock(&mu_);
    std::vector<v1::StepRecord> out;
    auto run = runs_.find(query.run);
    if (run == runs_.end()) return out;
    for (auto it = run->second.steps.lower_bound({query.start_step, 0});
         it != run->second.steps.end() && out.size() < query.limit; ++it) {
      const auto& [key, record] = *it;
      if (key.first >= query.end_step) break;
      if (query.after.has_value() && key <= *query.after) continue;
      if (query.rank.has_value() && key.second != *query.rank) continue;
      out.push_back(record);
      if (!query.include_layers) out.back().clear_layers();
    }
    return out;
  }

  base::StatusOr<std::vector<v1::StepRecord>> GetRecentSteps(const std::string& run, std::uint32_t rank,
                                                       std::uint32_t window) override {
    base::MutexLock lock(&mu_);
    std::vector<v1::StepRecord> out;
    auto it = runs_.find(run);
    if (it == runs_.end()) return out;
    const auto& steps = it->second.steps;
    for (auto s = steps.rbegin(); s != steps.rend() && (window == 0 || out.size() < window); ++s) {
      if (s->first.second != rank) continue;
      out.push_back(s->second);
      out.back().clear_layers();
    }
    std::reverse(out.begin(), out.end());
    return out;
  }

  base::StatusOr<std::vector<v1::ConfigChange>> ListConfigChanges(const std::string& run,
                                                            std::uint64_t offset,
                                                            std::uint32_t limit) override {
    base::MutexLock lock(&mu_);
    std::vector<v1::ConfigChange> out;
    auto it = changes_.find(run);
    if (it == changes_.end()) return out;
    const std::vector<v1::ConfigChange>& all = it->second;
    for (std::uint64_t i = offset; i < all.size() && out.size() < limit; ++i) out.push_back(all[i]);
    return out;
  }

  base::StatusOr<std::uint64_t> DeleteIdleRuns(std::int64_t cutoff_ns) override {
    base::MutexLock lock(&mu_);
    std::uint64_t deleted = 0;
    for (auto it = runs_.begin(); it != runs_.end();) {
      if (it->second.info.last_seen_ns() < cutoff_ns) {
        it = runs_.erase(it);
        ++deleted;
      } else {
        ++it;
      }
    }
    return deleted;
  }

 private:
  using StepKey = std::pair<std::int64_t, std::uint32_t>;  // (step, rank)

  struct RunData {
    v1::RunInfo info;                         // config left empty
    std::map<StepKey, v1::StepRecord> steps;  // with layers
  };

  void ApplySteps(WriteOp* op) GAC_REQUIRES(mu_) {
    for (const v1::StepRecord& r : op->steps->records()) {
      auto it = runs_.find(r.run());
      const StepKey key{r.step(), r.rank()};
      if (it == runs_.end()) {
        it = runs_.emplace(r.run(), RunData()).first;
        v1::RunInfo& info = it->second.info;
        info.set_run(r.run());
        info.set_first_step(r.step());
        info.set_last_step(r.step());
        info.set_first_seen_ns(op->received_ns);
        info.set_last_seen_ns(op->received_ns);
      }
      RunData& run = it->second;
      v1::RunInfo& info = run.info;
      // Seen times move for duplicates too: a replay is a report of the run.
      info.set_first_seen_ns(std::min(info.first_seen_ns(), op->received_ns));
      info.set_last_seen_ns(std::max(info.last_seen_ns(), op->received_ns));
      if (!run.steps.emplace(key, r).second) {
        ++op->duplicates;
        continue;
      }
      ++op->stored;
      info.set_first_step(std::min(info.first_step(), r.step()));
      info.set_last_step(std::max(info.last_step(), r.step()));
      info.set_step_records(info.step_records() + 1);
      info.set_world_size(std::max({info.world_size(), r.world_size(), std::uint32_t{1}}));
      info.set_steps_mode(run.steps.rbegin()->second.mode());  // of the latest (step, rank)
    }
  }

  base::Mutex mu_;
  std::map<std::string, RunData> runs_ GAC_GUARDED_BY(mu_);  // runs with at least one stored step
  std::map<std::string, v1::RunConfig> configs_ GAC_GUARDED_BY(mu_);
  std::map<std::string, std::vector<v1::ConfigChange>> changes_ GAC_GUARDED_BY(mu_);  // oldest first
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace gac::server
