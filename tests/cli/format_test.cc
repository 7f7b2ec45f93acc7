// gac::cli without a process: the row formats, the flag syntax, and the
// replay logic against a reference written here from the algorithm's rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "cli/src/flags.h"
#include "gac/cli/format.h"
#include "gac/cli/replay.h"

namespace gac::cli {
namespace {

std::string Write(Format format, const std::vector<Column>& columns, const std::vector<std::vector<Cell>>& rows,
                  const std::vector<std::pair<std::string, Cell>>& extra = {}) {
  std::ostringstream out;
  auto writer = RowWriter::Create(format, &out, columns);
  for (const auto& row : rows) writer->Add(row, extra);
  writer->Flush();
  return out.str();
}

TEST(FormatExact, ReadsBackToTheSameBits) {
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<std::uint64_t> bits;
  int tested = 0;
  while (tested < 20000) {
    const std::uint64_t b = bits(rng);
    double v;
    std::memcpy(&v, &b, sizeof v);
    if (!std::isfinite(v)) continue;
    ++tested;
    const std::string text = FormatExact(v);
    const double back = std::strtod(text.c_str(), nullptr);
    ASSERT_EQ(std::memcmp(&v, &back, sizeof v), 0) << text;
  }
  EXPECT_EQ(FormatExact(0.1), "0.1");
  EXPECT_EQ(FormatExact(0.05), "0.05");
  EXPECT_EQ(FormatExact(1.0), "1");
  EXPECT_EQ(FormatExact(1e-5), "1e-05");
  EXPECT_EQ(FormatExact(-0.0), "-0");
}

TEST(FormatDisplay, SixSignificantDigits) {
  EXPECT_EQ(FormatDisplay(0.0164102298), "0.0164102");
  EXPECT_EQ(FormatDisplay(1.0), "1");
  EXPECT_EQ(FormatDisplay(2.3875892e-05), "2.38759e-05");
}

TEST(FormatTime, UtcWithMilliseconds) {
  EXPECT_EQ(FormatTimeUtc(1714564800000000000), "2024-05-01T12:00:00.000Z");
  EXPECT_EQ(FormatTimeUtc(1714564800123456789), "2024-05-01T12:00:00.123Z");
  EXPECT_EQ(FormatTimeUtc(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(FormatTimeUtc(-1000000), "1969-12-31T23:59:59.999Z");
}

TEST(FormatAge, Words) {
  EXPECT_EQ(FormatAge(850000000), "850ms");
  EXPECT_EQ(FormatAge(42000000000), "42s");
  EXPECT_EQ(FormatAge(185000000000), "3m05s");
  EXPECT_EQ(FormatAge(7620000000000), "2h07m");
  EXPECT_EQ(FormatAge(273600000000000), "3d04h");
  EXPECT_EQ(FormatAge(-5), "0ms");
}

TEST(Csv, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(CsvField("plain"), "plain");
  EXPECT_EQ(CsvField("a,b"), "\"a,b\"");
  EXPECT_EQ(CsvField("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(CsvField("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(CsvField(" padded"), "\" padded\"");
  EXPECT_EQ(CsvField(""), "");
}

TEST(Json, EscapesControlCharacters) {
  EXPECT_EQ(JsonString("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonString("x\ny\tz\x01"), "\"x\\ny\\tz\\u0001\"");
  EXPECT_EQ(JsonString("caf\xc3\xa9"), "\"caf\xc3\xa9\"");  // UTF-8 passes through
}

TEST(RowWriter, ThreeFormatsOfOneRow) {
  const std::vector<Column> columns = {{"run", "RUN"}, {"step", "STEP", true}, {"cosine", "C_T", true},
                                       {"time", "TIME"}, {"ok", "OK"}};
  const std::vector<std::vector<Cell>> rows = {
      {Cell::Text("exp,1"), Cell::Int(12), Cell::Real(0.015), Cell::TimeNs(1714564800000000000), Cell::Bool(true)},
      {Cell::Text("b"), Cell::Int(3), Cell(), Cell::TimeNs(0), Cell::Bool(false)},
  };
  EXPECT_EQ(Write(Format::kCsv, columns, rows),
            "run,step,cosine,time,ok\n"
            "\"exp,1\",12,0.015,1714564800000000000,true\n"
            "b,3,,0,false\n");
  EXPECT_EQ(Write(Format::kJsonl, columns, rows, {{"scalar.reward", Cell::Real(0.5)}}),
            "{\"run\":\"exp,1\",\"step\":12,\"cosine\":0.015,\"time\":1714564800000000000,\"ok\":true,"
            "\"scalar.reward\":0.5}\n"
            "{\"run\":\"b\",\"step\":3,\"cosine\":null,\"time\":0,\"ok\":false,\"scalar.reward\":0.5}\n");
  EXPECT_EQ(Write(Format::kTable, columns, rows),
            "RUN    STEP    C_T  TIME                      OK\n"
            "exp,1    12  0.015  2024-05-01T12:00:00.000Z  true\n"
            "b         3      -  -                         false\n");
}

TEST(RowWriter, NothingBeforeTheFirstRowOrFlush) {
  for (Format f : {Format::kTable, Format::kCsv, Format::kJsonl}) {
    std::ostringstream out;
    auto writer = RowWriter::Create(f, &out, {{"a", "A"}});
    EXPECT_EQ(out.str(), "") << FormatName(f);
  }
}

TEST(RowWriter, TableColumnsNeverNarrowAcrossFlushes) {
  std::ostringstream out;
  auto writer = RowWriter::Create(Format::kTable, &out, {{"step", "STEP", true}, {"regime", "REGIME"}});
  writer->Add({Cell::Int(1234567), Cell::Text("project")});
  writer->Flush();
  writer->Add({Cell::Int(8), Cell::Text("safe")});
  writer->Flush();
  EXPECT_EQ(out.str(),
            "   STEP  REGIME\n"
            "1234567  project\n"
            "      8  safe\n");
}

TEST(ParseFormat, Names) {
  EXPECT_EQ(*ParseFormat("csv"), Format::kCsv);
  EXPECT_EQ(*ParseFormat("jsonl"), Format::kJsonl);
  EXPECT_EQ(*ParseFormat("table"), Format::kTable);
  EXPECT_TRUE(ParseFormat("json").status().IsInvalidArgument());
}

// ---- flags ----

std::vector<FlagSpec> Specs() {
  return {{"from", "N", ""}, {"layers", "", ""}, {"follow", "", "", 'f'}, {"lines", "N", "", 'n'}};
}

TEST(Flags, LongShortInlineAndSeparateValues) {
  auto p = ParseFlags({"run1", "--from=5", "--layers", "-f", "-n", "3", "--lines", "4"}, Specs());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p->Get("from"), "5");
  EXPECT_TRUE(p->Has("layers"));
  EXPECT_TRUE(p->Has("follow"));
  EXPECT_EQ(*p->Get("lines"), "4");  // the last one wins
  EXPECT_EQ(p->positional(), std::vector<std::string>{"run1"});
  p = ParseFlags({"--from", "-3", "--", "-odd-run"}, Specs());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p->Get("from"), "-3");
  EXPECT_EQ(p->positional(), std::vector<std::string>{"-odd-run"});
}

TEST(Flags, ErrorsNameTheFlag) {
  EXPECT_EQ(ParseFlags({"--frm", "1"}, Specs()).status().message(), "unknown flag '--frm'");
  EXPECT_EQ(ParseFlags({"-x"}, Specs()).status().message(), "unknown flag '-x'");
  EXPECT_EQ(ParseFlags({"--from"}, Specs()).status().message(), "--from needs a value (N)");
  EXPECT_EQ(ParseFlags({"--layers=1"}, Specs()).status().message(), "--layers takes no value");
  EXPECT_EQ(ParseIntFlag("--from", "x", 0, 10).status().message(), "--from: expected an integer, got 'x'");
  EXPECT_EQ(ParseIntFlag("--from", "11", 0, 10).status().message(), "--from: 11 is outside [0, 10]");
  EXPECT_TRUE(ParseRealFlag("--c-low", "nan").status().IsInvalidArgument());
  EXPECT_TRUE(ParseRealFlag("--c-low", "0.1x").status().IsInvalidArgument());
  EXPECT_EQ(*ParseRealListFlag("--c-low", "0.03,0.05"), (std::vector<double>{0.03, 0.05}));
  EXPECT_TRUE(ParseRealListFlag("--c-low", "0.03,").status().IsInvalidArgument());
}

TEST(Flags, DeprecatedAliasesLeaveANote) {
  const std::vector<FlagSpec> specs = {{"start-step", "N", ""}, DeprecatedFlag("from", "N", "use --start-step")};
  auto p = ParseFlags({"--from", "3", "--from=4"}, specs);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p->Get("from"), "4");
  EXPECT_EQ(p->deprecation_notes(), std::vector<std::string>{"--from is deprecated: use --start-step"});
  p = ParseFlags({"--start-step", "3"}, specs);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->deprecation_notes().empty());
}

TEST(Flags, Durations) {
  EXPECT_EQ(ParseDurationFlag("--t", "500ms")->count(), 500);
  EXPECT_EQ(ParseDurationFlag("--t", "10s")->count(), 10000);
  EXPECT_EQ(ParseDurationFlag("--t", "1.5")->count(), 1500);
  EXPECT_EQ(ParseDurationFlag("--t", "2m")->count(), 120000);
  EXPECT_EQ(ParseDurationFlag("--t", "1h")->count(), 3600000);
  EXPECT_EQ(ParseDurationFlag("--t", "1d")->count(), 86400000) << "gac::base::ParseDuration's units, as gacd's";
  EXPECT_EQ(ParseDurationFlag("--t", "0.1ms")->count(), 1) << "at least a millisecond";
  EXPECT_EQ(ParseDurationFlag("--t", "1.9ms")->count(), 2) << "to the nearest millisecond";
  EXPECT_EQ(ParseDurationFlag("--t", "11574d")->count(), 999993600000) << "just under 1e12 ms";
  EXPECT_TRUE(ParseDurationFlag("--t", "11575d").status().IsInvalidArgument()) << "a deadline that would overflow";
  for (const char* bad : {"0", "-1s", "s", "10x", "", "1e999"}) {
    EXPECT_TRUE(ParseDurationFlag("--t", bad).status().IsInvalidArgument()) << bad;
  }
}

// ---- replay ----

// The regime and alpha of a recorded c_t by the rules in docs/ALGORITHM.md, written
// out here rather than taken from gac::Controller.
std::pair<controller::Regime, double> Reference(const RecordedStep& s, double lo, double hi, controller::AlphaMode mode) {
  if (s.regime == controller::Regime::kInvalid) return {controller::Regime::kInvalid, 1.0};
  if (s.regime == controller::Regime::kSpike) return {controller::Regime::kSpike, 1.0};  // the guard's, kept
  if (!s.cosine) return {controller::Regime::kSafe, 1.0};
  const double a = std::fabs(*s.cosine);
  if (a <= lo) return {controller::Regime::kSafe, 1.0};
  if (a >= hi) return {controller::Regime::kSkip, 1.0};
  const double c = *s.cosine;
  const double alpha =
      mode == controller::AlphaMode::kPaper ? lo / a : lo * std::sqrt(1.0 - c * c) / (a * std::sqrt(1.0 - lo * lo));
  return {controller::Regime::kProject, alpha};
}

TEST(Replay, EveryStepAgreesWithTheRules) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> cos_dist(-0.7, 0.7);
  std::uniform_int_distribution<int> kind(0, 19);
  std::vector<RecordedStep> steps;
  for (std::int64_t i = 0; i < 3000; ++i) {
    RecordedStep s;
    s.step = i;
    const int k = kind(rng);
    if (k == 0) {
      s.regime = controller::Regime::kInvalid;
    } else if (k == 19) {
      s.regime = controller::Regime::kSpike;
      s.cosine = cos_dist(rng);
    } else if (k > 1) {
      s.cosine = cos_dist(rng);
    }
    steps.push_back(s);
  }
  // Cosines exactly on the thresholds.
  steps[10].cosine = 0.05;
  steps[11].cosine = -0.3;
  steps[12].cosine = std::nextafter(0.3, 0.0);
  for (controller::AlphaMode mode : {controller::AlphaMode::kPaper, controller::AlphaMode::kExact}) {
    for (auto [lo, hi] : {std::pair{0.05, 0.3}, std::pair{0.1, 0.5}, std::pair{0.02, 1.0}}) {
      Replayer replayer(*controller::Controller::Create({lo, hi}, mode));
      std::uint64_t counts[std::size(controller::kAllRegimes)] = {};
      for (const RecordedStep& s : steps) {
        const ReplayedDecision d = replayer.Add(s);
        const auto [want, alpha] = Reference(s, lo, hi, mode);
        ASSERT_EQ(d.regime, want) << "step " << s.step;
        ASSERT_NEAR(d.alpha, alpha, 1e-15 * alpha) << "step " << s.step;
        ++counts[static_cast<int>(want)];
      }
      for (controller::Regime r : controller::kAllRegimes) EXPECT_EQ(replayer.replayed().count(r), counts[static_cast<int>(r)]);
      EXPECT_EQ(replayer.steps(), steps.size());
    }
  }
}

TEST(Replay, RecordedThresholdsGiveNoDifferences) {
  const controller::Controller recorded = *controller::Controller::Create({0.05, 0.3});
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> cos_dist(-0.6, 0.6);
  Replayer same(recorded);
  Replayer other(*controller::Controller::Create({0.1, 0.3}), 3);
  std::uint64_t want_differing = 0;
  for (std::int64_t i = 0; i < 1000; ++i) {
    RecordedStep s;
    s.step = i;
    s.cosine = cos_dist(rng);
    s.regime = recorded.RegimeForCosine(*s.cosine);
    s.alpha = s.regime == controller::Regime::kProject ? recorded.Alpha(*s.cosine) : 1.0;
    same.Add(s);
    other.Add(s);
    const double a = std::fabs(*s.cosine);
    if (a > 0.05 && a <= 0.1) ++want_differing;  // project with 0.05, safe with 0.1
  }
  EXPECT_EQ(same.differing_count(), 0u);
  EXPECT_EQ(*same.mean_project_alpha(), *same.mean_recorded_project_alpha());
  EXPECT_EQ(other.differing_count(), want_differing);
  ASSERT_EQ(other.differing().size(), 3u);  // kept: the first three
  EXPECT_LT(other.differing()[0].step, other.differing()[1].step);
  EXPECT_EQ(other.differing()[0].recorded, controller::Regime::kProject);
  EXPECT_EQ(other.differing()[0].replayed, controller::Regime::kSafe);
}

TEST(RegimeSeries, FirstStepsAndLongestSkipRunWithGaps) {
  RegimeSeries s;
  const std::vector<std::pair<std::int64_t, controller::Regime>> steps = {
      {0, controller::Regime::kSafe},  {1, controller::Regime::kProject}, {2, controller::Regime::kSkip}, {3, controller::Regime::kSkip},
      {5, controller::Regime::kSkip},  {6, controller::Regime::kSkip},    {7, controller::Regime::kSkip}, {8, controller::Regime::kInvalid},
      {9, controller::Regime::kSkip},  {10, controller::Regime::kSkip},   {11, controller::Regime::kSkip}, {12, controller::Regime::kSkip}};
  for (auto [step, r] : steps) s.Add(step, r);
  EXPECT_EQ(*s.first_project(), 1);
  EXPECT_EQ(*s.first_skip(), 2);
  // 2-3, then a gap (4 missing): 5-7, then invalid: 9-12 is the longest.
  EXPECT_EQ(s.longest_skip(), 4u);
  EXPECT_EQ(*s.longest_skip_first(), 9);
  EXPECT_EQ(s.count(controller::Regime::kSkip), 9u);
  EXPECT_EQ(s.total(), steps.size());
  RegimeSeries none;
  none.Add(0, controller::Regime::kSafe);
  EXPECT_EQ(none.longest_skip(), 0u);
  EXPECT_FALSE(none.longest_skip_first().has_value());
  EXPECT_FALSE(none.first_skip().has_value());
}

TEST(ThresholdGrid, PairsInOrderWithoutTheImpossibleOnes) {
  auto g = ThresholdGrid({0.1, 0.3}, {0.2, 0.3, 0.4});
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->size(), 4u);  // (0.1,0.2) (0.1,0.3) (0.1,0.4) (0.3,0.4)
  EXPECT_EQ((*g)[0].c_low, 0.1);
  EXPECT_EQ((*g)[0].c_high, 0.2);
  EXPECT_EQ((*g)[3].c_low, 0.3);
  EXPECT_EQ((*g)[3].c_high, 0.4);
  EXPECT_TRUE(ThresholdGrid({0.5}, {0.2}).status().IsInvalidArgument());
  EXPECT_TRUE(ThresholdGrid({0.0}, {0.2}).status().IsInvalidArgument());
  EXPECT_TRUE(ThresholdGrid({0.1}, {1.5}).status().IsInvalidArgument());
  EXPECT_TRUE(ThresholdGrid({}, {0.2}).status().IsInvalidArgument());
}

}  // namespace
}  // namespace gac::cli
