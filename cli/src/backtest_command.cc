// gacctl backtest: the alignment and policy-health alerts, or the spike
// guard, replayed on recorded runs (offline).
#include <filesystem>
#include <set>

#include "cli/src/commands.h"
#include "gac/cli/backtest.h"
#include "gac/controller/window.h"

namespace gac::cli {
namespace {

namespace fs = std::filesystem;

struct BacktestOptions {
  std::vector<std::string> files;      // the runs tested
  std::vector<std::string> calibrate;  // the synchronous runs to calibrate on; empty: thresholds given
  AlertSettings settings;
  // The spike guard's settings: given, the backtest replays the guard
  // instead of the alerts.
  std::optional<controller::SpikeSettings> guard;
  bool per_run = false;
  Format format = Format::kTable;
};

// The CSV files a command-line path names: the file, or a directory's *.csv
// in name order. InvalidArgument naming the path.
base::Status ExpandPath(const std::string& flag, const std::string& path, std::vector<std::string>* out) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return base::Status::InvalidArgument(flag + path + ": no such file or directory");
  if (!fs::is_directory(st)) {
    out->push_back(path);
    return base::Status::Ok();
  }
  std::vector<std::string> found;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".csv" && it->is_regular_file(ec)) found.push_back(it->path().string());
  }
  if (ec) return base::Status::InvalidArgument(flag + path + ": cannot list the directory: " + ec.message());
  if (found.empty()) return base::Status::InvalidArgument(flag + path + ": no .csv file in the directory");
  std::sort(found.begin(), found.end());
  out->insert(out->end(), found.begin(), found.end());
  return base::Status::Ok();
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// The finished runs of `paths` for the alerts; a run whose log has no
// "summary:" line is left out with a note on stderr, as the experiment's
// analysis does; InvalidArgument for a CSV without the column cosine.
base::StatusOr<std::vector<RecordedRun>> ReadRuns(Context& ctx, const std::vector<std::string>& paths) {
  std::vector<RecordedRun> runs;
  for (const std::string& path : paths) {
    GAC_ASSIGN_OR_RETURN(RecordedRun run, ReadRun(path));
    if (!run.has_cosine) return base::Status::InvalidArgument(path + ": no column 'cosine' for the alerts");
    if (!run.finished) {
      ctx.err() << "gacctl: note: " << path << " left out: its log has no \"summary:\" line (unfinished run)\n";
      continue;
    }
    runs.push_back(std::move(run));
  }
  return runs;
}

std::vector<Column> SummaryColumns() {
  return {{"alert", "ALERT"},
          {"threshold", "THRESHOLD", true},
          {"for_steps", "FOR_STEPS", true},
          {"runs", "RUNS", true},
          {"not_evaluated", "NOT_EVALUATED", true},
          {"collapsed", "COLLAPSED", true},
          {"never_learned", "NEVER_LEARNED", true},
          {"alarmed", "ALARMED", true},
          {"at_first_eligible", "AT_FIRST", true},
          {"at_first_eligible_collapsed", "OF_THEM_COLLAPSED", true},
          {"tp", "TP", true},
          {"fp", "FP", true},
          {"fp_never_learned", "FP_NEVER_LEARNED", true},
          {"fn", "FN", true},
          {"tn", "TN", true},
          {"precision", "PRECISION", true},
          {"recall", "RECALL", true},
          {"lead_median", "LEAD_MEDIAN", true},
          {"lead_q25", "LEAD_Q25", true},
          {"lead_q75", "LEAD_Q75", true},
          {"lead_min", "LEAD_MIN", true},
          {"lead_max", "LEAD_MAX", true},
          {"tp_later", "TP_LATER", true},
          {"fp_later", "FP_LATER", true},
          {"precision_later", "PRECISION_LATER", true},
          {"recall_later", "RECALL_LATER", true}};
}

