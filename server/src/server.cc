#include "gac/server/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <sys/stat.h>
#include <thread>
#include <unordered_set>
#include <vector>

#include "gac/controller/calibration.h"
#include "gac/server/auth.h"
#include "gac/server/metrics.h"
#include "gac/server/registry.h"
#include "gac/server/validate.h"
#include "gac/server/writer.h"
#include "gac/v1/control.grpc.pb.h"
#include "gac/v1/query.grpc.pb.h"
#include "gac/v1/telemetry.grpc.pb.h"

namespace gac::server {
namespace {

using Clock = std::chrono::system_clock;

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// A small fixed pool for the calls that read the store, so callback threads
// never block on the disk.
class Executor {
 public:
  explicit Executor(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~Executor() { Stop(); }
  void Post(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // Runs what is queued, then joins.
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

class IngestReactor;

// State shared by every service.
struct Core {
  ServerConfig config;
  Limits limits;
  Authenticator auth = Authenticator::Insecure();
  std::unique_ptr<Store> store;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<RunRegistry> registry;
  std::unique_ptr<Writer> writer;
  std::unique_ptr<Executor> executor;

  std::mutex streams_mu;
  std::condition_variable calls_cv;
  std::set<IngestReactor*> streams;  // guarded by streams_mu
  bool draining = false;             // guarded by streams_mu
  // Calls that have not called Finish yet: unary calls and registered
  // streams. Shutdown waits for them (up to the drain time) before it cuts
  // the rest off. Guarded by streams_mu.
  int open_calls = 0;

  void CallStarted() {
    std::lock_guard lock(streams_mu);
    ++open_calls;
  }
  void CallFinished() {
    std::lock_guard lock(streams_mu);
    if (--open_calls == 0) calls_cv.notify_all();
  }
  void Finish(grpc::ServerUnaryReactor* reactor, const grpc::Status& status) {
    reactor->Finish(status);
    CallFinished();
  }
  // Waits until no call is open or the deadline passes.
  void WaitForCalls(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(streams_mu);
    calls_cv.wait_until(lock, deadline, [this] { return open_calls == 0; });
  }

  StatusOr<const Principal*> Authenticate(grpc::CallbackServerContext* ctx) const {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    std::string_view value;
    if (it != md.end()) value = std::string_view(it->second.data(), it->second.size());
    return auth.Authenticate(value);
  }

  // Authenticates and authorises one call on `run`.
  StatusOr<const Principal*> Check(grpc::CallbackServerContext* ctx, Right right, const std::string& run) const {
    StatusOr<const Principal*> p = Authenticate(ctx);
    if (!p.ok()) return p;
    Status st = Authenticator::Authorize(**p, right, run);
    if (!st.ok()) return st;
    return p;
  }

  grpc::Status Fail(const char* method, const Status& st) {
    metrics->ObserveRpcError(method, StatusCodeName(st.code()));
    return ToGrpc(st);
  }

  bool AddStream(IngestReactor* r) {
    std::lock_guard lock(streams_mu);
    if (draining) return false;
    streams.insert(r);
    ++open_calls;
    return true;
  }
  void RemoveStream(IngestReactor* r) {
    std::lock_guard lock(streams_mu);
    streams.erase(r);
  }
  void DrainStreams();

  // After a batch committed: metrics of its newly stored records.
  void ObserveCommitted(const v1::IngestRequest& req, const WriteOp& op) {
    std::uint64_t layer_rows = 0;
    const auto now = Clock::now();
    // Records are observed only when the whole batch is new: a replayed batch
    // must not count twice. A partly replayed batch (re-batched after a
    // reconnect) leaves its counters short by the overlap, never over.
    const bool all_new = op.duplicates == 0;
    std::string last_run;
    for (const v1::StepRecord& r : req.records()) {
      if (r.run() != last_run) {
        metrics->ObserveConfig(r.run(), registry->Get(r.run()), now);
        last_run = r.run();
      }
      if (all_new) {
        metrics->ObserveStep(r, now);
        layer_rows += static_cast<std::uint64_t>(r.layers_size());
      }
    }
    metrics->ObserveIngest(op.stored, layer_rows, op.duplicates);
  }
};

// One ingest stream. Reactions decide under mu_ what to start next and start
// it after releasing mu_ (gRPC may run a reaction inline in the starting
// thread). The reactor finishes only when no write op is pending, so
// OnDone never races with a writer callback.
class IngestReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static constexpr int kMaxInflight = 64;  // batches per stream awaiting commit

  IngestReactor(Core* core, grpc::CallbackServerContext* ctx) : core_(core) {
    StatusOr<const Principal*> p = core_->Authenticate(ctx);
    if (!p.ok()) {
      finished_ = true;
      Finish(core_->Fail("Ingest", p.status()));
      return;
    }
    principal_ = *p;
    if (!core_->AddStream(this)) {
      finished_ = true;
      Finish(ToGrpc(Status::Unavailable("gacd is shutting down")));
      return;
    }
    registered_ = true;
    reading_ = true;
    StartRead(&raw_request_);
  }

  void OnReadDone(bool ok) override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      reading_ = false;
      if (!ok) {
        reading_done_ = true;
      } else if (!reading_done_) {
        const Status st = Accept();
        if (!st.ok()) {
          error_ = st;
          core_->metrics->ObserveRpcError("Ingest", StatusCodeName(st.code()));
          reading_done_ = true;
        }
      }
      Decide(a);
    }
    Run(a);
  }

