#include "gac/cli/backtest.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <regex>

#include "gac/base/file_util.h"
#include "gac/cli/format.h"
#include "gac/controller/calibration.h"
#include "gac/controller/window.h"

namespace gac::cli {
namespace {

// The fields of one CSV line (RFC 4180 quoting; the trainer writes none).
std::vector<std::string> SplitCsvLine(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (ch == '"') {
        quoted = false;
      } else {
        fields.back() += ch;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      fields.emplace_back();
    } else {
      fields.back() += ch;
    }
  }
  return fields;
}

std::string Where(const std::string& path, std::size_t line) { return path + ":" + std::to_string(line); }

// A number, or absent for an empty cell; InvalidArgument for anything else.
base::StatusOr<std::optional<double>> ParseCell(const std::string& text, const std::string& column,
                                                const std::string& where) {
  if (text.empty()) return std::optional<double>();
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || errno == ERANGE) {
    return base::Status::InvalidArgument(where + ": column " + column + ": '" + text + "' is not a number");
  }
  return std::optional<double>(v);
}

std::optional<std::size_t> ColumnIndex(const std::vector<std::string>& header, const std::string& name) {
  const auto it = std::find(header.begin(), header.end(), name);
  if (it == header.end()) return std::nullopt;
  return static_cast<std::size_t>(it - header.begin());
}

std::string BaseName(const std::string& path) {
  const auto slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, ".csv") == 0) name.resize(name.size() - 4);
  return name;
}

// The policy-health columns read, and where a run keeps them.
struct PolicyColumn {
  const char* name;
  std::vector<std::optional<double>> RecordedRun::*values;
};
constexpr PolicyColumn kPolicyColumns[] = {
    {"ess_token", &RecordedRun::ess_token},
    {"clip_fraction_low", &RecordedRun::clip_fraction_low},
    {"clip_fraction_high", &RecordedRun::clip_fraction_high},
    {"kl_k3", &RecordedRun::kl_k3},
};
constexpr std::size_t kPolicyColumnCount = sizeof(kPolicyColumns) / sizeof(kPolicyColumns[0]);

// The columns of a run CSV: their indices in its header.
struct CsvColumns {
  std::size_t fields = 0;  // in the header, and so in every row
  std::size_t step = 0, acc = 0;
  std::optional<std::size_t> cosine, regime, norm, loss, injected;
  std::array<std::optional<std::size_t>, kPolicyColumnCount> policy;  // by kPolicyColumns
};

// The next line of `text` from *start, without its "\n" or "\r\n"; false
// after the last.
bool NextLine(const std::string& text, std::size_t* start, std::string* line) {
  if (*start >= text.size()) return false;
  std::size_t end = text.find('\n', *start);
  if (end == std::string::npos) end = text.size();
  *line = text.substr(*start, end - *start);
  *start = end + 1;
  if (!line->empty() && line->back() == '\r') line->pop_back();
  return true;
}

// InvalidArgument when a column every backtest needs (step, heldout_acc)
// is missing; the alerts' need of cosine is checked by their caller (the
// spike guard reads grad_norm and loss instead).
base::StatusOr<CsvColumns> ReadHeader(const std::vector<std::string>& header, const std::string& where) {
  const std::optional<std::size_t> step = ColumnIndex(header, "step");
  const std::optional<std::size_t> acc = ColumnIndex(header, "heldout_acc");
  for (const auto& [col, name] : {std::pair{step, "step"}, {acc, "heldout_acc"}}) {
    if (!col) return base::Status::InvalidArgument(where + ": no column '" + name + "' in the header");
  }
  CsvColumns c;
  c.fields = header.size();
  c.step = *step;
  c.cosine = ColumnIndex(header, "cosine");
  c.acc = *acc;
  c.regime = ColumnIndex(header, "regime");
  c.norm = ColumnIndex(header, "grad_norm");
  c.loss = ColumnIndex(header, "loss");
  c.injected = ColumnIndex(header, "injected");
  for (std::size_t i = 0; i < kPolicyColumnCount; ++i) c.policy[i] = ColumnIndex(header, kPolicyColumns[i].name);
  return c;
}

