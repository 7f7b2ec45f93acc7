#include "gac/transport/spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "gac/base/file_util.h"

namespace gac::transport {
namespace {

constexpr std::uint32_t kMagic = 0x31505347;  // "GSP1" little-endian
constexpr std::size_t kHeader = 20;
constexpr std::uint32_t kMaxPayload = 64u << 20;

void Put32(char* p, std::uint32_t v) { std::memcpy(p, &v, 4); }
void Put64(char* p, std::uint64_t v) { std::memcpy(p, &v, 8); }
std::uint32_t Get32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
std::uint64_t Get64(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::uint32_t EntryCrc(std::uint64_t seq, const char* payload, std::size_t size) {
  char s[8];
  Put64(s, seq);
  return Crc32(payload, size, Crc32(s, 8));
}

std::string SegmentName(std::uint64_t first_seq) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "spool-%020llu.log", static_cast<unsigned long long>(first_seq));
  return buf;
}

struct ScanResult {
  std::uint64_t good_end = 0;  // offset after the last intact entry
  bool truncate = false;       // bytes after good_end are damaged
};

// Reads every entry of `data`; fn(seq, payload, size) for intact ones,
// damage(description, bytes) for damaged ones.
template <typename Fn, typename Damage>
ScanResult Scan(const std::string& name, const std::string& data, Fn&& fn, Damage&& damage) {
  ScanResult r;
  std::size_t off = 0;
  while (off < data.size()) {
    const std::size_t left = data.size() - off;
    if (left < kHeader) {
      damage(name + ": torn entry header at offset " + std::to_string(off), left);
      r.truncate = true;
      break;
    }
    const char* h = data.data() + off;
    const std::uint32_t magic = Get32(h), len = Get32(h + 4), crc = Get32(h + 16);
    const std::uint64_t seq = Get64(h + 8);
    if (magic != kMagic || len > kMaxPayload) {
      damage(name + ": damaged entry header at offset " + std::to_string(off) + "; rest of the segment dropped", left);
      r.truncate = true;
      break;
    }
    if (left < kHeader + len) {
      damage(name + ": torn entry (sequence " + std::to_string(seq) + ") at offset " + std::to_string(off), left);
      r.truncate = true;
      break;
    }
    const char* payload = h + kHeader;
    if (EntryCrc(seq, payload, len) != crc) {
      damage(name + ": checksum mismatch in entry (sequence " + std::to_string(seq) + ") at offset " +
                 std::to_string(off),
             kHeader + len);
    } else {
      fn(seq, payload, static_cast<std::size_t>(len));
    }
    off += kHeader + len;
    r.good_end = off;
  }
  return r;
}

}  // namespace

std::uint32_t Crc32(const void* data, std::size_t size, std::uint32_t crc) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

base::StatusOr<std::unique_ptr<Spool>> Spool::Open(const SpoolOptions& options, SpoolRecovery* recovery) {
  if (options.dir.empty()) return base::Status::InvalidArgument("spool directory is empty");
  if (options.max_bytes == 0 || options.segment_bytes == 0) {
    return base::Status::InvalidArgument("spool max_bytes and segment_bytes must be > 0");
  }
  base::Status st = base::MakeDirs(options.dir, "spool directory");
  if (!st.ok()) return st;
  std::unique_ptr<Spool> spool(new Spool(options));
  SpoolRecovery local;
  st = spool->Recover(recovery != nullptr ? recovery : &local);
  if (!st.ok()) return st;
  return spool;
}

Spool::~Spool() {
  if (fd_ >= 0) close(fd_);
}

base::Status Spool::Recover(SpoolRecovery* recovery) {
  *recovery = SpoolRecovery{};
  {
    std::ifstream in(options_.dir + "/ACKED");
    unsigned long long v = 0;
    if (in >> v) acked_ = v;
  }
  DIR* d = opendir(options_.dir.c_str());
  if (d == nullptr) return base::ErrnoToStatus(errno, "cannot read spool directory '" + options_.dir + "'");
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind("spool-", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".log") == 0) names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());  // zero-padded: sequence order
  for (const std::string& name : names) {
    Segment seg;
    seg.path = options_.dir + "/" + name;
    GAC_ASSIGN_OR_RETURN(std::string read, base::ReadFileToString(seg.path, "spool segment"));
    const std::string& data = read;
    const ScanResult r = Scan(
        name, data,
        [&](std::uint64_t seq, const char*, std::size_t size) {
          if (!seg.has_entries) seg.first_seq = seq;
          seg.has_entries = true;
          seg.last_seq = std::max(seg.last_seq, seq);
          seg.payload_bytes += size;
          last_seq_ = std::max(last_seq_, seq);
          if (seq > acked_) {
            ++recovery->entries;
            recovery->bytes += size;
          }
        },
        [&](const std::string& what, std::uint64_t bytes) {
          ++recovery->dropped_entries;
          recovery->dropped_bytes += bytes;
          recovery->detail += what + "\n";
        });
    if (r.truncate && truncate(seg.path.c_str(), static_cast<off_t>(r.good_end)) != 0) {
      return base::ErrnoToStatus(errno, "cannot truncate damaged spool segment '" + seg.path + "'");
    }
    seg.size = r.good_end;
    if (!seg.has_entries || seg.last_seq <= acked_) {
      unlink(seg.path.c_str());
      continue;
    }
    bytes_ += seg.payload_bytes;
    segments_.push_back(seg);
  }
  // New entries must come after everything acknowledged, even when no entry
  // survived (all acknowledged and deleted, or damaged): an entry numbered at
  // or below ACKED would count as acknowledged and be lost in the next
  // recovery.
  last_seq_ = std::max(last_seq_, acked_);
  return base::Status::Ok();
}

