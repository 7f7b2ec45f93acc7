// gacctl replay: GAC's decisions on a recorded run with other thresholds.
#include "cli/src/commands.h"
#include "gac/cli/replay.h"
#include "gac/proto/convert.h"

namespace gac::cli {
namespace {

constexpr std::uint32_t kReplayPage = 5000;

struct ReplayOptions {
  std::string run;
  std::vector<controller::Thresholds> pairs;  // one, or the grid's
  controller::AlphaMode alpha = controller::AlphaMode::kPaper;
  bool grid = false;
  bool per_step = false;
  std::int64_t from = 0;
  std::int64_t end = 0;  // exclusive; 0 = no limit
  std::size_t max_diffs = 20;  // kept for the summary; SIZE_MAX = all
  Format format = Format::kTable;
};

std::string OptionalStep(const std::optional<std::int64_t>& step) { return step ? std::to_string(*step) : "-"; }

std::string OptionalReal(const std::optional<double>& v) { return v ? FormatDisplay(*v) : "-"; }

std::string LongestSkip(const RegimeSeries& s) {
  if (s.longest_skip() == 0) return "0";
  return std::to_string(s.longest_skip()) + " from " + std::to_string(*s.longest_skip_first());
}

std::vector<Column> PerStepColumns() {
  return {{"step", "STEP", true},
          {"cosine", "C_T", true},
          {"recorded_regime", "RECORDED"},
          {"recorded_alpha", "RECORDED_ALPHA", true},
          {"regime", "REPLAYED"},
          {"alpha", "REPLAYED_ALPHA", true},
          {"differs", "DIFFERS"}};
}

std::vector<Column> GridColumns() {
  return {{"c_low", "C_LOW", true},
          {"c_high", "C_HIGH", true},
          {"alpha_mode", "ALPHA"},
          {"steps", "STEPS", true},
          {"safe", "SAFE", true},
          {"project", "PROJECT", true},
          {"skip", "SKIP", true},
          {"invalid", "INVALID", true},
          {"first_project", "FIRST_PROJECT", true},
          {"first_skip", "FIRST_SKIP", true},
          {"longest_skip", "LONGEST_SKIP", true},
          {"longest_skip_first", "FROM", true},
          {"mean_project_alpha", "MEAN_ALPHA", true},
          {"differing", "DIFFERING", true}};
}

Cell StepCell(const std::optional<std::int64_t>& step) { return step ? Cell::Int(*step) : Cell(); }

void WriteSummary(std::ostream& out, const ReplayOptions& o, const Replayer& r, std::int64_t first,
                  std::int64_t last) {
  const controller::Thresholds& t = r.controller().thresholds();
  out << "replay of " << o.run << ", rank 0: " << r.steps() << " steps (" << first << " to " << last
      << ") with c_low " << FormatExact(t.c_low) << ", c_high " << FormatExact(t.c_high) << ", alpha "
      << controller::AlphaModeName(r.controller().mode()) << "\n\n";
  std::unique_ptr<RowWriter> table =
      RowWriter::Create(Format::kTable, &out, {{"what", " "}, {"recorded", "RECORDED", true}, {"replayed", "REPLAYED", true}});
  for (controller::Regime regime : controller::kAllRegimes) {
    table->Add({Cell::Text(controller::RegimeName(regime)), Cell::Int(static_cast<std::int64_t>(r.recorded().count(regime))),
                Cell::Int(static_cast<std::int64_t>(r.replayed().count(regime)))});
  }
  table->Add({Cell::Text("first project step"), Cell::Text(OptionalStep(r.recorded().first_project())),
              Cell::Text(OptionalStep(r.replayed().first_project()))});
  table->Add({Cell::Text("first skip step"), Cell::Text(OptionalStep(r.recorded().first_skip())),
              Cell::Text(OptionalStep(r.replayed().first_skip()))});
  table->Add({Cell::Text("longest skip run"), Cell::Text(LongestSkip(r.recorded())),
              Cell::Text(LongestSkip(r.replayed()))});
  table->Add({Cell::Text("mean alpha (project)"), Cell::Text(OptionalReal(r.mean_recorded_project_alpha())),
              Cell::Text(OptionalReal(r.mean_project_alpha()))});
  table->Flush();
  out << "\nsteps whose regime differs from the recorded one: " << r.differing_count();
  if (r.differing_count() == 0) {
    out << "\n";
    return;
  }
  if (r.differing().size() < r.differing_count()) {
    out << " (the first " << r.differing().size() << "; --max-diffs 0 lists all)";
  }
  out << "\n";
  std::vector<Column> columns = PerStepColumns();
  columns.pop_back();  // all of them differ
  std::unique_ptr<RowWriter> diffs = RowWriter::Create(Format::kTable, &out, std::move(columns));
  for (const DifferingStep& d : r.differing()) {
    diffs->Add({Cell::Int(d.step), Cell::Optional(d.cosine), Cell::Text(controller::RegimeName(d.recorded)),
                Cell::Real(d.recorded_alpha), Cell::Text(controller::RegimeName(d.replayed)), Cell::Real(d.replayed_alpha)});
  }
  diffs->Flush();
}

base::Status Replay(Context& ctx, const ReplayOptions& o) {
  std::vector<Replayer> replayers;
  for (const controller::Thresholds& t : o.pairs) {
    GAC_ASSIGN_OR_RETURN(controller::Controller controller, controller::Controller::Create(t, o.alpha));
    replayers.emplace_back(controller, o.grid ? 0 : o.max_diffs);
  }
  std::unique_ptr<RowWriter> per_step;
  if (o.per_step) per_step = RowWriter::Create(o.format, &ctx.out(), PerStepColumns());

  v1::GetStepsRequest request;
  request.set_run(o.run);
  request.set_rank(0);
  request.set_start_step(o.from);
  request.set_end_step(o.end);
  request.set_page_size(kReplayPage);
  std::optional<std::int64_t> first, last;
  GAC_RETURN_IF_ERROR(ctx.client().ForEachStepPage(request, [&](const v1::GetStepsResponse& page) -> base::Status {
    for (const v1::StepRecord& r : page.steps()) {
      base::StatusOr<controller::Regime> regime = proto::FromProto(r.regime());
      if (!regime.ok()) return regime.status().WithPrefix("step " + std::to_string(r.step()) + " of " + o.run);
      RecordedStep step;
      step.step = r.step();
      if (r.has_cosine()) step.cosine = r.cosine();
      step.regime = *regime;
      step.alpha = r.alpha();
      if (!first) first = step.step;
      last = step.step;
      for (Replayer& replayer : replayers) {
        const ReplayedDecision d = replayer.Add(step);
        if (per_step) {
          per_step->Add({Cell::Int(step.step), Cell::Optional(step.cosine), Cell::Text(controller::RegimeName(step.regime)),
                         Cell::Real(step.alpha), Cell::Text(controller::RegimeName(d.regime)), Cell::Real(d.alpha),
                         Cell::Bool(d.regime != step.regime)});
        }
      }
    }
    if (per_step) per_step->Flush();
    if (last) ctx.Progress("gacctl: replayed " + std::to_string(replayers[0].steps()) + " steps, at step " +
                           std::to_string(*last));
    if (ctx.interrupted() && !page.next_page_token().empty()) return Interrupted();
    return base::Status::Ok();
  }));
  ctx.EndProgress();
  if (per_step) {
    per_step->Flush();
    return base::Status::Ok();
  }
  std::ostream& out = ctx.out();
  if (!first) {
    out << "replay of " << o.run << ", rank 0: no stored steps" << (o.from > 0 || o.end > 0 ? " in the range" : "")
        << "\n";
    return base::Status::Ok();
  }
  if (!o.grid) {
    WriteSummary(out, o, replayers[0], *first, *last);
    return base::Status::Ok();
  }
  if (o.format == Format::kTable) {
    out << "replay grid of " << o.run << ", rank 0: " << replayers[0].steps() << " steps (" << *first << " to "
        << *last << "), alpha " << controller::AlphaModeName(o.alpha) << "\n\n";
  }
  std::unique_ptr<RowWriter> grid = RowWriter::Create(o.format, &out, GridColumns());
  for (const Replayer& r : replayers) {
    const RegimeSeries& s = r.replayed();
    grid->Add({Cell::Real(r.controller().thresholds().c_low), Cell::Real(r.controller().thresholds().c_high),
               Cell::Text(controller::AlphaModeName(r.controller().mode())), Cell::Int(static_cast<std::int64_t>(r.steps())),
               Cell::Int(static_cast<std::int64_t>(s.count(controller::Regime::kSafe))),
               Cell::Int(static_cast<std::int64_t>(s.count(controller::Regime::kProject))),
               Cell::Int(static_cast<std::int64_t>(s.count(controller::Regime::kSkip))),
               Cell::Int(static_cast<std::int64_t>(s.count(controller::Regime::kInvalid))), StepCell(s.first_project()),
               StepCell(s.first_skip()), Cell::Int(static_cast<std::int64_t>(s.longest_skip())),
               StepCell(s.longest_skip_first()), Cell::Optional(r.mean_project_alpha()),
               Cell::Int(static_cast<std::int64_t>(r.differing_count()))});
  }
  grid->Flush();
  return base::Status::Ok();
}

CommandSpec ReplayCommand() {
  CommandSpec c;
  c.name = "replay";
  c.args = "RUN";
  c.summary = "what GAC would have decided on a recorded run with other thresholds (--grid: many)";
  c.description =
      "For every stored step of rank 0, the regime and alpha GAC chooses with the given\n"
      "thresholds. This is exact: a step's regime depends only on its recorded c_t and the\n"
      "thresholds (steps without a c_t are safe, invalid ones stay invalid). What the run\n"
      "would have done afterwards, with other updates, is not in the record.\n\n"
      "The summary compares the recorded and replayed regime counts, the first project\n"
      "and the first skip step, the longest run of skips (consecutive step numbers) and\n"
      "the mean alpha of the project steps, then lists the steps whose regime differs\n"
      "(none when the thresholds are the ones the run was recorded with).\n\n"
      "--grid takes comma-separated lists (--c-low 0.03,0.05,0.07 --c-high 0.2,0.3,0.4) and\n"
      "prints one row per pair with c_low < c_high, from one read of the run:\n"
      "  c_low, c_high, alpha_mode, steps, safe, project, skip, invalid, first_project,\n"
      "  first_skip, longest_skip, longest_skip_first [FROM], mean_project_alpha, differing\n"
      "--steps prints one row per step instead of the summary:\n"
      "  step, cosine, recorded_regime, recorded_alpha, regime, alpha, differs\n";
  c.flags = {
      {"c-low", "X", "|c_t| at or below: safe (with --grid, a list)"},
      {"c-high", "X", "|c_t| at or above: skip (with --grid, a list)"},
      {"alpha-mode", "paper|exact", "how alpha is chosen in the projection band (default paper)"},
      {"grid", "", "evaluate every (c_low, c_high) pair of the two lists"},
  };
  for (FlagSpec& f : StepRangeFlagSpecs()) c.flags.push_back(std::move(f));
  c.flags.insert(c.flags.end(), {
      {"steps", "", "one row per step instead of the summary"},
      {"max-diffs", "N", "differing steps listed in the summary (default 20; 0 = all)"},
      {"format", "table|csv|jsonl", "output format of --grid and --steps (default table)"},
  });
  c.positionals = 1;
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>& args) -> base::StatusOr<Action> {
    ReplayOptions o;
    o.run = args[0];
    o.grid = flags.Has("grid");
    o.per_step = flags.Has("steps");
    const std::string* lo = flags.Get("c-low");
    const std::string* hi = flags.Get("c-high");
    if (lo == nullptr || hi == nullptr) return base::Status::InvalidArgument("--c-low and --c-high are required");
    if (o.grid) {
      if (o.per_step) return base::Status::InvalidArgument("--steps and --grid exclude each other");
      GAC_ASSIGN_OR_RETURN(auto lows, ParseRealListFlag("--c-low", *lo));
      GAC_ASSIGN_OR_RETURN(auto highs, ParseRealListFlag("--c-high", *hi));
      GAC_ASSIGN_OR_RETURN(auto pairs, ThresholdGrid(lows, highs));
      o.pairs = pairs;
    } else {
      if (lo->find(',') != std::string::npos || hi->find(',') != std::string::npos) {
        return base::Status::InvalidArgument("a list of thresholds needs --grid");
      }
      GAC_ASSIGN_OR_RETURN(auto l, ParseRealFlag("--c-low", *lo));
      GAC_ASSIGN_OR_RETURN(auto h, ParseRealFlag("--c-high", *hi));
      const controller::Thresholds t{l, h};
      GAC_RETURN_IF_ERROR(controller::ValidateThresholds(t));
      o.pairs = {t};
    }
    if (const std::string* a = flags.Get("alpha-mode")) {
      base::StatusOr<controller::AlphaMode> m = controller::ParseAlphaMode(a->c_str());
      if (!m.ok()) return base::Status::InvalidArgument("--alpha-mode: " + m.status().message());
      o.alpha = *m;
    }
    GAC_RETURN_IF_ERROR(StepRangeFlags(flags, &o.from, &o.end));
    GAC_ASSIGN_OR_RETURN(auto diffs, OptionalInt(flags, "max-diffs", 0, INT64_MAX));
    if (diffs && (o.grid || o.per_step)) return base::Status::InvalidArgument("--max-diffs applies only to the summary");
    if (diffs) o.max_diffs = *diffs == 0 ? SIZE_MAX : static_cast<std::size_t>(*diffs);
    GAC_ASSIGN_OR_RETURN(Format format, FormatFlag(flags));
    if (flags.Has("format") && !o.grid && !o.per_step) {
      return base::Status::InvalidArgument("--format applies to --grid and --steps");
    }
    o.format = format;
    return Action([o](Context& ctx) { return Replay(ctx, o); });
  };
  return c;
}

}  // namespace

std::vector<CommandSpec> ReplayCommands() { return {ReplayCommand()}; }

}  // namespace gac::cli
