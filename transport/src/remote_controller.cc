#include "gac/transport/remote_controller.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "gac/base/mutex.h"

#include "gac/proto/convert.h"
#include "gac/proto/step_window.h"
#include "gac/transport/channel.h"
#include "gac/v1/control.grpc.pb.h"

namespace gac::transport {

struct RemoteController::Impl {
  RemoteControllerOptions options;
  // One per gacd address (replicas sharing a store).
  struct Replica {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ControlService::Stub> stub;
    std::unique_ptr<v1::AdminService::Stub> admin;
  };
  std::vector<Replica> replicas;
  std::atomic<std::size_t> preferred{0};  // the replica that answered last

  // The run's previous valid cosines, newest last (at most kMaxWindow), and
  // the run's window as gacd last said.
  base::Mutex window_mu;
  std::deque<double> recent GAC_GUARDED_BY(window_mu);
  int window GAC_GUARDED_BY(window_mu) = controller::TriggerSettings{}.window;
  // The spike guard's history: the |g| and losses of the run's valid
  // steps, spikes clamped to the bound they broke (controller::HistoryEntry),
  // newest last (at most kMaxSpikeWindow), and how many of them gacd's guard
  // reads (0 while the run has no z-score, as gacd last said).
  std::deque<double> norms GAC_GUARDED_BY(window_mu);
  std::deque<double> losses GAC_GUARDED_BY(window_mu);
  int spike_window GAC_GUARDED_BY(window_mu) = 0;

  // Consecutive calls that reached no replica in time (UNAVAILABLE,
  // DEADLINE_EXCEEDED), and until when Decide asks no one after two of them.
  base::Mutex miss_mu;
  int misses GAC_GUARDED_BY(miss_mu) = 0;
  bool last_miss_deadline GAC_GUARDED_BY(miss_mu) = false;
  std::chrono::steady_clock::time_point hold_until GAC_GUARDED_BY(miss_mu);

  // How long Decide answers UNAVAILABLE without asking after two misses: the
  // training thread then waits at most one deadline in 20 on gacd.
  std::chrono::milliseconds HoldOff() const { return std::max<std::chrono::milliseconds>(std::chrono::seconds(1), 20 * options.deadline); }

  // Why Decide should not ask now, or "" when it should: two misses in a
  // row, the hold-off not over, and no replica connected since a refused
  // connection (a replica that came back is asked at once; one that let the
  // deadline pass, stalled or cut off behind a live connection, is not).
  std::string HeldOff() {
    int n;
    bool deadline;
    std::chrono::steady_clock::time_point until;
    {
      base::MutexLock lock(&miss_mu);
      n = misses;
      deadline = last_miss_deadline;
      until = hold_until;
    }
    if (n < 2 || std::chrono::steady_clock::now() >= until) return "";
    if (!deadline) {
      const auto connected = [this] {
        return std::any_of(replicas.begin(), replicas.end(),
                           [](Replica& r) { return r.channel->GetState(true) == GRPC_CHANNEL_READY; });
      };
      if (connected()) return "";
      PollForAMoment(preferred.load(std::memory_order_relaxed));
      if (connected()) return "";
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    return "gacd Decide not asked: " + std::to_string(n) + " calls in a row reached no gacd replica (" +
           (deadline ? "deadline exceeded" : "unavailable") + "); asking again in " +
           std::to_string(std::max<std::int64_t>(left.count(), 0)) + " ms";
  }

  // A channel whose calls fail fast, or are not made, is polled by no
  // thread, and its reconnection attempts cannot complete: poll replica k's
  // for a moment, so that a replica that came back is found.
  void PollForAMoment(std::size_t k) {
    replicas[k].channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
  }

  void CountCall(const grpc::Status& st) {
    base::MutexLock lock(&miss_mu);
    const bool deadline = st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!deadline && st.error_code() != grpc::StatusCode::UNAVAILABLE) {
      misses = 0;
      return;
    }
    ++misses;
    last_miss_deadline = deadline;
    if (misses >= 2) hold_until = std::chrono::steady_clock::now() + HoldOff();
  }