std::vector<Column> PerRunColumns() {
  return {{"run", "RUN"},
          {"steps", "STEPS", true},
          {"outcome", "OUTCOME"},
          {"collapse_step", "COLLAPSE", true},
          {"alert", "ALERT"},
          {"first_alarm", "FIRST_ALARM", true},
          {"at_first_eligible", "AT_FIRST"},
          {"firing_steps", "FIRING_STEPS", true},
          {"lead", "LEAD", true},
          {"verdict", "VERDICT"}};
}

Cell OptionalStep(const std::optional<std::int64_t>& step) { return step ? Cell::Int(*step) : Cell(); }

// The number each alert's rule compares with (the policy alerts' ratios to
// the early median, and the clipped fraction).
double Threshold(const AlertSettings& s, Alert alert) {
  switch (alert) {
    case Alert::kSpike: return s.c_high;
    case Alert::kElevated: return s.window_c_low;
    case Alert::kEssLow: return kEssLowRatio;
    case Alert::kClipped: return kClippedFraction;
    case Alert::kKlJump: return kKlJumpRatio;
  }
  return s.c_high;
}

void WriteSummaryRows(RowWriter& w, const std::vector<RunBacktest>& results, const AlertSettings& s) {
  for (Alert alert : kAllAlerts) {
    const AlertScore score = ScoreAlert(results, alert);
    const std::vector<double> leads(score.leads.begin(), score.leads.end());
    w.Add({Cell::Text(AlertName(alert)), Cell::Real(Threshold(s, alert)),
           alert == Alert::kSpike ? Cell::Int(0) : Cell::Int(s.for_steps), Cell::Int(score.runs),
           Cell::Int(score.not_evaluated), Cell::Int(score.collapsed), Cell::Int(score.never_learned),
           Cell::Int(score.alarmed),
           Cell::Int(score.at_first_eligible), Cell::Int(score.at_first_eligible_collapsed), Cell::Int(score.tp),
           Cell::Int(score.fp), Cell::Int(score.fp_never_learned), Cell::Int(score.fn), Cell::Int(score.tn),
           Cell::Optional(score.precision()), Cell::Optional(score.recall()), Cell::Optional(SortedQuantile(leads, 0.5)),
           Cell::Optional(SortedQuantile(leads, 0.25)), Cell::Optional(SortedQuantile(leads, 0.75)),
           leads.empty() ? Cell() : Cell::Int(score.leads.front()), leads.empty() ? Cell() : Cell::Int(score.leads.back()),
           Cell::Int(score.tp_later), Cell::Int(score.fp_later), Cell::Optional(score.precision_later()),
           Cell::Optional(score.recall_later())});
  }
  w.Flush();
}

void WritePerRunRows(RowWriter& w, const std::vector<RunBacktest>& results) {
  for (const RunBacktest& r : results) {
    for (Alert alert : kAllAlerts) {
      const Alarm& a = r.alarms[static_cast<std::size_t>(alert)];
      const Verdict v = Judge(r.outcome, a);
      w.Add({Cell::Text(r.name), Cell::Int(r.steps), Cell::Text(OutcomeName(r.outcome.outcome)),
             OptionalStep(r.outcome.collapse_step), Cell::Text(AlertName(alert)), OptionalStep(a.step),
             a.step ? Cell::Bool(a.at_first_eligible) : Cell(), a.evaluated ? Cell::Int(a.firing_steps) : Cell(),
             v == Verdict::kWarned ? Cell::Int(*r.outcome.collapse_step - *a.step) : Cell(),
             Cell::Text(VerdictName(v))});
    }
  }
  w.Flush();
}

