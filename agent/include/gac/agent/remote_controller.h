// gacd as the agent's decision source in remote mode (gac::agent_grpc).
//
// Decide() sends the step's three statistics to gacd's ControlService and
// waits at most `deadline` for the answer; a miss, an outage or a rejection
// is an error, on which the agent falls back to its local decision and
// counts the fallback. gRPC's fail-fast default applies: while gacd is
// unreachable, calls fail at once instead of waiting for the deadline.
//
// Thread safety: Decide may be called from any thread.

#ifndef GAC_AGENT_REMOTE_CONTROLLER_H_
#define GAC_AGENT_REMOTE_CONTROLLER_H_

#include <chrono>
#include <memory>
#include <string>

#include "gac/agent/decision_source.h"

namespace grpc {
class Channel;
}

namespace gac::agent {

struct RemoteControllerOptions {
  std::string address;                     // gacd host:port
  std::string token;                       // bearer token with write rights on the run
  std::string tls_root_certs;              // PEM roots; "" = plaintext
  std::string run;                         // run id
  std::uint32_t rank = 0;
  std::chrono::milliseconds deadline{50};  // per Decide
};

class RemoteController final : public DecisionSource {
 public:
  static StatusOr<std::unique_ptr<RemoteController>> Create(const RemoteControllerOptions& options);
  ~RemoteController() override;

  StatusOr<Decision> Decide(std::int64_t step, const AlignmentStats& stats) override;

  // Sets the run's thresholds on gacd and its mode to remote, through the
  // admin API (the token needs admin rights on the run); `reason` goes to
  // gacd's audit log. Waits up to 10 s.
  Status SetRunThresholds(const Thresholds& thresholds, AlphaMode alpha_mode, const std::string& reason);

 private:
  struct Impl;
  explicit RemoteController(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A channel to gacd with reconnect backoff suited to the agent (gRPC's
// default waits up to 2 minutes before retrying a restarted server).
std::shared_ptr<grpc::Channel> MakeGacdChannel(const std::string& address, const std::string& tls_root_certs,
                                               std::chrono::milliseconds max_backoff);

}  // namespace gac::agent

#endif  // GAC_AGENT_REMOTE_CONTROLLER_H_
