// gac/proto/step_window.h: m_t of listed records against a brute-force mean
// over every stored record, for listings that start anywhere in a run; the
// look-back's reads (how far back, how often) through a hand-written reader.
#include "gac/proto/step_window.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace gac::proto {
namespace {

v1::StepRecord Record(std::int64_t step, std::uint32_t rank, std::optional<double> cosine,
                      v1::Regime regime = v1::REGIME_SAFE) {
  v1::StepRecord r;
  r.set_run("r");
  r.set_step(step);
  r.set_rank(rank);
  r.set_regime(regime);
  if (cosine) r.set_cosine(*cosine);
  return r;
}

// A run's stored records in (step, rank) order, read as a store would.
struct FakeRun {
  std::vector<v1::StepRecord> records;
  std::vector<std::pair<std::int64_t, std::int64_t>> reads;  // [start, end) of each read

  RankStepsReader Reader() {
    return [this](std::uint32_t rank, std::int64_t start, std::int64_t end,
                  const std::function<void(const v1::StepRecord&)>& visit) {
      reads.emplace_back(start, end);
      for (const v1::StepRecord& r : records) {
        if (r.rank() == rank && r.step() >= start && r.step() < end) visit(r);
      }
      return base::Status::Ok();
    };
  }
};

// The mean of the last w cosines of valid steps of the record's rank up to
// and including it, over all of `records` (brute force).
std::optional<double> BruteForce(const std::vector<v1::StepRecord>& records, std::size_t at, int w) {
  std::vector<double> c;
  for (std::size_t i = 0; i <= at; ++i) {
    const v1::StepRecord& r = records[i];
    if (r.rank() == records[at].rank() && r.has_cosine() && r.regime() != v1::REGIME_INVALID) c.push_back(r.cosine());
  }
  if (c.size() < static_cast<std::size_t>(w)) return std::nullopt;
  long double sum = 0;
  for (std::size_t i = c.size() - static_cast<std::size_t>(w); i < c.size(); ++i) sum += c[i];
  return static_cast<double>(sum / w);
}

TEST(RecordWindowCosine, OnlyTheCosinesOfValidSteps) {
  EXPECT_EQ(RecordWindowCosine(Record(1, 0, -0.25)), -0.25);
  EXPECT_EQ(RecordWindowCosine(Record(1, 0, std::nullopt)), std::nullopt);
  EXPECT_EQ(RecordWindowCosine(Record(1, 0, 0.5, v1::REGIME_INVALID)), std::nullopt);
  EXPECT_EQ(RecordWindowCosine(Record(1, 0, NAN)), std::nullopt);
  EXPECT_EQ(RecordWindowCosine(Record(1, 0, 0.75, v1::REGIME_SKIP)), 0.75);
}

TEST(ListingWindow, TheRunsWindowHeldToItsRange) {
  v1::RunConfig c;
  EXPECT_EQ(ListingWindow(c), 20);  // 0 on the wire: the default
  c.set_window(7);
  EXPECT_EQ(ListingWindow(c), 7);
  c.set_window(5000);
  EXPECT_EQ(ListingWindow(c), controller::kMaxWindow);
}

// Every listing start of a run with gaps, invalid steps and a long stretch
// without cosines gives the brute-force m_t at every listed record.
TEST(StepWindowMeans, EveryListingStartGivesTheMeanOverTheWholeRun) {
  FakeRun run;
  for (std::int64_t step = 3; step < 120; ++step) {
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
      if (step == 50 && rank == 1) continue;
      std::optional<double> c = std::sin(static_cast<double>(step * 3 + rank)) * 0.7;
      if (step == 3 || (rank == 0 && step >= 60 && step < 90)) c.reset();  // no reference
      run.records.push_back(Record(step, rank, c, step % 11 == 7 ? v1::REGIME_INVALID : v1::REGIME_SAFE));
    }
  }
  for (int w : {1, 4, 20}) {
    for (std::size_t first = 0; first < run.records.size(); first += 5) {
      StepWindowMeans means(w, 3, run.Reader());
      for (std::size_t i = first; i < run.records.size(); ++i) {
        base::StatusOr<std::optional<double>> m = means.Next(run.records[i]);
        ASSERT_TRUE(m.ok());
        const std::optional<double> want = BruteForce(run.records, i, w);
        ASSERT_EQ(m->has_value(), want.has_value()) << "w " << w << " from " << first << " at " << i;
        if (want) {
          EXPECT_NEAR(**m, *want, 1e-15) << "w " << w << " from " << first << " at " << i;
        }
      }
    }
  }
}

TEST(StepWindowMeans, LooksBackWStepsThenWiderUntilTheRunsFirstStep) {
  FakeRun run;
  for (std::int64_t step = 10; step < 200; ++step) {
    run.records.push_back(Record(step, 0, step < 100 || step >= 150 ? std::optional<double>(0.01 * (step % 7)) : std::nullopt));
  }
  const std::vector<v1::StepRecord> page = {Record(160, 0, 0.2)};
  {
    // Cosines right before: one read of the W steps before the listing.
    StepWindowMeans means(5, 10, run.Reader());
    ASSERT_TRUE(means.Next(page[0]).ok());
    EXPECT_EQ(run.reads, (std::vector<std::pair<std::int64_t, std::int64_t>>{{155, 160}}));
  }
  run.reads.clear();
  {
    // 10 cosines at 150-159, none at 100-149: 12 steps, 48 before those,
    // then (192 reach past it) back to the run's first step.
    StepWindowMeans means(12, 10, run.Reader());
    base::StatusOr<std::optional<double>> m = means.Next(page[0]);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(m->has_value());
    EXPECT_EQ(run.reads, (std::vector<std::pair<std::int64_t, std::int64_t>>{{148, 160}, {100, 148}, {10, 100}}));
  }
  run.reads.clear();
  {
    // Not enough cosines in the whole run: reads stop at the first step.
    StepWindowMeans means(12, 10, run.Reader());
    base::StatusOr<std::optional<double>> m = means.Next(Record(14, 0, 0.1));
    ASSERT_TRUE(m.ok());
    EXPECT_FALSE(m->has_value());
    EXPECT_EQ(run.reads, (std::vector<std::pair<std::int64_t, std::int64_t>>{{10, 14}}));
  }
}

TEST(StepWindowMeans, AReadErrorIsReturnedAndTheRankIsReadAgain) {
  int calls = 0;
  StepWindowMeans means(3, 0, [&calls](std::uint32_t, std::int64_t, std::int64_t,
                                       const std::function<void(const v1::StepRecord&)>& visit) {
    if (++calls == 1) return base::Status::Unavailable("store went away");
    for (int s = 5; s < 8; ++s) visit(Record(s, 0, 0.5));
    return base::Status::Ok();
  });
  base::StatusOr<std::optional<double>> m = means.Next(Record(8, 0, 0.2));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(m.status().IsUnavailable());
  m = means.Next(Record(8, 0, 0.2));
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(m->has_value());
  EXPECT_NEAR(**m, (0.5 + 0.5 + 0.2) / 3, 1e-15);
}

}  // namespace
}  // namespace gac::proto
