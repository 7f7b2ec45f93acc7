#include "gac/agent/agent.h"

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#ifdef __linux__
#include <sys/mman.h>
#endif

#include "cpu_kernels.h"
#include "device_passes.h"
#include "thread_pool.h"

namespace gac::agent {

namespace {

using Clock = std::chrono::steady_clock;

// The device passes take the CPU kernels' element types as they are.
static_assert(static_cast<int>(cpu::ElemType::kF32) == static_cast<int>(cuda::ElemType::kF32) &&
                  static_cast<int>(cpu::ElemType::kBF16) == static_cast<int>(cuda::ElemType::kBF16) &&
                  static_cast<int>(cpu::ElemType::kF16) == static_cast<int>(cuda::ElemType::kF16),
              "cpu::ElemType and cuda::ElemType must number the types alike");

// Below this many elements a step runs on the calling thread only: waking
// workers would cost more than it saves.
constexpr std::int64_t kSerialElements = std::int64_t{1} << 18;
// Parameters whose gradients are looked up together (see Step).
constexpr std::size_t kGatherBlock = 16;
constexpr std::int64_t kTasksPerThread = 4;
// Snapshot slices start on 64-byte boundaries (16 fp32 / 32 bf16 elements).
constexpr std::int64_t kSliceAlignElements = 32;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::optional<cpu::ElemType> ToElemType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return cpu::ElemType::kF32;
    case at::kBFloat16: return cpu::ElemType::kBF16;
    case at::kHalf: return cpu::ElemType::kF16;
    default: return std::nullopt;
  }
}

// Strides agree on every dimension that has more than one element.
bool SameLayout(at::IntArrayRef sizes, at::IntArrayRef a, at::IntArrayRef b) {
  if (a.size() != b.size() || a.size() != sizes.size()) return false;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > 1 && a[i] != b[i]) return false;
  }
  return true;
}

bool SameSizes(at::IntArrayRef a, at::IntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// First element of a CPU tensor with plain storage, as Tensor::data_ptr()
// returns it for a non-empty tensor, without its virtual has_storage() call;
// tensors without a storage object take data_ptr() and its checks.
void* DataPtr(const at::Tensor& t, std::size_t elem_size) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();
  if (!storage) return t.data_ptr();
  return static_cast<char*>(storage.data()) + impl->storage_offset() * static_cast<std::int64_t>(elem_size);
}

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

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kMonitor: return "monitor";
    case Mode::kLocal: return "local";
    case Mode::kRemote: return "remote";
  }
  return "?";
}

std::optional<double> GroupStats::cosine() const {
  if (!(pp > 0.0) || !std::isfinite(dot) || !std::isfinite(gg) || !std::isfinite(pp) || gg < 0.0) {
    return std::nullopt;
  }
  return dot / (std::sqrt(gg) * std::sqrt(pp) + kCosineEpsilon);
}

StatusOr<Mode> ParseMode(const char* name) {
  for (Mode m : {Mode::kMonitor, Mode::kLocal, Mode::kRemote}) {
    if (name != nullptr && std::strcmp(name, ModeName(m)) == 0) return m;
  }
  return Status::InvalidArgument(std::string("unknown agent mode '") + (name ? name : "") +
                                 "' (expected monitor, local or remote)");
}

// The parameter set, the snapshot and the per-step scratch. Built on the
// first step after creation or Reset().
struct Agent::Plan {
  // What Step() reads for every tensor comes first (~1.5 cache lines).
  struct Slot {
    const c10::TensorImpl* param = nullptr;  // identity of the parameter
    std::int64_t numel = 0;
    std::int64_t first_chunk = 0;
    std::int64_t end_chunk = 0;     // chunks [first_chunk, end_chunk) are this tensor's
    bool snap_contiguous = false;   // snap_strides are the contiguous strides of sizes
    c10::SmallVector<std::int64_t, 5> sizes;  // inline up to 5 dimensions
    std::int64_t offset = 0;  // first snapshot element
    c10::SmallVector<std::int64_t, 5> snap_strides;  // layout of the snapshot slice
  };
  // A gradient that takes the strided path this step.
  struct Strided {
    const Slot* slot;
    const at::Tensor* grad;
  };

