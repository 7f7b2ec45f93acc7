// gacd's services end to end: in-process servers on OS-chosen ports and real
// gacd processes, driven through the generated stubs.

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>
#include <unistd.h>
#include <thread>

#include "gac/controller/calibration.h"
#include "gac/controller/controller.h"
#include "gac/server/config.h"
#include "gac/proto/convert.h"
#include "gac/server/store.h"
#include "server/src/validate.h"
#include "tests/common/test_util.h"

namespace gac::testing {
namespace {

using server::GacServer;

class InProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = GacServer::Start(TestConfig(dir_));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
  }
  Client Writer() { return Client(server_->address(), kWriterToken); }
  Client Admin() { return Client(server_->address(), kAdminToken); }
  Client Reader() { return Client(server_->address(), kReaderToken); }

  ScratchDir dir_;
  std::unique_ptr<GacServer> server_;
};

TEST_F(InProcess, IngestAcknowledgesInOrderAndStores) {
  Client c = Writer();
  std::vector<v1::IngestRequest> batches;
  for (int b = 0; b < 5; ++b) {
    std::vector<v1::StepRecord> recs;
    for (int i = 0; i < 4; ++i) recs.push_back(MakeStep("exp-a", b * 4 + i, 0.01 * i));
    batches.push_back(MakeBatch(10 + 2 * b, recs));  // gaps in sequence numbers are fine
  }
  std::vector<v1::IngestAck> acks;
  ASSERT_TRUE(c.Ingest(batches, &acks).ok());
  ASSERT_EQ(acks.size(), 5u);
  for (int b = 0; b < 5; ++b) {
    EXPECT_EQ(acks[b].sequence(), 10u + 2 * b);
    EXPECT_EQ(acks[b].stored(), 4u);
    EXPECT_EQ(acks[b].duplicates(), 0u);
  }
  std::vector<v1::StepRecord> steps;
  ASSERT_TRUE(Reader().AllSteps("exp-a", &steps).ok());
  ASSERT_EQ(steps.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(steps[i].step(), i);
    EXPECT_DOUBLE_EQ(steps[i].cosine(), 0.01 * (i % 4));
  }
}

TEST_F(InProcess, ReplayedBatchesAreAcknowledgedAsDuplicates) {
  Client c = Writer();
  std::vector<v1::IngestRequest> batches = {MakeBatch(1, {MakeStep("exp-r", 0), MakeStep("exp-r", 1)}),
                                            MakeBatch(2, {MakeStep("exp-r", 2)})};
  ASSERT_TRUE(c.Ingest(batches).ok());
  // A reconnecting agent replays: same records, new stream, partly new.
  batches.push_back(MakeBatch(3, {MakeStep("exp-r", 2), MakeStep("exp-r", 3)}));
  std::vector<v1::IngestAck> acks;
  ASSERT_TRUE(c.Ingest(batches, &acks).ok());
  ASSERT_EQ(acks.size(), 3u);
  EXPECT_EQ(acks[0].duplicates(), 2u);
  EXPECT_EQ(acks[1].duplicates(), 1u);
  EXPECT_EQ(acks[2].stored(), 1u);
  EXPECT_EQ(acks[2].duplicates(), 1u);
  std::vector<v1::StepRecord> steps;
  ASSERT_TRUE(Reader().AllSteps("exp-r", &steps).ok());
  EXPECT_EQ(steps.size(), 4u);
}

TEST_F(InProcess, DecideMatchesTheControllerWithTheRunSettings) {
  Client w = Writer();
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  auto check = [&](const controller::Thresholds& t, controller::AlphaMode mode) {
    auto ctl = controller::Controller::Create(t, mode);
    ASSERT_TRUE(ctl.ok());
    for (int i = 0; i < 200; ++i) {
      const double gg = 1 + 10 * std::fabs(u(rng)), pp = 1 + 10 * std::fabs(u(rng));
      const double dot = u(rng) * std::sqrt(gg * pp);
      v1::DecideRequest req;
      req.set_run("exp-d");
      req.set_step(i);
      req.set_dot(dot);
      req.set_grad_sq(gg);
      req.set_ref_sq(pp);
      req.set_has_reference(i > 0);
      v1::DecideResponse resp;
      ASSERT_TRUE(w.Decide(req, &resp).ok());
      const controller::Decision d = ctl->Decide({dot, gg, pp, i > 0});
      ASSERT_EQ(resp.regime(), proto::ToProto(d.regime)) << i;
      ASSERT_EQ(resp.has_cosine(), d.cosine.has_value());
      if (d.cosine) {
        EXPECT_EQ(resp.cosine(), *d.cosine);
      }
      EXPECT_EQ(resp.alpha(), d.alpha);
      EXPECT_EQ(resp.projection_coeff(), d.projection_coeff);
      EXPECT_EQ(resp.apply_update(), d.apply_update);
      EXPECT_EQ(resp.run(), "exp-d");  // the answer says what it answers
      EXPECT_EQ(resp.step(), i);
      EXPECT_TRUE(proto::DecodeDecideResponse(req, resp).ok());
      EXPECT_EQ(resp.config().thresholds().c_low(), t.c_low);
      EXPECT_EQ(resp.config().thresholds().c_high(), t.c_high);
    }
  };
  check(controller::Thresholds{0.05, 0.3}, controller::AlphaMode::kPaper);  // server defaults
  v1::SetRunConfigRequest set;
  set.set_run("exp-d");
  set.mutable_thresholds()->set_c_low(0.2);
  set.mutable_thresholds()->set_c_high(0.6);
  set.mutable_thresholds()->set_alpha_mode(v1::ALPHA_MODE_EXACT);
  set.set_mode(v1::CONTROL_MODE_REMOTE);
  set.set_reason("calibrated from the synchronous run");
  v1::RunConfig after;
  ASSERT_TRUE(Admin().SetRunConfig(set, &after).ok());
  EXPECT_EQ(after.version(), 1u);
  EXPECT_EQ(after.updated_by(), "admin");
  check(controller::Thresholds{0.2, 0.6}, controller::AlphaMode::kExact);
}

