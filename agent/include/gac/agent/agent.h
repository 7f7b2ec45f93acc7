// Agent: Gradient Alignment Control inside the trainer.
//
// Call Step() once per optimizer step, after backward (and after gradient
// accumulation and any data-parallel reduction), before clipping and the
// optimizer:
//
//   auto report = agent.Step(step, params);       // StatusOr<StepReport>
//   if (!report.ok()) { log(report.status()); optimizer.step(); }
//   else if (report->step_optimizer) optimizer.step();
//
// Step() reads every gradient once for the statistics (no flattening, no
// copy), decides through gac::Controller, and in `local` mode projects the
// gradients in place in a second pass that also refreshes the snapshot of the
// previous gradient; otherwise that pass only writes the snapshot. Memory:
// one snapshot (fp32 or bf16) plus O(chunks) scratch, allocated on the first
// step and reused.
//
// Gradients may be fp32, bf16 or fp16, any size (zero included), dense or
// strided. Parameters without a gradient this step are left out of the
// statistics and keep their snapshot. The parameter list must be the same
// tensors in the same order at every step; Reset() starts over with a new set.
//
// Gradients on a CUDA device (all parameters on that one device) need a
// build against a CUDA LibTorch: the passes then run as fused multi-tensor
// kernels on the device's current stream, the snapshot lives on the device,
// and Step() waits for the device only to read back the summed statistics;
// the projection / snapshot pass is enqueued, not waited for. A DeviceReducer
// (NcclReducer) all-reduces the sums on the device.
//
// Thread-safety: an Agent is used by one training thread at a time. It owns
// a small thread pool for its passes. Step() never throws; errors come back
// as a Status and leave the gradients and the snapshot untouched.
#ifndef GAC_AGENT_AGENT_H_
#define GAC_AGENT_AGENT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gac/agent/reducer.h"
#include "gac/controller/controller.h"
#include "gac/controller/decision_source.h"
#include "gac/controller/step_report.h"

namespace gac::agent {

// The agent's vocabulary is the controller library's (LibTorch-free, shared
// with the transport and gacd); re-exported so gac::agent::Mode and
// gac::Mode name the same type.
using ::gac::controller::DecisionSource;
using ::gac::controller::LayerStats;
using ::gac::controller::Mode;
using ::gac::controller::ModeName;
using ::gac::controller::ParseMode;
using ::gac::controller::StepReport;

class ThreadPool;
struct Plan;

enum class SnapshotDtype : std::uint8_t { kFloat32 = 0, kBFloat16 = 1 };
// What the next step is compared with.
enum class ReferencePolicy : std::uint8_t {
  kRawGradient = 0,    // the previous raw gradient (the paper's c_t); default
  kAppliedUpdate = 1,  // the previous applied (projected) gradient; unchanged by a skip
};

// (The deprecated member `groups` would make the compiler warn wherever the
// implicit constructors are used; only a use of `groups` itself should.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct AgentOptions {
  controller::Thresholds thresholds;
  controller::AlphaMode alpha_mode = controller::AlphaMode::kPaper;
  controller::Mode mode = controller::Mode::kLocal;
  SnapshotDtype snapshot_dtype = SnapshotDtype::kFloat32;
  ReferencePolicy reference = ReferencePolicy::kRawGradient;
  // Threads for the passes, the caller included; 0 = hardware threads, at most 8.
  int num_threads = 0;
  // Elements per work item; tensors are split into chunks of this size.
  std::int64_t chunk_elements = std::int64_t{1} << 16;
  // Sums the statistics across ranks when gradients are sharded; null when
  // each rank holds whole gradients (or there is one rank).
  std::shared_ptr<Reducer> reducer;
  // The decision source of remote mode (gac::transport::RemoteController).
  // Required for Mode::kRemote. With a reducer, a fallback on any rank makes
  // every rank use the local decision (one more 1-scalar all-reduce), so the
  // ranks never apply different updates.
  std::shared_ptr<controller::DecisionSource> decision_source;
  // Per-layer breakdown (opt-in): named sets of parameter indices (a "layer"
  // is any such set). Each step then reports dot, |g|^2 and |p|^2 per layer
  // in StepReport::layers (summed across ranks with the main statistics). A
  // parameter may be in at most one layer.
  struct LayerSpec {
    std::string name;
    std::vector<int> parameters;  // indices into Step()'s parameter list
  };
  using ParameterGroup [[deprecated("use AgentOptions::LayerSpec")]] = LayerSpec;
  std::vector<LayerSpec> layers;
  // The former name of `layers`: Agent::Create moves it into `layers` when
  // `layers` is empty (InvalidArgument when both are given).
  [[deprecated("use AgentOptions::layers")]] std::vector<LayerSpec> groups;
};
#pragma GCC diagnostic pop

class Agent {
 public:
  // Validates the options (thresholds, chunk size); InvalidArgument on error.
  static base::StatusOr<std::unique_ptr<Agent>> Create(AgentOptions options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // One GAC step over the gradients of `parameters` (see the file comment).
  // REQUIRES: step greater than the previous step since creation or Reset().
  // Errors: InvalidArgument (unsupported dtype, non-increasing step,
  // parameters or gradients on different devices), FailedPrecondition
  // (parameter set changed; call Reset()), Unimplemented (gradients on a
  // device this build cannot read), Unavailable (the reducer failed). On
  // error nothing is modified.
  base::StatusOr<controller::StepReport> Step(std::int64_t step, const std::vector<at::Tensor>& parameters);

  // Forgets the parameter set and the snapshot: the next Step() has no
  // reference and may use a new parameter list.
  void Reset();
  // Switches mode between steps (e.g. from an operator's command).
  // InvalidArgument for kRemote without a decision source.
  base::Status set_mode(controller::Mode mode);
  // Remote decisions replaced by the local one since creation.
  std::uint64_t fallbacks() const { return fallbacks_; }
  const AgentOptions& options() const { return options_; }
  const controller::Controller& controller() const { return controller_; }
  // Bytes held by the snapshot (0 before the first step).
  std::int64_t snapshot_bytes() const;
  // Name of the CPU kernels in use ("avx512", "avx2", "baseline").
  const char* kernel_isa() const;

 private:
  Agent(AgentOptions options, controller::Controller controller);

  // Step()'s parts, in order. Builds the plan on the first step (or checks
  // the parameter count and the step number against it).
  base::Status PreparePlan(std::int64_t step, const std::vector<at::Tensor>& parameters);
  // Gathers the gradients and sums dot, |g|^2, |p|^2 (and per group) into
  // the plan, all-reduced across ranks when there is a reducer.
  base::Status ComputeStatistics(const std::vector<at::Tensor>& parameters, controller::StepReport* report);
  // Remote mode: the decision source's answer, or the local decision and a
  // fallback (on every rank when any rank falls back).
  base::Status DecideRemotely(std::int64_t step, const controller::AlignmentStats& stats, controller::StepReport* report);
  // Projects the gradients in place (local and remote modes) and refreshes
  // the snapshot, per the decision and the reference policy.
  base::Status ApplyDecision(controller::StepReport* report);

  AgentOptions options_;
  controller::Controller controller_;
  std::unique_ptr<Plan> plan_;
  std::unique_ptr<ThreadPool> pool_;
  std::uint64_t fallbacks_ = 0;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_AGENT_H_
