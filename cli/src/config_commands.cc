// gacctl config get|set|history and calibrate.
#include "cli/src/commands.h"
#include "gac/controller/calibration.h"
#include "gac/controller/window.h"
#include "gac/proto/convert.h"

#include <cmath>
#include <limits>
#include <optional>

namespace gac::cli {
namespace {

void WriteConfig(std::ostream& out, const std::string& run, const v1::RunConfig& config) {
  out << "run         " << run << "\n"
      << "c_low       " << FormatExact(config.thresholds().c_low()) << "\n"
      << "c_high      " << FormatExact(config.thresholds().c_high()) << "\n"
      << "alpha_mode  " << proto::EnumName(config.thresholds().alpha_mode()) << "\n"
      << "mode        " << proto::EnumName(config.mode()) << "\n"
      << "trigger     " << proto::EnumName(config.trigger()) << "\n"
      << "window      " << proto::WindowFromProto(config.window()) << " steps\n";
  const v1::Thresholds& w = config.has_window_thresholds() ? config.window_thresholds() : config.thresholds();
  out << "window_c_low  " << FormatExact(w.c_low()) << "\n"
      << "window_c_high " << FormatExact(w.c_high()) << "\n"
      << "spike_guard " << SpikeText(config) << "\n";
  if (config.version() == 0) {
    out << "version     0 (gacd's defaults, never set)\n";
  } else {
    out << "version     " << config.version() << "\n"
        << "updated     " << FormatTimeUtc(config.updated_ns()) << " by " << config.updated_by() << "\n";
  }
}

CommandSpec ConfigGetCommand() {
  CommandSpec c;
  c.name = "config get";
  c.args = "RUN";
  c.summary = "a run's settings: thresholds, alpha mode, mode, version";
  c.description =
      "A run gacd has never been told about has gacd's defaults (version 0).\n";
  c.positionals = 1;
  c.prepare = [](const ParsedFlags&, const std::vector<std::string>& args) -> base::StatusOr<Action> {
    return Action([run = args[0]](Context& ctx) -> base::Status {
      GAC_ASSIGN_OR_RETURN(v1::RunConfig config, ctx.client().GetRunConfig(run));
      WriteConfig(ctx.out(), run, config);
      return base::Status::Ok();
    });
  };
  return c;
}

// The new settings of `config set` or `calibrate --apply`; absent fields
// keep the run's current value.
struct SettingsChange {
  std::string run;
  std::optional<double> c_low, c_high;
  std::optional<controller::AlphaMode> alpha_mode;
  std::optional<controller::Mode> mode;
  std::optional<controller::Trigger> trigger;
  std::optional<int> window;
  std::optional<double> window_c_low, window_c_high;
  // The spike guard: the flags given change the run's current guard; off
  // turns it off.
  std::optional<double> max_grad_norm, spike_sigma;
  std::optional<int> spike_window, spike_warmup;
  bool spike_off = false;
  std::string reason;
  std::optional<std::uint64_t> expected_version;

