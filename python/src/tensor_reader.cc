#include "python/src/tensor_reader.h"

#include <algorithm>
#include <string>
#include <utility>

#include "python/src/support.h"

namespace py = pybind11;

namespace gac::python {
namespace {

using agent::DType;
using agent::DeviceId;
using agent::TensorView;

// The torch objects and attribute names the reader uses, looked up once.
struct TorchApi {
  PyObject* tensor_type = nullptr;
  PyObject* dtensor_type = nullptr;  // null where torch.distributed has no DTensor
  PyObject* f32 = nullptr;
  PyObject* bf16 = nullptr;
  PyObject* f16 = nullptr;
  PyObject* grad = nullptr;
  PyObject* data_ptr = nullptr;
  PyObject* is_contiguous = nullptr;
  PyObject* dtype = nullptr;
  PyObject* shape = nullptr;
  PyObject* stride = nullptr;
  PyObject* device = nullptr;
  PyObject* local_tensor = nullptr;
  PyObject* numel = nullptr;
};

PyObject* Intern(const char* s) { return PyUnicode_InternFromString(s); }
PyObject* Keep(py::object o) { return o.release().ptr(); }

// REQUIRES: the GIL. Imports torch the first time (references kept for the
// life of the process).
const TorchApi& Api() {
  static TorchApi* api = nullptr;
  if (api != nullptr) return *api;
  auto* a = new TorchApi;
  py::module_ torch = py::module_::import("torch");
  a->tensor_type = Keep(torch.attr("Tensor"));
  a->f32 = Keep(torch.attr("float32"));
  a->bf16 = Keep(torch.attr("bfloat16"));
  a->f16 = Keep(torch.attr("float16"));
  for (const char* name : {"torch.distributed.tensor", "torch.distributed._tensor"}) {
    try {
      a->dtensor_type = Keep(py::module_::import(name).attr("DTensor"));
      break;
    } catch (py::error_already_set&) {
      // torch without distributed, or a release with the other module name
    }
  }
  a->grad = Intern("grad");
  a->data_ptr = Intern("data_ptr");
  a->is_contiguous = Intern("is_contiguous");
  a->dtype = Intern("dtype");
  a->shape = Intern("shape");
  a->stride = Intern("stride");
  a->device = Intern("device");
  a->local_tensor = Intern("_local_tensor");
  a->numel = Intern("numel");
  api = a;
  return *api;
}

py::object Steal(PyObject* o) {
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

py::object GetAttr(PyObject* o, PyObject* name) { return Steal(PyObject_GetAttr(o, name)); }
py::object CallMethod(PyObject* o, PyObject* name) { return Steal(PyObject_CallMethodNoArgs(o, name)); }

DType DTypeOf(const TorchApi& api, PyObject* dtype, const char** name) {
  if (dtype == api.f32) return DType::kF32;
  if (dtype == api.bf16) return DType::kBF16;
  if (dtype == api.f16) return DType::kF16;
  std::string s = py::str(dtype);
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  *name = agent::PersistentName(s);
  return DType::kOther;
}

void ReadInts(PyObject* seq, std::vector<std::int64_t>* out) {
  py::sequence s = py::reinterpret_borrow<py::sequence>(seq);
  for (py::handle v : s) out->push_back(v.cast<std::int64_t>());
}

DeviceId DeviceOf(PyObject* tensor) {
  py::object device = GetAttr(tensor, Api().device);
  const std::string type = device.attr("type").cast<std::string>();
  py::object index = device.attr("index");
  DeviceId id;
  id.index = index.is_none() ? -1 : index.cast<int>();
  if (type == "cpu") {
    id.kind = DeviceId::Kind::kCpu;
    id.index = -1;
  } else if (type == "cuda") {
    id.kind = DeviceId::Kind::kCuda;
    if (id.index < 0) id.index = 0;
  } else {
    id.kind = DeviceId::Kind::kOther;
    id.other_name = agent::PersistentName(type);
  }
  return id;
}

}  // namespace

bool IsTensor(PyObject* obj) {
  const TorchApi& api = Api();
  return PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(api.tensor_type));
}

void TensorReader::Prepare(const std::vector<py::object>& params) {
  const TorchApi& api = Api();
  std::vector<Slot> slots(params.size());
  int cuda_index = -1;
  bool has_dtensor = false;
  for (std::size_t i = 0; i < params.size(); ++i) {
    Slot& s = slots[i];
    s.object = params[i].ptr();
    s.dtensor = api.dtensor_type != nullptr &&
                PyObject_TypeCheck(s.object, reinterpret_cast<PyTypeObject*>(api.dtensor_type));
    has_dtensor = has_dtensor || s.dtensor;
    py::object local = s.dtensor ? GetAttr(s.object, api.local_tensor) : py::reinterpret_borrow<py::object>(s.object);
    py::object shape = GetAttr(local.ptr(), api.shape);
    ReadInts(shape.ptr(), &s.dims);
    const int ndim = static_cast<int>(s.dims.size());
    py::object stride = CallMethod(local.ptr(), api.stride);
    ReadInts(stride.ptr(), &s.dims);
    // The contiguous strides, for gradients that say they are contiguous.
    s.dims.resize(3 * static_cast<std::size_t>(ndim));
    std::int64_t step = 1;
    for (int d = ndim; d-- > 0;) {
      s.dims[2 * static_cast<std::size_t>(ndim) + static_cast<std::size_t>(d)] = step;
      step *= std::max<std::int64_t>(s.dims[static_cast<std::size_t>(d)], 1);
    }
    TensorView& v = s.param;
    v.ndim = ndim;
    v.numel = 1;
    for (int d = 0; d < ndim; ++d) v.numel *= s.dims[static_cast<std::size_t>(d)];
    py::object dtype = GetAttr(local.ptr(), api.dtype);
    v.dtype = DTypeOf(api, dtype.ptr(), &v.dtype_name);
    v.device = DeviceOf(local.ptr());
    if (i == 0 && v.device.kind == DeviceId::Kind::kCuda) cuda_index = v.device.index;
  }
  for (Slot& s : slots) {  // pointers into dims once the vectors are final
    const auto n = static_cast<std::size_t>(s.param.ndim);
    s.param.sizes = s.dims.data();
    s.param.strides = s.dims.data() + n;
    s.param.contiguous = agent::IsContiguous(s.param.sizes, s.param.strides, s.param.ndim);
    s.param.non_overlapping_and_dense = agent::NonOverlappingAndDense(s.param.sizes, s.param.strides, s.param.ndim);
  }
  slots_ = std::move(slots);
  grads_.assign(slots_.size(), TensorView());
  absent_.assign(slots_.size(), 1);
  held_.clear();
  stream_ = nullptr;
  cuda_index_ = cuda_index;
  has_dtensor_ = has_dtensor;
}

void TensorReader::Prefetch() {
  const TorchApi& api = Api();
  held_.clear();
  held_.reserve(slots_.size());
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    py::object g = GetAttr(s.object, api.grad);
    if (!g.is_none() && s.dtensor) g = GetAttr(g.ptr(), api.local_tensor);
    absent_[i] = g.is_none() ? 1 : 0;
    if (absent_[i]) continue;
    TensorView& v = grads_[i];
    v = s.param;  // the shape and the device are the parameter's: torch checks that they agree
    {
      py::object dtype = GetAttr(g.ptr(), api.dtype);
      v.dtype = DTypeOf(api, dtype.ptr(), &v.dtype_name);
    }
    {
      py::object ptr = CallMethod(g.ptr(), api.data_ptr);
      v.data = PyLong_AsVoidPtr(ptr.ptr());
      if (v.data == nullptr && PyErr_Occurred()) throw py::error_already_set();
    }
    {
      py::object numel = CallMethod(g.ptr(), api.numel);
      if (PyLong_AsLongLong(numel.ptr()) != s.param.numel) {
        if (PyErr_Occurred()) throw py::error_already_set();
        RaiseStatus(base::Status::FailedPrecondition(
            "parameter " + std::to_string(i) + " changed size since the first step (" +
            std::to_string(s.param.numel) + " elements, now " + std::to_string(PyLong_AsLongLong(numel.ptr())) +
            "): its data was replaced or resharded; call agent.reset() to start over"));
      }
    }
    const auto ndim = static_cast<std::size_t>(v.ndim);
    if (CallMethod(g.ptr(), api.is_contiguous).ptr() == Py_True) {
      v.strides = s.dims.data() + 2 * ndim;
      v.contiguous = true;
      v.non_overlapping_and_dense = true;
    } else {
      // Sizes too: the same number of elements may come in another shape.
      s.grad_dims.clear();
      ReadInts(GetAttr(g.ptr(), api.shape).ptr(), &s.grad_dims);
      ReadInts(CallMethod(g.ptr(), api.stride).ptr(), &s.grad_dims);
      v.ndim = static_cast<int>(s.grad_dims.size() / 2);
      v.sizes = s.grad_dims.data();
      v.strides = s.grad_dims.data() + v.ndim;
      v.contiguous = false;
      v.non_overlapping_and_dense = agent::NonOverlappingAndDense(v.sizes, v.strides, v.ndim);
    }
    held_.push_back(std::move(g));
  }
  if (cuda_index_ >= 0) {
    // The trainer's current stream, which may change from step to step.
    py::object stream = py::module_::import("torch.cuda").attr("current_stream")(cuda_index_);
    stream_ = reinterpret_cast<void*>(stream.attr("cuda_stream").cast<std::uintptr_t>());
  }
}

void TensorReader::Release() { held_.clear(); }

base::Status TensorReader::Describe(std::size_t i, const void** id, TensorView* param, TensorView* grad) {
  const Slot& s = slots_[i];
  *id = s.object;
  *param = s.param;
  if (!absent_[i]) *grad = grads_[i];
  return base::Status::Ok();
}

base::Status TensorReader::Gather(std::size_t begin, std::size_t end, const void** ids, TensorView* grads,
                                  bool* absent) {
  for (std::size_t i = begin; i < end; ++i) {
    ids[i - begin] = slots_[i].object;
    absent[i - begin] = absent_[i] != 0;
    if (!absent_[i]) grads[i - begin] = grads_[i];
  }
  return base::Status::Ok();
}

}  // namespace gac::python
