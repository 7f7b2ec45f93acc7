// gacctl steps and tail.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "cli/src/commands.h"
#include "gac/proto/record_schema.h"
#include "gac/proto/step_window.h"
#include "gac/proto/wire_rules.h"

namespace gac::cli {
namespace {

// Records per GetSteps page: a page of records without layers is about
// 1 MB; with layers (up to 4096 a record) pages are kept short.
constexpr std::uint32_t kStepPage = 5000;
constexpr std::uint32_t kLayerPage = 200;

// The step row's columns are the record schema's fields
// (gac/proto/record_schema.h), after `run`, in gacctl's order: the fields
// named here first, then any other field of the table in its order, so a
// field added to the table is a column without an edit here. A field's table
// header is its name in capitals unless named here.
struct ColumnLook {
  const char* field;
  const char* table_header;  // nullptr: the name in capitals
};
constexpr ColumnLook kColumnLooks[] = {
    {"step", nullptr},        {"rank", nullptr},         {"world_size", "WORLD"},
    {"wall_time_ns", "WALL_TIME"}, {"mode", nullptr},    {"regime", nullptr},
    {"cosine", "C_T"},        {"cosine_after", "C_AFTER"}, {"alpha", nullptr},
    {"grad_norm", "|G|"},     {"ref_norm", "|P|"},       {"staleness", nullptr},
    {"fallback", nullptr},
};

std::string Capitals(std::string text) {
  for (char& ch : text) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return text;
}

// The schema's fields in column order, with their table headers.
const std::vector<std::pair<const proto::StepField*, std::string>>& StepFieldColumns() {
  static const auto* columns = [] {
    auto* out = new std::vector<std::pair<const proto::StepField*, std::string>>();
    std::set<std::string> placed;
    for (const ColumnLook& look : kColumnLooks) {
      const proto::StepField* f = proto::FindStepField(look.field);
      if (f == nullptr) continue;  // a field the schema no longer has
      out->emplace_back(f, look.table_header != nullptr ? look.table_header : Capitals(f->name));
      placed.insert(f->name);
    }
    for (const proto::StepField& f : proto::kStepFields) {
      if (placed.count(f.name) == 0) out->emplace_back(&f, Capitals(f.name));
    }
    return out;
  }();
  return *columns;
}

// The columns of a step row, before the scalars: run, the stored fields,
// then m_t, which gacctl computes (gac/proto/step_window.h).
std::vector<Column> StepColumns() {
  std::vector<Column> columns = {{"run", "RUN"}};
  for (const auto& [f, header] : StepFieldColumns()) {
    const bool numeric = f->type == proto::FieldType::kInteger || f->type == proto::FieldType::kReal;
    columns.push_back({f->name, header, numeric && f->unit != std::string("ns")});
  }
  columns.push_back({"window_mean", "M_T", true});
  return columns;
}

// How a monitor-mode step's regime reads in a table.
enum class MonitorRegime { kWouldHave, kAsRecorded };

// One field of `r` as a cell: by the field's type; a time in ns since the
// epoch as a UTC time; an enum as its name (a monitor-mode step's regime
// shown, by default, as what GAC would have done).
Cell FieldCell(const proto::StepField& f, const v1::StepRecord& r,
               MonitorRegime monitor = MonitorRegime::kWouldHave) {
  const proto::FieldValue v = f.get(r);
  if (!v.present) return Cell();
  switch (f.type) {
    case proto::FieldType::kInteger:
      return f.json_string && f.unit == std::string("ns") ? Cell::TimeNs(v.integer) : Cell::Int(v.integer);
    case proto::FieldType::kReal:
      return Cell::Real(v.real);
    case proto::FieldType::kBool:
      return Cell::Bool(v.integer != 0);
    case proto::FieldType::kEnum: {
      Cell cell = Cell::Text(f.enum_name(v.integer));
      if (f.name == std::string("regime") && monitor == MonitorRegime::kWouldHave) {
        return std::move(cell).WithDisplay(proto::RegimeInModeName(r.regime(), r.mode()));
      }
      return cell;
    }
    case proto::FieldType::kText:
      break;
  }
  return Cell();
}

std::vector<Cell> StepCells(const v1::StepRecord& r, std::optional<double> window_mean) {
  std::vector<Cell> cells = {Cell::Text(r.run())};
  for (const auto& [f, header] : StepFieldColumns()) cells.push_back(FieldCell(*f, r));
  cells.push_back(window_mean ? Cell::Real(*window_mean) : Cell());
  return cells;
}

// The help's paragraph on the step columns, from the schema.
std::string StepColumnsHelp() {
  std::string text = "  run [RUN]";
  for (const auto& [f, header] : StepFieldColumns()) {
    text += ",\n  " + std::string(f->name) + " [" + header + "]: " + f->help;
    if (f->unit[0] != '\0') text += " (" + std::string(f->unit) + ")";
  }
  return text +
         ",\n  window_mean [M_T]: m_t, the signed mean of the rank's last W cosines up to\n"
         "  this step (W: the run's window setting now; steps without a cosine do not enter;\n"
         "  empty until W cosines), as gac_window_mean,\n";
}

std::vector<Column> LayerColumns() {
  return {
      {"run", "RUN"},        {"step", "STEP", true},        {"rank", "RANK", true},
      {"layer", "LAYER"},    {"cosine", "C_T", true},       {"grad_norm", "|G|", true},
      {"ref_norm", "|P|", true},
  };
}

std::map<std::string, double> SortedScalars(const v1::StepRecord& r) {
  return std::map<std::string, double>(r.scalars().begin(), r.scalars().end());
}

std::string ScalarColumn(const std::string& name) { return "scalar." + name; }

// Writes step records as rows, choosing the scalar columns from the first
// page (or --scalars); scalars outside them go to other_scalars as a JSON
// object, so nothing is dropped. JSON Lines writes every scalar as its own
// "scalar.NAME" key.
class StepRows {
 public:
  StepRows(Context& ctx, Format format, bool layers, std::optional<std::vector<std::string>> scalars)
      : ctx_(ctx), format_(format), layers_(layers), scalars_(std::move(scalars)) {}