  bool complete() const { return c_low && c_high && alpha_mode && mode; }
  bool changes_window() const { return trigger || window || window_c_low || window_c_high; }
  bool changes_spike() const { return max_grad_norm || spike_sigma || spike_window || spike_warmup || spike_off; }
  bool empty() const { return !c_low && !c_high && !alpha_mode && !mode && !changes_window() && !changes_spike(); }
};

// Parses the spike guard's flags of `config set`.
base::Status ParseSpikeFlags(const ParsedFlags& flags, SettingsChange* change) {
  GAC_ASSIGN_OR_RETURN(change->max_grad_norm, OptionalReal(flags, "max-grad-norm"));
  GAC_ASSIGN_OR_RETURN(change->spike_sigma, OptionalReal(flags, "spike-sigma"));
  GAC_ASSIGN_OR_RETURN(auto window, OptionalInt(flags, "spike-window", 2, controller::kMaxSpikeWindow));
  if (window) change->spike_window = static_cast<int>(*window);
  GAC_ASSIGN_OR_RETURN(auto warmup, OptionalInt(flags, "spike-warmup", 2, controller::kMaxSpikeWindow));
  if (warmup) change->spike_warmup = static_cast<int>(*warmup);
  change->spike_off = flags.Has("spike-off");
  if (change->spike_off && (change->max_grad_norm || change->spike_sigma || window || warmup)) {
    return base::Status::InvalidArgument("--spike-off turns the spike guard off: give it alone, without "
                                         "--max-grad-norm, --spike-sigma, --spike-window or --spike-warmup");
  }
  // Checked here as the controller checks it, so the error names the flag.
  controller::SpikeSettings s;
  s.zscore = true;
  if (change->max_grad_norm) s.max_grad_norm = *change->max_grad_norm;
  if (change->spike_sigma) s.sigma = *change->spike_sigma;
  if (change->spike_window) s.window = *change->spike_window;
  if (change->spike_warmup) {
    if (!change->spike_window) s.window = controller::kMaxSpikeWindow;  // the run's own window: gacd checks
    s.warmup = *change->spike_warmup;
  }
  const base::Status st = controller::ValidateSpikeSettings(s);
  if (st.ok()) return st;
  // "spike_sigma must be ..." -> "--spike-sigma must be ...": the flag's name.
  std::string message = st.message();
  for (std::size_t i = 0; i < message.size() && message[i] != ' '; ++i) {
    if (message[i] == '_') message[i] = '-';
  }
  return base::Status::InvalidArgument("--" + message);
}

// Parses --alpha-mode, --mode, --reason and --expected-version.
base::Status ParseChangeFlags(const ParsedFlags& flags, SettingsChange* change) {
  if (const std::string* a = flags.Get("alpha-mode")) {
    base::StatusOr<controller::AlphaMode> m = controller::ParseAlphaMode(a->c_str());
    if (!m.ok()) return base::Status::InvalidArgument("--alpha-mode: " + m.status().message());
    change->alpha_mode = *m;
  }
  if (const std::string* m = flags.Get("mode")) {
    base::StatusOr<controller::Mode> mode = controller::ParseMode(m->c_str());
    if (!mode.ok()) return base::Status::InvalidArgument("--mode: " + mode.status().message());
    change->mode = *mode;
  }
  if (const std::string* t = flags.Get("trigger")) {
    base::StatusOr<controller::Trigger> trigger = controller::ParseTrigger(t->c_str());
    if (!trigger.ok()) return base::Status::InvalidArgument("--trigger: " + trigger.status().message());
    change->trigger = *trigger;
  }
  GAC_ASSIGN_OR_RETURN(auto window, OptionalInt(flags, "window-steps", 1, controller::kMaxWindow));
  if (window) change->window = static_cast<int>(*window);
  if (const std::string* r = flags.Get("reason")) change->reason = *r;
  GAC_ASSIGN_OR_RETURN(auto expected, OptionalInt(flags, "expected-version", 1, INT64_MAX));
  if (expected) change->expected_version = static_cast<std::uint64_t>(*expected);
  return base::Status::Ok();
}

// Sets the change: the fields not given are read from the run's current
// settings, and the change then applies only to the version that was read
// (unless --expected-version says which), so a concurrent change is not
// overwritten unseen. gacd validates the thresholds; its error is returned
// as it is.
base::StatusOr<v1::RunConfig> ApplyChange(Context& ctx, const SettingsChange& change) {
  v1::SetRunConfigRequest request;
  request.set_run(change.run);
  request.set_reason(change.reason);
  controller::Thresholds t;
  controller::AlphaMode alpha = controller::AlphaMode::kPaper;
  controller::Mode mode = controller::Mode::kLocal;
  std::uint64_t expected = 0;
  v1::Thresholds window_thresholds;
  controller::SpikeSettings spike;
  if (!change.complete() || change.changes_window() || change.changes_spike()) {
    GAC_ASSIGN_OR_RETURN(v1::RunConfig current, ctx.client().GetRunConfig(change.run));
    window_thresholds = current.has_window_thresholds() ? current.window_thresholds() : current.thresholds();
    t.c_low = current.thresholds().c_low();
    t.c_high = current.thresholds().c_high();
    base::StatusOr<controller::AlphaMode> a = proto::FromProto(current.thresholds().alpha_mode());
    if (!a.ok()) return a.status().WithPrefix("gacd's settings of " + change.run);
    alpha = *a;
    if (current.mode() != v1::CONTROL_MODE_UNSPECIFIED) {
      base::StatusOr<controller::Mode> m = proto::FromProto(current.mode());
      if (!m.ok()) return m.status().WithPrefix("gacd's settings of " + change.run);
      mode = *m;
    } else if (!change.mode) {
      return base::Status::FailedPrecondition("gacd's settings of " + change.run + " have no mode: give --mode");
    }
    if (current.has_spike()) {
      base::StatusOr<controller::SpikeSettings> s = proto::SpikeFromProto(current.spike());
      if (!s.ok()) return s.status().WithPrefix("gacd's settings of " + change.run);
      spike = *s;
    }
    expected = current.version();
  }
  if (change.c_low) t.c_low = *change.c_low;
  if (change.c_high) t.c_high = *change.c_high;
  if (change.alpha_mode) alpha = *change.alpha_mode;
  if (change.mode) mode = *change.mode;
  if (change.expected_version) expected = *change.expected_version;
  *request.mutable_thresholds() = proto::ToProto(t, alpha);
  request.set_mode(proto::ToProto(mode));
  if (change.trigger) request.set_trigger(proto::ToProto(*change.trigger));
  if (change.window) request.set_window(static_cast<std::uint32_t>(*change.window));
  if (change.window_c_low || change.window_c_high) {
    if (change.window_c_low) window_thresholds.set_c_low(*change.window_c_low);
    if (change.window_c_high) window_thresholds.set_c_high(*change.window_c_high);
    window_thresholds.set_alpha_mode(proto::ToProto(alpha));
    *request.mutable_window_thresholds() = window_thresholds;
  }
  if (change.changes_spike()) {
    if (change.spike_off) spike = controller::SpikeSettings{};
    if (change.max_grad_norm) spike.max_grad_norm = *change.max_grad_norm;
    if (change.spike_sigma || change.spike_window || change.spike_warmup) spike.zscore = true;
    if (change.spike_sigma) spike.sigma = *change.spike_sigma;
    if (change.spike_window) spike.window = *change.spike_window;
    if (change.spike_warmup) spike.warmup = *change.spike_warmup;
    *request.mutable_spike() = proto::ToProto(spike);
  }
  if (change.expected_version) expected = *change.expected_version;
  request.set_expected_version(expected);
  return ctx.client().SetRunConfig(request);
}

std::string ChangedText(const std::string& run, const v1::RunConfig& config) {
  return run + ": settings version " + std::to_string(config.version()) + ": " + SettingsText(config) + "\n";
}

std::vector<FlagSpec> ChangeFlags() {
  return {
      {"alpha-mode", "paper|exact", "alpha = c_low/|c| (paper) or the exact gain (default: unchanged)"},
      {"mode", "monitor|local|remote", "who decides the run's regimes (default: unchanged)"},
      {"trigger", "per_step|window", "decide on |c_t| of each step or on |m_t| of the window (default: unchanged)"},
      {"window-steps", "W", "steps in the windowed mean m_t, 1-1000 (default: unchanged)"},
      {"reason", "TEXT", "why, for the audit log (required)"},
      {"expected-version", "N", "apply only if the run's settings are at version N (else ABORTED)"},
  };
}

CommandSpec ConfigSetCommand() {
  CommandSpec c;
  c.name = "config set";
  c.args = "RUN";
  c.summary = "change a run's thresholds, alpha mode, mode or trigger (needs admin rights)";
  c.description =
      "Settings not given keep their current value: gacctl reads them, and the change\n"
      "then applies only if the run's settings are still at the version it read. With\n"
      "--expected-version N it applies only at version N. Otherwise gacd refuses with\n"
      "ABORTED and nothing changes. gacd validates the thresholds (0 < c_low < c_high <= 1)\n"
      "and its error is shown as it is. gacd answers once the change and its audit record\n"
      "are durable; agents in remote mode use it from their next Decide. The token needs\n"
      "admin rights on RUN, and read rights too when settings are left out.\n"
      "The windowed trigger (--trigger window) applies the rule to m_t, the signed mean of\n"
      "the run's last W valid c_t (--window-steps W), with its own thresholds\n"
      "(--window-c-low, --window-c-high; 'gacctl calibrate --windowed' suggests them).\n"
      "The spike guard decides before GAC for agents in remote mode: a step with |g| above\n"
      "--max-grad-norm, or whose |g| or loss is more than --spike-sigma standard deviations\n"
      "above its last --spike-window steps, is skipped (regime spike). The flags\n"
      "given change the run's guard; any z-score flag turns its z-score on; --spike-off\n"
      "turns the guard off.\n";
  c.flags = {{"c-low", "X", "|c_t| at or below: safe (default: unchanged)"},
             {"c-high", "X", "|c_t| at or above: skip (default: unchanged)"},
             {"window-c-low", "X", "|m_t| at or below: safe, windowed trigger (default: unchanged)"},
             {"window-c-high", "X", "|m_t| at or above: skip, windowed trigger (default: unchanged)"},
             {"max-grad-norm", "X", "spike guard: skip a step with |g| above X; 0 = no bound (default: unchanged)"},
             {"spike-sigma", "X", "spike guard: skip a step whose |g| or loss z-score is above X (default 6)"},
             {"spike-window", "N", "spike guard: the z-score over the last N steps, 2-10000 (default 128)"},
             {"spike-warmup", "N", "spike guard: steps held before the z-score applies (default N/2)"},
             {"spike-off", "", "turn the run's spike guard off"}};
  for (FlagSpec& f : ChangeFlags()) c.flags.push_back(std::move(f));
  c.positionals = 1;
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>& args) -> base::StatusOr<Action> {
    SettingsChange change;
    change.run = args[0];
    GAC_ASSIGN_OR_RETURN(auto lo, OptionalReal(flags, "c-low"));
    GAC_ASSIGN_OR_RETURN(auto hi, OptionalReal(flags, "c-high"));
    change.c_low = lo;
    change.c_high = hi;
    GAC_ASSIGN_OR_RETURN(change.window_c_low, OptionalReal(flags, "window-c-low"));
    GAC_ASSIGN_OR_RETURN(change.window_c_high, OptionalReal(flags, "window-c-high"));
    GAC_RETURN_IF_ERROR(ParseChangeFlags(flags, &change));
    GAC_RETURN_IF_ERROR(ParseSpikeFlags(flags, &change));
    if (change.empty()) {
      return base::Status::InvalidArgument(
          "nothing to change: give --c-low, --c-high, --alpha-mode, --mode, --trigger, --window-steps, "
          "--window-c-low, --window-c-high or a spike guard flag (--max-grad-norm, --spike-sigma, "
          "--spike-window, --spike-warmup, --spike-off)");
    }
    if (!flags.Has("reason") || change.reason.empty()) {
      return base::Status::InvalidArgument("--reason is required: say why, for the audit log");
    }
    return Action([change](Context& ctx) -> base::Status {
      GAC_ASSIGN_OR_RETURN(v1::RunConfig config, ApplyChange(ctx, change));
      ctx.out() << ChangedText(change.run, config);
      return base::Status::Ok();
    });
  };
  return c;
}

// "c_low 0.05 -> 0.04, mode local -> remote".
std::string ChangeText(const v1::RunConfig& before, const v1::RunConfig& after) {
  std::string text;
  auto add = [&](const char* what, const std::string& a, const std::string& b) {
    if (a == b) return;
    text += std::string(text.empty() ? "" : ", ") + what + " " + a + " -> " + b;
  };
  add("c_low", FormatExact(before.thresholds().c_low()), FormatExact(after.thresholds().c_low()));
  add("c_high", FormatExact(before.thresholds().c_high()), FormatExact(after.thresholds().c_high()));
  add("alpha", proto::EnumName(before.thresholds().alpha_mode()), proto::EnumName(after.thresholds().alpha_mode()));
  add("mode", proto::EnumName(before.mode()), proto::EnumName(after.mode()));
  add("trigger", proto::EnumName(before.trigger()), proto::EnumName(after.trigger()));
  add("window", std::to_string(proto::WindowFromProto(before.window())),
      std::to_string(proto::WindowFromProto(after.window())));
  const auto window_of = [](const v1::RunConfig& c) -> const v1::Thresholds& {
    return c.has_window_thresholds() ? c.window_thresholds() : c.thresholds();
  };
  add("window c_low", FormatExact(window_of(before).c_low()), FormatExact(window_of(after).c_low()));
  add("window c_high", FormatExact(window_of(before).c_high()), FormatExact(window_of(after).c_high()));
  add("spike guard", SpikeText(before), SpikeText(after));
  return text.empty() ? "no change" : text;
}

base::Status History(Context& ctx, const std::string& run, Format format) {
  std::vector<Column> columns;
  if (format == Format::kTable) {
    columns = {{"version", "VERSION", true}, {"time", "TIME"}, {"by", "BY"}, {"change", "CHANGE"}, {"reason", "REASON"}};
  } else {
    for (const char* name : {"version", "updated_ns", "updated_by", "c_low", "c_high", "alpha_mode", "mode",
                             "before_version", "before_c_low", "before_c_high", "before_alpha_mode", "before_mode",
                             "reason"}) {
      columns.push_back(Column{name, "", false, 0});
    }
  }
  std::unique_ptr<RowWriter> writer = RowWriter::Create(format, &ctx.out(), columns);
  GAC_RETURN_IF_ERROR(ctx.client().ForEachConfigChangePage(run, [&](const v1::ListConfigChangesResponse& page) {
    for (const v1::ConfigChange& change : page.changes()) {
      const v1::RunConfig& b = change.before();
      const v1::RunConfig& a = change.after();
      if (format == Format::kTable) {
        writer->Add({Cell::Int(static_cast<std::int64_t>(a.version())), Cell::TimeNs(a.updated_ns()),
                     Cell::Text(a.updated_by()), Cell::Text(ChangeText(b, a)), Cell::Text(change.reason())});
      } else {
        writer->Add({Cell::Int(static_cast<std::int64_t>(a.version())), Cell::Int(a.updated_ns()),
                     Cell::Text(a.updated_by()), Cell::Real(a.thresholds().c_low()),
                     Cell::Real(a.thresholds().c_high()), Cell::Text(proto::EnumName(a.thresholds().alpha_mode())),
                     Cell::Text(proto::EnumName(a.mode())), Cell::Int(static_cast<std::int64_t>(b.version())),
                     Cell::Real(b.thresholds().c_low()), Cell::Real(b.thresholds().c_high()),
                     Cell::Text(proto::EnumName(b.thresholds().alpha_mode())), Cell::Text(proto::EnumName(b.mode())),
                     Cell::Text(change.reason())});
      }
    }
    writer->Flush();
    return base::Status::Ok();
  }));
  writer->Flush();
  return base::Status::Ok();
}

CommandSpec ConfigHistoryCommand() {
  CommandSpec c;
  c.name = "config history";
  c.args = "RUN";
  c.summary = "the audit log of a run's settings: who, when, before -> after, why";
  c.description =
      "Oldest first. The table shows version [VERSION], the time of the change in UTC [TIME],\n"
      "the token's name [BY], what changed [CHANGE] and the reason [REASON]. CSV and JSON\n"
      "Lines carry each change in full, in this order:\n"
      "  version, updated_ns, updated_by, c_low, c_high, alpha_mode, mode, before_version,\n"
      "  before_c_low, before_c_high, before_alpha_mode, before_mode, reason\n";
  c.flags = {FormatFlagSpec()};
  c.positionals = 1;
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>& args) -> base::StatusOr<Action> {
    GAC_ASSIGN_OR_RETURN(Format format, FormatFlag(flags));
    return Action([run = args[0], f = format](Context& ctx) { return History(ctx, run, f); });
  };
  return c;
}

