// Conformance suite of the Store implementations: every StoreTest runs on
// the in-memory store, on SQLite (a fresh database in a fresh temporary
// directory per test) and on PostgreSQL (a fresh database of a server the
// test starts; skipped when PostgreSQL is not installed). Then SQLite-only
// tests (persistence, schema versions, WAL, errors, rollback) and a random
// workload applied to the stores, whose query answers must be equal.
// Tests of several gacd processes sharing one PostgreSQL database
// (replays, settings propagation, kill -9, outages) are in replicas_test.cc.
//
// Expected values are written out from the contract in gac/server/store.h,
// never read back from one implementation to test the other, except in the
// random workload (where the two are compared with each other).

#include "gac/server/store.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "gac/proto/record_schema.h"
#include "tests/common/postgres_cluster.h"

namespace gac::server {
namespace {

using google::protobuf::util::MessageDifferencer;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// A fresh directory under the test temporary directory, removed on
// destruction.
class TempDir {
 public:
  TempDir() {
    std::string templ = ::testing::TempDir() + "gac_store_test_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    const char* dir = mkdtemp(buf.data());
    EXPECT_NE(dir, nullptr) << "mkdtemp " << templ;
    if (dir != nullptr) path_ = dir;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::unique_ptr<Store> OpenOrDie(const std::string& path, const SqliteOptions& options = {}) {
  base::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(path, options);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(store).value() : nullptr;
}

// A step record whose values follow from (rank, step): every field set,
// optional fields present, `layers` layers named in reverse-alphabetical
// order (so that order by name and order of insertion differ) and two scalars.
v1::StepRecord MakeStep(const std::string& run, std::uint32_t rank, std::int64_t step,
                        int layers = 0, std::uint32_t world_size = 4) {
  v1::StepRecord r;
  r.set_run(run);
  r.set_rank(rank);
  r.set_world_size(world_size);
  r.set_step(step);
  r.set_cosine(0.25 + 0.001 * static_cast<double>(step % 100));
  r.set_grad_norm(1.5 + static_cast<double>(rank));
  r.set_ref_norm(2.0 + 0.5 * static_cast<double>(step % 7));
  r.set_regime(v1::REGIME_PROJECT);
  r.set_alpha(0.75);
  r.set_cosine_after(0.125);
  r.set_staleness(step % 3);
  r.set_wall_time_ns(1'700'000'000'000'000'000 + step);
  r.set_agent_overhead_seconds(1e-4);
  r.set_mode(v1::CONTROL_MODE_LOCAL);
  r.set_fallback(step % 2 == 1);
  (*r.mutable_scalars())["loss"] = 3.0 - 0.01 * static_cast<double>(step);
  (*r.mutable_scalars())["reward"] = static_cast<double>(rank);
  for (int i = layers - 1; i >= 0; --i) {
    v1::LayerRecord* layer = r.add_layers();
    layer->set_name("model.layers." + std::to_string(i) + ".weight");
    if (i % 2 == 0) layer->set_cosine(0.1 * i - 0.3);
    layer->set_grad_norm(0.5 * i);
    layer->set_ref_norm(0.25 * i + 1);
  }
  return r;
}

// The result counts of one op.
struct Counts {
  std::uint32_t stored = 0;
  std::uint32_t duplicates = 0;
  bool operator==(const Counts& o) const {
    return stored == o.stored && duplicates == o.duplicates;
  }
};

std::ostream& operator<<(std::ostream& os, const Counts& c) {
  return os << "{stored " << c.stored << ", duplicates " << c.duplicates << "}";
}

// Applies one batch of records as one op.
Counts ApplyRecords(Store* store, const std::vector<v1::StepRecord>& records,
                    std::int64_t received_ns) {
  v1::IngestRequest request;
  request.set_sequence(1);
  for (const v1::StepRecord& r : records) *request.add_records() = r;
  std::vector<WriteOp> ops(1);
  ops[0].steps = &request;
  ops[0].received_ns = received_ns;
  base::Status s = store->Apply(&ops);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return Counts{ops[0].stored, ops[0].duplicates};
}

ConfigWrite MakeConfigWrite(const std::string& run, std::uint64_t version, double c_low,
                            const std::string& reason) {
  ConfigWrite w;
  w.run = run;
  w.config.mutable_thresholds()->set_c_low(c_low);
  w.config.mutable_thresholds()->set_c_high(0.9);
  w.config.set_mode(v1::CONTROL_MODE_REMOTE);
  w.config.set_version(version);
  w.config.set_updated_ns(static_cast<std::int64_t>(version) * 1000);
  w.config.set_updated_by("admin");
  w.change.mutable_before()->set_version(version - 1);
  *w.change.mutable_after() = w.config;
  w.change.set_reason(reason);
  return w;
}

base::Status ApplyConfig(Store* store, const ConfigWrite& write, std::int64_t received_ns) {
  std::vector<WriteOp> ops(1);
  ops[0].config = &write;
  ops[0].received_ns = received_ns;
  return store->Apply(&ops);
}

template <typename Message>
::testing::AssertionResult SameMessages(const std::vector<Message>& got,
                                        const std::vector<Message>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "got " << got.size() << " messages, want " << want.size();
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::string diff;
    MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&diff);
    if (!differencer.Compare(want[i], got[i])) {
      return ::testing::AssertionFailure() << "message " << i << " differs: " << diff;
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SameMessage(const google::protobuf::Message& got,
                                       const google::protobuf::Message& want) {
  std::string diff;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  if (differencer.Compare(want, got)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << diff;
}

std::vector<v1::StepRecord> WithoutLayers(std::vector<v1::StepRecord> records) {
  for (v1::StepRecord& r : records) r.clear_layers();
  return records;
}

std::vector<v1::StepRecord> Steps(Store* store, const StepQuery& query) {
  base::StatusOr<std::vector<v1::StepRecord>> got = store->GetSteps(query);
  EXPECT_TRUE(got.ok()) << got.status().ToString();
  return got.ok() ? std::move(got).value() : std::vector<v1::StepRecord>();
}

std::vector<std::pair<std::int64_t, std::uint32_t>> Keys(const std::vector<v1::StepRecord>& rs) {
  std::vector<std::pair<std::int64_t, std::uint32_t>> keys;
  for (const v1::StepRecord& r : rs) keys.emplace_back(r.step(), r.rank());
  return keys;
}

// ---------------------------------------------------------------------------
// The conformance suite, on both implementations
// ---------------------------------------------------------------------------

enum class Impl { kMemory, kSqlite, kPostgres };

const char* ImplName(Impl impl) {
  switch (impl) {
    case Impl::kMemory:
      return "Memory";
    case Impl::kSqlite:
      return "Sqlite";
    case Impl::kPostgres:
      return "Postgres";
  }
  return "?";
}

void PrintTo(Impl impl, std::ostream* os) { *os << ImplName(impl); }

// PostgreSQL: a fresh database of the test process's server (started by the
// test, tests/common/postgres_cluster.h) per test.
class StoreTest : public ::testing::TestWithParam<Impl> {
 protected:
  void SetUp() override {
    if (GetParam() == Impl::kMemory) {
      store_ = NewMemoryStore();
    } else if (GetParam() == Impl::kSqlite) {
      dir_ = std::make_unique<TempDir>();
      store_ = OpenOrDie(dir_->File("gacd.db"));
    } else {
      GAC_NEW_POSTGRES_DATABASE_OR_SKIP(cluster, uri);
      base::StatusOr<std::unique_ptr<Store>> store = OpenPostgresStore(uri);
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      store_ = std::move(store).value();
      pg_cluster_ = cluster;
      pg_database_ = uri.substr(uri.rfind('/') + 1);
    }
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override {
    store_.reset();
    dir_.reset();
  }

  // The columns of the store's `steps` table but its key (run_id) and the
  // receive time (received_ns), sorted, as "name type null|not-null"; empty
  // for the memory store. (Column order is not part of the contract: a
  // migration appends a new column after received_ns.)
  std::vector<std::string> StepColumns();

  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<Store> store_;
  testing::PostgresCluster* pg_cluster_ = nullptr;
  std::string pg_database_;
};

INSTANTIATE_TEST_SUITE_P(Impls, StoreTest, ::testing::Values(Impl::kMemory, Impl::kSqlite, Impl::kPostgres),
                         [](const ::testing::TestParamInfo<Impl>& info) { return ImplName(info.param); });

// The expected column, in the same form as StoreTest::StepColumns.
std::string ExpectedColumn(const proto::StepField& f, Impl impl) {
  std::string type;
  if (impl == Impl::kSqlite) {
    // Reals are untyped (BLOB affinity keeps the double exact; see sqlite_store.cc).
    type = f.type == proto::FieldType::kReal ? "" : "INTEGER";
  } else {
    switch (f.type) {
      case proto::FieldType::kReal: type = "double precision"; break;
      case proto::FieldType::kEnum: type = "integer"; break;
      case proto::FieldType::kBool: type = "boolean"; break;
      case proto::FieldType::kInteger: type = "bigint"; break;
      case proto::FieldType::kText: type = "text"; break;
    }
  }
  return std::string(f.column) + " " + type + " " + (f.optional ? "null" : "not-null");
}

std::vector<std::string> StoreTest::StepColumns() {
  std::vector<std::string> out;
  if (GetParam() == Impl::kSqlite) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(dir_->File("gacd.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, "SELECT name, type, \"notnull\" FROM pragma_table_info('steps') ORDER BY cid",
                                 -1, &stmt, nullptr),
              SQLITE_OK);
    while (stmt != nullptr && sqlite3_step(stmt) == SQLITE_ROW) {
      const auto text = [&](int col) {
        const unsigned char* t = sqlite3_column_text(stmt, col);
        return t == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(t));
      };
      out.push_back(text(0) + " " + text(1) + " " + (sqlite3_column_int(stmt, 2) != 0 ? "not-null" : "null"));
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
  } else if (GetParam() == Impl::kPostgres) {
    std::string error, columns;
    EXPECT_TRUE(pg_cluster_->Exec(pg_database_,
                                  "SELECT string_agg(column_name || ' ' || data_type || ' ' || "
                                  "CASE is_nullable WHEN 'YES' THEN 'null' ELSE 'not-null' END, ',' "
                                  "ORDER BY ordinal_position) FROM information_schema.columns "
                                  "WHERE table_name = 'steps' AND table_schema = current_schema()",
                                  &error, &columns))
        << error;
    for (std::size_t start = 0; start <= columns.size();) {
      std::size_t end = columns.find(',', start);
      if (end == std::string::npos) end = columns.size();
      out.push_back(columns.substr(start, end - start));
      start = end + 1;
    }
  }
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const std::string& c) { return c.rfind("run_id ", 0) == 0 || c.rfind("received_ns ", 0) == 0; }),
            out.end());
  std::sort(out.begin(), out.end());
  return out;
}

// A record with every field of the record schema set through the table, to
// a value unlike its default and unlike the other fields'.
v1::StepRecord EveryFieldSet(const std::string& run) {
  v1::StepRecord r = MakeStep(run, 0, 0, 2);
  for (std::size_t i = 0; i < proto::kStepFieldCount; ++i) {
    const proto::StepField& f = proto::kStepFields[i];
    proto::FieldValue v;
    switch (f.type) {
      case proto::FieldType::kReal: v.real = 0.03125 * static_cast<double>(i + 1); break;
      case proto::FieldType::kEnum: v.integer = 2; break;
      case proto::FieldType::kBool: v.integer = 1; break;
      default: v.integer = 100 + static_cast<std::int64_t>(i); break;
    }
    f.set(v, &r);
  }
  return r;
}

TEST_P(StoreTest, StepsTableHasTheRecordSchemasColumns) {
  if (GetParam() == Impl::kMemory) GTEST_SKIP() << "no table";
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("r", 0, 0)}, 1), Counts({1, 0}));
  std::vector<std::string> expected;
  for (const proto::StepField& f : proto::kStepFields) expected.push_back(ExpectedColumn(f, GetParam()));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(StepColumns(), expected);
}

