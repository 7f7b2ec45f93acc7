// The size limits of the wire contract (proto/gac/v1/*.proto), as plain
// constants: this header includes no generated message, so code that does
// not link gac::proto (the Python package's gac._controller) can read the
// same numbers. gac/proto/wire_rules.h includes it and holds the checks.
//
// Thread safety: constants.
#ifndef GAC_PROTO_WIRE_LIMITS_H_
#define GAC_PROTO_WIRE_LIMITS_H_

#include <cstddef>

namespace gac::proto {

// A run id is 1..kMaxRunIdLength characters of [A-Za-z0-9._:/-].
inline constexpr std::size_t kMaxRunIdLength = 128;
// A layer or scalar name is 1..kMaxNameLength printable ASCII characters
// (0x20-0x7e).
inline constexpr std::size_t kMaxNameLength = 256;
// The most scalars and layers one StepRecord may carry, and the most records
// one IngestRequest may carry.
inline constexpr std::size_t kMaxScalarsPerRecord = 64;
inline constexpr std::size_t kMaxLayersPerRecord = 4096;
inline constexpr std::size_t kMaxRecordsPerBatch = 4096;

}  // namespace gac::proto

#endif  // GAC_PROTO_WIRE_LIMITS_H_
