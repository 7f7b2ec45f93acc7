// Several gacd replicas on one PostgreSQL database, as real processes on
// loopback ports, against a PostgreSQL server the test starts
// (tests/common/postgres_cluster.h; skipped when PostgreSQL is not
// installed): overlapping replays through two and three replicas, a settings
// change through one replica used by another's Decide within a second, kill
// -9 of the replica an agent streams to, twenty times during a run, bad
// configuration at start-up, and a database that goes away while serving.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gac/controller/controller.h"
#include "gac/proto/convert.h"
#include "gac/transport/remote_controller.h"
#include "gac/transport/telemetry.h"
#include "tests/common/postgres_cluster.h"
#include "tests/common/test_util.h"

namespace gac::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The sum of every sample of `name` whose labels include all of `labels`
// (k="v" pairs) in a Prometheus text exposition.
double SumSamples(const std::string& text, const std::string& name, const std::vector<std::string>& labels = {}) {
  double sum = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t end = line.find_first_of("{ ");
    if (end == std::string::npos || line.compare(0, end, name) != 0 || end != name.size()) continue;
    const std::size_t value_at = line.rfind(' ');
    const std::string series = line.substr(0, value_at);
    bool match = true;
    for (const std::string& label : labels) match = match && series.find(label) != std::string::npos;
    if (match) sum += std::stod(line.substr(value_at + 1));
  }
  return sum;
}

// A gacd replica on the shared database; restartable on its port.
class Replica {
 public:
  Replica(const ScratchDir& dir, std::string name, std::string store, std::string tokens, int port = 0)
      : dir_(dir), name_(std::move(name)), store_(std::move(store)), tokens_(std::move(tokens)), port_(port) {}

  bool Start() {
    proc_ = std::make_unique<GacdProcess>(std::vector<std::string>{
        "--listen=127.0.0.1:" + std::to_string(port_), "--http-listen=127.0.0.1:0", "--store=" + store_,
        "--token-file=" + tokens_, "--drain-timeout=1s"});
    if (!proc_->Start(dir_.File("ready-" + name_))) {
      ADD_FAILURE() << name_ << ": " << proc_->error();
      return false;
    }
    address_ = proc_->address();
    port_ = std::stoi(address_.substr(address_.rfind(':') + 1));
    return true;
  }
  void Kill() { proc_->Kill(); }
  GacdProcess& process() { return *proc_; }
  const std::string& address() const { return address_; }
  std::string Metrics() const { return HttpGet(proc_->metrics_address(), "/metrics").value_or(""); }

 private:
  const ScratchDir& dir_;
  const std::string name_, store_, tokens_;
  int port_;
  std::string address_;
  std::unique_ptr<GacdProcess> proc_;
};

class Replicas : public ::testing::Test {
 protected:
  void SetUp() override {
    GAC_NEW_POSTGRES_DATABASE_OR_SKIP(cluster, uri);
    cluster_ = cluster;
    uri_ = uri;
    tokens_ = WriteTestTokens(dir_);
  }

  // Starts n replicas (fixed ports when `fixed_ports`).
  void StartReplicas(int n, bool fixed_ports = false) {
    for (int i = 0; i < n; ++i) {
      replicas_.push_back(std::make_unique<Replica>(dir_, "r" + std::to_string(i), uri_, tokens_,
                                                    fixed_ports ? FreeLoopbackPort() : 0));
      ASSERT_TRUE(replicas_.back()->Start());
    }
  }

  ScratchDir dir_;
  PostgresCluster* cluster_ = nullptr;
  std::string uri_, tokens_;
  std::vector<std::unique_ptr<Replica>> replicas_;
};

std::vector<v1::IngestRequest> OverlapBatches(const std::string& run, int batches) {
  std::vector<v1::IngestRequest> out;
  for (int b = 0; b < batches; ++b) {
    std::vector<v1::StepRecord> records;
    for (int i = 0; i < 4; ++i) {
      for (std::uint32_t rank = 0; rank < 2; ++rank) {
        v1::StepRecord r = MakeStep(run, b * 4 + i, 0.001 * (b * 4 + i), rank, 2);
        v1::LayerRecord* layer = r.add_layers();
        layer->set_name("model.layers.0.mlp");
        layer->set_cosine(0.25);
        layer->set_grad_norm(1);
        layer->set_ref_norm(2);
        (*r.mutable_scalars())["reward"] = b;
        records.push_back(std::move(r));
      }
    }
    out.push_back(MakeBatch(static_cast<std::uint64_t>(b + 1), std::move(records)));
  }
  return out;
}

