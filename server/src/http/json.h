// JsonWriter: appends JSON text (RFC 8259) to a string, for gacd's HTTP API.
//
// Strings are escaped (quote, backslash and control characters) and always
// come out as valid UTF-8: a byte that does not start or continue a valid
// UTF-8 sequence is written as U+FFFD. Doubles are written in their
// shortest form that reads back to the same value; NaN and infinities,
// which JSON cannot represent, are written as null. The writer does not
// check the nesting: callers pair Begin*/End* and put a Key before each
// value inside an object.
//
// Thread safety: a value; use from one thread at a time.
#ifndef GAC_SERVER_SRC_HTTP_JSON_H_
#define GAC_SERVER_SRC_HTTP_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace gac::server {

class JsonWriter {
 public:
  // Appends to `*out`, which must outlive the writer.
  explicit JsonWriter(std::string* out) : out_(out) {}

  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  // The name of the next member of the current object.
  void Key(std::string_view key);

  void String(std::string_view value);
  void Int(std::int64_t value);
  void Uint(std::uint64_t value);
  // A 64-bit integer as a decimal string: for values (nanosecond
  // timestamps) that a JSON number would not keep exactly in a reader
  // that parses numbers as doubles (beyond 2^53).
  void IntString(std::int64_t value);
  void Double(double value);
  void Bool(bool value);
  void Null();

 private:
  void Open(char c);
  void Close(char c);
  void Separate() {
    if (need_comma_) out_->push_back(',');
    need_comma_ = true;
  }

  std::string* out_;
  bool need_comma_ = false;  // a value was written at this level
};

// `value` as a JSON string literal, quotes included.
std::string JsonQuote(std::string_view value);

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_HTTP_JSON_H_
