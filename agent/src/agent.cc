#include "gac/agent/agent.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "agent/src/cpu/kernels.h"
#include "agent/src/cpu/thread_pool.h"
#include "agent/src/device_passes.h"
#include "agent/src/plan.h"

namespace gac::agent {

namespace {

using Clock = std::chrono::steady_clock;

// The device passes take the CPU kernels' element types as they are.
static_assert(static_cast<int>(cpu::ElemType::kF32) == static_cast<int>(cuda::ElemType::kF32) &&
                  static_cast<int>(cpu::ElemType::kBF16) == static_cast<int>(cuda::ElemType::kBF16) &&
                  static_cast<int>(cpu::ElemType::kF16) == static_cast<int>(cuda::ElemType::kF16),
              "cpu::ElemType and cuda::ElemType must number the types alike");

// Parameters whose gradients are looked up together (see GatherGradients).
constexpr std::size_t kGatherBlock = 16;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::optional<cpu::ElemType> ToElemType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return cpu::ElemType::kF32;
    case at::kBFloat16: return cpu::ElemType::kBF16;
    case at::kHalf: return cpu::ElemType::kF16;
    default: return std::nullopt;
  }
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
// tensors without a storage object take data_ptr() and its checks. Writable:
// mutable_data() materialises a copy-on-write storage first.
void* DataPtr(const at::Tensor& t, std::size_t elem_size) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();
  if (!storage) return t.data_ptr();
  return static_cast<char*>(storage.mutable_data()) + impl->storage_offset() * static_cast<std::int64_t>(elem_size);
}

void MarkAbsent(Plan::Slot const& s, cpu::Span* spans) {
  for (std::int64_t c = s.first_chunk; c < s.end_chunk; ++c) spans[c].g = nullptr;
}

