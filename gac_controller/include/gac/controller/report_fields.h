// The fields of a StepReport, written down once: name, type, unit, one line
// of help, and how to read each from a report. Every row is a property of
// Python's gac.StepReport (python/src/controller_module.cc) and a key of
// report.to_dict() (python/gac/_report.py, through REPORT_FIELDS); a test
// checks the stub against the table.
//
// The wire is not named here (gac::controller does not know gac.v1): the
// record's rows (gac/proto/record_schema.h) read the report themselves, and
// the remote decision's optional reals are mapped in proto/src/convert.cc,
// each in C++ that names both sides, so a field renamed on either side fails
// the build there.
// Adding a report field is: the StepReport member and one row here; when
// gacd should keep it, the .proto field and its record schema row (which
// reads the member); when gacd decides it too (remote mode), DecideResponse's
// field and its row in convert.cc.
//
// Not rows: `decision` (the whole Decision) and `layers` (a list), which the
// Python binding exposes as objects.
//
// Thread safety: constant data and pure functions.
#ifndef GAC_CONTROLLER_REPORT_FIELDS_H_
#define GAC_CONTROLLER_REPORT_FIELDS_H_

#include <cstddef>
#include <cstdint>
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

struct ReportField {
  const char* name;    // the Python property, the logger key after its prefix
  ReportType type;
  bool optional;       // may be absent (None)
  const char* unit;    // "" when dimensionless, else "s", "steps", ...
  const char* help;    // one line: the property's docstring, docs
  ReportValue (*get)(const StepReport& report);
};

inline constexpr std::size_t kReportFieldCount = 48;
extern const ReportField kReportFields[kReportFieldCount];

// The row named `name`, or nullptr.
const ReportField* FindReportField(const char* name);

// The name of an enum-typed value ("unknown" for a number that is none of
// the enum's: kAllRegimes, kAllModes, kAllTriggers); nullptr for other types.
const char* ReportEnumName(ReportType type, std::int64_t value);

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_REPORT_FIELDS_H_
