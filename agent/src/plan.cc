#include "agent/src/plan.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#ifdef __linux__
#include <sys/mman.h>
#endif

#include "agent/src/self_check.h"
#include "gac/agent/cuda_info.h"

namespace gac::agent {
namespace {

std::vector<std::int64_t> ContiguousStrides(const Dims& sizes) {
  std::vector<std::int64_t> strides(static_cast<std::size_t>(sizes.size()));
  std::int64_t s = 1;
  for (int i = sizes.size(); i-- > 0;) {
    strides[static_cast<std::size_t>(i)] = s;
    s *= std::max<std::int64_t>(sizes[i], 1);
  }
  return strides;
}

using SnapshotMemory = std::unique_ptr<char, std::function<void(char*)>>;

// The host snapshot: zeroed, and from 2 MiB on in transparent huge pages where
// the kernel offers them on request (THP "madvise" mode, common on servers).
// Every pass reads the whole snapshot once per step; with 4 KiB pages a
// cold pass pays a page walk every 4 KiB of it (measured: the statistics pass
// on 2,000 x 1,024 fp32 after a cache flush, docs/BENCHMARKS.md).
base::StatusOr<SnapshotMemory> HostSnapshot(std::size_t bytes) {
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
      return SnapshotMemory(static_cast<char*>(aligned), [raw, mapped](char*) { munmap(raw, mapped); });
    }
  }
#endif
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    return base::Status::ResourceExhausted("cannot allocate the " + std::to_string(bytes) + "-byte snapshot");
  }
  std::memset(p, 0, bytes);
  return SnapshotMemory(static_cast<char*>(p), [](char* q) { std::free(q); });
}

// Snapshot elements to leave before a slice on a GPU, so that the slice has
// its gradient's misalignment: the kernels then read both with 16-byte
// vectors after the same short prologue (multi_tensor.h, VectorHead). The
// slices start on kSliceAlignElements boundaries of a 256-byte aligned
// allocation. The gradient's address at the plan's first step decides; a
// gradient that moves to another misalignment later takes the scalar path.
std::int64_t SlicePad(const TensorView& g, int snap_elem_size) {
  if (g.data == nullptr || (g.dtype != DType::kF32 && g.dtype != DType::kBF16 && g.dtype != DType::kF16)) return 0;
  const int g_size = g.dtype == DType::kF32 ? 4 : 2;
  const auto to_boundary = static_cast<int>((16 - (reinterpret_cast<std::uintptr_t>(g.data) & 15u)) & 15u);
  if (to_boundary % g_size != 0) return 0;
  const int per_vector = 16 / snap_elem_size;  // snapshot elements per 16 bytes
  return (per_vector - to_boundary / g_size % per_vector) % per_vector;
}

// Why gac's kernels cannot read gradients on the plan's device (a GPU),
// or "" when they can.
std::string NoKernels(const Plan& plan) {
  if (plan.device.kind != DeviceId::Kind::kCuda) return "gac has no kernels for " + plan.device.str();
#ifdef GAC_AGENT_CUDA
  const CudaEnvironment env = QueryCudaEnvironment();
  if (!env.error.empty()) return env.error;
  for (const CudaDeviceInfo& d : env.devices) {
    if (d.index != plan.device.index) continue;
    if (!d.image.empty()) return "";
    return "gac's kernels carry no image for " + plan.device.str() + " (" + d.name + ", compute capability " +
           std::to_string(d.major) + "." + std::to_string(d.minor) + ")";
  }
  return "CUDA does not list " + plan.device.str();
#else
  return "this build of the agent has no CUDA kernels (they are built when nvcc is found)";
#endif
}