// Checks the gradient of parameter i and points its spans at it (fast path:
// dense, with the snapshot's layout) or queues it for the strided path.
// Counts it in the report. Reads only: nothing is modified on error.
base::Status GatherOne(Plan& plan, std::size_t i, const at::Tensor& param, const at::Tensor& g, controller::StepReport* report) {
  const Plan::Slot& s = plan.slots[i];
  cpu::Span* const spans = plan.spans.data();
  if (!g.defined()) {
    (void)param.grad();  // LibTorch's warning for a non-leaf tensor's missing .grad
    MarkAbsent(s, spans);
    return base::Status::Ok();
  }
  const c10::TensorImpl* gi = g.unsafeGetTensorImpl();
  if (gi->device() != plan.device) {
    return base::Status::InvalidArgument("gradient of parameter " + std::to_string(i) + " is on " + g.device().str() +
                                   ", the parameters on " + plan.device.str() +
                                   "; the agent needs every gradient on one device");
  }
  const at::ScalarType scalar = c10::typeMetaToScalarType(gi->dtype());
  const std::optional<cpu::ElemType> type = ToElemType(scalar);
  if (!type) {
    return base::Status::InvalidArgument("gradient of parameter " + std::to_string(i) + " has dtype " +
                                   std::string(c10::toString(scalar)) + "; supported: float32, bfloat16, float16");
  }
  if (!SameSizes(gi->sizes(), s.sizes)) {
    return base::Status::InvalidArgument("gradient of parameter " + std::to_string(i) +
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
    MarkAbsent(s, spans);
    plan.strided.push_back({&s, &g});
  }
  report->elements += s.numel;
  ++report->tensors;
  return base::Status::Ok();
}

// Gathers every parameter's gradient into the plan's spans, block by block,
// and calls on_block(end_chunk) after each block: spans [0, end_chunk) are
// then final. Validates everything before anything is written.
//
// With many small tensors this is bound by cache misses: each tensor is a
// chain of objects (parameter -> autograd meta -> gradient -> storage ->
// data) over ~10 cache lines that are rarely all in L2. So blocks of
// kGatherBlock parameters go through three short loops (look up the
// gradients; prefetch their storage objects; check them), and the caller
// may sum a block's chunks right after it is gathered, while its data is in
// L1. The tensors are read through their TensorImpl: Tensor::grad() would add
// a dispatcher call (is_leaf) per parameter and data_ptr() a virtual call.
template <typename OnBlock>
base::Status GatherGradients(Plan& plan, const std::vector<at::Tensor>& parameters, controller::StepReport* report,
                       OnBlock&& on_block) {
  for (std::size_t b0 = 0; b0 < parameters.size(); b0 += kGatherBlock) {
    const std::size_t b1 = std::min(parameters.size(), b0 + kGatherBlock);
    const at::Tensor* grads[kGatherBlock];
    for (std::size_t i = b0; i < b1; ++i) {
      const c10::TensorImpl* impl = parameters[i].unsafeGetTensorImpl();
      // s.param is never the undefined tensor's impl, so this also rejects undefined tensors.
      if (impl != plan.slots[i].param) {
        return base::Status::FailedPrecondition("parameter set changed: tensor " + std::to_string(i) +
                                          " is not the one tracked (call Reset() to start over with a new set)");
      }
      grads[i - b0] = &impl->grad();
    }
    for (std::size_t i = b0; i < b1; ++i) {
      const c10::StorageImpl* storage = grads[i - b0]->unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
      if (storage != nullptr) __builtin_prefetch(&storage->data_ptr());
    }
    for (std::size_t i = b0; i < b1; ++i) {
      GAC_RETURN_IF_ERROR(GatherOne(plan, i, parameters[i], *grads[i - b0], report));
    }
    on_block(plan.slots[b1 - 1].end_chunk);
  }
  return base::Status::Ok();
}

// Fast path, one thread: each block's chunks are summed right after the block
// is gathered.
base::Status SumSerially(Plan& plan, const std::vector<at::Tensor>& parameters, controller::StepReport* report) {
  const cpu::Kernels& k = cpu::BestKernels();
  cpu::Partial sum;
  std::int64_t summed = 0;
  GAC_RETURN_IF_ERROR(GatherGradients(plan, parameters, report, [&](std::int64_t end) {
    k.stats_spans(plan.spans.data() + summed, end - summed, plan.snap_type, plan.has_reference, nullptr, &sum);
    summed = end;
  }));
  plan.reduced[0] = sum.dot;
  plan.reduced[1] = sum.grad_sq;
  plan.reduced[2] = sum.ref_sq;
  return base::Status::Ok();
}

// Fast path on the pool: the statistics tasks start while this thread
// gathers, each once its chunks are gathered, so the gather (pointer chasing
// through ~10 cold cache lines per tensor) overlaps the pass. On an error the
// tasks stop (frontier -1) and nothing was written. The per-chunk partials
// are added in chunk order, so the sums are the serial path's bits whatever
// the thread count.
base::Status SumInParallel(Plan& plan, ThreadPool& pool, const std::vector<at::Tensor>& parameters, controller::StepReport* report) {
  const cpu::Kernels& k = cpu::BestKernels();
  std::atomic<std::int64_t> frontier{0};
  base::Status gathered;
  const std::function<void()> gather_first = [&] {
    gathered = GatherGradients(plan, parameters, report,
                               [&](std::int64_t end) { frontier.store(end, std::memory_order_release); });
    if (!gathered.ok()) frontier.store(-1, std::memory_order_release);
  };
  pool.ParallelFor(
      plan.num_tasks(),
      [&](std::int64_t task) {
        const std::int64_t first = plan.task_first_chunk[task];
        const std::int64_t end = plan.task_first_chunk[task + 1];
        std::int64_t f;
        while ((f = frontier.load(std::memory_order_acquire)) >= 0 && f < end) CpuRelax();
        if (f < 0) return;
        k.stats_spans(plan.spans.data() + first, end - first, plan.snap_type, plan.has_reference,
                      plan.partials.data() + first, nullptr);
      },
      &gather_first);
  if (!gathered.ok()) return gathered;
  for (const cpu::Partial& p : plan.partials) {
    plan.reduced[0] += p.dot;
    plan.reduced[1] += p.grad_sq;
    plan.reduced[2] += p.ref_sq;
  }
  return base::Status::Ok();
}

// Fast path on a GPU: the dense gradients' sums, the groups' too, come from
// the device, all-reduced there by a DeviceReducer unless strided gradients
// (summed on the host by the slow path) must join them first.
base::Status SumOnDevice(Plan& plan, Reducer* reducer, const std::vector<at::Tensor>& parameters, controller::StepReport* report,
                   bool* all_reduced) {
  GAC_RETURN_IF_ERROR(GatherGradients(plan, parameters, report, [](std::int64_t) {}));
  const cpu::Span* const spans = plan.spans.data();
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
  return plan.device_passes->Statistics(plan.device_tensors, plan.has_reference,
                                        plan.strided.empty() ? reducer : nullptr, plan.reduced.data(), all_reduced);
}

// Slow path: gradients that are not dense with the snapshot's layout, summed
// by ATen in fp64 (rare; allocates per tensor).
void SumStrided(Plan& plan) {
  for (const Plan::Strided& st : plan.strided) {
    const at::Tensor g64 = st.grad->to(at::kDouble);
    double part[3] = {0.0, g64.square().sum().item<double>(), 0.0};
    if (plan.has_reference) {
      const at::Tensor p64 = plan.SnapshotView(*st.slot).to(at::kDouble);
      part[0] = (g64 * p64).sum().item<double>();
      part[2] = p64.square().sum().item<double>();
    }
    const int g = plan.group_of[static_cast<std::size_t>(plan.SlotIndex(*st.slot))];
    for (int j = 0; j < 3; ++j) {
      plan.reduced[static_cast<std::size_t>(j)] += part[j];
      if (g >= 0) plan.reduced[static_cast<std::size_t>(3 + 3 * g + j)] += part[j];
    }
  }
}

// The dense gradients of each layer on the CPU: one more read of
// them (strided ones have no span and were added by SumStrided).
void SumLayers(Plan& plan, const std::vector<AgentOptions::LayerSpec>& layers) {
  const cpu::Kernels& k = cpu::BestKernels();
  for (std::size_t g = 0; g < layers.size(); ++g) {
    for (int i : layers[g].parameters) {
      const Plan::Slot& s = plan.slots[static_cast<std::size_t>(i)];
      cpu::Partial part;
      k.stats_spans(plan.spans.data() + s.first_chunk, s.end_chunk - s.first_chunk, plan.snap_type,
                    plan.has_reference, nullptr, &part);
      plan.reduced[3 + 3 * g] += part.dot;
      plan.reduced[4 + 3 * g] += part.grad_sq;
      plan.reduced[5 + 3 * g] += part.ref_sq;
    }
  }
}

// Slow path of the apply pass: the strided gradients, through ATen.
void ApplyStrided(const Plan& plan, bool project, float coeff, bool snapshot_projected) {
  for (const Plan::Strided& st : plan.strided) {
    at::Tensor g = *st.grad;  // shares storage with the parameter's gradient
    at::Tensor p = plan.SnapshotView(*st.slot);
    if (project) {
      const at::Tensor projected = g.to(at::kFloat) - p.to(at::kFloat) * coeff;
      if (!snapshot_projected) p.copy_(g);
      g.copy_(projected);
      if (snapshot_projected) p.copy_(g);
    } else {
      p.copy_(g);
    }
  }
}

// AgentOptions::groups is the deprecated name of AgentOptions::layers.
base::Status TakeDeprecatedGroups(AgentOptions* options) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  if (options->groups.empty()) return base::Status::Ok();
  if (!options->layers.empty()) {
    return base::Status::InvalidArgument("give AgentOptions::layers or its deprecated name groups, not both");
  }
  options->layers = std::move(options->groups);
  options->groups.clear();
#pragma GCC diagnostic pop
  return base::Status::Ok();
}

}  // namespace