TEST_P(StoreTest, EveryFieldOfTheRecordSchemaRoundTrips) {
  const v1::StepRecord want = EveryFieldSet("every");
  ASSERT_EQ(ApplyRecords(store_.get(), {want}, 1), Counts({1, 0}));
  StepQuery query;
  query.run = "every";
  query.include_layers = true;
  const std::vector<v1::StepRecord> got = Steps(store_.get(), query);
  ASSERT_EQ(got.size(), 1u);
  for (const proto::StepField& f : proto::kStepFields) {
    const proto::FieldValue a = f.get(got[0]);
    const proto::FieldValue b = f.get(want);
    EXPECT_TRUE(a.present) << f.name;
    EXPECT_EQ(a.integer, b.integer) << f.name;
    EXPECT_EQ(a.real, b.real) << f.name;
  }
  EXPECT_TRUE(SameMessages(got, {want}));
}

// RunInfo.steps_mode is the mode of the latest record (highest step, then
// highest rank), whatever order the records arrive in.
TEST_P(StoreTest, RunInfoStepsModeIsTheLatestRecordsMode) {
  const auto step = [](std::uint32_t rank, std::int64_t n, v1::ControlMode mode) {
    v1::StepRecord r = MakeStep("m", rank, n);
    r.set_mode(mode);
    return r;
  };
  ASSERT_EQ(ApplyRecords(store_.get(), {step(0, 5, v1::CONTROL_MODE_MONITOR), step(0, 3, v1::CONTROL_MODE_LOCAL)}, 1),
            Counts({2, 0}));
  EXPECT_EQ(store_->GetRun("m")->steps_mode(), v1::CONTROL_MODE_MONITOR);
  ASSERT_EQ(ApplyRecords(store_.get(), {step(1, 5, v1::CONTROL_MODE_REMOTE)}, 2), Counts({1, 0}));
  EXPECT_EQ(store_->GetRun("m")->steps_mode(), v1::CONTROL_MODE_REMOTE);
  ASSERT_EQ(ApplyRecords(store_.get(), {step(0, 4, v1::CONTROL_MODE_LOCAL)}, 3), Counts({1, 0}));
  EXPECT_EQ(store_->GetRun("m")->steps_mode(), v1::CONTROL_MODE_REMOTE);
  base::StatusOr<std::vector<v1::RunInfo>> runs = store_->ListRuns("", 10);
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].steps_mode(), v1::CONTROL_MODE_REMOTE);
}

TEST_P(StoreTest, EmptyStoreAnswersEmpty) {
  base::StatusOr<std::vector<v1::RunInfo>> runs = store_->ListRuns("", 100);
  ASSERT_TRUE(runs.ok());
  EXPECT_TRUE(runs->empty());
  EXPECT_EQ(store_->GetRun("r").status().code(), base::StatusCode::kNotFound);
  StepQuery query;
  query.run = "r";
  EXPECT_TRUE(Steps(store_.get(), query).empty());
  base::StatusOr<std::vector<v1::StepRecord>> recent = store_->GetRecentSteps("r", 0, 10);
  ASSERT_TRUE(recent.ok());
  EXPECT_TRUE(recent->empty());
  base::StatusOr<std::vector<v1::ConfigChange>> changes = store_->ListConfigChanges("r", 0, 10);
  ASSERT_TRUE(changes.ok());
  EXPECT_TRUE(changes->empty());
  base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> configs = store_->LoadRunConfigs();
  ASSERT_TRUE(configs.ok());
  EXPECT_TRUE(configs->empty());
  base::StatusOr<std::uint64_t> deleted =
      store_->DeleteIdleRuns(std::numeric_limits<std::int64_t>::max());
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 0u);
  std::vector<WriteOp> no_ops;
  EXPECT_TRUE(store_->Apply(&no_ops).ok());
  std::vector<WriteOp> empty_op(1);
  EXPECT_TRUE(store_->Apply(&empty_op).ok());
  EXPECT_EQ(Counts({empty_op[0].stored, empty_op[0].duplicates}), Counts({0, 0}));
}

TEST_P(StoreTest, CountsStoredAndDuplicates) {
  const std::vector<v1::StepRecord> batch = {MakeStep("r", 0, 0, 2), MakeStep("r", 1, 0, 2),
                                             MakeStep("r", 0, 1, 2)};
  EXPECT_EQ(ApplyRecords(store_.get(), batch, 100), Counts({3, 0}));
  // A replay of the whole batch stores nothing.
  EXPECT_EQ(ApplyRecords(store_.get(), batch, 200), Counts({0, 3}));
  // Partial overlap: two old keys, two new.
  EXPECT_EQ(ApplyRecords(store_.get(),
                         {MakeStep("r", 0, 1), MakeStep("r", 1, 1), MakeStep("r", 1, 0),
                          MakeStep("r", 0, 2)},
                         300),
            Counts({2, 2}));
  base::StatusOr<v1::RunInfo> info = store_->GetRun("r");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->step_records(), 5u);
}

TEST_P(StoreTest, CountsEachOpOfOneApply) {
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("a", 0, 0), MakeStep("a", 0, 1)}, 10),
            Counts({2, 0}));
  v1::IngestRequest first, second, third;
  *first.add_records() = MakeStep("a", 0, 0);  // duplicate
  *first.add_records() = MakeStep("a", 0, 2);
  *second.add_records() = MakeStep("b", 0, 0);
  *second.add_records() = MakeStep("a", 0, 3);
  *second.add_records() = MakeStep("b", 0, 1);
  *third.add_records() = MakeStep("a", 0, 1);  // duplicate
  const ConfigWrite config = MakeConfigWrite("a", 1, 0.2, "tune");
  std::vector<WriteOp> ops(4);
  ops[0].steps = &first;
  ops[1].steps = &second;
  ops[2].config = &config;
  ops[3].steps = &third;
  for (WriteOp& op : ops) {
    op.received_ns = 20;
    op.stored = 99;  // Apply sets the results, whatever they were
    op.duplicates = 99;
  }
  ASSERT_TRUE(store_->Apply(&ops).ok());
  EXPECT_EQ(Counts({ops[0].stored, ops[0].duplicates}), Counts({1, 1}));
  EXPECT_EQ(Counts({ops[1].stored, ops[1].duplicates}), Counts({3, 0}));
  EXPECT_EQ(Counts({ops[2].stored, ops[2].duplicates}), Counts({0, 0}));
  EXPECT_EQ(Counts({ops[3].stored, ops[3].duplicates}), Counts({0, 1}));
  EXPECT_EQ(store_->GetRun("a")->step_records(), 4u);
  EXPECT_EQ(store_->GetRun("b")->step_records(), 2u);
  EXPECT_EQ(store_->LoadRunConfigs()->size(), 1u);
}

TEST_P(StoreTest, LayersAndScalarsRoundTrip) {
  const std::vector<v1::StepRecord> batch = {MakeStep("r", 0, 7, 5), MakeStep("r", 1, 7, 0),
                                             MakeStep("r", 0, 8, 300)};
  ASSERT_EQ(ApplyRecords(store_.get(), batch, 1), Counts({3, 0}));
  StepQuery query;
  query.run = "r";
  query.include_layers = true;
  // Layers come back in the order they were sent, not in name order.
  EXPECT_TRUE(SameMessages(Steps(store_.get(), query), {batch[0], batch[1], batch[2]}));
  query.include_layers = false;
  std::vector<v1::StepRecord> without = Steps(store_.get(), query);
  EXPECT_TRUE(SameMessages(without, WithoutLayers(batch)));
  ASSERT_EQ(without.size(), 3u);
  EXPECT_EQ(without[0].scalars().size(), 2u);
  EXPECT_EQ(without[0].scalars().at("loss"), 3.0 - 0.07);
}

TEST_P(StoreTest, DuplicateIsNotRewritten) {
  v1::StepRecord original = MakeStep("r", 0, 5, 3);
  ASSERT_EQ(ApplyRecords(store_.get(), {original}, 1), Counts({1, 0}));
  v1::StepRecord replay = MakeStep("r", 0, 5, 6);
  replay.set_grad_norm(99);
  replay.set_world_size(64);
  (*replay.mutable_scalars())["extra"] = 1;
  EXPECT_EQ(ApplyRecords(store_.get(), {replay}, 2), Counts({0, 1}));
  StepQuery query;
  query.run = "r";
  query.include_layers = true;
  EXPECT_TRUE(SameMessages(Steps(store_.get(), query), {original}));
  EXPECT_EQ(store_->GetRun("r")->world_size(), 4u);
}