// A step number that follows the last of `steps`.
base::StatusOr<std::int64_t> ParseStep(const std::string& cell, const std::string& where,
                                       const std::vector<std::int64_t>& steps) {
  GAC_ASSIGN_OR_RETURN(std::optional<double> step, ParseCell(cell, "step", where));
  if (!step || *step != std::floor(*step) || std::fabs(*step) > 1e15) {
    return base::Status::InvalidArgument(where + ": column step: '" + cell + "' is not a step number");
  }
  const auto s = static_cast<std::int64_t>(*step);
  if (!steps.empty() && s <= steps.back()) {
    return base::Status::InvalidArgument(where + ": step " + std::to_string(s) + " does not follow step " +
                                         std::to_string(steps.back()));
  }
  return s;
}

// A policy-health cell: absent without the column, for an empty cell or a
// value that is not finite; InvalidArgument for what is not a number.
base::StatusOr<std::optional<double>> ParsePolicyCell(const std::vector<std::string>& fields,
                                                      std::optional<std::size_t> col, const char* name,
                                                      const std::string& where) {
  if (!col) return std::optional<double>();
  GAC_ASSIGN_OR_RETURN(std::optional<double> v, ParseCell(fields[*col], name, where));
  if (v && !std::isfinite(*v)) v.reset();
  return v;
}

base::StatusOr<bool> ParseInjected(const std::string& cell, const std::string& where) {
  if (cell != "0" && cell != "1") {
    return base::Status::InvalidArgument(where + ": column injected: '" + cell + "' is not 0 or 1");
  }
  return cell == "1";
}

// Appends the step of a row to `run`.
base::Status ParseRow(const std::vector<std::string>& fields, const CsvColumns& cols, const std::string& where,
                      RecordedRun* run) {
  if (fields.size() != cols.fields) {
    return base::Status::InvalidArgument(where + ": " + std::to_string(fields.size()) + " fields, the header has " +
                                         std::to_string(cols.fields));
  }
  GAC_ASSIGN_OR_RETURN(const std::int64_t s, ParseStep(fields[cols.step], where, run->steps));
  const bool invalid = cols.regime && fields[*cols.regime] == "invalid";
  std::optional<double> cosine;
  if (cols.cosine) {
    GAC_ASSIGN_OR_RETURN(cosine, ParseCell(fields[*cols.cosine], "cosine", where));
    if ((cosine && !std::isfinite(*cosine)) || invalid) cosine.reset();
  }
  GAC_ASSIGN_OR_RETURN(std::optional<double> acc, ParseCell(fields[cols.acc], "heldout_acc", where));
  if (acc && !std::isfinite(*acc)) {
    return base::Status::InvalidArgument(where + ": column heldout_acc: '" + fields[cols.acc] + "' is not finite");
  }
  std::optional<double> norm, loss;
  if (cols.norm) {
    GAC_ASSIGN_OR_RETURN(norm, ParseCell(fields[*cols.norm], "grad_norm", where));
    if ((norm && !std::isfinite(*norm)) || invalid) norm.reset();
  }
  if (cols.loss) {
    GAC_ASSIGN_OR_RETURN(loss, ParseCell(fields[*cols.loss], "loss", where));
  }
  bool injected = false;
  if (cols.injected) {
    GAC_ASSIGN_OR_RETURN(injected, ParseInjected(fields[*cols.injected], where));
  }
  std::array<std::optional<double>, kPolicyColumnCount> policy;
  for (std::size_t i = 0; i < kPolicyColumnCount; ++i) {
    GAC_ASSIGN_OR_RETURN(policy[i], ParsePolicyCell(fields, cols.policy[i], kPolicyColumns[i].name, where));
  }
  run->steps.push_back(s);
  run->cosines.push_back(cosine);
  run->grad_norms.push_back(norm);
  run->losses.push_back(loss);
  run->injected.push_back(injected);
  for (std::size_t i = 0; i < kPolicyColumnCount; ++i) (run->*kPolicyColumns[i].values).push_back(policy[i]);
  if (acc) run->evaluations.push_back({s, *acc});
  return base::Status::Ok();
}

}  // namespace

