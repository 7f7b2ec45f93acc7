#include "gac/agent/agent.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>

#include "cpu_kernels.h"
#include "thread_pool.h"

namespace gac::agent {

namespace {

using Clock = std::chrono::steady_clock;

// Below this many elements a step runs on the calling thread only: waking
// workers would cost more than it saves.
constexpr std::int64_t kSerialElements = std::int64_t{1} << 18;
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

std::vector<std::int64_t> ContiguousStrides(at::IntArrayRef sizes) {
  std::vector<std::int64_t> strides(sizes.size());
  std::int64_t s = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(sizes[i], 1);
  }
  return strides;
}

}  // namespace

const char* ModeName(Mode mode) { return mode == Mode::kMonitor ? "monitor" : "local"; }

StatusOr<Mode> ParseMode(const char* name) {
  for (Mode m : {Mode::kMonitor, Mode::kLocal}) {
    if (name != nullptr && std::strcmp(name, ModeName(m)) == 0) return m;
  }
  return Status::InvalidArgument(std::string("unknown agent mode '") + (name ? name : "") +
                                 "' (expected monitor or local)");
}

// The parameter set, the snapshot and the per-step scratch. Built on the
// first step after creation or Reset().
struct Agent::Plan {
  struct Slot {
    const c10::TensorImpl* param = nullptr;  // identity of the parameter
    std::int64_t numel = 0;
    std::int64_t offset = 0;  // first snapshot element
    std::vector<std::int64_t> sizes;
    std::vector<std::int64_t> snap_strides;  // layout of the snapshot slice
    // Per step.
    const at::Tensor* grad = nullptr;  // null: no gradient this step
    void* grad_ptr = nullptr;
    cpu::ElemType grad_type = cpu::ElemType::kF32;
    std::size_t grad_elem_size = 4;
    bool fast = false;  // dense, same layout as the snapshot: flat kernels
  };
  struct Chunk {
    std::int32_t slot;
    std::int64_t begin;
    std::int64_t length;
  };

  std::vector<Slot> slots;
  std::vector<Chunk> chunks;
  std::vector<std::int64_t> task_first_chunk;  // tasks + 1 entries
  std::vector<cpu::Partial> partials;          // one per chunk
  at::Tensor snapshot;                         // flat, snapshot dtype
  char* snap_base = nullptr;
  std::size_t snap_elem_size = 4;
  cpu::ElemType snap_type = cpu::ElemType::kF32;
  at::ScalarType snap_scalar = at::kFloat;
  bool has_reference = false;
  bool stepped = false;
  std::int64_t last_step = 0;

  at::Tensor SnapshotView(const Slot& s) const {
    return at::from_blob(snap_base + s.offset * static_cast<std::int64_t>(snap_elem_size), s.sizes, s.snap_strides,
                         at::TensorOptions().dtype(snap_scalar));
  }
  char* SnapshotPtr(const Slot& s, std::int64_t begin) const {
    return snap_base + (s.offset + begin) * static_cast<std::int64_t>(snap_elem_size);
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
  return std::unique_ptr<Agent>(new Agent(std::move(options), *controller));
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
    auto& s = plan->slots[i];
    s.param = p.unsafeGetTensorImpl();
    s.numel = p.numel();
    s.sizes = p.sizes().vec();
    const at::Tensor& g = p.grad();
    if (g.defined() && g.sizes() == p.sizes() && g.is_non_overlapping_and_dense()) {
      s.snap_strides = g.strides().vec();
    } else if (p.is_non_overlapping_and_dense()) {
      s.snap_strides = p.strides().vec();
    } else {
      s.snap_strides = ContiguousStrides(p.sizes());
    }
    s.offset = total;
    total += (s.numel + kSliceAlignElements - 1) / kSliceAlignElements * kSliceAlignElements;
    for (std::int64_t b = 0; b < s.numel; b += options.chunk_elements) {
      plan->chunks.push_back({static_cast<std::int32_t>(i), b, std::min(options.chunk_elements, s.numel - b)});
    }
  }
  const bool bf16 = options.snapshot_dtype == SnapshotDtype::kBFloat16;
  plan->snap_scalar = bf16 ? at::kBFloat16 : at::kFloat;
  plan->snap_type = bf16 ? cpu::ElemType::kBF16 : cpu::ElemType::kF32;
  plan->snap_elem_size = bf16 ? 2 : 4;
  plan->snapshot = at::zeros({std::max<std::int64_t>(total, 1)}, at::TensorOptions().dtype(plan->snap_scalar));
  plan->snap_base = static_cast<char*>(plan->snapshot.data_ptr());
  plan->partials.resize(plan->chunks.size());

