// The fields of a StepReport, written down once: name, type, unit, one line
// of help, and which views show each. The views walk this table rather than
// naming fields:
//   - Python's gac.StepReport properties (python/src/controller_module.cc),
//     and REPORT_FIELDS, from which report.to_dict()'s logger keys follow
//     (python/gac/_report.py); a test checks the stub against it;
//   - the telemetry record (gac/transport/step_record.h): a row with a
//     `record` name fills that field of gac.v1.StepRecord, whose own table
//     (gac/proto/record_schema.h) drives the stores, the HTTP JSON, the
//     page, gacctl and the metrics;
//   - the remote decision (gac.v1.DecideResponse, proto/src/convert.cc): a
//     row with a `decided` slot is a Decision's optional real that the
//     response carries in its optional field of the row's name.
// Adding a report field is: the StepReport member, one row here, and, when
// gacd should keep it, the .proto field and its record schema row; when
// gacd decides it too (remote mode), DecideResponse's field and the row's
// `decided` slot.
//
// Not rows: `decision` (the whole Decision) and `layers` (a list), which the
// Python binding exposes as objects.
//
// Thread safety: constant data and pure functions.
#ifndef GAC_CONTROLLER_REPORT_FIELDS_H_
#define GAC_CONTROLLER_REPORT_FIELDS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "gac/controller/step_report.h"

namespace gac::controller {

// A field's type, which decides how a view writes it.
enum class ReportType : std::uint8_t {
  kInteger,
  kReal,
  kBool,
  kText,
  kRegime,   // integer: the Regime's number; RegimeName gives its name
  kMode,     // integer: the Mode's number; ModeName
  kTrigger,  // integer: the Trigger's number; TriggerName
};

// A field's value. `present` is false only for an optional field without a
// value (Python None; left out of the record and of numeric logger dicts).
struct ReportValue {
  bool present = true;
  std::int64_t integer = 0;  // kInteger, kBool (0/1) and the enums
  double real = 0.0;         // kReal
  std::string text;          // kText
};

// Which views show a field (a bit set).
enum ReportView : unsigned {
  kViewPython = 1u << 0,  // a property of gac.StepReport
  kViewLogger = 1u << 1,  // a key of report.to_dict() (numeric: enums as their index, bools 0/1)
};

// Where a Decision holds a row's value, for the rows the remote decision's
// wire carries.
struct DecisionSlot {
  std::optional<double> (*get)(const Decision& decision);
  void (*set)(Decision& decision, double value);
  bool cosine;  // a cosine, in [-1, 1] up to rounding; else any finite value
};

struct ReportField {
  const char* name;    // the Python property, the logger key after its prefix
  ReportType type;
  bool optional;       // may be absent (None)
  const char* unit;    // "" when dimensionless, else "s", "steps", ...
  const char* help;    // one line: the property's docstring, docs
  unsigned views;      // ReportView bits
  const char* record;  // the gac.v1.StepRecord field it fills, or nullptr
  ReportValue (*get)(const StepReport& report);
  const DecisionSlot* decided = nullptr;  // unless the remote decision carries it
};

inline constexpr std::size_t kReportFieldCount = 32;
extern const ReportField kReportFields[kReportFieldCount];

// The row named `name`, or nullptr.
const ReportField* FindReportField(const char* name);

// The name of an enum-typed value ("unknown" outside the enum); nullptr for
// other types.
const char* ReportEnumName(ReportType type, std::int64_t value);

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_REPORT_FIELDS_H_
