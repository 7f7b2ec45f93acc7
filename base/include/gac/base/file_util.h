// Small POSIX file helpers shared by gacd, the transport and gacctl. Errors
// carry the code of the failed call's errno (gac/base/status.h: ErrnoToStatus),
// so a missing directory is NOT_FOUND and a full disk RESOURCE_EXHAUSTED.
//
// Thread safety: the functions are reentrant.
#ifndef GAC_BASE_FILE_UTIL_H_
#define GAC_BASE_FILE_UTIL_H_

#include <string>

#include "gac/base/status.h"

namespace gac::base {

// Creates `dir` and every missing parent with permission bits `mode` (less
// the umask); directories that exist are left as they are. `what` names the
// directory in errors ("data directory", "spool directory").
Status MakeDirs(const std::string& dir, const std::string& what, unsigned mode = 0750);

// The whole content of `path`. `what` names the file in errors ("TLS key").
StatusOr<std::string> ReadFileToString(const std::string& path, const std::string& what);

}  // namespace gac::base

#endif  // GAC_BASE_FILE_UTIL_H_
