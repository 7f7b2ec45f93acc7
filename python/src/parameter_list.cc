#include "python/src/parameter_list.h"

#include <string>
#include <utility>

#include "python/src/tensor_reader.h"

namespace py = pybind11;

namespace gac::python {
namespace {

[[noreturn]] void RaiseNotTensor(std::size_t i, py::handle item) {
  throw py::type_error("params[" + std::to_string(i) + "] is a " +
                       py::str(py::type::of(item).attr("__name__")).cast<std::string>() +
                       ", expected a torch.Tensor (pass model.parameters() or a list of tensors)");
}

}  // namespace

const std::vector<py::object>& ParameterList::Convert(py::handle params, bool* changed) {
  *changed = false;
  PyObject* const obj = params.ptr();
  if (IsTensor(obj)) {
    throw py::type_error("params is a single tensor; pass an iterable of tensors (model.parameters() or a list)");
  }
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    PyObject** const items = PySequence_Fast_ITEMS(obj);
    bool same = static_cast<std::size_t>(n) == objects_.size();
    for (Py_ssize_t i = 0; same && i < n; ++i) same = items[i] == objects_[static_cast<std::size_t>(i)].ptr();
    if (same) return objects_;
    std::vector<py::object> fresh;
    fresh.reserve(static_cast<std::size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) fresh.push_back(py::reinterpret_borrow<py::object>(items[i]));
    Rebuild(std::move(fresh));
    *changed = true;
    return objects_;
  }
  // Any other iterable: compared with the kept objects as it is consumed.
  py::iterator it;
  try {
    it = py::iter(params);
  } catch (py::error_already_set&) {
    throw py::type_error("params must be an iterable of tensors (model.parameters() or a list), got a " +
                         py::str(py::type::of(params).attr("__name__")).cast<std::string>());
  }
  std::vector<py::object> fresh;
  std::size_t matched = 0;  // leading items that are the kept objects
  bool same = true;
  for (py::handle item : it) {
    if (same && matched < objects_.size() && item.ptr() == objects_[matched].ptr()) {
      ++matched;
      continue;
    }
    if (same) {
      same = false;
      fresh.assign(objects_.begin(), objects_.begin() + static_cast<std::ptrdiff_t>(matched));
    }
    fresh.push_back(py::reinterpret_borrow<py::object>(item));
  }
  if (same && matched == objects_.size()) return objects_;
  if (same) fresh.assign(objects_.begin(), objects_.begin() + static_cast<std::ptrdiff_t>(matched));
  Rebuild(std::move(fresh));
  *changed = true;
  return objects_;
}

void ParameterList::Rebuild(std::vector<py::object> objects) {
  for (std::size_t i = 0; i < objects.size(); ++i) {
    if (!IsTensor(objects[i].ptr())) RaiseNotTensor(i, objects[i]);
  }
  objects_ = std::move(objects);
}

}  // namespace gac::python
