// gac's own concurrent components under ThreadSanitizer, without gRPC (see
// CMakeLists.txt): each test drives one component from several threads at
// once, the way gacd or the agent does, and checks the result as well, so
// that it fails without TSan when the outcome is wrong.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gac/base/mutex.h"
#include "gac/proto/convert.h"
#include "gac/server/store.h"
#include "gac/transport/spool.h"
#include "server/src/executor.h"
#include "server/src/metrics.h"
#include "server/src/registry.h"
#include "server/src/writer.h"

// Protobuf 3.21's MapFieldBase has two more members when these macros are
// set (google/protobuf/map_field.h): instrumented code would then disagree
// with Debian's uninstrumented libprotobuf about the layout of every message
// with a map field. Clang 14 sets neither under -fsanitize=thread.
#if defined(__SANITIZE_THREAD__) || defined(THREAD_SANITIZER)
#error "Protobuf's headers change layout under this compiler's TSan: tsan_test would not match libprotobuf"
#endif

// A report ends the process at once, whatever TSAN_OPTIONS says besides.
extern "C" const char* __tsan_default_options() { return "halt_on_error=1:second_deadlock_stack=1"; }

namespace gac {
namespace {

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = ::testing::TempDir() + "gac-tsan-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Starts `n` threads running fn(i) and joins them.
template <typename Fn>
void RunThreads(int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  for (std::thread& t : threads) t.join();
}

v1::StepRecord Record(const std::string& run, std::int64_t step, int layers = 0) {
  v1::StepRecord r;
  r.set_run(run);
  r.set_step(step);
  r.set_world_size(1);
  r.set_regime(v1::REGIME_SAFE);
  r.set_cosine(0.01 * static_cast<double>(step % 90));
  r.set_grad_norm(1.0);
  r.set_ref_norm(1.0);
  (*r.mutable_scalars())["reward"] = 0.5;
  for (int i = 0; i < layers; ++i) {
    v1::LayerRecord* l = r.add_layers();
    l->set_name("layer." + std::to_string(i));
    l->set_cosine(0.1);
    l->set_grad_norm(1.0);
  }
  return r;
}

// The tree is really instrumented and a report is fatal: a deliberate race
// on a plain counter kills the process that runs it.
TEST(TsanIsOn, ADeliberateRaceIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        int counter = 0;
        RunThreads(2, [&](int) {
          for (int i = 0; i < 10000; ++i) ++counter;  // no lock: a data race
        });
        std::printf("%d\n", counter);
      },
      "ThreadSanitizer: data race");
}

TEST(TsanExecutor, RunsEveryTaskPostedFromManyThreadsOnce) {
  constexpr int kThreads = 4, kTasks = 500;
  std::vector<std::atomic<int>> ran(kThreads * kTasks);
  base::Mutex mu;
  int total = 0;
  {
    server::Executor executor(3);
    RunThreads(kThreads, [&](int t) {
      for (int i = 0; i < kTasks; ++i) {
        executor.Post([&, k = t * kTasks + i] {
          ran[static_cast<std::size_t>(k)].fetch_add(1);
          base::MutexLock lock(&mu);
          ++total;
        });
      }
    });
    executor.Stop();  // runs what is queued
  }
  base::MutexLock lock(&mu);
  EXPECT_EQ(total, kThreads * kTasks);
  for (const auto& r : ran) ASSERT_EQ(r.load(), 1);
}

