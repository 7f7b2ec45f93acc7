#include "gac/agent/remote_controller.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>

#include "gac/v1/control.grpc.pb.h"

namespace gac::agent {

struct RemoteController::Impl {
  RemoteControllerOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ControlService::Stub> stub;
  std::unique_ptr<v1::AdminService::Stub> admin;
};

std::shared_ptr<grpc::Channel> MakeGacdChannel(const std::string& address, const std::string& tls_root_certs,
                                               std::chrono::milliseconds max_backoff) {
  grpc::ChannelArguments args;
  // gRPC's own reconnect backoff starts at 1 s and grows to 2 min; a
  // restarted gacd should be found within the sender's own backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(std::max<std::int64_t>(max_backoff.count(), 100)));
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!tls_root_certs.empty()) {
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = tls_root_certs;
    creds = grpc::SslCredentials(opts);
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

RemoteController::RemoteController(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteController::~RemoteController() = default;

StatusOr<std::unique_ptr<RemoteController>> RemoteController::Create(const RemoteControllerOptions& options) {
  if (options.address.empty()) return Status::InvalidArgument("remote controller address is empty");
  if (options.run.empty()) return Status::InvalidArgument("remote controller run id is empty");
  if (options.deadline.count() <= 0) return Status::InvalidArgument("remote controller deadline must be > 0");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->channel = MakeGacdChannel(options.address, options.tls_root_certs, std::chrono::milliseconds(1000));
  impl->stub = v1::ControlService::NewStub(impl->channel);
  impl->admin = v1::AdminService::NewStub(impl->channel);
  return std::unique_ptr<RemoteController>(new RemoteController(std::move(impl)));
}

StatusOr<Decision> RemoteController::Decide(std::int64_t step, const AlignmentStats& stats) {
  const RemoteControllerOptions& o = impl_->options;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + o.deadline);
  if (!o.token.empty()) ctx.AddMetadata("authorization", "Bearer " + o.token);
  v1::DecideRequest req;
  req.set_run(o.run);
  req.set_rank(o.rank);
  req.set_step(step);
  req.set_dot(stats.dot);
  req.set_grad_sq(stats.gg);
  req.set_ref_sq(stats.pp);
  req.set_has_reference(stats.has_reference);
  v1::DecideResponse resp;
  const grpc::Status st = impl_->stub->Decide(&ctx, req, &resp);
  if (!st.ok()) return Status(static_cast<StatusCode>(st.error_code()), "gacd Decide: " + st.error_message());
  Decision d;
  switch (resp.regime()) {
    case v1::REGIME_SAFE: d.regime = Regime::kSafe; break;
    case v1::REGIME_PROJECT: d.regime = Regime::kProject; break;
    case v1::REGIME_SKIP: d.regime = Regime::kSkip; break;
    case v1::REGIME_INVALID: d.regime = Regime::kInvalid; break;
    default: return Status::Internal("gacd Decide returned no regime");
  }
  if (resp.has_cosine()) d.cosine = resp.cosine();
  if (resp.has_cosine_after()) d.cosine_after = resp.cosine_after();
  d.alpha = resp.alpha();
  d.projection_coeff = resp.projection_coeff();
  d.apply_update = resp.apply_update();
  d.grad_norm = std::sqrt(stats.gg);
  d.ref_norm = std::sqrt(stats.pp);
  return d;
}

Status RemoteController::SetRunThresholds(const Thresholds& thresholds, AlphaMode alpha_mode,
                                          const std::string& reason) {
  const RemoteControllerOptions& o = impl_->options;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!o.token.empty()) ctx.AddMetadata("authorization", "Bearer " + o.token);
  v1::SetRunConfigRequest req;
  req.set_run(o.run);
  req.mutable_thresholds()->set_c_low(thresholds.c_low);
  req.mutable_thresholds()->set_c_high(thresholds.c_high);
  req.mutable_thresholds()->set_alpha_mode(alpha_mode == AlphaMode::kExact ? v1::ALPHA_MODE_EXACT
                                                                            : v1::ALPHA_MODE_PAPER);
  req.set_mode(v1::CONTROL_MODE_REMOTE);
  req.set_reason(reason);
  v1::RunConfig cfg;
  const grpc::Status st = impl_->admin->SetRunConfig(&ctx, req, &cfg);
  if (!st.ok()) return Status(static_cast<StatusCode>(st.error_code()), "gacd SetRunConfig: " + st.error_message());
  return Status::Ok();
}

}  // namespace gac::agent
