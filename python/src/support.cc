#include "python/src/support.h"

namespace py = pybind11;

namespace gac::python {

void RaiseStatus(const base::Status& status) {
  const int code = static_cast<int>(status.code());
  py::object cls = py::module_::import("gac._errors").attr("error_class")(code);
  py::object error = cls(status.message(), code);
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw py::error_already_set();
}

void RaiseInvalidArgument(const std::string& message) { RaiseStatus(base::Status::InvalidArgument(message)); }

void WarnDeprecated(const char* alias) { py::module_::import("gac._deprecation").attr("warn_deprecated")(alias); }

controller::AlphaMode AlphaModeFromName(const std::string& name) {
  base::StatusOr<controller::AlphaMode> mode = controller::ParseAlphaMode(name.c_str());
  if (!mode.ok()) RaiseInvalidArgument("alpha_mode must be 'paper' or 'exact', got '" + name + "'");
  return *mode;
}

controller::Mode ModeFromName(const std::string& name) {
  base::StatusOr<controller::Mode> mode = controller::ParseMode(name.c_str());
  if (!mode.ok()) RaiseInvalidArgument("mode must be 'local', 'monitor' or 'remote', got '" + name + "'");
  return *mode;
}

controller::Trigger TriggerFromName(const std::string& name) {
  base::StatusOr<controller::Trigger> trigger = controller::ParseTrigger(name.c_str());
  if (!trigger.ok()) RaiseInvalidArgument("trigger must be 'per_step' or 'window', got '" + name + "'");
  return *trigger;
}

controller::SpikeSettings SpikeFromKeywords(const pybind11::object& max_grad_norm, const pybind11::object& sigma,
                                            const pybind11::object& window, const pybind11::object& warmup) {
  controller::SpikeSettings s;
  if (!max_grad_norm.is_none()) s.max_grad_norm = max_grad_norm.cast<double>();
  s.zscore = !sigma.is_none() || !window.is_none() || !warmup.is_none();
  if (!sigma.is_none()) s.sigma = sigma.cast<double>();
  if (!window.is_none()) s.window = window.cast<int>();
  if (!warmup.is_none()) s.warmup = warmup.cast<int>();
  ThrowIfError(controller::ValidateSpikeSettings(s));
  return s;
}

}  // namespace gac::python