// The run's spike guard decides before GAC, on the history the asker sends:
// z-scores against a reference computed here, a spike skipped with the
// step's cosine and the window's mean without it; bad settings and bad
// history are INVALID_ARGUMENT; a change without the guard keeps it.
TEST_F(InProcess, DecideAppliesTheRunsSpikeGuardToTheAskersHistory) {
  const auto z_of = [](double x, const std::vector<double>& held) {
    double mean = 0;
    for (double v : held) mean += v;
    mean /= static_cast<double>(held.size());
    double ss = 0;
    for (double v : held) ss += (v - mean) * (v - mean);
    return (x - mean) / std::sqrt(ss / static_cast<double>(held.size() - 1));
  };
  Client a = Admin();
  v1::SetRunConfigRequest set;
  set.set_run("exp-spike");
  set.set_reason("guard");
  v1::RunConfig cfg;
  for (const auto& [field, value, message] :
       {std::tuple{"sigma", -1.0, "spike_sigma must be finite and > 0"},
        std::tuple{"window", 1.0, "spike_window must be in [2, 10000]"},
        std::tuple{"max", -2.0, "max_grad_norm must be finite and >= 0"}}) {
    v1::SpikeGuard* g = set.mutable_spike();
    g->Clear();
    g->set_zscore(true);
    if (std::string(field) == "sigma") g->set_sigma(value);
    if (std::string(field) == "window") g->set_window(static_cast<std::uint32_t>(value));
    if (std::string(field) == "max") g->set_max_grad_norm(value);
    const grpc::Status st = a.SetRunConfig(set, &cfg);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_NE(st.error_message().find(message), std::string::npos) << st.error_message();
  }
  set.mutable_spike()->Clear();
  set.mutable_spike()->set_zscore(true);
  set.mutable_spike()->set_window(4);
  set.mutable_spike()->set_sigma(3);
  set.mutable_spike()->set_warmup(3);
  set.mutable_spike()->set_max_grad_norm(50);
  ASSERT_TRUE(a.SetRunConfig(set, &cfg).ok());
  ASSERT_TRUE(cfg.has_spike());

  Client w = Writer();
  const std::vector<double> norms = {9.0, 10.0, 11.0, 100.0, 10.0, 10.5, 9.5};  // the newest 4 count
  const std::vector<double> newest(norms.end() - 4, norms.end());
  const auto ask = [&](double norm, std::optional<double> loss, std::vector<double> losses,
                       v1::DecideResponse* resp) {
    v1::DecideRequest req;
    req.set_run("exp-spike");
    req.set_step(7);
    req.set_grad_sq(norm * norm);
    req.set_ref_sq(1.0);
    req.set_dot(0.5 * norm);  // c_t = 0.5
    req.set_has_reference(true);
    for (double c : {0.1, 0.2}) req.add_recent_cosines(c);
    for (double n : norms) req.add_recent_grad_norms(n);
    for (double l : losses) req.add_recent_losses(l);
    if (loss) req.set_loss(*loss);
    return w.Decide(req, resp);
  };
  v1::DecideResponse resp;
  // |g| = 20: z = (20 - 30.0) / sd over {100, 10, 10.5, 9.5}: below; GAC skips c_t = 0.5.
  ASSERT_TRUE(ask(20.0, std::nullopt, {}, &resp).ok());
  EXPECT_EQ(resp.regime(), v1::REGIME_SKIP);
  ASSERT_TRUE(resp.has_grad_norm_z());
  EXPECT_NEAR(resp.grad_norm_z(), z_of(20.0, newest), 1e-12);
  EXPECT_FALSE(resp.has_loss_z());
  // |g| = 60 > max_grad_norm 50: a spike, whatever the z-score.
  ASSERT_TRUE(ask(60.0, std::nullopt, {}, &resp).ok());
  EXPECT_EQ(resp.regime(), v1::REGIME_SPIKE);
  EXPECT_FALSE(resp.apply_update());
  EXPECT_EQ(resp.alpha(), 1.0);
  EXPECT_FALSE(resp.has_cosine_after());
  EXPECT_NEAR(resp.cosine(), 0.5, 1e-8);
  EXPECT_NEAR(resp.grad_norm_z(), z_of(60.0, newest), 1e-12);
  // The loss alone: its z-score against the newest 4 losses.
  const std::vector<double> losses = {1.0, 1.1, 0.9, 1.05, 0.95};
  ASSERT_TRUE(ask(10.0, 5.0, losses, &resp).ok());
  EXPECT_EQ(resp.regime(), v1::REGIME_SPIKE);
  EXPECT_NEAR(resp.loss_z(), z_of(5.0, std::vector<double>(losses.end() - 4, losses.end())), 1e-9);
  ASSERT_TRUE(ask(10.0, std::numeric_limits<double>::quiet_NaN(), losses, &resp).ok());
  EXPECT_EQ(resp.regime(), v1::REGIME_SPIKE);
  ASSERT_TRUE(ask(10.0, 1.0, losses, &resp).ok());
  EXPECT_EQ(resp.regime(), v1::REGIME_SKIP);
  // Bad history.
  v1::DecideRequest bad;
  bad.set_run("exp-spike");
  bad.add_recent_grad_norms(-1.0);
  EXPECT_EQ(w.Decide(bad, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad.clear_recent_grad_norms();
  bad.add_recent_losses(std::numeric_limits<double>::infinity());
  const grpc::Status st = w.Decide(bad, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("recent_losses[0] must be finite"), std::string::npos) << st.error_message();
  // A change without the guard keeps it; an empty one turns it off.
  v1::SetRunConfigRequest keep;
  keep.set_run("exp-spike");
  keep.set_window(5);
  ASSERT_TRUE(a.SetRunConfig(keep, &cfg).ok());
  EXPECT_EQ(cfg.spike().window(), 4u);
  keep.mutable_spike();
  ASSERT_TRUE(a.SetRunConfig(keep, &cfg).ok());
  EXPECT_FALSE(cfg.has_spike());
  ASSERT_TRUE(ask(60.0, std::nullopt, {}, &resp).ok());
  EXPECT_EQ(resp.regime(), v1::REGIME_SKIP);
  EXPECT_FALSE(resp.has_grad_norm_z());
}

TEST_F(InProcess, SettingsChangesAreVersionedAndAudited) {
  Client a = Admin();
  v1::SetRunConfigRequest set;
  set.set_run("exp-v");
  set.mutable_thresholds()->set_c_low(0.1);
  set.mutable_thresholds()->set_c_high(0.5);
  set.set_mode(v1::CONTROL_MODE_LOCAL);
  set.set_reason("first");
  v1::RunConfig cfg;
  ASSERT_TRUE(a.SetRunConfig(set, &cfg).ok());
  set.set_expected_version(1);
  set.mutable_thresholds()->set_c_low(0.15);
  set.set_reason("second");
  ASSERT_TRUE(a.SetRunConfig(set, &cfg).ok());
  EXPECT_EQ(cfg.version(), 2u);
  // A stale writer loses.
  set.set_expected_version(1);
  grpc::Status st = a.SetRunConfig(set, &cfg);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED) << st.error_message();
  ASSERT_TRUE(a.GetRunConfig("exp-v", &cfg).ok());
  EXPECT_EQ(cfg.version(), 2u);
  EXPECT_EQ(cfg.thresholds().c_low(), 0.15);
  v1::ListConfigChangesRequest req;
  req.set_run("exp-v");
  req.set_page_size(1);
  std::vector<v1::ConfigChange> changes;
  for (;;) {
    v1::ListConfigChangesResponse resp;
    ASSERT_TRUE(a.ListConfigChanges(req, &resp).ok());
    for (const auto& c : resp.changes()) changes.push_back(c);
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].before().version(), 0u);
  EXPECT_EQ(changes[0].after().version(), 1u);
  EXPECT_EQ(changes[0].reason(), "first");
  EXPECT_EQ(changes[1].before().thresholds().c_low(), 0.1);
  EXPECT_EQ(changes[1].after().thresholds().c_low(), 0.15);
  EXPECT_EQ(changes[1].after().updated_by(), "admin");
}

