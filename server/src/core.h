// Core: the state every gacd service shares, and the domain operations
// behind its write-side calls (Decide, a settings change, the metrics of a
// committed batch). The services translate between the wire and these; the
// HTTP API calls the same operations.
//
// A Core is built from its parts (Core::Parts) and holds them for its whole
// life: no part can be replaced once gacd serves.
//
// Thread safety: the parts are each safe for concurrent use; the call
// counter is guarded by calls_mu_.
#ifndef GAC_SERVER_SRC_CORE_H_
#define GAC_SERVER_SRC_CORE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "gac/base/mutex.h"
#include "gac/server/config.h"
#include "gac/server/store.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/telemetry.pb.h"
#include "server/src/auth.h"
#include "server/src/executor.h"
#include "server/src/metrics.h"
#include "server/src/registry.h"
#include "server/src/validate.h"
#include "server/src/writer.h"

namespace gac::server {

class Core {
 public:
  // What gacd is assembled from. The writer writes into `store` and counts
  // into `metrics`; GacServer::Start (or a test) builds them in that order.
  struct Parts {
    ServerConfig config;
    Limits limits;
    Authenticator auth = Authenticator::Insecure();
    std::unique_ptr<Store> store;
    std::unique_ptr<Metrics> metrics;
    std::unique_ptr<RunRegistry> registry;
    std::unique_ptr<Writer> writer;
    std::unique_ptr<Executor> executor;
  };
  // REQUIRES: every pointer of `parts` is set.
  explicit Core(Parts parts);
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // The parts, fixed for the core's lifetime (each is safe for concurrent use).
  const ServerConfig& config() const { return config_; }
  const Limits& limits() const { return limits_; }
  Store& store() const { return *store_; }
  Metrics& metrics() const { return *metrics_; }
  RunRegistry& registry() const { return *registry_; }
  Writer& writer() const { return *writer_; }
  Executor& executor() const { return *executor_; }

  // The principal of the "authorization" header value (may be empty).
  base::StatusOr<const Principal*> Authenticate(std::string_view authorization) const;
  base::StatusOr<const Principal*> Authenticate(const grpc::CallbackServerContext& ctx) const;
  // Authenticates and authorises `right` on `run`.
  base::StatusOr<const Principal*> Authorize(const grpc::CallbackServerContext& ctx, Right right,
                                       const std::string& run) const;

  // Counts the failure in gac_rpc_errors_total{method, code} and returns it
  // as a gRPC status.
  grpc::Status Fail(const char* method, const base::Status& status);

  // Calls that have not finished: shutdown waits for them (up to the drain
  // time) before it cuts the rest off.
  void CallStarted() GAC_EXCLUDES(calls_mu_);
  void CallFinished() GAC_EXCLUDES(calls_mu_);
  // Waits until no call is open or `deadline` passes.
  void WaitForCalls(std::chrono::steady_clock::time_point deadline) GAC_EXCLUDES(calls_mu_);

  // Decides `request` (already validated and authorised) with the run's
  // settings, in memory, and fills `response`; observes the decision.
  void Decide(const v1::DecideRequest& request, v1::DecideResponse* response,
              std::chrono::steady_clock::time_point received);

  // Changes a run's settings for `principal` (authorised for admin on the
  // run): validated and installed at once (so Decide uses them), made
  // durable with their audit record through the writer, undone if the write
  // fails. `done` runs once: with the new settings after the commit, or the
  // error (InvalidArgument, Aborted for a stale expected_version, also when
  // another replica sharing the store changed the run first, Unavailable
  // when not stored). Never waits on the disk.
  using ConfigDone = std::function<void(const base::StatusOr<v1::RunConfig>&)>;
  void ChangeRunConfig(const v1::SetRunConfigRequest& request, const Principal& principal, ConfigDone done);

  // After a batch committed: the metrics of its newly stored records.
  void ObserveCommitted(const v1::IngestRequest& request, const WriteOp& op);

 private:
  // Tries of a settings change without expected_version that lose to
  // changes made through other replicas at the same moment.
  static constexpr int kConfigAttempts = 5;
  void TryChangeRunConfig(std::shared_ptr<const v1::SetRunConfigRequest> request, std::string principal,
                          std::shared_ptr<ConfigDone> done, int attempts);

  // Constant after construction. Declared in dependency order: the writer
  // (which commits what is queued when it stops) goes before the store and
  // the metrics it uses.
  const ServerConfig config_;
  const Limits limits_;
  const Authenticator auth_;
  const std::unique_ptr<Store> store_;
  const std::unique_ptr<Metrics> metrics_;
  const std::unique_ptr<RunRegistry> registry_;
  const std::unique_ptr<Writer> writer_;
  const std::unique_ptr<Executor> executor_;

  base::Mutex calls_mu_;
  base::CondVar calls_cv_;
  int open_calls_ GAC_GUARDED_BY(calls_mu_) = 0;
};

// Nanoseconds since the Unix epoch.
std::int64_t NowNs();

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_CORE_H_
