#include "gac/base/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gac::base {

namespace internal {
void DieOfStatusOrError(const Status& status) {
  std::fprintf(stderr, "StatusOr::value() on an error: %s\n", status.ToString().c_str());
  std::abort();
}
}  // namespace internal

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(rep_->code)) + ": " + rep_->message;
}

Status Status::WithPrefix(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(rep_->code, prefix + ": " + rep_->message);
}

StatusCode ErrnoToStatusCode(int errno_value) {
  switch (errno_value) {
    case 0:
      return StatusCode::kOk;
    case EINVAL: case ENAMETOOLONG: case E2BIG: case EFAULT: case ENOTTY: case ESPIPE: case ELOOP:
      return StatusCode::kInvalidArgument;
    case ETIMEDOUT:
      return StatusCode::kDeadlineExceeded;
    case ENOENT: case ENODEV: case ENXIO: case ESRCH:
      return StatusCode::kNotFound;
    case EEXIST:
      return StatusCode::kAlreadyExists;
    case EPERM: case EACCES: case EROFS:
      return StatusCode::kPermissionDenied;
    case ENOTDIR: case EISDIR: case ENOTEMPTY: case EBUSY: case ETXTBSY: case EBADF: case EPIPE:
    case EADDRINUSE: case ENOTCONN:
      return StatusCode::kFailedPrecondition;
    case ENOSPC: case EDQUOT: case EMFILE: case ENFILE: case ENOMEM: case ENOBUFS: case EMLINK: case EFBIG:
      return StatusCode::kResourceExhausted;
    case EOVERFLOW: case ERANGE:
      return StatusCode::kOutOfRange;
    case ENOSYS: case EOPNOTSUPP: case EXDEV: case EAFNOSUPPORT: case EPROTONOSUPPORT:
      return StatusCode::kUnimplemented;
    case EINTR: case EAGAIN: case EIO: case ECONNREFUSED: case ECONNRESET: case ECONNABORTED:
    case EHOSTUNREACH: case ENETUNREACH: case ENETDOWN: case ENOLCK:
      return StatusCode::kUnavailable;
    case EDEADLK: case ESTALE:
      return StatusCode::kAborted;
    case ECANCELED:
      return StatusCode::kCancelled;
    default:
      return StatusCode::kUnknown;
  }
}

Status ErrnoToStatus(int errno_value, const std::string& message) {
  return Status(ErrnoToStatusCode(errno_value), message + ": " + std::strerror(errno_value));
}

}  // namespace gac::base
