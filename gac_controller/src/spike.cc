#include "gac/controller/spike.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "gac/controller/window.h"

namespace gac::controller {

namespace {

// z of x against the newest `window` values of [first, last), and the bound
// mean + sigma * sd, or absent with fewer than `warmup` of them.
template <typename It>
std::optional<SpikeScore> ZScore(double x, It first, It last, int window, int warmup, double sigma) {
  const auto held = std::distance(first, last);
  if (held > window) std::advance(first, held - window);
  const auto n = std::distance(first, last);
  if (n < warmup || n < 2) return std::nullopt;
  double mean = 0.0;
  for (It i = first; i != last; ++i) mean += *i;
  mean /= static_cast<double>(n);
  double ss = 0.0;
  for (It i = first; i != last; ++i) ss += (*i - mean) * (*i - mean);
  const double sd = std::sqrt(ss / static_cast<double>(n - 1));
  const double dev = x - mean;
  double z = sd > 0.0 ? dev / sd : (dev == 0.0 ? 0.0 : std::copysign(kMaxSpikeZ, dev));
  if (!std::isfinite(z)) z = std::copysign(kMaxSpikeZ, dev);
  SpikeScore out{std::clamp(z, -kMaxSpikeZ, kMaxSpikeZ), std::nullopt};
  if (sd > 0.0 && std::isfinite(mean + sigma * sd)) out.bound = mean + sigma * sd;
  return out;
}

template <typename Seq>
SpikeVerdict Judge(const SpikeSettings& s, double grad_norm, std::optional<double> loss, const Seq& norms,
                   const Seq& losses) {
  SpikeVerdict v;
  if (s.max_grad_norm > 0.0 && grad_norm > s.max_grad_norm) v.spike = true;
  if (!s.zscore) return v;
  const int warmup = s.effective_warmup();
  v.grad_norm = ZScore(grad_norm, norms.begin(), norms.end(), s.window, warmup, s.sigma);
  if (v.grad_norm && v.grad_norm->z > s.sigma) v.spike = true;
  if (loss) {
    if (!std::isfinite(*loss)) {
      v.spike = true;
    } else {
      v.loss = ZScore(*loss, losses.begin(), losses.end(), s.window, warmup, s.sigma);
      if (v.loss && v.loss->z > s.sigma) v.spike = true;
    }
  }
  return v;
}

// One value's entry: see HistoryEntry.
std::optional<double> Entry(bool spike, double x, const std::optional<SpikeScore>& score) {
  if (!std::isfinite(x)) return std::nullopt;
  if (!spike) return x;
  if (!score) return std::nullopt;
  return score->bound ? std::min(x, *score->bound) : x;
}

void Push(std::deque<double>& d, double x, int window) {
  d.push_back(x);
  while (d.size() > static_cast<std::size_t>(window)) d.pop_front();
}

}  // namespace

int SpikeSettings::effective_warmup() const { return warmup > 0 ? warmup : std::max(2, window / 2); }

base::Status ValidateSpikeSettings(const SpikeSettings& s) {
  if (!std::isfinite(s.max_grad_norm) || s.max_grad_norm < 0.0) {
    return base::Status::InvalidArgument("max_grad_norm must be finite and >= 0 (0: no bound), got " +
                                         std::to_string(s.max_grad_norm));
  }
  if (s.window < 2 || s.window > kMaxSpikeWindow) {
    return base::Status::InvalidArgument("spike_window must be in [2, " + std::to_string(kMaxSpikeWindow) +
                                         "], got " + std::to_string(s.window));
  }
  if (!std::isfinite(s.sigma) || !(s.sigma > 0.0)) {
    return base::Status::InvalidArgument("spike_sigma must be finite and > 0, got " + std::to_string(s.sigma));
  }
  if (s.warmup != 0 && (s.warmup < 2 || s.warmup > s.window)) {
    return base::Status::InvalidArgument("spike_warmup must be in [2, spike_window=" + std::to_string(s.window) +
                                         "] (0: spike_window / 2), got " + std::to_string(s.warmup));
  }
  return base::Status::Ok();
}

HistoryValues HistoryEntry(const SpikeVerdict& verdict, bool spike, double grad_norm, std::optional<double> loss) {
  HistoryValues out;
  out.grad_norm = Entry(spike, grad_norm, verdict.grad_norm);
  if (loss) out.loss = Entry(spike, *loss, verdict.loss);
  return out;
}

SpikeVerdict JudgeSpike(const SpikeSettings& settings, double grad_norm, std::optional<double> loss,
                        const std::vector<double>& norms, const std::vector<double>& losses) {
  return Judge(settings, grad_norm, loss, norms, losses);
}

Decision SpikeDecision(const AlignmentStats& stats, const SpikeVerdict& verdict,
                       std::optional<double> window_mean) {
  Decision d;
  d.regime = Regime::kSpike;
  d.apply_update = false;
  d.grad_norm = std::sqrt(stats.grad_sq);
  d.ref_norm = std::sqrt(stats.ref_sq);
  d.cosine = StepCosine(stats);
  d.window_mean = window_mean;
  d.spike_verdict = verdict;
  return d;
}

SpikeVerdict SpikeGuard::Judge(double grad_norm, std::optional<double> loss) const {
  return controller::Judge(settings_, grad_norm, loss, norms_, losses_);
}

void SpikeGuard::Record(const SpikeVerdict& verdict, bool spike, double grad_norm, std::optional<double> loss) {
  const HistoryValues entry = HistoryEntry(verdict, spike, grad_norm, loss);
  if (entry.grad_norm) Push(norms_, *entry.grad_norm, settings_.window);
  if (entry.loss) Push(losses_, *entry.loss, settings_.window);
}

SpikeVerdict SpikeGuard::Step(double grad_norm, std::optional<double> loss) {
  SpikeVerdict v = Judge(grad_norm, loss);
  Record(v, v.spike, grad_norm, loss);
  return v;
}

void SpikeGuard::Clear() {
  norms_.clear();
  losses_.clear();
}

}  // namespace gac::controller