// The policy-health alerts' rules, and the runs each was not evaluated on.
void WritePolicyHeading(std::ostream& out, const std::vector<RunBacktest>& results, int for_steps) {
  struct Rule {
    Alert alert;
    std::string text, input;
  };
  const std::string early = " x its early median (first " + std::to_string(controller::kEarlyValues) + " values)";
  const Rule rules[] = {
      {Alert::kEssLow, "GacPolicyEssLow:      ess_token < " + FormatDisplay(kEssLowRatio) + early, "ess_token"},
      {Alert::kClipped, "GacPolicyClipped:     clip_fraction_low + clip_fraction_high > " +
                            FormatDisplay(kClippedFraction), "clip_fraction_low or clip_fraction_high"},
      {Alert::kKlJump, "GacSamplerKlJump:     kl_k3 > " + FormatDisplay(kKlJumpRatio) + early + " and > " +
                           FormatDisplay(kKlJumpFloor), "kl_k3"},
  };
  for (const Rule& rule : rules) {
    const auto n = std::count_if(results.begin(), results.end(), [&rule](const RunBacktest& r) {
      return !r.alarms[static_cast<std::size_t>(rule.alert)].evaluated;
    });
    out << rule.text << ", held " << for_steps << " more steps";
    if (n > 0) out << "; not evaluated in " << n << " of " << results.size() << " runs (no " << rule.input << " value)";
    out << "\n";
  }
}

void WriteHeading(std::ostream& out, const BacktestOptions& o, const std::vector<RunBacktest>& results,
                  const std::optional<AlertCalibration>& cal) {
  const AlertSettings& s = o.settings;
  std::int64_t counts[3] = {0, 0, 0};
  for (const RunBacktest& r : results) ++counts[static_cast<int>(r.outcome.outcome)];
  out << "backtest of " << results.size() << " runs: " << counts[0] << " collapsed, " << counts[1]
      << " never learned, " << counts[2] << " learned; alarms from step " << s.warmup + 1 << "\n";
  out << "GacAlignmentSpike:    |c_t| >= c_high " << FormatDisplay(s.c_high) << "\n";
  out << "GacAlignmentElevated: |m_t| > window c_low " << FormatDisplay(s.window_c_low) << " (W " << s.window
      << "), held " << s.for_steps << " more steps\n";
  WritePolicyHeading(out, results, s.for_steps);
  if (cal) {
    out << "thresholds calibrated on " << cal->runs << " synchronous runs (steps > " << s.warmup << "): q0.9 |c_t| "
        << FormatDisplay(cal->c_q90) << ", max |c_t| " << FormatDisplay(cal->c_max) << " over " << cal->cosines
        << " steps; q0.9 |m_t| " << FormatDisplay(cal->window_q90) << ", max |m_t| " << FormatDisplay(cal->window_max)
        << " over " << cal->window_means << " steps\n";
  }
  out << "\n";
}

base::Status Backtest(Context& ctx, BacktestOptions o) {
  std::optional<AlertCalibration> cal;
  if (!o.calibrate.empty()) {
    GAC_ASSIGN_OR_RETURN(std::vector<RecordedRun> sync, ReadRuns(ctx, o.calibrate));
    base::StatusOr<AlertCalibration> c = CalibrateAlerts(sync, o.settings.window, o.settings.warmup);
    if (!c.ok()) return c.status().WithPrefix("--calibrate-on");
    cal = *c;
    o.settings.c_high = cal->c_high;
    o.settings.window_c_low = cal->window_c_low;
  }
  GAC_ASSIGN_OR_RETURN(std::vector<RecordedRun> runs, ReadRuns(ctx, o.files));
  if (runs.empty()) return base::Status::FailedPrecondition("no finished run to backtest");
  std::vector<RunBacktest> results;
  results.reserve(runs.size());
  for (const RecordedRun& run : runs) results.push_back(BacktestRun(run, o.settings));

  std::ostream& out = ctx.out();
  if (o.format == Format::kTable) WriteHeading(out, o, results, cal);
  std::unique_ptr<RowWriter> w = RowWriter::Create(o.format, &out, o.per_run ? PerRunColumns() : SummaryColumns());
  if (o.per_run) {
    WritePerRunRows(*w, results);
  } else {
    WriteSummaryRows(*w, results, o.settings);
  }
  return base::Status::Ok();
}

