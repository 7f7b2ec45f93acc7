// gac._agent: the agent core (gac::agent::AgentCore) for PyTorch trainers,
// with no LibTorch: the module links neither libtorch nor libtorch_python,
// so one build serves every torch 2.x. The gradients are read through
// torch's Python API (data_ptr(), dtype, strides: python/src/tensor_reader.h)
// and the core reads and projects the very memory autograd wrote (no copy),
// on the trainer's current CUDA stream for CUDA tensors; the statistics of
// sharded gradients are all-reduced with torch.distributed (gac/_dist.py).
// A step runs with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gac/agent/core.h"
#include "gac/agent/front_passes.h"
#include "gac/agent/cuda_info.h"
#include "gac/controller/policy_health.h"
#include "python/src/parameter_list.h"
#include "python/src/support.h"
#include "python/src/tensor_reader.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace gac::python {
namespace {

using agent::AgentCore;
using agent::AgentOptions;
using agent::ReferencePolicy;
using agent::SnapshotDtype;

SnapshotDtype SnapshotDtypeFrom(const py::object& dtype) {
  // torch.float32 prints as "torch.float32"; plain names are accepted too.
  std::string name = py::str(dtype);
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  if (name == "float32" || name == "float") return SnapshotDtype::kFloat32;
  if (name == "bfloat16") return SnapshotDtype::kBFloat16;
  RaiseInvalidArgument("snapshot_dtype must be torch.float32 or torch.bfloat16, got " + std::string(py::str(dtype)));
}

const char* SnapshotDtypeName(SnapshotDtype d) { return d == SnapshotDtype::kFloat32 ? "float32" : "bfloat16"; }

const char* ReferenceName(ReferencePolicy r) {
  return r == ReferencePolicy::kRawGradient ? "raw_gradient" : "applied_update";
}

ReferencePolicy ReferenceFrom(const std::string& name) {
  if (name == "raw_gradient") return ReferencePolicy::kRawGradient;
  if (name == "applied_update") return ReferencePolicy::kAppliedUpdate;
  RaiseInvalidArgument("reference must be 'raw_gradient' or 'applied_update', got '" + name + "'");
}

// Sums the statistics over a torch.distributed group through
// gac._dist.AllReduce (torch.distributed.all_reduce of one small fp64
// tensor, on the GPU for NCCL), taking the GIL for the call.
class PythonReducer final : public agent::Reducer {
 public:
  explicit PythonReducer(py::object reducer) : reducer_(std::move(reducer)) {
    rank_ = reducer_.attr("rank").cast<int>();
    world_size_ = reducer_.attr("world_size").cast<int>();
  }
  ~PythonReducer() override {
    py::gil_scoped_acquire gil;
    reducer_ = py::object();
  }

  base::Status AllReduceSum(double* values, std::size_t n) override {
    py::gil_scoped_acquire gil;
    try {
      py::list in(n);
      for (std::size_t i = 0; i < n; ++i) in[i] = py::float_(values[i]);
      py::sequence out = reducer_(in);
      if (out.size() != n) return base::Status::Internal("the all-reduce returned " + std::to_string(out.size()) + " values");
      for (std::size_t i = 0; i < n; ++i) values[i] = out[i].cast<double>();
      return base::Status::Ok();
    } catch (py::error_already_set& e) {
      return base::Status::Unavailable(std::string("torch.distributed.all_reduce failed: ") + e.what());
    }
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

 private:
  py::object reducer_;
  int rank_ = 0;
  int world_size_ = 1;
};

// The reducer of a torch.distributed group: gac._dist.AllReduce(group).
std::shared_ptr<agent::Reducer> ReducerOf(const py::object& group) {
  return std::make_shared<PythonReducer>(py::module_::import("gac._dist").attr("AllReduce")(group));
}

const char* PassesName(agent::PassesChoice p) {
  switch (p) {
    case agent::PassesChoice::kKernels: return "kernels";
    case agent::PassesChoice::kFront: return "torch";
    default: return "auto";
  }
}

agent::PassesChoice PassesFrom(const std::string& name) {
  if (name == "auto") return agent::PassesChoice::kAuto;
  if (name == "kernels") return agent::PassesChoice::kKernels;
  if (name == "torch") return agent::PassesChoice::kFront;
  RaiseInvalidArgument("passes must be 'auto', 'kernels' or 'torch', got '" + name + "'");
}

// The torch-ops path (gac/_torch_ops.py) as the core's front passes. The
// core runs with the GIL released: each call takes it.
class TorchOpsPasses final : public agent::FrontPasses {
 public:
  explicit TorchOpsPasses(py::object impl)
      : impl_(std::move(impl)), snapshot_bytes_(impl_.attr("snapshot_bytes").cast<std::int64_t>()) {}
  ~TorchOpsPasses() override {
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }

  base::Status Statistics(const std::vector<char>& present, bool with_p, double* out) override {
    py::gil_scoped_acquire gil;
    try {
      const py::list values = impl_.attr("statistics")(py::bytes(present.data(), present.size()), with_p);
      for (std::size_t k = 0; k < values.size(); ++k) out[k] = values[k].cast<double>();
      return base::Status::Ok();
    } catch (py::error_already_set& e) {
      return base::Status::Internal(std::string("the torch-ops path's statistics failed: ") + e.what());
    }
  }
  base::Status Apply(bool project, float coeff, bool snapshot_projected) override {
    py::gil_scoped_acquire gil;
    try {
      impl_.attr("apply")(project, coeff, snapshot_projected);
      return base::Status::Ok();
    } catch (py::error_already_set& e) {
      return base::Status::Internal(std::string("the torch-ops path's apply pass failed: ") + e.what());
    }
  }
  std::int64_t snapshot_bytes() const override { return snapshot_bytes_; }
  const char* name() const override { return "torch"; }

 private:
  py::object impl_;
  const std::int64_t snapshot_bytes_;
};

// gac.Agent. Holds the options the C++ agent is made from; layers given as
// tensors are turned into indices of the parameter list on the
// first step after creation, reset() or a new process_group (the C++ agent
// takes indices), which re-creates the C++ agent when they changed, as
// set_thresholds() does (Replace).
class PyAgent {
 public:
  PyAgent(double c_low, double c_high, const std::string& mode, const std::string& alpha_mode,
          const py::object& snapshot_dtype, const std::string& reference, const py::object& layers,
          const py::object& groups, const py::object& process_group, const py::object& decision_source,
          int num_threads, std::int64_t chunk_elements, const std::string& trigger, int window,
          double window_c_low, double window_c_high, const py::object& max_grad_norm, const py::object& spike_sigma,
          const py::object& spike_window, const py::object& spike_warmup, const std::string& passes,
          const py::object& replicated_on) {
    options_.thresholds = controller::Thresholds{c_low, c_high};
    options_.alpha_mode = AlphaModeFromName(alpha_mode);
    options_.trigger.trigger = TriggerFromName(trigger);
    options_.trigger.window = window;
    options_.trigger.window_thresholds = controller::Thresholds{window_c_low, window_c_high};
    ThrowIfError(controller::ValidateWindow(window));
    const base::Status window_thresholds = controller::ValidateThresholds(options_.trigger.window_thresholds);
    if (!window_thresholds.ok()) {
      RaiseInvalidArgument("window_c_low, window_c_high: " + window_thresholds.message());
    }
    SetSpike(max_grad_norm, spike_sigma, spike_window, spike_warmup);
    options_.mode = ModeFromName(mode);
    options_.snapshot_dtype = SnapshotDtypeFrom(snapshot_dtype);
    options_.reference = ReferenceFrom(reference);
    options_.num_threads = num_threads;
    options_.chunk_elements = chunk_elements;
    options_.passes = PassesFrom(passes);
    options_.front_passes = [this](const agent::FrontPassesRequest& r) { return MakeTorchOps(r); };
    if (!decision_source.is_none()) {
      if (!py::isinstance<controller::DecisionSource>(decision_source)) {
        throw py::type_error("decision_source must be a gac.RemoteController or a gac.DecisionSource subclass, got a " +
                             py::str(py::type::of(decision_source).attr("__name__")).cast<std::string>());
      }
      // The Python object is kept too: a Python subclass lives as long as the agent.
      decision_source_ = decision_source;
      options_.decision_source = decision_source.cast<std::shared_ptr<controller::DecisionSource>>();
    }
    if (!process_group.is_none()) set_process_group(process_group);
    if (!replicated_on.is_none()) {
      if (!py::isinstance<py::dict>(replicated_on) && !PyCallable_Check(replicated_on.ptr())) {
        throw py::type_error("replicated_on must be a dict {parameter: group or None} or a function of a parameter, got a " +
                             py::str(py::type::of(replicated_on).attr("__name__")).cast<std::string>());
      }
      replicated_on_ = replicated_on;
    }
    if (!groups.is_none()) {
      WarnDeprecated("Agent(groups=...)");
      if (!layers.is_none()) RaiseInvalidArgument("give layers or its deprecated name groups, not both");
    }
    SetLayers(layers.is_none() ? groups : layers);
    agent_ = ValueOrRaise(AgentCore::Create(options_));
  }