// A thresholds change without a mode (UNSPECIFIED) keeps the run's mode;
// for a run never set, the default mode.
TEST_F(InProcess, AThresholdsChangeWithoutAModeKeepsTheMode) {
  Client a = Admin();
  v1::SetRunConfigRequest set;
  set.set_run("exp-keep");
  set.mutable_thresholds()->set_c_low(0.1);
  set.mutable_thresholds()->set_c_high(0.5);
  v1::RunConfig defaults;
  ASSERT_TRUE(a.GetRunConfig("exp-keep", &defaults).ok());
  v1::RunConfig cfg;
  ASSERT_TRUE(a.SetRunConfig(set, &cfg).ok());
  EXPECT_EQ(cfg.mode(), defaults.mode());
  set.set_mode(v1::CONTROL_MODE_MONITOR);
  ASSERT_TRUE(a.SetRunConfig(set, &cfg).ok());
  EXPECT_EQ(cfg.mode(), v1::CONTROL_MODE_MONITOR);
  set.clear_mode();
  set.mutable_thresholds()->set_c_low(0.2);
  ASSERT_TRUE(a.SetRunConfig(set, &cfg).ok());
  EXPECT_EQ(cfg.mode(), v1::CONTROL_MODE_MONITOR);
  EXPECT_EQ(cfg.thresholds().c_low(), 0.2);
  EXPECT_EQ(cfg.version(), 3u);
  ASSERT_TRUE(a.GetRunConfig("exp-keep", &cfg).ok());
  EXPECT_EQ(cfg.mode(), v1::CONTROL_MODE_MONITOR);
}

TEST_F(InProcess, StepsArePagedInStepRankOrder) {
  std::vector<v1::StepRecord> recs;
  for (int s = 0; s < 25; ++s) {
    for (std::uint32_t r = 0; r < 2; ++r) recs.push_back(MakeStep("exp-p", s, 0.001 * s, r, 2));
  }
  std::shuffle(recs.begin(), recs.end(), std::mt19937(3));
  ASSERT_TRUE(Writer().Ingest({MakeBatch(1, recs)}).ok());
  Client rd = Reader();
  v1::GetStepsRequest req;
  req.set_run("exp-p");
  req.set_start_step(3);
  req.set_end_step(20);
  req.set_page_size(7);
  std::vector<std::pair<std::int64_t, std::uint32_t>> keys;
  int pages = 0;
  for (;; ++pages) {
    v1::GetStepsResponse resp;
    ASSERT_TRUE(rd.GetSteps(req, &resp).ok());
    for (const auto& s : resp.steps()) keys.emplace_back(s.step(), s.rank());
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  ASSERT_EQ(keys.size(), 34u);
  EXPECT_EQ(pages + 1, 5);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(keys[i].first, 3 + static_cast<std::int64_t>(i / 2));
    EXPECT_EQ(keys[i].second, i % 2);
  }
  req.clear_page_token();
  req.set_rank(1);
  req.set_page_size(100);
  v1::GetStepsResponse resp;
  ASSERT_TRUE(rd.GetSteps(req, &resp).ok());
  ASSERT_EQ(resp.steps_size(), 17);
  for (const auto& s : resp.steps()) EXPECT_EQ(s.rank(), 1u);
}

