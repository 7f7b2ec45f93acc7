// server/src/queries.h without gRPC: page tokens, the paging of runs and
// steps over an in-memory store, and the run summary against a
// recomputation written here from the definitions of the paper's Table 3.
#include "server/src/queries.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>

#include "gac/proto/convert.h"
#include "tests/common/test_util.h"

namespace gac::server {
namespace {

using testing::MakeStep;

// Stores `records` in one transaction.
void Put(Store& store, const std::vector<v1::StepRecord>& records) {
  v1::IngestRequest req = testing::MakeBatch(1, records);
  std::vector<WriteOp> ops(1);
  ops[0].steps = &req;
  ASSERT_TRUE(store.Apply(&ops).ok());
}

TEST(QueriesTest, PageTokensRoundTripAndRejectEverythingElse) {
  EXPECT_EQ(*DecodeStepToken(EncodeStepToken(123456789012, 7)), std::make_pair(std::int64_t{123456789012}, 7u));
  EXPECT_EQ(*DecodeOffsetToken(EncodeOffsetToken(99)), 99u);
  EXPECT_EQ(*DecodeOffsetToken(""), 0u);
  EXPECT_EQ(*DecodeRunToken(EncodeRunToken("exp-1/a")), "exp-1/a");
  EXPECT_EQ(*DecodeRunToken(""), "");
  for (const char* bad : {"x", "s", "s1", "s.1", "s1.", "s-1.0", "s1.2.3x", "s99999999999999999999.1",
                          "s1.99999999999999999999", "o", "ox", "o-1", "o99999999999999999999", "r", "r bad",
                          "q12",
                          // Found by the page token fuzzer: a rank above 2^32 - 1 wrapped to a small
                          // one, and a second dot cut the rank short.
                          "s9223372036854775807.4294967296", "s1.2.3", "s-0.1"}) {
    SCOPED_TRACE(bad);
    const bool step_ok = DecodeStepToken(bad).ok();
    const bool offset_ok = DecodeOffsetToken(bad).ok();
    const bool run_ok = DecodeRunToken(bad).ok();
    EXPECT_FALSE(step_ok || offset_ok || run_ok);
    EXPECT_EQ(DecodeOffsetToken(bad).status().message().find("malformed") == std::string::npos, offset_ok);
  }
}

TEST(QueriesTest, PageSizeDefaultsAndLimits) {
  EXPECT_EQ(*PageSize(0, kStepPages), kStepPages.default_size);
  EXPECT_EQ(*PageSize(kStepPages.max_size, kStepPages), kStepPages.max_size);
  EXPECT_TRUE(PageSize(kStepPages.max_size + 1, kStepPages).status().IsInvalidArgument());
}

TEST(QueriesTest, StepPagesCoverEveryRecordOnceInOrder) {
  std::unique_ptr<Store> store = NewMemoryStore();
  std::vector<v1::StepRecord> records;
  for (int step = 0; step < 50; ++step) {
    for (std::uint32_t rank = 0; rank < 3; ++rank) records.push_back(MakeStep("exp-1", step, 0.01, rank, 3));
  }
  Put(*store, records);
  v1::GetStepsRequest req;
  req.set_run("exp-1");
  req.set_start_step(10);
  req.set_end_step(40);
  req.set_page_size(7);
  std::vector<std::pair<std::int64_t, std::uint32_t>> seen;
  for (int pages = 0;; ++pages) {
    ASSERT_LT(pages, 100);
    base::StatusOr<StepQuery> q = StepQueryFromRequest(req);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    base::StatusOr<v1::GetStepsResponse> page = GetStepsPage(*store, *q);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    EXPECT_LE(page->steps_size(), 7);
    for (const v1::StepRecord& r : page->steps()) seen.emplace_back(r.step(), r.rank());
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  ASSERT_EQ(seen.size(), 30u * 3u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.front(), std::make_pair(std::int64_t{10}, 0u));
  EXPECT_EQ(seen.back(), std::make_pair(std::int64_t{39}, 2u));

  req.set_run("exp-unknown");
  req.clear_page_token();
  EXPECT_TRUE(GetStepsPage(*store, *StepQueryFromRequest(req)).status().IsNotFound());
  req.set_end_step(5);
  EXPECT_TRUE(StepQueryFromRequest(req).status().IsInvalidArgument());
}

TEST(QueriesTest, RunPagesSkipRunsThePrincipalMayNotRead) {
  std::unique_ptr<Store> store = NewMemoryStore();
  std::vector<v1::StepRecord> records;
  for (int i = 0; i < 25; ++i) records.push_back(MakeStep((i % 2 ? "exp-" : "other-") + std::to_string(100 + i), 1));
  Put(*store, records);
  base::StatusOr<Authenticator> auth =
      Authenticator::FromText("reader reader-token-0123456789 read exp-*\n");
  ASSERT_TRUE(auth.ok());
  const Principal* reader = *auth->Authenticate("Bearer reader-token-0123456789");
  RunRegistry registry(v1::Thresholds(), v1::CONTROL_MODE_LOCAL);
  v1::ListRunsRequest req;
  req.set_page_size(5);
  std::vector<std::string> runs;
  for (int pages = 0;; ++pages) {
    ASSERT_LT(pages, 20);
    base::StatusOr<v1::ListRunsResponse> page = ListRunsPage(*store, registry, *reader, req);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    for (const v1::RunInfo& info : page->runs()) runs.push_back(info.run());
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  ASSERT_EQ(runs.size(), 12u);  // the odd i: exp-101 ... exp-123
  for (const std::string& r : runs) EXPECT_EQ(r.rfind("exp-", 0), 0u) << r;
  EXPECT_TRUE(std::is_sorted(runs.begin(), runs.end()));
}

// include_latest: each run's latest rank-0 step comes with its RunInfo, so
// a listing (gacctl runs) is one call per page, not one more per run.
TEST(QueriesTest, RunPagesCarryTheLatestStepWhenAsked) {
  std::unique_ptr<Store> store = NewMemoryStore();
  std::vector<v1::StepRecord> records;
  for (int step = 0; step < 5; ++step) records.push_back(MakeStep("exp-a", step, 0.01 * step));
  records.back().set_mode(v1::CONTROL_MODE_MONITOR);
  records.push_back(MakeStep("exp-b", 7, 0.5, 1, 2));  // rank 1 only
  Put(*store, records);
  base::StatusOr<Authenticator> auth = Authenticator::FromText("reader reader-token-0123456789 read *\n");
  ASSERT_TRUE(auth.ok());
  const Principal* reader = *auth->Authenticate("Bearer reader-token-0123456789");
  RunRegistry registry(v1::Thresholds(), v1::CONTROL_MODE_LOCAL);
  v1::ListRunsRequest req;
  base::StatusOr<v1::ListRunsResponse> page = ListRunsPage(*store, registry, *reader, req);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->runs_size(), 2);
  EXPECT_FALSE(page->runs(0).has_latest()) << "only when asked";
  req.set_include_latest(true);
  page = ListRunsPage(*store, registry, *reader, req);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->runs_size(), 2);
  ASSERT_TRUE(page->runs(0).has_latest());
  EXPECT_EQ(page->runs(0).latest().step(), 4);
  EXPECT_EQ(page->runs(0).latest().mode(), v1::CONTROL_MODE_MONITOR);
  EXPECT_FALSE(page->runs(1).has_latest()) << "rank 0 has no step";
}

// A page's m_t reads each rank's records before it from the store: here
// back through 10,000 steps of rank 0 without a cosine to the 4 cosines of
// steps 20000-20003, in widening ranges; the last range, [0, 21904), holds
// more records than one store read (kStepPages.max_size) and those
// cosines come in its third read.
TEST(QueriesTest, PageWindowMeansReadBackThroughStepsWithoutCosines) {
  std::unique_ptr<Store> store = NewMemoryStore();
  std::vector<v1::StepRecord> records;
  std::vector<double> rank0;  // rank 0's cosines, oldest first
  for (int step = 0; step < 30100; ++step) {
    const bool with_cosine = (step >= 20000 && step < 20004) || step >= 30095;
    const double c = with_cosine ? 0.1 * (step % 5) - 0.2 : NAN;
    records.push_back(MakeStep("exp-w", step, c, 0, 2));
    if (with_cosine) rank0.push_back(c);
    records.push_back(MakeStep("exp-w", step, 0.3, 1, 2));
  }
  Put(*store, records);
  RunRegistry registry(v1::Thresholds(), v1::CONTROL_MODE_LOCAL);
  v1::SetRunConfigRequest set;
  set.set_run("exp-w");
  set.set_window(6);
  ASSERT_TRUE(registry.Change(set, "test", 1, nullptr).ok());
  // The page of rank 0's steps 30094-30099: step 30094 holds the 4 cosines
  // of steps 20000-20003 only; each later step adds one.
  v1::GetStepsRequest req;
  req.set_run("exp-w");
  req.set_rank(0);
  req.set_start_step(30094);
  base::StatusOr<StepQuery> query = StepQueryFromRequest(req);
  ASSERT_TRUE(query.ok());
  base::StatusOr<v1::GetStepsResponse> page = GetStepsPage(*store, *query);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->steps_size(), 6);
  base::StatusOr<std::vector<std::optional<double>>> means = PageWindowMeans(*store, registry, "exp-w", *page);
  ASSERT_TRUE(means.ok()) << means.status().ToString();
  ASSERT_EQ(means->size(), 6u);
  EXPECT_FALSE((*means)[0].has_value());
  EXPECT_FALSE((*means)[1].has_value());  // 5 cosines
  for (std::size_t i = 2; i < 6; ++i) {
    const std::size_t last = 4 + i;  // rank 0's cosines up to the record, exclusive
    double sum = 0;
    for (std::size_t k = last - 6; k < last; ++k) sum += rank0[k];
    ASSERT_TRUE((*means)[i].has_value()) << i;
    EXPECT_NEAR(*(*means)[i], sum / 6, 1e-15) << i;
  }
  // Rank 1 has a cosine at every step: its window is full from the step before.
  req.set_rank(1);
  req.set_start_step(30000);
  req.set_end_step(30002);
  query = StepQueryFromRequest(req);
  ASSERT_TRUE(query.ok());
  page = GetStepsPage(*store, *query);
  ASSERT_TRUE(page.ok());
  means = PageWindowMeans(*store, registry, "exp-w", *page);
  ASSERT_TRUE(means.ok());
  ASSERT_EQ(means->size(), 2u);
  for (const std::optional<double>& m : *means) EXPECT_NEAR(m.value_or(-1), 0.3, 1e-15);
}

TEST(QueriesTest, SummaryMatchesARecomputationFromTheRecords) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> cos_dist(-0.5, 0.5);
  const controller::Regime regimes[] = {controller::Regime::kSafe, controller::Regime::kProject, controller::Regime::kSkip, controller::Regime::kInvalid};
  std::vector<v1::StepRecord> records;
  std::map<std::string, std::uint64_t> expected_counts;
  std::vector<double> abs_cosines;
  for (int step = 0; step < 200; ++step) {
    v1::StepRecord r = MakeStep("exp-s", step, step % 10 == 0 ? std::nan("") : cos_dist(rng));
    const controller::Regime regime = regimes[step % 7 % 4];
    r.set_regime(proto::ToProto(regime));
    ++expected_counts[controller::RegimeName(regime)];
    if (r.has_cosine()) abs_cosines.push_back(std::fabs(r.cosine()));
    records.push_back(r);
  }
  v1::RunInfo info;
  info.set_run("exp-s");
  v1::RunConfig config;
  config.mutable_thresholds()->set_c_low(0.2);
  config.mutable_thresholds()->set_c_high(0.6);
  const v1::RunSummary s = SummarizeRun(info, config, records);
  for (const auto& [name, count] : expected_counts) EXPECT_EQ(s.steps_by_regime().at(name), count) << name;
  std::sort(abs_cosines.begin(), abs_cosines.end());
  const double pos = 0.9 * static_cast<double>(abs_cosines.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(pos);
  const double q90 = abs_cosines[lo] + (pos - static_cast<double>(lo)) * (abs_cosines[lo + 1] - abs_cosines[lo]);
  double sum = 0.0;
  std::size_t below = 0;
  for (double c : abs_cosines) {
    sum += c;
    below += c <= 0.2 ? 1 : 0;
  }
  EXPECT_EQ(s.calibration().count(), abs_cosines.size());
  EXPECT_NEAR(s.calibration().q90(), q90, 1e-12);
  EXPECT_EQ(s.calibration().max(), abs_cosines.back());
  EXPECT_NEAR(s.calibration().mean(), sum / static_cast<double>(abs_cosines.size()), 1e-12);
  EXPECT_NEAR(s.calibration().fraction_le_c_low(),
              static_cast<double>(below) / static_cast<double>(abs_cosines.size()), 1e-12);
  EXPECT_TRUE(s.calibration().has_suggested());
  EXPECT_EQ(s.latest().step(), 199);
  EXPECT_EQ(s.info().config().thresholds().c_low(), 0.2);

  // Too few values to calibrate: no suggestion; no steps: zero counts.
  const v1::RunSummary empty = SummarizeRun(info, config, {});
  EXPECT_EQ(empty.steps_by_regime().size(), std::size(controller::kAllRegimes));
  for (const auto& [name, count] : empty.steps_by_regime()) EXPECT_EQ(count, 0u) << name;
  EXPECT_FALSE(empty.calibration().has_suggested());
  EXPECT_FALSE(empty.has_latest());
}

}  // namespace
}  // namespace gac::server
