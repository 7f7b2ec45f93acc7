// ParameterList: the parameters a Python trainer passes to agent.step(), as
// the std::vector<at::Tensor> that Agent::Step takes, without rebuilding it
// at every step.
//
// A trainer passes the same parameters at every step (the agent requires
// it). Converting a list of 2,000 torch.Tensor objects costs about as much
// as the agent's whole host overhead (a type check and an atomic reference
// count per tensor, and as many again to free the vector), so the last
// conversion is kept with references to the Python objects it came from;
// when the same objects come in the same order, it is reused after a
// pointer comparison per element. The tensors cross without copies: each
// at::Tensor shares its TensorImpl with the Python object.
//
// Thread safety: needs the GIL; used by one agent.
#ifndef GAC_PYTHON_SRC_PARAMETER_LIST_H_
#define GAC_PYTHON_SRC_PARAMETER_LIST_H_

#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>

#include <vector>

namespace gac::python {

class ParameterList {
 public:
  // The tensors of `params`: a list or tuple of torch.Tensor, or any
  // iterable of them (a generator such as model.parameters()). Raises
  // TypeError for anything else, naming the offending element; the last
  // conversion is then kept.
  const std::vector<at::Tensor>& Convert(pybind11::handle params);

  // The tensors of the last successful Convert().
  const std::vector<at::Tensor>& tensors() const { return tensors_; }
  // Drops the tensors and the references to their Python objects.
  void Clear();

 private:
  // Replaces the kept conversion by `objects` (new references).
  void Rebuild(std::vector<pybind11::object> objects);

  std::vector<pybind11::object> objects_;  // the Python tensors, in order
  std::vector<at::Tensor> tensors_;        // the same tensors, for Agent::Step
};

}  // namespace gac::python

#endif  // GAC_PYTHON_SRC_PARAMETER_LIST_H_