// ---- calibrate ----

struct CalibrateOptions {
  std::string run;
  std::uint32_t window = 0;
  bool apply = false;
  bool windowed = false;  // thresholds of |m_t| instead of |c_t|
  int window_steps = 0;   // W of m_t; 0: the run's
  SettingsChange change;  // run = the target
};

// The windowed calibration: |m_t| over rank 0's steps of the run (the last
// `last` records when non-zero), m_t the signed mean of the last W valid c_t,
// computed here from the stored steps. The same rule as for |c_t|.
base::Status CalibrateWindowed(Context& ctx, CalibrateOptions o) {
  GAC_ASSIGN_OR_RETURN(v1::RunConfig source, ctx.client().GetRunConfig(o.run));
  const int w = o.window_steps != 0 ? o.window_steps : proto::WindowFromProto(source.window());
  v1::GetStepsRequest request;
  request.set_run(o.run);
  request.set_rank(0);
  request.set_page_size(10000);
  std::vector<double> cosines;  // of every record, NaN when it has none
  GAC_RETURN_IF_ERROR(ctx.client().ForEachStepPage(request, [&](const v1::GetStepsResponse& page) -> base::Status {
    for (const v1::StepRecord& r : page.steps()) {
      const bool valid = r.has_cosine() && std::isfinite(r.cosine()) && r.regime() != v1::REGIME_INVALID;
      cosines.push_back(valid ? r.cosine() : std::numeric_limits<double>::quiet_NaN());
    }
    if (page.steps_size() > 0) ctx.Progress("gacctl: " + std::to_string(cosines.size()) + " records read");
    if (ctx.interrupted() && !page.next_page_token().empty()) return Interrupted();
    return base::Status::Ok();
  }));
  ctx.EndProgress();
  const std::size_t first = o.window != 0 && cosines.size() > o.window ? cosines.size() - o.window : 0;
  controller::AlignmentWindow window(w);
  std::vector<double> means;
  for (std::size_t i = first; i < cosines.size(); ++i) {
    if (std::isnan(cosines[i])) continue;
    window.Add(cosines[i]);
    if (const std::optional<double> m = window.mean()) means.push_back(*m);
  }
  const v1::Thresholds& current = source.has_window_thresholds() ? source.window_thresholds() : source.thresholds();
  const controller::CalibrationStats stats = controller::ComputeCalibration(means, current.c_low());
  std::ostream& out = ctx.out();
  out << "windowed calibration of " << o.run << ": |m_t|, the signed mean of the last " << w
      << " valid c_t, over rank 0's "
      << (o.window == 0 ? std::string("stored steps") : "last " + std::to_string(o.window) + " steps") << "\n"
      << "  values          " << stats.count << "\n";
  if (stats.count > 0) {
    out << "  q0.9 |m_t|      " << FormatDisplay(stats.q90) << "\n"
        << "  max |m_t|       " << FormatDisplay(stats.max) << "\n"
        << "  mean |m_t|      " << FormatDisplay(stats.mean) << "\n";
  }
  base::StatusOr<controller::Thresholds> suggested = controller::SuggestThresholds(stats);
  if (!suggested.ok()) return base::Status::FailedPrecondition(suggested.status().message());
  out << "suggested         window c_low " << FormatExact(suggested->c_low) << ", window c_high "
      << FormatExact(suggested->c_high) << " (window " << w << ")\n";
  if (!o.apply) {
    out << "to apply them:    gacctl calibrate " << o.run << " --windowed --window-steps " << w
        << " --apply --apply-to RUN [--trigger window] --reason TEXT\n";
    return base::Status::Ok();
  }
  o.change.window_c_low = suggested->c_low;
  o.change.window_c_high = suggested->c_high;
  o.change.window = w;
  if (o.change.reason.empty()) {
    o.change.reason = "gacctl calibrate " + o.run + " --windowed --window-steps " + std::to_string(w) + ": q0.9 " +
                      FormatDisplay(stats.q90) + ", max " + FormatDisplay(stats.max) + " of |m_t| over " +
                      std::to_string(stats.count) + " steps";
  }
  GAC_ASSIGN_OR_RETURN(v1::RunConfig applied, ApplyChange(ctx, o.change));
  out << "applied           " << ChangedText(o.change.run, applied);
  return base::Status::Ok();
}

