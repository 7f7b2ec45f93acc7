// gacd's HTTP port end to end: a real gacd process fed a synthetic run over
// gRPC, its JSON API read and written over plain HTTP and checked against
// the gRPC API's answers for the same data (auth, scopes, bad parameters,
// unknown runs, page limits, settings changes, concurrent ingest), and the
// page's files against web/ and web/node_modules.

#include <gtest/gtest.h>
#include <zlib.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gac/controller/controller.h"
#include "gac/proto/convert.h"
#include "gac/proto/record_schema.h"
#include "gac/proto/wire_rules.h"
#include "server/src/metrics.h"
#include "tests/common/test_util.h"
#include "tests/dashboards/synthetic_run.h"
#include "web/latest_step.h"

namespace gac::testing {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Value;

const std::string kSourceDir = GAC_SOURCE_DIR;
constexpr std::size_t kMaxMessageBytes = 65536;

const ListValue& List(const Value& v) { return v.list_value(); }

std::string Gunzip(const std::string& in) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) return "";
  std::string out;
  char buf[65536];
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  int rc;
  do {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof buf - zs.avail_out);
  } while (rc == Z_OK);
  inflateEnd(&zs);
  EXPECT_EQ(rc, Z_STREAM_END);
  return out;
}

void ExpectOptional(const Value& j, bool has, double value, const std::string& what) {
  if (has) {
    EXPECT_EQ(j.number_value(), value) << what;
  } else {
    EXPECT_EQ(j.kind_case(), Value::kNullValue) << what;
  }
}

// The record schema's fields of a JSON step against the record, walked from
// the table (record_schema.h): every field of the table is in the JSON.
void ExpectSchemaFields(const Value& j, const v1::StepRecord& r, const std::string& where) {
  for (const proto::StepField& f : proto::kStepFields) {
    const Value& v = JsonMember(j, f.name);
    const proto::FieldValue want = f.get(r);
    if (!want.present) {
      EXPECT_EQ(v.kind_case(), Value::kNullValue) << where << " " << f.name;
      continue;
    }
    switch (f.type) {
      case proto::FieldType::kReal:
        EXPECT_EQ(v.number_value(), want.real) << where << " " << f.name;
        break;
      case proto::FieldType::kEnum:
        EXPECT_EQ(v.string_value(), f.enum_name(want.integer)) << where << " " << f.name;
        break;
      case proto::FieldType::kBool:
        EXPECT_EQ(v.bool_value(), want.integer != 0) << where << " " << f.name;
        break;
      case proto::FieldType::kInteger:
      case proto::FieldType::kText:
        if (f.json_string) {
          EXPECT_EQ(v.string_value(), std::to_string(want.integer)) << where << " " << f.name;
        } else {
          EXPECT_EQ(v.number_value(), static_cast<double>(want.integer)) << where << " " << f.name;
        }
        break;
    }
  }
}

// A record of the JSON API against the same record read over gRPC.
void ExpectStep(const Value& j, const v1::StepRecord& r, bool layers) {
  const std::string where = r.run() + " step " + std::to_string(r.step()) + " rank " + std::to_string(r.rank());
  ExpectSchemaFields(j, r, where);
  EXPECT_EQ(JsonMember(j, "run").string_value(), r.run()) << where;
  EXPECT_EQ(JsonMember(j, "rank").number_value(), r.rank()) << where;
  EXPECT_EQ(JsonMember(j, "world_size").number_value(), r.world_size()) << where;
  EXPECT_EQ(JsonMember(j, "step").number_value(), static_cast<double>(r.step())) << where;
  ExpectOptional(JsonMember(j, "cosine"), r.has_cosine(), r.cosine(), where + " cosine");
  EXPECT_EQ(JsonMember(j, "grad_norm").number_value(), r.grad_norm()) << where;
  EXPECT_EQ(JsonMember(j, "ref_norm").number_value(), r.ref_norm()) << where;
  EXPECT_EQ(JsonMember(j, "regime").string_value(), controller::RegimeName(*proto::FromProto(r.regime()))) << where;
  EXPECT_EQ(JsonMember(j, "alpha").number_value(), r.alpha()) << where;
  ExpectOptional(JsonMember(j, "cosine_after"), r.has_cosine_after(), r.cosine_after(), where + " cosine_after");
  ExpectOptional(JsonMember(j, "staleness"), r.has_staleness(), static_cast<double>(r.staleness()), where + " staleness");
  const auto& scalars = JsonMember(j, "scalars").struct_value().fields();
  EXPECT_EQ(scalars.size(), r.scalars().size()) << where;
  for (const auto& [name, value] : r.scalars()) {
    ASSERT_TRUE(scalars.count(name)) << where << " " << name;
    EXPECT_EQ(scalars.at(name).number_value(), value) << where << " " << name;
  }
  if (layers) {
    const ListValue& l = List(JsonMember(j, "layers"));
    ASSERT_EQ(l.values_size(), r.layers_size()) << where;
    for (int i = 0; i < r.layers_size(); ++i) {
      EXPECT_EQ(JsonMember(l.values(i), "name").string_value(), r.layers(i).name()) << where;
      ExpectOptional(JsonMember(l.values(i), "cosine"), r.layers(i).has_cosine(), r.layers(i).cosine(), where + " layer");
      EXPECT_EQ(JsonMember(l.values(i), "grad_norm").number_value(), r.layers(i).grad_norm()) << where;
      EXPECT_EQ(JsonMember(l.values(i), "ref_norm").number_value(), r.layers(i).ref_norm()) << where;
    }
  } else {
    EXPECT_EQ(JsonMember(j, "layers").kind_case(), Value::KIND_NOT_SET) << where;
  }
  EXPECT_EQ(JsonMember(j, "wall_time_ns").string_value(), std::to_string(r.wall_time_ns())) << where;
  EXPECT_EQ(JsonMember(j, "agent_overhead_seconds").number_value(), r.agent_overhead_seconds()) << where;
  EXPECT_EQ(JsonMember(j, "mode").string_value(), controller::ModeName(*proto::FromProto(r.mode()))) << where;
  EXPECT_EQ(JsonMember(j, "fallback").bool_value(), r.fallback()) << where;
}

// m_t of each record of `records` ((step, rank) order, every stored record of
// the run from its first): per rank, the mean of the last `w` c_t of valid
// steps up to and including the record; absent before the rank has `w`.
std::vector<std::optional<double>> ReferenceWindowMeans(const std::vector<v1::StepRecord>& records, std::size_t w) {
  std::map<std::uint32_t, std::vector<double>> cosines;
  std::vector<std::optional<double>> out;
  for (const v1::StepRecord& r : records) {
    std::vector<double>& c = cosines[r.rank()];
    if (r.has_cosine() && r.regime() != v1::REGIME_INVALID) c.push_back(r.cosine());
    long double sum = 0;
    for (std::size_t i = c.size() >= w ? c.size() - w : 0; i < c.size(); ++i) sum += c[i];
    out.push_back(c.size() >= w ? std::optional<double>(static_cast<double>(sum / w)) : std::nullopt);
  }
  return out;
}

