// StepReport: what one GAC step measured and decided, as the agent returns it
// from Agent::Step. A plain value (standard library only, no LibTorch), so
// the transport can turn it into a telemetry record (gac/transport/
// step_record.h) and the Python package can expose it, without the agent.
//
// Thread safety: a value; not synchronised.
#ifndef GAC_CONTROLLER_STEP_REPORT_H_
#define GAC_CONTROLLER_STEP_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gac/controller/controller.h"
#include "gac/controller/policy_health.h"
#include "gac/controller/window.h"

namespace gac::controller {

// One layer's statistics for a step (the opt-in per-layer breakdown,
// AgentOptions::layers). A "layer" is any named set of parameters.
struct LayerStats {
  std::string name;
  double dot = 0.0;      // <g, p> over the layer
  double grad_sq = 0.0;  // |g|^2 (formerly `gg`)
  double ref_sq = 0.0;   // |p|^2 (formerly `pp`)
  // cos(g_layer, p_layer); absent without a reference, with a zero norm, or
  // with non-finite sums.
  std::optional<double> cosine() const;
};
// The former name of LayerStats.
using GroupStats [[deprecated("use gac::controller::LayerStats")]] = LayerStats;

// The rule an agent decided a step's regime with: its per-step thresholds
// and its trigger (window and window thresholds).
struct DecisionRule {
  Thresholds thresholds;
  TriggerSettings trigger;
};

// The fields are described once, for every view, in
// gac/controller/report_fields.h.
struct StepReport {
  std::int64_t step = 0;
  // The training loss the trainer gave with the step (with a reducer: the
  // ranks' mean), which the spike guard's z-score reads; absent when none.
  std::optional<double> loss;
  // The mode the agent ran this step in (Agent::Step sets it). In monitor
  // mode `decision` is what GAC would have done, never an applied decision.
  Mode mode = Mode::kLocal;
  // The controller's verdict: regime, cosine, alpha, norms. In monitor mode it
  // says what local mode would have done.
  Decision decision;
  // Call optimizer.step()? Always true in monitor mode.
  bool step_optimizer = true;
  // True when the gradients were projected in place.
  bool gradient_modified = false;
  std::int64_t elements = 0;         // local gradient elements read
  std::int32_t tensors = 0;          // tensors with a gradient this step
  std::int32_t strided_tensors = 0;  // tensors that took the strided path
  // Which passes read the gradients: "cpu" or "cuda" (gac's kernels), or
  // the front's own (gac/agent/front_passes.h): "torch" in Python.
  std::string passes;
  double stats_seconds = 0.0;        // statistics pass and all-reduce
  double decide_seconds = 0.0;       // remote decision (remote mode)
  double apply_seconds = 0.0;        // projection / snapshot pass (CUDA: enqueueing it)
  // Remote mode: the decision source failed (or another rank's did) and the
  // local decision was used; remote_error says why.
  bool fallback = false;
  std::string remote_error;
  std::vector<LayerStats> layers;    // per AgentOptions::layers entry, in order
  // The agent's rule when the agent decided (local and monitor mode, a
  // remote fallback); absent when the decision source decided.
  std::optional<DecisionRule> rule;
  // The policy-health signals the trainer gave with the step; absent when
  // it gave none.
  std::optional<PolicyHealth> policy;

  // The agent's own time for this step, seconds: stats + decide + apply.
  double agent_overhead_seconds() const { return stats_seconds + decide_seconds + apply_seconds; }
};

}  // namespace gac::controller

#endif  // GAC_CONTROLLER_STEP_REPORT_H_
