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

// The SQL store a column definition is for.
enum class SqlDialect { kSqlite, kPostgres };

// "<column> <type> [NOT NULL DEFAULT 0]": the definition ALTER TABLE ADD
// COLUMN gives a schema row the `steps` table lacks. Optional fields are
// nullable (NULL: absent); others get their type's zero, which rows stored
// before the column existed read as. SQLite keeps reals untyped (bit-exact,
// see sqlite_store.cc); PostgreSQL's types are ReadStep's.
inline std::string StepColumnDefinition(const proto::StepField& field, SqlDialect dialect) {
  std::string type;
  const char* zero = "0";
  switch (field.type) {
    case proto::FieldType::kReal: type = dialect == SqlDialect::kSqlite ? "" : "float8"; break;
    case proto::FieldType::kText: type = dialect == SqlDialect::kSqlite ? "TEXT" : "text"; zero = "''"; break;
    case proto::FieldType::kBool:
      type = dialect == SqlDialect::kSqlite ? "INTEGER" : "boolean";
      if (dialect == SqlDialect::kPostgres) zero = "false";
      break;
    case proto::FieldType::kEnum: type = dialect == SqlDialect::kSqlite ? "INTEGER" : "integer"; break;
    case proto::FieldType::kInteger: type = dialect == SqlDialect::kSqlite ? "INTEGER" : "bigint"; break;
  }
  std::string out = field.column;
  if (!type.empty()) out += " " + type;
  if (!field.optional) out += std::string(" NOT NULL DEFAULT ") + zero;
  return out;
}

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_STORE_STEP_COLUMNS_H_