TEST_P(StoreTest, OptionalFieldsRoundTripExactly) {
  // All optional fields absent, every scalar field at its default.
  v1::StepRecord bare;
  bare.set_run("r");
  bare.set_step(0);
  bare.set_regime(v1::REGIME_SAFE);
  v1::LayerRecord* layer = bare.add_layers();
  layer->set_name("w");
  // Optional fields present with zero values: present, not absent.
  v1::StepRecord zeros = bare;
  zeros.set_step(1);
  zeros.set_cosine(0.0);
  zeros.set_cosine_after(0.0);
  zeros.set_staleness(0);
  zeros.mutable_layers(0)->set_cosine(0.0);
  // Extremes, negative zero and integral doubles keep their exact values.
  v1::StepRecord extremes = MakeStep("r", 3, 2, 1, 0);
  extremes.set_cosine(-0.0);
  extremes.set_cosine_after(-1.0);
  extremes.set_grad_norm(std::numeric_limits<double>::max());
  extremes.set_ref_norm(std::numeric_limits<double>::denorm_min());
  extremes.set_alpha(1.0);
  extremes.set_staleness(std::numeric_limits<std::int64_t>::max());
  extremes.set_rank(std::numeric_limits<std::uint32_t>::max() - 1);
  extremes.set_world_size(std::numeric_limits<std::uint32_t>::max());
  extremes.set_wall_time_ns(-5);
  extremes.set_regime(v1::REGIME_INVALID);
  extremes.set_mode(v1::CONTROL_MODE_REMOTE);
  extremes.set_fallback(true);
  extremes.mutable_layers(0)->set_cosine(-0.0);
  (*extremes.mutable_scalars())["zero"] = -0.0;
  ASSERT_EQ(ApplyRecords(store_.get(), {bare, zeros, extremes}, 1), Counts({3, 0}));

  StepQuery query;
  query.run = "r";
  query.include_layers = true;
  std::vector<v1::StepRecord> got = Steps(store_.get(), query);
  ASSERT_TRUE(SameMessages(got, {bare, zeros, extremes}));
  EXPECT_FALSE(got[0].has_cosine());
  EXPECT_FALSE(got[0].has_cosine_after());
  EXPECT_FALSE(got[0].has_staleness());
  EXPECT_FALSE(got[0].layers(0).has_cosine());
  EXPECT_TRUE(got[0].scalars().empty());
  EXPECT_TRUE(got[1].has_cosine());
  EXPECT_TRUE(got[1].has_cosine_after());
  EXPECT_TRUE(got[1].has_staleness());
  EXPECT_TRUE(got[1].layers(0).has_cosine());
  EXPECT_TRUE(std::signbit(got[2].cosine()));
  EXPECT_TRUE(std::signbit(got[2].layers(0).cosine()));
  EXPECT_TRUE(std::signbit(got[2].scalars().at("zero")));
  // Byte-exact, too (no map: map order is not part of equality).
  got[2].clear_scalars();
  extremes.clear_scalars();
  EXPECT_EQ(got[2].SerializeAsString(), extremes.SerializeAsString());
  EXPECT_EQ(got[0].SerializeAsString(), bare.SerializeAsString());
}

TEST_P(StoreTest, GetStepsOrdersAndPages) {
  // Three ranks, steps 0..9, written out of order and in several batches.
  std::vector<v1::StepRecord> all;
  for (std::int64_t step = 9; step >= 0; --step) {
    std::vector<v1::StepRecord> batch;
    for (std::uint32_t rank : {2u, 0u, 1u}) batch.push_back(MakeStep("r", rank, step, 1));
    ASSERT_EQ(ApplyRecords(store_.get(), batch, 10 - step), Counts({3, 0}));
  }
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("other", 0, 3)}, 1), Counts({1, 0}));

  StepQuery query;
  query.run = "r";
  std::vector<std::pair<std::int64_t, std::uint32_t>> want;
  for (std::int64_t step = 0; step < 10; ++step) {
    for (std::uint32_t rank = 0; rank < 3; ++rank) want.emplace_back(step, rank);
  }
  EXPECT_EQ(Keys(Steps(store_.get(), query)), want);

  // Paging with `after`, 4 at a time, visits every record once in order.
  std::vector<std::pair<std::int64_t, std::uint32_t>> paged;
  query.limit = 4;
  for (int page = 0; page < 20; ++page) {
    std::vector<v1::StepRecord> got = Steps(store_.get(), query);
    EXPECT_LE(got.size(), 4u);
    if (got.empty()) break;
    for (const auto& key : Keys(got)) paged.push_back(key);
    query.after = std::make_pair(got.back().step(), got.back().rank());
  }
  EXPECT_EQ(paged, want);

  // Range [3, 6) of rank 1.
  query = StepQuery();
  query.run = "r";
  query.start_step = 3;
  query.end_step = 6;
  query.rank = 1;
  EXPECT_EQ(Keys(Steps(store_.get(), query)),
            (std::vector<std::pair<std::int64_t, std::uint32_t>>{{3, 1}, {4, 1}, {5, 1}}));
  // Resume after (4, 1) with the rank filter; after (4, 0) too.
  query.after = std::make_pair(std::int64_t{4}, 1u);
  EXPECT_EQ(Keys(Steps(store_.get(), query)),
            (std::vector<std::pair<std::int64_t, std::uint32_t>>{{5, 1}}));
  query.after = std::make_pair(std::int64_t{4}, 0u);
  EXPECT_EQ(Keys(Steps(store_.get(), query)),
            (std::vector<std::pair<std::int64_t, std::uint32_t>>{{4, 1}, {5, 1}}));
  // `after` before start_step: start_step still applies.
  query.after = std::make_pair(std::int64_t{1}, 2u);
  EXPECT_EQ(Keys(Steps(store_.get(), query)).size(), 3u);

  // Without a rank filter, resuming in the middle of a step.
  query = StepQuery();
  query.run = "r";
  query.start_step = 8;
  query.after = std::make_pair(std::int64_t{8}, 1u);
  EXPECT_EQ(Keys(Steps(store_.get(), query)),
            (std::vector<std::pair<std::int64_t, std::uint32_t>>{{8, 2}, {9, 0}, {9, 1}, {9, 2}}));

  // Empty answers: limit 0, empty range, unknown rank, unknown run.
  query = StepQuery();
  query.run = "r";
  query.limit = 0;
  EXPECT_TRUE(Steps(store_.get(), query).empty());
  query.limit = 10;
  query.start_step = 5;
  query.end_step = 5;
  EXPECT_TRUE(Steps(store_.get(), query).empty());
  query.start_step = 0;
  query.end_step = 100;
  query.rank = 7;
  EXPECT_TRUE(Steps(store_.get(), query).empty());
  query.rank.reset();
  query.run = "unknown";
  EXPECT_TRUE(Steps(store_.get(), query).empty());
  // Other runs are not mixed in.
  query.run = "other";
  EXPECT_EQ(Keys(Steps(store_.get(), query)),
            (std::vector<std::pair<std::int64_t, std::uint32_t>>{{3, 0}}));
}

TEST_P(StoreTest, ListRunsPagesByName) {
  for (const char* run : {"d", "b", "a", "c/1", "c"}) {
    ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep(run, 0, 0)}, 1), Counts({1, 0}));
  }
  auto names = [this](const std::string& after, std::uint32_t limit) {
    std::vector<std::string> out;
    base::StatusOr<std::vector<v1::RunInfo>> runs = store_->ListRuns(after, limit);
    EXPECT_TRUE(runs.ok()) << runs.status().ToString();
    if (runs.ok()) {
      for (const v1::RunInfo& info : *runs) {
        out.push_back(info.run());
        EXPECT_FALSE(info.has_config());
      }
    }
    return out;
  };
  using Names = std::vector<std::string>;
  EXPECT_EQ(names("", 100), (Names{"a", "b", "c", "c/1", "d"}));
  EXPECT_EQ(names("", 2), (Names{"a", "b"}));
  EXPECT_EQ(names("b", 2), (Names{"c", "c/1"}));
  EXPECT_EQ(names("c/1", 2), (Names{"d"}));
  EXPECT_EQ(names("bb", 100), (Names{"c", "c/1", "d"}));
  EXPECT_EQ(names("d", 100), Names{});
  EXPECT_EQ(names("", 0), Names{});
}

TEST_P(StoreTest, GetRunOfUnknownRunIsNotFound) {
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("known", 0, 0)}, 1), Counts({1, 0}));
  EXPECT_EQ(store_->GetRun("unknown").status().code(), base::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetRun("know").status().code(), base::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetRun("").status().code(), base::StatusCode::kNotFound);
  // Settings alone do not make a run.
  ASSERT_TRUE(ApplyConfig(store_.get(), MakeConfigWrite("configured", 1, 0.2, ""), 1).ok());
  EXPECT_EQ(store_->GetRun("configured").status().code(), base::StatusCode::kNotFound);
  EXPECT_EQ(store_->ListRuns("", 100)->size(), 1u);
}

TEST_P(StoreTest, RunInfoFollowsTheRecords) {
  ASSERT_EQ(
      ApplyRecords(
          store_.get(),
          {MakeStep("r", 0, 5, 0, 2), MakeStep("r", 1, 5, 0, 2), MakeStep("r", 0, 3, 0, 2)}, 100),
      Counts({3, 0}));
  v1::RunInfo want;
  want.set_run("r");
  want.set_first_step(3);
  want.set_last_step(5);
  want.set_step_records(3);
  want.set_first_seen_ns(100);
  want.set_last_seen_ns(100);
  want.set_world_size(2);
  want.set_steps_mode(v1::CONTROL_MODE_LOCAL);  // MakeStep's
  EXPECT_TRUE(SameMessage(*store_->GetRun("r"), want));

  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("r", 3, 9, 0, 4), MakeStep("r", 0, 3, 0, 8)}, 200),
            Counts({1, 1}));
  want.set_last_step(9);
  want.set_step_records(4);
  want.set_last_seen_ns(200);
  want.set_world_size(4);  // the duplicate's 8 is not stored
  EXPECT_TRUE(SameMessage(*store_->GetRun("r"), want));

  // A replay is a report: it moves last_seen_ns and nothing else.
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("r", 0, 5)}, 300), Counts({0, 1}));
  want.set_last_seen_ns(300);
  EXPECT_TRUE(SameMessage(*store_->GetRun("r"), want));
  // An earlier receive time moves first_seen_ns back (ops are not required to
  // arrive in time order).
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("r", 0, 1, 0, 1)}, 50), Counts({1, 0}));
  want.set_first_step(1);
  want.set_step_records(5);
  want.set_first_seen_ns(50);
  EXPECT_TRUE(SameMessage(*store_->GetRun("r"), want));

  // world_size 0 is read as 1.
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("solo", 0, 0, 0, 0)}, 1), Counts({1, 0}));
  EXPECT_EQ(store_->GetRun("solo")->world_size(), 1u);

  // Interleaved runs in one batch.
  ASSERT_EQ(ApplyRecords(store_.get(),
                         {MakeStep("x", 0, 4), MakeStep("y", 0, 7), MakeStep("x", 0, 2),
                          MakeStep("y", 1, 7), MakeStep("x", 1, 6)},
                         400),
            Counts({5, 0}));
  base::StatusOr<v1::RunInfo> x = store_->GetRun("x");
  base::StatusOr<v1::RunInfo> y = store_->GetRun("y");
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(std::make_tuple(x->first_step(), x->last_step(), x->step_records()),
            std::make_tuple(std::int64_t{2}, std::int64_t{6}, std::uint64_t{3}));
  EXPECT_EQ(std::make_tuple(y->first_step(), y->last_step(), y->step_records()),
            std::make_tuple(std::int64_t{7}, std::int64_t{7}, std::uint64_t{2}));

  // ListRuns gives the same RunInfo as GetRun.
  base::StatusOr<std::vector<v1::RunInfo>> runs = store_->ListRuns("", 10);
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 4u);
  EXPECT_TRUE(SameMessage((*runs)[0], want));
}

