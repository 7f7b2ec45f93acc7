// Bearer-token authentication and run-scoped authorisation of gacd.
//
// The token file has one token per line; '#' starts a comment:
//
//   # name      token                             rights           runs
//   trainer     7c1f0d6e4b0a4f3e9d2c8b1a5e6f7a8b  write            exp-*,ablation-?
//   grafana     0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b  read             *
//   operator    a1b2c3d4e5f60718293a4b5c6d7e8f90  read,write,admin *
//
// name: [A-Za-z0-9._-]+, unique, recorded in the audit log; token: at least
// 16 characters, no whitespace, unique; rights: comma-separated read, write,
// admin (each independent: admin does not imply read); runs: comma-separated
// glob patterns ('*' any run, '?' one character) over run ids.
//
// The file must not be readable or writable by other users, nor writable by
// its group (mode 0600, or 0640 with a group of gacd's own): FromFile
// refuses it otherwise (FAILED_PRECONDITION), as ssh refuses a private key
// others can read. No error message or log line repeats a token.
//
// Clients send the header "authorization: Bearer <token>". A missing or
// unknown token is UNAUTHENTICATED; a known token without the right on the
// run is PERMISSION_DENIED. In insecure mode (explicit, for local use) every
// call is allowed and attributed to "insecure".
//
// Thread safety: immutable after construction; safe for concurrent use.

#ifndef GAC_SERVER_SRC_AUTH_H_
#define GAC_SERVER_SRC_AUTH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gac/base/status.h"

namespace gac::server {

enum Right : std::uint8_t { kRead = 1, kWrite = 2, kAdmin = 4 };

const char* RightName(Right right);

struct Principal {
  std::string name;
  std::string token;
  std::uint8_t rights = 0;             // bitwise or of Right
  std::vector<std::string> run_patterns;

  // True when this principal holds `right` on `run`.
  bool Allows(Right right, std::string_view run) const;
  // True when some run may exist that this principal holds `right` on.
  bool HasRight(Right right) const { return (rights & right) != 0; }
};

// Glob match of '*' and '?' over the whole of `text`.
bool GlobMatch(std::string_view pattern, std::string_view text);

class Authenticator {
 public:
  // Parses a token file (format above). InvalidArgument with the line number
  // for a malformed line; the errno's code (NotFound, PermissionDenied...)
  // when it cannot be read; FailedPrecondition when others may read it or
  // change it (see above).
  static base::StatusOr<Authenticator> FromFile(const std::string& path);
  static base::StatusOr<Authenticator> FromText(std::string_view text);
  // Every call allowed; the principal is named "insecure".
  static Authenticator Insecure();

  // Resolves the value of the "authorization" header (may be empty).
  // Returns UNAUTHENTICATED for a missing, malformed or unknown token.
  // The returned pointer lives as long as this object.
  base::StatusOr<const Principal*> Authenticate(std::string_view authorization) const;

  // PERMISSION_DENIED unless `principal` holds `right` on `run`.
  static base::Status Authorize(const Principal& principal, Right right, std::string_view run);

  bool insecure() const { return insecure_; }
  std::size_t size() const { return principals_->size(); }

 private:
  Authenticator() = default;

  bool insecure_ = false;
  std::shared_ptr<std::vector<Principal>> principals_;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_AUTH_H_