  std::vector<Slot> slots;
  // One per chunk, in slot order: the snapshot slice and length are fixed;
  // the gradient pointer and type are set per step (null: no gradient this
  // step, or not dense with the snapshot's layout).
  std::vector<cpu::Span> spans;
  std::vector<std::int64_t> task_first_chunk;  // tasks + 1 entries
  std::vector<cpu::Partial> partials;          // one per chunk (parallel passes)
  std::vector<Strided> strided;                // per step
  std::vector<int> group_of;                   // per slot: its parameter group, or -1
  std::vector<double> reduced;                 // per step: 3 sums, then 3 per group
                                               // (device plans: then the non-finite count)
  // Gradients on a GPU: the passes run there (the spans then only carry
  // device pointers for the gather) and the snapshot lives on that device.
  c10::Device device = c10::Device(c10::kCPU);
  std::unique_ptr<DevicePasses> device_passes;  // null for CPU plans
  std::vector<cuda::TensorRef> device_tensors;  // per slot, per step
  std::int64_t chunk_elements = 0;
  at::Tensor snapshot;                         // flat, snapshot dtype
  char* snap_base = nullptr;
  std::size_t snap_elem_size = 4;
  cpu::ElemType snap_type = cpu::ElemType::kF32;
  at::ScalarType snap_scalar = at::kFloat;
  bool has_reference = false;
  bool stepped = false;
  std::int64_t last_step = 0;

  std::int64_t num_tasks() const { return static_cast<std::int64_t>(task_first_chunk.size()) - 1; }
  at::Tensor SnapshotView(const Slot& s) const {
    return at::from_blob(snap_base + s.offset * static_cast<std::int64_t>(snap_elem_size), s.sizes, s.snap_strides,
                         at::TensorOptions().dtype(snap_scalar).device(device));
  }

  // Builds the slots, chunks, tasks and the zeroed snapshot for `params`.
  static StatusOr<std::unique_ptr<Plan>> Build(const std::vector<at::Tensor>& params, const AgentOptions& options);
};

StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  StatusOr<Controller> controller = Controller::Create(options.thresholds, options.alpha_mode);
  if (!controller.ok()) return controller.status();
  if (options.chunk_elements < 1024) {
    return Status::InvalidArgument("chunk_elements must be >= 1024, got " + std::to_string(options.chunk_elements));
  }
  if (options.num_threads < 0) {
    return Status::InvalidArgument("num_threads must be >= 0, got " + std::to_string(options.num_threads));
  }
  if (options.num_threads == 0) {
    options.num_threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  }
  if (options.mode == Mode::kRemote && options.decision_source == nullptr) {
    return Status::InvalidArgument("remote mode needs options.decision_source (e.g. a RemoteController)");
  }
  std::vector<bool> grouped;
  for (const AgentOptions::ParameterGroup& g : options.groups) {
    if (g.name.empty()) return Status::InvalidArgument("parameter group with an empty name");
    for (int i : g.parameters) {
      if (i < 0) return Status::InvalidArgument("parameter group '" + g.name + "' has a negative index");
      if (static_cast<std::size_t>(i) >= grouped.size()) grouped.resize(static_cast<std::size_t>(i) + 1, false);
      if (grouped[static_cast<std::size_t>(i)]) {
        return Status::InvalidArgument("parameter " + std::to_string(i) + " is in more than one group");
      }
      grouped[static_cast<std::size_t>(i)] = true;
    }
  }
  return std::unique_ptr<Agent>(new Agent(std::move(options), *controller));
}

Status Agent::set_mode(Mode mode) {
  if (mode == Mode::kRemote && options_.decision_source == nullptr) {
    return Status::InvalidArgument("remote mode needs options.decision_source (e.g. a RemoteController)");
  }
  options_.mode = mode;
  return Status::Ok();
}

Agent::Agent(AgentOptions options, Controller controller)
    : options_(std::move(options)),
      controller_(controller),
      pool_(std::make_unique<ThreadPool>(options_.num_threads)) {}

Agent::~Agent() = default;

void Agent::Reset() { plan_.reset(); }

std::int64_t Agent::snapshot_bytes() const {
  return plan_ ? static_cast<std::int64_t>(plan_->snapshot.nbytes()) : 0;
}

const char* Agent::kernel_isa() const { return cpu::BestKernels().isa; }

