// gacd's gRPC services. Each only translates between the wire and the Core
// (and the functions of server/src/queries.h): decode and check the request,
// authorise, ask the domain, encode the answer. Ingest and Decide take raw
// bytes and parse them themselves, so that a malformed message gets a clear
// INVALID_ARGUMENT instead of a bare stream failure.
//
// Thread safety: gRPC calls the handlers from its callback threads; they
// never block (store reads go to the Core's executor, writes to its writer).
#ifndef GAC_SERVER_SRC_SERVICES_SERVICES_H_
#define GAC_SERVER_SRC_SERVICES_SERVICES_H_

#include <memory>

#include "gac/v1/control.grpc.pb.h"
#include "gac/v1/query.grpc.pb.h"
#include "gac/v1/telemetry.grpc.pb.h"
#include "server/src/core.h"

namespace gac::server {

class IngestStreams;

// IngestService.Ingest: the acknowledged stream of step batches.
class IngestServiceImpl final
    : public v1::IngestService::WithRawCallbackMethod_Ingest<v1::IngestService::Service> {
 public:
  explicit IngestServiceImpl(Core* core);
  ~IngestServiceImpl() override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Ingest(grpc::CallbackServerContext* ctx) override;

  // Shutdown: refuses new streams and ends the open ones once their pending
  // batches are acknowledged (status UNAVAILABLE, so agents resend
  // elsewhere or later).
  void DrainStreams();

 private:
  Core* const core_;
  std::unique_ptr<IngestStreams> streams_;
};

// ControlService.Decide: the closed-loop decision, in memory.
class ControlServiceImpl final
    : public v1::ControlService::WithRawCallbackMethod_Decide<v1::ControlService::Service> {
 public:
  explicit ControlServiceImpl(Core* core) : core_(core) {}
  grpc::ServerUnaryReactor* Decide(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;

 private:
  Core* const core_;
};

// AdminService: a run's settings and their audit log.
class AdminServiceImpl final : public v1::AdminService::CallbackService {
 public:
  explicit AdminServiceImpl(Core* core) : core_(core) {}
  grpc::ServerUnaryReactor* GetRunConfig(grpc::CallbackServerContext* ctx, const v1::GetRunConfigRequest* request,
                                         v1::RunConfig* response) override;
  grpc::ServerUnaryReactor* SetRunConfig(grpc::CallbackServerContext* ctx, const v1::SetRunConfigRequest* request,
                                         v1::RunConfig* response) override;
  grpc::ServerUnaryReactor* ListConfigChanges(grpc::CallbackServerContext* ctx,
                                              const v1::ListConfigChangesRequest* request,
                                              v1::ListConfigChangesResponse* response) override;

 private:
  Core* const core_;
};

// QueryService: runs, step history and run summaries.
class QueryServiceImpl final : public v1::QueryService::CallbackService {
 public:
  explicit QueryServiceImpl(Core* core) : core_(core) {}
  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx, const v1::ListRunsRequest* request,
                                     v1::ListRunsResponse* response) override;
  grpc::ServerUnaryReactor* GetSteps(grpc::CallbackServerContext* ctx, const v1::GetStepsRequest* request,
                                     v1::GetStepsResponse* response) override;
  grpc::ServerUnaryReactor* GetRunSummary(grpc::CallbackServerContext* ctx, const v1::GetRunSummaryRequest* request,
                                          v1::RunSummary* response) override;

 private:
  Core* const core_;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_SERVICES_SERVICES_H_
