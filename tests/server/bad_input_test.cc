// The catalogue of bad inputs: each case asserts its status code and that the
// store, the run settings and the step counters are exactly as before.

#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cctype>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <sstream>
#include <limits>
#include <map>
#include <random>

#include "server/src/metrics.h"
#include "server/src/validate.h"
#include "tests/common/test_util.h"

namespace gac::testing {
namespace {

using server::GacServer;
using Code = grpc::StatusCode;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  const char* name;
  Code code;
  std::function<grpc::Status(GacServer&)> call;
};

v1::IngestRequest One(v1::StepRecord r, std::uint64_t seq = 1) { return MakeBatch(seq, {std::move(r)}); }

grpc::Status IngestAs(GacServer& s, const char* token, std::vector<v1::IngestRequest> batches) {
  return Client(s.address(), token).Ingest(batches);
}
grpc::Status Ingest(GacServer& s, std::vector<v1::IngestRequest> batches) {
  return IngestAs(s, kWriterToken, std::move(batches));
}

v1::StepRecord Step(std::int64_t step) { return MakeStep("exp-bad", step); }

template <typename F>
v1::StepRecord With(F f, std::int64_t step = 1000) {
  v1::StepRecord r = Step(step);
  f(r);
  return r;
}

v1::SetRunConfigRequest GoodSet() {
  v1::SetRunConfigRequest set;
  set.set_run("exp-seed");
  set.mutable_thresholds()->set_c_low(0.1);
  set.mutable_thresholds()->set_c_high(0.5);
  set.set_mode(v1::CONTROL_MODE_REMOTE);
  return set;
}

grpc::Status SetAs(GacServer& s, const char* token, const v1::SetRunConfigRequest& req) {
  v1::RunConfig cfg;
  return Client(s.address(), token).SetRunConfig(req, &cfg);
}
template <typename F>
grpc::Status Set(GacServer& s, F f) {
  v1::SetRunConfigRequest req = GoodSet();
  f(req);
  return SetAs(s, kAdminToken, req);
}

template <typename F>
grpc::Status Decide(GacServer& s, F f, const char* token = kWriterToken) {
  v1::DecideRequest req;
  req.set_run("exp-seed");
  req.set_step(5);
  req.set_dot(0.1);
  req.set_grad_sq(1);
  req.set_ref_sq(1);
  req.set_has_reference(true);
  f(req);
  v1::DecideResponse resp;
  return Client(s.address(), token).Decide(req, &resp);
}

template <typename F>
grpc::Status Steps(GacServer& s, F f) {
  v1::GetStepsRequest req;
  req.set_run("exp-seed");
  f(req);
  v1::GetStepsResponse resp;
  return Client(s.address(), kReaderToken).GetSteps(req, &resp);
}

grpc::Status RawUnary(GacServer& s, const std::string& method, const std::string& bytes) {
  return testing::RawUnary(s.address(), method, bytes);
}
grpc::Status RawIngest(GacServer& s, const std::string& bytes) { return testing::RawIngest(s.address(), bytes); }

const std::vector<Case>& Catalogue() {
  static const auto* cases = new std::vector<Case>{
      // Ingest: batches
      {"sequence zero", Code::INVALID_ARGUMENT, [](GacServer& s) { return Ingest(s, {One(Step(1000), 0)}); }},
      {"empty batch", Code::INVALID_ARGUMENT, [](GacServer& s) { return Ingest(s, {MakeBatch(1, {})}); }},
      {"more than 4096 records", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         std::vector<v1::StepRecord> recs;
         for (int i = 0; i < 4097; ++i) recs.push_back(Step(1000 + i));
         return Ingest(s, {MakeBatch(1, recs)});
       }},
      {"message above the size limit", Code::RESOURCE_EXHAUSTED,
       [](GacServer& s) {
         v1::StepRecord r = Step(1000);
         for (int i = 0; i < 3000; ++i) {
           r.add_layers()->set_name(std::string(200, 'a') + std::to_string(i));
         }
         return Ingest(s, {One(r)});
       }},
      {"duplicate step within a batch", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {MakeBatch(1, {Step(1000), Step(1001), Step(1000)})}); }},
      {"sequence not increasing", Code::OUT_OF_RANGE,
       [](GacServer& s) {
         // The first batch only replays stored steps, so the store is unchanged.
         return Ingest(s, {One(MakeStep("exp-seed", 3), 7), One(Step(1000), 7)});
       }},
      {"sequence going back", Code::OUT_OF_RANGE,
       [](GacServer& s) { return Ingest(s, {One(MakeStep("exp-seed", 3), 7), One(Step(1000), 2)}); }},
      {"ingest with malformed bytes", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return RawIngest(s, "\x0a\xff\xff\xff\xff\x0f"); }},
      {"ingest with invalid UTF-8 in the run id", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         v1::IngestRequest b = One(Step(1000));
         std::string bytes = b.SerializeAsString();
         const auto at = bytes.find("exp-bad");
         bytes[at + 3] = '\xc3';  // a lone UTF-8 lead byte
         return RawIngest(s, bytes);
       }},
      // Ingest: records
      {"negative step", Code::INVALID_ARGUMENT, [](GacServer& s) { return Ingest(s, {One(Step(-1))}); }},
      {"step 2^63 - 1 (no query could read it back)", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(Step(std::numeric_limits<std::int64_t>::max()))}); }},
      {"NaN cosine", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(With([](auto& r) { r.set_cosine(kNaN); }))}); }},
      {"cosine above 1", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(With([](auto& r) { r.set_cosine(1.5); }))}); }},
      {"infinite gradient norm", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(With([](auto& r) { r.set_grad_norm(kInf); }))}); }},
      {"negative reference norm", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(With([](auto& r) { r.set_ref_norm(-1); }))}); }},
      {"alpha above 1", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(With([](auto& r) { r.set_alpha(1.5); }))}); }},
      {"regime unspecified", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(With([](auto& r) { r.set_regime(v1::REGIME_UNSPECIFIED); }))}); }},
      {"unknown regime value", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         return Ingest(s, {One(With([](auto& r) { r.set_regime(static_cast<v1::Regime>(42)); }))});
       }},
      {"rank not below world size", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(MakeStep("exp-bad", 1000, 0.01, 4, 4))}); }},
      {"empty run id", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(MakeStep("", 1000))}); }},
      {"run id with a space", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(MakeStep("exp bad", 1000))}); }},
      {"negative staleness", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(With([](auto& r) { r.set_staleness(-3); }))}); }},
      {"NaN trainer scalar", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(With([](auto& r) { (*r.mutable_scalars())["reward"] = kNaN; }))}); }},
      {"duplicate layer name", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         return Ingest(s, {One(With([](auto& r) {
                          r.add_layers()->set_name("l0");
                          r.add_layers()->set_name("l0");
                        }))});
       }},
      {"layer name with a control character", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Ingest(s, {One(With([](auto& r) { r.add_layers()->set_name("l\n0"); }))}); }},
      {"more than 4096 layers", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         return Ingest(s, {One(With([](auto& r) {
                          for (int i = 0; i < 4097; ++i) r.add_layers()->set_name("l" + std::to_string(i));
                        }))});
       }},
      {"valid batch then a bad one on one stream: the good one was a replay", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         return Ingest(s, {One(MakeStep("exp-seed", 1), 1), One(With([](auto& r) { r.set_cosine(kNaN); }), 2)});
       }},
      // Ingest: authentication and scope
      {"ingest without a token", Code::UNAUTHENTICATED,
       [](GacServer& s) { return IngestAs(s, "", {One(Step(1000))}); }},
      {"ingest with an unknown token", Code::UNAUTHENTICATED,
       [](GacServer& s) { return IngestAs(s, "not-a-token-of-this-server", {One(Step(1000))}); }},
      {"ingest outside the token's runs", Code::PERMISSION_DENIED,
       [](GacServer& s) { return IngestAs(s, kOtherToken, {One(Step(1000))}); }},
      {"ingest with a read-only token", Code::PERMISSION_DENIED,
       [](GacServer& s) { return IngestAs(s, kReaderToken, {One(Step(1000))}); }},
      {"one foreign run in a batch", Code::PERMISSION_DENIED,
       [](GacServer& s) { return Ingest(s, {MakeBatch(1, {Step(1000), MakeStep("other-x", 1)})}); }},
      // Decide
      {"decide with negative grad_sq", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Decide(s, [](auto& r) { r.set_grad_sq(-1); }); }},
      {"decide with negative ref_sq", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Decide(s, [](auto& r) { r.set_ref_sq(-1e-3); }); }},
      {"decide with |dot| above sqrt(grad_sq * ref_sq)", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Decide(s, [](auto& r) { r.set_ref_sq(1e-300); }); }},
      {"decide with a negative step", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Decide(s, [](auto& r) { r.set_step(-5); }); }},
      {"recent cosine above 1", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Decide(s, [](auto& r) { r.add_recent_cosines(0.5); r.add_recent_cosines(1.5); }); }},
      {"more recent cosines than a window holds", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         return Decide(s, [](auto& r) {
           for (int i = 0; i < 1001; ++i) r.add_recent_cosines(0.1);
         });
       }},
      {"decide with a bad run id", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Decide(s, [](auto& r) { r.set_run("exp/\x01"); }); }},
      {"decide with a read-only token", Code::PERMISSION_DENIED,
       [](GacServer& s) { return Decide(s, [](auto&) {}, kReaderToken); }},
      {"decide with malformed bytes", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return RawUnary(s, "/gac.v1.ControlService/Decide", "\xff\xff\xff\xff\x0f"); }},
      // Admin
      {"c_low above c_high", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Set(s, [](auto& r) { r.mutable_thresholds()->set_c_low(0.6); }); }},
      {"c_high above 1", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Set(s, [](auto& r) { r.mutable_thresholds()->set_c_high(1.5); }); }},
      {"c_low zero", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Set(s, [](auto& r) { r.mutable_thresholds()->set_c_low(0); }); }},
      {"NaN c_low", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Set(s, [](auto& r) { r.mutable_thresholds()->set_c_low(kNaN); }); }},
      {"unknown alpha mode", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         return Set(s, [](auto& r) { r.mutable_thresholds()->set_alpha_mode(static_cast<v1::AlphaMode>(9)); });
       }},
      {"unknown mode", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Set(s, [](auto& r) { r.set_mode(static_cast<v1::ControlMode>(9)); }); }},
      {"nothing to change", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Set(s, [](auto& r) { r.clear_thresholds(); r.clear_mode(); }); }},
      {"window out of range", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Set(s, [](auto& r) { r.set_window(1001); }); }},
      {"unknown trigger", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Set(s, [](auto& r) { r.set_trigger(static_cast<v1::Trigger>(9)); }); }},
      {"window thresholds inverted", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         return Set(s, [](auto& r) {
           r.mutable_window_thresholds()->set_c_low(0.6);
           r.mutable_window_thresholds()->set_c_high(0.2);
         });
       }},
      {"reason too long", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Set(s, [](auto& r) { r.set_reason(std::string(2000, 'r')); }); }},
      {"stale expected version", Code::ABORTED,
       [](GacServer& s) { return Set(s, [](auto& r) { r.set_expected_version(7); }); }},
      {"settings change without admin right", Code::PERMISSION_DENIED,
       [](GacServer& s) { return SetAs(s, kWriterToken, GoodSet()); }},
      // Queries
      {"steps of an unknown run", Code::NOT_FOUND,
       [](GacServer& s) { return Steps(s, [](auto& r) { r.set_run("exp-never-seen"); }); }},
      {"summary of an unknown run", Code::NOT_FOUND,
       [](GacServer& s) {
         v1::GetRunSummaryRequest req;
         req.set_run("exp-never-seen");
         v1::RunSummary resp;
         return Client(s.address(), kReaderToken).GetRunSummary(req, &resp);
       }},
      {"end_step not above start_step", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         return Steps(s, [](auto& r) {
           r.set_start_step(10);
           r.set_end_step(10);
         });
       }},
      {"negative start_step", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Steps(s, [](auto& r) { r.set_start_step(-1); }); }},
      {"page_size above the maximum", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Steps(s, [](auto& r) { r.set_page_size(1000000); }); }},
      {"malformed page token", Code::INVALID_ARGUMENT,
       [](GacServer& s) { return Steps(s, [](auto& r) { r.set_page_token("garbage"); }); }},
      {"malformed ListRuns page token", Code::INVALID_ARGUMENT,
       [](GacServer& s) {
         v1::ListRunsRequest req;
         req.set_page_token("r bad token");
         v1::ListRunsResponse resp;
         return Client(s.address(), kReaderToken).ListRuns(req, &resp);
       }},
      {"query without a token", Code::UNAUTHENTICATED,
       [](GacServer& s) {
         v1::GetStepsRequest req;
         req.set_run("exp-seed");
         v1::GetStepsResponse resp;
         return Client(s.address(), "").GetSteps(req, &resp);
       }},
  };
  return *cases;
}