  void OnWriteDone(bool ok) override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      if (!ok) {  // the client went away: nothing more can be acknowledged
        acks_.clear();
        client_gone_ = true;
        reading_done_ = true;
      }
      Decide(a);
    }
    Run(a);
  }

  void OnDone() override {
    if (registered_) core_->RemoveStream(this);
    { std::lock_guard lock(mu_); }  // the last Run() released mu_ before Finish
    delete this;
  }

  struct Actions {
    bool read = false;
    bool write = false;
    bool finish = false;
  };

  // Stops reading; the stream ends with UNAVAILABLE once pending batches are
  // acknowledged. The caller must pass the result to Run() after releasing
  // the streams lock (the reactor stays alive until then: it cannot finish
  // before the chosen operations are started).
  Actions BeginDrain() {
    std::lock_guard lock(mu_);
    if (!reading_done_) {
      reading_done_ = true;
      error_ = Status::Unavailable("gacd is shutting down; resend unacknowledged batches after reconnecting");
    }
    Actions a;
    Decide(a);
    return a;
  }

  void Run(const Actions& a) {
    // After Finish the reactor may be deleted at any moment: start it last.
    if (a.write) StartWrite(&raw_ack_);
    if (a.read) StartRead(&raw_request_);
    if (a.finish) {
      const bool registered = registered_;
      Core* core = core_;
      Finish(ToGrpc(pending_finish_status_));
      if (registered) core->CallFinished();
    }
  }

 private:

  // REQUIRES: mu_ held; raw_request_ holds a new batch. Validates it and
  // hands it to the writer; an error ends the stream.
  Status Accept() {
    // Parsed here rather than by gRPC, so a malformed message gets a clear
    // INVALID_ARGUMENT instead of a bare stream failure.
    if (!grpc::SerializationTraits<v1::IngestRequest>::Deserialize(&raw_request_, &request_).ok()) {
      return Status::InvalidArgument("malformed IngestRequest: not a valid gac.v1.IngestRequest message");
    }
    Status st = CheckBatch();
    if (!st.ok()) return st;
    auto req = std::make_shared<v1::IngestRequest>(std::move(request_));
    request_.Clear();
    last_sequence_ = req->sequence();
    std::size_t rows = 0;
    for (const auto& r : req->records()) rows += 1 + static_cast<std::size_t>(r.layers_size());
    WriteOp op;
    op.steps = req.get();
    op.received_ns = NowNs();
    st = core_->writer->Submit(op, rows, [this, req](const Status& s, const WriteOp& done) {
      OnCommitted(*req, s, done);
    });
    if (st.ok()) ++inflight_;
    return st;
  }

  Status CheckBatch() {
    if (request_.sequence() == 0) return Status::InvalidArgument("sequence must be >= 1");
    if (request_.sequence() <= last_sequence_) {
      return Status::OutOfRange("sequence " + std::to_string(request_.sequence()) +
                                " is not above the previous " + std::to_string(last_sequence_) +
                                " on this stream");
    }
    Status st = ValidateIngestRequest(request_, core_->limits);
    if (!st.ok()) return st;
    const std::string* allowed = nullptr;
    for (const v1::StepRecord& r : request_.records()) {
      if (allowed != nullptr && *allowed == r.run()) continue;
      st = Authenticator::Authorize(*principal_, kWrite, r.run());
      if (!st.ok()) return st;
      allowed = &r.run();
    }
    return Status::Ok();
  }