base::Status Spool::OpenNewSegment(std::uint64_t first_seq) {
  if (fd_ >= 0) close(fd_);
  Segment seg;
  seg.path = options_.dir + "/" + SegmentName(first_seq);
  seg.first_seq = first_seq;
  fd_ = open(seg.path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd_ < 0) return base::ErrnoToStatus(errno, "cannot create spool segment '" + seg.path + "'");
  segments_.push_back(seg);
  return base::Status::Ok();
}

base::Status Spool::Append(std::uint64_t seq, std::string_view payload) {
  if (payload.size() > kMaxPayload) return base::Status::InvalidArgument("spool entry larger than 64 MiB");
  if (bytes_ + payload.size() > options_.max_bytes) {
    return base::Status(base::StatusCode::kResourceExhausted, "spool full (" + std::to_string(bytes_) + " bytes unacknowledged)");
  }
  if (fd_ < 0 || segments_.back().size >= options_.segment_bytes) {
    base::Status st = OpenNewSegment(seq);
    if (!st.ok()) return st;
  }
  char header[kHeader];
  Put32(header, kMagic);
  Put32(header + 4, static_cast<std::uint32_t>(payload.size()));
  Put64(header + 8, seq);
  Put32(header + 16, EntryCrc(seq, payload.data(), payload.size()));
  std::string entry(header, kHeader);
  entry.append(payload);
  std::size_t off = 0;
  while (off < entry.size()) {
    const ssize_t n = write(fd_, entry.data() + off, entry.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const base::Status err = base::ErrnoToStatus(errno, "cannot append to spool segment '" + segments_.back().path + "'");
      // Cut a partial entry so the segment stays readable; later appends go
      // to a fresh segment.
      if (ftruncate(fd_, static_cast<off_t>(segments_.back().size)) != 0) {
        // The torn entry will be dropped by the next recovery.
      }
      close(fd_);
      fd_ = -1;
      if (!segments_.back().has_entries) {
        // A segment opened for this entry alone: no empty files pile up while
        // the disk stays full, and none stands before acknowledged segments
        // that DropAcknowledgedSegments must delete to free the disk.
        unlink(segments_.back().path.c_str());
        segments_.pop_back();
      }
      return err;
    }
    off += static_cast<std::size_t>(n);
  }
  if (options_.fsync == SpoolFsync::kEveryAppend && fdatasync(fd_) != 0) {
    return base::ErrnoToStatus(errno, "cannot sync spool segment '" + segments_.back().path + "'");
  }
  Segment& seg = segments_.back();
  if (!seg.has_entries) seg.first_seq = seq;
  seg.has_entries = true;
  seg.last_seq = seq;
  seg.size += entry.size();
  seg.payload_bytes += payload.size();
  bytes_ += payload.size();
  last_seq_ = std::max(last_seq_, seq);
  return base::Status::Ok();
}

void Spool::DropAcknowledgedSegments() {
  while (!segments_.empty()) {
    Segment& seg = segments_.front();
    const bool open_for_append = fd_ >= 0 && segments_.size() == 1;
    if (seg.has_entries ? seg.last_seq > acked_ : open_for_append) break;
    if (open_for_append) {
      close(fd_);
      fd_ = -1;
    }
    unlink(seg.path.c_str());
    bytes_ -= std::min(bytes_, seg.payload_bytes);
    segments_.pop_front();
  }
}

base::Status Spool::Acknowledge(std::uint64_t seq) {
  if (seq <= acked_) return base::Status::Ok();
  acked_ = seq;
  // Segments first: on a full disk, ACKED can be written only once they are
  // gone. Deleting acknowledged entries before ACKED says so is safe: a
  // crash in between leaves an older ACKED, which at worst replays entries
  // gacd already stored (it ignores them as duplicates).
  DropAcknowledgedSegments();
  const std::string tmp = options_.dir + "/ACKED.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << acked_ << "\n";
    out.flush();
    if (!out) {
      const int err = errno;
      out.close();
      unlink(tmp.c_str());
      return base::ErrnoToStatus(err, "cannot write '" + tmp + "'");
    }
  }
  if (std::rename(tmp.c_str(), (options_.dir + "/ACKED").c_str()) != 0) {
    return base::ErrnoToStatus(errno, "cannot replace '" + options_.dir + "/ACKED'");
  }
  return base::Status::Ok();
}

base::Status Spool::ForEachUnacknowledged(const std::function<void(std::uint64_t, std::string&&)>& fn) const {
  for (const Segment& seg : segments_) {
    GAC_ASSIGN_OR_RETURN(std::string read, base::ReadFileToString(seg.path, "spool segment"));
    const std::string& data = read;
    Scan(
        seg.path, data,
        [&](std::uint64_t seq, const char* payload, std::size_t size) {
          if (seq > acked_) fn(seq, std::string(payload, size));
        },
        [](const std::string&, std::uint64_t) {});
  }
  return base::Status::Ok();
}

}  // namespace gac::transport
