// The `steps` columns of both SQL stores, from the record schema
// (gac/proto/record_schema.h): a store names no StepRecord field itself.
//
// Thread safety: pure functions.
#ifndef GAC_SERVER_SRC_STORE_STEP_COLUMNS_H_
#define GAC_SERVER_SRC_STORE_STEP_COLUMNS_H_

#include <string>

#include "gac/proto/record_schema.h"

namespace gac::server {

// "<prefix>step, <prefix>rank, ..." : the schema's columns in table order.
inline std::string StepColumnList(const std::string& prefix = "") {
  std::string out;
  for (const proto::StepField& field : proto::kStepFields) {
    if (!out.empty()) out += ", ";
    out += prefix;
    out += field.column;
  }
  return out;
}

// "<first>, <first + 1>, ..." : kStepFieldCount placeholders, numbered from
// `first` with `sigil` ('?' for SQLite, '$' for PostgreSQL).
inline std::string StepPlaceholders(char sigil, int first) {
  std::string out;
  for (std::size_t i = 0; i < proto::kStepFieldCount; ++i) {
    if (!out.empty()) out += ", ";
    out += sigil;
    out += std::to_string(first + static_cast<int>(i));
  }
  return out;
}

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_STORE_STEP_COLUMNS_H_