std::vector<Column> GuardColumns() {
  return {{"run", "RUN"},
          {"judged", "JUDGED", true},
          {"spikes", "SPIKES", true},
          {"injected", "INJECTED", true},
          {"caught", "CAUGHT", true},
          {"missed", "MISSED", true},
          {"false_spikes", "FALSE_SPIKES", true},
          {"spike_steps", "SPIKE_STEPS"}};
}

// The spike guard on every run, one row a run and a last row "all".
base::Status BacktestGuard(Context& ctx, const BacktestOptions& o) {
  const controller::SpikeSettings& s = *o.guard;
  std::vector<RecordedRun> runs;
  for (const std::string& path : o.files) {
    GAC_ASSIGN_OR_RETURN(RecordedRun run, ReadRun(path));
    if (!run.has_grad_norm) return base::Status::InvalidArgument(path + ": no column 'grad_norm' for the spike guard");
    runs.push_back(std::move(run));
  }
  std::ostream& out = ctx.out();
  if (o.format == Format::kTable) {
    out << "spike guard replayed on " << runs.size() << " runs:";
    if (s.max_grad_norm > 0) out << " |g| > " << FormatDisplay(s.max_grad_norm) << (s.zscore ? " or" : "");
    if (s.zscore) {
      out << " z(|g|) or z(loss) > " << FormatDisplay(s.sigma) << " over the last " << s.window
          << " accepted steps (from " << s.effective_warmup() << " held)";
    }
    out << "\n\n";
  }
  std::unique_ptr<RowWriter> w = RowWriter::Create(o.format, &out, GuardColumns());
  GuardReplay all;
  const auto row = [&](const std::string& name, const GuardReplay& g, bool list) {
    const auto spikes = static_cast<std::int64_t>(g.spikes.size());
    std::string steps;
    for (std::size_t i = 0; list && i < g.spikes.size() && i < 20; ++i) steps += (i ? " " : "") + std::to_string(g.spikes[i]);
    if (list && g.spikes.size() > 20) steps += " ...";
    w->Add({Cell::Text(name), Cell::Int(g.judged), Cell::Int(spikes), Cell::Int(g.injected), Cell::Int(g.caught),
            Cell::Int(g.injected - g.caught), Cell::Int(spikes - g.caught), Cell::Text(steps)});
  };
  for (const RecordedRun& run : runs) {
    const GuardReplay g = ReplayGuard(run, s);
    all.judged += g.judged;
    all.injected += g.injected;
    all.caught += g.caught;
    all.spikes.insert(all.spikes.end(), g.spikes.begin(), g.spikes.end());
    row(run.name, g, true);
  }
  row("all", all, false);
  w->Flush();
  return base::Status::Ok();
}

base::StatusOr<std::vector<std::string>> ExpandPaths(const std::string& flag, const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& p : paths) GAC_RETURN_IF_ERROR(ExpandPath(flag, p, &files));
  return files;
}

