// AgentCore: the agent's step over gradients described as raw buffer views
// (pointer, element type, sizes, strides, device), with no LibTorch. The
// LibTorch agent (gac/agent/agent.h) and the Python package's agent
// (python/src/agent_module.cc, which reads torch.Tensor objects through
// Python's C API) are thin fronts over it: each describes its tensors through
// a GradientSource, and the core does the rest (the plan, the snapshot, the
// CPU and CUDA passes, the reduction, the decision).
//
// Thread-safety: an AgentCore is used by one training thread at a time.
#ifndef GAC_AGENT_CORE_H_
#define GAC_AGENT_CORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gac/agent/options.h"
#include "gac/base/status.h"
#include "gac/controller/controller.h"
#include "gac/controller/step_report.h"
#include "gac/controller/window.h"

namespace gac::agent {

class ThreadPool;
struct Plan;

// `name` kept for the life of the process (one copy per distinct name), for
// the names a view carries (DeviceId::other_name, TensorView::dtype_name).
// Thread-safe.
const char* PersistentName(const std::string& name);

// The gradient element types the passes read; anything else is kOther.
enum class DType : std::uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kOther = 255 };

struct DeviceId {
  enum class Kind : std::uint8_t { kCpu = 0, kCuda = 1, kOther = 2 };
  Kind kind = Kind::kCpu;
  int index = -1;  // the CUDA device's ordinal
  bool operator==(const DeviceId& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const DeviceId& o) const { return !(*this == o); }
  // "cpu", "cuda:1", or the name the front gave for another kind.
  std::string str() const;
  const char* other_name = "other";  // kOther: the device type's name, for messages
};

// One tensor's memory. The pointers (data, sizes, strides, dtype_name) must
// stay valid for the call they are passed to.
struct TensorView {
  void* data = nullptr;  // the first element; may be null when numel is 0
  const std::int64_t* sizes = nullptr;
  const std::int64_t* strides = nullptr;  // in elements
  int ndim = 0;
  std::int64_t numel = 0;
  DType dtype = DType::kF32;
  const char* dtype_name = "float32";  // for messages about kOther
  DeviceId device;
  bool contiguous = false;               // row-major contiguous
  bool non_overlapping_and_dense = false;  // every element once, no gaps (any order)
};

// True when `sizes`/`strides` describe every element exactly once with no
// gaps (a permutation of a contiguous layout).
bool NonOverlappingAndDense(const std::int64_t* sizes, const std::int64_t* strides, int ndim);
bool IsContiguous(const std::int64_t* sizes, const std::int64_t* strides, int ndim);

// What a front tells the core of its parameters and their gradients.
class GradientSource {
 public:
  virtual ~GradientSource() = default;
  // Number of parameters.
  virtual std::size_t size() const = 0;
  // Parameter i when a plan is built: an identity that stays the same object
  // for as long as the plan lives (a TensorImpl, a Python object), the
  // parameter itself (data not read), and its gradient (data null: none).
  virtual base::Status Describe(std::size_t i, const void** id, TensorView* param, TensorView* grad) = 0;
  // Each step, in blocks: the identities and gradients of parameters
  // [begin, end) (grads[k].data null and numel set: no gradient this step,
  // marked by absent[k]). An error stops the step before anything is written.
  virtual base::Status Gather(std::size_t begin, std::size_t end, const void** ids, TensorView* grads,
                              bool* absent) = 0;
  // The CUDA stream the device passes run on for gradients on CUDA device
  // `index` (the trainer's current stream); null is the default stream.
  virtual void* Stream(int index) { return nullptr; }
};

class AgentCore {
 public:
  // Validates the options (thresholds, trigger, chunk size, layers);
  // InvalidArgument on error.
  static base::StatusOr<std::unique_ptr<AgentCore>> Create(AgentOptions options);
  ~AgentCore();
  AgentCore(const AgentCore&) = delete;
  AgentCore& operator=(const AgentCore&) = delete;

  // One GAC step over the gradients `source` describes (see gac/agent/agent.h
  // for the contract and the errors; the parameter list is the source's).
  // `loss`, when given, is what the spike guard's loss z-score reads.
  base::StatusOr<controller::StepReport> Step(std::int64_t step, GradientSource& source,
                                              std::optional<double> loss = std::nullopt);

  // Forgets the parameter set, the snapshot and the trigger's window.
  void Reset();
  base::Status set_mode(controller::Mode mode);
  std::uint64_t fallbacks() const { return fallbacks_; }
  const AgentOptions& options() const { return options_; }
  // The per-step rule (options().thresholds).
  const controller::Controller& controller() const { return triggered_.per_step(); }
  // The rule the local decision comes from, with its window.
  const controller::TriggeredController& triggered() const { return triggered_; }
  std::int64_t snapshot_bytes() const;
  const char* kernel_isa() const;
  // Warnings for the trainer since the last call (e.g. gac's GPU kernels set
  // aside after disagreeing with the front's passes on their first steps);
  // the Python front turns each into a Python warning.
  std::vector<std::string> TakeWarnings() { return std::exchange(warnings_, {}); }

 private:
  AgentCore(AgentOptions options, controller::TriggeredController triggered);

  base::Status PreparePlan(std::int64_t step, GradientSource& source);
  base::Status ComputeStatistics(GradientSource& source, controller::StepReport* report);
  base::Status DecideRemotely(std::int64_t step, const controller::AlignmentStats& stats,
                              controller::StepReport* report);
  base::Status ApplyDecision(controller::StepReport* report);
  // The loss the spike guard judges: with a reducer and the z-score on (or
  // in remote mode, where gacd's guard may read it), the mean over the
  // ranks that gave one (every rank calls the all-reduce).
  base::StatusOr<std::optional<double>> GuardLoss(std::optional<double> loss);

  AgentOptions options_;
  controller::TriggeredController triggered_;
  // triggered_ before this step's Decide: restored when the step fails
  // after it, so a failed step leaves the window as it was.
  std::optional<controller::TriggeredController> before_step_;
  controller::SpikeGuard guard_;
  std::optional<controller::SpikeGuard> guard_before_step_;  // as before_step_
  std::unique_ptr<Plan> plan_;
  std::unique_ptr<ThreadPool> pool_;
  std::uint64_t fallbacks_ = 0;
  void* stream_ = nullptr;  // the step's CUDA stream (device plans)
  std::vector<std::string> warnings_;
};

}  // namespace gac::agent

#endif  // GAC_AGENT_CORE_H_
