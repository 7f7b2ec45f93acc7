// The spool: round trips, acknowledgement, limits and recovery from damage.

#include "gac/transport/spool.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <random>
#include <fstream>
#include <vector>

#include "tests/common/test_util.h"

namespace gac::transport {
namespace {

using testing::ScratchDir;

std::vector<std::pair<std::uint64_t, std::string>> Contents(const Spool& spool) {
  std::vector<std::pair<std::uint64_t, std::string>> out;
  EXPECT_TRUE(spool.ForEachUnacknowledged([&](std::uint64_t seq, std::string&& p) { out.emplace_back(seq, p); }).ok());
  return out;
}

std::vector<std::string> Segments(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("spool-", 0) == 0) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Payload(std::uint64_t seq) { return "batch-" + std::to_string(seq) + std::string(seq % 7, 'x'); }

TEST(Crc32, MatchesTheStandardCheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(Crc32(s, 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(s + 4, 5, Crc32(s, 4)), 0xCBF43926u);  // incremental
}

TEST(Spool, EntriesSurviveReopenUntilAcknowledged) {
  ScratchDir dir;
  SpoolOptions o{dir.path(), 1 << 20, 64, SpoolFsync::kEveryAppend};
  {
    auto spool = Spool::Open(o, nullptr);
    ASSERT_TRUE(spool.ok()) << spool.status().ToString();
    for (std::uint64_t s = 1; s <= 10; ++s) ASSERT_TRUE((*spool)->Append(s, Payload(s)).ok());
    ASSERT_TRUE((*spool)->Acknowledge(4).ok());
    EXPECT_EQ((*spool)->last_sequence(), 10u);
  }
  SpoolRecovery rec;
  auto spool = Spool::Open(o, &rec);
  ASSERT_TRUE(spool.ok());
  EXPECT_EQ(rec.entries, 6u);
  EXPECT_EQ(rec.dropped_entries, 0u);
  EXPECT_EQ(rec.detail, "");
  auto got = Contents(**spool);
  ASSERT_EQ(got.size(), 6u);
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, 5 + i);
    EXPECT_EQ(got[i].second, Payload(5 + i));
  }
  EXPECT_EQ((*spool)->last_sequence(), 10u);
  // New appends continue after the old ones.
  ASSERT_TRUE((*spool)->Append(11, Payload(11)).ok());
  ASSERT_TRUE((*spool)->Acknowledge(11).ok());
  EXPECT_TRUE(Contents(**spool).empty());
  EXPECT_TRUE(Segments(dir.path()).empty()) << "acknowledged segments are deleted";
  EXPECT_EQ((*spool)->unacknowledged_bytes(), 0u);
}

// A spool whose entries were all acknowledged (so its segments are gone)
// keeps ACKED: the next process must number its batches above it, or they
// would count as acknowledged and be dropped by the recovery after a crash.
// (Found by the spool fuzzer: tests/fuzz/corpus/spool/crash-bcf8...)
TEST(Spool, EntriesAfterARestartFollowTheAcknowledgedOnes) {
  ScratchDir dir;
  SpoolOptions o{dir.path(), 1 << 20, 64, SpoolFsync::kNone};
  {
    auto spool = Spool::Open(o, nullptr);
    ASSERT_TRUE(spool.ok());
    for (std::uint64_t s = 1; s <= 5; ++s) ASSERT_TRUE((*spool)->Append(s, Payload(s)).ok());
    ASSERT_TRUE((*spool)->Acknowledge(5).ok());
    EXPECT_TRUE(Segments(dir.path()).empty());
  }
  std::uint64_t next = 0;
  {
    // The next process: a new batch, then a crash before it is acknowledged.
    auto spool = Spool::Open(o, nullptr);
    ASSERT_TRUE(spool.ok());
    next = (*spool)->last_sequence() + 1;
    EXPECT_GT(next, 5u);
    ASSERT_TRUE((*spool)->Append(next, "unacknowledged").ok());
  }
  SpoolRecovery rec;
  auto spool = Spool::Open(o, &rec);
  ASSERT_TRUE(spool.ok());
  EXPECT_EQ(rec.entries, 1u);
  EXPECT_EQ(Contents(**spool), (std::vector<std::pair<std::uint64_t, std::string>>{{next, "unacknowledged"}}));
}

TEST(Spool, FullSpoolRefusesAppends) {
  ScratchDir dir;
  auto spool = Spool::Open({dir.path(), 100, 1 << 20, SpoolFsync::kNone}, nullptr);
  ASSERT_TRUE(spool.ok());
  ASSERT_TRUE((*spool)->Append(1, std::string(60, 'a')).ok());
  const base::Status st = (*spool)->Append(2, std::string(60, 'b'));
  EXPECT_EQ(st.code(), base::StatusCode::kResourceExhausted);
  ASSERT_TRUE((*spool)->Acknowledge(1).ok());
  EXPECT_TRUE((*spool)->Append(2, std::string(60, 'b')).ok());
}

class SpoolDamage : public ::testing::Test {
 protected:
  // Ten entries in one segment; returns the segment's path.
  std::string Fill() {
    auto spool = Spool::Open({dir_.path(), 1 << 20, 1 << 20, SpoolFsync::kNone}, nullptr);
    EXPECT_TRUE(spool.ok());
    for (std::uint64_t s = 1; s <= 10; ++s) EXPECT_TRUE((*spool)->Append(s, Payload(s)).ok());
    auto segs = Segments(dir_.path());
    EXPECT_EQ(segs.size(), 1u);
    return segs.at(0);
  }
  std::vector<std::uint64_t> Reopen(SpoolRecovery* rec) {
    auto spool = Spool::Open({dir_.path(), 1 << 20, 1 << 20, SpoolFsync::kNone}, rec);
    EXPECT_TRUE(spool.ok());
    std::vector<std::uint64_t> seqs;
    for (auto& [s, p] : Contents(**spool)) {
      EXPECT_EQ(p, Payload(s));
      seqs.push_back(s);
    }
    return seqs;
  }
  static std::uint64_t Size(const std::string& path) { return std::filesystem::file_size(path); }
  static void Corrupt(const std::string& path, std::uint64_t offset, char value) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(value);
  }
  ScratchDir dir_;
};