void ExpectWindowMean(const Value& j, std::optional<double> want, const std::string& where) {
  const Value& m = JsonMember(j, "window_mean");
  if (!want) {
    EXPECT_EQ(m.kind_case(), Value::kNullValue) << where;
    return;
  }
  ASSERT_EQ(m.kind_case(), Value::kNumberValue) << where;
  EXPECT_NEAR(m.number_value(), *want, 1e-15) << where;
}

void ExpectRunInfo(const Value& j, const v1::RunInfo& info) {
  EXPECT_EQ(JsonMember(j, "run").string_value(), info.run());
  EXPECT_EQ(JsonMember(j, "first_step").number_value(), static_cast<double>(info.first_step()));
  EXPECT_EQ(JsonMember(j, "last_step").number_value(), static_cast<double>(info.last_step()));
  EXPECT_EQ(JsonMember(j, "step_records").number_value(), static_cast<double>(info.step_records()));
  EXPECT_EQ(JsonMember(j, "first_seen_ns").string_value(), std::to_string(info.first_seen_ns()));
  EXPECT_EQ(JsonMember(j, "last_seen_ns").string_value(), std::to_string(info.last_seen_ns()));
  EXPECT_EQ(JsonMember(j, "world_size").number_value(), info.world_size());
  EXPECT_EQ(JsonMember(j, "steps_mode").string_value(), proto::EnumName(info.steps_mode()));
  EXPECT_EQ(JsonMember(j, "decisions_applied").bool_value(), proto::ModeApplies(info.steps_mode()));
  const Value& c = JsonMember(j, "config");
  EXPECT_EQ(JsonMember(JsonMember(c, "thresholds"), "c_low").number_value(), info.config().thresholds().c_low());
  EXPECT_EQ(JsonMember(JsonMember(c, "thresholds"), "c_high").number_value(), info.config().thresholds().c_high());
  EXPECT_EQ(JsonMember(c, "version").number_value(), static_cast<double>(info.config().version()));
  EXPECT_EQ(JsonMember(c, "mode").string_value(), controller::ModeName(*proto::FromProto(info.config().mode())));
}

std::string Bearer(const char* token) { return std::string("Authorization: Bearer ") + token; }

class HttpApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir;
    gacd_ = new GacdProcess({"--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
                             "--store=sqlite:" + dir_->File("data"), "--token-file=" + WriteTestTokens(*dir_),
                             "--max-message-bytes=" + std::to_string(kMaxMessageBytes), "--drain-timeout=2s"});
    ASSERT_TRUE(gacd_->Start(dir_->File("ready"))) << gacd_->error();
    // A spiky synthetic run of two ranks with per-layer records, and a run
    // of another scope.
    SyntheticRunOptions o;
    o.run = "exp-web/a";
    o.spike = true;
    o.spike_start = 80;
    o.layers = 6;
    SyntheticRun run(o);
    std::vector<v1::IngestRequest> batches;
    for (int b = 0; b < 30; ++b) {
      std::vector<v1::StepRecord> records;
      for (int s = 0; s < 10; ++s) {
        for (auto& r : run.NextStep()) records.push_back(std::move(r));
      }
      batches.push_back(MakeBatch(b + 1, records));
    }
    ASSERT_TRUE(Client(gacd_->address(), kWriterToken).Ingest(batches).ok());
    std::vector<v1::StepRecord> other;
    for (int s = 0; s < 5; ++s) other.push_back(MakeStep("other-run", s, 0.02));
    ASSERT_TRUE(Client(gacd_->address(), kOtherToken).Ingest({MakeBatch(1, other)}).ok());
  }
  static void TearDownTestSuite() {
    delete gacd_;
    delete dir_;
  }

  static std::optional<HttpReply> Get(const std::string& path, const char* token = kReaderToken) {
    std::vector<std::string> headers;
    if (token != nullptr) headers.push_back(Bearer(token));
    return HttpFetch(gacd_->metrics_address(), "GET", path, headers);
  }
  static std::optional<HttpReply> Put(const std::string& path, const std::string& body,
                                      const char* token = kAdminToken) {
    std::vector<std::string> headers = {"Content-Type: application/json"};
    if (token != nullptr) headers.push_back(Bearer(token));
    return HttpFetch(gacd_->metrics_address(), "PUT", path, headers, body);
  }
  // An answer's status, and its body's error code when it is not 200.
  static void ExpectError(const std::optional<HttpReply>& reply, int status, const std::string& code,
                          const std::string& what) {
    ASSERT_TRUE(reply.has_value()) << what;
    EXPECT_EQ(reply->status, status) << what << ": " << reply->body;
    EXPECT_EQ(reply->Header("content-type"), "application/json") << what;
    EXPECT_EQ(JsonMember(ParseJson(reply->body), "code").string_value(), code) << what << ": " << reply->body;
  }
  static Client Grpc(const char* token = kAdminToken) { return Client(gacd_->address(), token); }

  static ScratchDir* dir_;
  static GacdProcess* gacd_;
};

ScratchDir* HttpApiTest::dir_ = nullptr;
GacdProcess* HttpApiTest::gacd_ = nullptr;

TEST_F(HttpApiTest, ListRunsMatchesGrpcWithTheSameScopesAndPages) {
  v1::ListRunsResponse all;
  ASSERT_TRUE(Grpc(kReaderToken).ListRuns({}, &all).ok());
  ASSERT_EQ(all.runs_size(), 2);
  auto reply = Get("/api/v1/runs");
  ASSERT_TRUE(reply.has_value());
  ASSERT_EQ(reply->status, 200) << reply->body;
  EXPECT_EQ(reply->Header("cache-control"), "no-store");
  const Value v = ParseJson(reply->body);
  ASSERT_EQ(List(JsonMember(v, "runs")).values_size(), 2);
  for (int i = 0; i < 2; ++i) ExpectRunInfo(List(JsonMember(v, "runs")).values(i), all.runs(i));
  EXPECT_EQ(JsonMember(v, "next_page_token").string_value(), "");
  EXPECT_FALSE(JsonMember(v, "server_time_ns").string_value().empty());

  // Pages of one, with gRPC's page tokens.
  v1::ListRunsRequest first;
  first.set_page_size(1);
  v1::ListRunsResponse grpc_page;
  ASSERT_TRUE(Grpc(kReaderToken).ListRuns(first, &grpc_page).ok());
  const Value p1 = ParseJson(Get("/api/v1/runs?limit=1")->body);
  ASSERT_EQ(List(JsonMember(p1, "runs")).values_size(), 1);
  EXPECT_EQ(JsonMember(p1, "next_page_token").string_value(), grpc_page.next_page_token());
  const Value p2 = ParseJson(Get("/api/v1/runs?limit=1&page_token=" + grpc_page.next_page_token())->body);
  ASSERT_EQ(List(JsonMember(p2, "runs")).values_size(), 1);
  ExpectRunInfo(List(JsonMember(p2, "runs")).values(0), all.runs(1));

  // A token lists only the runs it may read; a write-only token none.
  const Value scoped = ParseJson(Get("/api/v1/runs", kOtherToken)->body);
  ASSERT_EQ(List(JsonMember(scoped, "runs")).values_size(), 1);
  EXPECT_EQ(JsonMember(List(JsonMember(scoped, "runs")).values(0), "run").string_value(), "other-run");
  EXPECT_EQ(List(JsonMember(ParseJson(Get("/api/v1/runs", kWriterToken)->body), "runs")).values_size(), 0);
}