  // Runs on the writer thread.
  void OnCommitted(const v1::IngestRequest& req, const Status& s, const WriteOp& op) {
    if (s.ok()) core_->ObserveCommitted(req, op);
    Actions a;
    {
      std::lock_guard lock(mu_);
      --inflight_;
      if (!s.ok()) {
        if (error_.ok()) error_ = Status::Unavailable("store write failed: " + s.message());
        reading_done_ = true;
      } else if (!client_gone_) {
        v1::IngestAck ack;
        ack.set_sequence(req.sequence());
        ack.set_stored(op.stored);
        ack.set_duplicates(op.duplicates);
        acks_.push_back(ack);
      }
      Decide(a);
    }
    Run(a);
  }

  // REQUIRES: mu_ held. Chooses the next operations.
  void Decide(Actions& a) {
    if (finished_) return;
    if (!writing_ && !acks_.empty()) {
      bool own_buffer = false;
      grpc::SerializationTraits<v1::IngestAck>::Serialize(acks_.front(), &raw_ack_, &own_buffer);
      acks_.pop_front();
      writing_ = true;
      a.write = true;
    }
    if (!reading_ && !reading_done_ && inflight_ < kMaxInflight) {
      reading_ = true;
      a.read = true;
    }
    if (reading_done_ && inflight_ == 0 && !writing_ && acks_.empty()) {
      finished_ = true;
      a.finish = true;
      pending_finish_status_ = error_;
    }
  }

  Core* const core_;
  const Principal* principal_ = nullptr;
  bool registered_ = false;

  std::mutex mu_;
  grpc::ByteBuffer raw_request_;  // the read buffer (guarded by reading_)
  v1::IngestRequest request_;     // raw_request_ parsed
  grpc::ByteBuffer raw_ack_;      // the write buffer (guarded by writing_)
  std::deque<v1::IngestAck> acks_;  // committed, not yet written
  std::uint64_t last_sequence_ = 0;
  int inflight_ = 0;            // submitted, not yet committed
  bool reading_ = false;
  bool writing_ = false;
  bool reading_done_ = false;   // no more batches will be accepted
  bool client_gone_ = false;     // a write failed
  bool finished_ = false;
  Status error_;                // the final status
  Status pending_finish_status_;
};

void Core::DrainStreams() {
  std::vector<std::pair<IngestReactor*, IngestReactor::Actions>> started;
  {
    std::lock_guard lock(streams_mu);
    draining = true;
    for (IngestReactor* r : streams) started.emplace_back(r, r->BeginDrain());
  }
  for (auto& [r, actions] : started) r->Run(actions);
}

// Ingest and Decide take raw bytes and parse them themselves (see Accept).
class IngestServiceImpl final
    : public v1::IngestService::WithRawCallbackMethod_Ingest<v1::IngestService::Service> {
 public:
  explicit IngestServiceImpl(Core* core) : core_(core) {}
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Ingest(grpc::CallbackServerContext* ctx) override {
    return new IngestReactor(core_, ctx);
  }

 private:
  Core* const core_;
};

class ControlServiceImpl final
    : public v1::ControlService::WithRawCallbackMethod_Decide<v1::ControlService::Service> {
 public:
  explicit ControlServiceImpl(Core* core) : core_(core) {}

  grpc::ServerUnaryReactor* Decide(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw_req,
                                   grpc::ByteBuffer* raw_resp) override {
    const auto start = std::chrono::steady_clock::now();
    auto* reactor = ctx->DefaultReactor();
    core_->CallStarted();
    v1::DecideRequest request;
    v1::DecideResponse response;
    v1::DecideRequest* req = &request;
    v1::DecideResponse* resp = &response;
    Status st;
    if (!grpc::SerializationTraits<v1::DecideRequest>::Deserialize(const_cast<grpc::ByteBuffer*>(raw_req), req).ok()) {
      st = Status::InvalidArgument("malformed DecideRequest: not a valid gac.v1.DecideRequest message");
    }
    if (st.ok()) st = ValidateDecideRequest(*req);
    if (st.ok()) st = core_->Check(ctx, kWrite, req->run()).status();
    if (!st.ok()) {
      core_->Finish(reactor, core_->Fail("Decide", st));
      return reactor;
    }
    AlignmentStats stats{req->dot(), req->grad_sq(), req->ref_sq(), req->has_reference()};
    const Decision d = core_->registry->Decide(req->run(), stats, resp->mutable_config());
    resp->set_regime(RegimeToProto(d.regime));
    if (d.cosine) resp->set_cosine(*d.cosine);
    if (d.cosine_after) resp->set_cosine_after(*d.cosine_after);
    resp->set_alpha(d.alpha);
    resp->set_projection_coeff(d.projection_coeff);
    resp->set_apply_update(d.apply_update);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    core_->metrics->ObserveDecide(req->run(), resp->regime(), seconds, Clock::now());
    bool own_buffer = false;
    grpc::SerializationTraits<v1::DecideResponse>::Serialize(*resp, raw_resp, &own_buffer);
    core_->Finish(reactor, grpc::Status::OK);
    return reactor;
  }

 private:
  Core* const core_;
};