TEST_P(StoreTest, GetRecentStepsGivesTheLastWindowOfARank) {
  std::vector<v1::StepRecord> rank0;
  for (std::int64_t step = 0; step < 10; ++step) {
    rank0.push_back(MakeStep("r", 0, step, 2));
    ASSERT_EQ(ApplyRecords(store_.get(), {rank0.back(), MakeStep("r", 1, step + 100, 2)}, step),
              Counts({2, 0}));
  }
  rank0 = WithoutLayers(rank0);
  auto recent = [this](std::uint32_t rank, std::uint32_t window) {
    base::StatusOr<std::vector<v1::StepRecord>> got = store_->GetRecentSteps("r", rank, window);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    return got.ok() ? std::move(got).value() : std::vector<v1::StepRecord>();
  };
  EXPECT_TRUE(SameMessages(recent(0, 3), {rank0[7], rank0[8], rank0[9]}));
  EXPECT_TRUE(SameMessages(recent(0, 1), {rank0[9]}));
  EXPECT_TRUE(SameMessages(recent(0, 0), rank0));
  EXPECT_TRUE(SameMessages(recent(0, 50), rank0));
  std::vector<v1::StepRecord> r1 = recent(1, 2);
  EXPECT_EQ(Keys(r1), (std::vector<std::pair<std::int64_t, std::uint32_t>>{{108, 1}, {109, 1}}));
  EXPECT_TRUE(recent(2, 0).empty());
  base::StatusOr<std::vector<v1::StepRecord>> unknown = store_->GetRecentSteps("nope", 0, 0);
  ASSERT_TRUE(unknown.ok());
  EXPECT_TRUE(unknown->empty());
}

TEST_P(StoreTest, ConfigWritesAuditAndLoad) {
  const ConfigWrite a1 = MakeConfigWrite("a", 1, 0.2, "first");
  const ConfigWrite a2 = MakeConfigWrite("a", 2, 0.3, "second");
  const ConfigWrite a3 = MakeConfigWrite("a", 3, 0.35, "third");
  const ConfigWrite b1 = MakeConfigWrite("b", 1, 0.1, "b only");
  ConfigWrite unset = MakeConfigWrite("c", 1, 0.1, "version 0");
  unset.config.set_version(0);
  ASSERT_TRUE(ApplyConfig(store_.get(), b1, 1).ok());
  ASSERT_TRUE(ApplyConfig(store_.get(), a1, 2).ok());
  ASSERT_TRUE(ApplyConfig(store_.get(), a2, 3).ok());
  ASSERT_TRUE(ApplyConfig(store_.get(), unset, 4).ok());
  ASSERT_TRUE(ApplyConfig(store_.get(), a3, 5).ok());

  base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> configs = store_->LoadRunConfigs();
  ASSERT_TRUE(configs.ok()) << configs.status().ToString();
  ASSERT_EQ(configs->size(), 2u);  // "c" has version 0: server defaults
  EXPECT_EQ((*configs)[0].first, "a");
  EXPECT_TRUE(SameMessage((*configs)[0].second, a3.config));
  EXPECT_EQ((*configs)[1].first, "b");
  EXPECT_TRUE(SameMessage((*configs)[1].second, b1.config));

  auto changes = [this](const std::string& run, std::uint64_t offset, std::uint32_t limit) {
    base::StatusOr<std::vector<v1::ConfigChange>> got = store_->ListConfigChanges(run, offset, limit);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    return got.ok() ? std::move(got).value() : std::vector<v1::ConfigChange>();
  };
  EXPECT_TRUE(SameMessages(changes("a", 0, 100), {a1.change, a2.change, a3.change}));
  EXPECT_TRUE(SameMessages(changes("a", 1, 1), {a2.change}));
  EXPECT_TRUE(SameMessages(changes("a", 2, 100), {a3.change}));
  EXPECT_TRUE(changes("a", 3, 100).empty());
  EXPECT_TRUE(changes("a", std::numeric_limits<std::uint64_t>::max(), 100).empty());
  EXPECT_TRUE(changes("a", 0, 0).empty());
  EXPECT_TRUE(SameMessages(changes("b", 0, 100), {b1.change}));
  EXPECT_TRUE(SameMessages(changes("c", 0, 100), {unset.change}));
  EXPECT_TRUE(changes("d", 0, 100).empty());
}

// A settings change made from a version that is no longer the stored one
// (another gacd sharing the store changed the run first) is not written: the
// op says so and carries the stored settings, and the call's other ops
// commit.
TEST_P(StoreTest, StaleSettingsChangeConflictsAndTheRestCommits) {
  const ConfigWrite a1 = MakeConfigWrite("a", 1, 0.2, "first");
  ASSERT_TRUE(ApplyConfig(store_.get(), a1, 1).ok());

  const ConfigWrite stale = MakeConfigWrite("a", 1, 0.4, "made from version 0 too");
  const ConfigWrite ahead = MakeConfigWrite("a", 3, 0.5, "made from version 2");
  const ConfigWrite unknown = MakeConfigWrite("b", 2, 0.5, "made from version 1 of a run without settings");
  v1::IngestRequest request;
  request.set_sequence(1);
  *request.add_records() = MakeStep("a", 0, 7);
  std::vector<WriteOp> ops(4);
  ops[0].config = &stale;
  ops[1].steps = &request;
  ops[2].config = &ahead;
  ops[3].config = &unknown;
  for (WriteOp& op : ops) op.received_ns = 10;
  base::Status s = store_->Apply(&ops);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(ops[0].config_conflict);
  EXPECT_TRUE(SameMessage(ops[0].stored_config, a1.config));
  EXPECT_FALSE(ops[1].config_conflict);
  EXPECT_EQ(Counts({ops[1].stored, ops[1].duplicates}), Counts({1, 0}));
  EXPECT_TRUE(ops[2].config_conflict);
  EXPECT_TRUE(SameMessage(ops[2].stored_config, a1.config));
  EXPECT_TRUE(ops[3].config_conflict);
  EXPECT_EQ(ops[3].stored_config.version(), 0u);

  // Nothing of the conflicting changes was written.
  base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> configs = store_->LoadRunConfigs();
  ASSERT_TRUE(configs.ok());
  ASSERT_EQ(configs->size(), 1u);
  EXPECT_TRUE(SameMessage(configs->at(0).second, a1.config));
  EXPECT_TRUE(SameMessages(*store_->ListConfigChanges("a", 0, 10), {a1.change}));
  EXPECT_TRUE(store_->ListConfigChanges("b", 0, 10)->empty());
  EXPECT_EQ(store_->GetRun("a")->step_records(), 1u);

  // Made from the stored version, the change is written.
  const ConfigWrite a2 = MakeConfigWrite("a", 2, 0.3, "second");
  std::vector<WriteOp> next(1);
  next[0].config = &a2;
  next[0].received_ns = 11;
  ASSERT_TRUE(store_->Apply(&next).ok());
  EXPECT_FALSE(next[0].config_conflict);
  EXPECT_TRUE(SameMessage(store_->LoadRunConfigs()->at(0).second, a2.config));
  EXPECT_TRUE(SameMessages(*store_->ListConfigChanges("a", 0, 10), {a1.change, a2.change}));
}

TEST_P(StoreTest, DeleteIdleRunsKeepsSettings) {
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("old", 0, 0, 3), MakeStep("old", 0, 1, 3)}, 100),
            Counts({2, 0}));
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("new", 0, 0, 3)}, 100), Counts({1, 0}));
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("new", 0, 1, 3)}, 300), Counts({1, 0}));
  const ConfigWrite config = MakeConfigWrite("old", 1, 0.2, "kept");
  ASSERT_TRUE(ApplyConfig(store_.get(), config, 150).ok());

  base::StatusOr<std::uint64_t> deleted = store_->DeleteIdleRuns(100);  // strictly before the cutoff
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 0u);
  deleted = store_->DeleteIdleRuns(200);
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(*deleted, 1u);

  EXPECT_EQ(store_->GetRun("old").status().code(), base::StatusCode::kNotFound);
  StepQuery query;
  query.run = "old";
  query.include_layers = true;
  EXPECT_TRUE(Steps(store_.get(), query).empty());
  EXPECT_TRUE(store_->GetRecentSteps("old", 0, 0)->empty());
  EXPECT_EQ(store_->ListRuns("", 10)->size(), 1u);
  EXPECT_EQ(store_->GetRun("new")->step_records(), 2u);
  query.run = "new";
  EXPECT_EQ(Steps(store_.get(), query).size(), 2u);
  // Settings and audit survive.
  ASSERT_EQ(store_->LoadRunConfigs()->size(), 1u);
  EXPECT_TRUE(SameMessage(store_->LoadRunConfigs()->at(0).second, config.config));
  EXPECT_EQ(store_->ListConfigChanges("old", 0, 10)->size(), 1u);

  // A replay of the deleted run is stored again, as a new run.
  ASSERT_EQ(ApplyRecords(store_.get(), {MakeStep("old", 0, 1, 3), MakeStep("new", 0, 1)}, 400),
            Counts({1, 1}));
  v1::RunInfo want;
  want.set_run("old");
  want.set_first_step(1);
  want.set_last_step(1);
  want.set_step_records(1);
  want.set_first_seen_ns(400);
  want.set_last_seen_ns(400);
  want.set_world_size(4);
  want.set_steps_mode(v1::CONTROL_MODE_LOCAL);
  EXPECT_TRUE(SameMessage(*store_->GetRun("old"), want));
  query.run = "old";
  std::vector<v1::StepRecord> got = Steps(store_.get(), query);
  EXPECT_TRUE(SameMessages(got, {MakeStep("old", 0, 1, 3)}));

  deleted = store_->DeleteIdleRuns(std::numeric_limits<std::int64_t>::max());
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 2u);
  EXPECT_TRUE(store_->ListRuns("", 10)->empty());
}

