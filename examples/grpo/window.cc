#include "examples/grpo/window.h"

#include <cmath>
#include <stdexcept>

namespace gac::grpo {

SignedWindow::SignedWindow(int size) : values_(static_cast<std::size_t>(size < 1 ? 1 : size), 0.0) {}

void SignedWindow::Add(double value) {
  if (count_ >= values_.size()) sum_ -= values_[next_];
  values_[next_] = value;
  sum_ += value;
  next_ = (next_ + 1) % values_.size();
  ++count_;
}

std::optional<double> SignedWindow::mean() const {
  const std::size_t held = count_ < values_.size() ? count_ : values_.size();
  if (held == 0) return std::nullopt;
  return sum_ / static_cast<double>(held);
}

namespace {

controller::Controller MakeController(controller::Thresholds thresholds, controller::AlphaMode mode) {
  auto c = controller::Controller::Create(thresholds, mode);
  if (!c.ok()) throw std::invalid_argument(c.status().ToString());
  return *c;
}

}  // namespace

WindowedDecisionSource::WindowedDecisionSource(controller::Thresholds thresholds, controller::AlphaMode mode, int window)
    : controller_(MakeController(thresholds, mode)), window_(window) {}

base::StatusOr<controller::Decision> WindowedDecisionSource::Decide(std::int64_t /*step*/, const controller::AlignmentStats& stats) {
  controller::Decision d = controller_.Decide(stats);
  if (!d.cosine || d.regime == controller::Regime::kInvalid) return d;  // no reference, or non-finite statistics
  window_.Add(*d.cosine);
  last_mean_ = window_.full() ? window_.mean() : std::nullopt;
  // Start from "safe" and decide on |m|.
  d.regime = controller::Regime::kSafe;
  d.alpha = 1.0;
  d.projection_coeff = 0.0;
  d.cosine_after = d.cosine;
  d.apply_update = true;
  if (!last_mean_) return d;
  const double m = std::fabs(*last_mean_);
  const controller::Thresholds& t = controller_.thresholds();
  if (m >= t.c_high) {
    d.regime = controller::Regime::kSkip;
    d.apply_update = false;
    d.cosine_after.reset();
  } else if (m > t.c_low) {
    d.regime = controller::Regime::kProject;
    d.alpha = controller_.Alpha(m);
    d.projection_coeff = (1.0 - d.alpha) * stats.dot / stats.ref_sq;
    d.cosine_after = controller::CosineAfterProjection(*d.cosine, d.alpha);
  }
  return d;
}

}  // namespace gac::grpo
