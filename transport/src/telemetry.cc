#include "gac/transport/telemetry.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "gac/base/mutex.h"
#include "gac/proto/convert.h"
#include "gac/proto/wire_rules.h"
#include "gac/transport/channel.h"
#include "gac/transport/scalar_budget.h"
#include "gac/v1/telemetry.grpc.pb.h"
#include "transport/src/record_ring.h"

namespace gac::transport {
namespace {

using Clock = std::chrono::steady_clock;

struct Pending {
  std::uint64_t seq = 0;
  std::shared_ptr<v1::IngestRequest> batch;
  bool sent = false;     // written to some stream before
  bool spooled = false;  // on disk: survives Close and the process
};

// How often a batch the spool refused is tried again when no
// acknowledgement frees room first (the disk may be freed by others).
constexpr std::chrono::milliseconds kSpoolRetry{250};

}  // namespace

struct Telemetry::Impl {
  TelemetryOptions options;
  base::Mutex spool_mu;
  std::unique_ptr<Spool> spool GAC_PT_GUARDED_BY(spool_mu);  // null without a spool directory
  SpoolRecovery recovery;
  // One per gacd address (several replicas sharing a store); the sender
  // streams to one at a time and moves to the next when it fails.
  std::vector<std::string> addresses;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::IngestService::Stub>> stubs;
  std::size_t current = 0;           // sender thread only
  std::size_t failures_in_a_row = 0;  // sender thread only

  // Queue side (training threads and the sender).
  mutable base::Mutex mu;
  base::CondVar wake;      // the sender waits here
  base::CondVar progress;  // Flush waits here
  Ring<v1::StepRecord> queue GAC_GUARDED_BY(mu);  // record_ring.h: Enqueue allocates nothing
  bool stopping GAC_GUARDED_BY(mu) = false;
  bool broken GAC_GUARDED_BY(mu) = false;  // the current stream failed
  std::deque<Pending> pending GAC_GUARDED_BY(mu);  // unacknowledged batches, in order
  std::uint64_t pending_records GAC_GUARDED_BY(mu) = 0;
  TelemetryCounters counters GAC_GUARDED_BY(mu);  // (queue_depth/unacknowledged computed)
  std::string last_error GAC_GUARDED_BY(mu);
  std::unique_ptr<grpc::ClientContext> ctx GAC_GUARDED_BY(mu);  // for TryCancel from Close
  std::string connected_address GAC_GUARDED_BY(mu);  // of the open stream; "" = none
  // Since when written batches have waited for an acknowledgement on the
  // open stream (reset by every acknowledgement); nullopt when none waits.
  std::optional<Clock::time_point> waiting_since GAC_GUARDED_BY(mu);
  bool stalled GAC_GUARDED_BY(mu) = false;  // the watchdog cancelled the open stream
  base::CondVar watch;                      // the watchdog waits here
  std::thread watchdog;

  std::thread sender;
  std::uint64_t next_seq = 1;          // sender thread only
  std::uint64_t recovered_records = 0;  // left in the spool by a previous process
  // A batch the spool refused (its bound or its disk full), numbered
  // next_seq; retried before any other record is taken. Sender thread only.
  std::shared_ptr<v1::IngestRequest> held;
  Clock::time_point held_retry_at;      // sender thread only
  bool spool_room GAC_GUARDED_BY(mu) = false;  // an acknowledgement may have freed room
  std::string spool_full_reason GAC_GUARDED_BY(mu);  // why the spool refused `held`
  // What Close discarded and why ("" = nothing). With the refusals, it
  // leads last_error(), so a later stream error never hides a loss.
  std::string discarded_note GAC_GUARDED_BY(mu);

  using Stream = grpc::ClientReaderWriter<v1::IngestRequest, v1::IngestAck>;
  // The sender loop's stream and retry schedule (sender thread only).
  struct Link {
    std::unique_ptr<Stream> stream;
    std::thread reader;  // ReadAcks of the stream
    bool connected = false;
    std::chrono::milliseconds backoff{0};  // before the next attempt after every address failed
    Clock::time_point next_attempt = Clock::now();
    std::mt19937_64 rng{std::random_device{}()};
    std::uniform_real_distribution<double> jitter{0.5, 1.5};
  };
  // What one turn of the sender loop took from the queue side.
  struct Turn {
    bool stop = false;         // Close asked the sender to stop
    bool lost_stream = false;  // the open stream failed
    bool retry_held = false;   // the held batch is tried again
    std::vector<v1::StepRecord> records;  // for a new batch
  };