  // Tasks: runs of chunks with roughly equal element counts, a few per thread.
  const std::int64_t threads = options.num_threads;
  const std::int64_t target = total < kSerialElements
                                  ? std::max<std::int64_t>(total, 1)
                                  : std::max(options.chunk_elements, (total + threads * 4 - 1) / (threads * 4));
  plan->task_first_chunk.push_back(0);
  std::int64_t acc = 0;
  for (std::size_t c = 0; c < plan->chunks.size(); ++c) {
    acc += plan->chunks[c].length;
    if (acc >= target && c + 1 < plan->chunks.size()) {
      plan->task_first_chunk.push_back(static_cast<std::int64_t>(c + 1));
      acc = 0;
    }
  }
  plan->task_first_chunk.push_back(static_cast<std::int64_t>(plan->chunks.size()));
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
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    Plan::Slot& s = plan.slots[i];
    const at::Tensor& p = parameters[i];
    if (!p.defined() || p.unsafeGetTensorImpl() != s.param) {
      return Status::FailedPrecondition("parameter set changed: tensor " + std::to_string(i) +
                                        " is not the one tracked (call Reset() to start over with a new set)");
    }
    const at::Tensor& g = p.grad();
    s.grad = nullptr;
    if (!g.defined()) continue;
    if (!g.device().is_cpu()) {
      return Status::Unimplemented("gradient of parameter " + std::to_string(i) + " is on " + g.device().str() +
                                   "; this build of the agent reads CPU gradients only");
    }
    const std::optional<cpu::ElemType> type = ToElemType(g.scalar_type());
    if (!type) {
      return Status::InvalidArgument("gradient of parameter " + std::to_string(i) + " has dtype " +
                                     std::string(c10::toString(g.scalar_type())) +
                                     "; supported: float32, bfloat16, float16");
    }
    if (g.sizes() != at::IntArrayRef(s.sizes)) {
      return Status::InvalidArgument("gradient of parameter " + std::to_string(i) +
                                     " does not have the parameter's shape");
    }
    s.grad = &g;
    s.grad_type = *type;
    s.grad_elem_size = g.element_size();
    s.fast = g.is_non_overlapping_and_dense() && SameLayout(s.sizes, g.strides(), s.snap_strides);
    s.grad_ptr = s.fast ? g.data_ptr() : nullptr;
    report.elements += s.numel;
    ++report.tensors;
    report.strided_tensors += s.fast ? 0 : 1;
  }

  // Statistics.
  const cpu::Kernels& k = cpu::BestKernels();
  const bool has_ref = plan.has_reference;
  const auto run_chunks = [&](auto&& chunk_fn) {
    pool_->ParallelFor(static_cast<std::int64_t>(plan.task_first_chunk.size()) - 1, [&](std::int64_t task) {
      for (std::int64_t c = plan.task_first_chunk[task]; c < plan.task_first_chunk[task + 1]; ++c) {
        const Plan::Chunk& ch = plan.chunks[c];
        chunk_fn(c, ch, plan.slots[ch.slot]);
      }
    });
  };
  run_chunks([&](std::int64_t c, const Plan::Chunk& ch, const Plan::Slot& s) {
    if (s.grad == nullptr || !s.fast) {
      plan.partials[c] = cpu::Partial{};
      return;
    }
    const char* g = static_cast<const char*>(s.grad_ptr) + ch.begin * static_cast<std::int64_t>(s.grad_elem_size);
    plan.partials[c] = k.stats(g, s.grad_type, has_ref ? plan.SnapshotPtr(s, ch.begin) : nullptr, plan.snap_type,
                               ch.length);
  });
  double sums[3] = {0.0, 0.0, 0.0};
  for (const cpu::Partial& p : plan.partials) {
    sums[0] += p.dot;
    sums[1] += p.gg;
    sums[2] += p.pp;
  }
  // Strided gradients: ATen in fp64 (rare; allocates per tensor).
  for (const Plan::Slot& s : plan.slots) {
    if (s.grad == nullptr || s.fast) continue;
    const at::Tensor g64 = s.grad->to(at::kDouble);
    sums[1] += g64.square().sum().item<double>();
    if (has_ref) {
      const at::Tensor p64 = plan.SnapshotView(s).to(at::kDouble);
      sums[0] += (g64 * p64).sum().item<double>();
      sums[2] += p64.square().sum().item<double>();
    }
  }
  if (options_.reducer) {
    Status st = options_.reducer->AllReduceSum(sums, 3);
    if (!st.ok()) return Status::Unavailable("all-reduce of the GAC statistics failed: " + st.ToString());
  }
  report.decision = controller_.Decide(AlignmentStats{sums[0], sums[1], sums[2], has_ref});
  const auto t1 = Clock::now();
  report.stats_seconds = Seconds(t0, t1);

  // Apply: project in local mode, refresh the snapshot per the reference policy.
  const Regime regime = report.decision.regime;
  report.step_optimizer = options_.mode == Mode::kMonitor || report.decision.apply_update;
  const bool project = options_.mode == Mode::kLocal && regime == Regime::kProject;
  const bool applied_policy = options_.reference == ReferencePolicy::kAppliedUpdate;
  const bool write_snapshot = regime != Regime::kInvalid && (!applied_policy || report.step_optimizer);
  if (project || write_snapshot) {
    const float coeff = static_cast<float>(report.decision.projection_coeff);
    run_chunks([&](std::int64_t, const Plan::Chunk& ch, const Plan::Slot& s) {
      if (s.grad == nullptr || !s.fast) return;
      char* g = static_cast<char*>(s.grad_ptr) + ch.begin * static_cast<std::int64_t>(s.grad_elem_size);
      char* p = plan.SnapshotPtr(s, ch.begin);
      if (project) {
        k.project_snapshot(g, s.grad_type, p, plan.snap_type, ch.length, coeff, applied_policy);
      } else {
        k.snapshot(g, s.grad_type, p, plan.snap_type, ch.length);
      }
    });
    for (const Plan::Slot& s : plan.slots) {
      if (s.grad == nullptr || s.fast) continue;
      at::Tensor g = *s.grad;  // shares storage with the parameter's gradient
      at::Tensor p = plan.SnapshotView(s);
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
  for (Plan::Slot& s : plan.slots) s.grad = nullptr;
  report.apply_seconds = Seconds(t1, Clock::now());
  return report;
} catch (const std::exception& e) {
  return Status::Internal(std::string("agent step failed: ") + e.what());
}

}  // namespace gac::agent
