// TensorReader: torch.Tensor parameters and their gradients described to the
// agent core (gac/agent/core.h) through Python's C API, with no LibTorch: the
// module that uses it links neither libtorch nor libtorch_python, so one
// build works with any torch 2.x (torch's Python API is what is stable across
// releases, its C++ ABI is not).
//
// What a parameter is does not change between steps (torch checks that a
// gradient has its parameter's shape, dtype and device), so the reader learns
// it once per parameter list (Prepare). Each step (Prefetch, with the GIL)
// it reads per parameter the gradient, its data_ptr(), its dtype object, its
// numel() (a parameter whose .data was replaced by a tensor of another size,
// or a resharded one, is refused: reset() starts over) and whether it is
// contiguous (and its sizes and strides only when it is not); the core
// then runs with the GIL released and reads what Prefetch kept. FSDP2's
// DTensor parameters are read as their local shards.
//
// Thread safety: Prepare and Prefetch need the GIL; the GradientSource calls
// do not. Used by one agent.
#ifndef GAC_PYTHON_SRC_TENSOR_READER_H_
#define GAC_PYTHON_SRC_TENSOR_READER_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gac/agent/core.h"

namespace gac::python {

// isinstance(obj, torch.Tensor). REQUIRES: the GIL; imports torch the first time.
bool IsTensor(PyObject* obj);

class TensorReader final : public agent::GradientSource {
 public:
  // Learns the parameters of `params` (torch.Tensor objects, kept alive by
  // the caller while the reader uses them). Raises for unusable tensors.
  void Prepare(const std::vector<pybind11::object>& params);
  // Reads this step's gradients of the prepared parameters.
  void Prefetch();
  // Drops what the last Prefetch kept (references to the gradients).
  void Release();
  // Whether a prepared parameter is a DTensor (FSDP2 and other meshes).
  bool has_dtensor() const { return has_dtensor_; }

  std::size_t size() const override { return slots_.size(); }
  base::Status Describe(std::size_t i, const void** id, agent::TensorView* param, agent::TensorView* grad) override;
  base::Status Gather(std::size_t begin, std::size_t end, const void** ids, agent::TensorView* grads,
                      bool* absent) override;
  void* Stream(int index) override { return stream_; }

 private:
  struct Slot {
    PyObject* object = nullptr;  // the parameter (borrowed)
    bool dtensor = false;        // read its (and its gradient's) _local_tensor
    agent::TensorView param;     // sizes and strides point into dims
    std::vector<std::int64_t> dims;  // sizes, strides, contiguous strides
    std::vector<std::int64_t> grad_dims;  // a non-contiguous gradient's sizes and strides, this step
  };

  std::vector<Slot> slots_;
  std::vector<agent::TensorView> grads_;
  std::vector<char> absent_;
  std::vector<pybind11::object> held_;  // this step's gradients, alive until Release()
  void* stream_ = nullptr;              // the current CUDA stream of the parameters' device
  int cuda_index_ = -1;                 // that device, or -1 for CPU parameters
  bool has_dtensor_ = false;
};

}  // namespace gac::python

#endif  // GAC_PYTHON_SRC_TENSOR_READER_H_
