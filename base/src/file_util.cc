#include "gac/base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace gac::base {

Status MakeDirs(const std::string& dir, const std::string& what, unsigned mode) {
  if (dir.empty()) return Status::InvalidArgument(what + " path is empty");
  std::string prefix;
  for (std::size_t i = 0; i <= dir.size(); ++i) {
    if ((i == dir.size() || dir[i] == '/') && !prefix.empty() && prefix != "/") {
      if (mkdir(prefix.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST) {
        return ErrnoToStatus(errno, "cannot create " + what + " '" + dir + "'");
      }
    }
    if (i < dir.size()) prefix += dir[i];
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return ErrnoToStatus(errno, "cannot create " + what + " '" + dir + "'");
  if (!S_ISDIR(st.st_mode)) return Status::FailedPrecondition(what + " '" + dir + "' exists and is not a directory");
  return Status::Ok();
}

StatusOr<std::string> ReadFileToString(const std::string& path, const std::string& what) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "cannot read " + what + " '" + path + "'");
  std::string out;
  char buf[1 << 14];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      const int err = errno;
      close(fd);
      return ErrnoToStatus(err, "error reading " + what + " '" + path + "'");
    }
  }
  close(fd);
  return out;
}

}  // namespace gac::base
