#include "gac/agent/core.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <set>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/src/cpu/kernels.h"
#include "agent/src/cpu/thread_pool.h"
#include "agent/src/device_passes.h"
#include "agent/src/plan.h"
#include "agent/src/self_check.h"

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

std::optional<cpu::ElemType> ToElemType(DType t) {
  switch (t) {
    case DType::kF32: return cpu::ElemType::kF32;
    case DType::kBF16: return cpu::ElemType::kBF16;
    case DType::kF16: return cpu::ElemType::kF16;
    default: return std::nullopt;
  }
}

std::size_t ElemSize(cpu::ElemType t) { return t == cpu::ElemType::kF32 ? 4 : 2; }

// No two indices of the layout address the same element: sorted by stride,
// each dimension's stride passes the furthest element of the ones before it.
// (A sufficient test; torch's layouts that fail it share memory.)
bool NonOverlapping(const std::int64_t* sizes, const std::int64_t* strides, int ndim) {
  std::vector<int> dims;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] == 0) return true;
    if (sizes[d] > 1) dims.push_back(d);
  }
  std::sort(dims.begin(), dims.end(), [&](int a, int b) { return strides[a] < strides[b]; });
  std::int64_t furthest = 0;
  for (int d : dims) {
    if (strides[d] <= furthest) return false;
    furthest += strides[d] * (sizes[d] - 1);
  }
  return true;
}

void MarkAbsent(Plan::Slot const& s, cpu::Span* spans) {
  for (std::int64_t c = s.first_chunk; c < s.end_chunk; ++c) spans[c].g = nullptr;
}

// Checks the gradient of parameter i and points its spans at it (fast path:
// dense, with the snapshot's layout) or queues it for the strided path.
// Counts it in the report. Reads only: nothing is modified on error.
base::Status GatherOne(Plan& plan, std::size_t i, const TensorView& g, bool absent, controller::StepReport* report) {
  const Plan::Slot& s = plan.slots[i];
  cpu::Span* const spans = plan.spans.data();
  plan.present[i] = absent ? 0 : plan.counted[i] != 0 ? 1 : 2;
  if (absent) {
    MarkAbsent(s, spans);
    return base::Status::Ok();
  }
  if (g.device != plan.device) {
    return base::Status::InvalidArgument("gradient of parameter " + std::to_string(i) + " is on " + g.device.str() +
                                         ", the parameters on " + plan.device.str() +
                                         "; the agent needs every gradient on one device");
  }
  const std::optional<cpu::ElemType> type = ToElemType(g.dtype);
  if (!type) {
    return base::Status::InvalidArgument("gradient of parameter " + std::to_string(i) + " has dtype " +
                                         g.dtype_name + "; supported: float32, bfloat16, float16");
  }
  if (!SameSizes(s.sizes, g.sizes, g.ndim)) {
    return base::Status::InvalidArgument("gradient of parameter " + std::to_string(i) +
                                         " does not have the parameter's shape");
  }
  report->elements += s.numel;
  ++report->tensors;
  if (plan.front_only()) return base::Status::Ok();  // the front reads any layout
  // A non-empty contiguous gradient has the contiguous strides on every
  // dimension of more than one element, so it matches a contiguous snapshot.
  const bool fast = g.non_overlapping_and_dense &&
                    ((s.numel > 0 && s.snap_contiguous && g.contiguous) ||
                     SameLayout(s.sizes.data(), s.sizes.size(), g.strides, s.snap_strides.data()));
  if (fast) {
    char* const data = s.numel > 0 ? static_cast<char*>(g.data) : nullptr;
    const std::int64_t chunk_bytes = plan.chunk_elements * static_cast<std::int64_t>(ElemSize(*type));
    for (std::int64_t c = s.first_chunk; c < s.end_chunk; ++c) {
      spans[c].g = data + (c - s.first_chunk) * chunk_bytes;
      spans[c].gt = *type;
    }
  } else if (plan.device_passes != nullptr && !NonOverlapping(g.sizes, g.strides, g.ndim)) {
    return base::Status::Unimplemented("gradient of parameter " + std::to_string(i) +
                                       " has elements that share memory (a stride of 0, as expand() gives); on a "
                                       "GPU the agent reads gradients whose elements are distinct");
  } else {
    MarkAbsent(s, spans);
    Plan::Strided st{&s, g, plan.strided_dims.size()};
    st.grad.dtype = g.dtype;
    plan.strided_dims.insert(plan.strided_dims.end(), g.strides, g.strides + g.ndim);
    plan.strided.push_back(st);
  }
  return base::Status::Ok();
}

