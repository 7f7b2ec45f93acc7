// What the gac Python modules share: a non-OK gac::Status raised as the
// Python exception that gac._errors chooses for its code (InvalidArgumentError,
// a ValueError, for INVALID_ARGUMENT; FailedPreconditionError for
// FAILED_PRECONDITION; ...), carrying the message and the code; the parsing
// of the names the Python API takes ("paper", "local", ...); and the
// StepReport the agent returns and the telemetry sends.
//
// Thread safety: the raising functions need the GIL; the parsers and
// PyStepReport are plain values.
#ifndef GAC_PYTHON_SRC_SUPPORT_H_
#define GAC_PYTHON_SRC_SUPPORT_H_

#include <pybind11/pybind11.h>

#include <string>
#include <utility>

#include "gac/controller/controller.h"
#include "gac/controller/step_report.h"
#include "gac/status.h"

namespace gac::python {

// Raises the gac._errors exception of status.code() with its message.
// REQUIRES: !status.ok(); the GIL is held.
[[noreturn]] void RaiseStatus(const Status& status);

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) RaiseStatus(status);
}

template <typename T>
T ValueOrRaise(StatusOr<T>&& value) {
  if (!value.ok()) RaiseStatus(value.status());
  return std::move(*value);
}

// Raises InvalidArgumentError (a ValueError) with `message`.
[[noreturn]] void RaiseInvalidArgument(const std::string& message);

// The names of the Python API, checked: an unknown name raises
// InvalidArgumentError naming the argument and the names it takes.
AlphaMode AlphaModeFromName(const std::string& name);
Mode ModeFromName(const std::string& name);

// A StepReport with the mode of the agent that produced it: what Python's
// gac.StepReport wraps, so that Telemetry.send knows the mode without being
// told (gac.v1.StepRecord carries it).
struct PyStepReport {
  StepReport report;
  Mode mode = Mode::kLocal;
};

}  // namespace gac::python

#endif  // GAC_PYTHON_SRC_SUPPORT_H_