  py::object Step(std::int64_t step, py::handle params, py::handle loss, py::handle policy) {
    const std::optional<double> step_loss = LossFrom(loss);
    std::optional<controller::PolicyHealth> health = PolicyFrom(policy);
    bool changed = false;
    const std::vector<py::object>& objects = params_.Convert(params, &changed);
    if (changed || !prepared_) {
      reader_.Prepare(objects);
      prepared_ = true;
    }
    if (!planned_) Configure(objects);
    return RunStep(step, nullptr, step_loss, std::move(health));
  }

  // Times the core's step alone, in C++ (the gradients read from Python
  // before the clock starts), on the parameters of the last step(): for
  // benchmarks that compare it with step() from Python in one process.
  std::pair<double, py::object> TimeCppStep(std::int64_t step) {
    if (!planned_) RaiseStatus(base::Status::FailedPrecondition("call step() once before _time_cpp_step()"));
    double seconds = 0.0;
    py::object report = RunStep(step, &seconds, std::nullopt);
    return {seconds, std::move(report)};
  }

  // Also empties the trigger's window.
  void Reset() {
    agent_->Reset();
    reader_.Release();
    params_.Clear();
    prepared_ = false;
    planned_ = false;
  }

  std::string mode() const { return controller::ModeName(agent_->options().mode); }
  void set_mode(const std::string& name) {
    const controller::Mode mode = ModeFromName(name);
    ThrowIfError(agent_->set_mode(mode));
    options_.mode = mode;
  }
  // The core has no setter for its thresholds: it is made again with them,
  // as a new agent would be (the next step has no reference, the trigger's
  // window and the spike guard's history are empty); the parameters, the
  // mode, the other options and the fallback count are kept.
  void SetThresholds(double c_low, double c_high) {
    AgentOptions options = agent_->options();
    options.thresholds = controller::Thresholds{c_low, c_high};
    Replace(std::move(options));
    options_.thresholds = agent_->options().thresholds;
  }
  // The next step plans again (Configure), and starts over when the summing
  // group changed.
  void set_process_group(const py::object& group) {
    options_.reducer = group.is_none() ? nullptr : ReducerOf(group);
    process_group_ = group;
    planned_ = false;
  }
  std::uint64_t fallbacks() const { return fallbacks_before_ + agent_->fallbacks(); }
  const AgentCore& agent() const { return *agent_; }
  const AgentOptions& options() const { return options_; }
  py::object decision_source() const { return decision_source_; }
  py::object process_group() const { return process_group_; }
  py::object replicated_on() const { return replicated_on_; }
  const char* passes() const { return PassesName(options_.passes); }

  py::object layer_names() const {
    if (layers_.empty()) return py::none();
    py::list names;
    for (const Layer& l : layers_) names.append(l.name);
    return std::move(names);
  }

 private:
  struct Layer {
    std::string name;
    std::vector<py::object> tensors;
  };

  // Checks `layers` ({name: iterable of tensors}): names non-empty, every
  // element a tensor, no tensor in two layers.
  void SetLayers(const py::object& layers) {
    if (layers.is_none()) return;
    if (!py::isinstance<py::dict>(layers)) {
      throw py::type_error("layers must be a dict {name: [parameters]}, got a " +
                           py::str(py::type::of(layers).attr("__name__")).cast<std::string>());
    }
    std::unordered_map<const void*, std::string> seen;
    for (auto item : layers.cast<py::dict>()) {
      if (!py::isinstance<py::str>(item.first)) throw py::type_error("layer names must be str");
      Layer g{item.first.cast<std::string>(), {}};
      if (g.name.empty()) RaiseInvalidArgument("layer names must not be empty");
      if (IsTensor(item.second.ptr())) {
        throw py::type_error("layer '" + g.name + "' is a single tensor; give a list of parameters");
      }
      for (py::handle t : py::iter(item.second)) {
        if (!IsTensor(t.ptr())) {
          throw py::type_error("layer '" + g.name + "' holds a " +
                               py::str(py::type::of(t).attr("__name__")).cast<std::string>() + ", expected tensors");
        }
        auto [it, fresh] = seen.emplace(t.ptr(), g.name);
        if (!fresh) RaiseInvalidArgument("a parameter is in layers '" + it->second + "' and '" + g.name + "'");
        g.tensors.push_back(py::reinterpret_borrow<py::object>(t));
      }
      layers_.push_back(std::move(g));
    }
  }