constexpr char kBacktestDescription[] =
    "Replays recorded runs (CSV files of the example trainer, gac_grpo, or every *.csv of\n"
    "a directory; needs no gacd) through the alerts of dashboards/gac.rules.yml, one\n"
    "evaluation per step, and scores each alert's first alarm against the run's collapse.\n"
    "Columns read: step, cosine, heldout_acc (and regime: an invalid step has no c_t), and\n"
    "when present ess_token, clip_fraction_low, clip_fraction_high, kl_k3; RUN.log beside\n"
    "RUN.csv gives the held-out accuracy after the warm-up, and a log without a\n"
    "\"summary:\" line marks an unfinished run, left out with a note.\n\n"
    "  GacAlignmentSpike     fires at a step with |c_t| >= c_high (its other clause, a step\n"
    "                        in the skip regime, is the same test with the run's c_high).\n"
    "  GacAlignmentElevated  |m_t| > window c_low, m_t the signed mean of the last W c_t\n"
    "                        (gac::controller::AlignmentWindow on the cosine column; a step\n"
    "                        without c_t leaves m_t as it was; none until W are held), held\n"
    "                        --for-steps further steps: the rule's `for: 5m` at r steps per\n"
    "                        second is ceil(300 r) steps (a step a minute: 5, the default).\n"
    "  GacPolicyEssLow       ess_token < 0.5 x its early median, the median of the run's\n"
    "                        first 20 ess_token values (none until 20 are seen), held\n"
    "                        --for-steps further steps.\n"
    "  GacPolicyClipped      clip_fraction_low + clip_fraction_high > 0.2 (a side without a\n"
    "                        value counts as 0), held --for-steps further steps.\n"
    "  GacSamplerKlJump      kl_k3 > 4 x its early median (the same rule) and kl_k3 > 0.001,\n"
    "                        held --for-steps further steps.\n"
    "Their rules' `for: 2m` is ceil(120 r) steps (2 at a step a minute; the default 5 is\n"
    "the elevated rule's). The policy columns are read as gacd's gauges show them: a step\n"
    "without a value (an empty cell) keeps the last one. A run without any value of a\n"
    "policy alert's input (no such column: a CSV from before gac_grpo wrote them; only\n"
    "empty cells: a loss that does not clip) has that alert \"not evaluated\", in none of\n"
    "its counts but NOT_EVALUATED.\n\n"
    "Alarms count from the first step after --warmup (the first eligible step); an alert\n"
    "already firing there alarms there, which in a run stale from its start says only\n"
    "that it is stale: those alarms are counted apart (AT_FIRST, and *_LATER below).\n\n"
    "Thresholds: --c-high and --window-c-low, or --calibrate-on synchronous runs with the\n"
    "experiment's rule, pooled over their steps after --warmup: window c_low = q0.9 |m_t|,\n"
    "c_high = min(3 max |c_t|, 0.95) (linear-interpolated quantile). Never calibrate on\n"
    "the runs tested: a file given to both is refused.\n\n"
    "Collapse (examples/grpo/analyze.py's rule): held-out evaluations e_0 (the log's\n"
    "accuracy after the warm-up; without it e_1) and e_1..e_n (the heldout_acc cells),\n"
    "running peak P_i = max(e_0..e_i); the run collapsed at the step of the first i >= 1\n"
    "with e_i < 0.7 P_i and every later e_j < 0.7 P_i (the last evaluation can be it).\n"
    "Otherwise it never learned when max(e_1..e_n) < e_0 + 0.05, else it learned.\n\n"
    "Scoring: an alarm at or before the collapse is a true positive (lead: the collapse\n"
    "step minus the alarm step); a collapsed run without an alarm, or with a later one, is\n"
    "missed; any alarm in a run that did not collapse is false (FP_NEVER_LEARNED: of them,\n"
    "in runs that never learned). *_LATER: the same when an alarm at the first eligible\n"
    "step counts as none (recall_later = tp_later / collapsed). Leads: median and quartiles\n"
    "interpolated linearly, min and max.\n\n"
    "Output, one row per alert:\n"
    "  alert, threshold (the policy alerts': 0.5, 0.2, 4), for_steps, runs (evaluated),\n"
    "  not_evaluated, collapsed, never_learned, alarmed,\n"
    "  at_first_eligible, at_first_eligible_collapsed, tp, fp, fp_never_learned, fn, tn,\n"
    "  precision, recall, lead_median, lead_q25, lead_q75, lead_min, lead_max, tp_later,\n"
    "  fp_later, precision_later, recall_later\n"
    "--per-run, one row per run and alert instead:\n"
    "  run, steps, outcome, collapse_step, alert, first_alarm, at_first_eligible,\n"
    "  firing_steps, lead, verdict (warned, late, missed, false alarm, quiet, not evaluated)\n\n"
    "The spike guard instead (--max-grad-norm, --spike-sigma, --spike-window,\n"
    "--spike-warmup; any z-score flag turns its z-score on, as gac.Agent's): the runs'\n"
    "grad_norm and loss columns (no cosine needed) through gac::controller::SpikeGuard,\n"
    "step after step, as the agent would have judged them (a spike enters neither\n"
    "window). With an `injected` column (0/1, gac_grpo --inject-spikes) the injected\n"
    "steps it caught and missed. One row per run and a last row `all`:\n"
    "  run, judged (steps with a grad_norm), spikes, injected, caught, missed,\n"
    "  false_spikes (spikes at steps not injected), spike_steps (the first 20)\n\n"
    "Unreadable files and bad rows (missing columns, a value that is not a number, steps\n"
    "out of order) are errors naming the file and line (exit 1); bad flags exit 2.\n";

