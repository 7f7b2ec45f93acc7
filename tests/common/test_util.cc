#include "tests/common/test_util.h"

#include <grpcpp/generic/generic_stub.h>

#include <arpa/inet.h>
#include <google/protobuf/util/json_util.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/stat.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace gac::testing {

ScratchDir::ScratchDir() {
  std::string tmpl = ::testing::TempDir() + "gac-server-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string WriteTestTokens(const ScratchDir& dir) {
  const std::string path = dir.File("tokens");
  WriteFile(path, std::string("# name token rights runs\n") +
                      "writer " + kWriterToken + " write exp-*\n" +
                      "reader " + kReaderToken + " read *\n" +
                      "admin " + kAdminToken + " read,write,admin *\n" +
                      "other " + kOtherToken + " read,write other-*\n");
  chmod(path.c_str(), 0600);  // gacd refuses a token file others can read
  return path;
}

server::ServerConfig TestConfig(const ScratchDir& dir) {
  server::ServerConfig c;
  c.listen = "127.0.0.1:0";
  c.metrics_listen = "";  // tests read Metrics::Render(); the exporter has its own tests
  c.data_dir = dir.path();
  c.token_file = WriteTestTokens(dir);
  c.sync = "normal";
  c.drain_timeout = std::chrono::seconds(2);
  return c;
}

Client::Client(const std::string& address, std::string token, std::shared_ptr<grpc::ChannelCredentials> creds,
               const grpc::ChannelArguments& args)
    : channel_(grpc::CreateCustomChannel(address, creds, args)),
      token_(std::move(token)),
      ingest_(v1::IngestService::NewStub(channel_)),
      control_(v1::ControlService::NewStub(channel_)),
      admin_(v1::AdminService::NewStub(channel_)),
      query_(v1::QueryService::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)) {}

std::unique_ptr<grpc::ClientContext> Client::Context(int deadline_ms) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  return ctx;
}

grpc::Status Client::Ingest(const std::vector<v1::IngestRequest>& batches, std::vector<v1::IngestAck>* acks) {
  auto ctx = Context(30000);
  auto stream = ingest_->Ingest(ctx.get());
  for (const auto& b : batches) {
    if (!stream->Write(b)) break;
  }
  stream->WritesDone();
  v1::IngestAck ack;
  while (stream->Read(&ack)) {
    if (acks != nullptr) acks->push_back(ack);
  }
  return stream->Finish();
}

grpc::Status Client::Decide(const v1::DecideRequest& req, v1::DecideResponse* resp) {
  return control_->Decide(Context().get(), req, resp);
}
grpc::Status Client::SetRunConfig(const v1::SetRunConfigRequest& req, v1::RunConfig* resp) {
  return admin_->SetRunConfig(Context().get(), req, resp);
}
grpc::Status Client::GetRunConfig(const std::string& run, v1::RunConfig* resp) {
  v1::GetRunConfigRequest req;
  req.set_run(run);
  return admin_->GetRunConfig(Context().get(), req, resp);
}
grpc::Status Client::ListRuns(const v1::ListRunsRequest& req, v1::ListRunsResponse* resp) {
  return query_->ListRuns(Context().get(), req, resp);
}
grpc::Status Client::GetSteps(const v1::GetStepsRequest& req, v1::GetStepsResponse* resp) {
  return query_->GetSteps(Context().get(), req, resp);
}
grpc::Status Client::GetRunSummary(const v1::GetRunSummaryRequest& req, v1::RunSummary* resp) {
  return query_->GetRunSummary(Context().get(), req, resp);
}
grpc::Status Client::ListConfigChanges(const v1::ListConfigChangesRequest& req,
                                       v1::ListConfigChangesResponse* resp) {
  return admin_->ListConfigChanges(Context().get(), req, resp);
}
grpc::Status Client::Health(grpc::health::v1::HealthCheckResponse* resp) {
  grpc::health::v1::HealthCheckRequest req;
  return health_->Check(Context().get(), req, resp);
}

