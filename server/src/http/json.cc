#include "server/src/http/json.h"

#include <charconv>
#include <cmath>

namespace gac::server {
namespace {

// Length of the valid UTF-8 sequence that starts at s[i] (a byte >= 0x80),
// or 0 when it is not one (RFC 3629: no overlong forms, no surrogates,
// nothing above U+10FFFF).
std::size_t Utf8SequenceLength(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  std::size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < len; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return len;
}

void AppendQuoted(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  std::size_t run = 0;  // start of the bytes not yet copied
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      if (const std::size_t len = Utf8SequenceLength(s, i); len != 0) {
        i += len;
        continue;
      }
    }
    out->append(s.data() + run, i - run);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xF]);
        } else {
          out->append("\\ufffd");  // not UTF-8
        }
    }
    run = ++i;
  }
  out->append(s.data() + run, s.size() - run);
  out->push_back('"');
}

template <typename T>
void AppendNumber(std::string* out, T value) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  (void)ec;  // 32 bytes hold any 64-bit integer and any shortest double
  out->append(buf, end);
}

}  // namespace

void JsonWriter::Open(char c) {
  Separate();
  out_->push_back(c);
  need_comma_ = false;
}

void JsonWriter::Close(char c) {
  out_->push_back(c);
  need_comma_ = true;
}

void JsonWriter::Key(std::string_view key) {
  Separate();
  AppendQuoted(out_, key);
  out_->push_back(':');
  need_comma_ = false;
}

void JsonWriter::String(std::string_view value) {
  Separate();
  AppendQuoted(out_, value);
}

void JsonWriter::Int(std::int64_t value) {
  Separate();
  AppendNumber(out_, value);
}

void JsonWriter::Uint(std::uint64_t value) {
  Separate();
  AppendNumber(out_, value);
}

void JsonWriter::IntString(std::int64_t value) {
  Separate();
  out_->push_back('"');
  AppendNumber(out_, value);
  out_->push_back('"');
}

void JsonWriter::Double(double value) {
  Separate();
  if (!std::isfinite(value)) {
    out_->append("null");
    return;
  }
  AppendNumber(out_, value);
}

void JsonWriter::Bool(bool value) {
  Separate();
  out_->append(value ? "true" : "false");
}

void JsonWriter::Null() {
  Separate();
  out_->append("null");
}

std::string JsonQuote(std::string_view value) {
  std::string out;
  AppendQuoted(&out, value);
  return out;
}

}  // namespace gac::server
