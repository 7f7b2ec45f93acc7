// ParameterList: the parameters a Python trainer passes to agent.step(), kept
// between steps.
//
// A trainer passes the same parameters at every step (the agent requires
// it), often as a fresh generator (model.parameters()). The last list is
// kept with references to its Python objects; when the same objects come in
// the same order it is reused after a pointer comparison per element, so
// the agent's per-tensor cache (python/src/tensor_reader.h) stays valid.
//
// Thread safety: needs the GIL; used by one agent.
#ifndef GAC_PYTHON_SRC_PARAMETER_LIST_H_
#define GAC_PYTHON_SRC_PARAMETER_LIST_H_

#include <pybind11/pybind11.h>

#include <vector>

namespace gac::python {

class ParameterList {
 public:
  // The tensors of `params`: a list or tuple of torch.Tensor, or any
  // iterable of them (a generator such as model.parameters()). Raises
  // TypeError for anything else, naming the offending element; the last
  // conversion is then kept. *changed tells whether the list differs from
  // the last one.
  const std::vector<pybind11::object>& Convert(pybind11::handle params, bool* changed);

  // The tensors of the last successful Convert().
  const std::vector<pybind11::object>& objects() const { return objects_; }
  // Drops the references to the Python objects.
  void Clear() { objects_.clear(); }

 private:
  // Replaces the kept list by `objects` (new references), after checking them.
  void Rebuild(std::vector<pybind11::object> objects);

  std::vector<pybind11::object> objects_;  // the Python tensors, in order
};

}  // namespace gac::python

#endif  // GAC_PYTHON_SRC_PARAMETER_LIST_H_