// Gathers every parameter's gradient into the plan's spans, block by block,
// and calls on_block(end_chunk) after each block: spans [0, end_chunk) are
// then final. Validates everything before anything is written. The source
// reads its block's tensors together (the LibTorch front prefetches them),
// and the caller may sum a block's chunks right after it is gathered, while
// its data is in cache.
template <typename OnBlock>
base::Status GatherGradients(Plan& plan, GradientSource& source, controller::StepReport* report, OnBlock&& on_block) {
  const std::size_t count = plan.slots.size();
  for (std::size_t b0 = 0; b0 < count; b0 += kGatherBlock) {
    const std::size_t b1 = std::min(count, b0 + kGatherBlock);
    const void* ids[kGatherBlock];
    TensorView grads[kGatherBlock];
    bool absent[kGatherBlock];
    GAC_RETURN_IF_ERROR(source.Gather(b0, b1, ids, grads, absent));
    for (std::size_t i = b0; i < b1; ++i) {
      if (ids[i - b0] != plan.slots[i].param) {
        return base::Status::FailedPrecondition("parameter set changed: tensor " + std::to_string(i) +
                                                " is not the one tracked (call Reset() to start over with a new set)");
      }
    }
    for (std::size_t i = b0; i < b1; ++i) {
      GAC_RETURN_IF_ERROR(GatherOne(plan, i, grads[i - b0], absent[i - b0], report));
    }
    on_block(plan.slots[b1 - 1].end_chunk);
  }
  return base::Status::Ok();
}

