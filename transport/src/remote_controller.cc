#include "gac/transport/remote_controller.h"

#include <grpcpp/grpcpp.h>

#include "gac/proto/convert.h"
#include "gac/transport/channel.h"
#include "gac/v1/control.grpc.pb.h"

namespace gac::transport {

struct RemoteController::Impl {
  RemoteControllerOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ControlService::Stub> stub;
  std::unique_ptr<v1::AdminService::Stub> admin;
};

RemoteController::RemoteController(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteController::~RemoteController() = default;

StatusOr<std::unique_ptr<RemoteController>> RemoteController::Create(const RemoteControllerOptions& options) {
  if (options.address.empty()) return Status::InvalidArgument("remote controller address is empty");
  if (options.run.empty()) return Status::InvalidArgument("remote controller run id is empty");
  if (options.deadline.count() <= 0) return Status::InvalidArgument("remote controller deadline must be > 0");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->channel = MakeGacdChannel(
      options.address, ChannelTls{options.tls_root_certs, options.tls_cert_chain, options.tls_private_key},
      std::chrono::milliseconds(1000));
  impl->stub = v1::ControlService::NewStub(impl->channel);
  impl->admin = v1::AdminService::NewStub(impl->channel);
  return std::unique_ptr<RemoteController>(new RemoteController(std::move(impl)));
}

StatusOr<Decision> RemoteController::Decide(std::int64_t step, const AlignmentStats& stats) {
  const RemoteControllerOptions& o = impl_->options;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + o.deadline);
  if (!o.token.empty()) ctx.AddMetadata("authorization", "Bearer " + o.token);
  const v1::DecideRequest req = proto::ToDecideRequest(o.run, o.rank, step, stats);
  v1::DecideResponse resp;
  const grpc::Status st = impl_->stub->Decide(&ctx, req, &resp);
  if (!st.ok()) return proto::FromGrpcStatus(st, "gacd Decide");
  StatusOr<Decision> decision = proto::DecodeDecideResponse(req, resp);
  if (!decision.ok()) return decision.status().WithPrefix("gacd Decide answered nonsense");
  return decision;
}

Status RemoteController::SetRunThresholds(const Thresholds& thresholds, AlphaMode alpha_mode,
                                          const std::string& reason) {
  const RemoteControllerOptions& o = impl_->options;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!o.token.empty()) ctx.AddMetadata("authorization", "Bearer " + o.token);
  v1::SetRunConfigRequest req;
  req.set_run(o.run);
  *req.mutable_thresholds() = proto::ToProto(thresholds, alpha_mode);
  req.set_mode(proto::ToProto(Mode::kRemote));
  req.set_reason(reason);
  v1::RunConfig cfg;
  return proto::FromGrpcStatus(impl_->admin->SetRunConfig(&ctx, req, &cfg), "gacd SetRunConfig");
}

}  // namespace gac::transport