  // The sender thread: batches the queue, spools and sends the batches,
  // reconnects; at Close, spools what is left.
  void Run();
  // After a failure the next address is tried at once; only when every
  // address failed in a row does the sender back off.
  void ScheduleRetry(Link& link) GAC_EXCLUDES(mu);
  // Closes the stream after a failure (to connect, or of the open stream),
  // schedules the next attempt and counts a reconnect.
  void DropStream(Link& link) GAC_EXCLUDES(mu);
  // Whether the sender has something to do before its deadline.
  bool HasWork(bool connected) const GAC_REQUIRES(mu);
  // Waits for work, at most a flush interval (or until the next attempt to
  // connect or the held batch's retry), and takes it.
  Turn WaitForTurn(const Link& link) GAC_EXCLUDES(mu);
  // Up to max_batch_records records from the front of the queue.
  std::vector<v1::StepRecord> TakeQueued() GAC_REQUIRES(mu);
  // The held batch to retry, a new batch of the turn's records, or null.
  std::shared_ptr<v1::IngestRequest> NextBatch(Turn& turn);
  // Writes a kept batch (the last pending) to the open stream.
  void Send(Link& link, const v1::IngestRequest& batch) GAC_EXCLUDES(mu);
  // Stopping: the held batch, then what is still queued, go to the spool
  // for the next process, as far as it has room.
  void SpoolAtClose() GAC_EXCLUDES(mu);
  bool Connect(std::unique_ptr<Stream>& stream, std::thread& reader);
  void Disconnect(std::unique_ptr<Stream>& stream, std::thread& reader);
  void ReadAcks(Stream* stream);
  // Cancels the open stream when its batches wait longer than ack_timeout.
  void Watch();
  // Marks written batches as waiting (from now, unless they already were).
  void Written() {
    base::MutexLock lock(&mu);
    if (!waiting_since) waiting_since = Clock::now();
  }
  void Acknowledge(std::uint64_t seq);
  // Numbers a batch (next_seq) and stamps the sender's counters on it.
  std::shared_ptr<v1::IngestRequest> MakeBatch(std::vector<v1::StepRecord>&& records);
  // Spools the batch and queues it as pending; false, with nothing changed,
  // when the spool has no room for it (its bound or its disk full).
  bool Keep(const std::shared_ptr<v1::IngestRequest>& batch);
  // What was lost so far, and why ("" = nothing). REQUIRES: mu held.
  std::string Losses() const GAC_REQUIRES(mu);
  // Counts, and reports, what Close leaves neither acknowledged nor
  // spooled: the queue, the held batch, pending batches not on disk.
  void CountDiscardedAtClose();

  bool reader_done GAC_GUARDED_BY(mu) = false;  // the current stream's reader saw its end
};

void Telemetry::Impl::ReadAcks(Stream* stream) {
  v1::IngestAck ack;
  while (stream->Read(&ack)) Acknowledge(ack.sequence());
  base::MutexLock lock(&mu);
  broken = true;
  reader_done = true;
  wake.SignalAll();
}

void Telemetry::Impl::Watch() {
  base::MutexLock lock(&mu);
  const auto period = std::max(std::chrono::milliseconds(10), options.ack_timeout / 4);
  while (!stopping) {
    watch.WaitUntil(&mu, Clock::now() + period);
    if (stopping || !ctx || reader_done || stalled || !waiting_since) continue;
    const auto waited = Clock::now() - *waiting_since;
    if (waited < options.ack_timeout) continue;
    stalled = true;
    broken = true;
    last_error = "DEADLINE_EXCEEDED: no acknowledgement from " + connected_address + " for " +
                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) + " ms";
    ctx->TryCancel();  // also ends a Write blocked on the silent connection
    wake.SignalAll();
  }
}

void Telemetry::Impl::Acknowledge(std::uint64_t seq) {
  {
    base::MutexLock lock(&mu);
    while (!pending.empty() && pending.front().seq <= seq) {
      const auto n = static_cast<std::uint64_t>(pending.front().batch->records_size());
      counters.records_acknowledged += n;
      pending_records -= n;
      pending.pop_front();
    }
    if (pending.empty()) {
      waiting_since.reset();
    } else {
      waiting_since = Clock::now();  // progress: the rest wait from now
    }
  }
  progress.SignalAll();
  if (spool) {
    base::MutexLock lock(&spool_mu);
    if (!spool->Acknowledge(seq).ok()) {
      // ACKED not written: the batches are replayed after a restart and
      // gacd ignores them as duplicates.
    }
  }
  {
    base::MutexLock lock(&mu);
    spool_room = true;
  }
  wake.SignalAll();  // room in the window and perhaps in the spool
}

