// gac._controller: the GAC decision from three scalars, the calibration
// helpers, the step report and the decision-source interface, over
// gac::controller, with the names of its enums and gacd's limit on a
// record's scalars (header-only constants of the wire library and the
// transport, which it does not link). Needs neither torch nor gRPC; the
// other modules import it for the types they share (Decision, StepReport,
// DecisionSource).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gac/controller/calibration.h"
#include "gac/controller/controller.h"
#include "gac/controller/decision_source.h"
#include "gac/controller/report_fields.h"
#include "gac/controller/step_report.h"
#include "gac/controller/window.h"
#include "gac/proto/wire_limits.h"
#include "gac/transport/scalar_budget.h"
#include "python/src/support.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace gac::python {
namespace {

// Lets a Python subclass of gac.DecisionSource decide for an agent in remote
// mode. The agent calls it with the GIL released, from its training thread;
// an exception or a wrong return type is an error, on which the agent falls
// back to its local decision.
class PyDecisionSource : public controller::DecisionSource {
 public:
  base::StatusOr<controller::Decision> Decide(std::int64_t step, const controller::AlignmentStats& stats) override {
    py::gil_scoped_acquire gil;
    try {
      py::function decide = py::get_override(static_cast<const controller::DecisionSource*>(this), "decide");
      if (!decide) return base::Status::Unimplemented("the DecisionSource subclass does not define decide()");
      py::object result = decide(step, stats);
      if (!py::isinstance<controller::Decision>(result)) {
        return base::Status::InvalidArgument("decide() returned " + std::string(py::str(py::type::of(result).attr("__name__"))) +
                                       ", not a gac.Decision");
      }
      return result.cast<controller::Decision>();
    } catch (py::error_already_set& e) {
      // The exception's type and message, without the traceback.
      return base::Status::Unavailable("decide() raised " + py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
                                 py::str(e.value()).cast<std::string>());
    }
  }
};

controller::Decision MakeDecision(const std::string& regime_name, std::optional<double> cosine, std::optional<double> cosine_after,
                      double alpha, double projection_coeff, double grad_norm, double ref_norm,
                      std::optional<double> window_mean) {
  base::StatusOr<controller::Regime> regime = controller::ParseRegime(regime_name.c_str());
  if (!regime.ok()) {
    RaiseInvalidArgument("regime must be 'safe', 'project', 'skip', 'invalid' or 'spike', got '" + regime_name + "'");
  }
  if (!(alpha >= 0.0 && alpha <= 1.0)) RaiseInvalidArgument("alpha must be in [0, 1], got " + std::to_string(alpha));
  if (!std::isfinite(projection_coeff)) RaiseInvalidArgument("projection_coeff must be finite");
  if (window_mean && !(std::fabs(*window_mean) <= 1.0)) {
    RaiseInvalidArgument("window_mean must be in [-1, 1] or None, got " + std::to_string(*window_mean));
  }
  if (*regime != controller::Regime::kProject && projection_coeff != 0.0) {
    RaiseInvalidArgument("projection_coeff must be 0 unless the regime is 'project'");
  }
  controller::Decision d;
  d.regime = *regime;
  d.cosine = cosine;
  d.cosine_after = cosine_after;
  d.alpha = alpha;
  d.projection_coeff = projection_coeff;
  d.grad_norm = grad_norm;
  d.ref_norm = ref_norm;
  d.window_mean = window_mean;
  d.apply_update = *regime == controller::Regime::kSafe || *regime == controller::Regime::kProject;
  return d;
}

py::dict DecisionDict(const controller::Decision& d) {
  return py::dict("regime"_a = controller::RegimeName(d.regime), "cosine"_a = d.cosine, "cosine_after"_a = d.cosine_after,
                  "alpha"_a = d.alpha, "projection_coeff"_a = d.projection_coeff, "grad_norm"_a = d.grad_norm,
                  "ref_norm"_a = d.ref_norm, "apply_update"_a = d.apply_update, "window_mean"_a = d.window_mean);
}

std::string OptionalText(const std::optional<double>& v) { return v ? py::repr(py::float_(*v)).cast<std::string>() : "None"; }

const char* ReportTypeName(controller::ReportType type) {
  switch (type) {
    case controller::ReportType::kInteger: return "int";
    case controller::ReportType::kReal: return "float";
    case controller::ReportType::kBool: return "bool";
    case controller::ReportType::kText: return "str";
    case controller::ReportType::kRegime: return "regime";
    case controller::ReportType::kMode: return "mode";
    case controller::ReportType::kTrigger: return "trigger";
  }
  return "unknown";
}

// A report field's value as Python gives it: None when absent, enums by name.
py::object ReportValueToPython(const controller::ReportField& f, const controller::ReportValue& v) {
  if (!v.present) return py::none();
  switch (f.type) {
    case controller::ReportType::kInteger: return py::int_(v.integer);
    case controller::ReportType::kReal: return py::float_(v.real);
    case controller::ReportType::kBool: return py::bool_(v.integer != 0);
    case controller::ReportType::kText: return py::str(v.text);
    default: return py::str(controller::ReportEnumName(f.type, v.integer));
  }
}

py::dict LayersDict(const controller::StepReport& r) {
  py::dict layers;
  for (const controller::LayerStats& l : r.layers) layers[py::str(l.name)] = l;
  return layers;
}

void BindDecision(py::module_& m) {
  py::class_<controller::Decision>(m, "Decision",
                       "What the controller decided for one step: the regime, the cosine c_t, the gain alpha on the\n"
                       "gradient's component along the previous one and the norms. Build one only in a\n"
                       "gac.DecisionSource subclass; the controller and the agent return them.")
      .def(py::init(&MakeDecision), "regime"_a, py::kw_only(), "cosine"_a = py::none(), "cosine_after"_a = py::none(),
           "alpha"_a = 1.0, "projection_coeff"_a = 0.0, "grad_norm"_a = 0.0, "ref_norm"_a = 0.0,
           "window_mean"_a = py::none(),
           "A decision; apply_update follows from the regime (False for 'skip', 'invalid' and 'spike').")
      .def_property_readonly("regime", [](const controller::Decision& d) { return controller::RegimeName(d.regime); },
                             "'safe', 'project', 'skip' or 'invalid'.")
      .def_property_readonly("cosine", [](const controller::Decision& d) { return d.cosine; },
                             "c_t = <g,p> / (|g| |p| + 1e-8); None without a reference or with non-finite sums.")
      .def_property_readonly("cosine_after", [](const controller::Decision& d) { return d.cosine_after; },
                             "The cosine of the applied update with p; None for skip, invalid and no reference.")
      .def_readonly("alpha", &controller::Decision::alpha, "Gain on the parallel component (1 = untouched).")
      .def_readonly("projection_coeff", &controller::Decision::projection_coeff,
                    "g' = g - projection_coeff * p; (1 - alpha) <g,p> / |p|^2 when projecting, else 0.")
      .def_readonly("grad_norm", &controller::Decision::grad_norm, "|g|.")
      .def_readonly("ref_norm", &controller::Decision::ref_norm, "|p|, the previous gradient's norm.")
      .def_readonly("apply_update", &controller::Decision::apply_update, "False for 'skip' and 'invalid': do not step the optimizer.")
      .def_property_readonly("window_mean", [](const controller::Decision& d) { return d.window_mean; },
                             "The signed mean of the last `window` cosines, this step's included; None until that\n"
                             "many are held. Reported with either trigger; trigger='window' decides on it.")
      .def("to_dict", &DecisionDict, "The fields as a dict.")
      .def("__repr__", [](const controller::Decision& d) {
        return "Decision(regime='" + std::string(controller::RegimeName(d.regime)) + "', cosine=" + OptionalText(d.cosine) +
               ", alpha=" + py::repr(py::float_(d.alpha)).cast<std::string>() + ")";
      });

  py::class_<controller::AlignmentStats>(m, "AlignmentStats",
                             "The three sums a decision is made from, over every trainable parameter (after the\n"
                             "all-reduce when gradients are sharded).")
      .def(py::init([](double dot, double grad_sq, double ref_sq, bool has_reference) {
             return controller::AlignmentStats{dot, grad_sq, ref_sq, has_reference};
           }),
           "dot"_a, "grad_sq"_a, "ref_sq"_a, "has_reference"_a = true)
      .def_readonly("dot", &controller::AlignmentStats::dot, "<g, p>.")
      .def_readonly("grad_sq", &controller::AlignmentStats::grad_sq, "|g|^2.")
      .def_readonly("ref_sq", &controller::AlignmentStats::ref_sq, "|p|^2.")
      .def_readonly("has_reference", &controller::AlignmentStats::has_reference, "False on the first step and after a reset.")
      .def("__repr__", [](const controller::AlignmentStats& s) {
        return "AlignmentStats(dot=" + py::repr(py::float_(s.dot)).cast<std::string>() +
               ", grad_sq=" + py::repr(py::float_(s.grad_sq)).cast<std::string>() +
               ", ref_sq=" + py::repr(py::float_(s.ref_sq)).cast<std::string>() +
               ", has_reference=" + (s.has_reference ? "True" : "False") + ")";
      });
}

void BindController(py::module_& m) {
  py::class_<controller::Controller>(m, "Controller",
                         "The GAC decision from three scalars, without torch: c = dot / (sqrt(grad_sq * ref_sq) + 1e-8);\n"
                         "|c| <= c_low: safe; c_low < |c| < c_high: project with gain alpha; |c| >= c_high: skip;\n"
                         "non-finite sums: invalid. alpha = c_low/|c| ('paper') or the gain that brings the cosine\n"
                         "to exactly c_low ('exact'). Immutable; safe to share between threads.")
      .def(py::init([](double c_low, double c_high, const std::string& alpha_mode) {
             return ValueOrRaise(controller::Controller::Create(controller::Thresholds{c_low, c_high}, AlphaModeFromName(alpha_mode)));
           }),
           "c_low"_a = controller::Thresholds{}.c_low, "c_high"_a = controller::Thresholds{}.c_high,
           "alpha_mode"_a = "paper",
           "Raises InvalidArgumentError (a ValueError) unless 0 < c_low < c_high <= 1.")
      .def(
          "decide",
          [](const controller::Controller& c, double dot, double grad_sq, double ref_sq, bool has_reference) {
            return c.Decide(controller::AlignmentStats{dot, grad_sq, ref_sq, has_reference});
          },
          "dot"_a, "grad_sq"_a, "ref_sq"_a, "has_reference"_a = true,
          "The decision for <g,p>, |g|^2 and |p|^2. has_reference=False (or ref_sq == 0) means there is no\n"
          "previous gradient: 'safe' with no cosine.")
      .def("alpha", &controller::Controller::Alpha, "cosine"_a, "alpha for a cosine in the projection band, per alpha_mode.")
      .def_property_readonly("c_low", [](const controller::Controller& c) { return c.thresholds().c_low; })
      .def_property_readonly("c_high", [](const controller::Controller& c) { return c.thresholds().c_high; })
      .def_property_readonly("alpha_mode", [](const controller::Controller& c) { return controller::AlphaModeName(c.mode()); })
      .def("__repr__", [](const controller::Controller& c) {
        return "Controller(c_low=" + py::repr(py::float_(c.thresholds().c_low)).cast<std::string>() +
               ", c_high=" + py::repr(py::float_(c.thresholds().c_high)).cast<std::string>() + ", alpha_mode='" +
               controller::AlphaModeName(c.mode()) + "')";
      });

  m.def("cosine_after_projection", &controller::CosineAfterProjection, "cosine"_a, "alpha"_a,
        "The cosine with p of g' = g - (1 - alpha) <g,p>/|p|^2 p, from the cosine of g and p and alpha.");
}

void BindCalibration(py::module_& m) {
  py::class_<controller::CalibrationStats>(m, "CalibrationStats",
                               "Statistics of |c_t| over a window of steps (non-finite values not counted).")
      .def_readonly("count", &controller::CalibrationStats::count, "Finite values in the window.")
      .def_readonly("q90", &controller::CalibrationStats::q90, "0.9 quantile of |c| (linear interpolation, numpy's default).")
      .def_readonly("max", &controller::CalibrationStats::max, "Largest |c|.")
      .def_readonly("mean", &controller::CalibrationStats::mean, "Mean |c|.")
      .def_readonly("frac_le_c_low", &controller::CalibrationStats::frac_le_c_low, "Fraction of values with |c| <= c_low.")
      .def("__repr__", [](const controller::CalibrationStats& s) {
        return "CalibrationStats(count=" + std::to_string(s.count) +
               ", q90=" + py::repr(py::float_(s.q90)).cast<std::string>() +
               ", max=" + py::repr(py::float_(s.max)).cast<std::string>() + ")";
      });

  m.def(
      "calibration_stats",
      [](const std::vector<std::optional<double>>& values, double c_low) {
        if (!std::isfinite(c_low)) RaiseInvalidArgument("c_low must be finite");
        std::vector<double> v;
        v.reserve(values.size());
        for (const std::optional<double>& x : values) v.push_back(x ? *x : NAN);
        return controller::ComputeCalibration(v, c_low);
      },
      "values"_a, "c_low"_a = controller::Thresholds{}.c_low,
      "Statistics of |c| for cosines of a synchronous run (None and non-finite values are skipped).");

  m.def(
      "suggest_thresholds",
      [](const controller::CalibrationStats& stats, int min_count) {
        if (min_count < 0) RaiseInvalidArgument("min_count must be >= 0, got " + std::to_string(min_count));
        const controller::Thresholds t = ValueOrRaise(controller::SuggestThresholds(stats, static_cast<std::size_t>(min_count)));
        return std::make_pair(t.c_low, t.c_high);
      },
      "stats"_a, "min_count"_a = 20,
      "(c_low, c_high) from on-policy statistics: c_low = q90 rounded up to 3 significant digits (at least\n"
      "1e-3), c_high = max(3 * max, 2 * c_low) capped at 1. FailedPreconditionError with fewer than\n"
      "min_count values.");

  py::class_<controller::CalibrationWindow>(m, "CalibrationWindow",
                                "The last `capacity` |c_t| of a run, after `skip_first` warm-up steps. Not\n"
                                "synchronised: one writer.")
      .def(py::init([](std::int64_t capacity, std::int64_t skip_first) {
             if (capacity < 1) RaiseInvalidArgument("capacity must be >= 1, got " + std::to_string(capacity));
             if (skip_first < 0) RaiseInvalidArgument("skip_first must be >= 0, got " + std::to_string(skip_first));
             return controller::CalibrationWindow(static_cast<std::size_t>(capacity), static_cast<std::size_t>(skip_first));
           }),
           "capacity"_a, "skip_first"_a = 0)
      .def(
          "add", [](controller::CalibrationWindow& w, std::optional<double> cosine) { w.Add(cosine ? *cosine : NAN); },
          "cosine"_a, "Adds one c_t (e.g. report.cosine); None and non-finite values are seen but not kept.")
      .def("stats", &controller::CalibrationWindow::Stats, "c_low"_a = controller::Thresholds{}.c_low,
           "Statistics of the values kept.")
      .def_property_readonly("seen", &controller::CalibrationWindow::seen, "Values added, warm-up and non-finite ones included.")
      .def_property_readonly("size", &controller::CalibrationWindow::size, "Values kept.");
}

void BindStepReport(py::module_& m) {
  py::class_<controller::LayerStats>(m, "LayerStats", "One layer's sums for a step (Agent(layers=...)).")
      .def_readonly("name", &controller::LayerStats::name)
      .def_readonly("dot", &controller::LayerStats::dot, "<g, p> over the layer.")
      .def_readonly("grad_sq", &controller::LayerStats::grad_sq, "|g|^2 over the layer.")
      .def_readonly("ref_sq", &controller::LayerStats::ref_sq, "|p|^2 over the layer.")
      .def_property_readonly("cosine", &controller::LayerStats::cosine,
                             "The layer's cosine; None without a reference, with a zero norm or non-finite sums.")
      .def_property_readonly("grad_norm", [](const controller::LayerStats& l) { return std::sqrt(l.grad_sq); })
      .def_property_readonly("ref_norm", [](const controller::LayerStats& l) { return std::sqrt(l.ref_sq); })
      .def("__repr__", [](const controller::LayerStats& l) {
        return "LayerStats(name='" + l.name + "', cosine=" + OptionalText(l.cosine()) + ")";
      });

  using R = controller::StepReport;
  py::class_<R> report(m, "StepReport",
                       "What one agent.step() measured and decided. Call optimizer.step() only when step_optimizer is\n"
                       "True; hand the report to Telemetry.send() to stream it to gacd.");
  report
      .def_property_readonly("decision", [](const R& r) { return r.decision; },
                             "The decision used (remote mode: gacd's, or the local one on a fallback).")
      .def_property_readonly("layers", [](const R& r) { return LayersDict(r); },
                             "Per layer (Agent(layers=...)), by name, in the order given.")
      .def("__repr__", [](const R& r) {
        return "StepReport(step=" + std::to_string(r.step) + ", regime='" +
               controller::RegimeName(r.decision.regime) + "', cosine=" + OptionalText(r.decision.cosine) +
               ", alpha=" + py::repr(py::float_(r.decision.alpha)).cast<std::string>() +
               ", step_optimizer=" + (r.step_optimizer ? "True" : "False") + ")";
      });
  // Every other property is a row of the report's field table
  // (gac/controller/report_fields.h), which REPORT_FIELDS describes to Python.
  py::list fields;
  // The docstrings live as long as the module (pybind11 keeps the pointer).
  static auto* docs = new std::vector<std::string>(controller::kReportFieldCount);
  for (std::size_t i = 0; i < controller::kReportFieldCount; ++i) {
    const controller::ReportField* field = &controller::kReportFields[i];
    fields.append(py::make_tuple(field->name, ReportTypeName(field->type), field->optional, field->unit, field->help));
    std::string& doc = (*docs)[i];
    doc = field->help;
    if (*field->unit != '\0') doc += std::string(" Unit: ") + field->unit + ".";
    report.def_property_readonly(
        field->name, [field](const R& r) { return ReportValueToPython(*field, field->get(r)); }, doc.c_str());
  }
  // (name, type, optional, unit, help), in order.
  m.attr("REPORT_FIELDS") = py::tuple(fields);
}

// True when `all` lists an enum's values in the order of their numbers, so
// that a value's number is its index (what report.to_dict() logs for it).
template <typename Enum, std::size_t N>
constexpr bool InNumberOrder(const Enum (&all)[N]) {
  for (std::size_t i = 0; i < N; ++i) {
    if (static_cast<std::size_t>(all[i]) != i) return false;
  }
  return true;
}
static_assert(InNumberOrder(controller::kAllRegimes) && InNumberOrder(controller::kAllModes) &&
              InNumberOrder(controller::kAllTriggers));

// The names of an enum's values, by number.
template <typename Enum, std::size_t N>
py::tuple EnumNames(const Enum (&all)[N], const char* (*name)(Enum)) {
  py::list names;
  for (Enum e : all) names.append(name(e));
  return py::tuple(names);
}

void BindEnumsAndLimits(py::module_& m) {
  m.attr("REGIMES") = EnumNames(controller::kAllRegimes, &controller::RegimeName);
  m.attr("MODES") = EnumNames(controller::kAllModes, &controller::ModeName);
  m.attr("TRIGGERS") = EnumNames(controller::kAllTriggers, &controller::TriggerName);
  // The scalars gacd takes with a step record (gac/proto/wire_limits.h),
  // and what gac's sender's own counters leave of them for the trainer's
  // (gac/transport/scalar_budget.h).
  m.attr("MAX_SCALARS") = proto::kMaxScalarsPerRecord;
  m.attr("MAX_TRAINER_SCALARS") = transport::kMaxTrainerScalars;
}

void BindDecisionSource(py::module_& m) {
  py::class_<controller::DecisionSource, PyDecisionSource, std::shared_ptr<controller::DecisionSource>>(
      m, "DecisionSource",
      "Where an agent in remote mode gets its decision: gac.RemoteController (gacd), or a subclass that\n"
      "defines decide(step, stats) -> gac.Decision. The agent calls it on its training thread; an exception or\n"
      "a wrong return value makes the agent use its local decision and count a fallback.")
      .def(py::init<>())
      .def(
          "decide",
          [](controller::DecisionSource& source, std::int64_t step, const controller::AlignmentStats& stats) {
            base::StatusOr<controller::Decision> d = [&] {
              py::gil_scoped_release release;
              return source.Decide(step, stats);
            }();
            return ValueOrRaise(std::move(d));
          },
          "step"_a, "stats"_a, "The decision for the step's (all-reduced) sums.");
}

}  // namespace
}  // namespace gac::python

PYBIND11_MODULE(_controller, m) {
  m.doc() = "The GAC decision, calibration, step reports and decision sources (no torch, no gRPC).";
  py::module_::import("gac._errors");
  gac::python::BindDecision(m);
  gac::python::BindController(m);
  gac::python::BindCalibration(m);
  gac::python::BindStepReport(m);
  gac::python::BindDecisionSource(m);
  gac::python::BindEnumsAndLimits(m);
}
