// The page tokens of server/src/queries.h (run, step and offset tokens):
// whatever a client sends as a page_token. Properties: a token that decodes
// means exactly the number it spells (no wrap-around, no silent cut), and
// encoding what was decoded gives a token that decodes to the same key.
#include <cstdint>
#include <string>

#include "server/src/queries.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// The decimal digits of `text` without leading zeros ("" for zero).
std::string Canonical(const std::string& text) {
  const auto first = text.find_first_not_of('0');
  return first == std::string::npos ? "" : text.substr(first);
}

std::string Canonical(std::uint64_t v) { return v == 0 ? "" : std::to_string(v); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  const std::string token(reinterpret_cast<const char*>(data), size);

  if (base::StatusOr<std::string> run = server::DecodeRunToken(token); run.ok()) {
    GAC_FUZZ_CHECK(token.empty() || server::EncodeRunToken(*run) == token, "run token round trip");
  } else {
    GAC_FUZZ_CHECK(run.status().IsInvalidArgument(), run.status().ToString());
  }

  if (auto key = server::DecodeStepToken(token); key.ok()) {
    const auto dot = token.find('.');
    GAC_FUZZ_CHECK(key->first >= 0, "a step token never decodes to a negative step");
    GAC_FUZZ_CHECK(Canonical(token.substr(1, dot - 1)) == Canonical(static_cast<std::uint64_t>(key->first)),
                   "step token '" + token + "' means its step");
    GAC_FUZZ_CHECK(Canonical(token.substr(dot + 1)) == Canonical(key->second),
                   "step token '" + token + "' means its rank");
    auto again = server::DecodeStepToken(server::EncodeStepToken(key->first, key->second));
    GAC_FUZZ_CHECK(again.ok() && *again == *key, "step token round trip");
  } else {
    GAC_FUZZ_CHECK(key.status().IsInvalidArgument(), key.status().ToString());
  }

  if (auto offset = server::DecodeOffsetToken(token); offset.ok()) {
    GAC_FUZZ_CHECK(token.empty() || Canonical(token.substr(1)) == Canonical(*offset),
                   "offset token '" + token + "' means its offset");
    auto again = server::DecodeOffsetToken(server::EncodeOffsetToken(*offset));
    GAC_FUZZ_CHECK(again.ok() && *again == *offset, "offset token round trip");
  } else {
    GAC_FUZZ_CHECK(offset.status().IsInvalidArgument(), offset.status().ToString());
  }
  return 0;
}