base::Status Calibrate(Context& ctx, CalibrateOptions o) {
  if (o.windowed) return CalibrateWindowed(ctx, std::move(o));
  GAC_ASSIGN_OR_RETURN(v1::RunSummary summary, ctx.client().GetRunSummary(o.run, o.window));
  const v1::CalibrationSummary& cal = summary.calibration();
  const v1::RunConfig& config = summary.info().config();
  std::ostream& out = ctx.out();
  out << "calibration of " << o.run << ": |c_t| of rank 0 over "
      << (o.window == 0 ? std::string("all stored steps") : "the last " + std::to_string(o.window) + " steps");
  if (summary.has_latest()) out << " (recorded in " << proto::EnumName(summary.latest().mode()) << " mode)";
  out << "\n  values          " << cal.count() << "\n";
  if (cal.count() > 0) {
    out << "  q0.9 |c_t|      " << FormatDisplay(cal.q90()) << "\n"
        << "  max |c_t|       " << FormatDisplay(cal.max()) << "\n"
        << "  mean |c_t|      " << FormatDisplay(cal.mean()) << "\n"
        << "  |c_t| <= c_low  " << Percent(cal.fraction_le_c_low()) << " (the run's c_low "
        << FormatExact(config.thresholds().c_low()) << ")\n";
  }
  if (!cal.has_suggested()) return base::Status::FailedPrecondition(NoSuggestionReason(cal));
  const double lo = cal.suggested().c_low();
  const double hi = cal.suggested().c_high();
  out << "suggested         c_low " << FormatExact(lo) << ", c_high " << FormatExact(hi) << "\n";
  if (!o.apply) {
    out << "to apply them:    gacctl calibrate " << o.run << (o.window ? " --window " + std::to_string(o.window) : "")
        << " --apply --apply-to RUN --reason TEXT\n";
    return base::Status::Ok();
  }
  o.change.c_low = lo;
  o.change.c_high = hi;
  if (o.change.reason.empty()) {
    o.change.reason = "gacctl calibrate " + o.run + (o.window ? " --window " + std::to_string(o.window) : "") +
                      ": q0.9 " + FormatDisplay(cal.q90()) + ", max " + FormatDisplay(cal.max()) + " over " +
                      std::to_string(cal.count()) + " steps";
  }
  GAC_ASSIGN_OR_RETURN(v1::RunConfig applied, ApplyChange(ctx, o.change));
  out << "applied           " << ChangedText(o.change.run, applied);
  return base::Status::Ok();
}

