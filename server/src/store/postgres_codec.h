// PostgreSQL's binary formats, as the PostgreSQL store sends and reads them:
// COPY ... FROM STDIN (FORMAT binary) streams, one-dimensional arrays for
// array parameters, and the big-endian scalars inside both and inside
// binary results. Only what the store uses: int8, int4, float8, bool, text
// and bytea.
//
// Thread safety: the builders are plain values; use one per thread.
#ifndef GAC_SERVER_SRC_STORE_POSTGRES_CODEC_H_
#define GAC_SERVER_SRC_STORE_POSTGRES_CODEC_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace gac::server::pg {

// Type OIDs of the PostgreSQL catalog (pg_type.dat); stable across versions.
inline constexpr unsigned kBoolOid = 16;
inline constexpr unsigned kByteaOid = 17;
inline constexpr unsigned kInt8Oid = 20;
inline constexpr unsigned kInt4Oid = 23;
inline constexpr unsigned kTextOid = 25;
inline constexpr unsigned kFloat8Oid = 701;
inline constexpr unsigned kTextArrayOid = 1009;
inline constexpr unsigned kInt8ArrayOid = 1016;

inline void PutInt16(std::string* out, std::int16_t v) {
  const auto u = __builtin_bswap16(static_cast<std::uint16_t>(v));
  out->append(reinterpret_cast<const char*>(&u), sizeof u);
}
inline void PutInt32(std::string* out, std::int32_t v) {
  const auto u = __builtin_bswap32(static_cast<std::uint32_t>(v));
  out->append(reinterpret_cast<const char*>(&u), sizeof u);
}
inline void PutInt64(std::string* out, std::int64_t v) {
  const auto u = __builtin_bswap64(static_cast<std::uint64_t>(v));
  out->append(reinterpret_cast<const char*>(&u), sizeof u);
}
// IEEE 754 bits, big-endian: exact, -0.0 and NaN included.
inline void PutFloat64(std::string* out, double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutInt64(out, static_cast<std::int64_t>(bits));
}

inline std::int64_t ReadInt64(const char* p) {
  std::uint64_t u;
  std::memcpy(&u, p, sizeof u);
  return static_cast<std::int64_t>(__builtin_bswap64(u));
}
inline std::int32_t ReadInt32(const char* p) {
  std::uint32_t u;
  std::memcpy(&u, p, sizeof u);
  return static_cast<std::int32_t>(__builtin_bswap32(u));
}
inline double ReadFloat64(const char* p) {
  const auto bits = static_cast<std::uint64_t>(ReadInt64(p));
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// A COPY FROM STDIN (FORMAT binary) stream: the signature header, then rows
// of length-prefixed fields, then the trailer (Finish).
class CopyStream {
 public:
  CopyStream() { Clear(); }

  // Starts again with an empty stream (keeps the buffer's capacity).
  void Clear() {
    buf_.clear();
    buf_.append("PGCOPY\n\377\r\n\0", 11);
    PutInt32(&buf_, 0);  // flags: no OIDs
    PutInt32(&buf_, 0);  // header extension length
    rows_ = 0;
  }
  void Reserve(std::size_t bytes) { buf_.reserve(bytes); }

  CopyStream& Row(int fields) {
    ++rows_;
    PutInt16(&buf_, static_cast<std::int16_t>(fields));
    return *this;
  }
  CopyStream& Int8(std::int64_t v) {
    PutInt32(&buf_, 8);
    PutInt64(&buf_, v);
    return *this;
  }
  CopyStream& Int4(std::int32_t v) {
    PutInt32(&buf_, 4);
    PutInt32(&buf_, v);
    return *this;
  }
  CopyStream& Float8(double v) {
    PutInt32(&buf_, 8);
    PutFloat64(&buf_, v);
    return *this;
  }
  CopyStream& Bool(bool v) {
    PutInt32(&buf_, 1);
    buf_.push_back(v ? '\1' : '\0');
    return *this;
  }
  CopyStream& Text(std::string_view v) {
    PutInt32(&buf_, static_cast<std::int32_t>(v.size()));
    buf_.append(v.data(), v.size());
    return *this;
  }
  CopyStream& Null() {
    PutInt32(&buf_, -1);
    return *this;
  }
  CopyStream& OptFloat8(bool has, double v) { return has ? Float8(v) : Null(); }
  CopyStream& OptInt8(bool has, std::int64_t v) { return has ? Int8(v) : Null(); }

  std::size_t rows() const { return rows_; }
  // The complete stream, with its trailer. No row may follow.
  const std::string& Finish() {
    PutInt16(&buf_, -1);
    return buf_;
  }

 private:
  std::string buf_;
  std::size_t rows_ = 0;
};

// A one-dimensional array parameter in binary format (array_recv): a header
// with the element type and count, then length-prefixed elements.
class ArrayParam {
 public:
  explicit ArrayParam(unsigned element_oid) : oid_(element_oid) {}

  ArrayParam& Int8(std::int64_t v) {
    ++count_;
    PutInt32(&body_, 8);
    PutInt64(&body_, v);
    return *this;
  }
  ArrayParam& Text(std::string_view v) {
    ++count_;
    PutInt32(&body_, static_cast<std::int32_t>(v.size()));
    body_.append(v.data(), v.size());
    return *this;
  }
  std::size_t size() const { return count_; }

  // The encoded array.
  std::string Encode() const {
    std::string out;
    out.reserve(20 + body_.size());
    PutInt32(&out, 1);  // dimensions
    PutInt32(&out, 0);  // no NULL elements
    PutInt32(&out, static_cast<std::int32_t>(oid_));
    PutInt32(&out, static_cast<std::int32_t>(count_));
    PutInt32(&out, 1);  // lower bound
    out += body_;
    return out;
  }

 private:
  unsigned oid_;
  std::size_t count_ = 0;
  std::string body_;
};

}  // namespace gac::server::pg

#endif  // GAC_SERVER_SRC_STORE_POSTGRES_CODEC_H_