std::vector<FlagSpec> BacktestFlags() {
  return {
      {"c-high", "X", "GacAlignmentSpike's c_high (with --window-c-low; or --calibrate-on)"},
      {"window-c-low", "X", "GacAlignmentElevated's window c_low"},
      {"calibrate-on", "PATHS", "calibrate both on these synchronous runs (comma-separated files or directories)"},
      {"window", "W", "m_t's window, in steps with a c_t (default 20, the example trainer's)"},
      {"for-steps", "N", "every alert's hold but GacAlignmentSpike's, in steps (default 5; 0 = at once)"},
      {"warmup", "N", "alarms and calibration start after step N (default 50)"},
      {"per-run", "", "one row per run and alert instead of the summary"},
      {"max-grad-norm", "X", "spike guard: a step with |g| above X is a spike"},
      {"spike-sigma", "X", "spike guard: a z-score of |g| or of the loss above X is a spike (default 6)"},
      {"spike-window", "N", "spike guard: the z-score over the last N steps (default 128)"},
      {"spike-warmup", "N", "spike guard: steps held before the z-score applies (default N/2)"},
      FormatFlagSpec(),
  };
}

// The spike guard's settings when a spike guard flag is given (the backtest
// then replays the guard), else nullopt; the alerts' flags are refused
// beside them.
base::StatusOr<std::optional<controller::SpikeSettings>> GuardSettings(const ParsedFlags& flags) {
  GAC_ASSIGN_OR_RETURN(auto max_norm, OptionalReal(flags, "max-grad-norm"));
  GAC_ASSIGN_OR_RETURN(auto sigma, OptionalReal(flags, "spike-sigma"));
  GAC_ASSIGN_OR_RETURN(auto spike_window, OptionalInt(flags, "spike-window", 2, controller::kMaxSpikeWindow));
  GAC_ASSIGN_OR_RETURN(auto spike_warmup, OptionalInt(flags, "spike-warmup", 2, controller::kMaxSpikeWindow));
  if (!(max_norm || sigma || spike_window || spike_warmup)) return std::optional<controller::SpikeSettings>();
  for (const char* f : {"c-high", "window-c-low", "calibrate-on", "window", "for-steps", "warmup", "per-run"}) {
    if (flags.Has(f)) {
      return base::Status::InvalidArgument(std::string("--") + f + " is the alerts' setting: the spike guard's "
                                           "backtest takes --max-grad-norm and the --spike-* flags");
    }
  }
  controller::SpikeSettings s;
  if (max_norm) s.max_grad_norm = *max_norm;
  s.zscore = sigma || spike_window || spike_warmup;
  if (sigma) s.sigma = *sigma;
  if (spike_window) s.window = static_cast<int>(*spike_window);
  if (spike_warmup) s.warmup = static_cast<int>(*spike_warmup);
  const base::Status st = controller::ValidateSpikeSettings(s);
  if (!st.ok()) return base::Status::InvalidArgument(st.message());
  return std::optional<controller::SpikeSettings>(s);
}

// InvalidArgument when a run to calibrate on is one of the runs tested.
base::Status CheckNotTested(const std::vector<std::string>& files, const std::vector<std::string>& calibrate) {
  std::set<std::string> tested;
  for (const std::string& f : files) tested.insert(Canonical(f));
  for (const std::string& f : calibrate) {
    if (tested.count(Canonical(f)) > 0) {
      return base::Status::InvalidArgument(f + " is both calibrated on and tested: thresholds are never set on "
                                           "the runs they are tested on");
    }
  }
  return base::Status::Ok();
}