grpc::Status Client::AllSteps(const std::string& run, std::vector<v1::StepRecord>* out, bool include_layers) {
  v1::GetStepsRequest req;
  req.set_run(run);
  req.set_include_layers(include_layers);
  // gacd ends a page before it passes 3 MiB, so that even 10,000 records
  // with their layers stay under gRPC's default 4 MiB receive limit.
  req.set_page_size(10000);
  for (;;) {
    v1::GetStepsResponse resp;
    grpc::Status st = GetSteps(req, &resp);
    if (!st.ok()) return st;
    for (auto& s : *resp.mutable_steps()) out->push_back(std::move(s));
    if (resp.next_page_token().empty()) return st;
    req.set_page_token(resp.next_page_token());
  }
}

std::string GacdProcess::Binary() { return GACD_BINARY; }

GacdProcess::~GacdProcess() {
  if (pid_ > 0) Kill();
}

bool GacdProcess::Start(const std::string& ready_file) {
  std::remove(ready_file.c_str());
  log_path_ = ready_file + ".log";
  std::vector<std::string> argv = {Binary()};
  argv.insert(argv.end(), args_.begin(), args_.end());
  argv.push_back("--ready-file=" + ready_file);
  pid_ = SpawnLogged(argv, log_path_, &error_);
  if (pid_ < 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(ready_file);
    if (in) {
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind("grpc=", 0) == 0) address_ = line.substr(5);
        if (line.rfind("http=", 0) == 0) metrics_address_ = line.substr(5);
      }
      if (!address_.empty()) return true;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      error_ = "gacd exited before it was ready: " + Log();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  error_ = "gacd not ready after 30 s: " + Log();
  Kill();
  return false;
}

int GacdProcess::Wait() {
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1000;
}

int GacdProcess::Terminate() {
  if (pid_ <= 0) return -1000;
  kill(pid_, SIGTERM);
  return Wait();
}

void GacdProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  Wait();
}

std::string GacdProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int SpawnLogged(const std::vector<std::string>& argv, const std::string& log_path, std::string* error) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  pid_t pid;
  const int rc = posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    *error = "posix_spawn " + argv[0] + " failed: " + std::to_string(rc);
    return -1;
  }
  return pid;
}

int RunProcess(const std::vector<std::string>& argv, const std::string& input, std::string* output) {
  int in_pipe[2], out_pipe[2];
  if (pipe(in_pipe) != 0 || pipe(out_pipe) != 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_pipe[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 2);
  posix_spawn_file_actions_addclose(&fa, in_pipe[1]);
  posix_spawn_file_actions_addclose(&fa, out_pipe[0]);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawnp(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in_pipe[0]);
  close(out_pipe[1]);
  if (rc != 0) {
    close(in_pipe[1]);
    close(out_pipe[0]);
    return -1;
  }
  std::thread writer([&] {
    std::size_t off = 0;
    while (off < input.size()) {
      const ssize_t n = write(in_pipe[1], input.data() + off, input.size() - off);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    close(in_pipe[1]);
  });
  char buf[4096];
  for (ssize_t n; (n = read(out_pipe[0], buf, sizeof buf)) > 0;) output->append(buf, static_cast<std::size_t>(n));
  close(out_pipe[0]);
  writer.join();
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

grpc::Status RawUnary(const std::string& address, const std::string& method, const std::string& bytes) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminToken);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer req(&slice, 1), resp;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status result;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status st) {
    std::lock_guard lock(mu);
    result = st;
    done = true;
    cv.notify_one();
  });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  return result;
}

