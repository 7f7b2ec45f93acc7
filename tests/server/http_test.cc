// gacd's HTTP API without a server: the JSON writer (read back with
// protobuf's JSON parser and strtod as independent references), the parsing
// of paths, query strings and PUT bodies, and the JSON shapes of the
// responses against the protos they encode.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include "server/src/http/api.h"
#include "server/src/http/json.h"
#include "server/src/queries.h"
#include "tests/common/test_util.h"

namespace gac::server {
namespace {

using google::protobuf::Value;
using gac::testing::JsonMember;
using gac::testing::ParseJson;

std::string Written(const std::string& s) {
  std::string out;
  JsonWriter w(&out);
  w.String(s);
  return out;
}

// ------------------------------------------------------------ JsonWriter

TEST(JsonWriter, StringsReadBackExactlyAndInvalidUtf8BecomesReplacement) {
  const std::string cases[] = {
      "",
      "plain run-1/exp.2:3",
      "quote \" backslash \\ slash /",
      [] {
        static const char kText[] = "controls \x01\x02\x1f \n\r\t\b\f and NUL \0 end";
        return std::string(kText, sizeof kText - 1);  // the NUL inside included
      }(),
      "\x7f delete",
      "two bytes \xc3\xa9, three \xe2\x82\xac, four \xf0\x9f\x98\x80",
  };
  for (const std::string& s : cases) {
    const Value v = ParseJson(Written(s));
    ASSERT_EQ(v.kind_case(), Value::kStringValue) << s;
    EXPECT_EQ(v.string_value(), s);
  }
  const std::string replacement = "\xef\xbf\xbd";
  const std::pair<std::string, std::string> invalid[] = {
      {"lone \x80 continuation", "lone " + replacement + " continuation"},
      {"truncated \xe2\x82", "truncated " + replacement + replacement},
      {"overlong \xc0\xaf", "overlong " + replacement + replacement},
      {"surrogate \xed\xa0\x80", "surrogate " + replacement + replacement + replacement},
      {"beyond \xf4\x90\x80\x80", "beyond " + replacement + replacement + replacement + replacement},
      {"\xff", replacement},
  };
  for (const auto& [in, expected] : invalid) EXPECT_EQ(ParseJson(Written(in)).string_value(), expected) << in;
}

TEST(JsonWriter, DoublesRoundTripAndNonFiniteIsNull) {
  std::mt19937_64 rng(7);
  std::vector<double> values = {0.0, -0.0, 1.0, -1.5, 0.1, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.125,
                                std::numeric_limits<double>::denorm_min(), 2.5e-5, 9007199254740993.0};
  for (int i = 0; i < 2000; ++i) {
    std::uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    if (std::isfinite(d)) values.push_back(d);
  }
  for (double d : values) {
    std::string out;
    JsonWriter(&out).Double(d);
    char* end = nullptr;
    const double back = std::strtod(out.c_str(), &end);
    EXPECT_EQ(*end, '\0') << out;
    EXPECT_EQ(std::memcmp(&back, &d, sizeof d), 0) << out;
    EXPECT_EQ(ParseJson(out).kind_case(), Value::kNumberValue) << out;
  }
  for (double d : {std::nan(""), std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    std::string out;
    JsonWriter(&out).Double(d);
    EXPECT_EQ(out, "null");
  }
}

TEST(JsonWriter, NestingIntegersAndStringIntegers) {
  std::string out;
  JsonWriter w(&out);
  w.BeginObject();
  w.Key("a");
  w.BeginArray();
  w.Int(std::numeric_limits<std::int64_t>::min());
  w.Uint(std::numeric_limits<std::uint64_t>::max());
  w.BeginObject();
  w.EndObject();
  w.BeginArray();
  w.EndArray();
  w.Bool(true);
  w.Null();
  w.EndArray();
  w.Key("ns");
  w.IntString(1795484153874470674);
  w.Key("empty");
  w.BeginObject();
  w.EndObject();
  w.EndObject();
  EXPECT_EQ(out, "{\"a\":[-9223372036854775808,18446744073709551615,{},[],true,null],"
                 "\"ns\":\"1795484153874470674\",\"empty\":{}}");
  const Value v = ParseJson(out);
  EXPECT_EQ(JsonMember(v, "a").list_value().values_size(), 6);
  EXPECT_EQ(JsonMember(v, "ns").string_value(), "1795484153874470674");
}

// ------------------------------------------------------------ routes and parameters

TEST(HttpApiParsing, RoutesReadTheResourceFromTheEndOfThePath) {
  struct Case {
    const char* method;
    const char* path;
    ApiRoute::Kind kind;
    const char* run;
    const char* grpc;
  };
  const Case cases[] = {
      {"GET", "/api/v1/runs", ApiRoute::kRuns, "", "ListRuns"},
      {"GET", "/api/v1/runs/", ApiRoute::kRuns, "", "ListRuns"},
      {"GET", "/api/v1/runs/exp-1", ApiRoute::kSummary, "exp-1", "GetRunSummary"},
      {"GET", "/api/v1/runs/team/exp.1:a", ApiRoute::kSummary, "team/exp.1:a", "GetRunSummary"},
      {"GET", "/api/v1/runs/team/exp/steps", ApiRoute::kSteps, "team/exp", "GetSteps"},
      {"GET", "/api/v1/runs/x/steps/steps", ApiRoute::kSteps, "x/steps", "GetSteps"},
      {"GET", "/api/v1/runs/x/steps/summary", ApiRoute::kSummary, "x/steps", "GetRunSummary"},
      {"GET", "/api/v1/runs/steps", ApiRoute::kSummary, "steps", "GetRunSummary"},
      {"GET", "/api/v1/runs/a/../b/config", ApiRoute::kConfig, "a/../b", "GetRunConfig"},
      {"PUT", "/api/v1/runs/exp/config", ApiRoute::kConfig, "exp", "SetRunConfig"},
      {"GET", "/api/v1/fields", ApiRoute::kFields, "", "GetStepFields"},
  };
  for (const Case& c : cases) {
    base::StatusOr<ApiRoute> r = ParseApiRoute(c.method, c.path);
    ASSERT_TRUE(r.ok()) << c.path << ": " << r.status().ToString();
    EXPECT_EQ(r->kind, c.kind) << c.path;
    EXPECT_EQ(r->run, c.run) << c.path;
    EXPECT_STREQ(r->method, c.grpc) << c.path;
  }
  EXPECT_TRUE(ParseApiRoute("GET", "/api/v1/run").status().IsNotFound());
  EXPECT_TRUE(ParseApiRoute("GET", "/api/v2/runs").status().IsNotFound());
  EXPECT_TRUE(ParseApiRoute("GET", "/api/v1/runs/bad run").status().IsInvalidArgument());
  EXPECT_TRUE(ParseApiRoute("GET", "/api/v1/runs/" + std::string(129, 'a')).status().IsInvalidArgument());
  EXPECT_TRUE(ParseApiRoute("PUT", "/api/v1/runs/exp/steps").status().IsUnimplemented());
  EXPECT_TRUE(ParseApiRoute("DELETE", "/api/v1/runs/exp/config").status().IsUnimplemented());
  EXPECT_TRUE(ParseApiRoute("POST", "/api/v1/runs").status().IsUnimplemented());
}

TEST(HttpApiParsing, QueryStringsAreDecodedAndChecked) {
  auto p = ParseQueryString("a=1&b=x%2Fy+z&&c=&d", {"a", "b", "c", "d"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->size(), 4u);
  EXPECT_EQ((*p)[0], (std::pair<std::string, std::string>{"a", "1"}));
  EXPECT_EQ((*p)[1], (std::pair<std::string, std::string>{"b", "x/y z"}));
  EXPECT_EQ((*p)[2], (std::pair<std::string, std::string>{"c", ""}));
  EXPECT_EQ((*p)[3], (std::pair<std::string, std::string>{"d", ""}));
  EXPECT_TRUE(ParseQueryString("", {}).ok());
  for (const char* bad : {"a=%", "a=%4", "a=%zz", "a=1&a=2", "e=1", "=1", "%41=1&A=2"}) {
    auto r = ParseQueryString(bad, {"a", "b"});
    EXPECT_TRUE(r.status().IsInvalidArgument()) << bad;
  }
  EXPECT_NE(ParseQueryString("x=1", {"from", "to"}).status().message().find("unknown parameter 'x' (expected from, to)"),
            std::string::npos);
}

TEST(HttpApiParsing, StepsParametersBecomeTheGetStepsRequest) {
  auto req = ParseStepsParams("exp", "from=10&to=20&rank=1&layers=true&limit=50&page_token=s12.0");
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_EQ(req->run(), "exp");
  EXPECT_EQ(req->start_step(), 10);
  EXPECT_EQ(req->end_step(), 20);
  ASSERT_TRUE(req->has_rank());
  EXPECT_EQ(req->rank(), 1u);
  EXPECT_TRUE(req->include_layers());
  EXPECT_EQ(req->page_size(), 50u);
  EXPECT_EQ(req->page_token(), "s12.0");
  auto plain = ParseStepsParams("exp", "");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->has_rank());
  EXPECT_EQ(plain->end_step(), 0);
  EXPECT_EQ(plain->page_size(), 0u);  // the default page, as for gRPC

  const std::pair<const char*, const char*> bad[] = {
      {"from=-1", "from: expected a non-negative integer, got '-1'"},
      {"from=1e3", "from: expected a non-negative integer, got '1e3'"},
      {"from=9223372036854775808", "from 9223372036854775808 above the maximum 9223372036854775807"},
      {"from=5&to=5", "end_step must be above start_step"},
      {"to=0", "end_step must be above start_step"},
      {"start_step=5&end_step=4", "end_step must be above start_step"},
      {"page_size=10001", "page_size 10001 above the maximum 10000"},
      {"from=1&start_step=2", "parameter 'start_step' given twice (also as its alias 'from')"},
      {"end_step=3&to=2", "parameter 'end_step' given twice (also as its alias 'to')"},
      {"limit=3&page_size=2", "parameter 'page_size' given twice (also as its alias 'limit')"},
      {"rank=4294967296", "rank 4294967296 above the maximum 4294967295"},
      {"rank=x", "rank: expected a non-negative integer, got 'x'"},
      {"layers=maybe", "layers: expected true or false"},
      {"limit=10001", "limit 10001 above the maximum 10000"},
      {"limit=99999999999999999999999999", "limit 99999999999999999999999999 above the maximum 10000"},
      {"page_token=garbage", "malformed page_token"},
      {"layer=1", "unknown parameter 'layer'"},
      {"limit=1&limit=2", "parameter 'limit' given twice"},
  };
  for (const auto& [query, message] : bad) {
    auto r = ParseStepsParams("exp", query);
    ASSERT_FALSE(r.ok()) << query;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << query;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << query << ": " << r.status().message();
  }
}

TEST(HttpApiParsing, StepsParametersTakeTheWireNames) {
  std::vector<std::string> deprecated;
  auto req = ParseStepsParams("exp", "start_step=10&end_step=20&page_size=50", &deprecated);
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_EQ(req->start_step(), 10);
  EXPECT_EQ(req->end_step(), 20);
  EXPECT_EQ(req->page_size(), 50u);
  EXPECT_TRUE(deprecated.empty());
}

// Each old name still works, means what its new name means, and says so.
TEST(HttpApiParsing, OldStepsParameterNamesAreDeprecatedAliases) {
  const struct {
    const char* query;
    const char* note;
  } cases[] = {
      {"from=10", "'from' is deprecated: use 'start_step'"},
      {"to=20", "'to' is deprecated: use 'end_step'"},
      {"limit=50", "'limit' is deprecated: use 'page_size'"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> deprecated;
    auto req = ParseStepsParams("exp", c.query, &deprecated);
    ASSERT_TRUE(req.ok()) << c.query << ": " << req.status().ToString();
    EXPECT_EQ(deprecated, std::vector<std::string>{c.note}) << c.query;
  }
  auto from = ParseStepsParams("exp", "from=10");
  auto to = ParseStepsParams("exp", "to=20");
  auto limit = ParseStepsParams("exp", "limit=50");
  EXPECT_EQ(from->start_step(), 10);
  EXPECT_EQ(to->end_step(), 20);
  EXPECT_EQ(limit->page_size(), 50u);
  std::vector<std::string> runs_notes;
  auto runs = ParseRunsParams("limit=7", &runs_notes);
  ASSERT_TRUE(runs.ok());
  EXPECT_EQ(runs->page_size(), 7u);
  EXPECT_EQ(runs_notes, std::vector<std::string>{"'limit' is deprecated: use 'page_size'"});
  runs_notes.clear();
  EXPECT_EQ(ParseRunsParams("page_size=7", &runs_notes)->page_size(), 7u);
  EXPECT_TRUE(runs_notes.empty());
}

TEST(HttpApiParsing, RunsAndSummaryParameters) {
  auto runs = ParseRunsParams("limit=7&page_token=rexp-1");
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  EXPECT_EQ(runs->page_size(), 7u);
  EXPECT_EQ(runs->page_token(), "rexp-1");
  EXPECT_NE(ParseRunsParams("limit=1001").status().message().find("limit 1001 above the maximum 1000"),
            std::string::npos);
  EXPECT_TRUE(ParseRunsParams("page_token=x").status().IsInvalidArgument());
  auto summary = ParseSummaryParams("exp", "window=500");
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->window(), 500u);
  EXPECT_TRUE(ParseSummaryParams("exp", "window=-1").status().IsInvalidArgument());
  EXPECT_TRUE(ParseSummaryParams("exp", "rank=0").status().IsInvalidArgument());
}

TEST(HttpApiParsing, ConfigBodies) {
  auto req = ParseConfigBody(
      "exp", R"({"thresholds": {"c_low": 0.1, "c_high": 0.4, "alpha_mode": "exact"}, "mode": "remote",
                 "reason": "calibrated \u00e9", "expected_version": 3})");
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  EXPECT_EQ(req->run(), "exp");
  EXPECT_DOUBLE_EQ(req->thresholds().c_low(), 0.1);
  EXPECT_DOUBLE_EQ(req->thresholds().c_high(), 0.4);
  EXPECT_EQ(req->thresholds().alpha_mode(), v1::ALPHA_MODE_EXACT);
  EXPECT_EQ(req->mode(), v1::CONTROL_MODE_REMOTE);
  EXPECT_EQ(req->reason(), "calibrated \xc3\xa9");
  EXPECT_EQ(req->expected_version(), 3u);
  auto minimal = ParseConfigBody("exp", R"({"thresholds": {"c_low": 0.05, "c_high": 0.3}, "mode": "local"})");
  ASSERT_TRUE(minimal.ok()) << minimal.status().ToString();
  EXPECT_EQ(minimal->thresholds().alpha_mode(), v1::ALPHA_MODE_PAPER);
  EXPECT_EQ(minimal->expected_version(), 0u);
  EXPECT_EQ(minimal->trigger(), v1::TRIGGER_UNSPECIFIED);  // kept
  EXPECT_EQ(minimal->window(), 0u);
  EXPECT_FALSE(minimal->has_window_thresholds());
  auto windowed = ParseConfigBody(
      "exp", R"({"thresholds": {"c_low": 0.05, "c_high": 0.3}, "mode": "local", "trigger": "window", "window": 40,
                 "window_thresholds": {"c_low": 0.2, "c_high": 0.5}})");
  ASSERT_TRUE(windowed.ok()) << windowed.status().ToString();
  EXPECT_EQ(windowed->trigger(), v1::TRIGGER_WINDOW);
  EXPECT_EQ(windowed->window(), 40u);
  EXPECT_DOUBLE_EQ(windowed->window_thresholds().c_low(), 0.2);
  EXPECT_DOUBLE_EQ(windowed->window_thresholds().c_high(), 0.5);
  EXPECT_EQ(windowed->window_thresholds().alpha_mode(), v1::ALPHA_MODE_PAPER);

