#include "gac/controller/window.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace gac::controller {

const char* TriggerName(Trigger t) { return t == Trigger::kWindow ? "window" : "per_step"; }

base::StatusOr<Trigger> ParseTrigger(const char* name) {
  for (Trigger t : {Trigger::kPerStep, Trigger::kWindow}) {
    if (name != nullptr && std::strcmp(name, TriggerName(t)) == 0) return t;
  }
  return base::Status::InvalidArgument(std::string("unknown trigger '") + (name ? name : "") +
                                       "' (expected per_step or window)");
}

base::Status ValidateWindow(int window) {
  if (window < 1 || window > kMaxWindow) {
    return base::Status::InvalidArgument("window must be in [1, " + std::to_string(kMaxWindow) + "], got " +
                                         std::to_string(window));
  }
  return base::Status::Ok();
}

std::optional<double> StepCosine(const AlignmentStats& s) {
  if (StatsInvalid(s) || !s.has_reference || s.ref_sq == 0.0) return std::nullopt;
  // As Controller::Decide: |g|*|p|, not sqrt(grad_sq*ref_sq), which can overflow.
  return s.dot / (std::sqrt(s.grad_sq) * std::sqrt(s.ref_sq) + kCosineEpsilon);
}

AlignmentWindow::AlignmentWindow(int size) : ring_(static_cast<std::size_t>(size < 1 ? 1 : size), 0.0) {}

void AlignmentWindow::Add(double cosine) {
  if (!std::isfinite(cosine)) return;
  const int n = size();
  if (held_ < n) {
    ring_[static_cast<std::size_t>((begin_ + held_) % n)] = cosine;
    ++held_;
  } else {
    ring_[static_cast<std::size_t>(begin_)] = cosine;
    begin_ = (begin_ + 1) % n;
  }
  Recompute();
}

void AlignmentWindow::Clear() {
  begin_ = 0;
  held_ = 0;
  mean_ = 0.0;
}

void AlignmentWindow::Resize(int size) {
  if (size < 1) size = 1;
  std::vector<double> kept = values();
  if (static_cast<int>(kept.size()) > size) kept.erase(kept.begin(), kept.end() - size);
  held_ = static_cast<int>(kept.size());
  kept.resize(static_cast<std::size_t>(size), 0.0);
  ring_ = std::move(kept);
  begin_ = 0;
  Recompute();
}

std::vector<double> AlignmentWindow::values() const {
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(held_));
  for (int i = 0; i < held_; ++i) out.push_back(ring_[static_cast<std::size_t>((begin_ + i) % size())]);
  return out;
}

// From the values held, oldest first, in long double: a running sum would
// carry the rounding of every value ever added and removed.
void AlignmentWindow::Recompute() {
  if (held_ == 0) {
    mean_ = 0.0;
    return;
  }
  long double sum = 0.0L;
  for (int i = 0; i < held_; ++i) sum += ring_[static_cast<std::size_t>((begin_ + i) % size())];
  mean_ = static_cast<double>(sum / held_);
}

Decision DecideOnMean(const Controller& controller, const AlignmentStats& s, std::optional<double> mean) {
  Decision d = controller.DecideOn(s, mean);
  d.window_mean = mean;
  return d;
}

base::Status ValidateTriggerSettings(const TriggerSettings& s) {
  if (s.trigger != Trigger::kPerStep && s.trigger != Trigger::kWindow) {
    return base::Status::InvalidArgument("unknown trigger " + std::to_string(static_cast<int>(s.trigger)));
  }
  GAC_RETURN_IF_ERROR(ValidateWindow(s.window));
  base::Status t = ValidateThresholds(s.window_thresholds);
  if (!t.ok()) return base::Status::InvalidArgument("window thresholds: " + t.message());
  return base::Status::Ok();
}

base::StatusOr<TriggeredController> TriggeredController::Create(Thresholds per_step, AlphaMode mode,
                                                                TriggerSettings trigger) {
  GAC_ASSIGN_OR_RETURN(Controller step_controller, Controller::Create(per_step, mode));
  GAC_RETURN_IF_ERROR(ValidateTriggerSettings(trigger));
  GAC_ASSIGN_OR_RETURN(Controller window_controller, Controller::Create(trigger.window_thresholds, mode));
  return TriggeredController(step_controller, window_controller, trigger);
}

TriggeredController::TriggeredController(Controller per_step, Controller windowed, TriggerSettings trigger)
    : per_step_(per_step), windowed_(windowed), trigger_(trigger), window_(trigger.window) {}

Decision TriggeredController::Decide(const AlignmentStats& stats) {
  if (const std::optional<double> c = StepCosine(stats)) window_.Add(*c);
  if (trigger_.trigger == Trigger::kWindow) return DecideOnMean(windowed_, stats, window_.mean());
  Decision d = per_step_.Decide(stats);
  d.window_mean = window_.mean();
  return d;
}

}  // namespace gac::controller