TEST_F(SpoolDamage, TornTailDropsOnlyTheLastEntry) {
  const std::string seg = Fill();
  ASSERT_EQ(truncate(seg.c_str(), static_cast<off_t>(Size(seg) - 3)), 0);
  SpoolRecovery rec;
  const auto seqs = Reopen(&rec);
  EXPECT_EQ(seqs, (std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(rec.dropped_entries, 1u);
  EXPECT_NE(rec.detail.find("torn entry (sequence 10)"), std::string::npos) << rec.detail;
  // The damage was cut away: a second recovery is clean.
  SpoolRecovery again;
  EXPECT_EQ(Reopen(&again).size(), 9u);
  EXPECT_EQ(again.dropped_entries, 0u);
}

TEST_F(SpoolDamage, TornHeaderAtTheTail) {
  const std::string seg = Fill();
  {
    std::ofstream f(seg, std::ios::app | std::ios::binary);
    f.write("GSP", 3);  // a crash right after starting the next header
  }
  SpoolRecovery rec;
  EXPECT_EQ(Reopen(&rec).size(), 10u);
  EXPECT_EQ(rec.dropped_entries, 1u);
  EXPECT_EQ(rec.dropped_bytes, 3u);
}

TEST_F(SpoolDamage, ChecksumMismatchSkipsOnlyThatEntry) {
  const std::string seg = Fill();
  Corrupt(seg, Size(seg) - 1, '#');  // last payload byte of entry 10
  SpoolRecovery rec;
  EXPECT_EQ(Reopen(&rec), (std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(rec.dropped_entries, 1u);
  EXPECT_NE(rec.detail.find("checksum mismatch in entry (sequence 10)"), std::string::npos) << rec.detail;
  // A middle entry: its neighbours are kept.
  Corrupt(seg, 20 + 3, '#');  // payload of entry 1
  SpoolRecovery rec2;
  EXPECT_EQ(Reopen(&rec2), (std::vector<std::uint64_t>{2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST_F(SpoolDamage, DamagedHeaderDropsTheRestOfTheSegment) {
  const std::string seg = Fill();
  const std::uint64_t first_entry = 20 + Payload(1).size();
  Corrupt(seg, first_entry, 'Z');  // magic of entry 2
  SpoolRecovery rec;
  EXPECT_EQ(Reopen(&rec), (std::vector<std::uint64_t>{1}));
  EXPECT_EQ(rec.dropped_entries, 1u);
  EXPECT_NE(rec.detail.find("damaged entry header"), std::string::npos);
}

TEST(Spool, UnwritableDirectoryIsAnError) {
  auto spool = Spool::Open({"/proc/gac-spool-test", 1 << 20, 1 << 20, SpoolFsync::kNone}, nullptr);
  EXPECT_FALSE(spool.ok());
}

}  // namespace
}  // namespace gac::transport

namespace gac::transport {
namespace {

// Random damage (byte flips, truncation, garbage appended) to a spool:
// recovery never fails or crashes, and every entry it returns is one that
// was written, with its exact payload, in order.
TEST(SpoolFuzz, RandomDamageNeverYieldsAWrongEntry) {
  std::mt19937 rng(20261121);
  for (int round = 0; round < 200; ++round) {
    testing::ScratchDir dir;
    const SpoolOptions o{dir.path(), 1 << 20, 512, SpoolFsync::kNone};
    {
      auto spool = Spool::Open(o, nullptr);
      ASSERT_TRUE(spool.ok());
      for (std::uint64_t s = 1; s <= 40; ++s) ASSERT_TRUE((*spool)->Append(s, Payload(s)).ok());
    }
    for (const std::string& seg : Segments(dir.path())) {
      std::string data;
      {
        std::ifstream in(seg, std::ios::binary);
        data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      switch (rng() % 4) {
        case 0:  // flip a few bytes
          for (int k = 0; k < 1 + static_cast<int>(rng() % 4) && !data.empty(); ++k) {
            data[rng() % data.size()] ^= static_cast<char>(1 + rng() % 255);
          }
          break;
        case 1:  // truncate anywhere
          data.resize(data.empty() ? 0 : rng() % data.size());
          break;
        case 2:  // garbage appended
          for (int k = 0; k < static_cast<int>(rng() % 64); ++k) data.push_back(static_cast<char>(rng()));
          break;
        default:
          break;
      }
      std::ofstream(seg, std::ios::binary | std::ios::trunc) << data;
    }
    SpoolRecovery rec;
    auto spool = Spool::Open(o, &rec);
    ASSERT_TRUE(spool.ok()) << spool.status().ToString();
    std::uint64_t prev = 0;
    for (auto& [seq, payload] : Contents(**spool)) {
      ASSERT_GE(seq, 1u);
      ASSERT_LE(seq, 40u);
      EXPECT_GT(seq, prev);
      EXPECT_EQ(payload, Payload(seq)) << "round " << round;
      prev = seq;
    }
    // Appending after recovery works and is read back.
    ASSERT_TRUE((*spool)->Append(100, "after").ok());
    EXPECT_EQ(Contents(**spool).back().second, "after");
  }
}

}  // namespace
}  // namespace gac::transport
