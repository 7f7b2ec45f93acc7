// gacctl config get|set|history and calibrate.
#include "cli/src/commands.h"
#include "gac/proto/convert.h"

namespace gac::cli {
namespace {

void WriteConfig(std::ostream& out, const std::string& run, const v1::RunConfig& config) {
  out << "run         " << run << "\n"
      << "c_low       " << FormatExact(config.thresholds().c_low()) << "\n"
      << "c_high      " << FormatExact(config.thresholds().c_high()) << "\n"
      << "alpha_mode  " << proto::EnumName(config.thresholds().alpha_mode()) << "\n"
      << "mode        " << proto::EnumName(config.mode()) << "\n";
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
  std::string reason;
  std::optional<std::uint64_t> expected_version;

  bool complete() const { return c_low && c_high && alpha_mode && mode; }
};

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
  if (!change.complete()) {
    GAC_ASSIGN_OR_RETURN(v1::RunConfig current, ctx.client().GetRunConfig(change.run));
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
    expected = current.version();
  }
  if (change.c_low) t.c_low = *change.c_low;
  if (change.c_high) t.c_high = *change.c_high;
  if (change.alpha_mode) alpha = *change.alpha_mode;
  if (change.mode) mode = *change.mode;
  if (change.expected_version) expected = *change.expected_version;
  *request.mutable_thresholds() = proto::ToProto(t, alpha);
  request.set_mode(proto::ToProto(mode));
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
      {"reason", "TEXT", "why, for the audit log (required)"},
      {"expected-version", "N", "apply only if the run's settings are at version N (else ABORTED)"},
  };
}

CommandSpec ConfigSetCommand() {
  CommandSpec c;
  c.name = "config set";
  c.args = "RUN";
  c.summary = "change a run's thresholds, alpha mode or mode (needs admin rights)";
  c.description =
      "Settings not given keep their current value: gacctl reads them, and the change\n"
      "then applies only if the run's settings are still at the version it read. With\n"
      "--expected-version N it applies only at version N. Otherwise gacd refuses with\n"
      "ABORTED and nothing changes. gacd validates the thresholds (0 < c_low < c_high <= 1)\n"
      "and its error is shown as it is. gacd answers once the change and its audit record\n"
      "are durable; agents in remote mode use it from their next Decide. The token needs\n"
      "admin rights on RUN, and read rights too when settings are left out.\n";
  c.flags = {{"c-low", "X", "|c_t| at or below: safe (default: unchanged)"},
             {"c-high", "X", "|c_t| at or above: skip (default: unchanged)"}};
  for (FlagSpec& f : ChangeFlags()) c.flags.push_back(std::move(f));
  c.positionals = 1;
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>& args) -> base::StatusOr<Action> {
    SettingsChange change;
    change.run = args[0];
    GAC_ASSIGN_OR_RETURN(auto lo, OptionalReal(flags, "c-low"));
    GAC_ASSIGN_OR_RETURN(auto hi, OptionalReal(flags, "c-high"));
    change.c_low = lo;
    change.c_high = hi;
    GAC_RETURN_IF_ERROR(ParseChangeFlags(flags, &change));
    if (!change.c_low && !change.c_high && !change.alpha_mode && !change.mode) {
      return base::Status::InvalidArgument("nothing to change: give --c-low, --c-high, --alpha-mode or --mode");
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
  SettingsChange change;  // run = the target
};

base::Status Calibrate(Context& ctx, CalibrateOptions o) {
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
      "done first: gacctl replay RUN2 --c-low X --c-high Y.\n";
  c.flags = {{"window", "N", "statistics over the last N steps of rank 0 (default 0 = all)"},
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
    GAC_RETURN_IF_ERROR(ParseChangeFlags(flags, &o.change));
    if (flags.Has("apply-to") && flags.Has("to")) {
      return base::Status::InvalidArgument("give --apply-to or its former name --to, not both");
    }
    const std::string* to = flags.Has("to") ? flags.Get("to") : flags.Get("apply-to");
    if (o.apply && to == nullptr) return base::Status::InvalidArgument("--apply needs --apply-to RUN2, the run to change");
    if (!o.apply) {
      for (const char* f : {"apply-to", "to", "alpha-mode", "mode", "reason", "expected-version"}) {
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
