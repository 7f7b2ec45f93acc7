#include "server/src/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <sstream>
#include <unordered_map>
#include <unordered_set>


namespace gac::server {
namespace {

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, ',')) out.push_back(cur);
  return out;
}

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// Compares in time independent of where the strings differ.
bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

base::Status CheckTokenFileMode(const std::string& path, unsigned mode) {
  // Like ssh with a private key: secrets that others can read are refused,
  // and so is a file that others could change to add a token of their own.
  if ((mode & (S_IRWXO | S_IWGRP)) == 0) return base::Status::Ok();
  char octal[8];
  std::snprintf(octal, sizeof octal, "%04o", mode & 07777u);
  return base::Status::FailedPrecondition("token file '" + path + "' has mode " + octal +
                                    ": other users may read or change the tokens; make it readable by gacd "
                                    "alone (chmod 600, or 640 with a group of gacd's own)");
}

// The whole file behind `fd`.
base::StatusOr<std::string> ReadAll(int fd) {
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return base::ErrnoToStatus(errno, "read failed");
    if (n == 0) return text;
    text.append(buf, static_cast<std::size_t>(n));
  }
}

}  // namespace

const char* RightName(Right right) {
  switch (right) {
    case kRead:
      return "read";
    case kWrite:
      return "write";
    case kAdmin:
      return "admin";
  }
  return "?";
}

bool GlobMatch(std::string_view pattern, std::string_view text) {
  // Iterative matcher with single-star backtracking: O(|p|·|t|) worst case.
  std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool Principal::Allows(Right right, std::string_view run) const {
  if ((rights & right) == 0) return false;
  for (const std::string& pattern : run_patterns) {
    if (GlobMatch(pattern, run)) return true;
  }
  return false;
}

base::StatusOr<Authenticator> Authenticator::FromFile(const std::string& path) {
  // The mode is checked on the file that is read (no swap between the two).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return base::ErrnoToStatus(errno, "cannot read token file '" + path + "'");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const base::Status err = base::ErrnoToStatus(errno, "cannot stat token file '" + path + "'");
    close(fd);
    return err;
  }
  base::Status mode = CheckTokenFileMode(path, st.st_mode);
  if (!mode.ok()) {
    close(fd);
    return mode;
  }
  base::StatusOr<std::string> text = ReadAll(fd);
  close(fd);
  if (!text.ok()) return base::Status(text.status().code(), "cannot read token file '" + path + "': " + text.status().message());
  base::StatusOr<Authenticator> auth = FromText(*text);
  if (!auth.ok()) {
    return base::Status(auth.status().code(), "token file '" + path + "': " + auth.status().message());
  }
  return auth;
}

base::StatusOr<Authenticator> Authenticator::FromText(std::string_view text) {
  Authenticator auth;
  auth.principals_ = std::make_shared<std::vector<Principal>>();
  std::unordered_map<std::string, int> names;  // line of each
  std::unordered_set<std::string> tokens;
  std::istringstream in{std::string(text)};
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    if (f.empty()) continue;
    const std::string where = "line " + std::to_string(lineno) + ": ";
    if (f.size() != 4) {
      return base::Status::InvalidArgument(where + "expected 4 fields (name token rights runs), got " +
                                     std::to_string(f.size()));
    }
    Principal p;
    p.name = f[0];
    for (char c : p.name) {
      if (!NameChar(c)) return base::Status::InvalidArgument(where + "name may contain only [A-Za-z0-9._-]");
    }
    p.token = f[1];
    if (p.token.size() < 16) return base::Status::InvalidArgument(where + "token shorter than 16 characters");
    for (const std::string& r : SplitComma(f[2])) {
      if (r == "read") {
        p.rights |= kRead;
      } else if (r == "write") {
        p.rights |= kWrite;
      } else if (r == "admin") {
        p.rights |= kAdmin;
      } else {
        // The field is not repeated: a token pasted into it would land in
        // the log.
        return base::Status::InvalidArgument(where + "the third field must list read, write or admin, comma-separated");
      }
    }
    p.run_patterns = SplitComma(f[3]);
    for (const std::string& pat : p.run_patterns) {
      if (pat.empty()) return base::Status::InvalidArgument(where + "empty run pattern");
    }
    if (const auto [it, fresh] = names.emplace(p.name, lineno); !fresh) {
      return base::Status::InvalidArgument(where + "duplicate name (as on line " + std::to_string(it->second) + ")");
    }
    if (!tokens.insert(p.token).second) return base::Status::InvalidArgument(where + "duplicate token");
    auth.principals_->push_back(std::move(p));
  }
  if (auth.principals_->empty()) return base::Status::InvalidArgument("no tokens defined");
  return auth;
}

Authenticator Authenticator::Insecure() {
  Authenticator auth;
  auth.insecure_ = true;
  Principal p;
  p.name = "insecure";
  p.rights = kRead | kWrite | kAdmin;
  p.run_patterns = {"*"};
  auth.principals_ = std::make_shared<std::vector<Principal>>(std::vector<Principal>{std::move(p)});
  return auth;
}

base::StatusOr<const Principal*> Authenticator::Authenticate(std::string_view authorization) const {
  if (insecure_) return &principals_->front();
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.empty()) {
    return base::Status(base::StatusCode::kUnauthenticated, "missing authorization: Bearer <token> metadata");
  }
  if (authorization.substr(0, kBearer.size()) != kBearer) {
    return base::Status(base::StatusCode::kUnauthenticated, "authorization metadata must be 'Bearer <token>'");
  }
  std::string_view token = authorization.substr(kBearer.size());
  const Principal* found = nullptr;
  for (const Principal& p : *principals_) {
    if (ConstantTimeEqual(p.token, token)) found = &p;
  }
  if (found == nullptr) return base::Status(base::StatusCode::kUnauthenticated, "unknown token");
  return found;
}

base::Status Authenticator::Authorize(const Principal& principal, Right right, std::string_view run) {
  if (principal.Allows(right, run)) return base::Status::Ok();
  return base::Status(base::StatusCode::kPermissionDenied, "'" + principal.name + "' has no " + RightName(right) +
                                                   " right on run '" + std::string(run) + "'");
}

}  // namespace gac::server