std::string EncodeOffsetToken(std::uint64_t offset) { return "o" + std::to_string(offset); }

StatusOr<std::uint64_t> DecodeOffsetToken(const std::string& token) {
  if (token.empty()) return std::uint64_t{0};
  if (token.size() < 2 || token[0] != 'o' || token.find_first_not_of("0123456789", 1) != std::string::npos ||
      token.size() > 21) {
    return Status::InvalidArgument("malformed page_token");
  }
  return std::stoull(token.substr(1));
}

StatusOr<std::uint32_t> PageSize(std::uint32_t requested, std::uint32_t dflt, std::uint32_t max) {
  if (requested == 0) return dflt;
  if (requested > max) {
    return Status::InvalidArgument("page_size " + std::to_string(requested) + " above the maximum " +
                                   std::to_string(max));
  }
  return requested;
}

class AdminServiceImpl final : public v1::AdminService::CallbackService {
 public:
  explicit AdminServiceImpl(Core* core) : core_(core) {}

  grpc::ServerUnaryReactor* GetRunConfig(grpc::CallbackServerContext* ctx, const v1::GetRunConfigRequest* req,
                                         v1::RunConfig* resp) override {
    auto* reactor = ctx->DefaultReactor();
    core_->CallStarted();
    Status st = ValidateRunId(req->run());
    if (st.ok()) st = core_->Check(ctx, kRead, req->run()).status();
    if (!st.ok()) {
      core_->Finish(reactor, core_->Fail("GetRunConfig", st));
      return reactor;
    }
    *resp = core_->registry->Get(req->run());
    core_->Finish(reactor, grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* SetRunConfig(grpc::CallbackServerContext* ctx, const v1::SetRunConfigRequest* req,
                                         v1::RunConfig* resp) override {
    auto* reactor = ctx->DefaultReactor();
    core_->CallStarted();
    Status st = ValidateRunId(req->run());
    StatusOr<const Principal*> p = core_->Check(ctx, kAdmin, req->run());
    if (st.ok()) st = p.status();
    if (st.ok() && !req->has_thresholds()) st = Status::InvalidArgument("thresholds are required");
    if (st.ok() && req->reason().size() > core_->limits.max_reason_bytes) {
      st = Status::InvalidArgument("reason longer than " + std::to_string(core_->limits.max_reason_bytes) + " bytes");
    }
    if (!st.ok()) {
      core_->Finish(reactor, core_->Fail("SetRunConfig", st));
      return reactor;
    }
    // The whole change is serialised through the registry; the write that
    // makes it durable goes through the writer (the callback thread never
    // waits on the disk), and the reply is sent once it is committed.
    auto write = std::make_shared<ConfigWrite>();
    write->run = req->run();
    StatusOr<v1::RunConfig> next = core_->registry->Change(req->run(), req->thresholds(), req->mode(),
                                                           req->expected_version(), (*p)->name, NowNs(),
                                                           write->change.mutable_before());
    if (!next.ok()) {
      core_->Finish(reactor, core_->Fail("SetRunConfig", next.status()));
      return reactor;
    }
    write->config = *next;
    *write->change.mutable_after() = *next;
    write->change.set_reason(req->reason());
    WriteOp op;
    op.config = write.get();
    op.received_ns = NowNs();
    Core* core = core_;
    st = core_->writer->Submit(op, 1, [core, write, reactor, resp](const Status& s, const WriteOp&) {
      if (!s.ok()) {
        core->registry->Revert(write->run, write->config, write->change.before());
        core->Finish(reactor, core->Fail("SetRunConfig", Status::Unavailable("settings not stored: " + s.message())));
        return;
      }
      core->metrics->ObserveConfig(write->run, write->config, Clock::now());
      *resp = write->config;
      core->Finish(reactor, grpc::Status::OK);
    });
    if (!st.ok()) {
      core_->registry->Revert(write->run, write->config, write->change.before());
      core_->Finish(reactor, core_->Fail("SetRunConfig", st));
    }
    return reactor;
  }

  grpc::ServerUnaryReactor* ListConfigChanges(grpc::CallbackServerContext* ctx,
                                              const v1::ListConfigChangesRequest* req,
                                              v1::ListConfigChangesResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    core_->CallStarted();
    Status st = ValidateRunId(req->run());
    if (st.ok()) st = core_->Check(ctx, kRead, req->run()).status();
    StatusOr<std::uint64_t> offset = DecodeOffsetToken(req->page_token());
    StatusOr<std::uint32_t> size = PageSize(req->page_size(), 100, 1000);
    if (st.ok()) st = offset.status();
    if (st.ok()) st = size.status();
    if (!st.ok()) {
      core_->Finish(reactor, core_->Fail("ListConfigChanges", st));
      return reactor;
    }
    Core* core = core_;
    const std::string run = req->run();
    const std::uint64_t off = *offset;
    const std::uint32_t limit = *size;
    core_->executor->Post([core, run, off, limit, reactor, resp] {
      auto changes = core->store->ListConfigChanges(run, off, limit + 1);
      if (!changes.ok()) {
        core->Finish(reactor, core->Fail("ListConfigChanges", changes.status()));
        return;
      }
      for (std::size_t i = 0; i < changes->size() && i < limit; ++i) *resp->add_changes() = (*changes)[i];
      if (changes->size() > limit) resp->set_next_page_token(EncodeOffsetToken(off + limit));
      core->Finish(reactor, grpc::Status::OK);
    });
    return reactor;
  }

 private:
  Core* const core_;
};

// Page token of GetSteps: "s<step>.<rank>" of the last record returned.
std::string EncodeStepToken(std::int64_t step, std::uint32_t rank) {
  return "s" + std::to_string(step) + "." + std::to_string(rank);
}

StatusOr<std::pair<std::int64_t, std::uint32_t>> DecodeStepToken(const std::string& token) {
  const auto dot = token.find('.');
  if (token.size() < 4 || token[0] != 's' || dot == std::string::npos ||
      token.find_first_not_of("0123456789.", 1) != std::string::npos || token.size() > 32) {
    return Status::InvalidArgument("malformed page_token");
  }
  try {
    return std::make_pair(static_cast<std::int64_t>(std::stoll(token.substr(1, dot - 1))),
                          static_cast<std::uint32_t>(std::stoul(token.substr(dot + 1))));
  } catch (const std::exception&) {
    return Status::InvalidArgument("malformed page_token");
  }
}

class QueryServiceImpl final : public v1::QueryService::CallbackService {
 public:
  explicit QueryServiceImpl(Core* core) : core_(core) {}

  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx, const v1::ListRunsRequest* req,
                                     v1::ListRunsResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    core_->CallStarted();
    StatusOr<const Principal*> p = core_->Authenticate(ctx);
    StatusOr<std::uint32_t> size = PageSize(req->page_size(), 100, 1000);
    Status st = p.status();
    if (st.ok()) st = size.status();
    std::string after;
    if (st.ok() && !req->page_token().empty()) {
      if (req->page_token()[0] != 'r' || !ValidateRunId(req->page_token().substr(1)).ok()) {
        st = Status::InvalidArgument("malformed page_token");
      } else {
        after = req->page_token().substr(1);
      }
    }
    if (!st.ok()) {
      core_->Finish(reactor, core_->Fail("ListRuns", st));
      return reactor;
    }
    Core* core = core_;
    const Principal* principal = *p;
    const std::uint32_t limit = *size;
    core_->executor->Post([core, principal, after, limit, reactor, resp]() mutable {
      // Runs the token may not read are skipped, so scan in chunks.
      for (;;) {
        auto runs = core->store->ListRuns(after, limit);
        if (!runs.ok()) {
          core->Finish(reactor, core->Fail("ListRuns", runs.status()));
          return;
        }
        for (v1::RunInfo& info : *runs) {
          after = info.run();
          if (!principal->Allows(kRead, info.run())) continue;
          *info.mutable_config() = core->registry->Get(info.run());
          *resp->add_runs() = std::move(info);
          if (static_cast<std::uint32_t>(resp->runs_size()) == limit) break;
        }
        if (runs->size() < limit) break;  // no more runs
        if (static_cast<std::uint32_t>(resp->runs_size()) == limit) {
          resp->set_next_page_token("r" + after);
          break;
        }
      }
      core->Finish(reactor, grpc::Status::OK);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* GetSteps(grpc::CallbackServerContext* ctx, const v1::GetStepsRequest* req,
                                     v1::GetStepsResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    core_->CallStarted();
    Status st = ValidateRunId(req->run());
    if (st.ok()) st = core_->Check(ctx, kRead, req->run()).status();
    StepQuery q;
    q.run = req->run();
    if (st.ok() && req->start_step() < 0) st = Status::InvalidArgument("start_step must be >= 0");
    if (st.ok() && req->end_step() != 0 && req->end_step() <= req->start_step()) {
      st = Status::InvalidArgument("end_step must be above start_step (or 0 for no limit)");
    }
    StatusOr<std::uint32_t> size = PageSize(req->page_size(), 1000, 10000);
    if (st.ok()) st = size.status();
    if (st.ok() && !req->page_token().empty()) {
      auto after = DecodeStepToken(req->page_token());
      if (after.ok()) {
        q.after = *after;
      } else {
        st = after.status();
      }
    }
    if (!st.ok()) {
      core_->Finish(reactor, core_->Fail("GetSteps", st));
      return reactor;
    }
    q.start_step = req->start_step();
    q.end_step = req->end_step() == 0 ? INT64_MAX : req->end_step();
    if (req->has_rank()) q.rank = req->rank();
    q.include_layers = req->include_layers();
    q.limit = *size + 1;
    Core* core = core_;
    core_->executor->Post([core, q, reactor, resp] {
      auto run = core->store->GetRun(q.run);
      if (!run.ok()) {
        core->Finish(reactor, core->Fail("GetSteps", Status::NotFound("unknown run '" + q.run + "'")));
        return;
      }
      auto steps = core->store->GetSteps(q);
      if (!steps.ok()) {
        core->Finish(reactor, core->Fail("GetSteps", steps.status()));
        return;
      }
      const std::size_t page = q.limit - 1;
      for (std::size_t i = 0; i < steps->size() && i < page; ++i) *resp->add_steps() = std::move((*steps)[i]);
      if (steps->size() > page) {
        const v1::StepRecord& last = resp->steps(resp->steps_size() - 1);
        resp->set_next_page_token(EncodeStepToken(last.step(), last.rank()));
      }
      core->Finish(reactor, grpc::Status::OK);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* GetRunSummary(grpc::CallbackServerContext* ctx, const v1::GetRunSummaryRequest* req,
                                          v1::RunSummary* resp) override {
    auto* reactor = ctx->DefaultReactor();
    core_->CallStarted();
    Status st = ValidateRunId(req->run());
    if (st.ok()) st = core_->Check(ctx, kRead, req->run()).status();
    if (!st.ok()) {
      core_->Finish(reactor, core_->Fail("GetRunSummary", st));
      return reactor;
    }
    Core* core = core_;
    const std::string run = req->run();
    const std::uint32_t window = req->window();
    core_->executor->Post([core, run, window, reactor, resp] {
      auto info = core->store->GetRun(run);
      if (!info.ok()) {
        core->Finish(reactor, core->Fail("GetRunSummary", Status::NotFound("unknown run '" + run + "'")));
        return;
      }
      auto steps = core->store->GetRecentSteps(run, 0, window);
      if (!steps.ok()) {
        core->Finish(reactor, core->Fail("GetRunSummary", steps.status()));
        return;
      }
      *resp->mutable_info() = *info;
      *resp->mutable_info()->mutable_config() = core->registry->Get(run);
      auto& counts = *resp->mutable_steps_by_regime();
      for (const char* name : {"safe", "project", "skip", "invalid"}) counts[name] = 0;
      std::vector<double> cosines;
      cosines.reserve(steps->size());
      for (const v1::StepRecord& r : *steps) {
        switch (r.regime()) {
          case v1::REGIME_SAFE: ++counts["safe"]; break;
          case v1::REGIME_PROJECT: ++counts["project"]; break;
          case v1::REGIME_SKIP: ++counts["skip"]; break;
          case v1::REGIME_INVALID: ++counts["invalid"]; break;
          default: break;
        }
        if (r.has_cosine()) cosines.push_back(r.cosine());
      }
      const double c_low = resp->info().config().thresholds().c_low();
      const CalibrationStats cal = ComputeCalibration(cosines, c_low);
      v1::CalibrationSummary* out = resp->mutable_calibration();
      out->set_count(cal.count);
      out->set_q90(cal.q90);
      out->set_max(cal.max);
      out->set_mean(cal.mean);
      out->set_fraction_le_c_low(cal.frac_le_c_low);
      if (auto suggested = SuggestThresholds(cal); suggested.ok()) {
        out->mutable_suggested()->set_c_low(suggested->c_low);
        out->mutable_suggested()->set_c_high(suggested->c_high);
        out->mutable_suggested()->set_alpha_mode(resp->info().config().thresholds().alpha_mode());
      }
      if (!steps->empty()) *resp->mutable_latest() = steps->back();
      core->Finish(reactor, grpc::Status::OK);
    });
    return reactor;
  }

 private:
  Core* const core_;
};

Status ReadFile(const std::string& path, const char* what, std::string* out) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument(std::string("cannot read ") + what + " '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  if (out->empty()) return Status::InvalidArgument(std::string(what) + " '" + path + "' is empty");
  return Status::Ok();
}

Status MakeDirs(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  if (!dir.empty() && dir[0] == '/') cur = "/";
  for (std::string part; std::getline(ss, part, '/');) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0750) != 0 && errno != EEXIST) {
      return Status::IOError("cannot create data directory '" + dir + "': " + std::strerror(errno));
    }
  }
  return Status::Ok();
}

}  // namespace

struct GacServer::Impl {
  Core core;
  std::unique_ptr<IngestServiceImpl> ingest;
  std::unique_ptr<ControlServiceImpl> control;
  std::unique_ptr<AdminServiceImpl> admin;
  std::unique_ptr<QueryServiceImpl> query;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string address;
  int port = 0;
  int metrics_port = 0;

  std::thread housekeeping;
  std::mutex mu;
  std::condition_variable cv;
  bool shutting_down = false;  // guarded by mu
  bool shut_down = false;      // guarded by mu

  void Housekeeping() {
    auto next_retention = std::chrono::steady_clock::now();
    std::unique_lock lock(mu);
    while (!shutting_down) {
      cv.wait_for(lock, std::chrono::seconds(1));
      if (shutting_down) break;
      lock.unlock();
      core.metrics->ExpireIdle(Clock::now());
      if (core.config.retention.count() > 0 && std::chrono::steady_clock::now() >= next_retention) {
        const std::int64_t cutoff =
            NowNs() - std::chrono::duration_cast<std::chrono::nanoseconds>(core.config.retention).count();
        auto deleted = core.store->DeleteIdleRuns(cutoff);
        if (!deleted.ok()) std::fprintf(stderr, "gacd: retention: %s\n", deleted.status().ToString().c_str());
        next_retention = std::chrono::steady_clock::now() + std::chrono::minutes(1);
      }
      lock.lock();
    }
  }
};

GacServer::GacServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GacServer::~GacServer() { Shutdown(std::chrono::milliseconds(0)); }

StatusOr<std::unique_ptr<GacServer>> GacServer::Start(const ServerConfig& config, std::unique_ptr<Store> store) {
  Status st = ValidateConfig(config);
  if (!st.ok()) return st;
  auto impl = std::make_unique<Impl>();
  Core& core = impl->core;
  core.config = config;
  if (!config.insecure) {
    StatusOr<Authenticator> auth = Authenticator::FromFile(config.token_file);
    if (!auth.ok()) return auth.status();
    core.auth = std::move(*auth);
  }
  if (store == nullptr) {
    if (config.db == ":memory:") {
      store = NewMemoryStore();
    } else {
      std::string path = config.db;
      if (path.empty()) {
        st = MakeDirs(config.data_dir);
        if (!st.ok()) return st;
        path = config.data_dir + "/gacd.db";
      }
      SqliteOptions opts;
      opts.synchronous = config.sync == "normal" ? "NORMAL" : "FULL";
      auto opened = OpenSqliteStore(path, opts);
      if (!opened.ok()) return opened.status();
      store = std::move(*opened);
    }
  }
  core.store = std::move(store);
  MetricsOptions mopts;
  mopts.per_layer = config.per_layer_metrics;
  mopts.max_layers_per_run = config.max_layers_per_run;
  mopts.max_runs = config.max_runs_exported;
  mopts.run_ttl = config.run_ttl;
  core.metrics = std::make_unique<Metrics>(mopts);
  core.registry = std::make_unique<RunRegistry>(config.default_thresholds, config.default_mode);
  auto configs = core.store->LoadRunConfigs();
  if (!configs.ok()) return configs.status();
  core.registry->Load(*configs);
  core.writer = std::make_unique<Writer>(core.store.get(), core.metrics.get(), config.max_queue_rows);
  core.executor = std::make_unique<Executor>(2);

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!config.tls_cert.empty()) {
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    st = ReadFile(config.tls_key, "TLS key", &pair.private_key);
    if (st.ok()) st = ReadFile(config.tls_cert, "TLS certificate", &pair.cert_chain);
    if (!st.ok()) return st;
    grpc::SslServerCredentialsOptions opts;
    opts.pem_key_cert_pairs.push_back(pair);
    creds = grpc::SslServerCredentials(opts);
  }

  impl->ingest = std::make_unique<IngestServiceImpl>(&core);
  impl->control = std::make_unique<ControlServiceImpl>(&core);
  impl->admin = std::make_unique<AdminServiceImpl>(&core);
  impl->query = std::make_unique<QueryServiceImpl>(&core);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, creds, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.RegisterService(impl->ingest.get());
  builder.RegisterService(impl->control.get());
  builder.RegisterService(impl->admin.get());
  builder.RegisterService(impl->query.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || port == 0) {
    core.writer->Stop();
    return Status::Unavailable("cannot listen on '" + config.listen + "' (address in use or invalid?)");
  }
  impl->port = port;
  const auto colon = config.listen.rfind(':');
  impl->address = config.listen.substr(0, colon) + ":" + std::to_string(port);
  impl->server->GetHealthCheckService()->SetServingStatus(true);

  if (!config.metrics_listen.empty()) {
    try {
      impl->exposer = std::make_unique<prometheus::Exposer>(config.metrics_listen, 2);
    } catch (const std::exception& e) {
      impl->server->Shutdown();
      core.writer->Stop();
      return Status::Unavailable("cannot serve /metrics on '" + config.metrics_listen + "': " + e.what());
    }
    impl->exposer->RegisterCollectable(core.metrics->registry());
    const std::vector<int> ports = impl->exposer->GetListeningPorts();
    impl->metrics_port = ports.empty() ? 0 : ports.front();
  }
  for (const auto& [run, cfg] : *configs) core.metrics->ObserveConfig(run, cfg, Clock::now());
  Impl* raw = impl.get();
  impl->housekeeping = std::thread([raw] { raw->Housekeeping(); });

  if (!config.ready_file.empty()) {
    const std::string tmp = config.ready_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << "grpc=" << impl->address << "\n";
      if (impl->metrics_port != 0) {
        const std::string& m = config.metrics_listen;
        out << "metrics=" << m.substr(0, m.rfind(':')) << ":" << impl->metrics_port << "\n";
      }
    }
    std::rename(tmp.c_str(), config.ready_file.c_str());
  }
  return std::unique_ptr<GacServer>(new GacServer(std::move(impl)));
}

void GacServer::Shutdown(std::chrono::milliseconds drain) {
  Impl& s = *impl_;
  {
    std::unique_lock lock(s.mu);
    if (s.shutting_down) {
      s.cv.wait(lock, [&] { return s.shut_down; });
      return;
    }
    s.shutting_down = true;
  }
  s.cv.notify_all();
  s.server->GetHealthCheckService()->SetServingStatus(false);
  // Open streams end once their batches are acknowledged, unary calls once
  // answered; then the server stops, cutting off only what outlived the
  // drain time (and stream reads left pending after Finish).
  std::thread exposer_stop([&s] { s.exposer.reset(); });  // civetweb takes ~2 s to stop
  s.core.DrainStreams();
  s.core.WaitForCalls(std::chrono::steady_clock::now() + drain);
  s.server->Shutdown(std::chrono::system_clock::now());
  s.server->Wait();
  s.core.executor->Stop();
  s.core.writer->Stop();  // commits everything queued
  if (s.housekeeping.joinable()) s.housekeeping.join();
  exposer_stop.join();
  {
    std::lock_guard lock(s.mu);
    s.shut_down = true;
  }
  s.cv.notify_all();
}

void GacServer::Wait() {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [this] { return impl_->shut_down; });
}

const std::string& GacServer::address() const { return impl_->address; }
int GacServer::port() const { return impl_->port; }
int GacServer::metrics_port() const { return impl_->metrics_port; }
Metrics& GacServer::metrics() { return *impl_->core.metrics; }
Store& GacServer::store() { return *impl_->core.store; }

}  // namespace gac::server
