// gacd as the agent's decision source in remote mode (gac::transport).
//
// Decide() sends the step's three statistics to gacd's ControlService and
// waits at most `deadline` for the answer; a miss, an outage or a rejection
// is an error, on which the agent falls back to its local decision and
// counts the fallback. gRPC's fail-fast default applies: while gacd is
// unreachable, calls fail at once instead of waiting for the deadline. Where
// a call cannot fail fast (packets dropped: a connection that hangs, a stalled
// gacd), two misses in a row (UNAVAILABLE or DEADLINE_EXCEEDED) make Decide
// answer UNAVAILABLE without asking for max(1 s, 20 deadlines), so that the
// training thread waits on an unreachable gacd at most one deadline in 20;
// a replica that reconnects after refusing ends that hold-off at once. An
// answer that no controller would give, or one for another run or step
// (gac/proto/convert.h: DecodeDecideResponse), is an error too: a broken or
// hostile gacd cannot change the update.
//
// With several gacd replicas sharing one store (`address` a comma-separated
// list), a call that a replica answers with UNAVAILABLE (down, draining) is
// sent to the next within the same deadline, and the replica that answers is
// asked first from then on. A DNS name that resolves to several replicas
// works as well (channel.h).
//
// The windowed trigger's window lives here, not in gacd: each call sends the
// run's previous valid cosines (the newest W, W the run's window as the
// last answer gave it, 20 until then), and the cosine of every step with
// finite statistics and a reference enters it, answered or not. gacd keeps
// nothing about a run's steps, so every replica gives the same answer to the
// same request, and the ranks of a sharded run (whose statistics are
// all-reduced) send the same window.
//
// Thread safety: Decide may be called from any thread.

#ifndef GAC_TRANSPORT_REMOTE_CONTROLLER_H_
#define GAC_TRANSPORT_REMOTE_CONTROLLER_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "gac/controller/decision_source.h"
#include "gac/controller/spike.h"
#include "gac/controller/window.h"

namespace gac::transport {

struct RemoteControllerOptions {
  std::string address;                     // gacd host:port, or a comma-separated list of replicas
  std::string token;                       // bearer token with write rights on the run
  std::string tls_root_certs;              // PEM roots; "" = plaintext
  std::string tls_cert_chain, tls_private_key;  // PEM client certificate and key (mTLS); "" = none
  std::string run;                         // run id
  std::uint32_t rank = 0;
  std::chrono::milliseconds deadline{50};  // per Decide
};

class RemoteController final : public controller::DecisionSource {
 public:
  static base::StatusOr<std::unique_ptr<RemoteController>> Create(const RemoteControllerOptions& options);
  ~RemoteController() override;

  base::StatusOr<controller::Decision> Decide(std::int64_t step, const controller::AlignmentStats& stats) override;

  // Sets the run's thresholds on gacd through the admin API (the token needs
  // admin rights on the run); `reason` goes to gacd's audit log. The run
  // keeps its mode unless `mode` is given. Waits up to 10 s.
  base::Status SetThresholds(const controller::Thresholds& thresholds, controller::AlphaMode alpha_mode, const std::string& reason,
                       std::optional<controller::Mode> mode = std::nullopt);
  // Sets the run's trigger, window and window thresholds on gacd (admin
  // rights; the rest of the run's settings are kept). Waits up to 10 s.
  base::Status SetTrigger(const controller::TriggerSettings& trigger, controller::AlphaMode alpha_mode,
                          const std::string& reason);
  // Replaces the run's spike guard on gacd whole (admin rights; the rest of
  // the run's settings are kept); a guard with neither rule turns it off.
  // InvalidArgument, before asking gacd, for settings the controller
  // refuses. Waits up to 10 s.
  base::Status SetSpikeGuard(const controller::SpikeSettings& spike, const std::string& reason);
  // The former name, which also switched the run to remote mode: the same as
  // SetThresholds(thresholds, alpha_mode, reason, Mode::kRemote).
  [[deprecated("use SetThresholds (which keeps the run's mode unless asked)")]]
  base::Status SetRunThresholds(const controller::Thresholds& thresholds, controller::AlphaMode alpha_mode, const std::string& reason);

 private:
  struct Impl;
  explicit RemoteController(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gac::transport

#endif  // GAC_TRANSPORT_REMOTE_CONTROLLER_H_