TEST_F(HttpApiTest, SummaryMatchesGrpc) {
  for (std::uint32_t window : {0u, 50u}) {
    v1::GetRunSummaryRequest req;
    req.set_run("exp-web/a");
    req.set_window(window);
    v1::RunSummary s;
    ASSERT_TRUE(Grpc(kReaderToken).GetRunSummary(req, &s).ok());
    for (const std::string path : {"/api/v1/runs/exp-web/a", "/api/v1/runs/exp-web/a/summary"}) {
      auto reply = Get(path + (window ? "?window=" + std::to_string(window) : ""));
      ASSERT_TRUE(reply.has_value());
      ASSERT_EQ(reply->status, 200) << reply->body;
      const Value v = ParseJson(reply->body);
      ExpectRunInfo(JsonMember(v, "info"), s.info());
      std::uint64_t total = 0;
      for (const auto& [regime, count] : s.steps_by_regime()) {
        EXPECT_EQ(JsonMember(JsonMember(v, "steps_by_regime"), regime).number_value(), static_cast<double>(count)) << regime;
        total += count;
      }
      EXPECT_EQ(total, window ? window : 300u);
      // A local run: its regimes were applied, and read as themselves.
      EXPECT_EQ(JsonMember(JsonMember(v, "info"), "steps_mode").string_value(), "local");
      for (const char* regime : {"safe", "project", "skip", "invalid"}) {
        EXPECT_EQ(JsonMember(JsonMember(v, "regime_labels"), regime).string_value(), regime);
      }
      const Value& cal = JsonMember(v, "calibration");
      EXPECT_EQ(JsonMember(cal, "count").number_value(), static_cast<double>(s.calibration().count()));
      EXPECT_EQ(JsonMember(cal, "q90").number_value(), s.calibration().q90());
      EXPECT_EQ(JsonMember(cal, "max").number_value(), s.calibration().max());
      EXPECT_EQ(JsonMember(cal, "mean").number_value(), s.calibration().mean());
      EXPECT_EQ(JsonMember(cal, "fraction_le_c_low").number_value(), s.calibration().fraction_le_c_low());
      ASSERT_TRUE(s.calibration().has_suggested());
      EXPECT_EQ(JsonMember(JsonMember(cal, "suggested"), "c_low").number_value(), s.calibration().suggested().c_low());
      ExpectStep(JsonMember(v, "latest"), s.latest(), false);
    }
  }
}