  // Before the first step after creation or reset(): the layers as indices of
  // `tensors`, and, for DTensor parameters or with replicated_on, how the
  // ranks' sums join (gac._dist.plan_reduction: the group, when no
  // process_group was given, and the parameters another rank counts).
  // Re-creates the core when any of them differs from what it has (it has no
  // plan yet, so nothing is lost but the fallback count, which is carried
  // over).
  void Configure(const std::vector<py::object>& tensors) {
    std::vector<AgentOptions::LayerSpec> resolved = ResolveLayers(tensors);
    std::shared_ptr<agent::Reducer> reducer = options_.reducer;
    std::vector<int> uncounted;
    py::object group = py::none();
    if (reader_.has_dtensor() || !replicated_on_.is_none()) {
      py::list list;
      for (const py::object& t : tensors) list.append(t);
      const py::object reduction =
          py::module_::import("gac._dist").attr("plan_reduction")(list, process_group_, replicated_on_);
      group = reduction.attr("group");
      uncounted = reduction.attr("uncounted").cast<std::vector<int>>();
    }
    if (process_group_.is_none()) {
      if (group.is_none()) {
        auto_group_ = py::none();
        auto_reducer_.reset();
      } else if (!group.is(auto_group_)) {
        auto_reducer_ = ReducerOf(group);
        auto_group_ = group;
      }
      reducer = auto_reducer_;
    }
    bool same = reducer == agent_->options().reducer && resolved.size() == agent_->options().layers.size() &&
                uncounted == agent_->options().uncounted;
    for (std::size_t g = 0; same && g < resolved.size(); ++g) {
      same = resolved[g].parameters == agent_->options().layers[g].parameters;
    }
    if (same) return;
    AgentOptions options = options_;
    options.mode = agent_->options().mode;
    options.layers = std::move(resolved);
    options.reducer = std::move(reducer);
    options.uncounted = std::move(uncounted);
    Replace(std::move(options));
  }

  // A new core from `options` in place of agent_ (which is left as it was
  // when they are refused), its fallbacks carried over.
  void Replace(AgentOptions options) {
    std::unique_ptr<AgentCore> fresh = ValueOrRaise(AgentCore::Create(std::move(options)));
    fallbacks_before_ += agent_->fallbacks();
    agent_ = std::move(fresh);
  }

  // The layers as indices of `tensors`.
  std::vector<AgentOptions::LayerSpec> ResolveLayers(const std::vector<py::object>& tensors) {
    std::unordered_map<const void*, int> index;
    for (std::size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].ptr(), static_cast<int>(i));
    std::vector<AgentOptions::LayerSpec> resolved;
    for (const Layer& g : layers_) {
      AgentOptions::LayerSpec pg{g.name, {}};
      for (std::size_t k = 0; k < g.tensors.size(); ++k) {
        auto it = index.find(g.tensors[k].ptr());
        if (it == index.end()) {
          RaiseInvalidArgument("layer '" + g.name + "': its parameter " + std::to_string(k) +
                               " is not among the parameters passed to step()");
        }
        pg.parameters.push_back(it->second);
      }
      resolved.push_back(std::move(pg));
    }
    return resolved;
  }

  // The core's front passes: the torch-ops path over the parameters of the
  // step that builds the plan.
  base::StatusOr<std::unique_ptr<agent::FrontPasses>> MakeTorchOps(const agent::FrontPassesRequest& r) {
    py::gil_scoped_acquire gil;
    try {
      py::list params;
      for (const py::object& t : params_.objects()) params.append(t);
      py::object impl = py::module_::import("gac._torch_ops")
                            .attr("TorchOpsPasses")(params, r.bf16_snapshot, r.group_of, r.num_groups);
      return std::unique_ptr<agent::FrontPasses>(new TorchOpsPasses(std::move(impl)));
    } catch (py::error_already_set& e) {
      return base::Status::Unavailable(std::string("the torch-ops path cannot start: ") + e.what());
    }
  }

  void SetSpike(const py::object& max_grad_norm, const py::object& sigma, const py::object& window,
                const py::object& warmup) {
    options_.spike = SpikeFromKeywords(max_grad_norm, sigma, window, warmup);
  }

  // A step's loss: None, a number or a one-element tensor (read with float()).
  static std::optional<double> LossFrom(py::handle loss) {
    if (loss.is_none()) return std::nullopt;
    try {
      return py::float_(py::reinterpret_borrow<py::object>(loss)).cast<double>();
    } catch (py::error_already_set&) {
      throw py::type_error("loss must be a number or a one-element tensor, got a " +
                           py::str(py::type::of(loss).attr("__name__")).cast<std::string>());
    }
  }

