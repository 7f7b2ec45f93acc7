// The LibTorch front of the agent: describes at::Tensor parameters and their
// gradients to the torch-free core (core.cc) as buffer views.
#include "gac/agent/agent.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>

#include "agent/src/torch_stream.h"

namespace gac::agent {

namespace {

DType ToDType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kF32;
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    default: return DType::kOther;
  }
}

DeviceId ToDeviceId(const c10::Device& d) {
  DeviceId id;
  if (d.is_cpu()) {
    id.kind = DeviceId::Kind::kCpu;
  } else if (d.is_cuda()) {
    id.kind = DeviceId::Kind::kCuda;
    id.index = d.has_index() ? d.index() : 0;
  } else {
    id.kind = DeviceId::Kind::kOther;
    id.index = d.has_index() ? d.index() : -1;
    id.other_name = PersistentName(c10::DeviceTypeName(d.type(), /*lower_case=*/true));
  }
  return id;
}

// First element of a CPU tensor with plain storage, as Tensor::data_ptr()
// returns it for a non-empty tensor, without its virtual has_storage() call;
// tensors without a storage object take data_ptr() and its checks. Writable:
// mutable_data() materialises a copy-on-write storage first.
void* DataPtr(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();
  if (!storage) return t.data_ptr();
  return static_cast<char*>(storage.mutable_data()) + impl->storage_offset() * static_cast<std::int64_t>(impl->itemsize());
}

void Describe(const at::Tensor& t, bool with_data, TensorView* v) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const at::ScalarType scalar = c10::typeMetaToScalarType(impl->dtype());
  v->dtype = ToDType(scalar);
  v->dtype_name = c10::toString(scalar);
  v->device = ToDeviceId(impl->device());
  v->sizes = impl->sizes().data();
  v->strides = impl->strides().data();
  v->ndim = static_cast<int>(impl->dim());
  v->numel = impl->numel();
  v->contiguous = impl->is_contiguous();
  v->non_overlapping_and_dense = impl->is_non_overlapping_and_dense();
  v->data = with_data && v->numel > 0 ? DataPtr(t) : nullptr;
}

// The parameters of one Step().
//
// With many small tensors the gather is bound by cache misses: each tensor is
// a chain of objects (parameter -> autograd meta -> gradient -> storage ->
// data) over ~10 cache lines that are rarely all in L2. So a block of
// parameters goes through three short loops (look up the gradients;
// prefetch their storage objects; describe them). The tensors are read
// through their TensorImpl: Tensor::grad() would add a dispatcher call
// (is_leaf) per parameter and data_ptr() a virtual call.
class TorchSource final : public GradientSource {
 public:
  explicit TorchSource(const std::vector<at::Tensor>& params) : params_(params) {}

  std::size_t size() const override { return params_.size(); }

  base::Status Describe(std::size_t i, const void** id, TensorView* param, TensorView* grad) override {
    const at::Tensor& p = params_[i];
    if (!p.defined()) return base::Status::InvalidArgument("parameter " + std::to_string(i) + " is an undefined tensor");
    *id = p.unsafeGetTensorImpl();
    agent::Describe(p, false, param);
    const at::Tensor& g = p.grad();
    if (g.defined()) agent::Describe(g, true, grad);
    return base::Status::Ok();
  }

  base::Status Gather(std::size_t begin, std::size_t end, const void** ids, TensorView* grads, bool* absent) override {
    const at::Tensor* g[32];
    for (std::size_t i = begin; i < end; ++i) {
      const c10::TensorImpl* impl = params_[i].unsafeGetTensorImpl();
      ids[i - begin] = impl;  // null for an undefined tensor: never a tracked one
      g[i - begin] = impl != nullptr ? &impl->grad() : nullptr;
    }
    for (std::size_t i = begin; i < end; ++i) {
      if (g[i - begin] == nullptr) continue;
      const c10::StorageImpl* storage = g[i - begin]->unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
      if (storage != nullptr) __builtin_prefetch(&storage->data_ptr());
    }
    for (std::size_t i = begin; i < end; ++i) {
      const at::Tensor* grad = g[i - begin];
      absent[i - begin] = grad == nullptr || !grad->defined();
      if (absent[i - begin]) {
        if (grad != nullptr) (void)params_[i].grad();  // LibTorch's warning for a non-leaf tensor's missing .grad
        continue;
      }
      agent::Describe(*grad, true, &grads[i - begin]);
    }
    return base::Status::Ok();
  }

  void* Stream(int index) override { return CurrentCudaStream(index); }

 private:
  const std::vector<at::Tensor>& params_;
};

}  // namespace

base::StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  GAC_ASSIGN_OR_RETURN(std::unique_ptr<AgentCore> core, AgentCore::Create(std::move(options)));
  return std::unique_ptr<Agent>(new Agent(std::move(core)));
}

Agent::Agent(std::unique_ptr<AgentCore> core) : core_(std::move(core)) {}

Agent::~Agent() = default;

void Agent::Reset() { core_->Reset(); }

base::Status Agent::set_mode(controller::Mode mode) { return core_->set_mode(mode); }

base::StatusOr<controller::StepReport> Agent::Step(std::int64_t step, const std::vector<at::Tensor>& parameters,
                                                   std::optional<double> loss) {
  TorchSource source(parameters);
  return core_->Step(step, source, loss);
}

}  // namespace gac::agent