bool Telemetry::Impl::Connect(std::unique_ptr<Stream>& stream, std::thread& reader) {
  // Wait briefly for a connection instead of letting the stream fail fast:
  // a fail-fast call on a channel in backoff fails without trying.
  if (!channels[current]->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(100))) {
    base::MutexLock lock(&mu);
    last_error = "UNAVAILABLE: no connection to " + addresses[current];
    return false;
  }
  auto context = std::make_unique<grpc::ClientContext>();
  if (!options.token.empty()) context->AddMetadata("authorization", "Bearer " + options.token);
  grpc::ClientContext* raw = context.get();
  {
    base::MutexLock lock(&mu);
    ctx = std::move(context);
    broken = false;
    reader_done = false;
    stalled = false;
    waiting_since.reset();
    connected_address = addresses[current];
  }
  stream = stubs[current]->Ingest(raw);
  reader = std::thread([this, s = stream.get()] { ReadAcks(s); });
  // Resend every unacknowledged batch, in order.
  std::vector<Pending> resend;
  {
    base::MutexLock lock(&mu);
    resend.assign(pending.begin(), pending.end());
  }
  for (const Pending& p : resend) {
    Written();
    if (!stream->Write(*p.batch)) return false;
    base::MutexLock lock(&mu);
    if (p.sent) {
      ++counters.batches_replayed;
      counters.records_replayed += static_cast<std::uint64_t>(p.batch->records_size());
    } else {
      counters.records_sent += static_cast<std::uint64_t>(p.batch->records_size());
    }
    for (Pending& q : pending) {
      if (q.seq == p.seq) q.sent = true;
    }
  }
  return true;
}

void Telemetry::Impl::Disconnect(std::unique_ptr<Stream>& stream, std::thread& reader) {
  if (!stream) return;
  {
    // A stream the server ended keeps its status; only a stream that is
    // still open (a failed write, Close) is cancelled.
    base::MutexLock lock(&mu);
    if (ctx && !reader_done) ctx->TryCancel();
  }
  if (reader.joinable()) reader.join();
  const grpc::Status st = stream->Finish();
  stream.reset();
  bool was_stalled = false;
  {
    base::MutexLock lock(&mu);
    was_stalled = stalled;
    stalled = false;
    waiting_since.reset();
  }
  if (was_stalled) {
    // The connection went silent; TCP may hold on to it for minutes. The
    // next stream to this address goes over a new one.
    channels[current] = MakeGacdChannel(
        addresses[current], ChannelTls{options.tls_root_certs, options.tls_cert_chain, options.tls_private_key},
        options.backoff_max, /*own_connection=*/true);
    stubs[current] = v1::IngestService::NewStub(channels[current]);
  }
  base::MutexLock lock(&mu);
  ctx.reset();
  connected_address.clear();
  if (st.ok() || st.error_code() == grpc::StatusCode::CANCELLED) return;
  last_error = proto::FromGrpcStatus(st).ToString();
  if (st.error_code() == grpc::StatusCode::INVALID_ARGUMENT && !pending.empty()) {
    // gacd processes batches in order, so the first unacknowledged one is
    // the batch it rejected; resending it would fail forever.
    const auto n = static_cast<std::uint64_t>(pending.front().batch->records_size());
    counters.records_rejected += n;
    pending_records -= n;
    const std::uint64_t seq = pending.front().seq;
    pending.pop_front();
    progress.SignalAll();
    if (spool) {
      base::MutexLock slock(&spool_mu);
      (void)spool->Acknowledge(seq);
    }
  }
}

void Telemetry::Impl::Run() {
  Link link;
  link.backoff = options.backoff_initial;
  for (;;) {
    if (!link.connected && Clock::now() >= link.next_attempt) {
      link.connected = Connect(link.stream, link.reader);
      if (!link.connected) DropStream(link);
    }
    // Records are taken while disconnected too: they go to the spool (or
    // the in-memory window) and are sent on the next connection.
    Turn turn = WaitForTurn(link);
    if (turn.stop) break;
    if (turn.lost_stream) {
      DropStream(link);
      continue;
    }
    std::shared_ptr<v1::IngestRequest> batch = NextBatch(turn);
    if (batch == nullptr) continue;
    if (!Keep(batch)) {
      // Keep the oldest: the batch waits for room and the queue behind it
      // fills; Enqueue then refuses new records and counts them.
      held = std::move(batch);
      held_retry_at = Clock::now() + kSpoolRetry;
      continue;
    }
    if (link.connected) Send(link, *batch);
  }
  SpoolAtClose();
  Disconnect(link.stream, link.reader);
  CountDiscardedAtClose();
}