base::StatusOr<RecordedRun> ParseRunCsv(const std::string& text, const std::string& path) {
  RecordedRun run;
  run.path = path;
  run.name = BaseName(path);
  std::optional<CsvColumns> columns;  // set by the header, the first line that is not empty
  std::size_t line_no = 0, start = 0;
  std::string line;
  while (NextLine(text, &start, &line)) {
    ++line_no;
    if (line.empty()) continue;
    const std::vector<std::string> fields = SplitCsvLine(line);
    if (!columns) {
      GAC_ASSIGN_OR_RETURN(columns, ReadHeader(fields, Where(path, line_no)));
      run.has_cosine = columns->cosine.has_value();
      run.has_grad_norm = columns->norm.has_value();
      run.has_loss = columns->loss.has_value();
      run.has_injected = columns->injected.has_value();
      continue;
    }
    GAC_RETURN_IF_ERROR(ParseRow(fields, *columns, Where(path, line_no), &run));
  }
  if (!columns) return base::Status::InvalidArgument(path + ": empty (no header)");
  if (run.steps.empty()) return base::Status::InvalidArgument(path + ": no steps after the header");
  return run;
}

RunLog ParseRunLog(const std::string& text) {
  RunLog log;
  log.finished = text.find("summary:") != std::string::npos;
  static const std::regex kStart(R"((?:supervised warm-up: .*|start:) held-out accuracy ([0-9.]+))");
  std::smatch m;
  if (std::regex_search(text, m, kStart)) log.start_accuracy = std::strtod(m[1].str().c_str(), nullptr);
  return log;
}

base::StatusOr<RecordedRun> ReadRun(const std::string& csv_path) {
  GAC_ASSIGN_OR_RETURN(std::string text, base::ReadFileToString(csv_path, "run CSV"));
  GAC_ASSIGN_OR_RETURN(RecordedRun run, ParseRunCsv(text, csv_path));
  std::string log_path = csv_path;
  if (log_path.size() > 4 && log_path.compare(log_path.size() - 4, 4, ".csv") == 0) log_path.resize(log_path.size() - 4);
  log_path += ".log";
  base::StatusOr<std::string> log_text = base::ReadFileToString(log_path, "run log");
  if (log_text.ok()) {
    const RunLog log = ParseRunLog(*log_text);
    run.has_log = true;
    run.finished = log.finished;
    run.start_accuracy = log.start_accuracy;
  } else if (!log_text.status().IsNotFound()) {
    return log_text.status();
  }
  return run;
}

GuardReplay ReplayGuard(const RecordedRun& run, const controller::SpikeSettings& s) {
  GuardReplay out;
  controller::SpikeGuard guard(s);
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    if (!run.grad_norms[i]) continue;
    ++out.judged;
    const bool spike = guard.Step(*run.grad_norms[i], run.losses[i]).spike;
    if (spike) out.spikes.push_back(run.steps[i]);
    if (run.injected[i]) {
      ++out.injected;
      out.caught += spike;
    }
  }
  return out;
}

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kCollapsed: return "collapsed";
    case Outcome::kNeverLearned: return "never learned";
    case Outcome::kLearned: return "learned";
  }
  return "learned";
}