// Fast path, one thread: each block's chunks are summed right after the block
// is gathered.
base::Status SumSerially(Plan& plan, GradientSource& parameters, controller::StepReport* report) {
  const auto pass = cpu::BestKernels().stats_spans;
  cpu::Partial sum;
  std::int64_t summed = 0;
  GAC_RETURN_IF_ERROR(GatherGradients(plan, parameters, report, [&](std::int64_t end) {
    pass(plan.spans.data() + summed, end - summed, plan.snap_type, plan.has_reference, nullptr, &sum);
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
base::Status SumInParallel(Plan& plan, ThreadPool& pool, GradientSource& parameters, controller::StepReport* report) {
  const auto pass = cpu::BestKernels().stats_spans;
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
        pass(plan.spans.data() + first, end - first, plan.snap_type, plan.has_reference,
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

// On a GPU: the sums, the groups' too, come from the device, all-reduced
// there by a DeviceReducer. Gradients not dense in their snapshot's layout
// go to the device passes' strided path.
base::Status SumOnDevice(Plan& plan, Reducer* reducer, GradientSource& parameters, controller::StepReport* report,
                         bool* all_reduced) {
  GAC_RETURN_IF_ERROR(GatherGradients(plan, parameters, report, [](std::int64_t) {}));
  plan.device_strided.clear();
  for (const Plan::Strided& st : plan.strided) {
    const Plan::Slot& s = *st.slot;
    StridedTensor t;
    t.g = st.grad.data;
    t.gt = static_cast<cuda::ElemType>(*ToElemType(st.grad.dtype));
    t.p = plan.SnapshotAt(s);
    t.n = s.numel;
    t.segment = plan.group_of[static_cast<std::size_t>(plan.SlotIndex(s))];
    t.counted = plan.counted[static_cast<std::size_t>(plan.SlotIndex(s))] != 0;
    t.ndim = s.sizes.size();
    t.sizes = s.sizes.data();
    t.g_strides = plan.strided_dims.data() + st.strides_at;
    t.p_strides = s.snap_strides.data();
    t.p_row_major = s.snap_contiguous;
    plan.device_strided.push_back(t);
  }
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
    t.counted = plan.counted[i] != 0;
  }
  return plan.device_passes->Statistics(plan.device_tensors, plan.device_strided, plan.has_reference, reducer,
                                        plan.reduced.data(), all_reduced, parameters.Stream(plan.device.index));
}

// The front's passes (any device): the gather checks the gradients and
// marks which are present; the front reads them.
base::Status SumOnFront(Plan& plan, GradientSource& parameters, controller::StepReport* report) {
  GAC_RETURN_IF_ERROR(GatherGradients(plan, parameters, report, [](std::int64_t) {}));
  return plan.front->Statistics(plan.present, plan.has_reference, plan.reduced.data());
}

// The first-contact check (self_check.h): the kernels' local sums of this
// step against the front's. A difference beyond the tolerance makes the
// front's sums this step's and the front's passes the plan's from now on (the
// front's snapshot was kept alike while checking); a conclusive agreement
// ends the check. Either verdict holds for the device in every agent.
base::Status CheckKernels(Plan& plan, std::vector<std::string>* warnings) {
  std::vector<double> reference(plan.reduced.size(), 0.0);
  GAC_RETURN_IF_ERROR(plan.front->Statistics(plan.present, plan.has_reference, reference.data()));
  const std::size_t groups = (plan.reduced.size() - 1) / 3 - 1;  // device plans carry the non-finite count too
  const SelfCheckResult r = CompareSums(plan.reduced.data(), reference.data(), groups, plan.has_reference);
  if (r.max_difference > kSelfCheckTolerance) {
    RecordSelfCheck(plan.device.index, false);
    char figures[128];
    std::snprintf(figures, sizeof figures, "%.3g in %s (relative; tolerance %.0e)", r.max_difference,
                  r.worst.c_str(), kSelfCheckTolerance);
    warnings->push_back("gac: on " + plan.device.str() + " the statistics of gac's CUDA kernels (gac_stats, " +
                        "gac_finalize) differ from the front's (" + plan.front->name() + ") by " + figures +
                        ": this device uses the front's passes from now on (slower). Please report it with the "
                        "output of `python -m gac --selftest`.");
    std::copy(reference.begin(), reference.end(), plan.reduced.begin());
    plan.device_passes.reset();
    plan.checking = false;
    plan.passes_name = plan.front->name();
  } else if (r.conclusive) {
    RecordSelfCheck(plan.device.index, true);
    plan.front.reset();
    plan.checking = false;
  }
  return base::Status::Ok();
}

// Calls f(a, b) for every index of `sizes` in row-major order, with the
// element offsets of that index under strides sa and sb.
template <typename F>
void ForEachIndex(const std::int64_t* sizes, int ndim, const std::int64_t* sa, const std::int64_t* sb, F&& f) {
  std::int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) numel *= sizes[d];
  if (numel == 0) return;
  std::vector<std::int64_t> index(static_cast<std::size_t>(ndim), 0);
  std::int64_t a = 0;
  std::int64_t b = 0;
  for (std::int64_t n = 0; n < numel; ++n) {
    f(a, b);
    for (int d = ndim - 1; d >= 0; --d) {
      const auto k = static_cast<std::size_t>(d);
      if (++index[k] < sizes[d]) {
        a += sa[d];
        b += sb[d];
        break;
      }
      a -= sa[d] * (sizes[d] - 1);
      b -= sb[d] * (sizes[d] - 1);
      index[k] = 0;
    }
  }
}

// A strided gradient and its snapshot slice, copied into (and back out of)
// contiguous buffers in the same element order, so that the kernels of the
// fast path do the arithmetic.
struct StridedCopy {
  std::vector<char> g;
  std::vector<char> p;
};

StridedCopy CopyIn(const Plan& plan, const Plan::Strided& st) {
  const Plan::Slot& s = *st.slot;
  const std::size_t ge = ElemSize(*ToElemType(st.grad.dtype));
  const std::size_t pe = plan.snap_elem_size;
  StridedCopy c{std::vector<char>(static_cast<std::size_t>(s.numel) * ge),
                std::vector<char>(static_cast<std::size_t>(s.numel) * pe)};
  const char* g = static_cast<const char*>(st.grad.data);
  const char* p = plan.SnapshotAt(s);
  std::size_t n = 0;
  ForEachIndex(s.sizes.data(), s.sizes.size(), plan.strided_dims.data() + st.strides_at, s.snap_strides.data(),
               [&](std::int64_t a, std::int64_t b) {
                 std::memcpy(c.g.data() + n * ge, g + a * static_cast<std::int64_t>(ge), ge);
                 std::memcpy(c.p.data() + n * pe, p + b * static_cast<std::int64_t>(pe), pe);
                 ++n;
               });
  return c;
}

void CopyOut(const Plan& plan, const Plan::Strided& st, const StridedCopy& c, bool write_g) {
  const Plan::Slot& s = *st.slot;
  const std::size_t ge = ElemSize(*ToElemType(st.grad.dtype));
  const std::size_t pe = plan.snap_elem_size;
  char* g = static_cast<char*>(st.grad.data);
  char* p = plan.SnapshotAt(s);
  std::size_t n = 0;
  ForEachIndex(s.sizes.data(), s.sizes.size(), plan.strided_dims.data() + st.strides_at, s.snap_strides.data(),
               [&](std::int64_t a, std::int64_t b) {
                 if (write_g) std::memcpy(g + a * static_cast<std::int64_t>(ge), c.g.data() + n * ge, ge);
                 std::memcpy(p + b * static_cast<std::int64_t>(pe), c.p.data() + n * pe, pe);
                 ++n;
               });
}

// Slow path: gradients that are not dense with the snapshot's layout (rare;
// copies each one).
void SumStrided(Plan& plan) {
  const cpu::Kernels& k = cpu::BestKernels();
  for (const Plan::Strided& st : plan.strided) {
    if (plan.counted[static_cast<std::size_t>(plan.SlotIndex(*st.slot))] == 0) continue;
    const StridedCopy c = CopyIn(plan, st);
    const cpu::Partial part = k.stats(c.g.data(), *ToElemType(st.grad.dtype),
                                      plan.has_reference ? c.p.data() : nullptr, plan.snap_type, st.slot->numel);
    const double values[3] = {part.dot, part.grad_sq, part.ref_sq};
    const int g = plan.group_of[static_cast<std::size_t>(plan.SlotIndex(*st.slot))];
    for (int j = 0; j < 3; ++j) {
      plan.reduced[static_cast<std::size_t>(j)] += values[j];
      if (g >= 0) plan.reduced[static_cast<std::size_t>(3 + 3 * g + j)] += values[j];
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

// Slow path of the apply pass: the strided gradients, through copies.
void ApplyStrided(const Plan& plan, bool project, float coeff, bool snapshot_projected) {
  const cpu::Kernels& k = cpu::BestKernels();
  for (const Plan::Strided& st : plan.strided) {
    StridedCopy c = CopyIn(plan, st);
    const cpu::ElemType gt = *ToElemType(st.grad.dtype);
    if (project) {
      k.project_snapshot(c.g.data(), gt, c.p.data(), plan.snap_type, st.slot->numel, coeff, snapshot_projected);
    } else {
      k.snapshot(c.g.data(), gt, c.p.data(), plan.snap_type, st.slot->numel);
    }
    CopyOut(plan, st, c, project);
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

const char* PersistentName(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> names;
  const std::lock_guard<std::mutex> lock(mu);
  return names.insert(name).first->c_str();
}

std::string DeviceId::str() const {
  switch (kind) {
    case Kind::kCpu: return "cpu";
    case Kind::kCuda: return "cuda:" + std::to_string(index);
    default: return index >= 0 ? std::string(other_name) + ":" + std::to_string(index) : std::string(other_name);
  }
}

bool IsContiguous(const std::int64_t* sizes, const std::int64_t* strides, int ndim) {
  std::int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (sizes[d] == 0) return true;
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

bool NonOverlappingAndDense(const std::int64_t* sizes, const std::int64_t* strides, int ndim) {
  if (IsContiguous(sizes, strides, ndim)) return true;
  // Some order of the dimensions is contiguous: sort them by stride.
  std::vector<int> order(static_cast<std::size_t>(ndim));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return sizes[a] < 2 ? false : sizes[b] < 2 ? true : strides[a] < strides[b];
  });
  std::int64_t expected = 1;
  for (int d : order) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

base::StatusOr<std::unique_ptr<AgentCore>> AgentCore::Create(AgentOptions options) {
  GAC_RETURN_IF_ERROR(controller::ValidateThresholds(options.thresholds));
  base::Status trigger = controller::ValidateTriggerSettings(options.trigger);
  if (!trigger.ok()) return base::Status::InvalidArgument("options.trigger: " + trigger.message());
  base::Status spike = controller::ValidateSpikeSettings(options.spike);
  if (!spike.ok()) return base::Status::InvalidArgument("options.spike: " + spike.message());
  GAC_ASSIGN_OR_RETURN(controller::TriggeredController triggered,
                       controller::TriggeredController::Create(options.thresholds, options.alpha_mode, options.trigger));
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
  std::vector<int> uncounted = options.uncounted;
  std::sort(uncounted.begin(), uncounted.end());
  if (!uncounted.empty() && uncounted.front() < 0) {
    return base::Status::InvalidArgument("uncounted names parameter " + std::to_string(uncounted.front()));
  }
  if (std::adjacent_find(uncounted.begin(), uncounted.end()) != uncounted.end()) {
    return base::Status::InvalidArgument("uncounted names a parameter twice");
  }
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
  return std::unique_ptr<AgentCore>(new AgentCore(std::move(options), std::move(triggered)));
}

base::Status AgentCore::set_mode(controller::Mode mode) {
  if (mode == controller::Mode::kRemote && options_.decision_source == nullptr) {
    return base::Status::InvalidArgument("remote mode needs options.decision_source (e.g. a RemoteController)");
  }
  options_.mode = mode;
  return base::Status::Ok();
}

AgentCore::AgentCore(AgentOptions options, controller::TriggeredController triggered)
    : options_(std::move(options)),
      triggered_(std::move(triggered)),
      guard_(options_.spike),
      pool_(std::make_unique<ThreadPool>(options_.num_threads)) {}

AgentCore::~AgentCore() = default;

void AgentCore::Reset() {
  plan_.reset();
  triggered_.Reset();
  guard_.Clear();
}

std::int64_t AgentCore::snapshot_bytes() const {
  return plan_ ? static_cast<std::int64_t>(plan_->snapshot_bytes) : 0;
}

const char* AgentCore::kernel_isa() const { return cpu::BestKernels().isa; }

base::Status AgentCore::PreparePlan(std::int64_t step, GradientSource& parameters) {
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

base::Status AgentCore::ComputeStatistics(GradientSource& parameters, controller::StepReport* report) {
  Plan& plan = *plan_;
  plan.strided.clear();
  plan.strided_dims.clear();
  std::fill(plan.reduced.begin(), plan.reduced.end(), 0.0);
  bool all_reduced = false;
  // No pass writes the snapshot before the decision: a spike or an invalid
  // step keeps the last accepted gradient, on every device and in every mode.
  base::Status st;
  if (plan.front_only()) {
    st = SumOnFront(plan, parameters, report);
  } else if (plan.device_passes != nullptr) {
    // While checking, the kernels' sums stay local (compared with the
    // front's, then all-reduced on the host).
    st = SumOnDevice(plan, plan.checking ? nullptr : options_.reducer.get(), parameters, report, &all_reduced);
    if (st.ok() && plan.checking) st = CheckKernels(plan, &warnings_);
  } else if (plan.serial(pool_->num_threads())) {
    st = SumSerially(plan, parameters, report);
  } else {
    st = SumInParallel(plan, *pool_, parameters, report);
  }
  if (st.ok()) {
    report->strided_tensors = static_cast<std::int32_t>(plan.strided.size());
    report->passes = plan.passes_name;
    if (plan.device_passes == nullptr && plan.front == nullptr) {
      SumStrided(plan);
      SumLayers(plan, options_.layers);
    }
    if (options_.reducer && !all_reduced) {
      st = options_.reducer->AllReduceSum(plan.reduced.data(), plan.reduced.size());
      if (!st.ok()) st = base::Status::Unavailable("all-reduce of the GAC statistics failed: " + st.ToString());
    }
  }
  if (!st.ok()) return st;
  for (std::size_t g = 0; g < options_.layers.size(); ++g) {
    report->layers.push_back(controller::LayerStats{options_.layers[g].name, plan.reduced[3 + 3 * g], plan.reduced[4 + 3 * g],
                                        plan.reduced[5 + 3 * g]});
  }
  return base::Status::Ok();
}

base::Status AgentCore::DecideRemotely(std::int64_t step, const controller::AlignmentStats& stats, controller::StepReport* report) {
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

base::Status AgentCore::ApplyDecision(controller::StepReport* report) {
  Plan& plan = *plan_;
  const controller::Regime regime = report->decision.regime;
  report->step_optimizer = options_.mode == controller::Mode::kMonitor || report->decision.apply_update;
  const bool project = options_.mode != controller::Mode::kMonitor && regime == controller::Regime::kProject;
  const bool snapshot_projected = options_.reference == ReferencePolicy::kAppliedUpdate;
  // A spike keeps the snapshot (the last accepted gradient), as invalid does.
  const bool write_snapshot = regime != controller::Regime::kInvalid && regime != controller::Regime::kSpike &&
                              (!snapshot_projected || report->step_optimizer);
  if (!project && !write_snapshot) return base::Status::Ok();
  const float coeff = static_cast<float>(report->decision.projection_coeff);
  if (plan.front_only()) {
    GAC_RETURN_IF_ERROR(plan.front->Apply(project, coeff, snapshot_projected));
  } else if (plan.device_passes != nullptr) {  // enqueued on the current stream, not waited for
    // While checking, the front keeps its own snapshot alike (in stream
    // order, as the kernels' pass): the gradient before the projection, or
    // the projected one.
    const bool check_after = plan.checking && snapshot_projected;
    if (plan.checking && !check_after) GAC_RETURN_IF_ERROR(plan.front->Apply(false, 0.0f, false));
    GAC_RETURN_IF_ERROR(plan.device_passes->Apply(project, coeff, snapshot_projected, stream_));
    if (check_after) GAC_RETURN_IF_ERROR(plan.front->Apply(false, 0.0f, false));
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
  if (plan.device_passes == nullptr && plan.front == nullptr) ApplyStrided(plan, project, coeff, snapshot_projected);
  report->gradient_modified = project;
  if (write_snapshot) plan.has_reference = true;
  return base::Status::Ok();
}

base::StatusOr<std::optional<double>> AgentCore::GuardLoss(std::optional<double> loss) {
  if (!options_.reducer || (!options_.spike.zscore && options_.mode != controller::Mode::kRemote)) return loss;
  double sum[2] = {loss ? *loss : 0.0, loss ? 1.0 : 0.0};
  base::Status st = options_.reducer->AllReduceSum(sum, 2);
  if (!st.ok()) return base::Status::Unavailable("all-reduce of the loss failed: " + st.ToString());
  if (sum[1] == 0.0) return std::optional<double>();
  return std::optional<double>(sum[0] / sum[1]);
}

base::StatusOr<controller::StepReport> AgentCore::Step(std::int64_t step, GradientSource& parameters,
                                                       std::optional<double> loss) try {
  const auto t0 = Clock::now();
  GAC_RETURN_IF_ERROR(PreparePlan(step, parameters));
  controller::StepReport report;
  report.step = step;
  report.mode = options_.mode;
  GAC_RETURN_IF_ERROR(ComputeStatistics(parameters, &report));
  const std::vector<double>& sums = plan_->reduced;
  GAC_ASSIGN_OR_RETURN(const std::optional<double> guard_loss, GuardLoss(loss));
  const controller::AlignmentStats stats{sums[0], sums[1], sums[2], plan_->has_reference, guard_loss};
  report.loss = guard_loss;
  // The spike guard, then the local decision (monitor: what local mode
  // would do; remote: the fallback), which move their windows: undone if
  // the step fails. A spike does not enter GAC's window.
  before_step_ = triggered_;
  guard_before_step_ = guard_;
  std::optional<controller::SpikeVerdict> verdict;
  if (options_.spike.enabled() && !controller::StatsInvalid(stats)) {
    verdict = guard_.Judge(std::sqrt(stats.grad_sq), guard_loss);
  }
  if (verdict && verdict->spike) {
    report.decision = controller::SpikeDecision(stats, *verdict, triggered_.window().mean());
  } else {
    report.decision = triggered_.Decide(stats);
    if (verdict) report.decision.spike_verdict = *verdict;
  }
  const controller::DecisionRule rule{triggered_.per_step().thresholds(), triggered_.trigger()};
  if (options_.mode != controller::Mode::kRemote) report.rule = rule;
  const auto t1 = Clock::now();
  report.stats_seconds = Seconds(t0, t1);
  base::Status st;
  // Remote mode: the decision source decides, its own spike guard included
  // (gacd: the run's settings, on the history the source keeps); the local
  // decision is the fallback.
  if (options_.mode == controller::Mode::kRemote) {
    const bool local_spike = report.decision.regime == controller::Regime::kSpike;
    st = DecideRemotely(step, stats, &report);
    if (report.fallback) report.rule = rule;
    // The source called a spike what the local rule let in: out of the window again.
    if (!local_spike && report.decision.regime == controller::Regime::kSpike) triggered_ = *before_step_;
    report.decide_seconds = Seconds(t1, Clock::now());
  }
  // The guard's history takes the step (a spike clamped to the bound it
  // broke; an invalid step not at all).
  if (!controller::StatsInvalid(stats)) {
    guard_.Record(verdict.value_or(controller::SpikeVerdict{}), report.decision.regime == controller::Regime::kSpike,
                  std::sqrt(stats.grad_sq), guard_loss);
  }
  const auto t2 = Clock::now();
  if (st.ok()) {
    stream_ = plan_->device_passes != nullptr ? parameters.Stream(plan_->device.index) : nullptr;
    st = ApplyDecision(&report);
  }
  if (!st.ok()) {
    triggered_ = *before_step_;
    guard_ = *guard_before_step_;
    return st;
  }
  plan_->stepped = true;
  plan_->last_step = step;
  plan_->strided.clear();
  report.apply_seconds = Seconds(t2, Clock::now());
  return report;
} catch (const std::exception& e) {
  return base::Status::Internal(std::string("agent step failed: ") + e.what());
}

}  // namespace gac::agent
