#include "gac/agent/process_group_reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <exception>
#include <string>
#include <vector>

namespace gac::agent {

struct ProcessGroupReducer::Impl {
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // one of the two is set
  c10::intrusive_ptr<c10d::Backend> backend;
  c10::Device device;
  std::vector<at::Tensor> buffer;  // one fp64 tensor on `device`, grown on demand
};

ProcessGroupReducer::ProcessGroupReducer(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device)
    : impl_(std::make_unique<Impl>(Impl{std::move(group), {}, device, {}})) {}

ProcessGroupReducer::ProcessGroupReducer(c10::intrusive_ptr<c10d::Backend> backend, c10::Device device)
    : impl_(std::make_unique<Impl>(Impl{{}, std::move(backend), device, {}})) {}

ProcessGroupReducer::~ProcessGroupReducer() = default;

int ProcessGroupReducer::rank() const { return impl_->group ? impl_->group->getRank() : impl_->backend->getRank(); }
int ProcessGroupReducer::world_size() const {
  return impl_->group ? impl_->group->getSize() : impl_->backend->getSize();
}

base::Status ProcessGroupReducer::AllReduceSum(double* values, std::size_t n) {
  try {
    const auto count = static_cast<std::int64_t>(n);
    if (impl_->buffer.empty() || impl_->buffer[0].numel() != count) {
      impl_->buffer = {at::empty({count}, at::TensorOptions().dtype(at::kDouble).device(impl_->device))};
    }
    at::Tensor host = at::from_blob(values, {count}, at::TensorOptions().dtype(at::kDouble));
    impl_->buffer[0].copy_(host);
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    auto work = impl_->group ? impl_->group->allreduce(impl_->buffer, opts) : impl_->backend->allreduce(impl_->buffer, opts);
    work->wait();
    host.copy_(impl_->buffer[0]);
    return base::Status::Ok();
  } catch (const std::exception& e) {
    return base::Status::Unavailable(std::string("process group all-reduce failed: ") + e.what());
  }
}

}  // namespace gac::agent
