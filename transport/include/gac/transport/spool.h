// An append-only on-disk spool of telemetry batches, for the agent's sender.
//
// Every batch is appended before it is sent and stays until gacd
// acknowledges it, so nothing unacknowledged is lost when gacd or the
// trainer dies; after a restart the sender replays what is left, in order.
//
// Layout: DIR/spool-<first sequence, 20 digits>.log segments of entries
//   u32 magic "GSP1" | u32 payload length | u64 sequence | u32 CRC-32 of
//   (sequence, payload) | payload
// (little-endian), and DIR/ACKED holding the highest acknowledged sequence
// (written to a temporary file and renamed). Segments whose entries are all
// acknowledged are deleted. Appends always go to a new segment after Open.
//
// Durability (SpoolFsync): kEveryAppend fsyncs each appended entry (survives
// power loss); kNone leaves it to the OS (survives a crash of the trainer
// process, not of the machine). ACKED is never fsynced: losing it only
// replays acknowledged batches, which gacd ignores as duplicates.
//
// Recovery (Open): a torn entry at the end of a segment (a crash mid-append)
// is cut off; an entry whose checksum does not match is skipped; an entry
// whose header is damaged ends the scan of its segment (its length cannot be
// trusted). Each case is counted and described in SpoolRecovery.
//
// Thread safety: not thread-safe; one owner (the sender thread).

#ifndef GAC_TRANSPORT_SPOOL_H_
#define GAC_TRANSPORT_SPOOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "gac/base/status.h"

namespace gac::transport {

enum class SpoolFsync : std::uint8_t { kNone = 0, kEveryAppend = 1 };

struct SpoolOptions {
  std::string dir;                               // created if missing
  std::uint64_t max_bytes = 256ull << 20;        // unacknowledged bytes on disk
  std::uint64_t segment_bytes = 8ull << 20;      // a new segment beyond this
  SpoolFsync fsync = SpoolFsync::kNone;
};

struct SpoolRecovery {
  std::uint64_t entries = 0;          // unacknowledged entries found
  std::uint64_t bytes = 0;            // their payload bytes
  std::uint64_t dropped_entries = 0;  // damaged entries dropped
  std::uint64_t dropped_bytes = 0;    // bytes cut off or skipped
  std::string detail;                 // one line per damage found; "" when clean
};

// CRC-32 (IEEE 802.3, reflected, as zlib's crc32).
std::uint32_t Crc32(const void* data, std::size_t size, std::uint32_t crc = 0);

class Spool {
 public:
  // Opens or creates the spool in options.dir and recovers what is there.
  static base::StatusOr<std::unique_ptr<Spool>> Open(const SpoolOptions& options, SpoolRecovery* recovery);
  ~Spool();
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  // Appends an entry. REQUIRES: seq above every sequence appended before.
  // RESOURCE_EXHAUSTED when the unacknowledged bytes would exceed max_bytes
  // (nothing written); DATA_LOSS on an I/O error.
  base::Status Append(std::uint64_t seq, std::string_view payload);

  // Every entry with sequence <= seq is acknowledged.
  base::Status Acknowledge(std::uint64_t seq);

  // Calls fn(seq, payload) for every unacknowledged entry, in order.
  base::Status ForEachUnacknowledged(const std::function<void(std::uint64_t, std::string&&)>& fn) const;

  std::uint64_t unacknowledged_bytes() const { return bytes_; }
  // The highest sequence appended or acknowledged (the next append must be
  // above it).
  std::uint64_t last_sequence() const { return last_seq_; }
  std::uint64_t acknowledged_sequence() const { return acked_; }

 private:
  struct Segment {
    std::string path;
    std::uint64_t first_seq = 0;
    std::uint64_t last_seq = 0;
    std::uint64_t size = 0;  // file bytes
    std::uint64_t payload_bytes = 0;
    bool has_entries = false;
  };
  explicit Spool(SpoolOptions options) : options_(std::move(options)) {}
  base::Status Recover(SpoolRecovery* recovery);
  base::Status OpenNewSegment(std::uint64_t first_seq);
  void DropAcknowledgedSegments();

  const SpoolOptions options_;
  std::deque<Segment> segments_;  // oldest first; the last one is open for appends when fd_ >= 0
  int fd_ = -1;
  std::uint64_t bytes_ = 0;       // unacknowledged payload bytes (approximate per segment)
  std::uint64_t last_seq_ = 0;
  std::uint64_t acked_ = 0;
};

}  // namespace gac::transport

#endif  // GAC_TRANSPORT_SPOOL_H_
