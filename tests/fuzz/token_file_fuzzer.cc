// gacd's token file (server/src/auth.h) and the authorization header. The
// input is the file's text; its last line is also sent as a header value.
// Properties: a refusal never repeats a token (a secret) of the file; every
// token of an accepted file authenticates as its own principal and a
// changed one does not; authorisation follows the run patterns.
#include <sstream>
#include <string>
#include <vector>

#include "server/src/auth.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The second field of each line: what would be a token.
  std::vector<std::string> secrets;
  {
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
      std::istringstream fields(line);
      std::string name, token;
      if (fields >> name >> token && token.size() >= 16) secrets.push_back(token);
    }
  }
  base::StatusOr<server::Authenticator> auth = server::Authenticator::FromText(text);
  if (!auth.ok()) {
    GAC_FUZZ_CHECK(auth.status().IsInvalidArgument(), auth.status().ToString());
    for (const std::string& s : secrets) {
      GAC_FUZZ_CHECK(auth.status().message().find(s) == std::string::npos,
                     "a refusal repeats a token: " + auth.status().message());
    }
    return 0;
  }
  GAC_FUZZ_CHECK(auth->size() == secrets.size(), "one principal per token line");
  for (const std::string& s : secrets) {
    base::StatusOr<const server::Principal*> p = auth->Authenticate("Bearer " + s);
    GAC_FUZZ_CHECK(p.ok() && (*p)->token == s, "a token authenticates as its principal");
    std::string changed = s;
    changed.back() ^= 1;
    base::StatusOr<const server::Principal*> q = auth->Authenticate("Bearer " + changed);
    GAC_FUZZ_CHECK(!q.ok() || (*q)->token == changed, "a changed token is someone else or no one");
    for (const char* run : {"exp-1", "a", "other-run/2"}) {
      bool matches = false;
      for (const std::string& pattern : (*p)->run_patterns) matches |= server::GlobMatch(pattern, run);
      GAC_FUZZ_CHECK((*p)->Allows(server::kRead, run) == (matches && (*p)->HasRight(server::kRead)),
                     "authorisation follows the run patterns");
    }
  }
  const std::string header = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
  base::StatusOr<const server::Principal*> p = auth->Authenticate(header);
  if (!p.ok()) {
    GAC_FUZZ_CHECK(p.status().code() == base::StatusCode::kUnauthenticated, p.status().ToString());
    for (const std::string& s : secrets) {
      GAC_FUZZ_CHECK(p.status().message().find(s) == std::string::npos, "a refusal repeats a token");
    }
  }
  return 0;
}