// Every replica receives every batch at once (an agent's replay landing on
// several replicas): each step is stored once, the acknowledgements and the
// per-replica metrics add up to exactly the records stored, and every
// replica answers queries with the same history.
void OverlappingReplays(Replicas* test, const std::vector<std::unique_ptr<Replica>>& replicas) {
  constexpr int kBatches = 40;
  const std::vector<v1::IngestRequest> batches = OverlapBatches("exp-overlap", kBatches);
  const std::uint64_t distinct = kBatches * 8;
  std::vector<std::vector<v1::IngestAck>> acks(replicas.size());
  std::vector<grpc::Status> results(replicas.size());
  std::vector<std::thread> clients;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    clients.emplace_back([&, i] {
      results[i] = Client(replicas[i]->address(), kWriterToken).Ingest(batches, &acks[i]);
    });
  }
  for (std::thread& t : clients) t.join();
  std::uint64_t stored = 0, duplicates = 0;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].error_message();
    ASSERT_EQ(acks[i].size(), static_cast<std::size_t>(kBatches));
    for (const v1::IngestAck& ack : acks[i]) {
      EXPECT_EQ(ack.stored() + ack.duplicates(), 8u);
      stored += ack.stored();
      duplicates += ack.duplicates();
    }
  }
  EXPECT_EQ(stored, distinct);
  EXPECT_EQ(duplicates, distinct * (replicas.size() - 1));

  std::vector<v1::StepRecord> want;
  for (const v1::IngestRequest& b : batches) {
    for (const v1::StepRecord& r : b.records()) want.push_back(r);
  }
  std::sort(want.begin(), want.end(), [](const v1::StepRecord& a, const v1::StepRecord& b) {
    return std::make_pair(a.step(), a.rank()) < std::make_pair(b.step(), b.rank());
  });
  for (const auto& replica : replicas) {
    std::vector<v1::StepRecord> got;
    ASSERT_TRUE(Client(replica->address(), kReaderToken).AllSteps("exp-overlap", &got, true).ok());
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k].SerializeAsString(), want[k].SerializeAsString()) << k;
    }
    v1::GetRunSummaryRequest req;
    req.set_run("exp-overlap");
    v1::RunSummary summary;
    ASSERT_TRUE(Client(replica->address(), kReaderToken).GetRunSummary(req, &summary).ok());
    EXPECT_EQ(summary.info().step_records(), distinct);
  }

  // Per replica the counters count what that replica stored; summed over
  // the replicas (sum without(instance) in PromQL) they count each record
  // once.
  double step_rows = 0, layer_rows = 0, dups = 0, steps_total = 0;
  for (const auto& replica : replicas) {
    const std::string text = replica->Metrics();
    ASSERT_FALSE(text.empty());
    step_rows += SumSamples(text, "gac_ingest_rows_total", {"kind=\"step\""});
    layer_rows += SumSamples(text, "gac_ingest_rows_total", {"kind=\"layer\""});
    dups += SumSamples(text, "gac_ingest_duplicates_total");
    steps_total += SumSamples(text, "gac_steps_total", {"run=\"exp-overlap\""});
  }
  EXPECT_EQ(step_rows, static_cast<double>(distinct));
  EXPECT_EQ(layer_rows, static_cast<double>(distinct));
  EXPECT_EQ(dups, static_cast<double>(distinct * (replicas.size() - 1)));
  EXPECT_EQ(steps_total, static_cast<double>(distinct));
  (void)test;
}

TEST_F(Replicas, TwoReplicasStoreOverlappingReplaysOnce) {
  StartReplicas(2);
  OverlappingReplays(this, replicas_);
}

TEST_F(Replicas, ThreeReplicasStoreOverlappingReplaysOnce) {
  StartReplicas(3);
  OverlappingReplays(this, replicas_);
}

