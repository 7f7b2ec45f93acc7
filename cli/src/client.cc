#include "gac/cli/client.h"

#include <grpcpp/grpcpp.h>

#include "gac/proto/convert.h"

namespace gac::cli {

GacdClient::GacdClient(const ConnectionOptions& options) : options_(options) {
  grpc::ChannelArguments args;
  // A page of steps with their layers may be larger than gRPC's 4 MiB default;
  // gacd bounds the page size.
  args.SetMaxReceiveMessageSize(-1);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (options_.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.tls_ca_pem;  // "" = gRPC's default roots
    creds = grpc::SslCredentials(ssl);
    if (!options_.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls_server_name);
    }
  }
  channel_ = grpc::CreateCustomChannel(options_.address, creds, args);
  query_ = v1::QueryService::NewStub(channel_);
  admin_ = v1::AdminService::NewStub(channel_);
  health_ = grpc::health::v1::Health::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> GacdClient::Context() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + options_.timeout);
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  return ctx;
}

base::Status GacdClient::FromWire(const grpc::Status& status) const {
  // Failures of the connection come from the client side: say where it was
  // trying to go. Everything else is gacd's own code and text.
  const bool connection = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                          status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  return proto::FromGrpcStatus(status, connection ? options_.address : "");
}

base::StatusOr<v1::ListRunsResponse> GacdClient::ListRuns(const v1::ListRunsRequest& request) {
  v1::ListRunsResponse response;
  const grpc::Status st = query_->ListRuns(Context().get(), request, &response);
  if (!st.ok()) return FromWire(st);
  return response;
}

base::StatusOr<v1::GetStepsResponse> GacdClient::GetSteps(const v1::GetStepsRequest& request) {
  v1::GetStepsResponse response;
  const grpc::Status st = query_->GetSteps(Context().get(), request, &response);
  if (!st.ok()) return FromWire(st);
  return response;
}

base::StatusOr<v1::RunSummary> GacdClient::GetRunSummary(const std::string& run, std::uint32_t window) {
  v1::GetRunSummaryRequest request;
  request.set_run(run);
  request.set_window(window);
  v1::RunSummary response;
  const grpc::Status st = query_->GetRunSummary(Context().get(), request, &response);
  if (!st.ok()) return FromWire(st);
  return response;
}

base::StatusOr<v1::RunConfig> GacdClient::GetRunConfig(const std::string& run) {
  v1::GetRunConfigRequest request;
  request.set_run(run);
  v1::RunConfig response;
  const grpc::Status st = admin_->GetRunConfig(Context().get(), request, &response);
  if (!st.ok()) return FromWire(st);
  return response;
}

base::StatusOr<v1::RunConfig> GacdClient::SetRunConfig(const v1::SetRunConfigRequest& request) {
  v1::RunConfig response;
  const grpc::Status st = admin_->SetRunConfig(Context().get(), request, &response);
  if (!st.ok()) return FromWire(st);
  return response;
}

base::StatusOr<v1::ListConfigChangesResponse> GacdClient::ListConfigChanges(const v1::ListConfigChangesRequest& request) {
  v1::ListConfigChangesResponse response;
  const grpc::Status st = admin_->ListConfigChanges(Context().get(), request, &response);
  if (!st.ok()) return FromWire(st);
  return response;
}

base::StatusOr<grpc::health::v1::HealthCheckResponse> GacdClient::Health(const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status st = health_->Check(Context().get(), request, &response);
  if (!st.ok()) return FromWire(st);
  return response;
}

base::Status GacdClient::ForEachRunPage(const std::function<base::Status(const v1::ListRunsResponse&)>& page) {
  return ForEachRunPage(v1::ListRunsRequest(), page);
}

base::Status GacdClient::ForEachRunPage(v1::ListRunsRequest request,
                                  const std::function<base::Status(const v1::ListRunsResponse&)>& page) {
  for (;;) {
    GAC_ASSIGN_OR_RETURN(v1::ListRunsResponse response, ListRuns(request));
    GAC_RETURN_IF_ERROR(page(response));
    if (response.next_page_token().empty()) return base::Status::Ok();
    request.set_page_token(response.next_page_token());
  }
}

base::Status GacdClient::ForEachStepPage(v1::GetStepsRequest request,
                                   const std::function<base::Status(const v1::GetStepsResponse&)>& page) {
  for (;;) {
    GAC_ASSIGN_OR_RETURN(v1::GetStepsResponse response, GetSteps(request));
    GAC_RETURN_IF_ERROR(page(response));
    if (response.next_page_token().empty()) return base::Status::Ok();
    request.set_page_token(response.next_page_token());
  }
}

base::Status GacdClient::ForEachConfigChangePage(const std::string& run,
                                           const std::function<base::Status(const v1::ListConfigChangesResponse&)>& page) {
  v1::ListConfigChangesRequest request;
  request.set_run(run);
  request.set_page_size(1000);
  for (;;) {
    GAC_ASSIGN_OR_RETURN(v1::ListConfigChangesResponse response, ListConfigChanges(request));
    GAC_RETURN_IF_ERROR(page(response));
    if (response.next_page_token().empty()) return base::Status::Ok();
    request.set_page_token(response.next_page_token());
  }
}

}  // namespace gac::cli
