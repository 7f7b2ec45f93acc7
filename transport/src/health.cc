#include "gac/transport/health.h"

#include <grpcpp/grpcpp.h>

#include <memory>

#include "gac/proto/convert.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace gac::transport {

base::StatusOr<std::string> CheckGacdHealth(const std::string& address, const ChannelTls& tls,
                                            const std::string& token, std::chrono::milliseconds deadline) {
  // A connection of its own: not one another channel has backed off on.
  const std::shared_ptr<grpc::Channel> channel = MakeGacdChannel(address, tls, deadline, /*own_connection=*/true);
  const std::unique_ptr<grpc::health::v1::Health::Stub> stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return proto::FromGrpcStatus(status, address);
  return grpc::health::v1::HealthCheckResponse_ServingStatus_Name(response.status());
}

}  // namespace gac::transport
