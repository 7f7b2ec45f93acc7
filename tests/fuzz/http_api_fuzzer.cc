// gacd's HTTP API after the bytes arrive (server/src/http/api.h): the first
// byte picks the path router, the query strings of /runs, /runs/{run} and
// /runs/{run}/steps, the JSON body of PUT /runs/{run}/config, or the JSON
// writer that every answer goes through. Properties: errors are the
// documented codes; a route names a valid run id and a method; parsed
// parameters are within their limits and accepted by the gRPC method's own
// check; a config body that parses has thresholds and a mode; text written
// by the JSON writer is read back by Protobuf's JSON parser (an independent
// reader) as the same string whenever the input was ASCII.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <cstdint>
#include <string>

#include "server/src/http/api.h"
#include "server/src/http/json.h"
#include "server/src/queries.h"
#include "server/src/validate.h"
#include "tests/fuzz/fuzz_util.h"

namespace gac::fuzz {
namespace {

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// `json` parses as a JSON string value; returns it.
std::string ReadJsonString(const std::string& json) {
  google::protobuf::Value v;
  const auto st = google::protobuf::util::JsonStringToMessage(json, &v);
  GAC_FUZZ_CHECK(st.ok(), "writer output is JSON: " + std::string(st.message()) + " in " + json);
  GAC_FUZZ_CHECK(v.kind_case() == google::protobuf::Value::kStringValue, "a JSON string: " + json);
  return v.string_value();
}

void CheckParams(const base::Status& status) {
  GAC_FUZZ_CHECK(status.IsInvalidArgument(), status.ToString());
}

}  // namespace
}  // namespace gac::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  fuzz::Input in(data, size);
  const std::uint8_t kind = in.Byte() % 6;
  if (kind == 0) {  // the router: a method, then the path
    static const char* kMethods[] = {"GET", "PUT", "POST", "DELETE"};
    const char* method = kMethods[in.Byte() % 4];
    const std::string path(in.Rest());
    base::StatusOr<server::ApiRoute> route = server::ParseApiRoute(method, path);
    if (!route.ok()) {
      const base::Status& s = route.status();
      GAC_FUZZ_CHECK(s.IsNotFound() || s.IsInvalidArgument() || s.IsUnimplemented(), s.ToString());
      return 0;
    }
    GAC_FUZZ_CHECK(route->method != nullptr, path);
    if (route->kind == server::ApiRoute::kRuns || route->kind == server::ApiRoute::kFields) {
      GAC_FUZZ_CHECK(route->run.empty(), path);
    } else {
      GAC_FUZZ_CHECK(server::ValidateRunId(route->run).ok(), "a valid run id: " + route->run);
      GAC_FUZZ_CHECK(path.size() > route->run.size() && path.find(route->run) != std::string::npos,
                     "the run comes from the path");
    }
    GAC_FUZZ_CHECK(std::string(method) == "GET" || route->kind == server::ApiRoute::kConfig,
                   "only config takes another method than GET");
    return 0;
  }
  if (kind == 1) {  // GET /api/v1/runs?...
    base::StatusOr<v1::ListRunsRequest> req = server::ParseRunsParams(in.Rest());
    if (!req.ok()) {
      fuzz::CheckParams(req.status());
      return 0;
    }
    GAC_FUZZ_CHECK(req->page_size() <= server::kRunPages.max_size, "page size within the maximum");
    GAC_FUZZ_CHECK(server::DecodeRunToken(req->page_token()).ok(), "page token decodes");
    return 0;
  }
  if (kind == 2) {  // GET /api/v1/runs/{run}?window=
    base::StatusOr<v1::GetRunSummaryRequest> req = server::ParseSummaryParams("exp-1", in.Rest());
    if (!req.ok()) fuzz::CheckParams(req.status());
    return 0;
  }
  if (kind == 3) {  // GET /api/v1/runs/{run}/steps?...
    base::StatusOr<v1::GetStepsRequest> req = server::ParseStepsParams("exp-1", in.Rest());
    if (!req.ok()) {
      fuzz::CheckParams(req.status());
      return 0;
    }
    GAC_FUZZ_CHECK(req->page_size() <= server::kStepPages.max_size, "page size within the maximum");
    GAC_FUZZ_CHECK(req->start_step() >= 0 && req->end_step() >= 0, "steps are not negative");
    GAC_FUZZ_CHECK(server::StepQueryFromRequest(*req).ok(), "GetSteps takes what the API accepted");
    return 0;
  }
  if (kind == 4) {  // PUT /api/v1/runs/{run}/config with a JSON body
    base::StatusOr<v1::SetRunConfigRequest> req = server::ParseConfigBody("exp-1", in.Rest());
    if (!req.ok()) {
      fuzz::CheckParams(req.status());
      return 0;
    }
    GAC_FUZZ_CHECK(req->has_thresholds(), "thresholds are required");
    GAC_FUZZ_CHECK(req->mode() != v1::CONTROL_MODE_UNSPECIFIED, "mode is required");
    // The reason is stored and written back in JSON answers and the audit log.
    GAC_FUZZ_CHECK(fuzz::ReadJsonString(server::JsonQuote(req->reason())) == req->reason(),
                   "the reason reads back");
    return 0;
  }
  // The JSON writer: any bytes (an error message quoting a client's input).
  const std::string text(in.Rest());
  const std::string back = fuzz::ReadJsonString(server::JsonQuote(text));
  if (fuzz::IsAscii(text)) GAC_FUZZ_CHECK(back == text, "ASCII reads back unchanged");
  const std::string error = server::EncodeError(base::Status::InvalidArgument(text));
  google::protobuf::Value v;
  GAC_FUZZ_CHECK(google::protobuf::util::JsonStringToMessage(error, &v).ok(), "an error body is JSON: " + error);
  return 0;
}