// Readers run while a writer commits: each reader sees whole transactions
// (a step record with all its layers) and counts that never go back.
TEST_P(StoreTest, ReadsSeeWholeTransactionsDuringWrites) {
  constexpr int kBatches = 150;
  constexpr int kLayers = 5;
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::thread reader([&] {
    std::size_t last = 0;
    while (!done.load()) {
      StepQuery query;
      query.run = "r";
      query.include_layers = true;
      query.limit = 100000;
      base::StatusOr<std::vector<v1::StepRecord>> got = store_->GetSteps(query);
      if (!got.ok() || got->size() < last || got->size() % 2 != 0) ++failures;
      if (got.ok()) {
        last = got->size();
        for (const v1::StepRecord& r : *got) {
          if (r.layers_size() != kLayers) ++failures;
        }
      }
      base::StatusOr<v1::RunInfo> info = store_->GetRun("r");
      if (info.ok() && info->step_records() < last) ++failures;
    }
  });
  for (int i = 0; i < kBatches; ++i) {
    ASSERT_EQ(
        ApplyRecords(store_.get(), {MakeStep("r", 0, i, kLayers), MakeStep("r", 1, i, kLayers)}, i),
        Counts({2, 0}));
  }
  done = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store_->GetRun("r")->step_records(), 2u * kBatches);
}

// ---------------------------------------------------------------------------
// SQLite only
// ---------------------------------------------------------------------------

// A raw connection to the store's file, for what the Store API cannot do.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
    sqlite3_busy_timeout(db_, 5000);
  }
  ~RawDb() { sqlite3_close(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  void Exec(const std::string& sql) {
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
        << sql << ": " << (error != nullptr ? error : "");
    sqlite3_free(error);
  }
  // The first column of the first row as text ("" when there is none).
  std::string Query(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
    std::string out;
    if (stmt != nullptr && sqlite3_step(stmt) == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(stmt, 0);
      if (text != nullptr) out = reinterpret_cast<const char*>(text);
    }
    sqlite3_finalize(stmt);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

class SqliteStoreTest : public ::testing::Test {
 protected:
  std::string DbPath() const { return dir_.File("gacd.db"); }
  TempDir dir_;
};

TEST_F(SqliteStoreTest, DataSurvivesReopen) {
  const std::vector<v1::StepRecord> batch = {MakeStep("r", 0, 1, 4), MakeStep("r", 1, 1, 4)};
  const ConfigWrite config = MakeConfigWrite("r", 1, 0.2, "persist");
  {
    SqliteOptions options;
    options.synchronous = "normal";
    std::unique_ptr<Store> store = OpenOrDie(DbPath(), options);
    ASSERT_NE(store, nullptr);
    ASSERT_EQ(ApplyRecords(store.get(), batch, 10), Counts({2, 0}));
    ASSERT_TRUE(ApplyConfig(store.get(), config, 11).ok());
  }
  std::unique_ptr<Store> store = OpenOrDie(DbPath());
  ASSERT_NE(store, nullptr);
  StepQuery query;
  query.run = "r";
  query.include_layers = true;
  EXPECT_TRUE(SameMessages(Steps(store.get(), query), batch));
  EXPECT_EQ(store->GetRun("r")->step_records(), 2u);
  EXPECT_EQ(store->LoadRunConfigs()->size(), 1u);
  EXPECT_EQ(store->ListConfigChanges("r", 0, 10)->size(), 1u);
  // Replays after a restart are still duplicates.
  EXPECT_EQ(ApplyRecords(store.get(), batch, 20), Counts({0, 2}));
  EXPECT_EQ(ApplyRecords(store.get(), {MakeStep("r", 0, 2)}, 20), Counts({1, 0}));
}

TEST_F(SqliteStoreTest, SchemaVersionAndWal) {
  std::unique_ptr<Store> store = OpenOrDie(DbPath());
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("r", 0, 0, 2)}, 1), Counts({1, 0}));
  EXPECT_EQ(SqliteSchemaVersion(), 1);
  RawDb raw(DbPath());
  EXPECT_EQ(raw.Query("PRAGMA user_version"), std::to_string(SqliteSchemaVersion()));
  EXPECT_EQ(raw.Query("PRAGMA journal_mode"), "wal");
  EXPECT_TRUE(std::filesystem::exists(DbPath() + "-wal"));
  EXPECT_EQ(raw.Query("SELECT count(*) FROM layers"), "2");
}

// A file made before some record schema rows existed (their columns
// dropped here) gets them as columns when opened; its rows read them as
// absent (optional fields) or zero, and new rows keep them.
TEST_F(SqliteStoreTest, ColumnsOfLaterFieldsAreAdded) {
  const std::vector<const char*> later = {"c_low", "c_high", "trigger", "window_size", "window_c_low",
                                          "window_c_high", "fallback"};
  const v1::StepRecord old_row = MakeStep("r", 0, 1);
  {
    std::unique_ptr<Store> store = OpenOrDie(DbPath());
    ASSERT_NE(store, nullptr);
    ASSERT_EQ(ApplyRecords(store.get(), {old_row}, 1), Counts({1, 0}));
  }
  {
    RawDb raw(DbPath());
    for (const char* column : later) raw.Exec(std::string("ALTER TABLE steps DROP COLUMN ") + column);
    EXPECT_EQ(raw.Query("SELECT count(*) FROM pragma_table_info('steps') WHERE name = 'c_low'"), "0");
  }
  std::unique_ptr<Store> store = OpenOrDie(DbPath());
  ASSERT_NE(store, nullptr);
  {
    RawDb raw(DbPath());
    for (const char* column : later) {
      EXPECT_EQ(raw.Query(std::string("SELECT count(*) FROM pragma_table_info('steps') WHERE name = '") + column + "'"),
                "1")
          << column;
    }
    EXPECT_EQ(raw.Query("SELECT \"notnull\" FROM pragma_table_info('steps') WHERE name = 'fallback'"), "1");
  }
  v1::StepRecord new_row = EveryFieldSet("r");
  new_row.set_step(2);
  ASSERT_EQ(ApplyRecords(store.get(), {new_row}, 2), Counts({1, 0}));
  StepQuery query;
  query.run = "r";
  query.include_layers = true;
  const std::vector<v1::StepRecord> got = Steps(store.get(), query);
  ASSERT_EQ(got.size(), 2u);
  v1::StepRecord old_read = old_row;
  old_read.set_fallback(false);  // the added column's default
  EXPECT_TRUE(SameMessages(std::vector<v1::StepRecord>{got[0]}, std::vector<v1::StepRecord>{old_read}));
  EXPECT_FALSE(got[0].has_c_low() || got[0].has_trigger() || got[0].has_window());
  EXPECT_TRUE(SameMessages(std::vector<v1::StepRecord>{got[1]}, std::vector<v1::StepRecord>{new_row}));
}

TEST_F(SqliteStoreTest, GarbageFileIsDataLoss) {
  {
    std::ofstream out(DbPath(), std::ios::binary);
    for (int i = 0; i < 512; ++i) out << "not a database ";
  }
  base::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(DbPath());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), base::StatusCode::kDataLoss) << store.status().ToString();
  EXPECT_NE(store.status().message().find(DbPath()), std::string::npos)
      << store.status().ToString();
}

TEST_F(SqliteStoreTest, MissingDirectoryIsNotFoundNotDataLoss) {
  const std::string path = dir_.File("no/such/dir/gacd.db");
  base::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), base::StatusCode::kNotFound) << store.status().ToString();
  EXPECT_NE(store.status().message().find(path), std::string::npos) << store.status().ToString();
}

TEST_F(SqliteStoreTest, NewerSchemaIsFailedPrecondition) {
  {
    RawDb raw(DbPath());
    raw.Exec("CREATE TABLE future (x); PRAGMA user_version = " +
             std::to_string(SqliteSchemaVersion() + 1));
  }
  base::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(DbPath());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), base::StatusCode::kFailedPrecondition) << store.status().ToString();
  // The file is left as it was.
  RawDb raw(DbPath());
  EXPECT_EQ(raw.Query("PRAGMA journal_mode"), "delete");
  EXPECT_EQ(raw.Query("SELECT count(*) FROM sqlite_schema WHERE name = 'runs'"), "0");
}

TEST_F(SqliteStoreTest, EmptyFileIsANewDatabase) {
  { std::ofstream out(DbPath(), std::ios::binary); }
  std::unique_ptr<Store> store = OpenOrDie(DbPath());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(ApplyRecords(store.get(), {MakeStep("r", 0, 0)}, 1), Counts({1, 0}));
}

TEST_F(SqliteStoreTest, TwoStoresOnOneFileShareData) {
  std::unique_ptr<Store> first = OpenOrDie(DbPath());
  std::unique_ptr<Store> second = OpenOrDie(DbPath());
  ASSERT_TRUE(first != nullptr && second != nullptr);
  ASSERT_EQ(ApplyRecords(first.get(), {MakeStep("r", 0, 0)}, 1), Counts({1, 0}));
  EXPECT_EQ(second->GetRun("r")->step_records(), 1u);
  EXPECT_EQ(ApplyRecords(second.get(), {MakeStep("r", 0, 0), MakeStep("r", 0, 1)}, 2),
            Counts({1, 1}));
}

TEST_F(SqliteStoreTest, BadOptionsAreInvalidArgument) {
  SqliteOptions options;
  options.synchronous = "FULL; DROP TABLE runs";
  EXPECT_EQ(OpenSqliteStore(DbPath(), options).status().code(), base::StatusCode::kInvalidArgument);
  options.synchronous = "EXTRA";
  options.busy_timeout_ms = -1;
  EXPECT_EQ(OpenSqliteStore(DbPath(), options).status().code(), base::StatusCode::kInvalidArgument);
}

TEST_F(SqliteStoreTest, LockedDatabaseIsUnavailable) {
  SqliteOptions options;
  options.busy_timeout_ms = 20;
  std::unique_ptr<Store> store = OpenOrDie(DbPath(), options);
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("r", 0, 0)}, 1), Counts({1, 0}));
  RawDb raw(DbPath());
  raw.Exec("BEGIN IMMEDIATE");
  v1::IngestRequest request;
  *request.add_records() = MakeStep("r", 0, 1);
  std::vector<WriteOp> ops(1);
  ops[0].steps = &request;
  base::Status s = store->Apply(&ops);
  EXPECT_EQ(s.code(), base::StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(store->DeleteIdleRuns(1000).status().code(), base::StatusCode::kUnavailable);
  // Reads go on under a writer.
  EXPECT_EQ(store->GetRun("r")->step_records(), 1u);
  raw.Exec("COMMIT");
  EXPECT_TRUE(store->Apply(&ops).ok());
  EXPECT_EQ(Counts({ops[0].stored, ops[0].duplicates}), Counts({1, 0}));
}