grpc::Status RawIngest(const std::string& address, const std::string& bytes) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.AddMetadata("authorization", std::string("Bearer ") + kAdminToken);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, "/gac.v1.IngestService/Ingest", &cq);
  void* tag;
  bool ok;
  auto step = [&](void* t) {
    cq.Next(&tag, &ok);
    EXPECT_EQ(tag, t);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  step(reinterpret_cast<void*>(1));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer msg(&slice, 1);
  call->Write(msg, reinterpret_cast<void*>(2));
  step(reinterpret_cast<void*>(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  step(reinterpret_cast<void*>(3));
  // Read the acks (if the batch was good) until the server ends the stream.
  for (grpc::ByteBuffer ack;;) {
    call->Read(&ack, reinterpret_cast<void*>(5));
    if (!step(reinterpret_cast<void*>(5))) break;
  }
  grpc::Status st;
  call->Finish(&st, reinterpret_cast<void*>(4));
  step(reinterpret_cast<void*>(4));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return st;
}

std::string HttpReply::Header(const std::string& name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return "";
}

std::optional<HttpReply> HttpFetch(const std::string& host_port, const std::string& method, const std::string& path,
                                   const std::vector<std::string>& headers, const std::string& body) {
  const auto colon = host_port.rfind(':');
  const std::string host = host_port.substr(0, colon);
  const int port = std::atoi(host_port.c_str() + colon + 1);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return std::nullopt;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + host_port + "\r\nConnection: close\r\n";
  for (const std::string& h : headers) req += h + "\r\n";
  if (!body.empty() || method == "PUT" || method == "POST") req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  for (std::size_t sent = 0; sent < req.size();) {
    const ssize_t n = write(fd, req.data() + sent, req.size() - sent);
    if (n <= 0) break;  // the server may answer (413) before reading everything
    sent += static_cast<std::size_t>(n);
  }
  std::string resp;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) resp.append(buf, static_cast<std::size_t>(n));
  close(fd);
  const auto end = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.", 0) != 0 || end == std::string::npos || resp.size() < 12) return std::nullopt;
  HttpReply reply;
  reply.status = std::atoi(resp.c_str() + 9);
  std::istringstream lines(resp.substr(0, end));
  std::string line;
  std::getline(lines, line);  // the status line
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto sep = line.find(':');
    if (sep == std::string::npos) continue;
    std::string name = line.substr(0, sep);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::size_t value = sep + 1;
    while (value < line.size() && line[value] == ' ') ++value;
    reply.headers.emplace_back(std::move(name), line.substr(value));
  }
  reply.body = resp.substr(end + 4);
  return reply;
}

google::protobuf::Value ParseJson(const std::string& text) {
  google::protobuf::Value v;
  const auto st = google::protobuf::util::JsonStringToMessage(text, &v);
  EXPECT_TRUE(st.ok()) << st.message() << " in " << text.substr(0, 500);
  return v;
}

const google::protobuf::Value& JsonMember(const google::protobuf::Value& v, const std::string& key) {
  static const google::protobuf::Value kMissing;
  if (v.kind_case() != google::protobuf::Value::kStructValue) return kMissing;
  auto it = v.struct_value().fields().find(key);
  return it == v.struct_value().fields().end() ? kMissing : it->second;
}

std::optional<std::string> HttpGet(const std::string& host_port, const std::string& path) {
  std::optional<HttpReply> reply = HttpFetch(host_port, "GET", path);
  if (!reply.has_value() || reply->status != 200) return std::nullopt;
  return std::move(reply->body);
}

v1::StepRecord MakeStep(const std::string& run, std::int64_t step, double cosine, std::uint32_t rank,
                        std::uint32_t world) {
  v1::StepRecord r;
  r.set_run(run);
  r.set_rank(rank);
  r.set_world_size(world);
  r.set_step(step);
  if (!std::isnan(cosine)) r.set_cosine(cosine);
  r.set_grad_norm(1.0);
  r.set_ref_norm(1.0);
  r.set_regime(v1::REGIME_SAFE);
  r.set_alpha(1.0);
  r.set_mode(v1::CONTROL_MODE_LOCAL);
  return r;
}

v1::IngestRequest MakeBatch(std::uint64_t sequence, std::vector<v1::StepRecord> records) {
  v1::IngestRequest b;
  b.set_sequence(sequence);
  for (auto& r : records) *b.add_records() = std::move(r);
  return b;
}

}  // namespace gac::testing