RunOutcome ClassifyOutcome(std::optional<double> start_accuracy, const std::vector<Evaluation>& evaluations) {
  RunOutcome out;
  if (evaluations.empty()) {
    out.outcome = Outcome::kNeverLearned;
    return out;
  }
  const double e0 = start_accuracy.value_or(evaluations.front().accuracy);
  double peak = e0;
  for (std::size_t i = 0; i < evaluations.size(); ++i) {
    peak = std::max(peak, evaluations[i].accuracy);
    const double bar = kCollapseFraction * peak;
    bool for_good = true;
    for (std::size_t j = i; j < evaluations.size() && for_good; ++j) for_good = evaluations[j].accuracy < bar;
    if (for_good) {
      out.outcome = Outcome::kCollapsed;
      out.collapse_step = evaluations[i].step;
      return out;
    }
  }
  double best = evaluations.front().accuracy;
  for (const Evaluation& e : evaluations) best = std::max(best, e.accuracy);
  out.outcome = best < e0 + kLearnMargin ? Outcome::kNeverLearned : Outcome::kLearned;
  return out;
}

const char* AlertName(Alert alert) {
  switch (alert) {
    case Alert::kSpike: return "GacAlignmentSpike";
    case Alert::kElevated: return "GacAlignmentElevated";
    case Alert::kEssLow: return "GacPolicyEssLow";
    case Alert::kClipped: return "GacPolicyClipped";
    case Alert::kKlJump: return "GacSamplerKlJump";
  }
  return "GacAlignmentSpike";
}

namespace {

bool AnyValue(const std::vector<std::optional<double>>& values) {
  return std::any_of(values.begin(), values.end(), [](const std::optional<double>& v) { return v.has_value(); });
}

}  // namespace

bool Evaluated(const RecordedRun& run, Alert alert) {
  switch (alert) {
    case Alert::kSpike:
    case Alert::kElevated: return true;
    case Alert::kEssLow: return AnyValue(run.ess_token);
    case Alert::kClipped: return AnyValue(run.clip_fraction_low) || AnyValue(run.clip_fraction_high);
    case Alert::kKlJump: return AnyValue(run.kl_k3);
  }
  return true;
}

base::Status ValidateAlertSettings(const AlertSettings& s) {
  if (!(s.c_high > 0.0 && s.c_high <= 1.0)) {
    return base::Status::InvalidArgument("c_high " + FormatExact(s.c_high) + " is outside (0, 1]");
  }
  if (!(s.window_c_low > 0.0 && s.window_c_low <= 1.0)) {
    return base::Status::InvalidArgument("window c_low " + FormatExact(s.window_c_low) + " is outside (0, 1]");
  }
  GAC_RETURN_IF_ERROR(controller::ValidateWindow(s.window));
  if (s.for_steps < 0) return base::Status::InvalidArgument("for_steps " + std::to_string(s.for_steps) + " is negative");
  if (s.warmup < 0) return base::Status::InvalidArgument("warmup " + std::to_string(s.warmup) + " is negative");
  return base::Status::Ok();
}

namespace {

// A policy column as gacd's gauge shows it: the last value reported (a step
// without one leaves it), and the column's early median.
struct PolicyGauge {
  std::optional<double> last;
  controller::EarlyMedian early;

  void Add(const std::optional<double>& v) {
    if (!v) return;
    last = v;
    early.Add(*v);
  }
  // last > ratio x the early median (below it when `below`).
  bool AgainstMedian(double ratio, bool below) const {
    if (!last || !early.median()) return false;
    return below ? *last < ratio * *early.median() : *last > ratio * *early.median();
  }
};

// The policy-health gauges of a run, step by step.
struct PolicyGauges {
  PolicyGauge ess, low, high, kl;

  void Add(const RecordedRun& run, std::size_t i) {
    ess.Add(At(run.ess_token, i));
    low.Add(At(run.clip_fraction_low, i));
    high.Add(At(run.clip_fraction_high, i));
    kl.Add(At(run.kl_k3, i));
  }
  // A column's value at step i; absent past its end (a run built without it).
  static std::optional<double> At(const std::vector<std::optional<double>>& values, std::size_t i) {
    return i < values.size() ? values[i] : std::nullopt;
  }
  void Conditions(AlertStep* a) const {
    a->ess_token_median = ess.early.median();
    a->kl_k3_median = kl.early.median();
    a->condition[static_cast<std::size_t>(Alert::kEssLow)] = ess.AgainstMedian(kEssLowRatio, /*below=*/true);
    a->condition[static_cast<std::size_t>(Alert::kClipped)] =
        (low.last || high.last) && low.last.value_or(0.0) + high.last.value_or(0.0) > kClippedFraction;
    a->condition[static_cast<std::size_t>(Alert::kKlJump)] =
        kl.AgainstMedian(kKlJumpRatio, /*below=*/false) && *kl.last > kKlJumpFloor;
  }
};

}  // namespace