// A trigger makes one layer insert fail in the middle of a transaction: the
// whole Apply is rolled back, and the store keeps working afterwards (its
// run-id cache must not name rolled-back runs).
TEST_F(SqliteStoreTest, FailedApplyRollsBackEverything) {
  std::unique_ptr<Store> store = OpenOrDie(DbPath());
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("existing", 0, 0, 2)}, 100), Counts({1, 0}));
  const v1::RunInfo before = *store->GetRun("existing");
  RawDb raw(DbPath());
  raw.Exec(
      "CREATE TRIGGER fail_boom BEFORE INSERT ON layers WHEN NEW.name = 'boom' "
      "BEGIN SELECT RAISE(ABORT, 'injected failure'); END");

  v1::IngestRequest good, bad;
  *good.add_records() = MakeStep("fresh", 0, 0, 2);
  *good.add_records() = MakeStep("existing", 0, 1, 2);
  *bad.add_records() = MakeStep("other", 0, 0, 2);
  v1::StepRecord boom = MakeStep("existing", 0, 2, 2);
  boom.mutable_layers(1)->set_name("boom");
  *bad.add_records() = boom;
  const ConfigWrite config = MakeConfigWrite("fresh", 1, 0.2, "lost");
  std::vector<WriteOp> ops(3);
  ops[0].steps = &good;
  ops[1].config = &config;
  ops[2].steps = &bad;
  for (WriteOp& op : ops) op.received_ns = 200;
  base::Status s = store->Apply(&ops);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("injected failure"), std::string::npos) << s.ToString();

  EXPECT_EQ(store->GetRun("fresh").status().code(), base::StatusCode::kNotFound);
  EXPECT_EQ(store->GetRun("other").status().code(), base::StatusCode::kNotFound);
  EXPECT_TRUE(SameMessage(*store->GetRun("existing"), before));
  EXPECT_TRUE(store->LoadRunConfigs()->empty());
  EXPECT_TRUE(store->ListConfigChanges("fresh", 0, 10)->empty());
  EXPECT_EQ(raw.Query("SELECT count(*) FROM steps"), "1");
  EXPECT_EQ(raw.Query("SELECT count(*) FROM layers"), "2");
  EXPECT_EQ(raw.Query("SELECT count(*) FROM runs"), "1");

  raw.Exec("DROP TRIGGER fail_boom");
  // Runs created and rolled back get fresh rows now; existing is updated.
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("other", 0, 0, 2)}, 300), Counts({1, 0}));
  ASSERT_EQ(
      ApplyRecords(store.get(), {MakeStep("fresh", 0, 0, 2), MakeStep("existing", 0, 1, 2)}, 300),
      Counts({2, 0}));
  EXPECT_EQ(store->GetRun("fresh")->step_records(), 1u);
  EXPECT_EQ(store->GetRun("other")->step_records(), 1u);
  EXPECT_EQ(store->GetRun("existing")->step_records(), 2u);
  EXPECT_EQ(store->GetRun("existing")->last_seen_ns(), 300);
  StepQuery query;
  query.run = "fresh";
  query.include_layers = true;
  EXPECT_TRUE(SameMessages(Steps(store.get(), query), {MakeStep("fresh", 0, 0, 2)}));
}

// Run ids of deleted runs may be reused; the writer must not keep using a
// cached id of a deleted run.
TEST_F(SqliteStoreTest, RunIdsAfterRetention) {
  std::unique_ptr<Store> store = OpenOrDie(DbPath());
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("a", 0, 0)}, 100), Counts({1, 0}));
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("b", 0, 0)}, 300), Counts({1, 0}));
  ASSERT_EQ(*store->DeleteIdleRuns(200), 1u);
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("c", 0, 5)}, 400), Counts({1, 0}));
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("b", 0, 1)}, 400), Counts({1, 0}));
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("a", 0, 0)}, 400), Counts({1, 0}));
  EXPECT_EQ(store->GetRun("a")->step_records(), 1u);
  EXPECT_EQ(store->GetRun("b")->step_records(), 2u);
  EXPECT_EQ(store->GetRun("c")->step_records(), 1u);
  StepQuery query;
  query.run = "c";
  EXPECT_EQ(Keys(Steps(store.get(), query)),
            (std::vector<std::pair<std::int64_t, std::uint32_t>>{{5, 0}}));
}

// ---------------------------------------------------------------------------
// The two implementations on one random workload
// ---------------------------------------------------------------------------

class RandomWorkload {
 public:
  explicit RandomWorkload(std::uint64_t seed) : rng_(seed) {}

  // One Apply call: 1-3 ops, steps (new keys, replays, collisions) or
  // settings. No key repeats within the call.
  void NextCall(std::vector<v1::IngestRequest>* requests, std::vector<ConfigWrite>* configs) {
    std::set<std::tuple<std::string, std::uint32_t, std::int64_t>> keys;
    const int n_ops = Uniform(1, 3);
    for (int op = 0; op < n_ops; ++op) {
      if (Uniform(0, 4) == 0) {
        const std::string& run = kRuns[Uniform(0, kRuns.size() - 1)];
        configs->push_back(
            MakeConfigWrite(run, ++versions_[run], Double(), "r" + std::to_string(op)));
        continue;
      }
      v1::IngestRequest& request = requests->emplace_back();
      const int n = Uniform(1, 8);
      for (int i = 0; i < n; ++i) {
        v1::StepRecord r;
        if (!history_.empty() && Uniform(0, 3) == 0) {
          r = history_[Uniform(0, history_.size() - 1)];  // an exact replay
        } else {
          r = RandomRecord();
        }
        if (!keys.emplace(r.run(), r.rank(), r.step()).second) continue;
        history_.push_back(r);
        *request.add_records() = std::move(r);
      }
    }
  }

  int Uniform(std::size_t lo, std::size_t hi) {
    return static_cast<int>(std::uniform_int_distribution<std::size_t>(lo, hi)(rng_));
  }

  static inline const std::vector<std::string> kRuns = {"alpha", "beta", "gamma/1", "delta:x"};

 private:
  double Double() {
    switch (Uniform(0, 9)) {
      case 0:
        return 0.0;
      case 1:
        return -0.0;
      case 2:
        return 1.0;
      default:
        return std::uniform_real_distribution<double>(-1, 1)(rng_);
    }
  }

  v1::StepRecord RandomRecord() {
    v1::StepRecord r;
    r.set_run(kRuns[Uniform(0, kRuns.size() - 1)]);
    r.set_rank(Uniform(0, 2));
    r.set_world_size(Uniform(0, 4));
    r.set_step(Uniform(0, 40));
    if (Uniform(0, 3) != 0) r.set_cosine(Double());
    r.set_grad_norm(std::abs(Double()));
    r.set_ref_norm(std::abs(Double()) * 10);
    r.set_regime(static_cast<v1::Regime>(Uniform(1, 4)));
    r.set_alpha(std::abs(Double()));
    if (Uniform(0, 1) == 0) r.set_cosine_after(Double());
    if (Uniform(0, 1) == 0) r.set_staleness(Uniform(0, 5));
    r.set_wall_time_ns(Uniform(0, 1'000'000));
    r.set_agent_overhead_seconds(std::abs(Double()) * 1e-3);
    r.set_mode(static_cast<v1::ControlMode>(Uniform(0, 3)));
    r.set_fallback(Uniform(0, 1) == 0);
    std::vector<std::string> names = {"w0", "w1", "embed", "head.bias", "z"};
    std::shuffle(names.begin(), names.end(), rng_);
    const int layers = Uniform(0, 4);
    for (int i = 0; i < layers; ++i) {
      v1::LayerRecord* layer = r.add_layers();
      layer->set_name(names[i]);
      if (Uniform(0, 2) != 0) layer->set_cosine(Double());
      layer->set_grad_norm(std::abs(Double()));
      layer->set_ref_norm(std::abs(Double()));
    }
    const int scalars = Uniform(0, 3);
    for (int i = 0; i < scalars; ++i) (*r.mutable_scalars())[names[i]] = Double();
    return r;
  }

  std::mt19937_64 rng_;
  std::vector<v1::StepRecord> history_;
  std::map<std::string, std::uint64_t> versions_;
};

void ExpectSameAnswers(Store* memory, Store* sqlite, RandomWorkload* random) {
  {
    auto want = memory->ListRuns("", 1000);
    auto got = sqlite->ListRuns("", 1000);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_TRUE(SameMessages(*got, *want)) << "ListRuns";
    auto want_page = memory->ListRuns("beta", 2);
    auto got_page = sqlite->ListRuns("beta", 2);
    ASSERT_TRUE(want_page.ok() && got_page.ok());
    EXPECT_TRUE(SameMessages(*got_page, *want_page)) << "ListRuns page";
  }
  std::vector<std::string> runs = RandomWorkload::kRuns;
  runs.push_back("unknown");
  for (const std::string& run : runs) {
    auto want_run = memory->GetRun(run);
    auto got_run = sqlite->GetRun(run);
    ASSERT_EQ(want_run.status().code(), got_run.status().code()) << run;
    if (want_run.ok()) {
      EXPECT_TRUE(SameMessage(*got_run, *want_run)) << run;
    }

    for (int q = 0; q < 6; ++q) {
      StepQuery query;
      query.run = run;
      query.include_layers = random->Uniform(0, 1) == 0;
      if (random->Uniform(0, 1) == 0) query.rank = random->Uniform(0, 3);
      if (random->Uniform(0, 1) == 0) {
        query.start_step = random->Uniform(0, 30);
        query.end_step = query.start_step + random->Uniform(0, 20);
      }
      query.limit = random->Uniform(0, 1) == 0 ? 1000 : random->Uniform(1, 7);
      // Page through to the end, both ways.
      for (int page = 0; page < 200; ++page) {
        auto want = memory->GetSteps(query);
        auto got = sqlite->GetSteps(query);
        ASSERT_TRUE(want.ok() && got.ok()) << got.status().ToString();
        ASSERT_TRUE(SameMessages(*got, *want)) << run << " page " << page;
        if (want->size() < query.limit) break;
        query.after = std::make_pair(want->back().step(), want->back().rank());
      }
    }
    for (std::uint32_t rank = 0; rank < 3; ++rank) {
      for (std::uint32_t window : {0u, 1u, 4u}) {
        auto want = memory->GetRecentSteps(run, rank, window);
        auto got = sqlite->GetRecentSteps(run, rank, window);
        ASSERT_TRUE(want.ok() && got.ok());
        EXPECT_TRUE(SameMessages(*got, *want)) << run << " recent " << rank << "/" << window;
      }
    }
    for (auto [offset, limit] : {std::pair<std::uint64_t, std::uint32_t>{0, 100}, {1, 2}, {3, 1}}) {
      auto want = memory->ListConfigChanges(run, offset, limit);
      auto got = sqlite->ListConfigChanges(run, offset, limit);
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_TRUE(SameMessages(*got, *want)) << run << " changes";
    }
  }
  auto want = memory->LoadRunConfigs();
  auto got = sqlite->LoadRunConfigs();
  ASSERT_TRUE(want.ok() && got.ok());
  ASSERT_EQ(got->size(), want->size());
  for (std::size_t i = 0; i < got->size(); ++i) {
    EXPECT_EQ((*got)[i].first, (*want)[i].first);
    EXPECT_TRUE(SameMessage((*got)[i].second, (*want)[i].second));
  }
}