  const std::pair<const char*, const char*> bad[] = {
      {"", "body is not a JSON object"},
      {"[1]", "body is not a JSON object"},
      {"{\"thresholds\": ", "body is not a JSON object"},
      {R"({"mode": "local"})", "thresholds are required"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}})", "mode is required"},
      {R"({"thresholds": {"c_low": "0.1", "c_high": 0.4}, "mode": "local"})", "thresholds.c_low: expected a number, got a string"},
      {R"({"thresholds": {"c_low": 0.1}, "mode": "local"})", "c_low and c_high are required"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4, "clow": 1}, "mode": "local"})", "unknown member 'clow'"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4, "alpha_mode": "fast"}, "mode": "local"})", "unknown alpha mode 'fast'"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}, "mode": "auto"})", "unknown mode 'auto'"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}, "mode": 2})", "mode: expected a string, got a number"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}, "mode": "local", "expected_version": 1.5})", "expected_version: expected a non-negative integer"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}, "mode": "local", "expected_version": -1})", "expected_version: expected a non-negative integer"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}, "mode": "local", "version": 1})", "unknown member 'version'"},
      {R"({"thresholds": null, "mode": "local"})", "thresholds: expected an object, got null"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}, "mode": "local", "trigger": "mean"})", "unknown trigger 'mean'"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}, "mode": "local", "window": 0})", "window: expected an integer from 1 to 1000"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}, "mode": "local", "window": 2.5})", "window: expected an integer from 1 to 1000"},
      {R"({"thresholds": {"c_low": 0.1, "c_high": 0.4}, "mode": "local", "window_thresholds": {"c_low": 0.1}})", "window: thresholds: c_low and c_high are required"},
  };
  for (const auto& [body, message] : bad) {
    auto r = ParseConfigBody("exp", body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << body;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << body << ": " << r.status().message();
  }
}

