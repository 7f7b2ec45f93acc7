// The fields of a gac.v1.StepRecord that are stored as one row of a store's
// `steps` table, written down once: the wire and storage description of a
// step, and where the agent's report holds each value.
//
// Every place that maps a step record field by field (the stores' binders
// and readers, the HTTP JSON, gacctl's columns, gacd's latest-value gauges,
// the transport's builder) walks kStepFields instead of naming the fields, so
// adding a field is: the .proto and one row here. The stores add a column for each row their
// `steps` table lacks when they open (nullable for an optional field, else
// NOT NULL DEFAULT 0). How the views show a field is theirs, keyed by the
// field's name: gacd's gauges (server/src/metrics.cc), gacctl's columns
// (cli/src/step_commands.cc), the page's card (web/latest_step.h).
//
// Out of the table: `run` (the key; stores keep it in their `runs` table),
// `scalars` and `layers` (child rows with their own tables).
//
// Order: the table's order is the order in which the stores name the columns
// of `steps` (a column added to an existing table comes last there), and the
// order of the fields in the HTTP JSON. Append rows; never reorder them.
//
// Thread safety: constant data and pure functions.
#ifndef GAC_PROTO_RECORD_SCHEMA_H_
#define GAC_PROTO_RECORD_SCHEMA_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gac/controller/step_report.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::proto {

// The type of a field's value, which decides how it is stored and written.
enum class FieldType : std::uint8_t {
  kInteger,  // integral; SQLite INTEGER, PostgreSQL bigint, JSON number (or string, see json_string)
  kReal,     // a double kept bit-exact; SQLite untyped column, PostgreSQL float8, JSON number
  kText,     // a string (no field of the row table has this type today)
  kBool,     // SQLite INTEGER 0/1, PostgreSQL boolean, JSON true/false
  kEnum,     // the enum's number; SQLite INTEGER, PostgreSQL integer, JSON its name (EnumName)
};

// The values a field may take on the wire (gacd refuses others). Reals must
// also be finite.
enum class FieldRange : std::uint8_t {
  kAny,          // no bound beyond the type (enums: checked against the enum)
  kNonNegative,  // >= 0
  kUnit,         // in [0, 1]
  kCosine,       // in [-1, 1], up to rounding (kCosineSlack, gac/proto/wire_rules.h)
};

// One field's value as stores and views move it. `present` is false only for
// an optional field that is not set (SQL NULL, JSON null).
struct FieldValue {
  bool present = true;
  std::int64_t integer = 0;  // kInteger; kBool as 0 or 1; kEnum as the enum's number
  double real = 0;           // kReal
};

// Reads a field of `record`. For a non-optional field `present` is true.
using FieldGetter = FieldValue (*)(const v1::StepRecord& record);
// Writes `value` into `record`. A value that is not present clears an
// optional field (and sets a non-optional one to its default).
using FieldSetter = void (*)(const FieldValue& value, v1::StepRecord* record);
// The name of an enum field's value ("unknown" for a value outside the enum).
using EnumNamer = const char* (*)(std::int64_t value);

// The field's value in the agent's report, as MakeStepRecord
// (gac/transport/step_record.h) puts it in the record: enums as the wire's
// numbers, an absent optional value not present.
using ReportReader = FieldValue (*)(const controller::StepReport& report);

struct StepField {
  const char* name;     // the wire name, also the JSON key and the CSV header
  const char* column;   // the column of the stores' `steps` table
  FieldType type;
  bool optional;        // has presence on the wire (proto3 optional): NULL when absent
  FieldRange range;     // checked on ingest when present
  bool json_string;     // an int64 that may exceed 2^53: JSON carries it as a decimal string
  const char* unit;     // "" when dimensionless, else "s", "ns", "steps", ...
  const char* help;     // one line for help text and docs
  FieldGetter get;
  FieldSetter set;
  EnumNamer enum_name;  // kEnum only, else nullptr
  ReportReader from_report;  // nullptr: not the report's (the run's identity, the
                             // transport's clock and staleness)
};

// The row fields of a StepRecord, in column order (range-for works on it).
inline constexpr std::size_t kStepFieldCount = 38;
extern const StepField kStepFields[kStepFieldCount];

// The field whose wire name is `name`, or nullptr.
const StepField* FindStepField(std::string_view name);

}  // namespace gac::proto

#endif  // GAC_PROTO_RECORD_SCHEMA_H_