// Applies `calls` calls of the random workload of `seed` to the memory store
// and to `other`: every op's counts must agree, retention now and then must
// delete the same runs, and every `check_every` calls every query must give
// the same answers. Adds the records stored and the duplicates to the totals.
void RunRandomWorkload(Store* memory, Store* other, std::uint64_t seed, int calls, int check_every,
                       std::uint64_t* total_stored, std::uint64_t* total_duplicates) {
  RandomWorkload random(seed);
  std::int64_t now = 1000;
  for (int call = 0; call < calls; ++call) {
    now += random.Uniform(1, 50);
    std::vector<v1::IngestRequest> requests;
    std::vector<ConfigWrite> configs;
    requests.reserve(3);
    configs.reserve(3);
    random.NextCall(&requests, &configs);
    std::vector<WriteOp> ops;
    for (const v1::IngestRequest& r : requests) ops.push_back(WriteOp{&r, nullptr, now});
    for (const ConfigWrite& c : configs) ops.push_back(WriteOp{nullptr, &c, now});
    std::vector<WriteOp> other_ops = ops;
    ASSERT_TRUE(memory->Apply(&ops).ok());
    base::Status s = other->Apply(&other_ops);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      ASSERT_EQ(Counts({other_ops[i].stored, other_ops[i].duplicates}), Counts({ops[i].stored, ops[i].duplicates}))
          << "call " << call << " op " << i;
      *total_stored += ops[i].stored;
      *total_duplicates += ops[i].duplicates;
    }
    if (random.Uniform(0, 24) == 0) {
      const std::int64_t cutoff = now - random.Uniform(0, 400);
      base::StatusOr<std::uint64_t> want = memory->DeleteIdleRuns(cutoff);
      base::StatusOr<std::uint64_t> got = other->DeleteIdleRuns(cutoff);
      ASSERT_TRUE(want.ok() && got.ok()) << got.status().ToString();
      ASSERT_EQ(*got, *want) << "call " << call;
    }
    if (call % check_every == check_every - 1) {
      ExpectSameAnswers(memory, other, &random);
      if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return;
    }
  }
}

TEST(StoreEquivalenceTest, RandomWorkloadGivesEqualAnswers) {
  TempDir dir;
  std::unique_ptr<Store> sqlite = OpenOrDie(dir.File("gacd.db"));
  ASSERT_NE(sqlite, nullptr);
  std::unique_ptr<Store> memory = NewMemoryStore();
  std::uint64_t total_stored = 0;
  std::uint64_t total_duplicates = 0;
  RunRandomWorkload(memory.get(), sqlite.get(), 20240611, 400, 40, &total_stored, &total_duplicates);
  if (HasFatalFailure()) return;
  // The workload exercised what it is meant to.
  EXPECT_GT(total_stored, 300u);
  EXPECT_GT(total_duplicates, 100u);
}


// ---------------------------------------------------------------------------
// PostgreSQL only: several stores on one database (as several gacd replicas
// have), notifications, outages and start-up errors, on a server the test
// starts.
// ---------------------------------------------------------------------------

std::unique_ptr<Store> OpenPostgresOrDie(const std::string& uri, const PostgresOptions& options = {}) {
  base::StatusOr<std::unique_ptr<Store>> store = OpenPostgresStore(uri, options);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(store).value() : nullptr;
}

class PostgresStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GAC_NEW_POSTGRES_DATABASE_OR_SKIP(cluster, uri);
    cluster_ = cluster;
    uri_ = uri;
  }
  std::string DatabaseName() const { return uri_.substr(uri_.rfind('/') + 1); }

  testing::PostgresCluster* cluster_ = nullptr;
  std::string uri_;
};

TEST_F(PostgresStoreTest, RandomWorkloadGivesTheMemoryStoresAnswers) {
  std::unique_ptr<Store> postgres = OpenPostgresOrDie(uri_);
  ASSERT_NE(postgres, nullptr);
  std::unique_ptr<Store> memory = NewMemoryStore();
  std::uint64_t total_stored = 0;
  std::uint64_t total_duplicates = 0;
  RunRandomWorkload(memory.get(), postgres.get(), 20240612, 300, 50, &total_stored, &total_duplicates);
  if (HasFatalFailure()) return;
  EXPECT_GT(total_stored, 200u);
  EXPECT_GT(total_duplicates, 70u);
}

// Three stores on one database write overlapping replays at once, as
// replicas do when agents fail over: every key is stored once, the stored
// counts add up to the distinct keys, and the run's counters agree.
TEST_F(PostgresStoreTest, ConcurrentWritersStoreEachKeyOnce) {
  constexpr int kWriters = 3;
  constexpr int kBatches = 60;
  constexpr int kStepsPerBatch = 4;
  constexpr int kRanks = 2;
  constexpr int kLayers = 3;
  std::vector<std::unique_ptr<Store>> stores;
  for (int i = 0; i < kWriters; ++i) {
    stores.push_back(OpenPostgresOrDie(uri_));
    ASSERT_NE(stores.back(), nullptr);
  }
  std::vector<v1::IngestRequest> batches(kBatches);
  for (int b = 0; b < kBatches; ++b) {
    batches[b].set_sequence(static_cast<std::uint64_t>(b + 1));
    for (int i = 0; i < kStepsPerBatch; ++i) {
      for (int rank = 0; rank < kRanks; ++rank) {
        *batches[b].add_records() = MakeStep(b % 3 == 0 ? "r2" : "r1", rank, b * kStepsPerBatch + i, kLayers);
      }
    }
  }
  std::atomic<std::uint64_t> stored{0}, duplicates{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      // Each writer sends every batch, in its own order, one to three per
      // call: the same keys reach the database from several connections.
      std::vector<int> order(kBatches);
      for (int b = 0; b < kBatches; ++b) order[b] = b;
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(w + 1)));
      std::mt19937 rng(static_cast<unsigned>(100 + w));
      for (std::size_t i = 0; i < order.size();) {
        std::vector<WriteOp> ops;
        const std::size_t n = std::min<std::size_t>(order.size() - i, 1 + rng() % 3);
        for (std::size_t k = 0; k < n; ++k) ops.push_back(WriteOp{&batches[order[i + k]], nullptr, 1000 + w});
        i += n;
        base::Status s = stores[w]->Apply(&ops);
        if (!s.ok()) {
          ADD_FAILURE() << "writer " << w << ": " << s.ToString();
          ++failures;
          return;
        }
        for (const WriteOp& op : ops) {
          stored += op.stored;
          duplicates += op.duplicates;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  const std::uint64_t distinct = static_cast<std::uint64_t>(kBatches) * kStepsPerBatch * kRanks;
  EXPECT_EQ(stored.load(), distinct);
  EXPECT_EQ(stored.load() + duplicates.load(), distinct * kWriters);
  std::uint64_t records = 0;
  for (const std::string run : {"r1", "r2"}) {
    StepQuery query;
    query.run = run;
    query.include_layers = true;
    query.limit = 100000;
    const std::vector<v1::StepRecord> got = Steps(stores[0].get(), query);
    std::set<std::pair<std::int64_t, std::uint32_t>> keys;
    for (const v1::StepRecord& r : got) {
      keys.emplace(r.step(), r.rank());
      EXPECT_TRUE(SameMessage(r, MakeStep(run, r.rank(), r.step(), kLayers))) << run << " " << r.step();
    }
    EXPECT_EQ(keys.size(), got.size()) << run;
    base::StatusOr<v1::RunInfo> info = stores[1]->GetRun(run);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->step_records(), got.size()) << run;
    EXPECT_EQ(info->first_seen_ns(), 1000);
    EXPECT_EQ(info->last_seen_ns(), 1000 + kWriters - 1);
    records += got.size();
  }
  EXPECT_EQ(records, distinct);
}

// Retention on one store while another writes the same run: the run's
// counters always describe the rows that exist.
TEST_F(PostgresStoreTest, RetentionElsewhereNeverSplitsARunFromItsRows) {
  std::unique_ptr<Store> writer = OpenPostgresOrDie(uri_);
  std::unique_ptr<Store> janitor = OpenPostgresOrDie(uri_);
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(janitor, nullptr);
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> deleted{0};
  std::thread retention([&] {
    while (!done.load()) {
      base::StatusOr<std::uint64_t> n = janitor->DeleteIdleRuns(std::numeric_limits<std::int64_t>::max());
      if (!n.ok()) {
        ADD_FAILURE() << n.status().ToString();
        return;
      }
      deleted += *n;
    }
  });
  for (int i = 0; i < 300; ++i) {
    v1::IngestRequest request;
    request.set_sequence(1);
    *request.add_records() = MakeStep("r", 0, i, 2);
    std::vector<WriteOp> ops(1);
    ops[0].steps = &request;
    ops[0].received_ns = i;
    base::Status s = writer->Apply(&ops);
    ASSERT_TRUE(s.ok()) << s.ToString();
    if (i % 25 == 0) {
      // Between deletions the run and its rows agree.
      base::StatusOr<v1::RunInfo> info = writer->GetRun("r");
      StepQuery query;
      query.run = "r";
      query.limit = 100000;
      const std::size_t rows = Steps(writer.get(), query).size();
      if (info.ok()) {
        EXPECT_LE(rows, info->step_records());
      }
    }
  }
  done = true;
  retention.join();
  EXPECT_GT(deleted.load(), 0u) << "retention never ran between the writes";
  base::StatusOr<v1::RunInfo> info = writer->GetRun("r");
  StepQuery query;
  query.run = "r";
  query.limit = 100000;
  const std::vector<v1::StepRecord> rows = Steps(writer.get(), query);
  if (info.ok()) {
    EXPECT_EQ(info->step_records(), rows.size());
    ASSERT_FALSE(rows.empty());
    EXPECT_EQ(info->first_step(), rows.front().step());
    EXPECT_EQ(info->last_step(), rows.back().step());
  } else {
    EXPECT_EQ(info.status().code(), base::StatusCode::kNotFound);
    EXPECT_TRUE(rows.empty());
  }
}