// The passes of a plan (AgentOptions::passes): gac's kernels, the front's,
// or the CUDA kernels checked against the front's on their first steps on
// a GPU (self_check.h).
base::Status ChoosePasses(Plan& plan, const AgentOptions& options) {
  const FrontPassesRequest request{plan.device.index, PersistentName(plan.device.str()),
                                   options.snapshot_dtype == SnapshotDtype::kBFloat16, plan.group_of,
                                   static_cast<int>(options.layers.size())};
  const auto use_front = [&](const std::string& why) -> base::Status {
    if (!options.front_passes) return base::Status::InvalidArgument(why + "; no front passes were given");
    GAC_ASSIGN_OR_RETURN(plan.front, options.front_passes(request));
    plan.passes_name = plan.front->name();
    return base::Status::Ok();
  };
  if (options.passes == PassesChoice::kFront) return use_front("passes=front");
  if (plan.device.kind == DeviceId::Kind::kCpu) return base::Status::Ok();
  const std::string no_kernels = NoKernels(plan);
  if (!no_kernels.empty()) {
    if (options.passes == PassesChoice::kKernels || !options.front_passes) {
      return base::Status::Unimplemented("the gradients are on " + plan.device.str() + ": " + no_kernels);
    }
    return use_front(no_kernels);
  }
  const SelfCheckState checked = SelfCheckStateOf(plan.device.index);
  if (options.passes == PassesChoice::kAuto && options.front_passes && checked == SelfCheckState::kFailed) {
    return use_front("gac's kernels failed their check on " + plan.device.str());
  }
#ifdef GAC_AGENT_CUDA
  GAC_ASSIGN_OR_RETURN(plan.device_passes, CreateCudaPasses(plan.device.index,
                                                            options.snapshot_dtype == SnapshotDtype::kBFloat16,
                                                            static_cast<int>(options.layers.size())));
  plan.passes_name = "cuda";
#endif
  if (options.passes == PassesChoice::kAuto && options.front_passes && checked == SelfCheckState::kUnchecked) {
    GAC_ASSIGN_OR_RETURN(plan.front, options.front_passes(request));
    plan.checking = true;
  }
  return base::Status::Ok();
}

}  // namespace

bool SameLayout(const std::int64_t* sizes, int ndim, const std::int64_t* a, const std::int64_t* b) {
  for (int i = 0; i < ndim; ++i) {
    if (sizes[i] > 1 && a[i] != b[i]) return false;
  }
  return true;
}

bool SameSizes(const Dims& a, const std::int64_t* b, int ndim) {
  if (a.size() != ndim) return false;
  const std::int64_t* d = a.data();
  for (int i = 0; i < ndim; ++i) {
    if (d[i] != b[i]) return false;
  }
  return true;
}

namespace {

// The slots and their chunks, from the source's description of each
// parameter; the snapshot's elements (the slices' total, padding included).
base::StatusOr<std::int64_t> DescribeSlots(Plan& plan, GradientSource& source, const AgentOptions& options) {
  const int snap_elem_size = options.snapshot_dtype == SnapshotDtype::kBFloat16 ? 2 : 4;
  const std::size_t count = source.size();
  plan.slots.resize(count);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    TensorView p;
    TensorView g;
    Plan::Slot& s = plan.slots[i];
    GAC_RETURN_IF_ERROR(source.Describe(i, &s.param, &p, &g));
    if (i == 0) {
      plan.device = p.device;
    } else if (p.device != plan.device) {
      return base::Status::InvalidArgument("parameter " + std::to_string(i) + " is on " + p.device.str() +
                                           " and parameter 0 on " + plan.device.str() +
                                           "; the agent needs every gradient on one device");
    }
    s.numel = p.numel;
    s.sizes.assign(p.sizes, p.ndim);
    if (g.data != nullptr && SameSizes(s.sizes, g.sizes, g.ndim) && g.non_overlapping_and_dense) {
      s.snap_strides.assign(g.strides, g.ndim);
    } else if (p.non_overlapping_and_dense) {
      s.snap_strides.assign(p.strides, p.ndim);
    } else {
      const std::vector<std::int64_t> strides = ContiguousStrides(s.sizes);
      s.snap_strides.assign(strides.data(), static_cast<int>(strides.size()));
    }
    s.snap_contiguous =
        SameLayout(s.sizes.data(), s.sizes.size(), s.snap_strides.data(), ContiguousStrides(s.sizes).data());
    const std::int64_t pad = plan.device.kind == DeviceId::Kind::kCpu ? 0 : SlicePad(g, snap_elem_size);
    s.offset = total + pad;
    total += (pad + s.numel + kSliceAlignElements - 1) / kSliceAlignElements * kSliceAlignElements;
    s.first_chunk = static_cast<std::int64_t>(plan.spans.size());
    for (std::int64_t b = 0; b < s.numel; b += options.chunk_elements) {
      cpu::Span span;
      span.n = std::min(options.chunk_elements, s.numel - b);
      plan.spans.push_back(span);  // span.p is set once the snapshot exists
    }
    s.end_chunk = static_cast<std::int64_t>(plan.spans.size());
  }
  plan.chunk_elements = options.chunk_elements;
  return total;
}

