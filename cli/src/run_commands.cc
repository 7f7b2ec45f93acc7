// gacctl runs, show and health.
#include <algorithm>
#include <map>
#include <utility>

#include "cli/src/commands.h"

namespace gac::cli {
namespace {

std::vector<Column> RunColumns() {
  return {
      {"run", "RUN"},
      {"first_step", "FIRST", true},
      {"last_step", "LAST", true},
      {"step_records", "RECORDS", true},
      {"world_size", "RANKS", true},
      {"last_seen_ns", "LAST_REPORT", true},
      {"cosine", "C_T", true},
      {"regime", "REGIME"},
      {"step_mode", "STEP_MODE"},
      {"mode", "MODE"},
      {"c_low", "C_LOW", true},
      {"c_high", "C_HIGH", true},
      {"alpha_mode", "ALPHA"},
      {"version", "VERSION", true},
  };
}

// A step's regime; in the table, a monitor-mode step's reads as what GAC
// would have done ("would skip"): nothing was applied.
Cell RegimeCell(const v1::StepRecord& r) {
  return Cell::Text(proto::EnumName(r.regime())).WithDisplay(proto::RegimeInModeName(r.regime(), r.mode()));
}

std::vector<Cell> RunRow(const v1::RunInfo& info, std::int64_t now_ns) {
  const v1::RunConfig& config = info.config();
  const v1::StepRecord* latest = info.has_latest() ? &info.latest() : nullptr;
  return {
      Cell::Text(info.run()),
      Cell::Int(info.first_step()),
      Cell::Int(info.last_step()),
      Cell::Int(static_cast<std::int64_t>(info.step_records())),
      Cell::Int(info.world_size()),
      Cell::Int(info.last_seen_ns()).WithDisplay(FormatAge(now_ns - info.last_seen_ns()) + " ago"),
      latest != nullptr && latest->has_cosine() ? Cell::Real(latest->cosine()) : Cell(),
      latest != nullptr ? RegimeCell(*latest) : Cell(),
      latest != nullptr ? Cell::Text(proto::EnumName(latest->mode())) : Cell(),
      Cell::Text(proto::EnumName(config.mode())),
      Cell::Real(config.thresholds().c_low()),
      Cell::Real(config.thresholds().c_high()),
      Cell::Text(proto::EnumName(config.thresholds().alpha_mode())),
      Cell::Int(static_cast<std::int64_t>(config.version())),
  };
}

base::Status ListRuns(Context& ctx, Format format) {
  std::unique_ptr<RowWriter> writer = RowWriter::Create(format, &ctx.out(), RunColumns());
  const std::int64_t now = ctx.NowNs();
  // One call per page: each run's latest step (of rank 0) comes with it.
  v1::ListRunsRequest request;
  request.set_include_latest(true);
  const base::Status st = ctx.client().ForEachRunPage(request, [&](const v1::ListRunsResponse& page) -> base::Status {
    if (ctx.interrupted()) return Interrupted();
    for (const v1::RunInfo& info : page.runs()) writer->Add(RunRow(info, now));
    writer->Flush();
    return base::Status::Ok();
  });
  if (!st.ok()) return st;
  writer->Flush();
  return base::Status::Ok();
}

CommandSpec RunsCommand() {
  CommandSpec c;
  c.name = "runs";
  c.summary = "the runs: steps, ranks, last report, latest c_t and regime, settings";
  c.description =
      "One row per run the token may read, in run id order.\n\n"
      "columns (csv and jsonl names; the table's header in brackets):\n"
      "  run [RUN], first_step [FIRST], last_step [LAST], step_records [RECORDS]: stored\n"
      "    records over all ranks, world_size [RANKS], last_seen_ns [LAST_REPORT]: when gacd\n"
      "    received the last record (ns since the Unix epoch; the table shows its age),\n"
      "  cosine [C_T], regime [REGIME], step_mode [STEP_MODE]: of rank 0's latest step, and\n"
      "    the mode the agent ran it in; in monitor mode the regime is what GAC would have\n"
      "    done (the table says \"would skip\"), never an applied decision,\n"
      "  mode [MODE], c_low [C_LOW], c_high [C_HIGH], alpha_mode [ALPHA], version [VERSION]:\n"
      "    the run's settings and their version (0 = gacd's defaults, never set).\n";
  c.flags = {FormatFlagSpec()};
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>&) -> base::StatusOr<Action> {
    GAC_ASSIGN_OR_RETURN(Format format, FormatFlag(flags));
    return Action([f = format](Context& ctx) { return ListRuns(ctx, f); });
  };
  return c;
}

// Aligned "key  value" lines.
class KeyValues {
 public:
  void Add(std::string key, std::string value) { lines_.emplace_back(std::move(key), std::move(value)); }
  void Write(std::ostream& out) const {
    std::size_t width = 0;
    for (const auto& [k, v] : lines_) width = std::max(width, k.size());
    for (const auto& [k, v] : lines_) {
      std::string line = k + std::string(width - k.size() + 2, ' ') + v;
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out << line << "\n";
    }
  }