base::StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  GAC_ASSIGN_OR_RETURN(controller::Controller controller, controller::Controller::Create(options.thresholds, options.alpha_mode));
  if (options.chunk_elements < 1024) {
    return base::Status::InvalidArgument("chunk_elements must be >= 1024, got " + std::to_string(options.chunk_elements));
  }
  if (options.num_threads < 0) {
    return base::Status::InvalidArgument("num_threads must be >= 0, got " + std::to_string(options.num_threads));
  }
  if (options.num_threads == 0) {
    options.num_threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  }
  if (options.mode == controller::Mode::kRemote && options.decision_source == nullptr) {
    return base::Status::InvalidArgument("remote mode needs options.decision_source (e.g. a RemoteController)");
  }
  GAC_RETURN_IF_ERROR(TakeDeprecatedGroups(&options));
  std::vector<bool> grouped;
  for (const AgentOptions::LayerSpec& g : options.layers) {
    if (g.name.empty()) return base::Status::InvalidArgument("layer with an empty name");
    for (int i : g.parameters) {
      if (i < 0) return base::Status::InvalidArgument("layer '" + g.name + "' has a negative index");
      if (static_cast<std::size_t>(i) >= grouped.size()) grouped.resize(static_cast<std::size_t>(i) + 1, false);
      if (grouped[static_cast<std::size_t>(i)]) {
        return base::Status::InvalidArgument("parameter " + std::to_string(i) + " is in more than one layer");
      }
      grouped[static_cast<std::size_t>(i)] = true;
    }
  }
  return std::unique_ptr<Agent>(new Agent(std::move(options), controller));
}

