// The spike guard: skips a step whose gradient norm (or loss) is far above
// the run's recent steps, before GAC decides. Two rules, each off unless
// asked for:
//
//   max_grad_norm > 0 and |g| > max_grad_norm                  -> spike
//   z-score on (zscore), at least `warmup` steps held:
//     z(|g|)  = (|g|  - mean) / std over the last `window` held norms  > sigma -> spike
//     z(loss) = (loss - mean) / std over the last `window` held losses > sigma -> spike
//     (the loss only when the trainer gives one; a non-finite loss is a spike)
//
// std is the sample standard deviation (n - 1). One-sided: a norm far below
// the mean is no spike. A spike step is skipped (the optimizer does not step)
// and enters neither GAC's window nor the snapshot: the reference stays the
// last accepted gradient. The guard's own history holds every judged step:
// an accepted one as it is, a spike clamped to the bound it broke,
// mean + sigma * std (HistoryEntry). One spike therefore moves the statistics
// by no more than a value at the bound, while a level that persists (a new
// learning rate, a harder batch mix) enters step by step and is followed
// after a run of skips (at window 128 and sigma 6: 12 for |g|
// doubling, 28 for x10, 66 for x1000, in a test) instead of being skipped for good.
// Steps with non-finite statistics are GAC's `invalid` and never reach the
// guard.
//
// SpikeSettings and SpikeVerdict are values; SpikeGuard keeps one run's
// history with no synchronisation (one per run, used by one thread);
// JudgeSpike and HistoryEntry are pure.
#ifndef GAC_CONTROLLER_SPIKE_H_
#define GAC_CONTROLLER_SPIKE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "gac/base/status.h"
#include "gac/controller/controller.h"
#include "gac/controller/spike_verdict.h"

namespace gac::controller {

inline constexpr int kMaxSpikeWindow = 10000;
// A z-score beyond it (a window of equal values has std 0) is reported as it.
inline constexpr double kMaxSpikeZ = 1e9;

struct SpikeSettings {
  double max_grad_norm = 0.0;  // > 0: the absolute bound on |g|; 0: none
  bool zscore = false;         // the z-score rule, on |g| and on the loss when given
  int window = 128;            // held steps the mean and std are over, [2, kMaxSpikeWindow]
  double sigma = 6.0;          // z above it is a spike; > 0
  int warmup = 0;              // steps held before the z-score applies, [2, window]; 0: max(2, window / 2)

  bool enabled() const { return max_grad_norm > 0.0 || zscore; }
  // warmup, or its default when 0.
  int effective_warmup() const;
};

// OK iff max_grad_norm is finite and >= 0, 2 <= window <= kMaxSpikeWindow,
// sigma finite and > 0, warmup 0 or in [2, window]; otherwise InvalidArgument
// naming the setting (as spike_<name>, the name every surface gives it).
base::Status ValidateSpikeSettings(const SpikeSettings& s);

// What a judged step adds to the guard's history, per value (norm, loss):
// a step let through, its value (a finite loss only); a spike, its value
// clamped to the verdict's bound, its value itself where std was 0, and
// nothing where the z-score did not apply (off, warming up) or the loss is
// not finite. `spike` is the step's outcome, which in remote mode gacd gives.
struct HistoryValues {
  std::optional<double> grad_norm;
  std::optional<double> loss;
};
HistoryValues HistoryEntry(const SpikeVerdict& verdict, bool spike, double grad_norm, std::optional<double> loss);

// The guard's verdict on a step with norm `grad_norm` (finite) and optional
// `loss`, given the held norms and losses (oldest first; only the newest
// `settings.window` of each are used).
SpikeVerdict JudgeSpike(const SpikeSettings& settings, double grad_norm, std::optional<double> loss,
                        const std::vector<double>& norms, const std::vector<double>& losses);

// The decision for a step the guard calls a spike: regime kSpike, the update
// skipped (apply_update false, alpha 1, no projection), the step's cosine
// and norms as Controller::Decide reports them, no cosine_after, the
// verdict's z-scores and `window_mean` (GAC's window, which the step does
// not enter). REQUIRES: !StatsInvalid(stats)
Decision SpikeDecision(const AlignmentStats& stats, const SpikeVerdict& verdict,
                       std::optional<double> window_mean);

class SpikeGuard {
 public:
  // REQUIRES: ValidateSpikeSettings(settings).ok()
  explicit SpikeGuard(SpikeSettings settings = {}) : settings_(settings) {}

  // Judges the step and records it (Record with the verdict's outcome).
  SpikeVerdict Step(double grad_norm, std::optional<double> loss);
  // JudgeSpike against the history, remembering nothing.
  SpikeVerdict Judge(double grad_norm, std::optional<double> loss) const;
  // Adds the step's HistoryEntry to the history.
  void Record(const SpikeVerdict& verdict, bool spike, double grad_norm, std::optional<double> loss);
  void Clear();

  const SpikeSettings& settings() const { return settings_; }
  // The norms and losses held, oldest first.
  std::vector<double> norms() const { return {norms_.begin(), norms_.end()}; }
  std::vector<double> losses() const { return {losses_.begin(), losses_.end()}; }

 private:
  SpikeSettings settings_;
  std::deque<double> norms_;
  std::deque<double> losses_;
};

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_SPIKE_H_