std::vector<AlertStep> ReplayAlerts(const RecordedRun& run, const AlertSettings& s) {
  std::vector<AlertStep> out;
  out.reserve(run.steps.size());
  controller::AlignmentWindow window(s.window);
  PolicyGauges policy;
  std::array<std::int64_t, kAlertCount> held{};  // consecutive steps with each condition, this one included
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    AlertStep a;
    a.step = run.steps[i];
    const std::optional<double>& c = run.cosines[i];
    if (c) window.Add(*c);
    a.window_mean = window.mean();
    a.condition[static_cast<std::size_t>(Alert::kSpike)] = c && std::fabs(*c) >= s.c_high;
    a.condition[static_cast<std::size_t>(Alert::kElevated)] =
        a.window_mean && std::fabs(*a.window_mean) > s.window_c_low;
    policy.Add(run, i);
    policy.Conditions(&a);
    for (std::size_t k = 0; k < kAlertCount; ++k) {
      held[k] = a.condition[k] ? held[k] + 1 : 0;
      // The spike has no hold; every other alert is held for_steps further steps.
      a.firing[k] = held[k] > (kAllAlerts[k] == Alert::kSpike ? 0 : s.for_steps);
    }
    out.push_back(a);
  }
  return out;
}

RunBacktest BacktestRun(const RecordedRun& run, const AlertSettings& s) {
  RunBacktest b;
  b.name = run.name;
  b.steps = static_cast<std::int64_t>(run.steps.size());
  b.outcome = ClassifyOutcome(run.start_accuracy, run.evaluations);
  for (Alert alert : kAllAlerts) b.alarms[static_cast<std::size_t>(alert)].evaluated = Evaluated(run, alert);
  for (const AlertStep& a : ReplayAlerts(run, s)) {
    if (a.step <= s.warmup) continue;
    if (!b.first_eligible) b.first_eligible = a.step;
    for (Alert alert : kAllAlerts) {
      Alarm& alarm = b.alarms[static_cast<std::size_t>(alert)];
      if (!alarm.evaluated || !a.fires(alert)) continue;
      ++alarm.firing_steps;
      if (!alarm.step) {
        alarm.step = a.step;
        alarm.at_first_eligible = a.step == *b.first_eligible;
      }
    }
  }
  return b;
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kWarned: return "warned";
    case Verdict::kLate: return "late";
    case Verdict::kMissed: return "missed";
    case Verdict::kFalseAlarm: return "false alarm";
    case Verdict::kQuiet: return "quiet";
    case Verdict::kNotEvaluated: return "not evaluated";
  }
  return "quiet";
}

Verdict Judge(const RunOutcome& outcome, const Alarm& alarm) {
  if (!alarm.evaluated) return Verdict::kNotEvaluated;
  if (outcome.collapse_step) {
    if (!alarm.step) return Verdict::kMissed;
    return *alarm.step <= *outcome.collapse_step ? Verdict::kWarned : Verdict::kLate;
  }
  return alarm.step ? Verdict::kFalseAlarm : Verdict::kQuiet;
}

namespace {

std::optional<double> Ratio(std::int64_t num, std::int64_t den) {
  if (den == 0) return std::nullopt;
  return static_cast<double>(num) / static_cast<double>(den);
}

}  // namespace

std::optional<double> AlertScore::precision() const { return Ratio(tp, tp + fp); }
std::optional<double> AlertScore::recall() const { return Ratio(tp, tp + fn); }
std::optional<double> AlertScore::precision_later() const { return Ratio(tp_later, tp_later + fp_later); }
std::optional<double> AlertScore::recall_later() const { return Ratio(tp_later, collapsed); }