base::Status Agent::set_mode(controller::Mode mode) {
  if (mode == controller::Mode::kRemote && options_.decision_source == nullptr) {
    return base::Status::InvalidArgument("remote mode needs options.decision_source (e.g. a RemoteController)");
  }
  options_.mode = mode;
  return base::Status::Ok();
}

Agent::Agent(AgentOptions options, controller::Controller controller)
    : options_(std::move(options)),
      controller_(controller),
      pool_(std::make_unique<ThreadPool>(options_.num_threads)) {}

Agent::~Agent() = default;

void Agent::Reset() { plan_.reset(); }

std::int64_t Agent::snapshot_bytes() const {
  return plan_ ? static_cast<std::int64_t>(plan_->snapshot.nbytes()) : 0;
}

const char* Agent::kernel_isa() const { return cpu::BestKernels().isa; }

base::Status Agent::PreparePlan(std::int64_t step, const std::vector<at::Tensor>& parameters) {
  if (!plan_) {
    GAC_ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, Plan::Build(parameters, options_));
    plan_ = std::move(plan);
  } else if (parameters.size() != plan_->slots.size()) {
    return base::Status::FailedPrecondition("parameter set changed: " + std::to_string(parameters.size()) +
                                      " tensors, the agent tracks " + std::to_string(plan_->slots.size()) +
                                      " (call Reset() to start over with a new set)");
  }
  if (plan_->stepped && step <= plan_->last_step) {
    return base::Status::InvalidArgument("step " + std::to_string(step) + " is not after the previous step " +
                                   std::to_string(plan_->last_step));
  }
  return base::Status::Ok();
}

base::Status Agent::ComputeStatistics(const std::vector<at::Tensor>& parameters, controller::StepReport* report) {
  Plan& plan = *plan_;
  plan.strided.clear();
  std::fill(plan.reduced.begin(), plan.reduced.end(), 0.0);
  bool all_reduced = false;
  if (plan.device_passes != nullptr) {
    GAC_RETURN_IF_ERROR(SumOnDevice(plan, options_.reducer.get(), parameters, report, &all_reduced));
  } else if (plan.serial(pool_->num_threads())) {
    GAC_RETURN_IF_ERROR(SumSerially(plan, parameters, report));
  } else {
    GAC_RETURN_IF_ERROR(SumInParallel(plan, *pool_, parameters, report));
  }
  report->strided_tensors = static_cast<std::int32_t>(plan.strided.size());
  SumStrided(plan);
  if (plan.device_passes == nullptr) SumLayers(plan, options_.layers);
  if (options_.reducer && !all_reduced) {
    base::Status st = options_.reducer->AllReduceSum(plan.reduced.data(), plan.reduced.size());
    if (!st.ok()) return base::Status::Unavailable("all-reduce of the GAC statistics failed: " + st.ToString());
  }
  for (std::size_t g = 0; g < options_.layers.size(); ++g) {
    report->layers.push_back(controller::LayerStats{options_.layers[g].name, plan.reduced[3 + 3 * g], plan.reduced[4 + 3 * g],
                                        plan.reduced[5 + 3 * g]});
  }
  return base::Status::Ok();
}

