#include "agent/src/plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <string>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace gac::agent {
namespace {

std::vector<std::int64_t> ContiguousStrides(at::IntArrayRef sizes) {
  std::vector<std::int64_t> strides(sizes.size());
  std::int64_t s = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(sizes[i], 1);
  }
  return strides;
}

// The host snapshot: zeroed, and from 2 MiB on in transparent huge pages where
// the kernel offers them on request (THP "madvise" mode, common on servers).
// Every pass reads the whole snapshot once per step; with 4 KiB pages a
// cold pass pays a page walk every 4 KiB of it (measured: the statistics pass
// on 2,000 x 1,024 fp32 after a cache flush, docs/BENCHMARKS.md).
at::Tensor HostSnapshot(std::int64_t elements, at::ScalarType scalar) {
  const std::size_t bytes = static_cast<std::size_t>(elements) * c10::elementSize(scalar);
#ifdef __linux__
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  if (bytes >= kHuge) {
    // Over-allocate by one huge page so the start can be aligned to one.
    const std::size_t mapped = (bytes + 2 * kHuge - 1) / kHuge * kHuge;
    void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw != MAP_FAILED) {
      const auto base = reinterpret_cast<std::uintptr_t>(raw);
      void* aligned = reinterpret_cast<void*>((base + kHuge - 1) / kHuge * kHuge);
      (void)madvise(aligned, mapped - kHuge, MADV_HUGEPAGE);  // advice only: 4 KiB pages if refused
      std::memset(aligned, 0, bytes);  // fault the pages in now, not in the first step
      return at::from_blob(
          aligned, {elements}, [raw, mapped](void*) { munmap(raw, mapped); },
          at::TensorOptions().dtype(scalar));
    }
  }
#endif
  return at::zeros({elements}, at::TensorOptions().dtype(scalar));
}

}  // namespace

bool SameLayout(at::IntArrayRef sizes, at::IntArrayRef a, at::IntArrayRef b) {
  if (a.size() != b.size() || a.size() != sizes.size()) return false;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > 1 && a[i] != b[i]) return false;
  }
  return true;
}

at::Tensor Plan::SnapshotView(const Slot& s) const {
  return at::from_blob(snap_base + s.offset * static_cast<std::int64_t>(snap_elem_size), s.sizes, s.snap_strides,
                       at::TensorOptions().dtype(snap_scalar).device(device));
}

