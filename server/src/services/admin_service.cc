#include "server/src/queries.h"
#include "server/src/services/services.h"
#include "server/src/unary_call.h"

namespace gac::server {

grpc::ServerUnaryReactor* AdminServiceImpl::GetRunConfig(grpc::CallbackServerContext* ctx,
                                                         const v1::GetRunConfigRequest* request,
                                                         v1::RunConfig* response) {
  UnaryCall call(core_, "GetRunConfig", ctx);
  base::Status st = ValidateRunId(request->run());
  if (st.ok()) st = call.Authorize(kRead, request->run()).status();
  if (st.ok()) *response = core_->registry().Get(request->run());
  return call.Finish(st);
}

grpc::ServerUnaryReactor* AdminServiceImpl::SetRunConfig(grpc::CallbackServerContext* ctx,
                                                         const v1::SetRunConfigRequest* request,
                                                         v1::RunConfig* response) {
  UnaryCall call(core_, "SetRunConfig", ctx);
  base::Status st = ValidateRunId(request->run());
  base::StatusOr<const Principal*> principal = call.Authorize(kAdmin, request->run());
  if (st.ok()) st = principal.status();
  if (!st.ok()) return call.Finish(st);
  // The reply is sent once the change is durable (on the writer's thread).
  core_->ChangeRunConfig(*request, **principal, [call, response](const base::StatusOr<v1::RunConfig>& config) {
    if (config.ok()) *response = *config;
    call.Finish(config.status());
  });
  return call.reactor();
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListConfigChanges(grpc::CallbackServerContext* ctx,
                                                              const v1::ListConfigChangesRequest* request,
                                                              v1::ListConfigChangesResponse* response) {
  UnaryCall call(core_, "ListConfigChanges", ctx);
  base::Status st = ValidateRunId(request->run());
  if (st.ok()) st = call.Authorize(kRead, request->run()).status();
  if (!st.ok()) return call.Finish(st);
  Store* store = &core_->store();
  return call.ReplyInBackground(response, [store, request] { return ListConfigChangesPage(*store, *request); });
}

}  // namespace gac::server
