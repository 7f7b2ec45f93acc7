#include <deque>
#include <set>

#include "gac/proto/convert.h"
#include "server/src/services/services.h"

namespace gac::server {

class IngestReactor;

// The open ingest streams, so that shutdown can end them after their acks.
class IngestStreams {
 public:
  // Registers a stream as an open call; false once draining has begun.
  bool Add(IngestReactor* r, Core* core) GAC_EXCLUDES(mu_);
  void Remove(IngestReactor* r) GAC_EXCLUDES(mu_);
  void Drain() GAC_EXCLUDES(mu_);

 private:
  base::Mutex mu_;
  std::set<IngestReactor*> streams_ GAC_GUARDED_BY(mu_);
  bool draining_ GAC_GUARDED_BY(mu_) = false;
};

// One ingest stream. Reactions decide under mu_ what to start next and start
// it after releasing mu_ (gRPC may run a reaction inline in the starting
// thread). The reactor finishes only when no write op is pending, so
// OnDone never races with a writer callback.
class IngestReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static constexpr int kMaxInflight = 64;  // batches per stream awaiting commit or their ack's write

  struct Actions {
    bool read = false;
    bool write = false;
    bool finish = false;
  };

  IngestReactor(Core* core, IngestStreams* streams, grpc::CallbackServerContext* ctx)
      : core_(core), streams_(streams) {
    base::StatusOr<const Principal*> p = core_->Authenticate(*ctx);
    if (!p.ok()) {
      Finish(core_->Fail("Ingest", p.status()));
      return;
    }
    principal_ = *p;
    if (!streams_->Add(this, core_)) {
      Finish(proto::ToGrpcStatus(base::Status::Unavailable("gacd is shutting down")));
      return;
    }
    registered_ = true;
    // From here a shutdown may drain the stream concurrently: the first read
    // is chosen like every later operation, so it never follows a Finish.
    Actions a;
    {
      base::MutexLock lock(&mu_);
      starting_ = false;
      Decide(a);
    }
    Run(a);
  }