v1::DecideRequest DecideAt(const std::string& run, double cosine) {
  v1::DecideRequest d;
  d.set_run(run);
  d.set_dot(cosine);
  d.set_grad_sq(1);
  d.set_ref_sq(1);
  d.set_has_reference(true);
  return d;
}

// A threshold change through one replica decides the next Decide on every
// other within one second: each replica learns it from the database's
// notification, never by Decide reading the database.
TEST_F(Replicas, ThresholdChangeThroughOneReplicaDecidesOnTheOthersWithinOneSecond) {
  StartReplicas(3);
  const std::string run = "exp-thresholds";
  // |c| = 0.1: PROJECT below c_low ... SAFE when c_low rises above it.
  const std::vector<double> c_lows = {0.07, 0.2, 0.05, 0.15, 0.08, 0.25};
  double worst_ms = 0;
  for (std::size_t i = 0; i < c_lows.size(); ++i) {
    Replica& through = *replicas_[i % replicas_.size()];
    v1::SetRunConfigRequest set;
    set.set_run(run);
    set.mutable_thresholds()->set_c_low(c_lows[i]);
    set.mutable_thresholds()->set_c_high(0.4);
    set.set_mode(v1::CONTROL_MODE_REMOTE);
    set.set_expected_version(i);  // the previous change is known everywhere
    set.set_reason("change " + std::to_string(i));
    v1::RunConfig after;
    grpc::Status st = Client(through.address(), kAdminToken).SetRunConfig(set, &after);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(after.version(), i + 1);
    const auto changed = Clock::now();
    const v1::Regime want = 0.1 < c_lows[i] ? v1::REGIME_SAFE : v1::REGIME_PROJECT;
    for (std::size_t k = 1; k < replicas_.size(); ++k) {
      Replica& other = *replicas_[(i + k) % replicas_.size()];
      Client writer(other.address(), kWriterToken);
      v1::DecideResponse resp;
      for (;;) {
        ASSERT_TRUE(writer.Decide(DecideAt(run, 0.1), &resp).ok());
        if (resp.config().version() == after.version() || Clock::now() - changed > 5s) break;
        std::this_thread::sleep_for(1ms);
      }
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - changed).count();
      worst_ms = std::max(worst_ms, ms);
      EXPECT_EQ(resp.config().version(), after.version()) << "replica " << (i + k) % replicas_.size();
      EXPECT_LT(ms, 1000.0) << "change " << i << " reached replica " << (i + k) % replicas_.size() << " after " << ms
                            << " ms";
      EXPECT_EQ(resp.regime(), want) << "change " << i;
      EXPECT_EQ(resp.config().thresholds().c_low(), c_lows[i]);
    }
  }
  std::printf("a threshold change reached every other replica's Decide within %.1f ms\n", worst_ms);

  // Without expected_version, changes through two replicas at once both
  // succeed, one after the other; with the same expected_version one loses.
  v1::RunConfig now;
  ASSERT_TRUE(Client(replicas_[0]->address(), kAdminToken).GetRunConfig(run, &now).ok());
  const std::uint64_t base = now.version();
  std::vector<grpc::Status> results(2);
  std::vector<v1::RunConfig> configs(2);
  for (bool expect_version : {false, true}) {
    std::vector<std::thread> admins;
    for (int k = 0; k < 2; ++k) {
      admins.emplace_back([&, k] {
        v1::SetRunConfigRequest set;
        set.set_run(run);
        set.mutable_thresholds()->set_c_low(0.01 * (k + 1));
        set.mutable_thresholds()->set_c_high(0.5);
        set.set_mode(v1::CONTROL_MODE_REMOTE);
        if (expect_version) set.set_expected_version(base + 2);
        results[k] = Client(replicas_[k]->address(), kAdminToken).SetRunConfig(set, &configs[k]);
      });
    }
    for (std::thread& t : admins) t.join();
    if (!expect_version) {
      ASSERT_TRUE(results[0].ok()) << results[0].error_message();
      ASSERT_TRUE(results[1].ok()) << results[1].error_message();
      EXPECT_EQ(std::set<std::uint64_t>({configs[0].version(), configs[1].version()}),
                std::set<std::uint64_t>({base + 1, base + 2}));
    } else {
      EXPECT_NE(results[0].ok(), results[1].ok());
      const grpc::Status& lost = results[0].ok() ? results[1] : results[0];
      EXPECT_EQ(lost.error_code(), grpc::StatusCode::ABORTED) << lost.error_message();
    }
  }
  v1::ListConfigChangesRequest list;
  list.set_run(run);
  list.set_page_size(100);
  v1::ListConfigChangesResponse changes;
  ASSERT_TRUE(Client(replicas_[2]->address(), kAdminToken).ListConfigChanges(list, &changes).ok());
  ASSERT_EQ(changes.changes_size(), static_cast<int>(base + 3));
  for (int k = 0; k < changes.changes_size(); ++k) {
    EXPECT_EQ(changes.changes(k).before().version(), static_cast<std::uint64_t>(k));
    EXPECT_EQ(changes.changes(k).after().version(), static_cast<std::uint64_t>(k + 1));
  }
}