  // Sends a settings change of this run (the settings `req` gives) with its
  // reason, waiting up to 10 s.
  base::Status SetRunConfig(v1::SetRunConfigRequest req, const std::string& reason) {
    req.set_run(options.run);
    req.set_reason(reason);
    v1::RunConfig cfg;
    const grpc::Status st = WithFailover(
        std::chrono::system_clock::now() + std::chrono::seconds(10),
        [&](Replica& r, grpc::ClientContext* ctx) { return r.admin->SetRunConfig(ctx, req, &cfg); });
    return proto::FromGrpcStatus(st, "gacd SetRunConfig");
  }


  // Calls `call(replica, ctx)` on the replicas in turn, connected ones
  // first from the preferred one on, while the answer is UNAVAILABLE (down,
  // draining) and `deadline` has not passed; the one that answers becomes
  // preferred. A replica that missed the deadline is asked last next time.
  template <typename Call>
  grpc::Status WithFailover(std::chrono::system_clock::time_point deadline, const Call& call) {
    const std::size_t first = preferred.load(std::memory_order_relaxed);
    std::vector<std::size_t> order, later;
    for (std::size_t i = 0; i < replicas.size(); ++i) {
      const std::size_t k = (first + i) % replicas.size();
      // GetState(true) also starts connecting an idle channel.
      (replicas[k].channel->GetState(true) == GRPC_CHANNEL_READY ? order : later).push_back(k);
    }
    const bool none_connected = order.empty();
    order.insert(order.end(), later.begin(), later.end());
    if (none_connected) PollForAMoment(order.front());
    grpc::Status st;
    for (std::size_t k : order) {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      if (!options.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options.token);
      st = call(replicas[k], &ctx);
      if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && replicas.size() > 1) {
        preferred.store((k + 1) % replicas.size(), std::memory_order_relaxed);
        return st;
      }
      if (st.error_code() != grpc::StatusCode::UNAVAILABLE) {
        if (k != first) preferred.store(k, std::memory_order_relaxed);
        return st;
      }
      if (std::chrono::system_clock::now() >= deadline) break;
    }
    return st;
  }
};