AlertScore ScoreAlert(const std::vector<RunBacktest>& runs, Alert alert) {
  AlertScore s;
  for (const RunBacktest& r : runs) {
    const Alarm& alarm = r.alarms[static_cast<std::size_t>(alert)];
    if (!alarm.evaluated) {
      ++s.not_evaluated;
      continue;
    }
    ++s.runs;
    if (r.outcome.outcome == Outcome::kCollapsed) ++s.collapsed;
    if (r.outcome.outcome == Outcome::kNeverLearned) ++s.never_learned;
    if (alarm.step) ++s.alarmed;
    if (alarm.step && alarm.at_first_eligible) {
      ++s.at_first_eligible;
      if (r.outcome.collapse_step) ++s.at_first_eligible_collapsed;
    }
    switch (Judge(r.outcome, alarm)) {
      case Verdict::kWarned:
        ++s.tp;
        s.leads.push_back(*r.outcome.collapse_step - *alarm.step);
        if (!alarm.at_first_eligible) ++s.tp_later;
        break;
      case Verdict::kLate:
      case Verdict::kMissed: ++s.fn; break;
      case Verdict::kFalseAlarm:
        ++s.fp;
        if (r.outcome.outcome == Outcome::kNeverLearned) ++s.fp_never_learned;
        if (!alarm.at_first_eligible) ++s.fp_later;
        break;
      case Verdict::kQuiet: ++s.tn; break;
      case Verdict::kNotEvaluated: break;  // counted above
    }
  }
  std::sort(s.leads.begin(), s.leads.end());
  return s;
}

std::optional<double> SortedQuantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return std::nullopt;
  return controller::SortedQuantile(sorted, q);
}

base::StatusOr<AlertCalibration> CalibrateAlerts(const std::vector<RecordedRun>& runs, int window,
                                                 std::int64_t warmup) {
  std::vector<double> c, m;
  AlertSettings s;
  s.window = window;
  for (const RecordedRun& run : runs) {
    const std::vector<AlertStep> steps = ReplayAlerts(run, s);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].step <= warmup) continue;
      if (run.cosines[i]) c.push_back(std::fabs(*run.cosines[i]));
      if (steps[i].window_mean) m.push_back(std::fabs(*steps[i].window_mean));
    }
  }
  if (c.empty() || m.empty()) {
    return base::Status::FailedPrecondition("the calibration runs have no " + std::string(c.empty() ? "c_t" : "m_t") +
                                            " after step " + std::to_string(warmup));
  }
  std::sort(c.begin(), c.end());
  std::sort(m.begin(), m.end());
  AlertCalibration cal;
  cal.runs = static_cast<std::int64_t>(runs.size());
  cal.cosines = static_cast<std::int64_t>(c.size());
  cal.window_means = static_cast<std::int64_t>(m.size());
  cal.c_q90 = *SortedQuantile(c, 0.9);
  cal.c_max = c.back();
  cal.window_q90 = *SortedQuantile(m, 0.9);
  cal.window_max = m.back();
  cal.c_low = cal.c_q90;
  cal.c_high = std::min(kHighRatio * cal.c_max, kHighCap);
  cal.window_c_low = cal.window_q90;
  cal.window_c_high = std::min(kHighRatio * cal.window_max, kHighCap);
  if (!(cal.c_low < cal.c_high) || !(cal.window_c_low < cal.window_c_high) || cal.c_low <= 0.0 ||
      cal.window_c_low <= 0.0) {
    return base::Status::FailedPrecondition("the calibration gives no usable thresholds (c_low " +
                                            FormatExact(cal.c_low) + ", c_high " + FormatExact(cal.c_high) +
                                            ", window c_low " + FormatExact(cal.window_c_low) + ", window c_high " +
                                            FormatExact(cal.window_c_high) + ")");
  }
  return cal;
}

}  // namespace gac::cli
