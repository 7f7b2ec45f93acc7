// A deterministic synthetic GRPO-style run for the dashboard tests and the
// panel pictures (dashboards/render_panels.py): step records as an agent
// would send them, with the regime, alpha and cosine after projection decided
// by gac::controller from statistics that have the wanted cosine.
//
// Profile of c_t: noise around 0.015 (quiet, always below c_low), and with a
// spike configured: a ramp from step spike_start over spike_ramp steps up to
// spike_peak (through the projection band into skip), a hold for spike_hold
// steps, then (recover) a ramp back down. The gradient norm grows with the
// alignment; the reward rises slowly and dips while the run is spiking.
//
// With `policy`, the records carry the trainer's policy-health signals
// (fields 26-41) of a learner that drifts from its sampler as the run
// spikes: at the peak the token ESS has fallen from about 0.92 to 0.22, the
// clipped fraction risen from 0.05 to 0.35 and the k3 KL from 0.002 to 0.032
// nats. They are drawn from a generator of their own, so a run's cosines are
// the same with and without them.

#ifndef GAC_TESTS_DASHBOARDS_SYNTHETIC_RUN_H_
#define GAC_TESTS_DASHBOARDS_SYNTHETIC_RUN_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gac/controller/controller.h"
#include "gac/proto/convert.h"
#include "gac/server/store.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/telemetry.pb.h"
#include "server/src/validate.h"

namespace gac::testing {

struct SyntheticRunOptions {
  std::string run = "synthetic";
  std::uint32_t world = 2;          // ranks; each reports every step (same all-reduced statistics)
  std::uint64_t seed = 1;
  controller::Thresholds thresholds;            // c_low 0.05, c_high 0.3
  bool spike = false;
  std::int64_t spike_start = 100;
  std::int64_t spike_ramp = 40;     // steps from the baseline to the peak (and back)
  std::int64_t spike_hold = 60;     // steps at the peak
  double spike_peak = 0.55;
  bool recover = true;              // ramp back down after the hold (else stay at the peak)
  int layers = 8;                   // per-layer rows per record; 0 = none
  bool remote = false;              // mode REMOTE: the caller asks gacd (Decide) and passes the answer
  int fallback_every = 0;           // remote: every Nth step the local decision is used (0 = never)
  bool report_rule = false;         // steps decided here carry `thresholds` as the agent's rule
  // The agent's spike guard: from step 10 the records carry its z-scores,
  // and this step (>= 0) is a spike it skipped (regime spike); -1: no guard.
  std::int64_t guard_spike_step = -1;
  bool policy = false;              // the policy-health signals (see above)
};

class SyntheticRun {
 public:
  explicit SyntheticRun(SyntheticRunOptions o)
      : o_(std::move(o)),
        controller_(*controller::Controller::Create(o_.thresholds)),
        rng_(o_.seed),
        policy_rng_(o_.seed ^ 0x9e3779b97f4a7c15ULL) {}

  const SyntheticRunOptions& options() const { return o_; }
  std::int64_t next_step() const { return step_; }

  // The target cosine of `step` (before noise).
  double BaseCosine(std::int64_t step) const {
    const double base = 0.015;
    if (!o_.spike || step < o_.spike_start) return base;
    const double ramp = static_cast<double>(std::max<std::int64_t>(o_.spike_ramp, 1));
    std::int64_t t = step - o_.spike_start;
    if (t < o_.spike_ramp) return base + (o_.spike_peak - base) * static_cast<double>(t) / ramp;
    t -= o_.spike_ramp;
    if (t < o_.spike_hold || !o_.recover) return o_.spike_peak;
    t -= o_.spike_hold;
    if (t < o_.spike_ramp) return o_.spike_peak - (o_.spike_peak - base) * static_cast<double>(t) / ramp;
    return base;
  }

  // How far the learner has drifted from its sampler at `step`, in [0, 1]:
  // 0 while quiet, 1 at the spike's peak.
  double Drift(std::int64_t step) const {
    const double base = BaseCosine(0);
    if (!o_.spike || o_.spike_peak <= base) return 0.0;
    return std::clamp((BaseCosine(step) - base) / (o_.spike_peak - base), 0.0, 1.0);
  }

  // Statistics of the next step, for a Decide request in remote mode.
  v1::DecideRequest NextDecideRequest() {
    Prepare();
    v1::DecideRequest req;
    req.set_run(o_.run);
    req.set_rank(0);
    req.set_step(step_);
    req.set_dot(stats_.dot);
    req.set_grad_sq(stats_.grad_sq);
    req.set_ref_sq(stats_.ref_sq);
    req.set_has_reference(stats_.has_reference);
    return req;
  }

