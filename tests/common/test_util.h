// Helpers shared by the server tests: scratch directories, gacd started
// in-process or as a real process on OS-chosen loopback ports, a gRPC client
// with the generated stubs, plain HTTP GET for /metrics, and record builders.

#ifndef GAC_TESTS_COMMON_TEST_UTIL_H_
#define GAC_TESTS_COMMON_TEST_UTIL_H_

#include <google/protobuf/struct.pb.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gac/server/config.h"
#include "gac/server/server.h"
#include "gac/v1/control.grpc.pb.h"
#include "gac/v1/query.grpc.pb.h"
#include "gac/v1/telemetry.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace gac::testing {

// A fresh directory under the test temp dir, removed (recursively) on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::string& text);
std::string ReadFileOrDie(const std::string& path);

// Tokens of the standard test token file (see WriteTestTokens).
inline constexpr const char* kWriterToken = "writer-token-0123456789";    // write on exp-*
inline constexpr const char* kReaderToken = "reader-token-0123456789";    // read on *
inline constexpr const char* kAdminToken = "admin-token-00123456789";     // read,write,admin on *
inline constexpr const char* kOtherToken = "other-token-00123456789";     // read,write on other-*
// Writes a token file with the four principals above; returns its path.
std::string WriteTestTokens(const ScratchDir& dir);

// A configuration for tests: ports chosen by the OS, tokens from `dir`,
// database in `dir`.
server::ServerConfig TestConfig(const ScratchDir& dir);

// A client of one gacd address, sending `token` (empty: none).
class Client {
 public:
  Client(const std::string& address, std::string token,
         std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials(),
         const grpc::ChannelArguments& args = {});

  std::unique_ptr<grpc::ClientContext> Context(int deadline_ms = 10000) const;

  // Sends the batches on one stream and reads an ack per batch (until the
  // stream ends). Returns the final status; `acks` receives the acks.
  grpc::Status Ingest(const std::vector<v1::IngestRequest>& batches, std::vector<v1::IngestAck>* acks = nullptr);

  grpc::Status Decide(const v1::DecideRequest& req, v1::DecideResponse* resp);
  grpc::Status SetRunConfig(const v1::SetRunConfigRequest& req, v1::RunConfig* resp);
  grpc::Status GetRunConfig(const std::string& run, v1::RunConfig* resp);
  grpc::Status ListRuns(const v1::ListRunsRequest& req, v1::ListRunsResponse* resp);
  grpc::Status GetSteps(const v1::GetStepsRequest& req, v1::GetStepsResponse* resp);
  grpc::Status GetRunSummary(const v1::GetRunSummaryRequest& req, v1::RunSummary* resp);
  grpc::Status ListConfigChanges(const v1::ListConfigChangesRequest& req, v1::ListConfigChangesResponse* resp);
  grpc::Status Health(grpc::health::v1::HealthCheckResponse* resp);

  // Every stored step of a run (all pages), or the error.
  grpc::Status AllSteps(const std::string& run, std::vector<v1::StepRecord>* out, bool include_layers = false);

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  v1::IngestService::Stub& ingest() { return *ingest_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::string token_;
  std::unique_ptr<v1::IngestService::Stub> ingest_;
  std::unique_ptr<v1::ControlService::Stub> control_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<v1::QueryService::Stub> query_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

// A real gacd process. Start() spawns build's gacd binary with `args` plus
// --ready-file, and waits for the ready file (or the process to die).
class GacdProcess {
 public:
  // Path of the gacd binary (from the GACD_BINARY compile definition).
  static std::string Binary();

  explicit GacdProcess(std::vector<std::string> args) : args_(std::move(args)) {}
  ~GacdProcess();  // SIGKILL if still running

  // Returns false (and fills error()) if gacd exited before it was ready.
  bool Start(const std::string& ready_file);
  // SIGTERM, then waits; returns the exit status (or -signal).
  int Terminate();
  // SIGKILL, then waits.
  void Kill();
  bool running() const { return pid_ > 0; }
  int pid() const { return pid_; }

  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& error() const { return error_; }
  // Everything gacd wrote to stderr so far.
  std::string Log() const;

 private:
  int Wait();
  std::vector<std::string> args_;
  int pid_ = -1;
  std::string log_path_;
  std::string address_, metrics_address_, error_;
};

// Starts `argv` (argv[0] a path) with stdout and stderr appended to
// `log_path`; returns its pid, or -1 with `error` filled.
int SpawnLogged(const std::vector<std::string>& argv, const std::string& log_path, std::string* error);

// Runs `argv` to completion with `input` on stdin; returns its exit status
// and fills `output` with stdout and stderr together.
int RunProcess(const std::vector<std::string>& argv, const std::string& input, std::string* output);

// Raw bytes as the request of unary `method` ("/gac.v1.ControlService/Decide"),
// or as the one message of an Ingest stream (reading acks until it ends),
// with the admin token; the call's status.
grpc::Status RawUnary(const std::string& address, const std::string& method, const std::string& bytes);
grpc::Status RawIngest(const std::string& address, const std::string& bytes);

// An HTTP exchange's answer: status, headers (names lower-cased) and body.
struct HttpReply {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // The value of header `name` (lower case), or "".
  std::string Header(const std::string& name) const;
};

// One plain HTTP/1.1 request ("Connection: close") to host:port (IPv4 or
// localhost) with `headers` ("Name: value" lines) and `body`; nullopt when
// the connection fails or the answer is not HTTP. The body is read up to
// the end of the connection.
std::optional<HttpReply> HttpFetch(const std::string& host_port, const std::string& method, const std::string& path,
                                   const std::vector<std::string>& headers = {}, const std::string& body = "");

// `text` read by protobuf's JSON parser (a reader independent of gacd's own
// JSON writer); text that does not parse fails the test.
google::protobuf::Value ParseJson(const std::string& text);
// The member `key` of a JSON object; an empty Value (KIND_NOT_SET) when `v`
// is not an object or has no such member.
const google::protobuf::Value& JsonMember(const google::protobuf::Value& v, const std::string& key);

// Plain HTTP GET; returns the body of a 200 answer, or nullopt.
std::optional<std::string> HttpGet(const std::string& host_port, const std::string& path);

// A valid step record: regime SAFE, cosine c (absent if NaN), norms 1.
v1::StepRecord MakeStep(const std::string& run, std::int64_t step, double cosine = 0.01,
                        std::uint32_t rank = 0, std::uint32_t world = 1);
v1::IngestRequest MakeBatch(std::uint64_t sequence, std::vector<v1::StepRecord> records);

}  // namespace gac::testing

#endif  // GAC_TESTS_COMMON_TEST_UTIL_H_