void Telemetry::Impl::ScheduleRetry(Link& link) {
  ++failures_in_a_row;
  if (addresses.size() > 1) {
    current = (current + 1) % addresses.size();
    base::MutexLock lock(&mu);
    ++counters.failovers;
  }
  if (failures_in_a_row % addresses.size() != 0) {
    link.next_attempt = Clock::now();
    return;
  }
  link.next_attempt = Clock::now() + std::chrono::duration_cast<Clock::duration>(link.backoff * link.jitter(link.rng));
  link.backoff = std::min(link.backoff * 2, options.backoff_max);
}

void Telemetry::Impl::DropStream(Link& link) {
  Disconnect(link.stream, link.reader);
  link.connected = false;
  ScheduleRetry(link);
  base::MutexLock lock(&mu);
  ++counters.reconnects;
}

bool Telemetry::Impl::HasWork(bool connected) const {
  return stopping || (connected && broken) || (held != nullptr && spool_room) ||
         (held == nullptr && pending.size() < options.max_unacknowledged_batches &&
          queue.size() >= options.max_batch_records);
}

Telemetry::Impl::Turn Telemetry::Impl::WaitForTurn(const Link& link) {
  Turn turn;
  base::MutexLock lock(&mu);
  auto timeout = options.flush_interval;
  if (!link.connected) {
    const auto until_attempt = std::chrono::duration_cast<std::chrono::milliseconds>(link.next_attempt - Clock::now());
    timeout = std::min(timeout, until_attempt + std::chrono::milliseconds(1));
  }
  auto deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(1));
  // While the spool refuses the held batch, nothing else is taken: the
  // sender waits for an acknowledgement or the retry time, and the
  // training threads' Enqueue never meets a sender spinning on the lock.
  if (held != nullptr) deadline = std::min(deadline, held_retry_at);
  while (!HasWork(link.connected) && wake.WaitUntil(&mu, deadline)) {
  }
  turn.stop = stopping;
  if (turn.stop) return turn;
  turn.lost_stream = link.connected && broken;
  if (!turn.lost_stream && held != nullptr) {
    turn.retry_held = spool_room || Clock::now() >= held_retry_at;
    spool_room = false;
  } else if (!turn.lost_stream && pending.size() < options.max_unacknowledged_batches) {
    turn.records = TakeQueued();
  }
  return turn;
}

std::vector<v1::StepRecord> Telemetry::Impl::TakeQueued() {
  std::vector<v1::StepRecord> records;
  const std::size_t n = std::min(queue.size(), options.max_batch_records);
  records.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    records.push_back(std::move(queue.front()));
    queue.pop_front();
  }
  return records;
}

std::shared_ptr<v1::IngestRequest> Telemetry::Impl::NextBatch(Turn& turn) {
  if (turn.retry_held) return std::move(held);
  if (!turn.records.empty()) return MakeBatch(std::move(turn.records));
  return nullptr;
}

void Telemetry::Impl::Send(Link& link, const v1::IngestRequest& batch) {
  {
    base::MutexLock lock(&mu);
    counters.records_sent += static_cast<std::uint64_t>(batch.records_size());
    pending.back().sent = true;
  }
  Written();
  if (link.stream->Write(batch)) {
    link.backoff = options.backoff_initial;
    failures_in_a_row = 0;
  } else {
    base::MutexLock lock(&mu);
    broken = true;
  }
}

void Telemetry::Impl::SpoolAtClose() {
  if (held != nullptr && Keep(held)) held.reset();
  while (held == nullptr && spool != nullptr) {
    std::vector<v1::StepRecord> records;
    {
      base::MutexLock lock(&mu);
      records = TakeQueued();
    }
    if (records.empty()) break;
    std::shared_ptr<v1::IngestRequest> batch = MakeBatch(std::move(records));
    if (!Keep(batch)) held = std::move(batch);
  }
}

std::string Telemetry::Impl::Losses() const {
  std::string out;
  if (counters.dropped_queue_full > 0) {
    out = "Enqueue refused " + std::to_string(counters.dropped_queue_full) + " records (queue full, capacity " +
          std::to_string(options.queue_capacity) + " records)";
    if (!spool_full_reason.empty()) out += "; spool full: " + spool_full_reason;
  }
  if (!discarded_note.empty()) out += (out.empty() ? "" : "; ") + discarded_note;
  return out;
}