// ------------------------------------------------------------ response shapes

v1::StepRecord FullRecord() {
  v1::StepRecord r;
  r.set_run("team/exp");
  r.set_rank(1);
  r.set_world_size(2);
  r.set_step(123456789012);
  r.set_cosine(-0.25);
  r.set_grad_norm(1.5);
  r.set_ref_norm(2.0);
  r.set_regime(v1::REGIME_PROJECT);
  r.set_alpha(0.2);
  r.set_cosine_after(0.05);
  r.set_staleness(16);
  (*r.mutable_scalars())["reward"] = 0.75;
  (*r.mutable_scalars())["odd \"name\""] = -1;
  v1::LayerRecord* l = r.add_layers();
  l->set_name("layers.0.attn");
  l->set_cosine(0.5);
  l->set_grad_norm(0.25);
  l->set_ref_norm(0.125);
  v1::LayerRecord* first = r.add_layers();  // no reference: no cosine
  first->set_name("layers.0.mlp");
  r.set_wall_time_ns(1795484153874470674);
  r.set_agent_overhead_seconds(2.5e-5);
  r.set_mode(v1::CONTROL_MODE_REMOTE);
  r.set_fallback(true);
  return r;
}

TEST(HttpApiEncoding, StepsPagesCarryEveryFieldOfTheRecord) {
  v1::GetStepsResponse page;
  *page.add_steps() = FullRecord();
  v1::StepRecord bare;  // optional fields absent, mode UNSPECIFIED (monitor)
  bare.set_run("team/exp");
  bare.set_step(7);
  bare.set_regime(v1::REGIME_SAFE);
  *page.add_steps() = bare;
  page.set_next_page_token(EncodeStepToken(7, 0));
  const Value v = ParseJson(EncodeStepsPage("team/exp", page, true, {-0.125, std::nullopt}));
  EXPECT_EQ(JsonMember(v, "run").string_value(), "team/exp");
  EXPECT_EQ(JsonMember(v, "next_page_token").string_value(), "s7.0");
  const auto& steps = JsonMember(v, "steps").list_value();
  ASSERT_EQ(steps.values_size(), 2);
  const Value& s = steps.values(0);
  EXPECT_EQ(JsonMember(s, "run").string_value(), "team/exp");
  EXPECT_EQ(JsonMember(s, "rank").number_value(), 1);
  EXPECT_EQ(JsonMember(s, "world_size").number_value(), 2);
  EXPECT_EQ(JsonMember(s, "step").number_value(), 123456789012.0);
  EXPECT_EQ(JsonMember(s, "cosine").number_value(), -0.25);
  EXPECT_EQ(JsonMember(s, "grad_norm").number_value(), 1.5);
  EXPECT_EQ(JsonMember(s, "ref_norm").number_value(), 2.0);
  EXPECT_EQ(JsonMember(s, "regime").string_value(), "project");
  EXPECT_EQ(JsonMember(s, "alpha").number_value(), 0.2);
  EXPECT_EQ(JsonMember(s, "cosine_after").number_value(), 0.05);
  EXPECT_EQ(JsonMember(s, "staleness").number_value(), 16);
  EXPECT_EQ(JsonMember(JsonMember(s, "scalars"), "reward").number_value(), 0.75);
  EXPECT_EQ(JsonMember(JsonMember(s, "scalars"), "odd \"name\"").number_value(), -1);
  const auto& layers = JsonMember(s, "layers").list_value();
  ASSERT_EQ(layers.values_size(), 2);
  EXPECT_EQ(JsonMember(layers.values(0), "name").string_value(), "layers.0.attn");
  EXPECT_EQ(JsonMember(layers.values(0), "cosine").number_value(), 0.5);
  EXPECT_EQ(JsonMember(layers.values(0), "grad_norm").number_value(), 0.25);
  EXPECT_EQ(JsonMember(layers.values(0), "ref_norm").number_value(), 0.125);
  EXPECT_EQ(JsonMember(layers.values(1), "cosine").kind_case(), Value::kNullValue);
  EXPECT_EQ(JsonMember(s, "wall_time_ns").string_value(), "1795484153874470674");
  EXPECT_EQ(JsonMember(s, "agent_overhead_seconds").number_value(), 2.5e-5);
  EXPECT_EQ(JsonMember(s, "mode").string_value(), "remote");
  EXPECT_TRUE(JsonMember(s, "fallback").bool_value());
  EXPECT_EQ(JsonMember(s, "window_mean").number_value(), -0.125);
  const Value& b = steps.values(1);
  EXPECT_EQ(JsonMember(b, "window_mean").kind_case(), Value::kNullValue);
  EXPECT_EQ(JsonMember(b, "cosine").kind_case(), Value::kNullValue);
  EXPECT_EQ(JsonMember(b, "cosine_after").kind_case(), Value::kNullValue);
  EXPECT_EQ(JsonMember(b, "staleness").kind_case(), Value::kNullValue);
  EXPECT_EQ(JsonMember(b, "mode").string_value(), "monitor");
  EXPECT_EQ(JsonMember(b, "layers").list_value().values_size(), 0);  // asked for: on every record
  // Not asked for: no record has a "layers" member.
  const Value plain = ParseJson(EncodeStepsPage("team/exp", page, false, {}));
  EXPECT_EQ(JsonMember(JsonMember(plain, "steps").list_value().values(0), "layers").kind_case(), Value::KIND_NOT_SET);
  // Without means: no record has a "window_mean" member.
  EXPECT_EQ(JsonMember(JsonMember(plain, "steps").list_value().values(0), "window_mean").kind_case(),
            Value::KIND_NOT_SET);
}