TEST_F(HttpApiTest, StepsMatchGrpcPageByPage) {
  std::vector<v1::StepRecord> grpc_steps;
  ASSERT_TRUE(Grpc(kReaderToken).AllSteps("exp-web/a", &grpc_steps, /*include_layers=*/true).ok());
  ASSERT_EQ(grpc_steps.size(), 600u);
  // The run's window is the default 20; pages of 97 cut windows apart.
  const std::vector<std::optional<double>> means = ReferenceWindowMeans(grpc_steps, 20);
  std::size_t seen = 0;
  std::string token;
  int pages = 0;
  do {
    auto reply = Get("/api/v1/runs/exp-web/a/steps?layers=1&limit=97" + (token.empty() ? "" : "&page_token=" + token));
    ASSERT_TRUE(reply.has_value());
    ASSERT_EQ(reply->status, 200) << reply->body;
    const Value v = ParseJson(reply->body);
    EXPECT_EQ(JsonMember(v, "run").string_value(), "exp-web/a");
    const ListValue& steps = List(JsonMember(v, "steps"));
    ASSERT_LE(steps.values_size(), 97);
    for (const Value& s : steps.values()) {
      ASSERT_LT(seen, grpc_steps.size());
      ExpectWindowMean(s, means[seen], "record " + std::to_string(seen));
      ExpectStep(s, grpc_steps[seen++], true);
    }
    token = JsonMember(v, "next_page_token").string_value();
    ++pages;
  } while (!token.empty() && pages < 100);
  EXPECT_EQ(seen, grpc_steps.size());
  EXPECT_EQ(pages, 7);  // 600 records in pages of 97

  // A range of one rank, without layers: GetSteps of the same request.
  v1::GetStepsRequest req;
  req.set_run("exp-web/a");
  req.set_start_step(95);
  req.set_end_step(140);
  req.set_rank(1);
  v1::GetStepsResponse page;
  ASSERT_TRUE(Grpc(kReaderToken).GetSteps(req, &page).ok());
  ASSERT_EQ(page.steps_size(), 45);
  auto reply = Get("/api/v1/runs/exp-web/a/steps?start_step=95&end_step=140&rank=1");
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->Header("warning"), "");
  const Value v = ParseJson(reply->body);
  ASSERT_EQ(List(JsonMember(v, "steps")).values_size(), 45);
  for (int i = 0; i < 45; ++i) ExpectStep(List(JsonMember(v, "steps")).values(i), page.steps(i), false);
  EXPECT_EQ(JsonMember(v, "next_page_token").string_value(), "");
  // Its m_t reads the rank's records before step 95.
  for (int i = 0; i < 45; ++i) {
    // Rank 1 of step s is record 2 s + 1 of the run.
    const std::size_t at = 2 * static_cast<std::size_t>(page.steps(i).step()) + 1;
    ASSERT_EQ(grpc_steps[at].step(), page.steps(i).step());
    ASSERT_EQ(grpc_steps[at].rank(), 1u);
    ExpectWindowMean(List(JsonMember(v, "steps")).values(i), means[at], "rank 1 record " + std::to_string(i));
  }
  // gac_window_mean is m_t of each rank's last step.
  auto metrics = HttpGet(gacd_->metrics_address(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  for (const std::size_t at : {grpc_steps.size() - 2, grpc_steps.size() - 1}) {
    ASSERT_TRUE(means[at].has_value());
    const std::string series = "gac_window_mean{rank=\"" + std::to_string(grpc_steps[at].rank()) + "\",run=\"exp-web/a\"} ";
    const std::size_t line = metrics->find("\n" + series);
    ASSERT_NE(line, std::string::npos) << series;
    EXPECT_NEAR(std::strtod(metrics->c_str() + line + 1 + series.size(), nullptr), *means[at], 1e-15) << series;
  }
}

// The old query names answer as the new ones, with a Warning header each.
TEST_F(HttpApiTest, DeprecatedQueryNamesAnswerWithAWarning) {
  const std::string steps = "/api/v1/runs/exp-web/a/steps?";
  for (const auto& [old_query, new_query, note] :
       {std::tuple<std::string, std::string, std::string>{"from=95&rank=1", "start_step=95&rank=1",
                                                          "'from' is deprecated: use 'start_step'"},
        {"to=140&rank=1", "end_step=140&rank=1", "'to' is deprecated: use 'end_step'"},
        {"limit=7", "page_size=7", "'limit' is deprecated: use 'page_size'"}}) {
    auto old_reply = Get(steps + old_query);
    auto new_reply = Get(steps + new_query);
    ASSERT_TRUE(old_reply.has_value() && new_reply.has_value());
    ASSERT_EQ(old_reply->status, 200) << old_reply->body;
    // The same page (scalars are a map: their order is not part of the answer).
    const Value a = ParseJson(old_reply->body), b = ParseJson(new_reply->body);
    ASSERT_EQ(List(JsonMember(a, "steps")).values_size(), List(JsonMember(b, "steps")).values_size()) << old_query;
    for (int i = 0; i < List(JsonMember(a, "steps")).values_size(); ++i) {
      for (const char* key : {"step", "rank"}) {
        EXPECT_EQ(JsonMember(List(JsonMember(a, "steps")).values(i), key).number_value(),
                  JsonMember(List(JsonMember(b, "steps")).values(i), key).number_value())
            << old_query;
      }
    }
    EXPECT_EQ(JsonMember(a, "next_page_token").string_value(), JsonMember(b, "next_page_token").string_value());
    EXPECT_EQ(old_reply->Header("warning"), "299 - \"" + note + "\"") << old_query;
    EXPECT_EQ(new_reply->Header("warning"), "") << new_query;
  }
  auto runs = Get("/api/v1/runs?limit=1");
  ASSERT_TRUE(runs.has_value());
  EXPECT_EQ(runs->status, 200);
  EXPECT_EQ(runs->Header("warning"), "299 - \"'limit' is deprecated: use 'page_size'\"");
}

// A record of `run` with every field of the record schema set (valid on
// ingest, each unlike its default).
v1::StepRecord EveryFieldRecord(const std::string& run) {
  v1::StepRecord r = MakeStep(run, 0, 0.02);
  for (std::size_t i = 0; i < proto::kStepFieldCount; ++i) {
    const proto::StepField& f = proto::kStepFields[i];
    proto::FieldValue v;
    switch (f.type) {
      case proto::FieldType::kReal: v.real = 0.03125 * static_cast<double>(i + 1); break;
      case proto::FieldType::kEnum: v.integer = 2; break;  // REGIME_PROJECT, CONTROL_MODE_LOCAL
      case proto::FieldType::kBool: v.integer = 1; break;
      default: v.integer = 100 + static_cast<std::int64_t>(i); break;
    }
    f.set(v, &r);
  }
  return r;
}

// Such a record comes back from the JSON API as it went in.
TEST_F(HttpApiTest, EveryFieldOfTheRecordSchemaRoundTripsThroughJson) {
  const v1::StepRecord want = EveryFieldRecord("exp-web/every");
  ASSERT_TRUE(Client(gacd_->address(), kWriterToken).Ingest({MakeBatch(1, {want})}).ok());
  auto reply = Get("/api/v1/runs/exp-web/every/steps?layers=1");
  ASSERT_TRUE(reply.has_value());
  ASSERT_EQ(reply->status, 200) << reply->body;
  const Value page = ParseJson(reply->body);
  const ListValue& steps = List(JsonMember(page, "steps"));
  ASSERT_EQ(steps.values_size(), 1);
  ExpectStep(steps.values(0), want, true);
}

// /api/v1/fields describes the record schema's fields in its order, and
// every gauge it names is exported with the value of the run's latest record.
TEST_F(HttpApiTest, FieldsDescribeTheRecordAndEveryGaugeNamedIsExported) {
  const v1::StepRecord r = EveryFieldRecord("exp-web/fields");
  ASSERT_TRUE(Client(gacd_->address(), kWriterToken).Ingest({MakeBatch(1, {r})}).ok());
  auto reply = Get("/api/v1/fields");
  ASSERT_TRUE(reply.has_value());
  ASSERT_EQ(reply->status, 200) << reply->body;
  const Value doc = ParseJson(reply->body);
  const ListValue& fields = List(JsonMember(doc, "fields"));
  ASSERT_EQ(static_cast<std::size_t>(fields.values_size()), proto::kStepFieldCount);
  auto metrics = HttpGet(gacd_->metrics_address(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  int gauges = 0, on_page = 0;
  for (std::size_t i = 0; i < proto::kStepFieldCount; ++i) {
    const proto::StepField& f = proto::kStepFields[i];
    const Value& j = fields.values(static_cast<int>(i));
    EXPECT_EQ(JsonMember(j, "name").string_value(), f.name);
    EXPECT_EQ(JsonMember(j, "optional").bool_value(), f.optional) << f.name;
    EXPECT_EQ(JsonMember(j, "help").string_value(), f.help) << f.name;
    EXPECT_EQ(JsonMember(j, "unit").string_value(), f.unit) << f.name;
    const Value& gauge = JsonMember(j, "gauge");
    const char* gauge_name = server::FieldGaugeName(f.name);
    if (gauge_name == nullptr) {
      EXPECT_EQ(gauge.kind_case(), Value::kNullValue) << f.name;
    } else {
      ++gauges;
      EXPECT_EQ(gauge.string_value(), gauge_name);
      // The exported series, and its value (the record's, written as a number).
      const std::string series =
          std::string(gauge_name) + "{rank=\"" + std::to_string(r.rank()) + "\",run=\"exp-web/fields\"} ";
      const std::size_t at = metrics->find(series);
      ASSERT_NE(at, std::string::npos) << series << " not in /metrics";
      const double shown = std::stod(metrics->substr(at + series.size()));
      const proto::FieldValue v = f.get(r);
      EXPECT_EQ(shown, f.type == proto::FieldType::kReal ? v.real : static_cast<double>(v.integer)) << f.name;
    }
    const Value& page = JsonMember(j, "page");
    const web::LatestStepRow* row = web::FindLatestStepRow(f.name);
    if (row == nullptr) {
      EXPECT_EQ(page.kind_case(), Value::kNullValue) << f.name;
    } else {
      ++on_page;
      EXPECT_EQ(JsonMember(page, "label").string_value(), row->label);
      EXPECT_EQ(JsonMember(page, "digits").number_value(), row->digits) << f.name;
      EXPECT_EQ(JsonMember(page, "place").number_value(), row->place) << f.name;
    }
  }
  EXPECT_GT(gauges, 0);
  EXPECT_GT(on_page, 0);
}

// Each field of the record schema is on the page's "Latest step" card
// (web/latest_step.h) or is left out here with the reason; a field added to
// the schema, or a row of the card that names no field, fails here until
// that is decided. The card's places are its own and taken once.
TEST(PageFieldsTest, EveryFieldIsOnTheCardOrSaysWhyNot) {
  const std::map<std::string, std::string> not_on_page = {
      {"rank", "the rank selector"},
      {"world_size", "the rank selector's choices"},
      {"alpha", "shown through the regime (project) and the cosine after; gacctl steps lists it"},
      {"wall_time_ns", "the card's \"last report\", from the run's last_seen_ns"},
      {"agent_overhead_seconds", "an operator's figure: gac_agent_overhead_seconds and gacctl steps"},
      {"mode", "the regime's text (monitor mode: what GAC would have done) and the regimes card"},
      {"fallback", "gac_controller_fallbacks_total and gacctl steps"},
      {"c_low", "the card's \"decided with\" and the charts' bands"},
      {"c_high", "the card's \"decided with\" and the charts' bands"},
      {"trigger", "the charts' bands"},
      {"window", "the m_t chart's title"},
      {"window_c_low", "the m_t chart's bands"},
      {"window_c_high", "the m_t chart's bands"},
      {"loss_z", "the spike guard's loss z-score: gac_loss_z and gacctl steps (the page marks spike steps)"},
      {"policy_tokens", "policy health: gacctl steps and gac_policy_tokens"},
      {"ess_sequence", "policy health: the ESS chart draws it beside the tokens' ESS"},
      {"truncation_fraction", "policy health: gacctl steps and the Grafana row"},
      {"log_ratio_max", "policy health: the log-ratio tails are the Grafana row's"},
      {"log_ratio_p99", "policy health: the Grafana row"},
      {"log_ratio_p1", "policy health: the Grafana row"},
      {"log_ratio_abs_mean", "policy health: the Grafana row (the card shows KL)"},
      {"staleness_min", "policy health: the card shows the configured staleness; the Grafana row the batch's"},
      {"staleness_mean", "policy health: the Grafana row"},
      {"staleness_max", "policy health: the Grafana row"},
      {"policy_invalid", "an invalid batch leaves the card's signals empty; gacctl steps"},
  };
  for (const proto::StepField& f : proto::kStepFields) {
    EXPECT_NE(web::FindLatestStepRow(f.name) != nullptr, not_on_page.count(f.name) == 1)
        << f.name << ": give it a row on the card, or say in not_on_page why not";
  }
  std::set<int> places = {web::kPlaceWindowMean, web::kPlaceDecidedWith, web::kPlaceLastReport};
  for (const web::LatestStepRow& row : web::kLatestStepRows) {
    EXPECT_NE(proto::FindStepField(row.field), nullptr) << row.field << " is no field of the record";
    EXPECT_TRUE(places.insert(row.place).second) << row.field << ": place " << row.place << " taken";
    EXPECT_GT(row.place, 0) << row.field;
    EXPECT_GE(row.digits, -1) << row.field;
  }
}

// A run whose steps ran in monitor mode reads as what GAC would have done,
// whatever mode its settings name.
TEST_F(HttpApiTest, MonitorModeRunsReadAsWhatGacWouldHaveDone) {
  std::vector<v1::StepRecord> records;
  for (int step = 0; step < 6; ++step) {
    v1::StepRecord r = MakeStep("exp-web/monitor", step, 0.5);
    r.set_mode(v1::CONTROL_MODE_MONITOR);
    r.set_regime(step % 2 == 0 ? v1::REGIME_SKIP : v1::REGIME_PROJECT);
    records.push_back(r);
  }
  ASSERT_TRUE(Client(gacd_->address(), kWriterToken).Ingest({MakeBatch(1, records)}).ok());
  const Value v = ParseJson(Get("/api/v1/runs/exp-web/monitor")->body);
  EXPECT_EQ(JsonMember(JsonMember(v, "info"), "steps_mode").string_value(), "monitor");
  EXPECT_FALSE(JsonMember(JsonMember(v, "info"), "decisions_applied").bool_value());
  const Value& labels = JsonMember(v, "regime_labels");
  EXPECT_EQ(JsonMember(labels, "skip").string_value(), "would skip");
  EXPECT_EQ(JsonMember(labels, "project").string_value(), "would project");
  EXPECT_EQ(JsonMember(labels, "safe").string_value(), "safe");
  EXPECT_EQ(JsonMember(JsonMember(v, "steps_by_regime"), "skip").number_value(), 3.0);
  bool listed = false;
  const Value runs = ParseJson(Get("/api/v1/runs")->body);
  for (const Value& run : List(JsonMember(runs, "runs")).values()) {
    if (JsonMember(run, "run").string_value() != "exp-web/monitor") continue;
    listed = true;
    EXPECT_EQ(JsonMember(run, "steps_mode").string_value(), "monitor");
    EXPECT_FALSE(JsonMember(run, "decisions_applied").bool_value());
  }
  EXPECT_TRUE(listed);
  // Its skips are not counted as skipped updates; its steps are, under mode="monitor".
  auto metrics = HttpGet(gacd_->metrics_address(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_NE(metrics->find("gac_steps_total{mode=\"monitor\",rank=\"0\",regime=\"skip\",run=\"exp-web/monitor\"} 3"),
            std::string::npos);
  EXPECT_NE(metrics->find("gac_skipped_updates_total{rank=\"0\",run=\"exp-web/monitor\"} 0"), std::string::npos);
}

TEST_F(HttpApiTest, ReadsNeedTheReadRightOnTheRun) {
  const std::string path = "/api/v1/runs/exp-web/a/steps?limit=1";
  auto missing = Get(path, nullptr);
  ExpectError(missing, 401, "UNAUTHENTICATED", "no token");
  EXPECT_EQ(missing->Header("www-authenticate"), "Bearer realm=\"gacd\"");
  ExpectError(HttpFetch(gacd_->metrics_address(), "GET", path, {"Authorization: Bearer not-a-known-token-123"}), 401,
              "UNAUTHENTICATED", "unknown token");
  ExpectError(HttpFetch(gacd_->metrics_address(), "GET", path, {"Authorization: Basic abc"}), 401,
              "UNAUTHENTICATED", "not a bearer token");
  ExpectError(Get(path, kOtherToken), 403, "PERMISSION_DENIED", "another scope");
  ExpectError(Get(path, kWriterToken), 403, "PERMISSION_DENIED", "write right only");
  ExpectError(Get("/api/v1/runs/exp-web/a", kOtherToken), 403, "PERMISSION_DENIED", "summary, another scope");
  ExpectError(Get("/api/v1/runs/exp-web/a/config", kWriterToken), 403, "PERMISSION_DENIED", "config, write only");
  ExpectError(Get("/api/v1/runs", nullptr), 401, "UNAUTHENTICATED", "runs without a token");
  ExpectError(Get("/api/v1/fields", nullptr), 401, "UNAUTHENTICATED", "fields without a token");
  EXPECT_EQ(Get("/api/v1/fields", kWriterToken)->status, 200);  // any token: no run is read
  EXPECT_EQ(Get(path, kAdminToken)->status, 200);
}

TEST_F(HttpApiTest, BadParametersUnknownRunsAndEndpoints) {
  struct Case {
    std::string path;
    int status;
    const char* code;
    const char* message;  // part of the message
  };
  const Case cases[] = {
      {"/api/v1/runs/exp-nothing/steps", 404, "NOT_FOUND", "unknown run 'exp-nothing'"},
      {"/api/v1/runs/exp-nothing", 404, "NOT_FOUND", "unknown run 'exp-nothing'"},
      {"/api/v1/runs/exp%20bad", 400, "INVALID_ARGUMENT", "run"},
      {"/api/v1/runs/exp-web/a/steps?limit=10001", 400, "INVALID_ARGUMENT", "limit 10001 above the maximum 10000"},
      {"/api/v1/runs/exp-web/a/steps?limit=18446744073709551616", 400, "INVALID_ARGUMENT", "above the maximum 10000"},
      {"/api/v1/runs?limit=1001", 400, "INVALID_ARGUMENT", "limit 1001 above the maximum 1000"},
      {"/api/v1/runs/exp-web/a/steps?from=-3", 400, "INVALID_ARGUMENT", "from: expected a non-negative integer"},
      {"/api/v1/runs/exp-web/a/steps?from=10&to=10", 400, "INVALID_ARGUMENT", "end_step must be above start_step"},
      {"/api/v1/runs/exp-web/a/steps?start_step=10&end_step=10", 400, "INVALID_ARGUMENT",
       "end_step must be above start_step"},
      {"/api/v1/runs/exp-web/a/steps?page_size=10001", 400, "INVALID_ARGUMENT", "page_size 10001 above the maximum 10000"},
      {"/api/v1/runs/exp-web/a/steps?from=1&start_step=1", 400, "INVALID_ARGUMENT", "given twice"},
      {"/api/v1/runs/exp-web/a/steps?rank=one", 400, "INVALID_ARGUMENT", "rank: expected a non-negative integer"},
      {"/api/v1/runs/exp-web/a/steps?layers=yes", 400, "INVALID_ARGUMENT", "layers: expected true or false"},
      {"/api/v1/runs/exp-web/a/steps?page_token=zzz", 400, "INVALID_ARGUMENT", "malformed page_token"},
      {"/api/v1/runs/exp-web/a/steps?first=1", 400, "INVALID_ARGUMENT", "unknown parameter 'first'"},
      {"/api/v1/runs/exp-web/a/steps?from=%zz", 400, "INVALID_ARGUMENT", "malformed query string"},
      {"/api/v1/runs/exp-web/a?window=x", 400, "INVALID_ARGUMENT", "window: expected a non-negative integer"},
      {"/api/v1/runs/exp-web/a/config?x=1", 400, "INVALID_ARGUMENT", "unknown parameter 'x'"},
      {"/api/v1/fields?x=1", 400, "INVALID_ARGUMENT", "unknown parameter 'x'"},
      {"/api/v1/nothing", 404, "NOT_FOUND", "no such endpoint"},
  };
  for (const Case& c : cases) {
    auto reply = Get(c.path, kAdminToken);
    ExpectError(reply, c.status, c.code, c.path);
    EXPECT_NE(JsonMember(ParseJson(reply->body), "message").string_value().find(c.message), std::string::npos)
        << c.path << ": " << reply->body;
  }
  // A known resource, another method.
  auto post = HttpFetch(gacd_->metrics_address(), "POST", "/api/v1/runs/exp-web/a/steps", {Bearer(kAdminToken)}, "{}");
  ExpectError(post, 405, "UNIMPLEMENTED", "POST steps");
  EXPECT_EQ(post->Header("allow"), "GET");
  auto del = HttpFetch(gacd_->metrics_address(), "DELETE", "/api/v1/runs/exp-web/a/config", {Bearer(kAdminToken)});
  ExpectError(del, 405, "UNIMPLEMENTED", "DELETE config");
  EXPECT_EQ(del->Header("allow"), "GET, PUT");
  auto put = HttpFetch(gacd_->metrics_address(), "PUT", "/api/v1/fields", {Bearer(kAdminToken)}, "{}");
  ExpectError(put, 405, "UNIMPLEMENTED", "PUT fields");
  EXPECT_EQ(put->Header("allow"), "GET");
  // Counted with gRPC's errors.
  auto metrics = HttpGet(gacd_->metrics_address(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_NE(metrics->find("gac_rpc_errors_total{code=\"INVALID_ARGUMENT\",method=\"http.GetSteps\"}"),
            std::string::npos);
  EXPECT_NE(metrics->find("gac_rpc_errors_total{code=\"NOT_FOUND\",method=\"http.GetRunSummary\"}"),
            std::string::npos);
}

TEST_F(HttpApiTest, ConfigReadsAndChangesAsSetRunConfigDoes) {
  // A run never seen reads as the defaults, as over gRPC.
  v1::RunConfig defaults;
  ASSERT_TRUE(Grpc().GetRunConfig("exp-cfg", &defaults).ok());
  auto got = Get("/api/v1/runs/exp-cfg/config");
  ASSERT_EQ(got->status, 200) << got->body;
  const Value d = ParseJson(got->body);
  EXPECT_EQ(JsonMember(d, "run").string_value(), "exp-cfg");
  EXPECT_EQ(JsonMember(JsonMember(JsonMember(d, "config"), "thresholds"), "c_low").number_value(), defaults.thresholds().c_low());
  EXPECT_EQ(JsonMember(JsonMember(d, "config"), "version").number_value(), 0);

  // Who may change it.
  const std::string body = R"({"thresholds": {"c_low": 0.08, "c_high": 0.35, "alpha_mode": "exact"},
                               "mode": "remote", "reason": "from the page", "expected_version": 0})";
  ExpectError(Put("/api/v1/runs/exp-cfg/config", body, nullptr), 401, "UNAUTHENTICATED", "no token");
  ExpectError(Put("/api/v1/runs/exp-cfg/config", body, "not-a-known-token-123"), 401, "UNAUTHENTICATED", "unknown");
  ExpectError(Put("/api/v1/runs/exp-cfg/config", body, kReaderToken), 403, "PERMISSION_DENIED", "read-only token");
  ExpectError(Put("/api/v1/runs/exp-cfg/config", body, kWriterToken), 403, "PERMISSION_DENIED", "write token");

  // Refusals carry the server's validation message, the same as over gRPC.
  v1::SetRunConfigRequest bad;
  bad.set_run("exp-cfg");
  bad.mutable_thresholds()->set_c_low(0.5);
  bad.mutable_thresholds()->set_c_high(0.4);
  bad.set_mode(v1::CONTROL_MODE_LOCAL);
  v1::RunConfig unused;
  const grpc::Status grpc_refusal = Grpc().SetRunConfig(bad, &unused);
  ASSERT_EQ(grpc_refusal.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto refused = Put("/api/v1/runs/exp-cfg/config", R"({"thresholds": {"c_low": 0.5, "c_high": 0.4}, "mode": "local"})");
  ExpectError(refused, 400, "INVALID_ARGUMENT", "c_low above c_high");
  EXPECT_EQ(JsonMember(ParseJson(refused->body), "message").string_value(), grpc_refusal.error_message());
  ExpectError(Put("/api/v1/runs/exp-cfg/config", "{not json"), 400, "INVALID_ARGUMENT", "not JSON");
  ExpectError(Put("/api/v1/runs/exp-cfg/config", std::string(kMaxMessageBytes + 1, ' ')), 413, "RESOURCE_EXHAUSTED",
              "a body above --max-message-bytes");

  // The change, then one from a stale version.
  auto changed = Put("/api/v1/runs/exp-cfg/config", body);
  ASSERT_EQ(changed->status, 200) << changed->body;
  const Value c = JsonMember(ParseJson(changed->body), "config");  // a copy
  EXPECT_EQ(JsonMember(c, "version").number_value(), 1);
  EXPECT_EQ(JsonMember(c, "updated_by").string_value(), "admin");
  EXPECT_EQ(JsonMember(c, "mode").string_value(), "remote");
  // expected_version 0 applies always; another version than the current one is refused.
  const std::string stale = R"({"thresholds": {"c_low": 0.09, "c_high": 0.35}, "mode": "remote", "expected_version": 7})";
  ExpectError(Put("/api/v1/runs/exp-cfg/config", stale), 409, "ABORTED", "stale expected_version");

  // Stored as a SetRunConfig would store it, with its audit record.
  v1::RunConfig now;
  ASSERT_TRUE(Grpc().GetRunConfig("exp-cfg", &now).ok());
  EXPECT_EQ(now.version(), 1u);
  EXPECT_EQ(now.thresholds().c_low(), 0.08);
  EXPECT_EQ(now.thresholds().c_high(), 0.35);
  EXPECT_EQ(now.thresholds().alpha_mode(), v1::ALPHA_MODE_EXACT);
  EXPECT_EQ(now.mode(), v1::CONTROL_MODE_REMOTE);
  v1::ListConfigChangesRequest lreq;
  lreq.set_run("exp-cfg");
  v1::ListConfigChangesResponse changes;
  ASSERT_TRUE(Grpc().ListConfigChanges(lreq, &changes).ok());
  ASSERT_EQ(changes.changes_size(), 1);
  EXPECT_EQ(changes.changes(0).reason(), "from the page");
  EXPECT_EQ(changes.changes(0).after().updated_by(), "admin");
  const Value read_back = ParseJson(Get("/api/v1/runs/exp-cfg/config")->body);
  EXPECT_EQ(JsonMember(JsonMember(JsonMember(read_back, "config"), "thresholds"), "alpha_mode").string_value(), "exact");
}

// The spike guard through PUT …/config: given, kept when left out, null
// turns it off; bad values are refused naming the setting.
TEST_F(HttpApiTest, TheSpikeGuardIsSetKeptAndTurnedOff) {
  const std::string path = "/api/v1/runs/exp-guard/config";
  const std::string base = R"({"thresholds": {"c_low": 0.05, "c_high": 0.3}, "mode": "remote")";
  for (const auto& [spike, message] :
       {std::pair{R"({"sigma": 0})", "spike.sigma must be finite and > 0"},
        std::pair{R"({"sigma": -2})", "spike.sigma must be finite and > 0"},
        std::pair{R"({"window": 1})", "spike_window must be in [2, 10000]"},
        std::pair{R"({"window": 2.5})", "spike.window: expected an integer"},
        std::pair{R"({"max_grad_norm": -1})", "max_grad_norm must be finite and >= 0"},
        std::pair{R"({"window": 8, "warmup": 9})", "spike_warmup must be in [2, spike_window=8]"},
        std::pair{R"({"rho": 1})", "spike: unknown member 'rho'"},
        std::pair{R"(7)", "spike"}}) {
    auto refused = Put(path, base + R"(, "spike": )" + spike + "}");
    ExpectError(refused, 400, "INVALID_ARGUMENT", spike);
    EXPECT_NE(JsonMember(ParseJson(refused->body), "message").string_value().find(message), std::string::npos)
        << refused->body;
  }
  auto set = Put(path, base + R"(, "spike": {"sigma": 5, "window": 64, "max_grad_norm": 1000}})");
  ASSERT_EQ(set->status, 200) << set->body;
  const Value guard = JsonMember(JsonMember(ParseJson(set->body), "config"), "spike");
  EXPECT_EQ(JsonMember(guard, "sigma").number_value(), 5);
  EXPECT_EQ(JsonMember(guard, "window").number_value(), 64);
  EXPECT_EQ(JsonMember(guard, "warmup").number_value(), 32);
  EXPECT_EQ(JsonMember(guard, "max_grad_norm").number_value(), 1000);
  v1::RunConfig now;
  ASSERT_TRUE(Grpc().GetRunConfig("exp-guard", &now).ok());
  EXPECT_TRUE(now.spike().zscore());
  EXPECT_EQ(now.spike().window(), 64u);
  ASSERT_EQ(Put(path, base + "}")->status, 200);  // left out: kept
  ASSERT_TRUE(Grpc().GetRunConfig("exp-guard", &now).ok());
  EXPECT_EQ(now.spike().sigma(), 5.0);
  auto off = Put(path, base + R"(, "spike": null})");
  ASSERT_EQ(off->status, 200) << off->body;
  EXPECT_EQ(JsonMember(JsonMember(ParseJson(off->body), "config"), "spike").kind_case(), Value::kNullValue);
  ASSERT_TRUE(Grpc().GetRunConfig("exp-guard", &now).ok());
  EXPECT_FALSE(now.has_spike());
}

TEST_F(HttpApiTest, ReadsWhileARunIsIngested) {
  constexpr int kSteps = 400;
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  grpc::Status ingest_status;
  int acks = 0;
  std::thread ingest([&] {
    Client w = Grpc(kWriterToken);
    auto ctx = w.Context(60000);
    auto stream = w.ingest().Ingest(ctx.get());
    for (int s = 0; s < kSteps; ++s) {
      if (s == kSteps / 2) {
        // Half the run is in: go on once three reads have seen it grow.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (reads < 3 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      v1::StepRecord r = MakeStep("exp-live", s, 0.01 * (s % 7));
      for (int l = 0; l < 20; ++l) {
        v1::LayerRecord* layer = r.add_layers();
        layer->set_name("layer." + std::to_string(l));
        layer->set_cosine(0.001 * l);
        layer->set_grad_norm(1);
        layer->set_ref_norm(1);
      }
      v1::IngestAck ack;
      if (!stream->Write(MakeBatch(s + 1, {r})) || !stream->Read(&ack)) break;
      acks += ack.stored() == 1 ? 1 : 0;
    }
    stream->WritesDone();
    ingest_status = stream->Finish();
    done = true;
  });
  // Read every step and the summary over and over while the run grows.
  int reads_during_ingest = 0;
  std::int64_t seen_last = -1;
  for (int attempt = 0; !done || seen_last < kSteps - 1; ++attempt) {
    ASSERT_LT(attempt, 100000);
    const bool ingesting = !done;
    auto reply = Get("/api/v1/runs/exp-live/steps?layers=1&limit=10000");
    ASSERT_TRUE(reply.has_value());
    if (reply->status == 404) continue;  // the first batch is not committed yet
    ASSERT_EQ(reply->status, 200) << reply->body;
    const Value page = ParseJson(reply->body);
    const ListValue& steps = List(JsonMember(page, "steps"));
    // A committed prefix, in order, each record whole.
    for (int i = 0; i < steps.values_size(); ++i) {
      ASSERT_EQ(JsonMember(steps.values(i), "step").number_value(), i);
      ASSERT_EQ(List(JsonMember(steps.values(i), "layers")).values_size(), 20);
    }
    ASSERT_GE(steps.values_size() - 1, seen_last);
    seen_last = steps.values_size() - 1;
    auto summary = Get("/api/v1/runs/exp-live");
    ASSERT_TRUE(summary.has_value());
    ASSERT_EQ(summary->status, 200) << summary->body;
    EXPECT_GE(JsonMember(JsonMember(ParseJson(summary->body), "info"), "last_step").number_value(), seen_last);
    ++reads;
    if (ingesting) ++reads_during_ingest;
  }
  ingest.join();
  ASSERT_TRUE(ingest_status.ok()) << ingest_status.error_message();
  EXPECT_EQ(acks, kSteps);
  EXPECT_EQ(seen_last, kSteps - 1);
  EXPECT_GE(reads_during_ingest, 3);
  std::printf("%d HTTP reads, %d of them while the run was ingested\n", reads.load(), reads_during_ingest);
}

TEST_F(HttpApiTest, ServesThePageCompiledIn) {
  const std::string addr = gacd_->metrics_address();
  auto index = HttpFetch(addr, "GET", "/");
  ASSERT_TRUE(index.has_value());
  EXPECT_EQ(index->status, 200);
  EXPECT_EQ(index->Header("content-type"), "text/html; charset=utf-8");
  EXPECT_NE(index->Header("content-security-policy").find("default-src 'self'"), std::string::npos);
  EXPECT_EQ(index->body, ReadFileOrDie(kSourceDir + "/web/index.html"));
  const std::pair<std::string, std::string> files[] = {
      {"/app.js", "web/app.js"},
      {"/style.css", "web/style.css"},
      {"/vendor/uPlot.iife.min.js", "web/node_modules/uplot/dist/uPlot.iife.min.js"},
      {"/vendor/uPlot.min.css", "web/node_modules/uplot/dist/uPlot.min.css"},
  };
  for (const auto& [path, file] : files) {
    const std::string expected = ReadFileOrDie(kSourceDir + "/" + file);
    auto plain = HttpFetch(addr, "GET", path);
    ASSERT_TRUE(plain.has_value()) << path;
    EXPECT_EQ(plain->status, 200) << path;
    EXPECT_EQ(plain->body, expected) << path;
    auto zipped = HttpFetch(addr, "GET", path, {"Accept-Encoding: gzip, deflate"});
    EXPECT_EQ(zipped->Header("content-encoding"), "gzip") << path;
    EXPECT_LT(zipped->body.size(), expected.size()) << path;
    EXPECT_EQ(Gunzip(zipped->body), expected) << path;
    const std::string etag = plain->Header("etag");
    ASSERT_FALSE(etag.empty()) << path;
    auto again = HttpFetch(addr, "GET", path, {"If-None-Match: " + etag});
    EXPECT_EQ(again->status, 304) << path;
    EXPECT_EQ(again->body, "") << path;
  }
  EXPECT_EQ(HttpFetch(addr, "GET", "/nothing.js")->status, 404);
  EXPECT_EQ(HttpFetch(addr, "POST", "/", {}, "x")->status, 405);
}

TEST_F(HttpApiTest, MetricsStayWhatTheExposerServed) {
  const std::string addr = gacd_->metrics_address();
  auto plain = HttpFetch(addr, "GET", "/metrics");
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->status, 200);
  EXPECT_EQ(plain->Header("content-type"), "text/plain; charset=utf-8");
  EXPECT_EQ(plain->body.rfind("# HELP exposer_transferred_bytes_total Transferred bytes to metrics services\n", 0), 0u)
      << plain->body.substr(0, 200);
  EXPECT_NE(plain->body.find("\nexposer_scrapes_total "), std::string::npos);
  EXPECT_NE(plain->body.find("\ngac_steps_total{"), std::string::npos);
  auto zipped = HttpFetch(addr, "GET", "/metrics", {"Accept-Encoding: gzip"});
  EXPECT_EQ(zipped->Header("content-encoding"), "gzip");
  const std::string text = Gunzip(zipped->body);
  EXPECT_NE(text.find("\ngac_steps_total{"), std::string::npos);
  // The same series (names and labels) in both.
  const auto series = [](const std::string& body) {
    std::vector<std::string> names;
    for (std::size_t at = 0; at < body.size();) {
      const std::size_t end = body.find('\n', at);
      const std::string line = body.substr(at, end - at);
      if (!line.empty() && line[0] != '#') names.push_back(line.substr(0, line.rfind(' ')));
      at = end == std::string::npos ? body.size() : end + 1;
    }
    return names;
  };
  EXPECT_EQ(series(text), series(plain->body));
}

TEST(HttpApiInsecure, AnswersOnlyOnLoopback) {
  ScratchDir dir;
  GacdProcess local({"--insecure", "--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--store=memory"});
  ASSERT_TRUE(local.Start(dir.File("ready-local"))) << local.error();
  auto ok = HttpFetch(local.metrics_address(), "GET", "/api/v1/runs");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200) << ok->body;

  GacdProcess open({"--insecure", "--listen=127.0.0.1:0", "--http-listen=0.0.0.0:0", "--store=memory"});
  ASSERT_TRUE(open.Start(dir.File("ready-open"))) << open.error();
  const std::string port = open.metrics_address().substr(open.metrics_address().rfind(':') + 1);
  auto refused = HttpFetch("127.0.0.1:" + port, "GET", "/api/v1/runs");
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 403) << refused->body;
  EXPECT_NE(refused->body.find("loopback"), std::string::npos) << refused->body;
  auto metrics = HttpFetch("127.0.0.1:" + port, "GET", "/metrics");
  EXPECT_EQ(metrics->status, 200);  // /metrics stays open, as before
}

}  // namespace
}  // namespace gac::testing