  // `window_means`: m_t of each record of the page, index for index (step
  // rows only).
  void AddPage(const v1::GetStepsResponse& page, const std::vector<std::optional<double>>& window_means) {
    if (!writer_) Start(&page);
    for (int i = 0; i < page.steps_size(); ++i) {
      const v1::StepRecord& r = page.steps(i);
      if (layers_) {
        for (const v1::LayerRecord& l : r.layers()) {
          writer_->Add({Cell::Text(r.run()), Cell::Int(r.step()), Cell::Int(r.rank()), Cell::Text(l.name()),
                        l.has_cosine() ? Cell::Real(l.cosine()) : Cell(), Cell::Real(l.grad_norm()),
                        Cell::Real(l.ref_norm())});
        }
        continue;
      }
      AddStep(r, window_means.at(static_cast<std::size_t>(i)));
    }
    writer_->Flush();
  }

  // Writes the header of an empty export.
  void Finish() {
    if (!writer_) Start(nullptr);
    writer_->Flush();
  }

 private:
  void Start(const v1::GetStepsResponse* first) {
    std::vector<Column> columns = layers_ ? LayerColumns() : StepColumns();
    if (!layers_ && format_ != Format::kJsonl) {
      if (!scalars_) {
        std::set<std::string> names;
        if (first != nullptr) {
          for (const v1::StepRecord& r : first->steps()) {
            for (const auto& [name, value] : r.scalars()) names.insert(name);
          }
        }
        scalars_ = std::vector<std::string>(names.begin(), names.end());
      }
      for (const std::string& name : *scalars_) {
        Column col{ScalarColumn(name), name, true};
        for (char& ch : col.table_header) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        columns.push_back(std::move(col));
      }
      columns.push_back({"other_scalars", "OTHER_SCALARS"});
    }
    writer_ = RowWriter::Create(format_, &ctx_.out(), std::move(columns));
  }

  void AddStep(const v1::StepRecord& r, std::optional<double> window_mean) {
    std::vector<Cell> row = StepCells(r, window_mean);
    std::vector<std::pair<std::string, Cell>> extra;
    const std::map<std::string, double> scalars = SortedScalars(r);
    if (format_ == Format::kJsonl) {
      for (const auto& [name, value] : scalars) extra.emplace_back(ScalarColumn(name), Cell::Real(value));
    } else {
      std::map<std::string, double> others = scalars;
      for (const std::string& name : *scalars_) {
        auto it = others.find(name);
        if (it == others.end()) {
          row.emplace_back();
        } else {
          row.push_back(Cell::Real(it->second));
          others.erase(it);
        }
      }
      if (others.empty()) {
        row.emplace_back();
      } else {
        std::string json = "{";
        for (const auto& [name, value] : others) {
          json += (json.size() > 1 ? "," : "") + JsonString(name) + ":" + FormatExact(value);
        }
        row.push_back(Cell::Text(json + "}"));
      }
    }
    writer_->Add(std::move(row), std::move(extra));
  }