StatusOr<std::unique_ptr<Agent::Plan>> Agent::Plan::Build(const std::vector<at::Tensor>& params,
                                                          const AgentOptions& options) {
  auto plan = std::make_unique<Plan>();
  plan->slots.resize(params.size());
  std::int64_t total = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.defined()) return Status::InvalidArgument("parameter " + std::to_string(i) + " is an undefined tensor");
    if (i == 0) {
      plan->device = p.device();
    } else if (p.device() != plan->device) {
      return Status::InvalidArgument("parameter " + std::to_string(i) + " is on " + p.device().str() +
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
      StatusOr<std::unique_ptr<DevicePasses>> passes =
          CreateCudaPasses(plan->device, bf16, static_cast<int>(options.groups.size()));
      if (!passes.ok()) return passes.status();
      plan->device_passes = std::move(*passes);
      plan->device_tensors.resize(params.size());
    }
#endif
    if (plan->device_passes == nullptr) {
      return Status::Unimplemented(
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
  for (std::size_t g = 0; g < options.groups.size(); ++g) {
    for (int i : options.groups[g].parameters) {  // Agent::Create checked i >= 0 and no repeats
      if (static_cast<std::size_t>(i) >= params.size()) {
        return Status::InvalidArgument("parameter group '" + options.groups[g].name + "' names parameter " +
                                       std::to_string(i) + " of " + std::to_string(params.size()));
      }
      plan->group_of[static_cast<std::size_t>(i)] = static_cast<int>(g);
    }
  }
  plan->reduced.assign(3 + 3 * options.groups.size() + (plan->device_passes ? 1 : 0), 0.0);

  // Tasks: runs of chunks with roughly equal element counts, kTasksPerThread
  // per thread. (16 per thread, for statistics tasks that follow the gather
  // more closely, measured no better on 2,000 x 4 KiB tensors.)
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

StatusOr<StepReport> Agent::Step(std::int64_t step, const std::vector<at::Tensor>& parameters) try {
  const auto t0 = Clock::now();
  if (!plan_) {
    StatusOr<std::unique_ptr<Plan>> plan = Plan::Build(parameters, options_);
    if (!plan.ok()) return plan.status();
    plan_ = std::move(*plan);
  } else if (parameters.size() != plan_->slots.size()) {
    return Status::FailedPrecondition("parameter set changed: " + std::to_string(parameters.size()) +
                                      " tensors, the agent tracks " + std::to_string(plan_->slots.size()) +
                                      " (call Reset() to start over with a new set)");
  }
  Plan& plan = *plan_;
  if (plan.stepped && step <= plan.last_step) {
    return Status::InvalidArgument("step " + std::to_string(step) + " is not after the previous step " +
                                   std::to_string(plan.last_step));
  }

  StepReport report;
  report.step = step;
  // Gather the gradients; validate everything before touching anything.
  // The tensors are read through their TensorImpl: Tensor::grad() would add a
  // dispatcher call (is_leaf) per parameter and data_ptr() a virtual call.
  //
  // With many small tensors this is bound by cache misses: each tensor is a
  // chain of objects (parameter -> autograd meta -> gradient -> storage ->
  // data) over ~10 cache lines that are rarely all in L2. So blocks of
  // kGatherBlock parameters go through three short loops (look up the
  // gradients; prefetch their storage objects; check them), and with a
  // serial plan the statistics of a block's chunks are computed right after
  // it is gathered, while its data is in L1 (reading is no side effect, so
  // an error in a later block still leaves everything untouched).
  const cpu::Kernels& k = cpu::BestKernels();
  const std::int64_t num_spans = static_cast<std::int64_t>(plan.spans.size());
  // Device plans: the gather below only collects pointers.
  const bool serial = plan.device_passes == nullptr && (plan.num_tasks() <= 1 || pool_->num_threads() == 1);
  const bool has_ref = plan.has_reference;
  cpu::Partial serial_sum;  // serial plans: the statistics of spans [0, summed)
  std::int64_t summed = 0;
  plan.strided.clear();
  cpu::Span* const spans = plan.spans.data();
  // Gathers the gradients into the spans; spans [0, *frontier) are final
  // (parallel plans: the statistics tasks run behind it).
  const auto gather = [&](std::atomic<std::int64_t>* frontier) -> Status {
    for (std::size_t b0 = 0; b0 < parameters.size(); b0 += kGatherBlock) {
      const std::size_t b1 = std::min(parameters.size(), b0 + kGatherBlock);
      const at::Tensor* grads[kGatherBlock];
      for (std::size_t i = b0; i < b1; ++i) {
        const c10::TensorImpl* impl = parameters[i].unsafeGetTensorImpl();
        // s.param is never the undefined tensor's impl, so this also rejects undefined tensors.
        if (impl != plan.slots[i].param) {
          return Status::FailedPrecondition("parameter set changed: tensor " + std::to_string(i) +
                                            " is not the one tracked (call Reset() to start over with a new set)");
        }
        grads[i - b0] = &impl->grad();
      }
      for (std::size_t i = b0; i < b1; ++i) {
        const c10::StorageImpl* storage = grads[i - b0]->unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
        if (storage != nullptr) __builtin_prefetch(&storage->data_ptr());
      }
      for (std::size_t i = b0; i < b1; ++i) {
        const Plan::Slot& s = plan.slots[i];
        const at::Tensor& g = *grads[i - b0];
        if (!g.defined()) {
          (void)parameters[i].grad();  // LibTorch's warning for a non-leaf tensor's missing .grad
          for (std::int64_t c = s.first_chunk; c < s.end_chunk; ++c) spans[c].g = nullptr;
          continue;
        }
        const c10::TensorImpl* gi = g.unsafeGetTensorImpl();
        if (gi->device() != plan.device) {
          return Status::InvalidArgument("gradient of parameter " + std::to_string(i) + " is on " + g.device().str() +
                                         ", the parameters on " + plan.device.str() +
                                         "; the agent needs every gradient on one device");
        }
        const at::ScalarType scalar = c10::typeMetaToScalarType(gi->dtype());
        const std::optional<cpu::ElemType> type = ToElemType(scalar);
        if (!type) {
          return Status::InvalidArgument("gradient of parameter " + std::to_string(i) + " has dtype " +
                                         std::string(c10::toString(scalar)) +
                                         "; supported: float32, bfloat16, float16");
        }
        if (!SameSizes(gi->sizes(), s.sizes)) {
          return Status::InvalidArgument("gradient of parameter " + std::to_string(i) +
                                         " does not have the parameter's shape");
        }
        // A non-empty contiguous gradient has the contiguous strides on every
        // dimension of more than one element, so it matches a contiguous snapshot.
        const bool fast = gi->is_non_overlapping_and_dense() &&
                          ((s.numel > 0 && s.snap_contiguous && gi->is_contiguous()) ||
                           SameLayout(s.sizes, gi->strides(), s.snap_strides));
        if (fast) {
          const std::size_t elem_size = *type == cpu::ElemType::kF32 ? 4 : 2;
          char* const data = s.numel > 0 ? static_cast<char*>(DataPtr(g, elem_size)) : nullptr;
          const std::int64_t chunk_bytes = plan.chunk_elements * static_cast<std::int64_t>(elem_size);
          for (std::int64_t c = s.first_chunk; c < s.end_chunk; ++c) {
            spans[c].g = data + (c - s.first_chunk) * chunk_bytes;
            spans[c].gt = *type;
          }
        } else {
          for (std::int64_t c = s.first_chunk; c < s.end_chunk; ++c) spans[c].g = nullptr;
          plan.strided.push_back({&s, &g});
        }
        report.elements += s.numel;
        ++report.tensors;
      }
      if (serial) {
        const std::int64_t end = plan.slots[b1 - 1].end_chunk;
        k.stats_spans(spans + summed, end - summed, plan.snap_type, has_ref, nullptr, &serial_sum);
        summed = end;
      }
      if (frontier != nullptr) frontier->store(plan.slots[b1 - 1].end_chunk, std::memory_order_release);
    }
    return Status::Ok();
  };

  // Statistics. Both ways add the per-chunk partials in chunk order, so the
  // sums do not depend on the thread count or the gather blocks.
  double sums[3] = {0.0, 0.0, 0.0};
  if (serial || plan.device_passes != nullptr) {
    Status st = gather(nullptr);
    if (!st.ok()) return st;
  }
  if (serial) {  // summed block by block in the gather
    sums[0] = serial_sum.dot;
    sums[1] = serial_sum.gg;
    sums[2] = serial_sum.pp;
  } else if (plan.device_passes == nullptr) {  // device plans: below
    // The tasks start while this thread gathers, each once its chunks are
    // gathered: the gather (pointer chasing through ~10 cold cache lines per
    // tensor) overlaps the pass. On an error the tasks stop (frontier -1)
    // and nothing was written.
    std::atomic<std::int64_t> frontier{0};
    Status gathered;
    const std::function<void()> gather_first = [&] {
      gathered = gather(&frontier);
      if (!gathered.ok()) frontier.store(-1, std::memory_order_release);
    };
    pool_->ParallelFor(
        plan.num_tasks(),
        [&](std::int64_t task) {
          const std::int64_t first = plan.task_first_chunk[task];
          const std::int64_t end = plan.task_first_chunk[task + 1];
          std::int64_t f;
          while ((f = frontier.load(std::memory_order_acquire)) >= 0 && f < end) CpuRelax();
          if (f < 0) return;
          k.stats_spans(spans + first, end - first, plan.snap_type, has_ref, plan.partials.data() + first, nullptr);
        },
        &gather_first);
    if (!gathered.ok()) return gathered;
    for (const cpu::Partial& p : plan.partials) {
      sums[0] += p.dot;
      sums[1] += p.gg;
      sums[2] += p.pp;
    }
  }
  report.strided_tensors = static_cast<std::int32_t>(plan.strided.size());
  // What the all-reduce sums: (dot, gg, pp) of the step, then of each
  // parameter group (opt-in).
  std::vector<double>& reduced = plan.reduced;
  std::fill(reduced.begin(), reduced.end(), 0.0);
  reduced[0] = sums[0];
  reduced[1] = sums[1];
  reduced[2] = sums[2];
  // Device plans: the dense gradients' sums, the groups' too, come from the
  // device, all-reduced there by a DeviceReducer unless strided gradients
  // (ATen sums below, on the host) must join them first.
  bool all_reduced = false;
  if (plan.device_passes != nullptr) {
    for (std::size_t i = 0; i < plan.slots.size(); ++i) {
      const Plan::Slot& s = plan.slots[i];
      cuda::TensorRef& t = plan.device_tensors[i];
      const bool dense = s.first_chunk < s.end_chunk && spans[s.first_chunk].g != nullptr;
      t.g = dense ? spans[s.first_chunk].g : nullptr;
      t.gt = dense ? static_cast<cuda::ElemType>(spans[s.first_chunk].gt) : cuda::ElemType::kF32;
      t.p = plan.snap_base + s.offset * static_cast<std::int64_t>(plan.snap_elem_size);
      t.n = s.numel;
      t.segment = plan.group_of[i];
    }
    Status st = plan.device_passes->Statistics(plan.device_tensors, has_ref,
                                               plan.strided.empty() ? options_.reducer.get() : nullptr,
                                               reduced.data(), &all_reduced);
    if (!st.ok()) return st;
  }
  // Strided gradients: ATen in fp64 (rare; allocates per tensor).
  for (const Plan::Strided& st : plan.strided) {
    const at::Tensor g64 = st.grad->to(at::kDouble);
    double part[3] = {0.0, g64.square().sum().item<double>(), 0.0};
    if (has_ref) {
      const at::Tensor p64 = plan.SnapshotView(*st.slot).to(at::kDouble);
      part[0] = (g64 * p64).sum().item<double>();
      part[2] = p64.square().sum().item<double>();
    }
    const int g = plan.group_of[static_cast<std::size_t>(st.slot - plan.slots.data())];
    for (int j = 0; j < 3; ++j) {
      reduced[static_cast<std::size_t>(j)] += part[j];
      if (g >= 0) reduced[static_cast<std::size_t>(3 + 3 * g + j)] += part[j];
    }
  }
  // Dense gradients of the groups: one more read of them (strided ones have
  // no span and add nothing here).
  const std::size_t num_groups = options_.groups.size();
  for (std::size_t g = 0; plan.device_passes == nullptr && g < num_groups; ++g) {
    for (int i : options_.groups[g].parameters) {
      const Plan::Slot& s = plan.slots[static_cast<std::size_t>(i)];
      cpu::Partial part;
      k.stats_spans(spans + s.first_chunk, s.end_chunk - s.first_chunk, plan.snap_type, has_ref, nullptr, &part);
      reduced[3 + 3 * g] += part.dot;
      reduced[4 + 3 * g] += part.gg;
      reduced[5 + 3 * g] += part.pp;
    }
  }
  if (options_.reducer && !all_reduced) {
    Status st = options_.reducer->AllReduceSum(reduced.data(), reduced.size());
    if (!st.ok()) return Status::Unavailable("all-reduce of the GAC statistics failed: " + st.ToString());
  }
  for (std::size_t g = 0; g < num_groups; ++g) {
    report.groups.push_back(
        GroupStats{options_.groups[g].name, reduced[3 + 3 * g], reduced[4 + 3 * g], reduced[5 + 3 * g]});
  }
  const AlignmentStats stats{reduced[0], reduced[1], reduced[2], has_ref};
  report.decision = controller_.Decide(stats);
  const auto t1 = Clock::now();
  report.stats_seconds = Seconds(t0, t1);
  if (options_.mode == Mode::kRemote) {
    // Every rank must apply the same decision: a fallback anywhere is a
    // fallback everywhere (the local decisions agree, the statistics being
    // all-reduced).
    StatusOr<Decision> remote = options_.decision_source->Decide(step, stats);
    double fell_back = remote.ok() ? 0.0 : 1.0;
    if (options_.reducer) {
      Status st = options_.reducer->AllReduceSum(&fell_back, 1);
      if (!st.ok()) return Status::Unavailable("all-reduce of the remote-decision outcome failed: " + st.ToString());
    }
    if (fell_back == 0.0) {
      report.decision = *remote;
    } else {
      report.fallback = true;
      report.remote_error = remote.ok() ? "another rank fell back" : remote.status().ToString();
      ++fallbacks_;
    }
    report.decide_seconds = Seconds(t1, Clock::now());
  }
  const auto t2 = Clock::now();

  // Apply: project in local mode, refresh the snapshot per the reference policy.
  const Regime regime = report.decision.regime;
  report.step_optimizer = options_.mode == Mode::kMonitor || report.decision.apply_update;
  const bool project = options_.mode != Mode::kMonitor && regime == Regime::kProject;
  const bool applied_policy = options_.reference == ReferencePolicy::kAppliedUpdate;
  const bool write_snapshot = regime != Regime::kInvalid && (!applied_policy || report.step_optimizer);
  if (project || write_snapshot) {
    const float coeff = static_cast<float>(report.decision.projection_coeff);
    const auto apply = [&](std::int64_t first, std::int64_t count) {
      if (project) {
        k.project_snapshot_spans(spans + first, count, plan.snap_type, coeff, applied_policy);
      } else {
        k.snapshot_spans(spans + first, count, plan.snap_type);
      }
    };
    if (plan.device_passes != nullptr) {  // enqueued on the current stream, not waited for
      Status st = plan.device_passes->Apply(project, coeff, applied_policy);
      if (!st.ok()) return st;
    } else if (serial) {
      apply(0, num_spans);
    } else {
      pool_->ParallelFor(plan.num_tasks(), [&](std::int64_t task) {
        const std::int64_t first = plan.task_first_chunk[task];
        apply(first, plan.task_first_chunk[task + 1] - first);
      });
    }
    for (const Plan::Strided& st : plan.strided) {
      at::Tensor g = *st.grad;  // shares storage with the parameter's gradient
      at::Tensor p = plan.SnapshotView(*st.slot);
      if (project) {
        const at::Tensor projected = g.to(at::kFloat) - p.to(at::kFloat) * coeff;
        if (!applied_policy) p.copy_(g);
        g.copy_(projected);
        if (applied_policy) p.copy_(g);
      } else {
        p.copy_(g);
      }
    }
    report.gradient_modified = project;
    if (write_snapshot) plan.has_reference = true;
  }
  plan.stepped = true;
  plan.last_step = step;
  plan.strided.clear();
  report.apply_seconds = Seconds(t2, Clock::now());
  return report;
} catch (const std::exception& e) {
  return Status::Internal(std::string("agent step failed: ") + e.what());
}

}  // namespace gac::agent
