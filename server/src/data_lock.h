// DataLock: the exclusive claim of one gacd on a SQLite store's files.
//
// Two gacd processes on one SQLite database would both serve, each with its
// own in-memory run settings and metrics, and write one file. gacd takes an
// advisory lock (flock) on a lock file beside the database before it opens
// it, and holds it for its life: a second gacd on the same files refuses to
// start and names the holder, as Prometheus does with its data directory. The
// kernel drops the lock when the holder exits, however it exits, so a lock
// file left behind by a killed gacd never blocks the next one.
//
// Thread safety: a value that owns a file descriptor; not synchronised.
#ifndef GAC_SERVER_SRC_DATA_LOCK_H_
#define GAC_SERVER_SRC_DATA_LOCK_H_

#include <string>

#include "gac/base/status.h"

namespace gac::server {

class DataLock {
 public:
  // Takes the lock on `path` (created, mode 0640, if missing) and writes this
  // process' id and host into it. FailedPrecondition naming the holder's
  // process id and host when another process holds it; an errno status when
  // the file cannot be opened.
  static base::StatusOr<DataLock> Acquire(const std::string& path);

  DataLock() = default;  // holds nothing
  DataLock(DataLock&& other) noexcept;
  DataLock& operator=(DataLock&& other) noexcept;
  DataLock(const DataLock&) = delete;
  DataLock& operator=(const DataLock&) = delete;
  ~DataLock();  // releases the lock (the file stays)

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  DataLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_DATA_LOCK_H_