void Telemetry::Impl::CountDiscardedAtClose() {
  base::MutexLock lock(&mu);
  std::uint64_t queued = queue.size(), unspooled = 0;
  queue.clear();
  if (held != nullptr) queued += static_cast<std::uint64_t>(held->records_size());
  held.reset();
  for (const Pending& p : pending) {
    if (!p.spooled) unspooled += static_cast<std::uint64_t>(p.batch->records_size());
  }
  if (queued + unspooled == 0) return;
  counters.dropped_at_close += queued + unspooled;
  discarded_note = "Close discarded " + std::to_string(queued + unspooled) +
                   " records neither acknowledged nor spooled (" + std::to_string(queued) + " not yet spooled, " +
                   std::to_string(unspooled) + " sent from memory only)";
  if (!spool_full_reason.empty()) discarded_note += "; spool full: " + spool_full_reason;
  if (spool == nullptr) discarded_note += "; no spool directory";
}

std::shared_ptr<v1::IngestRequest> Telemetry::Impl::MakeBatch(std::vector<v1::StepRecord>&& records) {
  auto batch = std::make_shared<v1::IngestRequest>();
  batch->set_sequence(next_seq);
  for (auto& r : records) *batch->add_records() = std::move(r);
  auto& sc = *batch->mutable_records(batch->records_size() - 1)->mutable_scalars();
  if (sc.size() + kSenderScalars <= proto::kMaxScalarsPerRecord) {  // gacd's limit
    // The sender's own counters ride on the last record of each batch as
    // scalars, so gacd exports them with the run (gac_trainer_scalar).
    base::MutexLock lock(&mu);
    sc["agent_records_sent"] = static_cast<double>(counters.records_sent);
    sc["agent_records_spooled"] = static_cast<double>(counters.records_spooled);
    sc["agent_records_replayed"] = static_cast<double>(counters.records_replayed);
    sc["agent_records_dropped"] =
        static_cast<double>(counters.dropped_queue_full + counters.records_rejected + counters.dropped_at_close);
    sc["agent_reconnects"] = static_cast<double>(counters.reconnects);
  }
  return batch;
}

bool Telemetry::Impl::Keep(const std::shared_ptr<v1::IngestRequest>& batch) {
  bool spooled = false;
  if (spool) {
    const std::string bytes = batch->SerializeAsString();
    base::MutexLock slock(&spool_mu);
    base::Status st = spool->Append(batch->sequence(), bytes);
    if (st.code() == base::StatusCode::kResourceExhausted) {
      // Its bound reached, or its disk full (ENOSPC, EDQUOT): the batch
      // waits for room.
      base::MutexLock lock(&mu);
      if (spool_full_reason.empty()) {
        last_error = "spool full: " + st.message() + "; records wait in the queue (capacity " +
                     std::to_string(options.queue_capacity) + "), beyond it Enqueue refuses and counts them";
      }
      spool_full_reason = st.message();
      return false;
    }
    base::MutexLock lock(&mu);
    spool_full_reason.clear();
    if (st.ok()) {
      counters.records_spooled += static_cast<std::uint64_t>(batch->records_size());
      spooled = true;
    } else {
      ++counters.spool_errors;  // kept in memory: sent, but lost if the process dies first
      last_error = "spool: " + st.ToString();
    }
  }
  ++next_seq;
  base::MutexLock lock(&mu);
  pending.push_back(Pending{batch->sequence(), batch, false, spooled});
  pending_records += static_cast<std::uint64_t>(batch->records_size());
  return true;
}