  // The records of the next step, one per rank. `remote` is the answer of
  // gacd's Decide to NextDecideRequest() (remote mode; nullptr: decide
  // locally, counted as a fallback in remote mode).
  std::vector<v1::StepRecord> NextStep(const v1::DecideResponse* remote = nullptr,
                                       std::chrono::system_clock::time_point now = std::chrono::system_clock::now()) {
    Prepare();
    const bool forced_fallback = o_.remote && o_.fallback_every > 0 && step_ > 0 && step_ % o_.fallback_every == 0;
    const controller::Decision local = controller_.Decide(stats_);
    const bool use_remote = o_.remote && remote != nullptr && !forced_fallback;

    v1::StepRecord r;
    r.set_run(o_.run);
    r.set_world_size(o_.world);
    r.set_step(step_);
    r.set_grad_norm(std::sqrt(stats_.grad_sq));
    r.set_ref_norm(std::sqrt(stats_.ref_sq));
    if (use_remote) {
      r.set_regime(remote->regime());
      if (remote->has_cosine()) r.set_cosine(Clamp1(remote->cosine()));
      if (remote->has_cosine_after()) r.set_cosine_after(Clamp1(remote->cosine_after()));
      r.set_alpha(remote->alpha());
    } else {
      r.set_regime(proto::ToProto(local.regime));
      if (local.cosine) r.set_cosine(Clamp1(*local.cosine));
      if (local.cosine_after) r.set_cosine_after(Clamp1(*local.cosine_after));
      r.set_alpha(local.alpha);
    }
    r.set_mode(o_.remote ? v1::CONTROL_MODE_REMOTE : v1::CONTROL_MODE_LOCAL);
    r.set_fallback(o_.remote && !use_remote);
    if (o_.report_rule && !use_remote) {
      r.set_c_low(o_.thresholds.c_low);
      r.set_c_high(o_.thresholds.c_high);
      r.set_trigger(v1::TRIGGER_PER_STEP);
      r.set_window(20);
      r.set_window_c_low(o_.thresholds.c_low);
      r.set_window_c_high(o_.thresholds.c_high);
    }
    if (o_.guard_spike_step >= 0 && step_ >= 10) {
      const bool spike = step_ == o_.guard_spike_step;
      r.set_grad_norm_z(spike ? 40.0 : Normal());
      r.set_loss_z(spike ? 3.0 : Normal());
      if (spike) {
        r.set_regime(v1::REGIME_SPIKE);
        r.set_alpha(1.0);
        r.clear_cosine_after();
      }
    }
    r.set_staleness(2 + step_ % 3);
    if (o_.policy) SetPolicySignals(&r);
    r.set_wall_time_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count());

    // Trainer scalars: reward climbs, dips while the gradients are aligned.
    const double progress = 1.0 - std::exp(-static_cast<double>(step_) / 400.0);
    const double excess = std::max(0.0, BaseCosine(step_) - o_.thresholds.c_low);
    dip_ = 0.9 * dip_ + 0.1 * excess;
    const double reward = 0.15 + 0.6 * progress - 0.8 * dip_ + 0.03 * Normal();
    (*r.mutable_scalars())["reward"] = reward;
    (*r.mutable_scalars())["loss"] = 1.2 - 0.7 * progress + 0.5 * dip_ + 0.02 * Normal();
    (*r.mutable_scalars())["kl"] = 0.01 + 0.02 * progress + 0.2 * dip_ + 0.002 * std::abs(Normal());
    (*r.mutable_scalars())["entropy"] = 2.0 - 0.8 * progress - 1.0 * dip_ + 0.02 * Normal();

    if (o_.layers > 0 && r.has_cosine()) {
      const double c = r.cosine();
      for (int i = 0; i < o_.layers; ++i) {
        v1::LayerRecord* l = r.add_layers();
        l->set_name("layers." + std::to_string(i / 2) + (i % 2 == 0 ? ".attn" : ".mlp"));
        // Later layers carry more of the alignment.
        const double weight = 0.4 + 1.2 * static_cast<double>(i) / std::max(o_.layers - 1, 1);
        l->set_cosine(Clamp1(c * weight + 0.02 * Normal()));
        l->set_grad_norm(r.grad_norm() / std::sqrt(static_cast<double>(o_.layers)) * (0.5 + weight / 2));
        l->set_ref_norm(r.ref_norm() / std::sqrt(static_cast<double>(o_.layers)) * (0.5 + weight / 2));
      }
    }

    std::vector<v1::StepRecord> out;
    for (std::uint32_t rank = 0; rank < o_.world; ++rank) {
      v1::StepRecord copy = r;
      copy.set_rank(rank);
      copy.set_agent_overhead_seconds(20e-6 + 5e-6 * rank + 2e-6 * std::abs(Normal()));
      out.push_back(std::move(copy));
    }
    prev_gg_ = stats_.grad_sq;
    prepared_ = false;
    ++step_;
    return out;
  }