RemoteController::RemoteController(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteController::~RemoteController() = default;

base::StatusOr<std::unique_ptr<RemoteController>> RemoteController::Create(const RemoteControllerOptions& options) {
  base::StatusOr<std::vector<std::string>> addresses = SplitGacdAddresses(options.address);
  if (!addresses.ok()) return addresses.status().WithPrefix("remote controller");
  if (options.run.empty()) return base::Status::InvalidArgument("remote controller run id is empty");
  if (options.deadline.count() <= 0) return base::Status::InvalidArgument("remote controller deadline must be > 0");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  for (const std::string& address : *addresses) {
    Impl::Replica& r = impl->replicas.emplace_back();
    r.channel = MakeGacdChannel(
        address, ChannelTls{options.tls_root_certs, options.tls_cert_chain, options.tls_private_key},
        std::chrono::milliseconds(1000));
    r.stub = v1::ControlService::NewStub(r.channel);
    r.admin = v1::AdminService::NewStub(r.channel);
  }
  return std::unique_ptr<RemoteController>(new RemoteController(std::move(impl)));
}

base::StatusOr<controller::Decision> RemoteController::Decide(std::int64_t step, const controller::AlignmentStats& stats) {
  const RemoteControllerOptions& o = impl_->options;
  std::vector<double> recent, norms, losses;
  {
    base::MutexLock lock(&impl_->window_mu);
    const auto newest = [](const std::deque<double>& d, int n) {
      const std::size_t keep = std::min(d.size(), static_cast<std::size_t>(n));
      return std::vector<double>(d.end() - static_cast<std::ptrdiff_t>(keep), d.end());
    };
    recent = newest(impl_->recent, impl_->window);
    norms = newest(impl_->norms, impl_->spike_window);
    losses = newest(impl_->losses, impl_->spike_window);
  }
  const v1::DecideRequest req = proto::ToDecideRequest(o.run, o.rank, step, stats, recent, norms, losses);
  v1::DecideResponse resp;
  const std::string held_off = impl_->HeldOff();
  grpc::Status st;
  if (held_off.empty()) {
    st = impl_->WithFailover(std::chrono::system_clock::now() + o.deadline,
                             [&](Impl::Replica& r, grpc::ClientContext* ctx) { return r.stub->Decide(ctx, req, &resp); });
    impl_->CountCall(st);
  }
  {
    // A spike enters GAC's window not at all and the guard's history as
    // HistoryEntry says, judged again here with the settings gacd decided
    // with on the history it was sent; a step gacd did not answer counts as
    // let through (the agent's own fallback decides it).
    const bool answered = st.ok() && held_off.empty();
    const bool spike = answered && resp.regime() == v1::REGIME_SPIKE;
    std::optional<controller::SpikeSettings> guard;  // the run's guard, as gacd answered
    if (answered) {
      base::StatusOr<controller::SpikeSettings> g = proto::SpikeFromProto(resp.config().spike());
      if (g.ok()) guard = *g;
    }
    const double norm = std::sqrt(stats.grad_sq);
    controller::SpikeVerdict verdict;
    if (spike && guard) verdict = controller::JudgeSpike(*guard, norm, stats.loss, norms, losses);
    const std::optional<double> cosine = controller::StepCosine(stats);
    const auto push = [](std::deque<double>& d, double x, int cap) {
      d.push_back(x);
      if (d.size() > static_cast<std::size_t>(cap)) d.pop_front();
    };
    base::MutexLock lock(&impl_->window_mu);
    if (cosine && !spike) push(impl_->recent, *cosine, controller::kMaxWindow);
    if (!controller::StatsInvalid(stats)) {
      const controller::HistoryValues entry = controller::HistoryEntry(verdict, spike, norm, stats.loss);
      if (entry.grad_norm) push(impl_->norms, *entry.grad_norm, controller::kMaxSpikeWindow);
      if (entry.loss) push(impl_->losses, *entry.loss, controller::kMaxSpikeWindow);
    }
    if (answered) {
      impl_->window = proto::ListingWindow(resp.config());
      impl_->spike_window = guard && guard->zscore ? guard->window : 0;
    }
  }
  if (!held_off.empty()) return base::Status::Unavailable(held_off);
  if (!st.ok()) return proto::FromGrpcStatus(st, "gacd Decide");
  base::StatusOr<controller::Decision> decision = proto::DecodeDecideResponse(req, resp);
  if (!decision.ok()) return decision.status().WithPrefix("gacd Decide answered nonsense");
  return decision;
}

base::Status RemoteController::SetThresholds(const controller::Thresholds& thresholds, controller::AlphaMode alpha_mode, const std::string& reason,
                                       std::optional<controller::Mode> mode) {
  v1::SetRunConfigRequest req;
  *req.mutable_thresholds() = proto::ToProto(thresholds, alpha_mode);
  if (mode) req.set_mode(proto::ToProto(*mode));  // UNSPECIFIED: gacd keeps the run's mode
  return impl_->SetRunConfig(req, reason);
}

base::Status RemoteController::SetTrigger(const controller::TriggerSettings& trigger, controller::AlphaMode alpha_mode,
                                          const std::string& reason) {
  GAC_RETURN_IF_ERROR(controller::ValidateTriggerSettings(trigger));
  v1::SetRunConfigRequest req;
  req.set_trigger(proto::ToProto(trigger.trigger));
  req.set_window(static_cast<std::uint32_t>(trigger.window));
  *req.mutable_window_thresholds() = proto::ToProto(trigger.window_thresholds, alpha_mode);
  return impl_->SetRunConfig(req, reason);
}

base::Status RemoteController::SetSpikeGuard(const controller::SpikeSettings& spike, const std::string& reason) {
  GAC_RETURN_IF_ERROR(controller::ValidateSpikeSettings(spike));
  v1::SetRunConfigRequest req;
  *req.mutable_spike() = proto::ToProto(spike);
  return impl_->SetRunConfig(req, reason);
}

base::Status RemoteController::SetRunThresholds(const controller::Thresholds& thresholds, controller::AlphaMode alpha_mode,
                                          const std::string& reason) {
  return SetThresholds(thresholds, alpha_mode, reason, controller::Mode::kRemote);
}

}  // namespace gac::transport