// Records whose default page (1000 records) would pass gRPC's default 4 MiB
// receive limit come back in smaller pages (the byte cap of
// server/src/queries.h), each within the limit, every record exactly once.
TEST_F(InProcess, StepPagesStayUnderTheClientsDefaultReceiveLimit) {
  constexpr int kSteps = 1200;
  constexpr int kLayers = 96;
  std::vector<v1::IngestRequest> batches;
  std::vector<v1::StepRecord> recs;
  std::size_t record_bytes = 0;
  for (int s = 0; s < kSteps; ++s) {
    v1::StepRecord r = MakeStep("exp-wide", s, 0.02);
    for (int l = 0; l < kLayers; ++l) {
      v1::LayerRecord* layer = r.add_layers();
      layer->set_name("model.layers." + std::to_string(l) + ".self_attention.query_key_value");
      layer->set_cosine(0.001 * l);
      layer->set_grad_norm(1.5 + l);
      layer->set_ref_norm(2.5 + l);
    }
    if (s < 1000) record_bytes += r.ByteSizeLong();
    recs.push_back(std::move(r));
    if (recs.size() == 200) {  // ~1.5 MB a batch, under gacd's 4 MiB receive limit
      batches.push_back(MakeBatch(batches.size() + 1, std::move(recs)));
      recs.clear();
    }
  }
  ASSERT_GT(record_bytes, std::size_t{4} << 20) << "the default page of these records must pass 4 MiB";
  std::vector<v1::IngestAck> acks;
  ASSERT_TRUE(Writer().Ingest(batches, &acks).ok());
  ASSERT_EQ(acks.size(), batches.size());
  Client rd = Reader();  // gRPC's default receive limit: 4 MiB
  v1::GetStepsRequest req;
  req.set_run("exp-wide");
  req.set_include_layers(true);
  std::vector<std::int64_t> steps;
  int pages = 0;
  for (;;) {
    v1::GetStepsResponse resp;
    const grpc::Status st = rd.GetSteps(req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_code() << ": " << st.error_message();
    ++pages;
    ASSERT_GT(resp.steps_size(), 0);
    EXPECT_LE(resp.ByteSizeLong(), std::size_t{3} << 20);
    for (const v1::StepRecord& r : resp.steps()) {
      EXPECT_EQ(r.layers_size(), kLayers);
      steps.push_back(r.step());
    }
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  EXPECT_GE(pages, 3);
  ASSERT_EQ(steps.size(), static_cast<std::size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(steps[s], s);
}

TEST_F(InProcess, ListRunsShowsOnlyReadableRunsInPages) {
  Client w = Writer();
  Client o(server_->address(), kOtherToken);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(w.Ingest({MakeBatch(1, {MakeStep("exp-" + std::to_string(i), 0)})}).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(o.Ingest({MakeBatch(1, {MakeStep("other-" + std::to_string(i), 0)})}).ok());
  auto list = [](Client& c, std::uint32_t page) {
    std::vector<std::string> runs;
    v1::ListRunsRequest req;
    req.set_page_size(page);
    for (;;) {
      v1::ListRunsResponse resp;
      EXPECT_TRUE(c.ListRuns(req, &resp).ok());
      for (const auto& r : resp.runs()) runs.push_back(r.run());
      if (resp.next_page_token().empty()) break;
      req.set_page_token(resp.next_page_token());
    }
    return runs;
  };
  Client rd = Reader();
  EXPECT_EQ(list(rd, 2).size(), 8u);
  const auto others = list(o, 2);
  EXPECT_EQ(others, (std::vector<std::string>{"other-0", "other-1", "other-2"}));
}

TEST_F(InProcess, RunSummaryHasTheCalibrationStatistics) {
  std::vector<v1::StepRecord> recs;
  std::vector<double> cosines;
  std::mt19937 rng(11);
  std::normal_distribution<double> n(0, 0.03);
  for (int s = 0; s < 100; ++s) {
    const double c = s == 0 ? NAN : n(rng);
    recs.push_back(MakeStep("exp-s", s, c));
    if (s >= 40 && s > 0) cosines.push_back(c);
    if (s % 10 == 0) recs.back().set_regime(v1::REGIME_SKIP);
  }
  ASSERT_TRUE(Writer().Ingest({MakeBatch(1, recs)}).ok());
  v1::GetRunSummaryRequest req;
  req.set_run("exp-s");
  req.set_window(60);
  v1::RunSummary sum;
  ASSERT_TRUE(Reader().GetRunSummary(req, &sum).ok());
  const controller::CalibrationStats want = controller::ComputeCalibration(cosines, 0.05);
  EXPECT_EQ(sum.calibration().count(), want.count);
  EXPECT_DOUBLE_EQ(sum.calibration().q90(), want.q90);
  EXPECT_DOUBLE_EQ(sum.calibration().max(), want.max);
  EXPECT_DOUBLE_EQ(sum.calibration().fraction_le_c_low(), want.frac_le_c_low);
  auto suggested = controller::SuggestThresholds(want);
  ASSERT_TRUE(suggested.ok());
  EXPECT_DOUBLE_EQ(sum.calibration().suggested().c_low(), suggested->c_low);
  EXPECT_EQ(sum.steps_by_regime().at("skip"), 6u);
  EXPECT_EQ(sum.steps_by_regime().at("safe"), 54u);
  EXPECT_EQ(sum.latest().step(), 99);
  EXPECT_EQ(sum.info().step_records(), 100u);
  EXPECT_EQ(sum.info().last_step(), 99);
}

TEST_F(InProcess, HealthIsServing) {
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(Client(server_->address(), "").Health(&resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(InProcess, AuthenticationAndScopes) {
  const auto code = [](grpc::Status s) { return s.error_code(); };
  std::vector<v1::IngestRequest> batch = {MakeBatch(1, {MakeStep("exp-x", 0)})};
  EXPECT_EQ(code(Client(server_->address(), "").Ingest(batch)), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(code(Client(server_->address(), "not-a-known-token-at-all").Ingest(batch)),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(code(Reader().Ingest(batch)), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(code(Client(server_->address(), kOtherToken).Ingest(batch)), grpc::StatusCode::PERMISSION_DENIED);
  v1::RunConfig cfg;
  EXPECT_EQ(code(Client(server_->address(), kOtherToken).GetRunConfig("exp-x", &cfg)),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::SetRunConfigRequest set;
  set.set_run("exp-x");
  set.mutable_thresholds()->set_c_low(0.1);
  set.mutable_thresholds()->set_c_high(0.5);
  set.set_mode(v1::CONTROL_MODE_LOCAL);
  EXPECT_EQ(code(Writer().SetRunConfig(set, &cfg)), grpc::StatusCode::PERMISSION_DENIED);
  v1::DecideRequest d;
  d.set_run("exp-x");
  v1::DecideResponse dr;
  EXPECT_EQ(code(Reader().Decide(d, &dr)), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Writer().Ingest(batch).ok());
  EXPECT_TRUE(Writer().Decide(d, &dr).ok());
  EXPECT_TRUE(Admin().SetRunConfig(set, &cfg).ok());
}

TEST(Tls, ServesOverTlsAndRefusesPlaintext) {
  ScratchDir dir;
  std::string out;
  const int rc = RunProcess({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                             "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout",
                             dir.File("key.pem"), "-out", dir.File("cert.pem")},
                            "", &out);
  if (rc != 0) GTEST_SKIP() << "openssl cannot make a certificate: " << out;
  server::ServerConfig config = TestConfig(dir);
  config.tls_cert = dir.File("cert.pem");
  config.tls_key = dir.File("key.pem");
  auto s = GacServer::Start(config);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = ReadFileOrDie(dir.File("cert.pem"));
  Client tls((*s)->address(), kWriterToken, grpc::SslCredentials(opts));
  EXPECT_TRUE(tls.Ingest({MakeBatch(1, {MakeStep("exp-tls", 0)})}).ok());
  Client plain((*s)->address(), kWriterToken);
  grpc::health::v1::HealthCheckResponse h;
  EXPECT_EQ(plain.Health(&h).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(InProcessStart, BadConfigurationIsAClearError) {
  ScratchDir dir;
  server::ServerConfig c = TestConfig(dir);
  c.token_file = dir.File("missing-tokens");
  auto s = GacServer::Start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("missing-tokens"), std::string::npos);
  c = TestConfig(dir);
  c.tls_cert = dir.File("nope.pem");
  c.tls_key = dir.File("nope.key");
  s = GacServer::Start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), base::StatusCode::kNotFound) << s.status().ToString();
  EXPECT_NE(s.status().message().find("nope.key"), std::string::npos) << s.status().ToString();
  // A data directory that cannot be created is an I/O failure with its own
  // code, not DATA_LOSS: nothing was lost.
  c = TestConfig(dir);
  WriteFile(dir.File("a-file"), "x");
  c.db.clear();
  c.data_dir = dir.File("a-file") + "/data";
  s = GacServer::Start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), base::StatusCode::kFailedPrecondition) << s.status().ToString();
  EXPECT_NE(s.status().message().find("data directory"), std::string::npos) << s.status().ToString();
  c = TestConfig(dir);
  WriteFile(dir.File("garbage.db"), std::string(8192, 'x'));
  c.db = dir.File("garbage.db");
  s = GacServer::Start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("garbage.db"), std::string::npos) << s.status().ToString();
}

// ---- real gacd processes ----

std::vector<std::string> ProcessArgs(const ScratchDir& dir) {
  return {"--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--store=sqlite:" + dir.File("data"),
          "--token-file=" + WriteTestTokens(dir), "--drain-timeout=2s"};
}

TEST(GacdProcess, DataAndSettingsSurviveARestart) {
  ScratchDir dir;
  GacdProcess gacd(ProcessArgs(dir));
  ASSERT_TRUE(gacd.Start(dir.File("ready"))) << gacd.error();
  std::vector<v1::StepRecord> recs;
  for (int s = 0; s < 50; ++s) {
    recs.push_back(MakeStep("exp-persist", s, 0.02));
    v1::LayerRecord* l = recs.back().add_layers();
    l->set_name("model.layers.0.mlp");
    l->set_cosine(0.5);
    l->set_grad_norm(2);
    l->set_ref_norm(3);
    (*recs.back().mutable_scalars())["reward"] = 0.25 * s;
  }
  {
    Client w(gacd.address(), kWriterToken);
    ASSERT_TRUE(w.Ingest({MakeBatch(1, recs)}).ok());
    v1::SetRunConfigRequest set;
    set.set_run("exp-persist");
    set.mutable_thresholds()->set_c_low(0.07);
    set.mutable_thresholds()->set_c_high(0.4);
    set.set_mode(v1::CONTROL_MODE_REMOTE);
    v1::RunConfig cfg;
    ASSERT_TRUE(Client(gacd.address(), kAdminToken).SetRunConfig(set, &cfg).ok());
  }
  EXPECT_EQ(gacd.Terminate(), 0) << gacd.Log();
  EXPECT_NE(gacd.Log().find("draining"), std::string::npos);

  GacdProcess again(ProcessArgs(dir));
  ASSERT_TRUE(again.Start(dir.File("ready"))) << again.error();
  Client rd(again.address(), kReaderToken);
  std::vector<v1::StepRecord> steps;
  ASSERT_TRUE(rd.AllSteps("exp-persist", &steps, true).ok());
  ASSERT_EQ(steps.size(), recs.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].SerializeAsString(), recs[i].SerializeAsString()) << i;
  }
  v1::RunConfig cfg;
  ASSERT_TRUE(rd.GetRunConfig("exp-persist", &cfg).ok());
  EXPECT_EQ(cfg.version(), 1u);
  EXPECT_EQ(cfg.thresholds().c_low(), 0.07);
  EXPECT_EQ(cfg.mode(), v1::CONTROL_MODE_REMOTE);
  // Decide uses the persisted settings: |c| = 0.1 is above c_low 0.07.
  v1::DecideRequest d;
  d.set_run("exp-persist");
  d.set_dot(0.1);
  d.set_grad_sq(1);
  d.set_ref_sq(1);
  d.set_has_reference(true);
  v1::DecideResponse dr;
  ASSERT_TRUE(Client(again.address(), kWriterToken).Decide(d, &dr).ok());
  EXPECT_EQ(dr.regime(), v1::REGIME_PROJECT);
  // The exporter shows the persisted thresholds at start-up.
  auto body = HttpGet(again.metrics_address(), "/metrics");
  ASSERT_TRUE(body.has_value());
  EXPECT_NE(body->find("gac_threshold_c_low{run=\"exp-persist\"} 0.07"), std::string::npos) << *body;
}

TEST(GacdProcess, LiveScrapePassesPromtool) {
  if (access("/usr/bin/promtool", X_OK) != 0) GTEST_SKIP() << "promtool not installed";
  ScratchDir dir;
  std::vector<std::string> args = ProcessArgs(dir);
  args.push_back("--per-layer-metrics");
  GacdProcess gacd(args);
  ASSERT_TRUE(gacd.Start(dir.File("ready"))) << gacd.error();
  std::vector<v1::StepRecord> recs;
  for (int s = 0; s < 10; ++s) {
    recs.push_back(MakeStep("exp-m", s, 0.1 * (s % 5)));
    recs.back().set_regime(s % 3 == 0 ? v1::REGIME_PROJECT : v1::REGIME_SAFE);
    recs.back().set_staleness(8);
    (*recs.back().mutable_scalars())["reward"] = s;
    recs.back().add_layers()->set_name("l0");
  }
  Client w(gacd.address(), kWriterToken);
  ASSERT_TRUE(w.Ingest({MakeBatch(1, recs)}).ok());
  v1::DecideRequest d;
  d.set_run("exp-m");
  v1::DecideResponse dr;
  ASSERT_TRUE(w.Decide(d, &dr).ok());
  auto body = HttpGet(gacd.metrics_address(), "/metrics");
  ASSERT_TRUE(body.has_value());
  EXPECT_NE(body->find("gac_steps_total{"), std::string::npos);
  std::string out;
  EXPECT_EQ(RunProcess({"/usr/bin/promtool", "check", "metrics"}, *body, &out), 0) << out;
  EXPECT_EQ(out, "") << out;
}

TEST(GacdProcess, SigtermEndsOpenStreamsAfterTheirAcks) {
  ScratchDir dir;
  std::vector<std::string> args = ProcessArgs(dir);
  args.push_back("--drain-timeout=60s");  // an open stream must not hold gacd this long
  GacdProcess gacd(args);
  ASSERT_TRUE(gacd.Start(dir.File("ready"))) << gacd.error();
  Client w(gacd.address(), kWriterToken);
  auto ctx = w.Context(30000);
  auto stream = w.ingest().Ingest(ctx.get());
  std::uint64_t acked = 0;
  for (int b = 1; b <= 20; ++b) {
    ASSERT_TRUE(stream->Write(MakeBatch(b, {MakeStep("exp-term", b)})));
    v1::IngestAck ack;
    ASSERT_TRUE(stream->Read(&ack));
    acked = ack.sequence();
  }
  EXPECT_EQ(acked, 20u);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(gacd.Terminate(), 0) << gacd.Log();
  // The open stream was ended by the server, not cut at the drain deadline.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << gacd.Log();
  v1::IngestAck ack;
  EXPECT_FALSE(stream->Read(&ack));
  const grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();

  GacdProcess again(ProcessArgs(dir));
  ASSERT_TRUE(again.Start(dir.File("ready"))) << again.error();
  std::vector<v1::StepRecord> steps;
  ASSERT_TRUE(Client(again.address(), kReaderToken).AllSteps("exp-term", &steps).ok());
  EXPECT_EQ(steps.size(), 20u);
}

TEST(GacdProcess, BadFlagsExitWithAClearMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--listen=127.0.0.1:0"}, "no --token-file"},
      {{"--insecure", "--listen=0.0.0.0:0"}, "loopback"},
      {{"--insecure", "--c-low=0.5", "--c-high=0.2"}, "thresholds"},
      {{"--insecure", "--retention=ten days"}, "retention"},
      {{"--insecure", "--frobnicate=1"}, "unknown option 'frobnicate'"},
      {{"--insecure", "--tls-cert=/x.pem"}, "--tls-key"},
      {{"--insecure", "--sync=sometimes"}, "sync"},
      {{"--config=/nonexistent/gacd.conf"}, "cannot read config file"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {GacdProcess::Binary()};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::string out;
    EXPECT_EQ(RunProcess(argv, "", &out), 2) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << c.args[0] << ": " << out;
  }
}

// gacd's durations are gac::base::ParseDuration's syntax (ms, s, m, h, d), in
// whole seconds.
TEST(Config, DurationsUseTheSharedSyntax) {
  EXPECT_EQ(*server::ParseSeconds("30d"), std::chrono::hours(30 * 24));
  EXPECT_EQ(*server::ParseSeconds("15m"), std::chrono::minutes(15));
  EXPECT_EQ(*server::ParseSeconds("10"), std::chrono::seconds(10));
  EXPECT_EQ(*server::ParseSeconds("2000ms"), std::chrono::seconds(2));
  EXPECT_EQ(*server::ParseSeconds("1.5h"), std::chrono::minutes(90));
  EXPECT_TRUE(server::ParseSeconds("1500ms").status().IsInvalidArgument()) << "not whole seconds";
  EXPECT_TRUE(server::ParseSeconds("ten days").status().IsInvalidArgument());
  const char* argv[] = {"gacd", "--insecure", "--drain-timeout=3000ms", "--run-ttl=0.5h"};
  base::StatusOr<server::Flags> flags = server::ParseFlags(4, argv);
  ASSERT_TRUE(flags.ok()) << flags.status().ToString();
  EXPECT_EQ(flags->config.drain_timeout, std::chrono::seconds(3));
  EXPECT_EQ(flags->config.run_ttl, std::chrono::minutes(30));
}

TEST(GacdProcess, ConfigFileIsReadAndFlagsOverrideIt) {
  ScratchDir dir;
  WriteFile(dir.File("gacd.conf"), "# test\nlisten = 127.0.0.1:0\nhttp-listen = \ninsecure = true\n"
                                   "store = sqlite:" + dir.File("d") + "\nc-low = 0.11\nc-high = 0.5\n");
  GacdProcess gacd({"--config=" + dir.File("gacd.conf"), "--c-high=0.6"});
  ASSERT_TRUE(gacd.Start(dir.File("ready"))) << gacd.error();
  EXPECT_TRUE(gacd.metrics_address().empty());
  v1::RunConfig cfg;
  ASSERT_TRUE(Client(gacd.address(), "").GetRunConfig("any-run", &cfg).ok());
  EXPECT_EQ(cfg.thresholds().c_low(), 0.11);
  EXPECT_EQ(cfg.thresholds().c_high(), 0.6);
  EXPECT_EQ(cfg.version(), 0u);
}

// ---- the store and HTTP flags, and their deprecated spellings ----

base::StatusOr<server::Flags> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), {"gacd", "--insecure"});
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return server::ParseFlags(static_cast<int>(argv.size()), argv.data());
}

TEST(Flags, OneFlagSelectsTheStore) {
  auto f = Parse({"--db=/old.db", "--store=sqlite:/var/lib/gacd"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->config.DatabasePath(), "/var/lib/gacd/gacd.db");
  EXPECT_FALSE(f->config.UsesMemoryStore());
  f = Parse({"--store=memory"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(f->config.UsesMemoryStore());
  EXPECT_TRUE(f->deprecations.empty());
  f = Parse({"--store", "postgresql://gacd@db:5432/gac"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->config.store, "postgresql://gacd@db:5432/gac");
  EXPECT_EQ(f->config.StoreDescription(), "postgresql://gacd@db:5432/gac");
  EXPECT_TRUE(f->deprecations.empty());
  f = Parse({"--store=sqlite:"});
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("sqlite: needs a data directory"), std::string::npos) << f.status().ToString();
  f = Parse({"--store=mysql://x"});
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("expected sqlite:DIR, memory or a postgresql:// URI"), std::string::npos)
      << f.status().ToString();
  f = Parse({"--store=memory", "--db=/x.db"});
  ASSERT_FALSE(f.ok());
}

TEST(Flags, OldStoreFlagsWorkWithADeprecationNote) {
  auto f = Parse({"--data-dir=/srv/gacd"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->config.DatabasePath(), "/srv/gacd/gacd.db");
  ASSERT_EQ(f->deprecations.size(), 1u);
  EXPECT_EQ(f->deprecations[0], "--data-dir is deprecated; use --store=sqlite:DIR");
  f = Parse({"--store", "sqlite", "--db=/srv/x.db"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->config.DatabasePath(), "/srv/x.db");
  ASSERT_EQ(f->deprecations.size(), 2u);
  EXPECT_EQ(f->deprecations[0], "--store=sqlite is deprecated; use --store=sqlite:DIR");
  EXPECT_NE(f->deprecations[1].find("--db is deprecated; use --store=sqlite:DIR"), std::string::npos);
  f = Parse({"--db=:memory:"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(f->config.UsesMemoryStore());
  ASSERT_EQ(f->deprecations.size(), 1u);
  EXPECT_NE(f->deprecations[0].find("--store=memory"), std::string::npos) << f->deprecations[0];
}

TEST(Flags, HttpListenNamesTheHttpPortAndMetricsListenIsItsOldName) {
  auto f = Parse({"--http-listen=127.0.0.1:9999"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->config.metrics_listen, "127.0.0.1:9999");
  EXPECT_TRUE(f->deprecations.empty());
  f = Parse({"--metrics-listen=127.0.0.1:9998"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->config.metrics_listen, "127.0.0.1:9998");
  ASSERT_EQ(f->deprecations.size(), 1u);
  EXPECT_EQ(f->deprecations[0], "--metrics-listen is deprecated; use --http-listen=HOST:PORT");
}

TEST(Flags, ConfigFileKeysOfTheOldNamesWorkWithADeprecationNote) {
  ScratchDir dir;
  WriteFile(dir.File("gacd.conf"), "metrics-listen = 127.0.0.1:9997\ndata-dir = /srv/d\n");
  auto f = Parse({"--config=" + dir.File("gacd.conf")});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->config.metrics_listen, "127.0.0.1:9997");
  EXPECT_EQ(f->config.DatabasePath(), "/srv/d/gacd.db");
  ASSERT_EQ(f->deprecations.size(), 2u);
  EXPECT_EQ(f->deprecations[0], dir.File("gacd.conf") + ":1: metrics-listen is deprecated; use http-listen = HOST:PORT");
  EXPECT_EQ(f->deprecations[1], dir.File("gacd.conf") + ":2: data-dir is deprecated; use store = sqlite:DIR");
}

// A real gacd with the new flags logs no note; with the old ones it serves
// the same and logs a note per old flag.
TEST(GacdProcess, StoreAndHttpFlagsAndTheirOldSpellings) {
  ScratchDir dir;
  const std::string tokens = WriteTestTokens(dir);
  GacdProcess current({"--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--store=sqlite:" + dir.File("new"),
                       "--token-file=" + tokens});
  ASSERT_TRUE(current.Start(dir.File("ready-new"))) << current.error();
  EXPECT_TRUE(HttpGet(current.metrics_address(), "/metrics").has_value());
  EXPECT_EQ(access(dir.File("new/gacd.db").c_str(), F_OK), 0);
  EXPECT_EQ(current.Terminate(), 0) << current.Log();
  EXPECT_EQ(current.Log().find("deprecated"), std::string::npos) << current.Log();
  EXPECT_NE(current.Log().find("store " + dir.File("new/gacd.db")), std::string::npos) << current.Log();

  GacdProcess old({"--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0", "--data-dir=" + dir.File("old"),
                   "--token-file=" + tokens});
  ASSERT_TRUE(old.Start(dir.File("ready-old"))) << old.error();
  EXPECT_TRUE(HttpGet(old.metrics_address(), "/metrics").has_value());
  EXPECT_EQ(access(dir.File("old/gacd.db").c_str(), F_OK), 0);
  EXPECT_NE(old.Log().find("gacd: warning: --metrics-listen is deprecated; use --http-listen=HOST:PORT"),
            std::string::npos)
      << old.Log();
  EXPECT_NE(old.Log().find("gacd: warning: --data-dir is deprecated; use --store=sqlite:DIR"), std::string::npos)
      << old.Log();
  EXPECT_EQ(old.Terminate(), 0) << old.Log();

  GacdProcess memory({"--insecure", "--listen=127.0.0.1:0", "--http-listen=", "--db=:memory:"});
  ASSERT_TRUE(memory.Start(dir.File("ready-memory"))) << memory.error();
  EXPECT_EQ(memory.Terminate(), 0) << memory.Log();
  EXPECT_NE(memory.Log().find("gacd: warning: --db is deprecated"), std::string::npos) << memory.Log();
  EXPECT_NE(memory.Log().find("store in memory (not persisted)"), std::string::npos) << memory.Log();
}

// A second gacd on the same SQLite files refuses to start and names the
// holder (issue: both would serve, each with its own run state, writing one
// file). The lock goes with its holder, also when it is killed.
TEST(GacdProcess, SecondGacdOnTheSameStoreRefusesAndNamesTheHolder) {
  ScratchDir dir;
  const std::string tokens = WriteTestTokens(dir);
  const std::vector<std::string> args = {"--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
                                         "--store=sqlite:" + dir.File("data"), "--token-file=" + tokens};
  GacdProcess first(args);
  ASSERT_TRUE(first.Start(dir.File("ready-1"))) << first.error();
  const std::string holder = "in use by another gacd (pid " + std::to_string(first.pid()) + " host ";

  // The same flags, and the same database file named by the old --db flag.
  for (const std::vector<std::string>& second :
       {args, std::vector<std::string>{"--listen=127.0.0.1:0", "--http-listen=", "--db=" + dir.File("data/gacd.db"),
                                       "--token-file=" + tokens}}) {
    std::vector<std::string> argv = {GacdProcess::Binary()};
    argv.insert(argv.end(), second.begin(), second.end());
    std::string out;
    EXPECT_NE(RunProcess(argv, "", &out), 0) << out;
    EXPECT_NE(out.find(holder), std::string::npos) << out;
    EXPECT_NE(out.find(dir.File("data/gacd.db.lock")), std::string::npos) << out;
  }
  EXPECT_TRUE(HttpGet(first.metrics_address(), "/metrics").has_value()) << "the holder serves on";

  // Killed, the holder leaves its lock file behind; it does not block the next gacd.
  first.Kill();
  GacdProcess next(args);
  ASSERT_TRUE(next.Start(dir.File("ready-2"))) << next.error() << next.Log();
  EXPECT_EQ(next.Terminate(), 0) << next.Log();
}

}  // namespace
}  // namespace gac::testing