 private:
  static double Clamp1(double x) { return std::clamp(x, -1.0, 1.0); }


  double Normal() { return normal_(rng_); }
  double PolicyNoise() { return policy_normal_(policy_rng_); }

  // The policy-health signals of step_ (fields 26-41), consistent with one
  // another: p1 <= p99 <= max, min <= mean <= max staleness, fractions and
  // ESS in [0, 1].
  void SetPolicySignals(v1::StepRecord* r) {
    const double d = Drift(step_);
    auto unit = [](double x) { return std::clamp(x, 0.0, 1.0); };
    r->set_policy_tokens(4000 + 16 * (step_ % 7));
    r->set_ess_token(std::clamp(0.92 - 0.7 * d + 0.01 * PolicyNoise(), 0.02, 1.0));
    r->set_ess_sequence(std::clamp(0.8 - 0.7 * d + 0.015 * PolicyNoise(), 0.01, 1.0));
    r->set_clip_fraction_low(unit(0.02 + 0.12 * d + 0.003 * PolicyNoise()));
    r->set_clip_fraction_high(unit(0.03 + 0.18 * d + 0.003 * PolicyNoise()));
    r->set_truncation_fraction(unit(0.002 + 0.05 * d + 0.001 * PolicyNoise()));
    const double p99 = 0.15 + 0.8 * d + 0.01 * PolicyNoise();
    r->set_log_ratio_p99(p99);
    r->set_log_ratio_p1(-(0.15 + 0.6 * d) + 0.01 * PolicyNoise());
    r->set_log_ratio_max(p99 + 0.3 + 1.5 * d + 0.05 * std::abs(PolicyNoise()));
    r->set_kl_k3(std::max(0.0, 0.002 * (1.0 + 0.05 * PolicyNoise()) + 0.03 * d * d));
    r->set_log_ratio_abs_mean(0.05 + 0.2 * d + 0.002 * std::abs(PolicyNoise()));
    r->set_entropy_mean(std::max(0.0, 1.1 - 0.5 * d + 0.01 * PolicyNoise()));
    r->set_staleness_min(2.0 * d);
    r->set_staleness_mean(1.5 + 3.0 * d);
    r->set_staleness_max(3.0 + 4.0 * d);
    r->set_policy_invalid(false);  // present with the signals, as an agent sends them
  }

  // Draws the statistics of step_ once (NextDecideRequest and NextStep see the same).
  void Prepare() {
    if (prepared_) return;
    prepared_ = true;
    double c = BaseCosine(step_);
    const bool quiet = c <= 0.015 + 1e-12;
    c += (quiet ? 0.012 : 0.03) * Normal();
    if (quiet) c = std::clamp(c, -0.045, 0.045);  // a quiet stretch never leaves the safe band
    c = Clamp1(c);
    const double g = (1.0 + 0.05 * Normal()) * (1.0 + 2.0 * std::max(0.0, BaseCosine(step_) - 0.015));
    stats_.grad_sq = g * g;
    stats_.ref_sq = prev_gg_;
    stats_.has_reference = step_ > 0;
    stats_.dot = stats_.has_reference ? c * std::sqrt(stats_.grad_sq * stats_.ref_sq) : 0.0;
  }

  SyntheticRunOptions o_;
  controller::Controller controller_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0.0, 1.0};
  // The policy signals' noise, apart from the rest (see the file comment).
  std::mt19937_64 policy_rng_;
  std::normal_distribution<double> policy_normal_{0.0, 1.0};
  std::int64_t step_ = 0;
  bool prepared_ = false;
  controller::AlignmentStats stats_;
  double prev_gg_ = 0.0;
  double dip_ = 0.0;
};

// Writes `steps` steps of a synthetic run straight into `store`, without a
// gacd, `batch` steps per transaction: for runs too long to stream in a
// test's time (the page's and the HTTP benchmark's 100,000-step run).
inline base::Status StoreSyntheticRun(server::Store& store, const SyntheticRunOptions& options, std::int64_t steps,
                                std::int64_t batch = 500) {
  SyntheticRun run(options);
  std::uint64_t sequence = 0;
  while (run.next_step() < steps) {
    v1::IngestRequest request;
    request.set_sequence(++sequence);
    for (std::int64_t i = 0; i < batch && run.next_step() < steps; ++i) {
      for (auto& r : run.NextStep()) *request.add_records() = std::move(r);
    }
    server::WriteOp op;
    op.steps = &request;
    op.received_ns = request.records(request.records_size() - 1).wall_time_ns();
    std::vector<server::WriteOp> ops{op};
    GAC_RETURN_IF_ERROR(store.Apply(&ops));
  }
  return base::Status::Ok();
}

}  // namespace gac::testing

#endif  // GAC_TESTS_DASHBOARDS_SYNTHETIC_RUN_H_
