#include "server/src/data_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

namespace gac::server {
namespace {

// What the holder wrote ("pid 123 host h"), or "" when unreadable.
std::string Holder(int fd) {
  char buf[256];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string text(buf, static_cast<std::size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

}  // namespace

base::StatusOr<DataLock> DataLock::Acquire(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return base::ErrnoToStatus(errno, "cannot open the lock file " + path);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const std::string holder = Holder(fd);
      close(fd);
      return base::Status::FailedPrecondition(
          "the store is in use by another gacd (" + (holder.empty() ? std::string("holder unknown") : holder) +
          ", lock file " + path + "): stop that gacd, or give this one another --store");
    }
    close(fd);
    return base::ErrnoToStatus(err, "cannot lock " + path);
  }
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::string who = "pid " + std::to_string(getpid()) + " host " + (host[0] ? host : "unknown") + "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, who.data(), who.size(), 0) != static_cast<ssize_t>(who.size())) {
    const int err = errno;
    close(fd);
    return base::ErrnoToStatus(err, "cannot write the lock file " + path);
  }
  return DataLock(fd, path);
}

DataLock::DataLock(DataLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

DataLock& DataLock::operator=(DataLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

DataLock::~DataLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace gac::server