  // The policy-health signals given with a step: None, or a
  // gac.rl.PolicySignals (any object with its attributes: `tokens`, the
  // reals of kPolicyReals, `invalid`). An invalid one keeps no value.
  static std::optional<controller::PolicyHealth> PolicyFrom(py::handle policy) {
    if (policy.is_none()) return std::nullopt;
    const auto read = [&](const char* name) {
      if (!py::hasattr(policy, name)) {
        throw py::type_error(std::string("policy must be a gac.rl.PolicySignals (no attribute '") + name +
                             "' on a " + py::str(py::type::of(policy).attr("__name__")).cast<std::string>() + ")");
      }
      return policy.attr(name);
    };
    controller::PolicyHealth h;
    const py::object tokens = read("tokens");
    if (!py::isinstance<py::int_>(tokens) || tokens.cast<std::int64_t>() < 0) {
      RaiseInvalidArgument("policy.tokens must be an integer >= 0, got " + py::repr(tokens).cast<std::string>());
    }
    h.tokens = tokens.cast<std::int64_t>();
    h.invalid = !read("invalid").is_none();
    for (const controller::PolicyReal& signal : controller::kPolicyReals) {
      const py::object value = read(signal.name);
      if (value.is_none() || h.invalid) continue;
      double v = 0.0;
      try {
        v = py::float_(value).cast<double>();
      } catch (py::error_already_set&) {
        throw py::type_error(std::string("policy.") + signal.name + " must be a number or None, got a " +
                             py::str(py::type::of(value).attr("__name__")).cast<std::string>());
      }
      if (!std::isfinite(v)) RaiseInvalidArgument(std::string("policy.") + signal.name + " is not finite");
      h.*signal.member = v;
    }
    return h;
  }

  // A failed step: "call Reset()" is reset() here.
  [[noreturn]] static void RaiseStep(const base::Status& status) {
    if (!status.IsFailedPrecondition()) RaiseStatus(status);
    std::string message = status.message();
    for (std::size_t at = message.find("Reset()"); at != std::string::npos; at = message.find("Reset()", at)) {
      message.replace(at, 7, "agent.reset()");
    }
    RaiseStatus(base::Status(status.code(), message));
  }

  // Reads this step's gradients (GIL held), runs the core with the GIL
  // released, and times the core alone when `seconds` is given.
  py::object RunStep(std::int64_t step, double* seconds, std::optional<double> loss,
                     std::optional<controller::PolicyHealth> policy = std::nullopt) {
    reader_.Prefetch();
    base::StatusOr<controller::StepReport> report = [&] {
      py::gil_scoped_release release;
      const auto t0 = std::chrono::steady_clock::now();
      base::StatusOr<controller::StepReport> r = agent_->Step(step, reader_, loss);
      if (seconds != nullptr) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return r;
    }();
    reader_.Release();
    for (const std::string& warning : agent_->TakeWarnings()) {
      if (PyErr_WarnEx(PyExc_RuntimeWarning, warning.c_str(), 1) != 0) throw py::error_already_set();
    }
    if (!report.ok()) RaiseStep(report.status());
    planned_ = true;
    report->policy = std::move(policy);
    return py::cast(std::move(*report));
  }

