// GacdClient: gacctl's view of gacd's gRPC API. Each call sends the bearer
// token, has a deadline, and returns gac::base::Status (through
// gac/proto/convert.h, so gacd's code and text arrive unchanged); failures
// of the connection itself (UNAVAILABLE, DEADLINE_EXCEEDED) name the address.
// The paged listings are walked with the opaque page tokens gacd returns,
// one page at a time, so a caller can stream them.
//
// Thread safety: a GacdClient may be used from several threads (gRPC's
// stubs are); the paging helpers call back on the calling thread.
#ifndef GAC_CLI_CLIENT_H_
#define GAC_CLI_CLIENT_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "gac/base/status.h"
#include "gac/v1/control.grpc.pb.h"
#include "gac/v1/query.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace gac::cli {

struct ConnectionOptions {
  std::string address = "127.0.0.1:7070";  // host:port
  std::string token;                       // bearer token; "" = none
  bool tls = false;                        // TLS (with tls_ca_pem, or the system's roots)
  std::string tls_ca_pem;                  // PEM roots that sign gacd's certificate
  std::string tls_server_name;             // name to verify instead of the address's host
  std::chrono::milliseconds timeout{10000};  // deadline of each call
};

class GacdClient {
 public:
  // Creates the channel (connects on the first call).
  explicit GacdClient(const ConnectionOptions& options);

  const ConnectionOptions& options() const { return options_; }

  base::StatusOr<v1::ListRunsResponse> ListRuns(const v1::ListRunsRequest& request);
  base::StatusOr<v1::GetStepsResponse> GetSteps(const v1::GetStepsRequest& request);
  base::StatusOr<v1::RunSummary> GetRunSummary(const std::string& run, std::uint32_t window);
  base::StatusOr<v1::RunConfig> GetRunConfig(const std::string& run);
  base::StatusOr<v1::RunConfig> SetRunConfig(const v1::SetRunConfigRequest& request);
  base::StatusOr<v1::ListConfigChangesResponse> ListConfigChanges(const v1::ListConfigChangesRequest& request);
  // grpc.health.v1 Check of `service` ("" = the server as a whole).
  base::StatusOr<grpc::health::v1::HealthCheckResponse> Health(const std::string& service);

  // Every readable run, a page at a time, in id order. Stops at the first
  // error, of the call or of `page`.
  base::Status ForEachRunPage(const std::function<base::Status(const v1::ListRunsResponse&)>& page);
  // The same for `request` (its page_token is the start; include_latest
  // asks for each run's latest step in the same call).
  base::Status ForEachRunPage(v1::ListRunsRequest request,
                        const std::function<base::Status(const v1::ListRunsResponse&)>& page);
  // Every page of `request` (its page_token is the start), in (step, rank)
  // order.
  base::Status ForEachStepPage(v1::GetStepsRequest request,
                         const std::function<base::Status(const v1::GetStepsResponse&)>& page);
  // Every page of a run's audit log, oldest first.
  base::Status ForEachConfigChangePage(const std::string& run,
                                 const std::function<base::Status(const v1::ListConfigChangesResponse&)>& page);

 private:
  std::unique_ptr<grpc::ClientContext> Context() const;
  base::Status FromWire(const grpc::Status& status) const;

  ConnectionOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::QueryService::Stub> query_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace gac::cli

#endif  // GAC_CLI_CLIENT_H_
