// AgentOptions: how an agent measures and acts, shared by the LibTorch agent
// (gac/agent/agent.h) and the torch-free core it is built on
// (gac/agent/core.h). No LibTorch.
#ifndef GAC_AGENT_OPTIONS_H_
#define GAC_AGENT_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gac/agent/front_passes.h"
#include "gac/agent/reducer.h"
#include "gac/controller/controller.h"
#include "gac/controller/decision_source.h"
#include "gac/controller/spike.h"
#include "gac/controller/window.h"

namespace gac::agent {

enum class SnapshotDtype : std::uint8_t { kFloat32 = 0, kBFloat16 = 1 };
// What the next step is compared with.
enum class ReferencePolicy : std::uint8_t {
  kRawGradient = 0,    // the previous raw gradient (the paper's c_t); default
  kAppliedUpdate = 1,  // the previous applied (projected) gradient; unchanged by a skip
};

// Which passes read and write the gradients (the report's `passes` says
// which ran: "cpu", "cuda" or the front's name, "torch" in Python).
enum class PassesChoice : std::uint8_t {
  // gac's kernels where it has them (the CPU; a CUDA GPU its kernels carry an
  // image for), checked against the front's passes on their first steps on
  // each GPU when the front gives them (AgentOptions::front_passes); the
  // front's passes on any other device.
  kAuto = 0,
  kKernels = 1,  // gac's kernels only: Unimplemented where there are none
  kFront = 2,    // the front's passes on every device, the CPU included
};

// (The deprecated member `groups` would make the compiler warn wherever the
// implicit constructors are used; only a use of `groups` itself should.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct AgentOptions {
  // Defined here, where the deprecation warning of `groups` is off (GCC would
  // warn wherever it generates them otherwise).
  AgentOptions() = default;
  ~AgentOptions() = default;
  AgentOptions(const AgentOptions&) = default;
  AgentOptions(AgentOptions&&) = default;
  AgentOptions& operator=(const AgentOptions&) = default;
  AgentOptions& operator=(AgentOptions&&) = default;

  controller::Thresholds thresholds;
  controller::AlphaMode alpha_mode = controller::AlphaMode::kPaper;
  controller::Mode mode = controller::Mode::kLocal;
  // What the regime is decided on: the step's |c_t| (per_step, the default:
  // `thresholds`) or the signed mean of the last `trigger.window` cosines
  // (window: `trigger.window_thresholds`). The window is kept in every mode,
  // so StepReport::decision.window_mean is reported with either trigger;
  // Reset() empties it. In remote mode the source's decision is used as it
  // comes; a fallback uses this trigger's local decision.
  controller::TriggerSettings trigger;
  // The spike guard, decided before GAC (gac/controller/spike.h; off unless
  // max_grad_norm or zscore is set): a step whose |g|, or loss given to
  // Step(), is far above the run's recent accepted steps is skipped with the
  // regime kSpike (monitor mode: reported only). In remote mode the source
  // decides, gacd with the run's own guard, and this one is the fallback's.
  // With a reducer and the z-score on, or in remote mode, the loss is
  // averaged across ranks (one more 2-scalar all-reduce per step), so every
  // rank decides alike.
  controller::SpikeSettings spike;
  SnapshotDtype snapshot_dtype = SnapshotDtype::kFloat32;
  PassesChoice passes = PassesChoice::kAuto;
  // The front's own passes (gac/agent/front_passes.h): the Python package's
  // torch operations. Null in the C++ fronts.
  FrontPassesFactory front_passes;
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
  // Parameters (indices into Step()'s list) this rank holds but leaves out of
  // its statistics, because another rank of the reducer's group holds the
  // same values and counts them (a DTensor replicated over a mesh dimension
  // the group spans, a tensor-parallel duplicate, a weight tied across
  // pipeline stages): every value is then counted once by one SUM. They are
  // still projected and snapshotted like the others.
  std::vector<int> uncounted;
  // The former name of `layers`: Agent::Create moves it into `layers` when
  // `layers` is empty (InvalidArgument when both are given).
  [[deprecated("use AgentOptions::layers")]] std::vector<LayerSpec> groups;
};
#pragma GCC diagnostic pop

}  // namespace gac::agent

#endif  // GAC_AGENT_OPTIONS_H_