  AgentOptions options_;  // as given; layers as indices live in agent_'s options
  std::vector<Layer> layers_;
  std::unique_ptr<AgentCore> agent_;
  ParameterList params_;
  TensorReader reader_;
  bool prepared_ = false;  // reader_ knows the parameters of params_
  bool planned_ = false;  // a step succeeded since creation or reset()
  std::uint64_t fallbacks_before_ = 0;  // of the cores Replace replaced
  py::object decision_source_ = py::none();
  py::object process_group_ = py::none();
  py::object replicated_on_ = py::none();  // gac._dist.plan_reduction's
  py::object auto_group_ = py::none();  // the DTensors' group when process_group_ is None
  std::shared_ptr<agent::Reducer> auto_reducer_;
};

// ", trigger='window', window=W, window_c_low=.., window_c_high=.." when not the default trigger.
std::string TriggerRepr(const controller::TriggerSettings& t) {
  if (t.trigger == controller::Trigger::kPerStep) return "";
  return ", trigger='" + std::string(controller::TriggerName(t.trigger)) + "', window=" + std::to_string(t.window) +
         ", window_c_low=" + py::repr(py::float_(t.window_thresholds.c_low)).cast<std::string>() +
         ", window_c_high=" + py::repr(py::float_(t.window_thresholds.c_high)).cast<std::string>();
}

// A setting of the spike guard's z-score, None with the z-score off.
template <typename T>
py::object SpikeZscoreSetting(const PyAgent& a, T value) {
  return a.options().spike.zscore ? py::cast(value) : py::none();
}

// gac.Agent's help (the class's and its constructor's).
constexpr const char* kAgentDoc =
    "Gradient Alignment Control in the training loop. Call step() once per optimizer step, after backward\n"
    "(and gradient accumulation and the data-parallel all-reduce), before clip_grad_norm_ and the optimizer:\n"
    "\n"
    "    report = agent.step(step, model.parameters())\n"
    "    if report.step_optimizer:\n"
    "        optimizer.step()\n"
    "\n"
    "step() reads every gradient once for c_t = cos(g_t, g_{t-1}) and, in local and remote modes, projects the\n"
    "gradients in place when c_low < |c_t| < c_high and tells the trainer to skip the update above c_high.\n"
    "Memory: one snapshot of the gradients (fp32, or bf16 on request), allocated at the first step.\n"
    "Used from one thread; the GIL is released while a step runs.";

constexpr const char* kAgentInitDoc =
    "c_low, c_high: thresholds of |c_t|, 0 < c_low < c_high <= 1 (else ValueError).\n"
    "mode: 'local' (decide and apply in-process), 'monitor' (measure only, never change the update) or\n"
    "'remote' (decision_source decides; on a miss the local decision is used and counted).\n"
    "alpha_mode: 'paper' (alpha = c_low/|c|) or 'exact' (the projected cosine is exactly c_low).\n"
    "snapshot_dtype: torch.float32 or torch.bfloat16, the previous gradient's storage.\n"
    "reference: 'raw_gradient' (the paper's c_t) or 'applied_update' (compare with the last update).\n"
    "layers: {name: [parameters]} for a per-layer breakdown in report.layers (one more read of them);\n"
    "groups: its former name (deprecated).\n"
    "process_group: a torch.distributed ProcessGroup over which sharded gradients' sums are all-reduced;\n"
    "every rank then reaches the same decision (DTensor parameters need none: their placements say it).\n"
    "replicated_on: for plain tensors, which ranks hold the same values ({param: group or None} or a\n"
    "function of a parameter; None: each rank holds its own part): of those in the summing group, the\n"
    "lowest counts them, so every value is counted once. decision_source: a gac.RemoteController or a\n"
    "gac.DecisionSource subclass (required for mode='remote'). num_threads: threads of the passes (0: the\n"
    "hardware's, at most 8). chunk_elements: elements per work item.\n"
    "trigger: 'per_step' (the regime of |c_t|, by c_low and c_high; the default) or 'window' (the regime\n"
    "of |m_t|, the signed mean of the last `window` cosines, by window_c_low and window_c_high; safe until\n"
    "`window` cosines are held). window: 1 to 1000; m_t is reported (report.window_mean) with either\n"
    "trigger. window_c_low, window_c_high: 0 < window_c_low < window_c_high <= 1 (else ValueError).\n"
    "The spike guard, decided before GAC, off unless asked for: a step is skipped with the regime 'spike'\n"
    "(it enters neither the snapshot nor GAC's window) when |g| > max_grad_norm (> 0), or, with any of\n"
    "spike_sigma (default 6, > 0), spike_window (default 128, 2 to 10000), spike_warmup (2 to spike_window;\n"
    "default spike_window // 2), when the z-score of |g|, or of the loss given to step(), against the last\n"
    "spike_window steps is above spike_sigma (after spike_warmup steps; a spike is held at the bound it broke,\n"
    "so a level that persists is followed after a run of skips).\n"
    "passes: 'auto' (gac's kernels on the CPU and on NVIDIA GPUs they carry an image for, checked against torch\n"
    "operations on their first steps on each GPU; torch operations on any other device: ROCm, XPU, MPS, older\n"
    "GPUs), 'kernels' (gac's kernels only) or 'torch' (torch operations on every device). report.passes says\n"
    "which ran.";

using AgentClass = py::class_<PyAgent>;

// gac.Agent(...): its keywords, with the C++ options' defaults.
void DefineAgentInit(AgentClass& cls) {
  const AgentOptions d;
  cls.def(py::init<double, double, const std::string&, const std::string&, const py::object&, const std::string&,
                   const py::object&, const py::object&, const py::object&, const py::object&, int, std::int64_t,
                   const std::string&, int, double, double, const py::object&, const py::object&, const py::object&,
                   const py::object&, const std::string&, const py::object&>(),
          "c_low"_a = d.thresholds.c_low, "c_high"_a = d.thresholds.c_high, py::kw_only(),
          "mode"_a = controller::ModeName(d.mode), "alpha_mode"_a = controller::AlphaModeName(d.alpha_mode),
          "snapshot_dtype"_a = SnapshotDtypeName(d.snapshot_dtype), "reference"_a = ReferenceName(d.reference),
          "layers"_a = py::none(), "groups"_a = py::none(), "process_group"_a = py::none(),
          "decision_source"_a = py::none(), "num_threads"_a = d.num_threads, "chunk_elements"_a = d.chunk_elements,
          "trigger"_a = controller::TriggerName(d.trigger.trigger), "window"_a = d.trigger.window,
          "window_c_low"_a = d.trigger.window_thresholds.c_low, "window_c_high"_a = d.trigger.window_thresholds.c_high,
          "max_grad_norm"_a = py::none(), "spike_sigma"_a = py::none(), "spike_window"_a = py::none(),
          "spike_warmup"_a = py::none(), "passes"_a = PassesName(d.passes), "replicated_on"_a = py::none(),
          kAgentInitDoc);
}

// step(), reset(), and what may change between steps: the mode, the thresholds, the process group.
void DefineAgentSteps(AgentClass& cls) {
  cls.def("step", &PyAgent::Step, "step"_a, "params"_a, "loss"_a = py::none(), "policy"_a = py::none(),
          "One GAC step over the gradients of `params` (model.parameters() or a list; the same tensors in the\n"
          "same order at every step; a list is converted once and reused). `step` must increase. Parameters\n"
          "without a gradient are left out. Gradients: float32, bfloat16 or float16, all on one device.\n"
          "loss: the step's training loss (a number or a one-element tensor), read by the spike guard's z-score.\n"
          "policy: the policy-health signals of the step's batch (gac.rl.signals' result), which the report and\n"
          "its record carry.\n"
          "Raises ValueError for bad gradients or a non-increasing step, FailedPreconditionError when the\n"
          "parameters changed (call reset()), UnavailableError when the all-reduce failed; on an error nothing\n"
          "is modified.")
      .def("reset", &PyAgent::Reset,
           "Forgets the parameters, the snapshot and the window of recent cosines: the next step has no\n"
           "reference and may use new parameters.")
      .def_property("mode", &PyAgent::mode, &PyAgent::set_mode,
                    "'local', 'monitor' or 'remote'; may be switched between steps ('remote' needs a decision_source).")
      .def("set_thresholds", &PyAgent::SetThresholds, "c_low"_a, "c_high"_a,
           "Replaces c_low and c_high (0 < c_low < c_high <= 1, else ValueError and nothing changes). The agent\n"
           "then starts over as a new one would: the next step has no reference, and the window of recent\n"
           "cosines and the spike guard's history are emptied; the parameters and other options are kept.")
      .def_property("process_group", &PyAgent::process_group, &PyAgent::set_process_group,
                    "The torch.distributed group the sums are all-reduced over (None: none). Set between steps,\n"
                    "the next step plans again, and starts over without a reference when the group changed.")
      .def_property_readonly("fallbacks", &PyAgent::fallbacks,
                             "Remote decisions replaced by the local one since creation.")
      .def("_time_cpp_step", &PyAgent::TimeCppStep, "step"_a,
           "Benchmarks only: (seconds, report) of Agent::Step timed in C++ on the parameters of the last step().")
      .def("__repr__", [](const PyAgent& a) {
        return "Agent(c_low=" + py::repr(py::float_(a.options().thresholds.c_low)).cast<std::string>() +
               ", c_high=" + py::repr(py::float_(a.options().thresholds.c_high)).cast<std::string>() + ", mode='" +
               a.mode() + "', alpha_mode='" + controller::AlphaModeName(a.options().alpha_mode) + "'" +
               TriggerRepr(a.options().trigger) + ")";
      });
}

// The options the agent was made with, read back (each keyword but groups, a
// former name: layers as layer_names), and what its core holds.
void DefineAgentOptions(AgentClass& cls) {
  cls.def_property_readonly("c_low", [](const PyAgent& a) { return a.options().thresholds.c_low; })
      .def_property_readonly("c_high", [](const PyAgent& a) { return a.options().thresholds.c_high; })
      .def_property_readonly("alpha_mode", [](const PyAgent& a) { return controller::AlphaModeName(a.options().alpha_mode); })
      .def_property_readonly("trigger", [](const PyAgent& a) { return controller::TriggerName(a.options().trigger.trigger); },
                             "'per_step' or 'window'.")
      .def_property_readonly("window", [](const PyAgent& a) { return a.options().trigger.window; })
      .def_property_readonly("window_c_low", [](const PyAgent& a) { return a.options().trigger.window_thresholds.c_low; })
      .def_property_readonly("window_c_high",
                             [](const PyAgent& a) { return a.options().trigger.window_thresholds.c_high; })
      .def_property_readonly("window_held", [](const PyAgent& a) { return a.agent().triggered().window().held(); },
                             "Cosines in the window now (at most `window`; 0 after creation and reset()).")
      .def_property_readonly("max_grad_norm", [](const PyAgent& a) { return a.options().spike.max_grad_norm; },
                             "The spike guard's bound on |g| (0: none).")
      .def_property_readonly("spike_sigma", [](const PyAgent& a) { return SpikeZscoreSetting(a, a.options().spike.sigma); },
                             "The spike guard's z-score bound; None with its z-score off.")
      .def_property_readonly("spike_window", [](const PyAgent& a) { return SpikeZscoreSetting(a, a.options().spike.window); })
      .def_property_readonly("spike_warmup",
                             [](const PyAgent& a) { return SpikeZscoreSetting(a, a.options().spike.effective_warmup()); })
      .def_property_readonly("snapshot_dtype", [](const PyAgent& a) { return SnapshotDtypeName(a.options().snapshot_dtype); })
      .def_property_readonly("reference", [](const PyAgent& a) { return ReferenceName(a.options().reference); },
                             "'raw_gradient' (the paper's p) or 'applied_update'.")
      .def_property_readonly("chunk_elements", [](const PyAgent& a) { return a.options().chunk_elements; })
      .def_property_readonly("passes", &PyAgent::passes, "'auto', 'kernels' or 'torch' (as given).")
      .def_property_readonly("layer_names", &PyAgent::layer_names,
                             "The names of the layers given (layers=...), in their order; None without layers.")
      .def_property_readonly("decision_source", &PyAgent::decision_source)
      .def_property_readonly("replicated_on", &PyAgent::replicated_on)
      .def_property_readonly("snapshot_bytes", [](const PyAgent& a) { return a.agent().snapshot_bytes(); },
                             "Bytes held by the snapshot (0 before the first step).")
      .def_property_readonly("num_threads", [](const PyAgent& a) { return a.agent().options().num_threads; })
      .def_property_readonly("kernel_isa", [](const PyAgent& a) { return std::string(a.agent().kernel_isa()); },
                             "The CPU kernels in use: 'avx512', 'avx2' or 'baseline'.");
}

void BindAgent(py::module_& m) {
  AgentClass cls(m, "Agent", kAgentDoc);
  DefineAgentInit(cls);
  DefineAgentSteps(cls);
  DefineAgentOptions(cls);
}

// "12.9" for 12090 (CUDA's version numbers); None for 0.
py::object CudaVersion(int version) {
  if (version <= 0) return py::none();
  return py::str(std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10));
}

