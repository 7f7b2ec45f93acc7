// Status and StatusOr<T>: the one error channel at gac's library boundaries.
//
// The codes are gRPC's (and absl's), so an error crosses the RPC boundary
// unchanged (gac/proto/convert.h converts to and from grpc::Status). Every
// code has a factory (Status::NotFound(msg)) and a predicate
// (status.IsNotFound()). Failures of system calls are mapped from errno by
// ErrnoToStatus: a missing file is NOT_FOUND, a full disk RESOURCE_EXHAUSTED,
// a refused permission PERMISSION_DENIED. DATA_LOSS is kept for data that is
// unrecoverable or corrupt (a damaged database, a torn record), never for an
// I/O call that merely failed.
//
// An OK status holds no allocation; copying one is cheap. Status and StatusOr
// are values: not synchronised, safe to use from one thread at a time.
#ifndef GAC_BASE_STATUS_H_
#define GAC_BASE_STATUS_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace gac::base {

// Same numbering as grpc::StatusCode / absl::StatusCode.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// Returns the canonical upper-case name ("INVALID_ARGUMENT"); "UNKNOWN" for
// a value outside the enum.
const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  // A `code` of kOk gives OK and drops the message.
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }
  static Status Cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status Unknown(std::string msg) { return {StatusCode::kUnknown, std::move(msg)}; }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status DeadlineExceeded(std::string msg) { return {StatusCode::kDeadlineExceeded, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status PermissionDenied(std::string msg) { return {StatusCode::kPermissionDenied, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  static Status Unimplemented(std::string msg) { return {StatusCode::kUnimplemented, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status DataLoss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
  static Status Unauthenticated(std::string msg) { return {StatusCode::kUnauthenticated, std::move(msg)}; }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  const std::string& message() const;
  // "OK" or "INVALID_ARGUMENT: <message>".
  std::string ToString() const;

  bool IsCancelled() const { return code() == StatusCode::kCancelled; }
  bool IsUnknown() const { return code() == StatusCode::kUnknown; }
  bool IsInvalidArgument() const { return code() == StatusCode::kInvalidArgument; }
  bool IsDeadlineExceeded() const { return code() == StatusCode::kDeadlineExceeded; }
  bool IsNotFound() const { return code() == StatusCode::kNotFound; }
  bool IsAlreadyExists() const { return code() == StatusCode::kAlreadyExists; }
  bool IsPermissionDenied() const { return code() == StatusCode::kPermissionDenied; }
  bool IsResourceExhausted() const { return code() == StatusCode::kResourceExhausted; }
  bool IsFailedPrecondition() const { return code() == StatusCode::kFailedPrecondition; }
  bool IsAborted() const { return code() == StatusCode::kAborted; }
  bool IsOutOfRange() const { return code() == StatusCode::kOutOfRange; }
  bool IsUnimplemented() const { return code() == StatusCode::kUnimplemented; }
  bool IsInternal() const { return code() == StatusCode::kInternal; }
  bool IsUnavailable() const { return code() == StatusCode::kUnavailable; }
  bool IsDataLoss() const { return code() == StatusCode::kDataLoss; }
  bool IsUnauthenticated() const { return code() == StatusCode::kUnauthenticated; }

  // The same code with "<prefix>: " in front of the message (OK stays OK).
  Status WithPrefix(const std::string& prefix) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }
  friend bool operator!=(const Status& a, const Status& b) { return !(a == b); }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null when OK
};

// The status code of a failed system call's errno (ENOENT: NOT_FOUND,
// EACCES/EPERM/EROFS: PERMISSION_DENIED, ENOSPC/EDQUOT/EMFILE/ENOMEM:
// RESOURCE_EXHAUSTED, EEXIST: ALREADY_EXISTS, ENOTDIR/EISDIR/EBUSY:
// FAILED_PRECONDITION, EINTR/EAGAIN/EIO...: UNAVAILABLE, ...; 0 is OK).
StatusCode ErrnoToStatusCode(int errno_value);
// `message` followed by ": " and strerror(errno_value), with the code above.
Status ErrnoToStatus(int errno_value, const std::string& message);

namespace internal {
// Writes "StatusOr::value() on an error: <status>" to stderr and aborts.
[[noreturn]] void DieOfStatusOrError(const Status& status);
}  // namespace internal

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // REQUIRES: !status.ok().
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Status::Internal("StatusOr constructed from an OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  // The value. On an error it stops the process with the status' message
  // (as absl::StatusOr does): a caller that may see an error checks ok().
  const T& value() const& {
    if (!ok()) internal::DieOfStatusOrError(status_);
    return *value_;
  }
  T& value() & {
    if (!ok()) internal::DieOfStatusOrError(status_);
    return *value_;
  }
  T&& value() && {
    if (!ok()) internal::DieOfStatusOrError(status_);
    return std::move(*value_);
  }
  // REQUIRES: ok(). Unchecked.
  const T& operator*() const& { return *value_; }
  T& operator*() & { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  const T* operator->() const { return &*value_; }
  T* operator->() { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace gac::base

// Evaluates `expr` (a Status) and returns it from the enclosing function
// when it is not OK.
#define GAC_RETURN_IF_ERROR(expr)                   \
  do {                                              \
    ::gac::base::Status gac_status_ = (expr);             \
    if (!gac_status_.ok()) return gac_status_;      \
  } while (0)

// Evaluates `expr` (a StatusOr<T>); when it holds an error, returns that
// status from the enclosing function, else moves the value into `lhs`, which
// may declare a variable: GAC_ASSIGN_OR_RETURN(auto rows, store.Read(run));
#define GAC_ASSIGN_OR_RETURN(lhs, expr) \
  GAC_ASSIGN_OR_RETURN_IMPL_(GAC_STATUS_CONCAT_(gac_status_or_, __LINE__), lhs, expr)
#define GAC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
#define GAC_STATUS_CONCAT_(a, b) GAC_STATUS_CONCAT_INNER_(a, b)
#define GAC_STATUS_CONCAT_INNER_(a, b) a##b

#endif  // GAC_BASE_STATUS_H_