// kill -9 of the replica the agent streams to, twenty times during a run,
// each killed replica restarted on its port: every step is stored exactly
// once, and remote decisions keep coming from the other replicas (a missed
// one is the agent's local fallback, counted).
TEST_F(Replicas, KillNineOfTheStreamedToReplicaTwentyTimes) {
  StartReplicas(3, /*fixed_ports=*/true);
  std::string addresses;
  for (const auto& r : replicas_) addresses += (addresses.empty() ? "" : ",") + r->address();

  transport::TelemetryOptions to;
  to.address = addresses;
  to.token = kWriterToken;
  to.spool_dir = dir_.File("spool");
  to.max_batch_records = 16;
  to.flush_interval = 5ms;
  to.backoff_initial = 20ms;
  to.backoff_max = 200ms;
  auto telemetry = transport::Telemetry::Start(to);
  ASSERT_TRUE(telemetry.ok()) << telemetry.status().ToString();
  transport::RemoteControllerOptions ro;
  ro.address = addresses;
  ro.token = kWriterToken;
  ro.run = "exp-failover";
  ro.deadline = 500ms;
  auto remote = transport::RemoteController::Create(ro);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  auto local = controller::Controller::Create(controller::Thresholds{0.05, 0.3});
  ASSERT_TRUE(local.ok());

  constexpr int kKills = 20;
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> steps{0};
  std::atomic<std::uint64_t> remote_decisions{0}, fallbacks{0};
  std::atomic<std::uint64_t> wrong{0};
  std::thread trainer([&] {
    for (std::int64_t s = 0; !stop.load(); ++s) {
      const double c = 0.2 * std::sin(0.01 * static_cast<double>(s));
      const controller::AlignmentStats stats{c, 1.0, 1.0, s > 0};
      base::StatusOr<controller::Decision> d = (*remote)->Decide(s, stats);
      if (d.ok()) {
        ++remote_decisions;
        if (d->regime != local->Decide(stats).regime) ++wrong;  // same (default) thresholds
      } else {
        ++fallbacks;  // the agent would decide locally
      }
      v1::StepRecord r = MakeStep("exp-failover", s, c);
      r.set_mode(v1::CONTROL_MODE_REMOTE);
      r.set_fallback(!d.ok());
      EXPECT_TRUE((*telemetry)->Enqueue(std::move(r)));
      steps = s + 1;
      std::this_thread::sleep_for(2ms);
    }
  });

  std::uint64_t windows_without_remote = 0;
  for (int k = 0; k < kKills; ++k) {
    // Wait until the agent streams again and remote decisions came since
    // the last kill.
    const std::uint64_t remote_before = remote_decisions.load();
    const std::uint64_t acked_before = (*telemetry)->counters().records_acknowledged;
    const auto deadline = Clock::now() + 30s;
    std::string target;
    while (Clock::now() < deadline) {
      target = (*telemetry)->address();
      if (!target.empty() && (*telemetry)->counters().records_acknowledged > acked_before + 16 &&
          remote_decisions.load() > remote_before) {
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    if (remote_decisions.load() == remote_before) ++windows_without_remote;
    auto it = std::find_if(replicas_.begin(), replicas_.end(), [&](const auto& r) { return r->address() == target; });
    ASSERT_NE(it, replicas_.end()) << "kill " << k << ": the agent streams to no replica (" << target << "): "
                                   << (*telemetry)->last_error();
    (*it)->Kill();
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE((*it)->Start()) << "restart after kill " << k;
  }
  // A little more of the run after the last kill.
  std::this_thread::sleep_for(300ms);
  stop = true;
  trainer.join();
  ASSERT_TRUE((*telemetry)->Flush(120s)) << (*telemetry)->last_error();

  const std::int64_t n = steps.load();
  std::vector<v1::StepRecord> stored;
  ASSERT_TRUE(Client(replicas_[0]->address(), kReaderToken).AllSteps("exp-failover", &stored).ok());
  ASSERT_EQ(stored.size(), static_cast<std::size_t>(n));
  for (std::int64_t s = 0; s < n; ++s) ASSERT_EQ(stored[static_cast<std::size_t>(s)].step(), s);
  v1::GetRunSummaryRequest req;
  req.set_run("exp-failover");
  v1::RunSummary summary;
  ASSERT_TRUE(Client(replicas_[1]->address(), kReaderToken).GetRunSummary(req, &summary).ok());
  EXPECT_EQ(summary.info().step_records(), static_cast<std::uint64_t>(n));

  const transport::TelemetryCounters c = (*telemetry)->counters();
  EXPECT_EQ(c.records_acknowledged, static_cast<std::uint64_t>(n));
  EXPECT_EQ(c.dropped_queue_full, 0u);
  EXPECT_GE(c.failovers, static_cast<std::uint64_t>(kKills));
  EXPECT_EQ(remote_decisions.load() + fallbacks.load(), static_cast<std::uint64_t>(n));
  EXPECT_EQ(windows_without_remote, 0u) << "remote decisions stopped after a kill";
  EXPECT_EQ(wrong.load(), 0u);
  std::printf("kill -9 x%d of the streamed-to replica over %lld steps: %llu remote decisions, %llu local "
              "fallbacks, %llu failovers, %llu batches replayed (%llu records)\n",
              kKills, static_cast<long long>(n), static_cast<unsigned long long>(remote_decisions.load()),
              static_cast<unsigned long long>(fallbacks.load()), static_cast<unsigned long long>(c.failovers),
              static_cast<unsigned long long>(c.batches_replayed), static_cast<unsigned long long>(c.records_replayed));
}

// Bad configuration is one line at start-up and exit status 2, never the
// password.
TEST_F(Replicas, BadConfigurationIsOneLineAndExitStatusTwo) {
  const std::string secret = "not-the-password-91c2";
  std::string error;
  std::unique_ptr<PostgresCluster> stopped = PostgresCluster::Start(&error);
  ASSERT_NE(stopped, nullptr) << error;
  ASSERT_TRUE(stopped->Stop(&error)) << error;
  // A database at a newer schema.
  const std::string newer = cluster_->NewDatabase(&error);
  ASSERT_FALSE(newer.empty()) << error;
  const std::string newer_db = newer.substr(newer.rfind('/') + 1);
  ASSERT_TRUE(cluster_->Exec(newer_db, "CREATE TABLE gac_schema (version integer NOT NULL); "
                                       "INSERT INTO gac_schema VALUES (7)",
                             &error))
      << error;
  struct Case {
    std::string store;
    std::vector<std::string> extra;
    std::string message;
  };
  const std::string db = uri_.substr(uri_.rfind('/') + 1);
  const std::vector<Case> cases = {
      {"postgresql://gac:" + secret + "@127.0.0.1:" + std::to_string(stopped->port()) + "/gac", {},
       "UNAVAILABLE"},
      {cluster_->Uri(db, secret), {}, "password authentication failed"},
      {newer, {}, "schema version 7 is newer than this build's"},
      {"mysql://gac:" + secret + "@127.0.0.1/gac", {}, "expected sqlite:DIR, memory or a postgresql:// URI"},
      {cluster_->Uri(db, secret), {"--db=/tmp/x.db"}, "--db names a SQLite file"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {GacdProcess::Binary(), "--listen=127.0.0.1:0", "--http-listen=",
                                     "--token-file=" + tokens_, "--store=" + c.store};
    argv.insert(argv.end(), c.extra.begin(), c.extra.end());
    std::string out;
    EXPECT_EQ(RunProcess(argv, "", &out), 2) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_EQ(out.find(secret), std::string::npos) << out;
  }
}

// The database goes away while gacd serves: ingest fails with UNAVAILABLE,
// Decide keeps answering from memory with the run's settings, and gacd
// recovers by itself when the database is back.
TEST(ReplicaOutage, IngestFailsDecideAnswersAndGacdRecovers) {
  if (PostgresCluster::BinDir().empty()) GTEST_SKIP() << "PostgreSQL server binaries not installed: skipping";
  std::string error;
  std::unique_ptr<PostgresCluster> cluster = PostgresCluster::Start(&error);
  ASSERT_NE(cluster, nullptr) << error;
  const std::string uri = cluster->NewDatabase(&error);
  ASSERT_FALSE(uri.empty()) << error;
  ScratchDir dir;
  Replica gacd(dir, "only", uri, WriteTestTokens(dir));
  ASSERT_TRUE(gacd.Start());
  Client writer(gacd.address(), kWriterToken);
  Client admin(gacd.address(), kAdminToken);
  ASSERT_TRUE(writer.Ingest({MakeBatch(1, {MakeStep("exp-outage", 0), MakeStep("exp-outage", 1)})}).ok());
  v1::SetRunConfigRequest set;
  set.set_run("exp-outage");
  set.mutable_thresholds()->set_c_low(0.2);
  set.mutable_thresholds()->set_c_high(0.6);
  set.set_mode(v1::CONTROL_MODE_REMOTE);
  v1::RunConfig cfg;
  ASSERT_TRUE(admin.SetRunConfig(set, &cfg).ok());

  ASSERT_TRUE(cluster->Stop(&error)) << error;
  std::vector<v1::IngestAck> acks;
  const grpc::Status st = writer.Ingest({MakeBatch(2, {MakeStep("exp-outage", 2)})}, &acks);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_TRUE(acks.empty());
  for (int i = 0; i < 20; ++i) {
    v1::DecideResponse resp;
    const grpc::Status d = writer.Decide(DecideAt("exp-outage", 0.1), &resp);
    ASSERT_TRUE(d.ok()) << d.error_message();
    EXPECT_EQ(resp.regime(), v1::REGIME_SAFE);  // |c| = 0.1 below the run's c_low 0.2
    EXPECT_EQ(resp.config().version(), 1u);
  }
  std::vector<v1::StepRecord> during;
  EXPECT_EQ(Client(gacd.address(), kReaderToken).AllSteps("exp-outage", &during).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  grpc::health::v1::HealthCheckResponse health;
  ASSERT_TRUE(Client(gacd.address(), "").Health(&health).ok());
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  set.mutable_thresholds()->set_c_low(0.25);
  EXPECT_EQ(admin.SetRunConfig(set, &cfg).error_code(), grpc::StatusCode::UNAVAILABLE);

  ASSERT_TRUE(cluster->Restart(&error)) << error;
  grpc::Status again;
  const auto deadline = Clock::now() + 30s;
  do {
    std::this_thread::sleep_for(100ms);
    again = writer.Ingest({MakeBatch(2, {MakeStep("exp-outage", 2)})});
  } while (!again.ok() && Clock::now() < deadline);
  ASSERT_TRUE(again.ok()) << again.error_message();
  // Reads reconnect on their own connections (at most one attempt per
  // reconnect interval each), so they may lag the first ingest briefly.
  std::vector<v1::StepRecord> steps;
  grpc::Status read;
  do {
    steps.clear();
    read = Client(gacd.address(), kReaderToken).AllSteps("exp-outage", &steps);
    if (!read.ok()) {
      EXPECT_EQ(read.error_code(), grpc::StatusCode::UNAVAILABLE) << read.error_message();
      std::this_thread::sleep_for(50ms);
    }
  } while (!read.ok() && Clock::now() < deadline);
  ASSERT_TRUE(read.ok()) << read.error_message();
  EXPECT_EQ(steps.size(), 3u);
  ASSERT_TRUE(admin.SetRunConfig(set, &cfg).ok());
  EXPECT_EQ(cfg.version(), 2u);
  EXPECT_EQ(gacd.process().Terminate(), 0) << gacd.process().Log();
}

}  // namespace
}  // namespace gac::testing