base::Status Agent::DecideRemotely(std::int64_t step, const controller::AlignmentStats& stats, controller::StepReport* report) {
  // Every rank must apply the same decision: a fallback anywhere is a
  // fallback everywhere (the local decisions agree, the statistics being
  // all-reduced).
  base::StatusOr<controller::Decision> remote = options_.decision_source->Decide(step, stats);
  double fell_back = remote.ok() ? 0.0 : 1.0;
  if (options_.reducer) {
    base::Status st = options_.reducer->AllReduceSum(&fell_back, 1);
    if (!st.ok()) return base::Status::Unavailable("all-reduce of the remote-decision outcome failed: " + st.ToString());
  }
  if (fell_back == 0.0) {
    report->decision = *remote;
  } else {
    report->fallback = true;
    report->remote_error = remote.ok() ? "another rank fell back" : remote.status().ToString();
    ++fallbacks_;
  }
  return base::Status::Ok();
}

base::Status Agent::ApplyDecision(controller::StepReport* report) {
  Plan& plan = *plan_;
  const controller::Regime regime = report->decision.regime;
  report->step_optimizer = options_.mode == controller::Mode::kMonitor || report->decision.apply_update;
  const bool project = options_.mode != controller::Mode::kMonitor && regime == controller::Regime::kProject;
  const bool snapshot_projected = options_.reference == ReferencePolicy::kAppliedUpdate;
  const bool write_snapshot = regime != controller::Regime::kInvalid && (!snapshot_projected || report->step_optimizer);
  if (!project && !write_snapshot) return base::Status::Ok();
  const float coeff = static_cast<float>(report->decision.projection_coeff);
  if (plan.device_passes != nullptr) {  // enqueued on the current stream, not waited for
    GAC_RETURN_IF_ERROR(plan.device_passes->Apply(project, coeff, snapshot_projected));
  } else {
    const cpu::Kernels& k = cpu::BestKernels();
    const auto apply = [&](std::int64_t first, std::int64_t count) {
      if (project) {
        k.project_snapshot_spans(plan.spans.data() + first, count, plan.snap_type, coeff, snapshot_projected);
      } else {
        k.snapshot_spans(plan.spans.data() + first, count, plan.snap_type);
      }
    };
    if (plan.serial(pool_->num_threads())) {
      apply(0, static_cast<std::int64_t>(plan.spans.size()));
    } else {
      pool_->ParallelFor(plan.num_tasks(), [&](std::int64_t task) {
        const std::int64_t first = plan.task_first_chunk[task];
        apply(first, plan.task_first_chunk[task + 1] - first);
      });
    }
  }
  ApplyStrided(plan, project, coeff, snapshot_projected);
  report->gradient_modified = project;
  if (write_snapshot) plan.has_reference = true;
  return base::Status::Ok();
}

base::StatusOr<controller::StepReport> Agent::Step(std::int64_t step, const std::vector<at::Tensor>& parameters) try {
  const auto t0 = Clock::now();
  GAC_RETURN_IF_ERROR(PreparePlan(step, parameters));
  controller::StepReport report;
  report.step = step;
  report.mode = options_.mode;
  GAC_RETURN_IF_ERROR(ComputeStatistics(parameters, &report));
  const std::vector<double>& sums = plan_->reduced;
  const controller::AlignmentStats stats{sums[0], sums[1], sums[2], plan_->has_reference};
  report.decision = controller_.Decide(stats);
  const auto t1 = Clock::now();
  report.stats_seconds = Seconds(t0, t1);
  if (options_.mode == controller::Mode::kRemote) {
    GAC_RETURN_IF_ERROR(DecideRemotely(step, stats, &report));
    report.decide_seconds = Seconds(t1, Clock::now());
  }
  const auto t2 = Clock::now();
  GAC_RETURN_IF_ERROR(ApplyDecision(&report));
  plan_->stepped = true;
  plan_->last_step = step;
  plan_->strided.clear();
  report.apply_seconds = Seconds(t2, Clock::now());
  return report;
} catch (const std::exception& e) {
  return base::Status::Internal(std::string("agent step failed: ") + e.what());
}

}  // namespace gac::agent