 private:
  std::vector<std::pair<std::string, std::string>> lines_;
};

std::string ScalarsText(const v1::StepRecord& r) {
  std::map<std::string, double> sorted(r.scalars().begin(), r.scalars().end());
  std::string text;
  for (const auto& [name, value] : sorted) text += ", " + name + " " + FormatDisplay(value);
  return text;
}

std::string StepText(const v1::StepRecord& r) {
  std::string text = "c_t " + (r.has_cosine() ? FormatDisplay(r.cosine()) : std::string("-")) + ", " +
                     proto::EnumName(r.regime()) + ", alpha " + FormatDisplay(r.alpha()) + ", |g| " +
                     FormatDisplay(r.grad_norm()) + ", |p| " + FormatDisplay(r.ref_norm());
  if (r.has_staleness()) text += ", staleness " + std::to_string(r.staleness());
  return text + ScalarsText(r);
}

base::Status ShowRun(Context& ctx, const std::string& run, std::uint32_t window) {
  GAC_ASSIGN_OR_RETURN(v1::RunSummary summary, ctx.client().GetRunSummary(run, window));
  const v1::RunInfo& info = summary.info();
  const v1::RunConfig& config = info.config();
  const v1::CalibrationSummary& cal = summary.calibration();
  const std::string over = window == 0 ? "all steps of rank 0" : "the last " + std::to_string(window) + " steps of rank 0";
  KeyValues kv;
  kv.Add("run", info.run());
  kv.Add("steps", std::to_string(info.first_step()) + " to " + std::to_string(info.last_step()) + ", " +
                      std::to_string(info.step_records()) + " records from " + std::to_string(info.world_size()) +
                      (info.world_size() == 1 ? " rank" : " ranks"));
  kv.Add("first seen", FormatTimeUtc(info.first_seen_ns()));
  kv.Add("last report",
         FormatTimeUtc(info.last_seen_ns()) + " (" + FormatAge(ctx.NowNs() - info.last_seen_ns()) + " ago)");
  kv.Add("settings", SettingsText(config));
  kv.Add("version", config.version() == 0 ? "0 (gacd's defaults, never set)"
                                          : std::to_string(config.version()) + ", set " +
                                                FormatTimeUtc(config.updated_ns()) + " by " + config.updated_by());
  const auto& by_regime = summary.steps_by_regime();
  std::string regimes;
  for (controller::Regime r : controller::kAllRegimes) {
    auto it = by_regime.find(controller::RegimeName(r));
    regimes += std::string(regimes.empty() ? "" : ", ") + controller::RegimeName(r) + " " +
               std::to_string(it == by_regime.end() ? 0 : it->second);
  }
  kv.Add("regimes", regimes + " (" + over + ")");
  kv.Add("calibration", "|c_t| over " + over + ": " + std::to_string(cal.count()) + " values");
  if (cal.count() > 0) {
    kv.Add("  q0.9", FormatDisplay(cal.q90()));
    kv.Add("  max", FormatDisplay(cal.max()));
    kv.Add("  mean", FormatDisplay(cal.mean()));
    kv.Add("  <= c_low", Percent(cal.fraction_le_c_low()) + " (c_low " + FormatExact(config.thresholds().c_low()) + ")");
  }
  if (cal.has_suggested()) {
    kv.Add("  suggested", "c_low " + FormatExact(cal.suggested().c_low()) + ", c_high " +
                              FormatExact(cal.suggested().c_high()) + " (gacctl calibrate " + info.run() + ")");
  } else {
    kv.Add("  suggested", "none: " + NoSuggestionReason(cal));
  }
  if (summary.has_latest()) {
    const v1::StepRecord& r = summary.latest();
    kv.Add("latest step", std::to_string(r.step()) + " (rank 0, " +
                              (r.wall_time_ns() != 0 ? FormatTimeUtc(r.wall_time_ns()) + ", " : std::string()) +
 std::string(proto::EnumName(r.mode())) + " mode" + (r.fallback() ? ", local fallback" : "") +
                              "): " + StepText(r));
  } else {
    kv.Add("latest step", "none of rank 0");
  }
  kv.Write(ctx.out());
  return base::Status::Ok();
}

CommandSpec ShowCommand() {
  CommandSpec c;
  c.name = "show";
  c.args = "RUN";
  c.summary = "a run's summary: regime counts, calibration statistics, settings, latest step";
  c.description =
      "Regime counts and the calibration statistics of |c_t| (q0.9, max, mean and the\n"
      "fraction at or below the run's c_low, as in the paper's Table 3) are over rank 0's\n"
      "steps: all of them, or the last N with --window. 'suggested' are the thresholds\n"
      "those statistics give (gacctl calibrate --help has the rule).\n";
  c.flags = {{"window", "N", "statistics over the last N steps of rank 0 (default 0 = all)"}};
  c.positionals = 1;
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>& args) -> base::StatusOr<Action> {
    GAC_ASSIGN_OR_RETURN(auto window, OptionalInt(flags, "window", 0, UINT32_MAX));
    const auto w = static_cast<std::uint32_t>(window.value_or(0));
    return Action([run = args[0], w](Context& ctx) { return ShowRun(ctx, run, w); });
  };
  return c;
}