CommandSpec CalibrateCommand() {
  CommandSpec c;
  c.name = "calibrate";
  c.args = "RUN";
  c.summary = "suggest thresholds from a synchronous (monitor-mode) run; --apply sets them on --apply-to RUN2";
  c.description =
      "Reads the calibration statistics of |c_t| over rank 0's steps of RUN (all, or the\n"
      "last --window N; leave out the warm-up, as the paper does with its first 50 steps)\n"
      "and the thresholds they suggest:\n"
      "  c_low  = q0.9 of |c_t|, rounded up to 3 significant digits (at least 0.001)\n"
      "  c_high = max(3 x max |c_t|, 2 x c_low), at most 1\n"
      "RUN should be a synchronous (on-policy) run, in monitor mode so that nothing\n"
      "changed its updates. With fewer than 20 values of c_t there is no suggestion\n"
      "(exit 1, FAILED_PRECONDITION). --apply sets the suggestion on the run named by\n"
      "--apply-to, keeping its alpha mode and mode unless --alpha-mode or --mode is given,\n"
      "with the same version check as 'gacctl config set'. Check what they would have\n"
      "done first: gacctl replay RUN2 --c-low X --c-high Y.\n"
      "--windowed suggests the thresholds of the windowed trigger instead, by the same rule\n"
      "applied to |m_t|, the signed mean of the last W valid c_t (W: --window-steps, else\n"
      "RUN's window), computed from RUN's stored steps; --apply then sets the window\n"
      "thresholds and W (and the trigger, with --trigger window). --window keeps its\n"
      "meaning: the last N steps the statistics are taken over.\n";
  c.flags = {{"window", "N", "statistics over the last N steps of rank 0 (default 0 = all)"},
             {"windowed", "", "thresholds of the windowed statistic |m_t| (see above)"},
             {"apply", "", "set the suggested thresholds on the run named by --apply-to"},
             {"apply-to", "RUN2", "the run --apply changes"},
             DeprecatedFlag("to", "RUN2", "use --apply-to")};
  for (FlagSpec& f : ChangeFlags()) {
    if (f.name == "reason") f.help = "why, for the audit log (default: the statistics used)";
    c.flags.push_back(std::move(f));
  }
  c.positionals = 1;
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>& args) -> base::StatusOr<Action> {
    CalibrateOptions o;
    o.run = args[0];
    GAC_ASSIGN_OR_RETURN(auto window, OptionalInt(flags, "window", 0, UINT32_MAX));
    o.window = static_cast<std::uint32_t>(window.value_or(0));
    o.apply = flags.Has("apply");
    o.windowed = flags.Has("windowed");
    GAC_RETURN_IF_ERROR(ParseChangeFlags(flags, &o.change));
    if (o.change.window) {
      if (!o.windowed) return base::Status::InvalidArgument("--window-steps applies only with --windowed");
      o.window_steps = *o.change.window;
    }
    if (flags.Has("apply-to") && flags.Has("to")) {
      return base::Status::InvalidArgument("give --apply-to or its former name --to, not both");
    }
    const std::string* to = flags.Has("to") ? flags.Get("to") : flags.Get("apply-to");
    if (o.apply && to == nullptr) return base::Status::InvalidArgument("--apply needs --apply-to RUN2, the run to change");
    if (!o.apply) {
      for (const char* f : {"apply-to", "to", "alpha-mode", "mode", "trigger", "reason", "expected-version"}) {
        if (flags.Has(f)) return base::Status::InvalidArgument(std::string("--") + f + " applies only with --apply");
      }
    }
    if (to != nullptr) o.change.run = *to;
    return Action([o](Context& ctx) { return Calibrate(ctx, o); });
  };
  return c;
}

}  // namespace

std::vector<CommandSpec> ConfigCommands() {
  return {ConfigGetCommand(), ConfigSetCommand(), ConfigHistoryCommand(), CalibrateCommand()};
}

}  // namespace gac::cli
