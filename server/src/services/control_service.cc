#include "server/src/services/services.h"
#include "server/src/unary_call.h"

namespace gac::server {

grpc::ServerUnaryReactor* ControlServiceImpl::Decide(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* raw_request,
                                                     grpc::ByteBuffer* raw_response) {
  const auto received = std::chrono::steady_clock::now();
  UnaryCall call(core_, "Decide", ctx);
  v1::DecideRequest request;
  if (!grpc::SerializationTraits<v1::DecideRequest>::Deserialize(const_cast<grpc::ByteBuffer*>(raw_request), &request)
           .ok()) {
    return call.Finish(base::Status::InvalidArgument("malformed DecideRequest: not a valid gac.v1.DecideRequest message"));
  }
  base::Status st = ValidateDecideRequest(request);
  if (st.ok()) st = call.Authorize(kWrite, request.run()).status();
  if (!st.ok()) return call.Finish(st);
  v1::DecideResponse response;
  core_->Decide(request, &response, received);
  bool own_buffer = false;
  grpc::SerializationTraits<v1::DecideResponse>::Serialize(response, raw_response, &own_buffer);
  return call.Finish(base::Status::Ok());
}

}  // namespace gac::server
