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
// copy), decides through gac::Controller (on c_t, or with the windowed
// trigger on the mean of the last W cosines: options.trigger), and in
// `local` mode projects the gradients in place in a second pass that also
// refreshes the snapshot of the previous gradient; otherwise that pass only
// writes the snapshot. In
// `monitor` mode on the CPU (without layers) the statistics pass writes the
// snapshot as it reads, cache-sized piece by piece, so the gradients are
// read once; a non-finite gradient (invalid) then leaves no reference for
// the next step, and an error in the step may too. Memory:
// one snapshot (fp32 or bf16) plus O(chunks) scratch, allocated on the first
// step and reused.
//
// Gradients may be fp32, bf16 or fp16, any size (zero included), dense or
// strided. Parameters without a gradient this step are left out of the
// statistics and keep their snapshot. The parameter list must be the same
// tensors in the same order at every step; Reset() starts over with a new set.
//
// Gradients on a CUDA device (all parameters on that one device) need a
// build with the CUDA kernels (nvcc found): the passes then run as fused multi-tensor
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
#include <string>
#include <vector>

#include "gac/agent/core.h"
#include "gac/agent/options.h"
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



class Agent {
 public:
  // Validates the options (thresholds, trigger, chunk size); InvalidArgument
  // on error.
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
  // `loss`, when given, is read by the spike guard's z-score (options().spike).
  base::StatusOr<controller::StepReport> Step(std::int64_t step, const std::vector<at::Tensor>& parameters,
                                              std::optional<double> loss = std::nullopt);

  // Forgets the parameter set, the snapshot and the trigger's window: the
  // next Step() has no reference and may use a new parameter list.
  void Reset();
  // Switches mode between steps (e.g. from an operator's command).
  // InvalidArgument for kRemote without a decision source.
  base::Status set_mode(controller::Mode mode);
  // Remote decisions replaced by the local one since creation.
  std::uint64_t fallbacks() const { return core_->fallbacks(); }
  const AgentOptions& options() const { return core_->options(); }
  // The per-step rule (options().thresholds).
  const controller::Controller& controller() const { return core_->controller(); }
  // The rule the local decision comes from (options().trigger), with the
  // window of recent cosines.
  const controller::TriggeredController& triggered() const { return core_->triggered(); }
  // Bytes held by the snapshot (0 before the first step).
  std::int64_t snapshot_bytes() const { return core_->snapshot_bytes(); }
  // Name of the CPU kernels in use ("avx512", "avx2", "baseline").
  const char* kernel_isa() const { return core_->kernel_isa(); }

 private:
  explicit Agent(std::unique_ptr<AgentCore> core);

  // Everything but reading at::Tensor objects is the core's (gac/agent/core.h).
  std::unique_ptr<AgentCore> core_;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_AGENT_H_