base::Status Health(Context& ctx, const std::string& service) {
  GAC_ASSIGN_OR_RETURN(grpc::health::v1::HealthCheckResponse health, ctx.client().Health(service));
  const std::string name = grpc::health::v1::HealthCheckResponse_ServingStatus_Name(health.status());
  ctx.out() << name << "\n";
  if (health.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return base::Status::Unavailable(ctx.client().options().address + " is " + name);
  }
  return base::Status::Ok();
}

CommandSpec HealthCommand() {
  CommandSpec c;
  c.name = "health";
  c.summary = "gacd's grpc.health.v1 status (exit 0 only when SERVING)";
  c.description =
      "Prints SERVING, NOT_SERVING or UNKNOWN. gacd reports NOT_SERVING while it drains\n"
      "after SIGTERM; the exit status is 1 for anything but SERVING.\n";
  c.flags = {{"service", "NAME", "the service to ask about (default \"\": gacd as a whole)"}};
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>&) -> base::StatusOr<Action> {
    const std::string* service = flags.Get("service");
    return Action([s = service ? *service : std::string()](Context& ctx) { return Health(ctx, s); });
  };
  return c;
}

}  // namespace

std::vector<CommandSpec> RunCommands() { return {RunsCommand(), ShowCommand(), HealthCommand()}; }

}  // namespace gac::cli