  Context& ctx_;
  Format format_;
  bool layers_;
  std::optional<std::vector<std::string>> scalars_;
  std::unique_ptr<RowWriter> writer_;
};

struct StepsOptions {
  std::string run;
  std::int64_t start = 0;
  std::int64_t end = 0;  // exclusive; 0 = no limit
  std::optional<std::uint32_t> rank;
  bool layers = false;
  Format format = Format::kTable;
  std::optional<std::vector<std::string>> scalars;
  std::optional<std::uint32_t> page_size;
};

// m_t of the exported records, from the run's window setting and the
// records of each rank before the export's first (fetched as needed).
base::StatusOr<proto::StepWindowMeans> ExportWindowMeans(Context& ctx, const std::string& run) {
  GAC_ASSIGN_OR_RETURN(v1::RunSummary summary, ctx.client().GetRunSummary(run, 1));
  auto read = [&ctx, run](std::uint32_t rank, std::int64_t start, std::int64_t end,
                          const std::function<void(const v1::StepRecord&)>& visit) -> base::Status {
    v1::GetStepsRequest request;
    request.set_run(run);
    request.set_rank(rank);
    request.set_start_step(start);
    request.set_end_step(end);
    request.set_page_size(kStepPage);
    return ctx.client().ForEachStepPage(request, [&](const v1::GetStepsResponse& page) {
      for (const v1::StepRecord& r : page.steps()) visit(r);
      return base::Status::Ok();
    });
  };
  return proto::StepWindowMeans(proto::ListingWindow(summary.info().config()), summary.info().first_step(), read);
}

base::Status ExportSteps(Context& ctx, const StepsOptions& o) {
  std::optional<proto::StepWindowMeans> windows;
  if (!o.layers) {
    GAC_ASSIGN_OR_RETURN(proto::StepWindowMeans w, ExportWindowMeans(ctx, o.run));
    windows.emplace(std::move(w));
  }
  v1::GetStepsRequest request;
  request.set_run(o.run);
  request.set_start_step(o.start);
  request.set_end_step(o.end);
  if (o.rank) request.set_rank(*o.rank);
  request.set_include_layers(o.layers);
  request.set_page_size(o.page_size.value_or(o.layers ? kLayerPage : kStepPage));
  StepRows rows(ctx, o.format, o.layers, o.scalars);
  std::uint64_t records = 0;
  GAC_RETURN_IF_ERROR(ctx.client().ForEachStepPage(request, [&](const v1::GetStepsResponse& page) -> base::Status {
    std::vector<std::optional<double>> means;
    if (windows) {
      GAC_ASSIGN_OR_RETURN(means, windows->Next(page.steps()));
    }
    rows.AddPage(page, means);
    records += static_cast<std::uint64_t>(page.steps_size());
    if (page.steps_size() > 0) {
      ctx.Progress("gacctl: " + std::to_string(records) + " records, at step " +
                   std::to_string(page.steps(page.steps_size() - 1).step()));
    }
    if (ctx.interrupted() && !page.next_page_token().empty()) return Interrupted();
    return base::Status::Ok();
  }));
  rows.Finish();
  return base::Status::Ok();
}

base::StatusOr<std::vector<std::string>> ParseNames(const std::string& text) {
  std::vector<std::string> names = SplitCommas(text);
  for (const std::string& name : names) {
    if (name.empty()) return base::Status::InvalidArgument("--scalars: empty name in '" + text + "'");
  }
  return names;
}

CommandSpec StepsCommand() {
  CommandSpec c;
  c.name = "steps";
  c.args = "RUN";
  c.summary = "export a run's step records (table, CSV or JSON Lines), streamed page by page";
  c.description =
      "Records are in (step, rank) order. CSV has a header line and loads as is in pandas\n"
      "(pd.read_csv) and spreadsheets; CSV and JSON Lines carry every stored value exactly\n"
      "(doubles in their shortest exact form, times in ns since the Unix epoch, an absent\n"
      "value as an empty field or null). The table rounds to 6 digits and shows UTC times.\n\n"
      "columns, in this order (the table's header in brackets; in monitor mode the table\n"
      "shows a regime as what GAC would have done, \"would skip\"):\n" +
      StepColumnsHelp() +
      "  then scalar.NAME [NAME] for each trainer scalar (reward, loss...), by name: the\n"
      "  names in the first page of records, or --scalars; a record's other scalars go in\n"
      "  other_scalars [OTHER_SCALARS] as a JSON object. JSON Lines has no other_scalars:\n"
      "  each line carries all of its record's scalars as scalar.NAME keys.\n\n"
      "with --layers, one row per layer record instead:\n"
      "  run, step, rank, layer, cosine, grad_norm, ref_norm\n"
      "  (join with the step rows on step and rank).\n";
  c.flags = StepRangeFlagSpecs();
  c.flags.insert(c.flags.end(), {
      {"rank", "R", "only this rank (default: all ranks)"},
      {"layers", "", "per-layer rows instead of step rows"},
      {"scalars", "A,B", "the scalar columns of CSV and the table (default: the first page's)"},
      {"page-size", "N", "records asked of gacd per call (default " + std::to_string(kStepPage) + ", with --layers " +
                             std::to_string(kLayerPage) + "; at most 10000, query.proto's limit; gacd may send fewer)"},
      FormatFlagSpec(),
  });
  c.positionals = 1;
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>& args) -> base::StatusOr<Action> {
    StepsOptions o;
    o.run = args[0];
    GAC_RETURN_IF_ERROR(StepRangeFlags(flags, &o.start, &o.end));
    GAC_ASSIGN_OR_RETURN(auto rank, OptionalInt(flags, "rank", 0, UINT32_MAX));
    if (rank) o.rank = static_cast<std::uint32_t>(*rank);
    o.layers = flags.Has("layers");
    GAC_ASSIGN_OR_RETURN(auto page_size, OptionalInt(flags, "page-size", 1, 10000));
    if (page_size) o.page_size = static_cast<std::uint32_t>(*page_size);
    GAC_ASSIGN_OR_RETURN(Format format, FormatFlag(flags));
    o.format = format;
    if (const std::string* s = flags.Get("scalars")) {
      if (o.layers) return base::Status::InvalidArgument("--scalars does not apply to --layers");
      GAC_ASSIGN_OR_RETURN(std::vector<std::string> names, ParseNames(*s));
      o.scalars = names;
    }
    return Action([o](Context& ctx) { return ExportSteps(ctx, o); });
  };
  return c;
}

// ---- tail ----

struct TailOptions {
  std::string run;
  std::int64_t lines = 10;
  std::uint32_t rank = 0;
  bool follow = false;
  std::chrono::milliseconds interval{1000};
  Format format = Format::kTable;
};

// gacctl tail's columns, in order: record fields by their wire name
// (gac/proto/record_schema.h; the help is the field's), m_t (computed here,
// as gacctl steps does) and the trainer scalar "reward". Each other field is
// left out for the reason tests/cli/gacctl_test.cc gives.
struct TailColumnLook {
  const char* field;         // the record field, or "window_mean" (m_t) or "reward"
  const char* table_header;
  std::size_t table_width;   // the column's narrowest width
};
constexpr char kTailWindowMean[] = "window_mean";
constexpr char kTailReward[] = "reward";
constexpr TailColumnLook kTailColumnLooks[] = {
    {"step", "STEP", 6},
    {"cosine", "C_T", 11},
    {kTailWindowMean, "M_T", 11},
    {"regime", "REGIME", 7},
    {"alpha", "ALPHA", 9},
    {"grad_norm", "|G|", 9},
    {"grad_norm_z", "Z", 9},
    {"staleness", "STALENESS", 9},
    {"ess_token", "ESS", 7},
    {"kl_k3", "KL", 9},
    {kTailReward, "REWARD", 10},
};

struct TailColumn {
  enum Kind { kField, kWindowMean, kReward } kind;
  const proto::StepField* field;  // kField only
  Column column;
  const char* help;
};

const std::vector<TailColumn>& TailLayout() {
  static const auto* layout = [] {
    auto* out = new std::vector<TailColumn>();
    for (const TailColumnLook& look : kTailColumnLooks) {
      const std::string name = look.field;
      if (name == kTailWindowMean) {
        out->push_back({TailColumn::kWindowMean, nullptr, {name, look.table_header, true, look.table_width},
                        "m_t, as gacctl steps gives it"});
      } else if (name == kTailReward) {
        out->push_back({TailColumn::kReward, nullptr, {name, look.table_header, true, look.table_width},
                        "the trainer scalar \"reward\""});
      } else if (const proto::StepField* f = proto::FindStepField(name)) {
        const bool numeric = f->type != proto::FieldType::kEnum && f->type != proto::FieldType::kText;
        out->push_back({TailColumn::kField, f, {name, look.table_header, numeric, look.table_width}, f->help});
      }
    }
    return out;
  }();
  return *layout;
}

std::vector<Column> TailColumns() {
  std::vector<Column> columns;
  for (const TailColumn& c : TailLayout()) columns.push_back(c.column);
  return columns;
}

std::vector<Cell> TailCells(const v1::StepRecord& r, std::optional<double> window_mean) {
  std::vector<Cell> cells;
  for (const TailColumn& c : TailLayout()) {
    switch (c.kind) {
      case TailColumn::kField:
        // A monitor-mode step's regime as recorded, where gacctl steps'
        // table says what GAC would have done.
        cells.push_back(FieldCell(*c.field, r, MonitorRegime::kAsRecorded));
        break;
      case TailColumn::kWindowMean:
        cells.push_back(window_mean ? Cell::Real(*window_mean) : Cell());
        break;
      case TailColumn::kReward: {
        auto reward = r.scalars().find("reward");
        cells.push_back(reward == r.scalars().end() ? Cell() : Cell::Real(reward->second));
        break;
      }
    }
  }
  return cells;
}

// The help's paragraph on tail's columns.
std::string TailColumnsHelp() {
  std::string text;
  for (const TailColumn& c : TailLayout()) {
    text += "  " + c.column.name + " [" + c.column.table_header + "]: " + c.help + "\n";
  }
  return text;
}

// All records of `rank` from `start` on.
base::StatusOr<std::vector<v1::StepRecord>> StepsFrom(Context& ctx, const std::string& run, std::uint32_t rank,
                                                std::int64_t start) {
  v1::GetStepsRequest request;
  request.set_run(run);
  request.set_rank(rank);
  request.set_start_step(start);
  request.set_page_size(kStepPage);
  std::vector<v1::StepRecord> out;
  base::Status st = ctx.client().ForEachStepPage(request, [&](const v1::GetStepsResponse& page) {
    for (const v1::StepRecord& r : page.steps()) out.push_back(r);
    return base::Status::Ok();
  });
  if (!st.ok()) return st;
  return out;
}

// The last `n` records of the rank (fewer when it has fewer). `next` is
// where following starts: after the last record, or after the run's latest
// step when n is 0.
base::Status LastSteps(Context& ctx, const TailOptions& o, std::vector<v1::StepRecord>* records, std::int64_t* next) {
  GAC_ASSIGN_OR_RETURN(v1::RunSummary summary, ctx.client().GetRunSummary(o.run, 1));
  const std::int64_t last =
      o.rank == 0 && summary.has_latest() ? summary.latest().step() : summary.info().last_step();
  records->clear();
  *next = last + 1;
  if (o.lines == 0) return base::Status::Ok();
  // Steps may be missing: widen the window until it holds n records.
  for (std::int64_t span = o.lines;; span = span > INT64_MAX / 4 ? INT64_MAX : span * 4) {
    const std::int64_t start = last - span + 1 > 0 ? last - span + 1 : 0;
    GAC_ASSIGN_OR_RETURN(std::vector<v1::StepRecord> got, StepsFrom(ctx, o.run, o.rank, start));
    if (static_cast<std::int64_t>(got.size()) >= o.lines || start == 0) {
      const std::size_t keep = std::min(got.size(), static_cast<std::size_t>(o.lines));
      records->assign(got.end() - static_cast<std::ptrdiff_t>(keep), got.end());
      *next = records->empty() ? 0 : records->back().step() + 1;
      return base::Status::Ok();
    }
  }
}

bool IsConnectionError(const base::Status& st) { return st.IsUnavailable() || st.IsDeadlineExceeded(); }

// m_t beside each printed record, as gacctl steps computes it; the run's
// window setting is read with its first record (a followed run may not exist
// when tail starts).
class TailWindows {
 public:
  TailWindows(Context& ctx, std::string run) : ctx_(ctx), run_(std::move(run)) {}