class BadInput : public ::testing::TestWithParam<std::size_t> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir();
    server::ServerConfig config = TestConfig(*dir_);
    config.max_message_bytes = 256 * 1024;
    auto s = GacServer::Start(config);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = s->release();
    std::vector<v1::StepRecord> recs;
    for (int i = 0; i < 10; ++i) {
      recs.push_back(MakeStep("exp-seed", i, 0.01 * i));
      recs.back().add_layers()->set_name("layer0");
      (*recs.back().mutable_scalars())["reward"] = i;
    }
    ASSERT_TRUE(Client(server_->address(), kWriterToken).Ingest({MakeBatch(1, recs)}).ok());
    v1::RunConfig cfg;
    ASSERT_TRUE(Client(server_->address(), kAdminToken).SetRunConfig(GoodSet(), &cfg).ok());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }

  // Everything a bad input must leave untouched.
  static std::string Snapshot() {
    Client admin(server_->address(), kAdminToken);
    std::string snap;
    v1::ListRunsResponse runs;
    EXPECT_TRUE(admin.ListRuns({}, &runs).ok());
    // A valid replay earlier on a rejected stream is a report of its run and
    // may move last_seen_ns; every other field must stay.
    for (auto& r : *runs.mutable_runs()) r.clear_last_seen_ns();
    snap += runs.SerializeAsString();
    for (const auto& r : runs.runs()) {
      std::vector<v1::StepRecord> steps;
      EXPECT_TRUE(admin.AllSteps(r.run(), &steps, true).ok());
      for (const auto& s : steps) snap += s.SerializeAsString();
      v1::ListConfigChangesRequest req;
      req.set_run(r.run());
      v1::ListConfigChangesResponse changes;
      EXPECT_TRUE(admin.ListConfigChanges(req, &changes).ok());
      snap += changes.SerializeAsString();
    }
    for (const char* run : {"exp-bad", "exp-seed", "other-x"}) {
      v1::RunConfig cfg;
      EXPECT_TRUE(admin.GetRunConfig(run, &cfg).ok());
      snap += cfg.SerializeAsString();
    }
    // Step counters of the exporter.
    const std::string text = server_->metrics().Render();
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("gac_steps_total", 0) == 0 || line.rfind("gac_ingest_rows_total", 0) == 0) snap += line + "\n";
    }
    return snap;
  }

  static ScratchDir* dir_;
  static GacServer* server_;
};

