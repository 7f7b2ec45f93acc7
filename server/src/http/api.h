// HttpApi: gacd's HTTP JSON API (/api/v1/...), the plain-HTTP twin of the
// query and admin gRPC services, for curl, notebooks, Grafana's JSON data
// sources and gacd's own page:
//
//   GET /api/v1/runs                   ListRuns        ?limit=&page_token=
//   GET /api/v1/runs/{run}             GetRunSummary   ?window=
//   GET /api/v1/runs/{run}/summary     the same (for a run id ending in /steps or /config)
//   GET /api/v1/runs/{run}/steps       GetSteps        ?from=&to=&rank=&layers=&limit=&page_token=
//                                      (each record with its m_t, window_mean: PageWindowMeans)
//   GET /api/v1/runs/{run}/config      GetRunConfig
//   PUT /api/v1/runs/{run}/config      SetRunConfig    (admin; JSON body)
//
// Each request is authenticated with the same bearer tokens ("Authorization:
// Bearer <token>"), authorised with the same rights on the run, checked by
// the same rules and limits, and answered from the same domain functions
// (server/src/queries.h, Core::ChangeRunConfig) as its gRPC method. A run id
// may contain '/'; the route is read from the end of the path. Errors are
// the gRPC codes, sent with their HTTP status (proto::ToHttpStatus) and the
// body {"code": "INVALID_ARGUMENT", "message": "..."}, and counted in
// gac_rpc_errors_total under the method "http.<gRPC method>". The JSON
// shapes are in docs/GACD.md.
//
// Reads go to the store's read side on the calling (HTTP worker) thread;
// nothing here waits on the writer except a settings change, which waits
// for its own commit as SetRunConfig does.
//
// The parsing functions take the raw text a client sent and return a
// Status: they are the surface a fuzzer drives.
//
// Thread safety: Handle may be called from many threads at once.
#ifndef GAC_SERVER_SRC_HTTP_API_H_
#define GAC_SERVER_SRC_HTTP_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gac/base/status.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/query.pb.h"
#include "server/src/core.h"

namespace gac::server {

// One request as the HTTP server received it.
struct HttpRequest {
  std::string method;         // "GET", "PUT", ...
  std::string path;           // percent-decoded, not normalised ("a/../b" stays)
  std::string query;          // after '?', still percent-encoded; "" when none
  std::string authorization;  // the Authorization header's value; "" when none
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // more header lines
};

// The resource a path and method name.
struct ApiRoute {
  enum Kind { kRuns, kSummary, kSteps, kConfig, kFields } kind = kRuns;
  std::string run;     // a valid run id; empty for kRuns and kFields
  const char* method;  // the gRPC method it mirrors, e.g. "GetSteps"
};

// The route of `path` (which starts with "/api/v1/") for `method`:
// NotFound for a path that names no resource, InvalidArgument for a bad run
// id, Unimplemented for a method the resource does not take.
base::StatusOr<ApiRoute> ParseApiRoute(std::string_view method, std::string_view path);

// The parameters of a query string ("a=1&b=x%2Fy"), percent-decoded, '+'
// read as a space. InvalidArgument for a malformed escape, an empty name, a
// name outside `allowed` or one given twice.
base::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseQueryString(
    std::string_view query, const std::vector<std::string_view>& allowed);

// The gRPC request each read endpoint stands for; InvalidArgument (naming
// the HTTP parameter) for a value that is not a number in range or a page
// size above the maximum, or for a name given together with its alias.
//
// The parameters take their wire names: start_step, end_step (half-open
// [start_step, end_step)), page_size, page_token. Deprecated aliases, same
// meaning: from (start_step), to (end_step), limit (page_size); for each one
// used, a note "'<alias>' is deprecated: use '<name>'" is appended to
// `deprecated` when it is not null (gacd sends them as Warning headers).
base::StatusOr<v1::ListRunsRequest> ParseRunsParams(std::string_view query,
                                              std::vector<std::string>* deprecated = nullptr);
base::StatusOr<v1::GetRunSummaryRequest> ParseSummaryParams(const std::string& run, std::string_view query);
base::StatusOr<v1::GetStepsRequest> ParseStepsParams(const std::string& run, std::string_view query,
                                               std::vector<std::string>* deprecated = nullptr);

// The SetRunConfigRequest of a PUT body:
//   {"thresholds": {"c_low": 0.1, "c_high": 0.4, "alpha_mode": "paper"},
//    "mode": "remote", "trigger": "window", "window": 20,
//    "window_thresholds": {"c_low": 0.29, "c_high": 0.95},
//    "reason": "...", "expected_version": 3}
// thresholds (c_low, c_high) and mode are required (the page's form sends
// every setting), alpha_mode ("paper" by default), trigger, window (1-1000)
// and window_thresholds (kept when absent), reason and expected_version
// optional. InvalidArgument for text
// that is not JSON, a member of the wrong type, an unknown member or an
// unknown enum name. Thresholds themselves are checked by the registry, as
// for SetRunConfig.
base::StatusOr<v1::SetRunConfigRequest> ParseConfigBody(const std::string& run, std::string_view body);

// JSON bodies (shapes in docs/GACD.md). `now_ns` is the server's clock, sent
// so that a client can compute ages without trusting its own.
std::string EncodeRunsPage(const v1::ListRunsResponse& page, std::int64_t now_ns);
std::string EncodeSummary(const v1::RunSummary& summary, std::int64_t now_ns);
// `with_layers`: each record has a "layers" array (layers=1 was asked).
// `window_means`: m_t of each record, index for index (PageWindowMeans), as
// its "window_mean"; a record past their end has no such member.
std::string EncodeStepsPage(const std::string& run, const v1::GetStepsResponse& page, bool with_layers,
                            const std::vector<std::optional<double>>& window_means);
std::string EncodeRunConfig(const std::string& run, const v1::RunConfig& config);
// GET /api/v1/fields: the step record's fields as the record schema
// describes them (gac/proto/record_schema.h), in its order: name, type,
// optional, unit, help, with their views: gauge (FieldGaugeName; null: none)
// and page (null, or the label, decimals and place of the field in the
// page's "Latest step", web/latest_step.h).
std::string EncodeStepFields();
std::string EncodeError(const base::Status& status);

class HttpApi {
 public:
  // `core` must outlive this object. `enabled` false refuses every request
  // (PermissionDenied, with `disabled_reason`): gacd does so in insecure mode
  // on an address other than loopback.
  HttpApi(Core* core, bool enabled, std::string disabled_reason = "");

  // Answers a request whose path starts with "/api/".
  HttpResponse Handle(const HttpRequest& request);

 private:
  // The body of a 200 answer; the notes of deprecated parameters it used go
  // to `warnings`.
  base::StatusOr<std::string> Serve(const HttpRequest& request, const ApiRoute& route, std::vector<std::string>* warnings);
  base::StatusOr<std::string> SetConfig(const Principal& principal, const std::string& run, std::string_view body);

  Core* const core_;
  const bool enabled_;
  const std::string disabled_reason_;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_HTTP_API_H_