// A settings change written through one store reaches every store's
// listener (its own included) with the settings themselves.
TEST_F(PostgresStoreTest, SettingsChangesReachEveryListener) {
  std::unique_ptr<Store> a = OpenPostgresOrDie(uri_);
  std::unique_ptr<Store> b = OpenPostgresOrDie(uri_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // The first call subscribes.
  for (Store* store : {a.get(), b.get()}) {
    auto none = store->WaitForConfigChanges(std::chrono::milliseconds(0));
    ASSERT_TRUE(none.ok()) << none.status().ToString();
    EXPECT_TRUE(none->empty());
  }
  const ConfigWrite c1 = MakeConfigWrite("exp/1:x", 1, 0.2, "through a");
  ASSERT_TRUE(ApplyConfig(a.get(), c1, 1).ok());
  for (Store* store : {b.get(), a.get()}) {
    std::vector<std::pair<std::string, v1::RunConfig>> got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got.empty() && std::chrono::steady_clock::now() < deadline) {
      auto changes = store->WaitForConfigChanges(std::chrono::milliseconds(500));
      ASSERT_TRUE(changes.ok()) << changes.status().ToString();
      got = std::move(*changes);
    }
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].first, "exp/1:x");
    EXPECT_TRUE(SameMessage(got[0].second, c1.config));
  }
  // A conflicting change is not announced.
  const ConfigWrite stale = MakeConfigWrite("exp/1:x", 1, 0.3, "stale");
  std::vector<WriteOp> ops(1);
  ops[0].config = &stale;
  ASSERT_TRUE(b->Apply(&ops).ok());
  ASSERT_TRUE(ops[0].config_conflict);
  auto changes = a->WaitForConfigChanges(std::chrono::milliseconds(300));
  ASSERT_TRUE(changes.ok());
  EXPECT_TRUE(changes->empty());
}

// Two stores change the same runs at once from the same version: exactly
// one change per run is written and audited; the other learns the winner.
TEST_F(PostgresStoreTest, RacingSettingsChangesHaveOneWinner) {
  std::unique_ptr<Store> a = OpenPostgresOrDie(uri_);
  std::unique_ptr<Store> b = OpenPostgresOrDie(uri_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr int kRuns = 30;
  std::vector<ConfigWrite> from_a, from_b;
  for (int i = 0; i < kRuns; ++i) {
    from_a.push_back(MakeConfigWrite("run-" + std::to_string(i), 1, 0.1, "a"));
    from_b.push_back(MakeConfigWrite("run-" + std::to_string(i), 1, 0.2, "b"));
  }
  std::vector<bool> a_won(kRuns), b_won(kRuns);
  std::vector<v1::RunConfig> a_saw(kRuns), b_saw(kRuns);
  auto race = [](Store* store, std::vector<ConfigWrite>* writes, std::vector<bool>* won,
                 std::vector<v1::RunConfig>* saw) {
    for (std::size_t i = 0; i < writes->size(); ++i) {
      std::vector<WriteOp> ops(1);
      ops[0].config = &(*writes)[i];
      base::Status s = store->Apply(&ops);
      ASSERT_TRUE(s.ok()) << s.ToString();
      (*won)[i] = !ops[0].config_conflict;
      (*saw)[i] = ops[0].stored_config;
    }
  };
  std::thread ta(race, a.get(), &from_a, &a_won, &a_saw);
  std::thread tb(race, b.get(), &from_b, &b_won, &b_saw);
  ta.join();
  tb.join();
  for (int i = 0; i < kRuns; ++i) {
    ASSERT_NE(a_won[i], b_won[i]) << "run " << i;
    const ConfigWrite& winner = a_won[i] ? from_a[i] : from_b[i];
    EXPECT_TRUE(SameMessage(a_won[i] ? b_saw[i] : a_saw[i], winner.config)) << i;
    EXPECT_TRUE(SameMessages(*a->ListConfigChanges(winner.run, 0, 10), {winner.change})) << i;
  }
}

TEST_F(PostgresStoreTest, DataSurvivesReopenAndReplicasMigrateOnce) {
  // Four stores open a fresh database at once: one creates the schema.
  std::vector<std::unique_ptr<Store>> stores(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < stores.size(); ++i) {
    threads.emplace_back([&, i] { stores[i] = OpenPostgresOrDie(uri_); });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& store : stores) ASSERT_NE(store, nullptr);
  std::string error, versions;
  ASSERT_TRUE(cluster_->Exec(DatabaseName(), "SELECT string_agg(version::text, ',') FROM gac_schema", &error,
                             &versions))
      << error;
  EXPECT_EQ(versions, std::to_string(PostgresSchemaVersion()));
  ASSERT_EQ(ApplyRecords(stores[0].get(), {MakeStep("r", 0, 1, 4), MakeStep("r", 1, 1, 4)}, 5), Counts({2, 0}));
  const ConfigWrite config = MakeConfigWrite("r", 1, 0.2, "persist");
  ASSERT_TRUE(ApplyConfig(stores[1].get(), config, 6).ok());
  stores.clear();
  std::unique_ptr<Store> again = OpenPostgresOrDie(uri_);
  ASSERT_NE(again, nullptr);
  StepQuery query;
  query.run = "r";
  query.include_layers = true;
  EXPECT_TRUE(SameMessages(Steps(again.get(), query), {MakeStep("r", 0, 1, 4), MakeStep("r", 1, 1, 4)}));
  ASSERT_EQ(again->LoadRunConfigs()->size(), 1u);
  EXPECT_TRUE(SameMessage(again->LoadRunConfigs()->at(0).second, config.config));
}

// Start-up errors are one line, name the database without the password,
// and have the code of what went wrong.
TEST_F(PostgresStoreTest, OpenErrorsAreOneLineWithoutThePassword) {
  const std::string secret = "not-the-password-7f3a";
  const auto expect_error = [&](const std::string& uri, base::StatusCode code, const std::string& part) {
    base::StatusOr<std::unique_ptr<Store>> store = OpenPostgresStore(uri);
    ASSERT_FALSE(store.ok()) << uri;
    const std::string message = store.status().ToString();
    EXPECT_EQ(store.status().code(), code) << message;
    EXPECT_NE(message.find(part), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.find(secret), std::string::npos) << message;
  };
  expect_error(cluster_->Uri(DatabaseName(), secret), base::StatusCode::kUnauthenticated, "password authentication failed");
  expect_error(cluster_->Uri("no_such_database", testing::PostgresCluster::kPassword), base::StatusCode::kNotFound,
               "does not exist");
  // A port nothing listens on: the one of a server that was stopped.
  {
    std::string error;
    std::unique_ptr<testing::PostgresCluster> stopped = testing::PostgresCluster::Start(&error);
    ASSERT_NE(stopped, nullptr) << error;
    ASSERT_TRUE(stopped->Stop(&error)) << error;
    expect_error("postgresql://gac:" + secret + "@127.0.0.1:" + std::to_string(stopped->port()) + "/gac",
                 base::StatusCode::kUnavailable, "Connection refused");
  }
  expect_error("postgresql://gac:" + secret + "@[::1/gac", base::StatusCode::kInvalidArgument, "bad PostgreSQL URI");
  EXPECT_EQ(DescribePostgresUri(cluster_->Uri(DatabaseName(), secret)),
            "postgresql://gac@127.0.0.1:" + std::to_string(cluster_->port()) + "/" + DatabaseName());

  // A schema newer than this build: refused, and left as it is.
  ASSERT_NE(OpenPostgresOrDie(uri_), nullptr);
  std::string error;
  ASSERT_TRUE(cluster_->Exec(DatabaseName(), "UPDATE gac_schema SET version = 99", &error)) << error;
  expect_error(uri_, base::StatusCode::kFailedPrecondition, "schema version 99 is newer than this build's");
  std::string version;
  ASSERT_TRUE(cluster_->Exec(DatabaseName(), "SELECT version FROM gac_schema", &error, &version)) << error;
  EXPECT_EQ(version, "99");
}

// The database goes away: every call fails at once with UNAVAILABLE (no
// wait for a timeout), and the store reconnects by itself when it is back.
TEST(PostgresOutage, CallsFailFastAndTheStoreReconnects) {
  if (testing::PostgresCluster::BinDir().empty()) GTEST_SKIP() << "PostgreSQL server binaries not installed: skipping";
  std::string error;
  std::unique_ptr<testing::PostgresCluster> cluster = testing::PostgresCluster::Start(&error);
  ASSERT_NE(cluster, nullptr) << error;
  const std::string uri = cluster->NewDatabase(&error);
  ASSERT_FALSE(uri.empty()) << error;
  PostgresOptions options;
  options.reconnect_interval = std::chrono::milliseconds(100);
  std::unique_ptr<Store> store = OpenPostgresOrDie(uri, options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->WaitForConfigChanges(std::chrono::milliseconds(0)).ok());
  ASSERT_EQ(ApplyRecords(store.get(), {MakeStep("r", 0, 0, 2)}, 1), Counts({1, 0}));

  ASSERT_TRUE(cluster->Stop(&error)) << error;
  const auto t0 = std::chrono::steady_clock::now();
  v1::IngestRequest request;
  request.set_sequence(1);
  *request.add_records() = MakeStep("r", 0, 1, 2);
  std::vector<WriteOp> ops(1);
  ops[0].steps = &request;
  for (int i = 0; i < 3; ++i) {
    base::Status s = store->Apply(&ops);
    EXPECT_EQ(s.code(), base::StatusCode::kUnavailable) << s.ToString();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.ToString();
    EXPECT_EQ(s.message().find(testing::PostgresCluster::kPassword), std::string::npos) << s.ToString();
  }
  EXPECT_EQ(store->GetRun("r").status().code(), base::StatusCode::kUnavailable);
  EXPECT_EQ(store->LoadRunConfigs().status().code(), base::StatusCode::kUnavailable);
  EXPECT_EQ(store->WaitForConfigChanges(std::chrono::milliseconds(0)).status().code(), base::StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));

  ASSERT_TRUE(cluster->Restart(&error)) << error;
  base::Status s;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s = store->Apply(&ops);
  } while (!s.ok() && std::chrono::steady_clock::now() < deadline);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Counts({ops[0].stored, ops[0].duplicates}), Counts({1, 0}));
  EXPECT_EQ(store->GetRun("r")->step_records(), 2u);
  // The listener is back too, and hears the next change.
  base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> changes =
      store->WaitForConfigChanges(std::chrono::milliseconds(0));
  while (!changes.ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    changes = store->WaitForConfigChanges(std::chrono::milliseconds(0));
  }
  ASSERT_TRUE(changes.ok()) << changes.status().ToString();
  ASSERT_TRUE(ApplyConfig(store.get(), MakeConfigWrite("r", 1, 0.2, "after the outage"), 3).ok());
  std::vector<std::pair<std::string, v1::RunConfig>> got;
  while (got.empty() && std::chrono::steady_clock::now() < deadline) {
    changes = store->WaitForConfigChanges(std::chrono::milliseconds(500));
    ASSERT_TRUE(changes.ok()) << changes.status().ToString();
    got = std::move(*changes);
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, "r");
}

}  // namespace
}  // namespace gac::server
