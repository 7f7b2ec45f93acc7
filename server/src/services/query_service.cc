#include "server/src/queries.h"
#include "server/src/services/services.h"
#include "server/src/unary_call.h"

namespace gac::server {

grpc::ServerUnaryReactor* QueryServiceImpl::ListRuns(grpc::CallbackServerContext* ctx,
                                                     const v1::ListRunsRequest* request,
                                                     v1::ListRunsResponse* response) {
  UnaryCall call(core_, "ListRuns", ctx);
  base::StatusOr<const Principal*> principal = call.Authenticate();
  base::Status st = principal.status();
  // The page parameters are checked here, before any store read.
  if (st.ok()) st = PageSize(request->page_size(), kRunPages).status();
  if (st.ok()) st = DecodeRunToken(request->page_token()).status();
  if (!st.ok()) return call.Finish(st);
  Core* core = core_;
  const Principal* p = *principal;
  return call.ReplyInBackground(response,
                                [core, p, request] { return ListRunsPage(core->store(), core->registry(), *p, *request); });
}

grpc::ServerUnaryReactor* QueryServiceImpl::GetSteps(grpc::CallbackServerContext* ctx,
                                                     const v1::GetStepsRequest* request,
                                                     v1::GetStepsResponse* response) {
  UnaryCall call(core_, "GetSteps", ctx);
  base::Status st = ValidateRunId(request->run());
  if (st.ok()) st = call.Authorize(kRead, request->run()).status();
  base::StatusOr<StepQuery> query = st.ok() ? StepQueryFromRequest(*request) : base::StatusOr<StepQuery>(st);
  if (!query.ok()) return call.Finish(query.status());
  Store* store = &core_->store();
  return call.ReplyInBackground(response, [store, q = std::move(*query)] { return GetStepsPage(*store, q); });
}

grpc::ServerUnaryReactor* QueryServiceImpl::GetRunSummary(grpc::CallbackServerContext* ctx,
                                                          const v1::GetRunSummaryRequest* request,
                                                          v1::RunSummary* response) {
  UnaryCall call(core_, "GetRunSummary", ctx);
  base::Status st = ValidateRunId(request->run());
  if (st.ok()) st = call.Authorize(kRead, request->run()).status();
  if (!st.ok()) return call.Finish(st);
  Core* core = core_;
  return call.ReplyInBackground(response, [core, request] {
    return server::GetRunSummary(core->store(), core->registry(), request->run(), request->window());
  });
}

}  // namespace gac::server