base::StatusOr<std::unique_ptr<Plan>> Plan::Build(const std::vector<at::Tensor>& params, const AgentOptions& options) {
  auto plan = std::make_unique<Plan>();
  plan->slots.resize(params.size());
  std::int64_t total = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.defined()) return base::Status::InvalidArgument("parameter " + std::to_string(i) + " is an undefined tensor");
    if (i == 0) {
      plan->device = p.device();
    } else if (p.device() != plan->device) {
      return base::Status::InvalidArgument("parameter " + std::to_string(i) + " is on " + p.device().str() +
                                     " and parameter 0 on " + plan->device.str() +
                                     "; the agent needs every gradient on one device");
    }
    auto& s = plan->slots[i];
    s.param = p.unsafeGetTensorImpl();
    s.numel = p.numel();
    s.sizes.assign(p.sizes().begin(), p.sizes().end());
    const at::Tensor& g = p.grad();
    if (g.defined() && g.sizes() == p.sizes() && g.is_non_overlapping_and_dense()) {
      s.snap_strides.assign(g.strides().begin(), g.strides().end());
    } else if (p.is_non_overlapping_and_dense()) {
      s.snap_strides.assign(p.strides().begin(), p.strides().end());
    } else {
      const std::vector<std::int64_t> strides = ContiguousStrides(p.sizes());
      s.snap_strides.assign(strides.begin(), strides.end());
    }
    s.snap_contiguous = SameLayout(s.sizes, s.snap_strides, ContiguousStrides(s.sizes));
    s.offset = total;
    total += (s.numel + kSliceAlignElements - 1) / kSliceAlignElements * kSliceAlignElements;
    s.first_chunk = static_cast<std::int64_t>(plan->spans.size());
    for (std::int64_t b = 0; b < s.numel; b += options.chunk_elements) {
      cpu::Span span;
      span.n = std::min(options.chunk_elements, s.numel - b);
      plan->spans.push_back(span);  // span.p is set once the snapshot exists
    }
    s.end_chunk = static_cast<std::int64_t>(plan->spans.size());
  }
  plan->chunk_elements = options.chunk_elements;
  const bool bf16 = options.snapshot_dtype == SnapshotDtype::kBFloat16;
  if (!plan->device.is_cpu()) {
#ifdef GAC_AGENT_TORCH_CUDA
    if (plan->device.is_cuda()) {
      base::StatusOr<std::unique_ptr<DevicePasses>> passes =
          CreateCudaPasses(plan->device, bf16, static_cast<int>(options.layers.size()));
      if (!passes.ok()) return passes.status();
      plan->device_passes = std::move(*passes);
      plan->device_tensors.resize(params.size());
    }
#endif
    if (plan->device_passes == nullptr) {
      return base::Status::Unimplemented(
          "the gradients are on " + plan->device.str() + "; this build of the agent reads CPU gradients only" +
          (plan->device.is_cuda() ? " (the CUDA passes need nvcc and a CUDA build of LibTorch)" : ""));
    }
  }
  plan->snap_scalar = bf16 ? at::kBFloat16 : at::kFloat;
  plan->snap_type = bf16 ? cpu::ElemType::kBF16 : cpu::ElemType::kF32;
  plan->snap_elem_size = bf16 ? 2 : 4;
  plan->snapshot = plan->device.is_cpu()
                       ? HostSnapshot(std::max<std::int64_t>(total, 1), plan->snap_scalar)
                       : at::zeros({std::max<std::int64_t>(total, 1)},
                                   at::TensorOptions().dtype(plan->snap_scalar).device(plan->device));
  plan->snap_base = static_cast<char*>(plan->snapshot.data_ptr());
  for (const Slot& s : plan->slots) {
    for (std::int64_t c = s.first_chunk; c < s.end_chunk; ++c) {
      const std::int64_t element = s.offset + (c - s.first_chunk) * options.chunk_elements;
      plan->spans[c].p = plan->snap_base + element * static_cast<std::int64_t>(plan->snap_elem_size);
    }
  }
  plan->partials.resize(plan->spans.size());
  plan->group_of.assign(params.size(), -1);
  for (std::size_t g = 0; g < options.layers.size(); ++g) {
    for (int i : options.layers[g].parameters) {  // Agent::Create checked i >= 0 and no repeats
      if (static_cast<std::size_t>(i) >= params.size()) {
        return base::Status::InvalidArgument("layer '" + options.layers[g].name + "' names parameter " +
                                       std::to_string(i) + " of " + std::to_string(params.size()));
      }
      plan->group_of[static_cast<std::size_t>(i)] = static_cast<int>(g);
    }
  }
  plan->reduced.assign(3 + 3 * options.layers.size() + (plan->device_passes ? 1 : 0), 0.0);

  // Tasks: runs of chunks with roughly equal element counts, kTasksPerThread
  // per thread.
  const std::int64_t tasks = options.num_threads * kTasksPerThread;
  const std::int64_t target = total < kSerialElements
                                  ? std::max<std::int64_t>(total, 1)
                                  : std::max(options.chunk_elements, (total + tasks - 1) / tasks);
  plan->task_first_chunk.push_back(0);
  std::int64_t acc = 0;
  for (std::size_t c = 0; c < plan->spans.size(); ++c) {
    acc += plan->spans[c].n;
    if (acc >= target && c + 1 < plan->spans.size()) {
      plan->task_first_chunk.push_back(static_cast<std::int64_t>(c + 1));
      acc = 0;
    }
  }
  plan->task_first_chunk.push_back(static_cast<std::int64_t>(plan->spans.size()));
  return plan;
}

}  // namespace gac::agent