// Submitters on several threads, readers of the store and of the queue
// size at the same time, and the writer's thread committing: every record
// is stored once and every callback runs once.
void WriterUnderLoad(server::Store* store) {
  constexpr int kThreads = 4, kBatches = 60, kRecords = 5;
  server::Metrics metrics;
  server::Writer writer(store, &metrics, 1 << 20, 64);
  base::Mutex mu;
  base::CondVar cv;
  int done = 0;
  std::uint64_t stored = 0;
  std::vector<std::shared_ptr<v1::IngestRequest>> batches;
  for (int t = 0; t < kThreads; ++t) {
    for (int b = 0; b < kBatches; ++b) {
      auto req = std::make_shared<v1::IngestRequest>();
      req->set_sequence(static_cast<std::uint64_t>(b + 1));
      for (int r = 0; r < kRecords; ++r) {
        *req->add_records() = Record("exp-" + std::to_string(t), b * kRecords + r, r % 3);
      }
      batches.push_back(req);
    }
  }
  std::atomic<bool> writing{true};
  std::thread reader([&] {
    while (writing.load()) {
      server::StepQuery q;
      q.run = "exp-1";
      q.include_layers = true;
      auto steps = store->GetSteps(q);
      ASSERT_TRUE(steps.ok()) << steps.status().ToString();
      ASSERT_TRUE(store->ListRuns("", 10).ok());
      (void)writer.queued_rows();
      (void)metrics.Render();
    }
  });
  RunThreads(kThreads, [&](int t) {
    for (int b = 0; b < kBatches; ++b) {
      const auto& req = batches[static_cast<std::size_t>(t * kBatches + b)];
      server::WriteOp op;
      op.steps = req.get();
      const base::Status st = writer.Submit(op, kRecords, [&, req](const base::Status& s, const server::WriteOp& result) {
        EXPECT_TRUE(s.ok()) << s.ToString();
        metrics.ObserveIngest(result.stored, 0, result.duplicates);
        base::MutexLock lock(&mu);
        ++done;
        stored += result.stored;
        cv.SignalAll();
      });
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  });
  {
    base::MutexLock lock(&mu);
    while (done < kThreads * kBatches) cv.Wait(&mu);
    EXPECT_EQ(stored, static_cast<std::uint64_t>(kThreads * kBatches * kRecords));
  }
  writing.store(false);
  reader.join();
  writer.Stop();
  for (int t = 0; t < kThreads; ++t) {
    auto info = store->GetRun("exp-" + std::to_string(t));
    ASSERT_TRUE(info.ok());
    server::StepQuery q;
    q.run = "exp-" + std::to_string(t);
    q.limit = 100000;
    auto steps = store->GetSteps(q);
    ASSERT_TRUE(steps.ok());
    EXPECT_EQ(steps->size(), static_cast<std::size_t>(kBatches * kRecords));
  }
}

TEST(TsanWriter, GroupCommitOverTheMemoryStore) {
  auto store = server::NewMemoryStore();
  WriterUnderLoad(store.get());
}

TEST(TsanWriter, GroupCommitOverSqliteWithConcurrentReads) {
  ScratchDir dir;
  server::SqliteOptions o;
  o.synchronous = "OFF";
  auto store = server::OpenSqliteStore(dir.path() + "/gacd.db", o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  WriterUnderLoad(store->get());
}

// Decide on several threads while the settings change and are reverted:
// every decision is the one its reported settings give.
TEST(TsanRegistry, DecisionsMatchTheSettingsTheyReport) {
  v1::Thresholds defaults;
  defaults.set_c_low(0.05);
  defaults.set_c_high(0.3);
  server::RunRegistry registry(defaults, v1::CONTROL_MODE_LOCAL);
  v1::Thresholds wide;
  wide.set_c_low(0.2);
  wide.set_c_high(0.6);
  wide.set_alpha_mode(v1::ALPHA_MODE_EXACT);
  std::atomic<bool> changing{true};
  std::thread admin([&] {
    for (int i = 0; i < 300; ++i) {
      v1::RunConfig before;
      v1::SetRunConfigRequest change;
      change.set_run("exp-r");
      *change.mutable_thresholds() = i % 2 ? wide : defaults;
      change.set_mode(v1::CONTROL_MODE_REMOTE);
      if (i % 3 == 0) change.set_trigger(i % 2 ? v1::TRIGGER_WINDOW : v1::TRIGGER_PER_STEP);
      auto next = registry.Change(change, "admin", i, &before);
      ASSERT_TRUE(next.ok()) << next.status().ToString();
      if (i % 7 == 0) registry.Revert("exp-r", *next, before);
    }
    changing.store(false);
  });
  RunThreads(3, [&](int t) {
    const controller::AlignmentStats stats{0.25 + 0.1 * t, 1.0, 1.0, true};  // decided differently by the two
    google::protobuf::RepeatedField<double> recent;
    for (int k = 0; k < 19; ++k) recent.Add(stats.dot);  // cosine = dot here; W = 20
    do {
      v1::RunConfig used;
      const controller::Decision d = registry.Decide("exp-r", stats, recent, &used);
      auto controller = proto::ControllerFromProto(used.thresholds());
      ASSERT_TRUE(controller.ok());
      auto trigger = proto::TriggerFromProto(used, defaults);
      ASSERT_TRUE(trigger.ok());
      auto windowed = proto::ControllerFromProto(used.window_thresholds());
      ASSERT_TRUE(windowed.ok());
      // The window: recent's W - 1 cosines and this step's.
      controller::AlignmentWindow window(trigger->window);
      for (double c : recent) window.Add(c);
      window.Add(*controller->Decide(stats).cosine);
      const controller::Decision expected = trigger->trigger == controller::Trigger::kWindow
                                                ? controller::DecideOnMean(*windowed, stats, window.mean())
                                                : controller->Decide(stats);
      ASSERT_EQ(d.window_mean, window.mean());
      ASSERT_EQ(d.regime, expected.regime);
      ASSERT_EQ(d.alpha, expected.alpha);
      (void)registry.Get("exp-r");
    } while (changing.load());
  });
  admin.join();
}

// Steps observed for more runs than are exported, decisions, expiry and
// rendering, all at once: the run bound holds and the exposition renders.
TEST(TsanMetrics, ObserveExpireAndRenderAtOnce) {
  server::MetricsOptions o;
  o.per_layer = true;
  o.max_layers_per_run = 4;
  o.max_runs = 8;
  o.run_ttl = std::chrono::seconds(60);
  server::Metrics metrics(o);
  const auto start = std::chrono::system_clock::now();
  std::atomic<bool> observing{true};
  std::thread expirer([&] {
    int i = 0;
    while (observing.load()) {
      // Now and then pretend that a minute and more has passed.
      metrics.ExpireIdle(start + std::chrono::seconds(++i % 5 == 0 ? 120 : 1));
      EXPECT_NE(metrics.Render().find("gac_runs_exported"), std::string::npos);
      EXPECT_LE(metrics.runs_exported(), o.max_runs);
    }
  });
  RunThreads(4, [&](int t) {
    for (int i = 0; i < 300; ++i) {
      const std::string run = "exp-" + std::to_string((t * 7 + i) % 20);
      metrics.ObserveStep(Record(run, i, 6), start);
      metrics.ObserveDecide(run, v1::REGIME_PROJECT, 1e-4, start);
      v1::RunConfig c;
      *c.mutable_thresholds() = v1::Thresholds();
      c.mutable_thresholds()->set_c_low(0.05);
      c.mutable_thresholds()->set_c_high(0.3);
      metrics.ObserveConfig(run, c, start);
      metrics.ObserveRpcError("Ingest", "INVALID_ARGUMENT");
      metrics.SetQueueRows(static_cast<std::uint64_t>(i));
    }
  });
  observing.store(false);
  expirer.join();
  EXPECT_LE(metrics.runs_exported(), o.max_runs);
}

// New runs keep evicting old ones while a scraper renders: no scrape shows
// more run labels than max_runs (the gate between Collect and eviction).
TEST(TsanMetrics, ScrapesDuringEvictionNeverShowMoreThanMaxRuns) {
  server::MetricsOptions o;
  o.per_layer = true;
  o.max_layers_per_run = 8;
  o.max_runs = 4;
  server::Metrics metrics(o);
  const auto now = std::chrono::system_clock::now();
  std::atomic<bool> observing{true};
  std::size_t most_runs = 0;
  int scrapes = 0;
  std::thread scraper([&] {
    while (observing.load()) {
      const std::string text = metrics.Render();
      std::set<std::string> runs;
      for (std::size_t pos = text.find("run=\""); pos != std::string::npos; pos = text.find("run=\"", pos)) {
        pos += 5;
        runs.insert(text.substr(pos, text.find('"', pos) - pos));
      }
      most_runs = std::max(most_runs, runs.size());
      ++scrapes;
    }
  });
  RunThreads(4, [&](int t) {
    for (int i = 0; i < 150; ++i) {
      const std::string run = "new-" + std::to_string(t) + "-" + std::to_string(i);
      metrics.ObserveStep(Record(run, i, 8), now);
      metrics.ObserveDecide(run, v1::REGIME_SAFE, 1e-4, now);
    }
  });
  observing.store(false);
  scraper.join();
  EXPECT_GT(scrapes, 0);
  EXPECT_LE(most_runs, o.max_runs) << "in " << scrapes << " scrapes";
  EXPECT_EQ(metrics.runs_exported(), o.max_runs);
}

// The telemetry sender's use of the spool: its sender thread appends, its
// reader thread acknowledges, both under one lock (Telemetry's spool_mu).
TEST(TsanSpool, AppendAndAcknowledgeFromTwoThreadsUnderOneLock) {
  ScratchDir dir;
  transport::SpoolOptions o;
  o.dir = dir.path();
  o.segment_bytes = 4096;  // many segments, so acknowledgements delete files
  auto opened = transport::Spool::Open(o, nullptr);
  ASSERT_TRUE(opened.ok());
  std::unique_ptr<transport::Spool> spool = std::move(*opened);
  base::Mutex mu;
  base::CondVar cv;
  std::uint64_t appended = 0;
  constexpr std::uint64_t kEntries = 2000;
  std::thread sender([&] {
    for (std::uint64_t seq = 1; seq <= kEntries; ++seq) {
      base::MutexLock lock(&mu);
      ASSERT_TRUE(spool->Append(seq, std::string(100, static_cast<char>('a' + seq % 26))).ok());
      appended = seq;
      cv.SignalAll();
    }
  });
  std::thread acker([&] {
    std::uint64_t acked = 0;
    while (acked < kEntries) {
      base::MutexLock lock(&mu);
      while (appended == acked) cv.Wait(&mu);
      acked = appended;
      ASSERT_TRUE(spool->Acknowledge(acked).ok());
    }
  });
  sender.join();
  acker.join();
  EXPECT_EQ(spool->acknowledged_sequence(), kEntries);
  EXPECT_EQ(spool->unacknowledged_bytes(), 0u);
}

}  // namespace
}  // namespace gac