ScratchDir* BadInput::dir_ = nullptr;
GacServer* BadInput::server_ = nullptr;

TEST_P(BadInput, GivesItsCodeAndChangesNothing) {
  const Case& c = Catalogue()[GetParam()];
  const std::string before = Snapshot();
  const grpc::Status st = c.call(*server_);
  EXPECT_EQ(st.error_code(), c.code) << c.name << ": " << st.error_message();
  EXPECT_FALSE(st.error_message().empty()) << c.name;
  EXPECT_EQ(Snapshot(), before) << c.name << " changed the server's state";
}

INSTANTIATE_TEST_SUITE_P(Catalogue, BadInput, ::testing::Range<std::size_t>(0, Catalogue().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           std::string name;
                           for (char ch : std::string(Catalogue()[info.param].name)) {
                             name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           }
                           return name;
                         });

TEST(BadInputCatalogue, HasAtLeastTwentyCases) { EXPECT_GE(Catalogue().size(), 20u); }

}  // namespace
}  // namespace gac::testing

namespace gac::testing {
namespace {

// Random mutations of valid Ingest and Decide messages: every call ends with
// a status (OK when the mutation still parses and validates), gacd stays
// up, and whatever it stored is a valid record.
TEST(DecodeFuzz, MutatedMessagesNeverHurtGacd) {
  ScratchDir dir;
  auto s = GacServer::Start(TestConfig(dir));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  GacServer& server = **s;
  std::mt19937 rng(7);
  v1::StepRecord rec = MakeStep("exp-fuzz", 3, 0.2);
  rec.add_layers()->set_name("layer");
  (*rec.mutable_scalars())["reward"] = 1.0;
  const std::string ingest = MakeBatch(1, {rec}).SerializeAsString();
  v1::DecideRequest d;
  d.set_run("exp-fuzz");
  d.set_step(3);
  d.set_dot(0.1);
  d.set_grad_sq(1);
  d.set_ref_sq(1);
  d.set_has_reference(true);
  const std::string decide = d.SerializeAsString();
  std::map<grpc::StatusCode, int> codes;
  for (int i = 0; i < 300; ++i) {
    const bool is_ingest = i % 2 == 0;
    std::string bytes = is_ingest ? ingest : decide;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits; ++k) {
      switch (rng() % 3) {
        case 0: bytes[rng() % bytes.size()] = static_cast<char>(rng()); break;
        case 1: bytes.resize(rng() % bytes.size() + 1); break;
        default: bytes.insert(rng() % bytes.size(), 1, static_cast<char>(rng())); break;
      }
    }
    const grpc::Status st = is_ingest ? RawIngest(server, bytes)
                                      : RawUnary(server, "/gac.v1.ControlService/Decide", bytes);
    ++codes[st.error_code()];
    EXPECT_TRUE(st.ok() || st.error_code() == Code::INVALID_ARGUMENT || st.error_code() == Code::OUT_OF_RANGE ||
                st.error_code() == Code::PERMISSION_DENIED)
        << "mutation " << i << ": " << st.error_code() << " " << st.error_message();
  }
  grpc::health::v1::HealthCheckResponse h;
  ASSERT_TRUE(Client(server.address(), "").Health(&h).ok());
  EXPECT_EQ(h.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_GT(codes[Code::INVALID_ARGUMENT], 0);
  // Whatever was stored passed validation.
  Client admin(server.address(), kAdminToken);
  v1::ListRunsResponse runs;
  ASSERT_TRUE(admin.ListRuns({}, &runs).ok());
  for (const auto& r : runs.runs()) {
    std::vector<v1::StepRecord> steps;
    ASSERT_TRUE(admin.AllSteps(r.run(), &steps, true).ok());
    for (const auto& step : steps) EXPECT_TRUE(server::ValidateStepRecord(step, server::Limits{}).ok());
  }
}

}  // namespace
}  // namespace gac::testing