Telemetry::Telemetry(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Telemetry::~Telemetry() { Close(std::chrono::milliseconds(0)); }

base::StatusOr<std::unique_ptr<Telemetry>> Telemetry::Start(const TelemetryOptions& options) {
  base::StatusOr<std::vector<std::string>> addresses = SplitGacdAddresses(options.address);
  if (!addresses.ok()) return addresses.status().WithPrefix("telemetry");
  if (options.queue_capacity == 0 || options.max_batch_records == 0 || options.max_unacknowledged_batches == 0) {
    return base::Status::InvalidArgument("telemetry queue_capacity, max_batch_records and max_unacknowledged_batches must be > 0");
  }
  if (options.ack_timeout.count() <= 0) return base::Status::InvalidArgument("telemetry ack_timeout must be > 0");
  if (options.max_batch_records > proto::kMaxRecordsPerBatch) {
    return base::Status::InvalidArgument("max_batch_records above gacd's limit of " + std::to_string(proto::kMaxRecordsPerBatch));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (!options.spool_dir.empty()) {
    SpoolOptions so;
    so.dir = options.spool_dir;
    so.max_bytes = options.spool_max_bytes;
    so.fsync = options.spool_fsync;
    GAC_ASSIGN_OR_RETURN(auto spool, Spool::Open(so, &impl->recovery));
    // What a previous process left: resent first, in order.
    std::deque<Pending> recovered;
    std::uint64_t records = 0;
    GAC_RETURN_IF_ERROR(spool->ForEachUnacknowledged([&](std::uint64_t seq, std::string&& payload) {
      auto batch = std::make_shared<v1::IngestRequest>();
      if (!batch->ParseFromString(payload)) return;  // checksummed, so not expected
      batch->set_sequence(seq);
      records += static_cast<std::uint64_t>(batch->records_size());
      recovered.push_back(Pending{seq, batch, true, true});
    }));
    impl->next_seq = spool->last_sequence() + 1;
    impl->recovered_records = records;
    // No other thread runs yet; the locks are taken for the analysis' sake.
    base::MutexLock spool_lock(&impl->spool_mu);
    base::MutexLock lock(&impl->mu);
    impl->spool = std::move(spool);
    impl->pending = std::move(recovered);
    impl->pending_records = records;
  }
  impl->addresses = std::move(*addresses);
  for (const std::string& address : impl->addresses) {
    impl->channels.push_back(MakeGacdChannel(
        address, ChannelTls{options.tls_root_certs, options.tls_cert_chain, options.tls_private_key},
        options.backoff_max, /*own_connection=*/true));
    impl->stubs.push_back(v1::IngestService::NewStub(impl->channels.back()));
  }
  Impl* raw = impl.get();
  impl->sender = std::thread([raw] { raw->Run(); });
  impl->watchdog = std::thread([raw] { raw->Watch(); });
  return std::unique_ptr<Telemetry>(new Telemetry(std::move(impl)));
}

bool Telemetry::Enqueue(v1::StepRecord&& record) {
  Impl& s = *impl_;
  bool wake = false;
  {
    base::MutexLock lock(&s.mu);
    if (s.queue.size() >= s.options.queue_capacity || s.stopping) {
      ++s.counters.dropped_queue_full;
      return false;
    }
    s.queue.push_back(std::move(record));
    ++s.counters.enqueued;
    wake = s.queue.size() == s.options.max_batch_records;
  }
  if (wake) s.wake.Signal();
  return true;
}

bool Telemetry::Flush(std::chrono::milliseconds timeout) {
  Impl& s = *impl_;
  base::MutexLock lock(&s.mu);
  const std::uint64_t target = s.recovered_records + s.counters.enqueued;
  s.wake.Signal();
  const auto deadline = Clock::now() + timeout;
  while (s.counters.records_acknowledged + s.counters.records_rejected < target && s.progress.WaitUntil(&s.mu, deadline)) {
  }
  return s.counters.records_acknowledged + s.counters.records_rejected >= target;
}

void Telemetry::Close(std::chrono::milliseconds timeout) {
  Impl& s = *impl_;
  if (!s.sender.joinable()) return;
  Flush(timeout);
  {
    base::MutexLock lock(&s.mu);
    s.stopping = true;
    if (s.ctx) s.ctx->TryCancel();  // unblocks a Write stuck on a stalled gacd
  }
  s.wake.SignalAll();
  s.watch.SignalAll();
  s.sender.join();
  s.watchdog.join();
}

TelemetryCounters Telemetry::counters() const {
  base::MutexLock lock(&impl_->mu);
  TelemetryCounters c = impl_->counters;
  c.queue_depth = impl_->queue.size();
  c.unacknowledged = impl_->pending_records;
  return c;
}

const SpoolRecovery& Telemetry::recovery() const { return impl_->recovery; }

std::string Telemetry::last_error() const {
  base::MutexLock lock(&impl_->mu);
  const std::string losses = impl_->Losses();
  if (losses.empty()) return impl_->last_error;
  if (impl_->last_error.empty()) return losses;
  return losses + "; last error: " + impl_->last_error;
}

std::string Telemetry::address() const {
  base::MutexLock lock(&impl_->mu);
  return impl_->connected_address;
}

}  // namespace gac::transport
