// The agent's telemetry sender (gac::transport): streams step records to
// gacd without ever slowing or failing the training step.
//
// Enqueue() puts a record in a bounded in-memory queue and returns; a
// background sender thread groups records into batches with increasing
// sequence numbers, appends each batch to the on-disk spool (spool.h) and
// writes it to gacd's Ingest stream; a reader thread takes the
// acknowledgements and releases acknowledged batches from the spool. When
// the stream breaks, the sender reconnects with exponential backoff and
// jitter and resends every unacknowledged batch in order (gacd stores each
// step once: duplicates are recognised by their keys). After a restart of
// the trainer, batches left in the spool are sent first.
//
// Overflow policy (never silent, never blocking): keep the oldest.
//   - spool full (spool_max_bytes unacknowledged, or its disk full: ENOSPC,
//     EDQUOT): what is on disk stays, untouched. The batch the spool refused
//     waits in memory and is tried again after each acknowledgement or every
//     250 ms; meanwhile the sender takes nothing more from the queue (and
//     never spins on its lock), so the queue fills behind it;
//   - queue full (queue_capacity records): Enqueue returns false and counts
//     the record in dropped_queue_full;
//   - without a spool directory, at most max_unacknowledged_batches batches
//     are kept in memory, with the same effect;
//   - Close: what it leaves neither acknowledged nor spooled (the queue and
//     the waiting batch when the spool is full; batches sent from memory
//     only, without a spool or after a spool error) is discarded and counted
//     in dropped_at_close.
// So every record Enqueue accepted (or Start recovered from the spool) is
// acknowledged, rejected, left in the spool for the next process, or counted
// in dropped_at_close; a record Enqueue refused is counted in
// dropped_queue_full. Nothing is lost uncounted. Each loss stays
// in last_error() (what was dropped, how many, why), also after later
// stream errors.
// The sender's counters (records sent, spooled, replayed, dropped, and
// reconnects, as of the batch) are attached to the last record of each batch
// as the scalars agent_records_sent, agent_records_spooled,
// agent_records_replayed, agent_records_dropped (dropped_queue_full +
// records_rejected + dropped_at_close) and agent_reconnects, so they reach
// gacd and its metrics with the run's telemetry (gac_trainer_scalar): the
// refusals of an outage arrive with the first batch after it. What Close
// discards cannot be exported (no batch is sent after it); it is in
// counters() and last_error().
//
// Silent faults: a stream whose batches wait longer than ack_timeout for an
// acknowledgement is cancelled by a watchdog thread (also when the sender
// is blocked writing to it) and the sender moves on, as after a failure.
//
// Several gacd replicas sharing one store: `address` lists them
// ("gacd-0:7070,gacd-1:7070") or names one DNS name that resolves to them.
// The sender streams to one replica; when its stream or connection fails it
// moves to the next at once (backing off only after every address failed in
// a row) and resends there every unacknowledged batch. A replica counts each
// replayed record that another already stored as a duplicate, so every step
// is stored once wherever its batches land.
//
// A batch that gacd rejects as invalid (INVALID_ARGUMENT) would be rejected
// forever: it is dropped, counted in records_rejected, and its error kept
// in last_error().
//
// Thread safety: Enqueue, Flush, counters and last_error may be called from
// any thread; Close from one.

#ifndef GAC_TRANSPORT_TELEMETRY_H_
#define GAC_TRANSPORT_TELEMETRY_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "gac/transport/spool.h"
#include "gac/base/status.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::transport {

struct TelemetryOptions {
  std::string address;                // gacd host:port, or a comma-separated list of replicas
  std::string token;                  // bearer token; "" for an insecure local gacd
  std::string tls_root_certs;         // PEM roots; "" = plaintext
  std::string tls_cert_chain, tls_private_key;  // PEM client certificate and key (mTLS); "" = none
  std::string spool_dir;              // "" = no spool (unacknowledged batches die with the process)
  std::uint64_t spool_max_bytes = 256ull << 20;
  SpoolFsync spool_fsync = SpoolFsync::kNone;
  std::size_t queue_capacity = 1 << 16;          // records
  std::size_t max_batch_records = 256;
  std::chrono::milliseconds flush_interval{50};  // a partial batch waits at most this long
  std::size_t max_unacknowledged_batches = 4096;  // in memory, per connection window
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{5000};
  // A stream with batches written and no acknowledgement for this long is
  // taken as broken: a silent partition (packets dropped, no reset), lost
  // acknowledgements, or a gacd that cannot store (e.g. cut from its
  // PostgreSQL). It is cancelled, the sender moves to the next address, and
  // that address's next stream goes over a new connection. A gacd that is
  // only slow gets its batches again (it stores each step once).
  std::chrono::milliseconds ack_timeout{15000};
};

struct TelemetryCounters {
  std::uint64_t enqueued = 0;            // records accepted by Enqueue
  std::uint64_t dropped_queue_full = 0;  // records refused by Enqueue
  std::uint64_t records_sent = 0;        // records written to a stream (first time)
  std::uint64_t records_acknowledged = 0;
  std::uint64_t records_spooled = 0;     // records appended to the spool
  std::uint64_t batches_replayed = 0;    // batches resent after a reconnect or restart
  std::uint64_t records_replayed = 0;
  std::uint64_t records_rejected = 0;    // dropped after INVALID_ARGUMENT from gacd
  std::uint64_t spool_errors = 0;        // failed spool writes (the batch is kept in memory)
  std::uint64_t dropped_at_close = 0;    // records Close discarded: neither acknowledged nor spooled
  std::uint64_t reconnects = 0;
  std::uint64_t failovers = 0;           // moves to the next address of a list after a failure
  std::uint64_t queue_depth = 0;         // records waiting in the queue now
  std::uint64_t unacknowledged = 0;      // records sent or spooled, not yet acknowledged
};

class Telemetry {
 public:
  // Opens the spool (recovering what a previous process left) and starts the
  // sender. gacd need not be up: records are spooled until it is.
  static base::StatusOr<std::unique_ptr<Telemetry>> Start(const TelemetryOptions& options);
  ~Telemetry();  // Close(0)
  Telemetry(const Telemetry&) = delete;
  Telemetry& operator=(const Telemetry&) = delete;

  // Queues a record; never blocks on the network or the disk. False when the
  // queue is full (counted).
  bool Enqueue(v1::StepRecord&& record);

  // Waits until every record enqueued before the call, and every record
  // recovered from the spool at Start, is acknowledged (or rejected).
  // False on timeout.
  bool Flush(std::chrono::milliseconds timeout);

  // Flushes for up to `timeout`, then stops the threads. What is not
  // acknowledged stays in the spool for the next process, as far as the
  // spool has room; the rest is discarded and counted in dropped_at_close.
  // Idempotent.
  void Close(std::chrono::milliseconds timeout);

  TelemetryCounters counters() const;
  // What the spool recovery found at Start.
  const SpoolRecovery& recovery() const;
  // The last stream error ("" if none), e.g. "UNAVAILABLE: connection refused",
  // after what was lost so far, if anything: "Enqueue refused N records
  // (queue full, ...; spool full: <why>); Close discarded M records ...;
  // last error: <the stream error>".
  std::string last_error() const;
  // The address of the gacd the open stream goes to ("" when none).
  std::string address() const;

 private:
  struct Impl;
  explicit Telemetry(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gac::transport

#endif  // GAC_TRANSPORT_TELEMETRY_H_
