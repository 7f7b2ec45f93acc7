#include "gac/cli/replay.h"

#include <cmath>
#include <string>

#include "gac/cli/format.h"

namespace gac::cli {

ReplayedDecision ReplayStep(const controller::Controller& controller, const RecordedStep& step) {
  ReplayedDecision d;
  // Invalid statistics and the spike guard's steps are no thresholds' doing:
  // they stay as recorded.
  if (step.regime == controller::Regime::kInvalid || step.regime == controller::Regime::kSpike) {
    d.regime = step.regime;
    return d;
  }
  if (!step.cosine) return d;  // no reference: safe under any thresholds
  d.regime = controller.RegimeForCosine(*step.cosine);
  if (d.regime == controller::Regime::kProject) d.alpha = controller.Alpha(*step.cosine);
  return d;
}

void RegimeSeries::Add(std::int64_t step, controller::Regime regime) {
  ++counts_[static_cast<std::size_t>(regime)];
  if (regime == controller::Regime::kProject && !first_project_) first_project_ = step;
  if (regime == controller::Regime::kSkip && !first_skip_) first_skip_ = step;
  if (regime == controller::Regime::kSkip) {
    if (run_length_ > 0 && last_step_ && *last_step_ + 1 == step) {
      ++run_length_;
    } else {
      run_length_ = 1;
      run_first_ = step;
    }
    if (run_length_ > longest_skip_) {
      longest_skip_ = run_length_;
      longest_skip_first_ = run_first_;
    }
  } else {
    run_length_ = 0;
  }
  last_step_ = step;
}

std::uint64_t RegimeSeries::total() const {
  std::uint64_t n = 0;
  for (std::uint64_t c : counts_) n += c;
  return n;
}

ReplayedDecision Replayer::Add(const RecordedStep& step) {
  const ReplayedDecision d = ReplayStep(controller_, step);
  recorded_.Add(step.step, step.regime);
  replayed_.Add(step.step, d.regime);
  if (d.regime == controller::Regime::kProject) project_alpha_sum_ += d.alpha;
  if (step.regime == controller::Regime::kProject) recorded_project_alpha_sum_ += step.alpha;
  if (d.regime != step.regime) {
    ++differing_count_;
    if (differing_.size() < max_kept_) {
      differing_.push_back(DifferingStep{step.step, step.cosine, step.regime, d.regime, step.alpha, d.alpha});
    }
  }
  return d;
}

std::optional<double> Replayer::mean_project_alpha() const {
  const std::uint64_t n = replayed_.count(controller::Regime::kProject);
  if (n == 0) return std::nullopt;
  return project_alpha_sum_ / static_cast<double>(n);
}

std::optional<double> Replayer::mean_recorded_project_alpha() const {
  const std::uint64_t n = recorded_.count(controller::Regime::kProject);
  if (n == 0) return std::nullopt;
  return recorded_project_alpha_sum_ / static_cast<double>(n);
}

base::StatusOr<std::vector<controller::Thresholds>> ThresholdGrid(const std::vector<double>& c_lows,
                                                const std::vector<double>& c_highs) {
  for (const auto* list : {&c_lows, &c_highs}) {
    const char* name = list == &c_lows ? "--c-low" : "--c-high";
    if (list->empty()) return base::Status::InvalidArgument(std::string(name) + " needs at least one value");
    for (double v : *list) {
      if (!std::isfinite(v) || v <= 0.0 || v > 1.0) {
        return base::Status::InvalidArgument(std::string(name) + " value " + FormatExact(v) + " is outside (0, 1]");
      }
    }
  }
  std::vector<controller::Thresholds> pairs;
  for (double lo : c_lows) {
    for (double hi : c_highs) {
      if (lo < hi) pairs.push_back(controller::Thresholds{lo, hi});
    }
  }
  if (pairs.empty()) return base::Status::InvalidArgument("the grid has no pair with c_low < c_high");
  return pairs;
}

}  // namespace gac::cli