TEST(HttpApiEncoding, SummaryRunsConfigAndErrors) {
  v1::RunInfo info;
  info.set_run("exp");
  info.set_first_step(3);
  info.set_last_step(99);
  info.set_step_records(194);
  info.set_first_seen_ns(1);
  info.set_last_seen_ns(1795484153874470674);
  info.set_world_size(2);
  v1::RunConfig config;
  config.mutable_thresholds()->set_c_low(0.08);
  config.mutable_thresholds()->set_c_high(0.35);
  config.mutable_thresholds()->set_alpha_mode(v1::ALPHA_MODE_EXACT);
  config.set_mode(v1::CONTROL_MODE_REMOTE);
  config.set_version(4);
  config.set_updated_ns(17);
  config.set_updated_by("admin");
  std::vector<v1::StepRecord> steps;
  for (int i = 0; i < 12; ++i) {
    v1::StepRecord r = FullRecord();
    r.clear_layers();
    r.set_step(i);
    r.set_cosine(0.01 * i);
    r.set_regime(i < 8 ? v1::REGIME_SAFE : v1::REGIME_SKIP);
    steps.push_back(r);
  }
  const v1::RunSummary summary = SummarizeRun(info, config, steps);
  const Value v = ParseJson(EncodeSummary(summary, 42));
  EXPECT_EQ(JsonMember(v, "server_time_ns").string_value(), "42");
  const Value& i = JsonMember(v, "info");
  EXPECT_EQ(JsonMember(i, "run").string_value(), "exp");
  EXPECT_EQ(JsonMember(i, "last_step").number_value(), 99);
  EXPECT_EQ(JsonMember(i, "step_records").number_value(), 194);
  EXPECT_EQ(JsonMember(i, "last_seen_ns").string_value(), "1795484153874470674");
  const Value& c = JsonMember(i, "config");
  EXPECT_EQ(JsonMember(JsonMember(c, "thresholds"), "c_low").number_value(), 0.08);
  EXPECT_EQ(JsonMember(JsonMember(c, "thresholds"), "alpha_mode").string_value(), "exact");
  EXPECT_EQ(JsonMember(c, "mode").string_value(), "remote");
  EXPECT_EQ(JsonMember(c, "version").number_value(), 4);
  EXPECT_EQ(JsonMember(c, "updated_by").string_value(), "admin");
  EXPECT_EQ(JsonMember(JsonMember(v, "steps_by_regime"), "safe").number_value(), 8);
  EXPECT_EQ(JsonMember(JsonMember(v, "steps_by_regime"), "skip").number_value(), 4);
  EXPECT_EQ(JsonMember(JsonMember(v, "steps_by_regime"), "project").number_value(), 0);
  const Value& cal = JsonMember(v, "calibration");
  EXPECT_EQ(JsonMember(cal, "count").number_value(), summary.calibration().count());
  EXPECT_EQ(JsonMember(cal, "q90").number_value(), summary.calibration().q90());
  EXPECT_EQ(JsonMember(cal, "fraction_le_c_low").number_value(), summary.calibration().fraction_le_c_low());
  EXPECT_EQ(JsonMember(JsonMember(v, "latest"), "step").number_value(), 11);

  v1::ListRunsResponse runs;
  *runs.add_runs() = info;
  runs.set_next_page_token("rexp");
  const Value r = ParseJson(EncodeRunsPage(runs, 5));
  EXPECT_EQ(JsonMember(r, "runs").list_value().values_size(), 1);
  EXPECT_EQ(JsonMember(r, "next_page_token").string_value(), "rexp");

  const Value cfg = ParseJson(EncodeRunConfig("exp", config));
  EXPECT_EQ(JsonMember(cfg, "run").string_value(), "exp");
  EXPECT_EQ(JsonMember(JsonMember(JsonMember(cfg, "config"), "thresholds"), "c_high").number_value(), 0.35);

  const Value e = ParseJson(EncodeError(base::Status::NotFound("unknown run 'x\"'")));
  EXPECT_EQ(JsonMember(e, "code").string_value(), "NOT_FOUND");
  EXPECT_EQ(JsonMember(e, "message").string_value(), "unknown run 'x\"'");
}

}  // namespace
}  // namespace gac::server
