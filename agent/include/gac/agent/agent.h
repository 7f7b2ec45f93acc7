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

#include "gac/agent/decision_source.h"
#include "gac/agent/reducer.h"
#include "gac/controller/controller.h"

namespace gac::agent {

class ThreadPool;

enum class Mode : std::uint8_t {
  kMonitor = 0,  // measure and report; never change the update
  kLocal = 1,    // decide in-process and apply the decision
  kRemote = 2,   // ask options.decision_source (gacd); on an error use the
                 // local decision and report the fallback
};
enum class SnapshotDtype : std::uint8_t { kFloat32 = 0, kBFloat16 = 1 };
// What the next step is compared with.
enum class ReferencePolicy : std::uint8_t {
  kRawGradient = 0,    // the previous raw gradient (the paper's c_t); default
  kAppliedUpdate = 1,  // the previous applied (projected) gradient; unchanged by a skip
};

const char* ModeName(Mode mode);
StatusOr<Mode> ParseMode(const char* name);

struct AgentOptions {
  Thresholds thresholds;
  AlphaMode alpha_mode = AlphaMode::kPaper;
  Mode mode = Mode::kLocal;
  SnapshotDtype snapshot_dtype = SnapshotDtype::kFloat32;
  ReferencePolicy reference = ReferencePolicy::kRawGradient;
  // Threads for the passes, the caller included; 0 = hardware threads, at most 8.
  int num_threads = 0;
  // Elements per work item; tensors are split into chunks of this size.
  std::int64_t chunk_elements = std::int64_t{1} << 16;
  // Sums the statistics across ranks when gradients are sharded; null when
  // each rank holds whole gradients (or there is one rank).
  std::shared_ptr<Reducer> reducer;
  // The decision source of remote mode (gac::agent::RemoteController).
  // Required for Mode::kRemote. With a reducer, a fallback on any rank makes
  // every rank use the local decision (one more 1-scalar all-reduce), so the
  // ranks never apply different updates.
  std::shared_ptr<DecisionSource> decision_source;
  // Per-layer breakdown (opt-in): named groups of parameter indices. Each
  // step then reports dot, |g|^2 and |p|^2 per group (summed across ranks
  // with the main statistics). A parameter may be in at most one group.
  struct ParameterGroup {
    std::string name;
    std::vector<int> parameters;  // indices into Step()'s parameter list
  };
  std::vector<ParameterGroup> groups;
};

// One parameter group's statistics for a step.
struct GroupStats {
  std::string name;
  double dot = 0.0, gg = 0.0, pp = 0.0;
  // cos(g_group, p_group); absent without a reference or with a zero norm.
  std::optional<double> cosine() const;
};

struct StepReport {
  std::int64_t step = 0;
  // The controller's verdict: regime, cosine, alpha, norms. In monitor mode it
  // says what local mode would have done.
  Decision decision;
  // Call optimizer.step()? Always true in monitor mode.
  bool step_optimizer = true;
  // True when the gradients were projected in place.
  bool gradient_modified = false;
  std::int64_t elements = 0;        // local gradient elements read
  std::int32_t tensors = 0;         // tensors with a gradient this step
  std::int32_t strided_tensors = 0; // tensors that took the strided path
  double stats_seconds = 0.0;       // statistics pass and all-reduce
  double decide_seconds = 0.0;      // remote decision (remote mode)
  double apply_seconds = 0.0;       // projection / snapshot pass (CUDA: enqueueing it)
  // Remote mode: the decision source failed (or another rank's did) and the
  // local decision was used; remote_error says why.
  bool fallback = false;
  std::string remote_error;
  std::vector<GroupStats> groups;   // per options.groups, in order
};

class Agent {
 public:
  // Validates the options (thresholds, chunk size); InvalidArgument on error.
  static StatusOr<std::unique_ptr<Agent>> Create(AgentOptions options);
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
  StatusOr<StepReport> Step(std::int64_t step, const std::vector<at::Tensor>& parameters);

  // Forgets the parameter set and the snapshot: the next Step() has no
  // reference and may use a new parameter list.
  void Reset();
  // Switches mode between steps (e.g. from an operator's command).
  // InvalidArgument for kRemote without a decision source.
  Status set_mode(Mode mode);
  // Remote decisions replaced by the local one since creation.
  std::uint64_t fallbacks() const { return fallbacks_; }
  const AgentOptions& options() const { return options_; }
  const Controller& controller() const { return controller_; }
  // Bytes held by the snapshot (0 before the first step).
  std::int64_t snapshot_bytes() const;
  // Name of the CPU kernels in use ("avx512", "avx2", "baseline").
  const char* kernel_isa() const;

 private:
  struct Plan;
  Agent(AgentOptions options, Controller controller);

  AgentOptions options_;
  Controller controller_;
  std::unique_ptr<Plan> plan_;
  std::unique_ptr<ThreadPool> pool_;
  std::uint64_t fallbacks_ = 0;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_AGENT_H_