// Each parameter's layer and whether this rank counts it (AgentOptions::
// layers, ::uncounted; AgentCore::Create checked the indices are >= 0 and
// not repeated).
base::Status MarkParameters(Plan& plan, const AgentOptions& options) {
  const std::size_t count = plan.slots.size();
  plan.group_of.assign(count, -1);
  for (std::size_t g = 0; g < options.layers.size(); ++g) {
    for (int i : options.layers[g].parameters) {
      if (static_cast<std::size_t>(i) >= count) {
        return base::Status::InvalidArgument("layer '" + options.layers[g].name + "' names parameter " +
                                             std::to_string(i) + " of " + std::to_string(count));
      }
      plan.group_of[static_cast<std::size_t>(i)] = static_cast<int>(g);
    }
  }
  plan.counted.assign(count, 1);
  for (int i : options.uncounted) {
    if (static_cast<std::size_t>(i) >= count) {
      return base::Status::InvalidArgument("uncounted parameter " + std::to_string(i) + " of " +
                                           std::to_string(count));
    }
    plan.counted[static_cast<std::size_t>(i)] = 0;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const Plan::Slot& s = plan.slots[i];
    for (std::int64_t c = s.first_chunk; c < s.end_chunk; ++c) plan.spans[c].counted = plan.counted[i] != 0;
  }
  plan.present.assign(count, 0);
  return base::Status::Ok();
}

// The snapshot of `total` elements, where the passes keep it (the host, the
// device passes' memory; the front keeps its own), and the spans' slices.
base::Status AllocateSnapshot(Plan& plan, const AgentOptions& options, std::int64_t total) {
  const bool bf16 = options.snapshot_dtype == SnapshotDtype::kBFloat16;
  plan.snap_type = bf16 ? cpu::ElemType::kBF16 : cpu::ElemType::kF32;
  plan.snap_elem_size = bf16 ? 2 : 4;
  if (plan.front_only()) {
    plan.snapshot_bytes = static_cast<std::size_t>(plan.front->snapshot_bytes());
    return base::Status::Ok();
  }
  plan.snapshot_bytes = static_cast<std::size_t>(std::max<std::int64_t>(total, 1)) * plan.snap_elem_size;
  if (plan.device_passes != nullptr) {
    GAC_ASSIGN_OR_RETURN(char* base, plan.device_passes->AllocateSnapshot(plan.snapshot_bytes));
    plan.snapshot = SnapshotMemory(base, [](char*) {});  // the device passes free it
  } else {
    GAC_ASSIGN_OR_RETURN(SnapshotMemory memory, HostSnapshot(plan.snapshot_bytes));
    plan.snapshot = std::move(memory);
  }
  plan.snap_base = plan.snapshot.get();
  for (const Plan::Slot& s : plan.slots) {
    for (std::int64_t c = s.first_chunk; c < s.end_chunk; ++c) {
      const std::int64_t element = s.offset + (c - s.first_chunk) * options.chunk_elements;
      plan.spans[c].p = plan.snap_base + element * static_cast<std::int64_t>(plan.snap_elem_size);
    }
  }
  return base::Status::Ok();
}

// Tasks: runs of chunks with roughly equal element counts, kTasksPerThread
// per thread.
void SplitTasks(Plan& plan, const AgentOptions& options, std::int64_t total) {
  const std::int64_t tasks = options.num_threads * kTasksPerThread;
  const std::int64_t target = total < kSerialElements
                                  ? std::max<std::int64_t>(total, 1)
                                  : std::max(options.chunk_elements, (total + tasks - 1) / tasks);
  plan.task_first_chunk.push_back(0);
  std::int64_t acc = 0;
  for (std::size_t c = 0; c < plan.spans.size(); ++c) {
    acc += plan.spans[c].n;
    if (acc >= target && c + 1 < plan.spans.size()) {
      plan.task_first_chunk.push_back(static_cast<std::int64_t>(c + 1));
      acc = 0;
    }
  }
  plan.task_first_chunk.push_back(static_cast<std::int64_t>(plan.spans.size()));
}

}  // namespace

base::StatusOr<std::unique_ptr<Plan>> Plan::Build(GradientSource& source, const AgentOptions& options) {
  auto plan = std::make_unique<Plan>();
  GAC_ASSIGN_OR_RETURN(const std::int64_t total, DescribeSlots(*plan, source, options));
  GAC_RETURN_IF_ERROR(MarkParameters(*plan, options));
  GAC_RETURN_IF_ERROR(ChoosePasses(*plan, options));
  if (plan->device_passes != nullptr) plan->device_tensors.resize(plan->slots.size());
  GAC_RETURN_IF_ERROR(AllocateSnapshot(*plan, options, total));
  plan->partials.resize(plan->spans.size());
  plan->reduced.assign(3 + 3 * options.layers.size() + (plan->device_passes ? 1 : 0), 0.0);
  SplitTasks(*plan, options, total);
  return plan;
}

}  // namespace gac::agent