// What this module was built with: the CUDA runtime and kernel images it
// carries (gac/agent/cuda_info.h), and the C++ compiler and C library it
// was compiled with.
py::dict BuildInfo() {
  const agent::CudaBuildInfo cuda = agent::GetCudaBuildInfo();
#if defined(__clang__)
  const std::string compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  const std::string compiler = "GCC " __VERSION__;
#else
  const std::string compiler = "unknown";
#endif
  py::object glibc = py::none();
#ifdef __GLIBC__
  glibc = py::str(std::to_string(__GLIBC__) + "." + std::to_string(__GLIBC_MINOR__));
#endif
  return py::dict("cuda_runtime"_a = CudaVersion(cuda.runtime_version),
                  "cuda_runtime_static"_a = cuda.kernels ? py::object(py::bool_(cuda.static_runtime)) : py::none(),
                  "cuda_archs"_a = cuda.archs,
                  "cuda_compiler"_a = cuda.kernels ? py::object(py::str(cuda.compiler)) : py::none(),
                  "compiler"_a = compiler, "glibc_built_against"_a = glibc);
}

py::dict CudaDevices() {
  const agent::CudaEnvironment env = [] {
    py::gil_scoped_release release;
    return agent::QueryCudaEnvironment();
  }();
  py::list devices;
  for (const agent::CudaDeviceInfo& d : env.devices) {
    devices.append(py::dict("index"_a = d.index, "name"_a = d.name,
                            "compute_capability"_a = std::to_string(d.major) + "." + std::to_string(d.minor),
                            "kernels"_a = d.image.empty() ? py::object(py::none()) : py::object(py::str(d.image))));
  }
  return py::dict("driver"_a = CudaVersion(env.driver_version),
                  "error"_a = env.error.empty() ? py::object(py::none()) : py::object(py::str(env.error)),
                  "devices"_a = devices);
}

}  // namespace
}  // namespace gac::python

PYBIND11_MODULE(_agent, m) {
  m.doc() = "The in-process GAC agent, over torch's Python API (no LibTorch).";
  py::module_::import("gac._controller");
  gac::python::BindAgent(m);
  m.def("build_info", &gac::python::BuildInfo,
        "What this build carries: {'cuda_runtime': '12.9' or None (no CUDA kernels), 'cuda_runtime_static',\n"
        "'cuda_archs': ['sm_80', ..., 'compute_120'] (cubins, PTX), 'cuda_compiler': 'NVRTC 12.9' or None,\n"
        "'compiler': the C++ compiler, 'glibc_built_against': '2.36' or None}.");
  m.def("cuda_devices", &gac::python::CudaDevices,
        "The CUDA driver and GPUs this process sees, asked of the CUDA runtime gac carries (no context is\n"
        "created): {'driver': '12.8' or None, 'error': why no GPU was listed or None, 'devices': [{'index',\n"
        "'name', 'compute_capability': '9.0', 'kernels': the image of gac's kernels that runs on it ('sm_90',\n"
        "'compute_120' compiled by the driver) or None}]}. Never raises for a missing driver or GPU.");
}
