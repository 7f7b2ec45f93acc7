#include "server/src/core.h"

#include <cassert>
#include <utility>

#include "gac/proto/convert.h"

namespace gac::server {

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Core::Core(Parts parts)
    : config_(std::move(parts.config)),
      limits_(parts.limits),
      auth_(std::move(parts.auth)),
      store_(std::move(parts.store)),
      metrics_(std::move(parts.metrics)),
      registry_(std::move(parts.registry)),
      writer_(std::move(parts.writer)),
      executor_(std::move(parts.executor)) {
  assert(store_ != nullptr && metrics_ != nullptr && registry_ != nullptr && writer_ != nullptr &&
         executor_ != nullptr);
}

base::StatusOr<const Principal*> Core::Authenticate(std::string_view authorization) const {
  return auth_.Authenticate(authorization);
}

base::StatusOr<const Principal*> Core::Authenticate(const grpc::CallbackServerContext& ctx) const {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  std::string_view value;
  if (it != md.end()) value = std::string_view(it->second.data(), it->second.size());
  return Authenticate(value);
}

base::StatusOr<const Principal*> Core::Authorize(const grpc::CallbackServerContext& ctx, Right right,
                                           const std::string& run) const {
  base::StatusOr<const Principal*> p = Authenticate(ctx);
  if (!p.ok()) return p;
  GAC_RETURN_IF_ERROR(Authenticator::Authorize(**p, right, run));
  return p;
}

grpc::Status Core::Fail(const char* method, const base::Status& status) {
  metrics_->ObserveRpcError(method, base::StatusCodeName(status.code()));
  return proto::ToGrpcStatus(status);
}

void Core::CallStarted() {
  base::MutexLock lock(&calls_mu_);
  ++open_calls_;
}

void Core::CallFinished() {
  base::MutexLock lock(&calls_mu_);
  if (--open_calls_ == 0) calls_cv_.SignalAll();
}

void Core::WaitForCalls(std::chrono::steady_clock::time_point deadline) {
  base::MutexLock lock(&calls_mu_);
  while (open_calls_ > 0 && calls_cv_.WaitUntil(&calls_mu_, deadline)) {
  }
}

void Core::Decide(const v1::DecideRequest& request, v1::DecideResponse* response,
                  std::chrono::steady_clock::time_point received) {
  const controller::Decision d = registry_->Decide(request.run(), proto::StatsFromProto(request),
                                                   request.recent_cosines(), response->mutable_config(),
                                                   &request.recent_grad_norms(), &request.recent_losses());
  proto::EncodeDecideResponse(request, d, response);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - received).count();
  metrics_->ObserveDecide(request.run(), response->regime(), seconds, std::chrono::system_clock::now());
}

void Core::ChangeRunConfig(const v1::SetRunConfigRequest& request, const Principal& principal, ConfigDone done) {
  if (request.reason().size() > limits_.max_reason_bytes) {
    done(base::Status::InvalidArgument("reason longer than " + std::to_string(limits_.max_reason_bytes) + " bytes"));
    return;
  }
  TryChangeRunConfig(std::make_shared<const v1::SetRunConfigRequest>(request), principal.name,
                     std::make_shared<ConfigDone>(std::move(done)), kConfigAttempts);
}

void Core::TryChangeRunConfig(std::shared_ptr<const v1::SetRunConfigRequest> request, std::string principal,
                              std::shared_ptr<ConfigDone> done, int attempts) {
  // The whole change is serialised through the registry; the write that
  // makes it durable goes through the writer (the caller never waits on the
  // disk), and `done` runs once it is committed. The store writes it only if
  // no other gacd sharing the store changed the run since (compare-and-set
  // on the version); otherwise the registry takes the stored settings and a
  // change without expected_version is made again on top of them.
  auto write = std::make_shared<ConfigWrite>();
  write->run = request->run();
  base::StatusOr<v1::RunConfig> next =
      registry_->Change(*request, principal, NowNs(), write->change.mutable_before());
  if (!next.ok()) {
    (*done)(next.status());
    return;
  }
  write->config = *next;
  *write->change.mutable_after() = *next;
  write->change.set_reason(request->reason());
  WriteOp op;
  op.config = write.get();
  op.received_ns = NowNs();
  const base::Status st = writer_->Submit(op, 1, [this, write, request, principal, done, attempts](const base::Status& s,
                                                                                          const WriteOp& result) {
    if (!s.ok()) {
      registry_->Revert(write->run, write->config, write->change.before());
      (*done)(base::Status::Unavailable("settings not stored: " + s.message()));
      return;
    }
    if (result.config_conflict) {
      registry_->Revert(write->run, write->config, result.stored_config);
      metrics_->ObserveConfig(write->run, registry_->Get(write->run), std::chrono::system_clock::now());
      if (request->expected_version() != 0 || attempts <= 1) {
        (*done)(base::Status(base::StatusCode::kAborted, "run '" + write->run + "' was changed through another gacd: it is at version " +
                                                 std::to_string(result.stored_config.version()) + ", not " +
                                                 std::to_string(write->change.before().version())));
        return;
      }
      TryChangeRunConfig(request, principal, done, attempts - 1);
      return;
    }
    metrics_->ObserveConfig(write->run, write->config, std::chrono::system_clock::now());
    (*done)(write->config);
  });
  if (!st.ok()) {
    registry_->Revert(write->run, write->config, write->change.before());
    (*done)(st);
  }
}

void Core::ObserveCommitted(const v1::IngestRequest& request, const WriteOp& op) {
  std::uint64_t layer_rows = 0;
  const auto now = std::chrono::system_clock::now();
  // Records are observed only when the whole batch is new: a replayed batch
  // must not count twice. A partly replayed batch (re-batched after a
  // reconnect) leaves its counters short by the overlap, never over.
  const bool all_new = op.duplicates == 0;
  std::string last_run;
  for (const v1::StepRecord& r : request.records()) {
    if (r.run() != last_run) {
      metrics_->ObserveConfig(r.run(), registry_->Get(r.run()), now);
      last_run = r.run();
    }
    if (all_new) {
      metrics_->ObserveStep(r, now);
      layer_rows += static_cast<std::uint64_t>(r.layers_size());
    }
  }
  metrics_->ObserveIngest(op.stored, layer_rows, op.duplicates);
}

}  // namespace gac::server
