// What the gac Python modules share: a non-OK gac::base::Status raised as the
// Python exception that gac._errors chooses for its code (InvalidArgumentError,
// a ValueError, for INVALID_ARGUMENT; FailedPreconditionError for
// FAILED_PRECONDITION; ...), carrying the message and the code; the parsing
// of the names the Python API takes ("paper", "local", "window", ...); and the
// deprecation warning of an alias the native classes keep (gac/_deprecation.py
// has the aliases, their text and their removal versions).
//
// Thread safety: the raising and warning functions need the GIL; the parsers
// are pure.
#ifndef GAC_PYTHON_SRC_SUPPORT_H_
#define GAC_PYTHON_SRC_SUPPORT_H_

#include <pybind11/pybind11.h>

#include <string>
#include <utility>

#include "gac/controller/controller.h"
#include "gac/controller/spike.h"
#include "gac/controller/window.h"
#include "gac/base/status.h"

namespace gac::python {

// Raises the gac._errors exception of status.code() with its message.
// REQUIRES: !status.ok(); the GIL is held.
[[noreturn]] void RaiseStatus(const base::Status& status);

inline void ThrowIfError(const base::Status& status) {
  if (!status.ok()) RaiseStatus(status);
}

template <typename T>
T ValueOrRaise(base::StatusOr<T>&& value) {
  if (!value.ok()) RaiseStatus(value.status());
  return std::move(*value);
}

// Raises InvalidArgumentError (a ValueError) with `message`.
[[noreturn]] void RaiseInvalidArgument(const std::string& message);

// The names of the Python API, checked: an unknown name raises
// InvalidArgumentError naming the argument and the names it takes.
controller::AlphaMode AlphaModeFromName(const std::string& name);
controller::Mode ModeFromName(const std::string& name);
controller::Trigger TriggerFromName(const std::string& name);

// The spike guard from the keywords every surface takes (None: not given):
// max_grad_norm; any of spike_sigma, spike_window, spike_warmup turns the
// z-score on, the others keeping their defaults. Raises InvalidArgumentError
// naming the keyword for settings the controller refuses.
controller::SpikeSettings SpikeFromKeywords(const pybind11::object& max_grad_norm, const pybind11::object& sigma,
                                            const pybind11::object& window, const pybind11::object& warmup);

// Warns that the deprecated alias `alias` (a key of gac._deprecation.ALIASES,
// e.g. "Agent(groups=...)") was used: gac._deprecation.warn_deprecated issues
// the DeprecationWarning, with its replacement and removal version, at the
// Python line that called into the module.
// REQUIRES: the GIL is held. Raises when warnings are errors.
void WarnDeprecated(const char* alias);

}  // namespace gac::python

#endif  // GAC_PYTHON_SRC_SUPPORT_H_
