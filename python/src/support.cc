#include "python/src/support.h"

namespace py = pybind11;

namespace gac::python {

void RaiseStatus(const Status& status) {
  const int code = static_cast<int>(status.code());
  py::object cls = py::module_::import("gac._errors").attr("error_class")(code);
  py::object error = cls(status.message(), code);
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw py::error_already_set();
}

void RaiseInvalidArgument(const std::string& message) { RaiseStatus(Status::InvalidArgument(message)); }

void WarnDeprecated(const std::string& message) {
  if (PyErr_WarnEx(PyExc_DeprecationWarning, message.c_str(), 1) != 0) throw py::error_already_set();
}

AlphaMode AlphaModeFromName(const std::string& name) {
  StatusOr<AlphaMode> mode = ParseAlphaMode(name.c_str());
  if (!mode.ok()) RaiseInvalidArgument("alpha_mode must be 'paper' or 'exact', got '" + name + "'");
  return *mode;
}

Mode ModeFromName(const std::string& name) {
  StatusOr<Mode> mode = ParseMode(name.c_str());
  if (!mode.ok()) RaiseInvalidArgument("mode must be 'local', 'monitor' or 'remote', got '" + name + "'");
  return *mode;
}

}  // namespace gac::python