  void OnReadDone(bool ok) override {
    Actions a;
    {
      base::MutexLock lock(&mu_);
      reading_ = false;
      if (!ok) {
        reading_done_ = true;
      } else if (!reading_done_) {
        const base::Status st = Accept();
        if (!st.ok()) {
          error_ = st;
          core_->metrics().ObserveRpcError("Ingest", base::StatusCodeName(st.code()));
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
      base::MutexLock lock(&mu_);
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
    if (registered_) streams_->Remove(this);
    { base::MutexLock lock(&mu_); }  // the last Run() released mu_ before Finish
    delete this;
  }

  // Stops reading; the stream ends with UNAVAILABLE once pending batches are
  // acknowledged. The caller passes the result to Run() after releasing the
  // streams' lock (the reactor stays alive until then: it cannot finish
  // before the chosen operations are started).
  Actions BeginDrain() GAC_EXCLUDES(mu_) {
    base::MutexLock lock(&mu_);
    if (!reading_done_) {
      reading_done_ = true;
      error_ = base::Status::Unavailable("gacd is shutting down; resend unacknowledged batches after reconnecting");
    }
    Actions a;
    Decide(a);
    return a;
  }

  void Run(const Actions& a) GAC_EXCLUDES(mu_) {
    // After Finish the reactor may be deleted at any moment: start it last.
    if (a.write) StartWrite(&raw_ack_);
    if (a.read) StartRead(&raw_request_);
    if (a.finish) {
      Core* core = core_;
      Finish(proto::ToGrpcStatus(finish_status_));
      core->CallFinished();  // only registered streams get here
    }
  }

 private:
  // Validates the new batch in raw_request_ and hands it to the writer; an
  // error ends the stream.
  base::Status Accept() GAC_REQUIRES(mu_) {
    if (!grpc::SerializationTraits<v1::IngestRequest>::Deserialize(&raw_request_, &request_).ok()) {
      return base::Status::InvalidArgument("malformed IngestRequest: not a valid gac.v1.IngestRequest message");
    }
    GAC_RETURN_IF_ERROR(CheckBatch());
    auto req = std::make_shared<v1::IngestRequest>(std::move(request_));
    request_.Clear();
    last_sequence_ = req->sequence();
    std::size_t rows = 0;
    for (const auto& r : req->records()) rows += 1 + static_cast<std::size_t>(r.layers_size());
    WriteOp op;
    op.steps = req.get();
    op.received_ns = NowNs();
    base::Status st = core_->writer().Submit(op, rows, [this, req](const base::Status& s, const WriteOp& done) {
      OnCommitted(*req, s, done);
    });
    if (st.ok()) ++inflight_;
    return st;
  }

  base::Status CheckBatch() GAC_REQUIRES(mu_) {
    if (request_.sequence() == 0) return base::Status::InvalidArgument("sequence must be >= 1");
    if (request_.sequence() <= last_sequence_) {
      return base::Status::OutOfRange("sequence " + std::to_string(request_.sequence()) +
                                " is not above the previous " + std::to_string(last_sequence_) +
                                " on this stream");
    }
    GAC_RETURN_IF_ERROR(ValidateIngestRequest(request_, core_->limits()));
    const std::string* allowed = nullptr;
    for (const v1::StepRecord& r : request_.records()) {
      if (allowed != nullptr && *allowed == r.run()) continue;
      GAC_RETURN_IF_ERROR(Authenticator::Authorize(*principal_, kWrite, r.run()));
      allowed = &r.run();
    }
    return base::Status::Ok();
  }

  // Runs on the writer thread.
  void OnCommitted(const v1::IngestRequest& req, const base::Status& s, const WriteOp& op) GAC_EXCLUDES(mu_) {
    if (s.ok()) core_->ObserveCommitted(req, op);
    Actions a;
    {
      base::MutexLock lock(&mu_);
      --inflight_;
      if (!s.ok()) {
        if (error_.ok()) error_ = base::Status::Unavailable("store write failed: " + s.message());
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

  // Chooses the next operations.
  void Decide(Actions& a) GAC_REQUIRES(mu_) {
    if (finished_ || starting_) return;
    if (!writing_ && !acks_.empty()) {
      bool own_buffer = false;
      grpc::SerializationTraits<v1::IngestAck>::Serialize(acks_.front(), &raw_ack_, &own_buffer);
      acks_.pop_front();
      writing_ = true;
      a.write = true;
    }
    // Batches awaiting commit and acks the client has not taken yet both
    // count: a client that never reads its acks stops being read, so its
    // writes back up in its own flow control instead of in gacd's memory.
    if (!reading_ && !reading_done_ && inflight_ + static_cast<int>(acks_.size()) < kMaxInflight) {
      reading_ = true;
      a.read = true;
    }
    if (reading_done_ && inflight_ == 0 && !writing_ && acks_.empty()) {
      finished_ = true;
      a.finish = true;
      finish_status_ = error_;
    }
  }

  Core* const core_;
  IngestStreams* const streams_;
  const Principal* principal_ = nullptr;  // constant once registered
  bool registered_ = false;               // constant after construction

  base::Mutex mu_;
  grpc::ByteBuffer raw_request_;  // the read buffer (owned by the pending read)
  v1::IngestRequest request_ GAC_GUARDED_BY(mu_);  // raw_request_ parsed
  grpc::ByteBuffer raw_ack_;      // the write buffer (owned by the pending write)
  std::deque<v1::IngestAck> acks_ GAC_GUARDED_BY(mu_);  // committed, not yet written
  std::uint64_t last_sequence_ GAC_GUARDED_BY(mu_) = 0;
  int inflight_ GAC_GUARDED_BY(mu_) = 0;  // submitted, not yet committed
  bool reading_ GAC_GUARDED_BY(mu_) = false;
  bool writing_ GAC_GUARDED_BY(mu_) = false;
  bool reading_done_ GAC_GUARDED_BY(mu_) = false;  // no more batches will be accepted
  bool client_gone_ GAC_GUARDED_BY(mu_) = false;   // a write failed
  bool starting_ GAC_GUARDED_BY(mu_) = true;       // the constructor has not chosen the first read
  bool finished_ GAC_GUARDED_BY(mu_) = false;
  base::Status error_ GAC_GUARDED_BY(mu_);  // the final status
  base::Status finish_status_;              // error_ as of the decision to finish
};

bool IngestStreams::Add(IngestReactor* r, Core* core) {
  base::MutexLock lock(&mu_);
  if (draining_) return false;
  streams_.insert(r);
  core->CallStarted();
  return true;
}

void IngestStreams::Remove(IngestReactor* r) {
  base::MutexLock lock(&mu_);
  streams_.erase(r);
}

void IngestStreams::Drain() {
  std::vector<std::pair<IngestReactor*, IngestReactor::Actions>> started;
  {
    base::MutexLock lock(&mu_);
    draining_ = true;
    for (IngestReactor* r : streams_) started.emplace_back(r, r->BeginDrain());
  }
  for (auto& [r, actions] : started) r->Run(actions);
}

IngestServiceImpl::IngestServiceImpl(Core* core) : core_(core), streams_(std::make_unique<IngestStreams>()) {}
IngestServiceImpl::~IngestServiceImpl() = default;

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* IngestServiceImpl::Ingest(
    grpc::CallbackServerContext* ctx) {
  return new IngestReactor(core_, streams_.get(), ctx);
}

void IngestServiceImpl::DrainStreams() { streams_->Drain(); }

}  // namespace gac::server