  base::StatusOr<std::optional<double>> Next(const v1::StepRecord& r) {
    if (!means_) {
      GAC_ASSIGN_OR_RETURN(proto::StepWindowMeans m, ExportWindowMeans(ctx_, run_));
      means_.emplace(std::move(m));
    }
    return means_->Next(r);
  }

 private:
  Context& ctx_;
  const std::string run_;
  std::optional<proto::StepWindowMeans> means_;
};

base::Status Tail(Context& ctx, const TailOptions& o) {
  std::unique_ptr<RowWriter> writer = RowWriter::Create(o.format, &ctx.out(), TailColumns());
  TailWindows windows(ctx, o.run);
  auto add = [&](const v1::StepRecord& r) -> base::Status {
    GAC_ASSIGN_OR_RETURN(std::optional<double> mean, windows.Next(r));
    writer->Add(TailCells(r, mean));
    return base::Status::Ok();
  };
  std::vector<v1::StepRecord> records;
  std::int64_t next = 0;
  base::Status st = LastSteps(ctx, o, &records, &next);
  if (!st.ok()) {
    if (!o.follow || !st.IsNotFound()) return st;
    // Following a run that has not reported yet: wait for it.
    ctx.err() << "gacctl: waiting for run '" << o.run << "' (" << st.ToString() << ")\n" << std::flush;
    next = 0;
  }
  for (const v1::StepRecord& r : records) GAC_RETURN_IF_ERROR(add(r));
  writer->Flush();
  if (!o.follow) return base::Status::Ok();

  Interrupt never;
  Interrupt* interrupt = ctx.env().interrupt != nullptr ? ctx.env().interrupt : &never;
  bool outage = false;
  while (!interrupt->WaitFor(o.interval)) {
    v1::GetStepsRequest request;
    request.set_run(o.run);
    request.set_rank(o.rank);
    request.set_start_step(next);
    request.set_page_size(kStepPage);
    st = ctx.client().ForEachStepPage(request, [&](const v1::GetStepsResponse& page) -> base::Status {
      for (const v1::StepRecord& r : page.steps()) {
        GAC_RETURN_IF_ERROR(add(r));
        next = r.step() + 1;
      }
      writer->Flush();
      return base::Status::Ok();
    });
    if (st.ok()) {
      if (outage) ctx.err() << "gacctl: reconnected to " << ctx.client().options().address << "\n" << std::flush;
      outage = false;
    } else if (st.IsNotFound()) {
      continue;  // the run has not reported yet
    } else if (IsConnectionError(st)) {
      // gacd restarting or the network: keep trying, say so once.
      if (!outage) ctx.err() << "gacctl: " << st.ToString() << "; retrying\n" << std::flush;
      outage = true;
    } else {
      return st;
    }
  }
  return base::Status::Ok();
}

CommandSpec TailCommand() {
  CommandSpec c;
  c.name = "tail";
  c.args = "RUN";
  c.summary = "a run's last steps; with -f, new steps as they arrive, until interrupted";
  c.description =
      "One line per step of one rank (rank 0 by default), with these columns:\n" +
      TailColumnsHelp() +
      "With -f gacctl asks gacd for newer steps every --interval and prints them as they\n"
      "come, until SIGINT or SIGTERM (exit 0). A run that does not exist yet is waited for;\n"
      "while gacd cannot be reached gacctl says so once and keeps trying.\n";
  c.flags = {
      {"lines", "N", "how many of the last steps (default 10; 0 = none, with -f only new ones)", 'n'},
      {"follow", "", "keep printing new steps until interrupted", 'f'},
      {"rank", "R", "the rank (default 0)"},
      {"interval", "DURATION", "with -f, how often to ask for new steps (default 1s)"},
      FormatFlagSpec(),
  };
  c.positionals = 1;
  c.prepare = [](const ParsedFlags& flags, const std::vector<std::string>& args) -> base::StatusOr<Action> {
    TailOptions o;
    o.run = args[0];
    GAC_ASSIGN_OR_RETURN(auto lines, OptionalInt(flags, "lines", 0, 1000000));
    o.lines = lines.value_or(10);
    GAC_ASSIGN_OR_RETURN(auto rank, OptionalInt(flags, "rank", 0, UINT32_MAX));
    o.rank = static_cast<std::uint32_t>(rank.value_or(0));
    o.follow = flags.Has("follow");
    if (const std::string* i = flags.Get("interval")) {
      GAC_ASSIGN_OR_RETURN(std::chrono::milliseconds d, ParseDurationFlag("--interval", *i));
      o.interval = d;
    }
    GAC_ASSIGN_OR_RETURN(Format format, FormatFlag(flags));
    o.format = format;
    return Action([o](Context& ctx) { return Tail(ctx, o); });
  };
  return c;
}

}  // namespace

std::vector<CommandSpec> StepCommands() { return {StepsCommand(), TailCommand()}; }

}  // namespace gac::cli