// The thresholds: given (--c-high and --window-c-low), or the runs to
// calibrate them on (--calibrate-on).
base::Status ReadThresholds(const ParsedFlags& flags, BacktestOptions* o) {
  GAC_ASSIGN_OR_RETURN(auto c_high, OptionalReal(flags, "c-high"));
  GAC_ASSIGN_OR_RETURN(auto window_c_low, OptionalReal(flags, "window-c-low"));
  if (const std::string* cal = flags.Get("calibrate-on")) {
    if (c_high || window_c_low) {
      return base::Status::InvalidArgument("--calibrate-on sets the thresholds: give it or --c-high and "
                                           "--window-c-low, not both");
    }
    GAC_ASSIGN_OR_RETURN(o->calibrate, ExpandPaths("--calibrate-on: ", SplitCommas(*cal)));
    return CheckNotTested(o->files, o->calibrate);
  }
  if (!c_high || !window_c_low) {
    return base::Status::InvalidArgument("give --c-high and --window-c-low, or --calibrate-on");
  }
  o->settings.c_high = *c_high;
  o->settings.window_c_low = *window_c_low;
  return base::Status::Ok();
}

// The alerts' window, hold and warm-up; the settings are checked here when
// the thresholds were given (calibrated ones are checked by the calibration).
base::Status ReadAlertSettings(const ParsedFlags& flags, BacktestOptions* o) {
  GAC_ASSIGN_OR_RETURN(auto window, OptionalInt(flags, "window", 1, controller::kMaxWindow));
  GAC_ASSIGN_OR_RETURN(auto for_steps, OptionalInt(flags, "for-steps", 0, 1000000));
  GAC_ASSIGN_OR_RETURN(auto warmup, OptionalInt(flags, "warmup", 0, INT64_MAX / 2));
  if (window) o->settings.window = static_cast<int>(*window);
  if (for_steps) o->settings.for_steps = static_cast<int>(*for_steps);
  if (warmup) o->settings.warmup = *warmup;
  if (o->calibrate.empty()) {
    const base::Status st = ValidateAlertSettings(o->settings);
    if (!st.ok()) return base::Status::InvalidArgument(st.message());
  }
  return base::Status::Ok();
}

base::StatusOr<Action> PrepareBacktest(const ParsedFlags& flags, const std::vector<std::string>& args) {
  BacktestOptions o;
  GAC_ASSIGN_OR_RETURN(o.files, ExpandPaths("", args));
  GAC_ASSIGN_OR_RETURN(o.guard, GuardSettings(flags));
  if (o.guard) {
    GAC_ASSIGN_OR_RETURN(o.format, FormatFlag(flags));
    return Action([o](Context& ctx) { return BacktestGuard(ctx, o); });
  }
  GAC_RETURN_IF_ERROR(ReadThresholds(flags, &o));
  GAC_RETURN_IF_ERROR(ReadAlertSettings(flags, &o));
  o.per_run = flags.Has("per-run");
  GAC_ASSIGN_OR_RETURN(o.format, FormatFlag(flags));
  return Action([o](Context& ctx) { return Backtest(ctx, o); });
}

CommandSpec BacktestCommand() {
  CommandSpec c;
  c.name = "backtest";
  c.args = "FILE_OR_DIR...";
  c.summary = "the alignment and policy-health alerts, or the spike guard, replayed on recorded runs (offline)";
  c.description = kBacktestDescription;
  c.flags = BacktestFlags();
  c.positionals = 1;
  c.more_positionals = true;
  c.prepare = PrepareBacktest;
  return c;
}

}  // namespace

std::vector<CommandSpec> BacktestCommands() { return {BacktestCommand()}; }

}  // namespace gac::cli
