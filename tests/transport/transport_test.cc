// The telemetry sender and the remote controller against real gacd
// processes: outages, kill -9, a stalled server, trainer restarts.

#include <gtest/gtest.h>
#include <netdb.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "gac/transport/channel.h"
#include "gac/controller/window.h"
#include "gac/transport/remote_controller.h"
#include "gac/transport/scalar_budget.h"
#include "gac/transport/telemetry.h"
#include "tests/common/test_util.h"

// clang spells "built with AddressSanitizer" as a feature, GCC as a macro.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GAC_TEST_HAS_ASAN 1
#endif
#endif
#ifndef GAC_TEST_HAS_ASAN
#define GAC_TEST_HAS_ASAN 0
#endif

namespace gac::transport {
namespace {

using namespace std::chrono_literals;
using testing::Client;
using testing::GacdProcess;
using testing::MakeStep;
using testing::ScratchDir;

// A gacd process that can be killed and restarted on the same port.
class Gacd {
 public:
  explicit Gacd(const ScratchDir& dir) : dir_(dir), tokens_(testing::WriteTestTokens(dir)) {}

  bool Start(const std::string& port = "0") {
    proc_ = std::make_unique<GacdProcess>(std::vector<std::string>{
        "--listen=127.0.0.1:" + port, "--http-listen=", "--store=sqlite:" + dir_.File("gacd"),
        "--token-file=" + tokens_, "--drain-timeout=1s"});
    if (!proc_->Start(dir_.File("ready"))) {
      ADD_FAILURE() << proc_->error();
      return false;
    }
    address_ = proc_->address();
    return true;
  }
  bool Restart() { return Start(address_.substr(address_.rfind(':') + 1)); }
  void Kill() { proc_->Kill(); }
  GacdProcess& process() { return *proc_; }
  const std::string& address() const { return address_; }

  // Steps stored for `run`, in order.
  std::vector<std::int64_t> Steps(const std::string& run) {
    std::vector<v1::StepRecord> recs;
    grpc::Status st = Client(address_, testing::kReaderToken).AllSteps(run, &recs);
    std::vector<std::int64_t> out;
    if (!st.ok()) return out;
    for (const auto& r : recs) out.push_back(r.step());
    return out;
  }

 private:
  const ScratchDir& dir_;
  std::string tokens_;
  std::unique_ptr<GacdProcess> proc_;
  std::string address_;
};

TelemetryOptions Options(const std::string& address, const ScratchDir& dir) {
  TelemetryOptions o;
  o.address = address;
  o.token = testing::kWriterToken;
  o.spool_dir = dir.File("spool");
  o.max_batch_records = 32;
  o.flush_interval = 5ms;
  o.backoff_initial = 20ms;
  o.backoff_max = 200ms;
  return o;
}

RemoteControllerOptions RemoteOptions(const std::string& address, const std::string& run,
                                      std::chrono::milliseconds deadline) {
  RemoteControllerOptions o;
  o.address = address;
  o.token = testing::kWriterToken;
  o.run = run;
  o.deadline = deadline;
  return o;
}

// Decides until gacd answers: the first call also connects, which a loaded
// machine may not do within a short deadline, and two misses hold Decide off
// for a second. Gives up after `patience`.
base::StatusOr<controller::Decision> DecideUntilAnswered(RemoteController& remote, std::int64_t step,
                                                         const controller::AlignmentStats& stats,
                                                         std::chrono::seconds patience = 15s) {
  const auto give_up = std::chrono::steady_clock::now() + patience;
  auto d = remote.Decide(step, stats);
  while (!d.ok() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(50ms);
    d = remote.Decide(step, stats);
  }
  return d;
}

std::vector<std::int64_t> Range(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

TEST(Telemetry, DeliversEveryRecordOnce) {
  ScratchDir dir;
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  auto t = Telemetry::Start(Options(gacd.address(), dir));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  for (int s = 0; s < 1000; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-t", s)));
  ASSERT_TRUE((*t)->Flush(30s)) << (*t)->last_error();
  const TelemetryCounters c = (*t)->counters();
  EXPECT_EQ(c.enqueued, 1000u);
  EXPECT_EQ(c.records_acknowledged, 1000u);
  EXPECT_EQ(c.records_spooled, 1000u);
  EXPECT_EQ(c.unacknowledged, 0u);
  EXPECT_EQ(gacd.Steps("exp-t"), Range(1000));
  // The sender's counters travel with the telemetry.
  std::vector<v1::StepRecord> recs;
  ASSERT_TRUE(Client(gacd.address(), testing::kReaderToken).AllSteps("exp-t", &recs).ok());
  const auto& last = recs.back().scalars();
  ASSERT_TRUE(last.count("agent_records_sent")) << recs.back().DebugString();
  EXPECT_GE(last.at("agent_records_sent"), 900.0);
  EXPECT_EQ(last.at("agent_records_dropped"), 0.0);
  EXPECT_GE(last.at("agent_records_spooled"), 900.0);
  // As many as scalar_budget.h leaves room for.
  std::size_t counters = 0;
  for (const auto& [name, value] : last) counters += name.rfind("agent_", 0) == 0 ? 1 : 0;
  EXPECT_EQ(counters, kSenderScalars);
}

TEST(Telemetry, GacdAbsentAtStartGetsEverythingLater) {
  ScratchDir dir;
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  gacd.Kill();  // keeps the port number for the restart
  auto t = Telemetry::Start(Options(gacd.address(), dir));
  ASSERT_TRUE(t.ok());
  for (int s = 0; s < 500; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-late", s)));
  EXPECT_FALSE((*t)->Flush(300ms));
  EXPECT_GT((*t)->counters().reconnects, 0u);
  EXPECT_EQ((*t)->counters().records_spooled, 500u);
  ASSERT_TRUE(gacd.Restart());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*t)->Flush(30s)) << (*t)->last_error();
  std::printf("delivered %.2f s after gacd came up\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_EQ(gacd.Steps("exp-late"), Range(500));
}

// Kills gacd (SIGKILL) `kills` times at random moments of a `steps`-step
// run, restarting it each time; the store must hold every step once.
void KillDuringRun(int kills, int steps) {
  ScratchDir dir;
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  auto t = Telemetry::Start(Options(gacd.address(), dir));
  ASSERT_TRUE(t.ok());
  std::atomic<bool> done{false};
  std::thread trainer([&] {
    for (int s = 0; s < steps; ++s) {
      EXPECT_TRUE((*t)->Enqueue(MakeStep("exp-kill", s)));
      std::this_thread::sleep_for(1ms);
    }
    done = true;
  });
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> pause_ms(20, 2 * steps / kills);
  for (int k = 0; k < kills; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms(rng)));
    gacd.Kill();
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms(rng) / 4));
    ASSERT_TRUE(gacd.Restart()) << "restart " << k;
  }
  trainer.join();
  ASSERT_TRUE((*t)->Flush(120s)) << (*t)->last_error();
  EXPECT_EQ(gacd.Steps("exp-kill"), Range(steps));
  const TelemetryCounters c = (*t)->counters();
  EXPECT_EQ(c.records_acknowledged, static_cast<std::uint64_t>(steps));
  EXPECT_EQ(c.dropped_queue_full, 0u);
  std::printf("kill -9 x%d over %d steps: %llu reconnects, %llu batches replayed (%llu records)\n", kills, steps,
              static_cast<unsigned long long>(c.reconnects), static_cast<unsigned long long>(c.batches_replayed),
              static_cast<unsigned long long>(c.records_replayed));
}

TEST(Telemetry, KillNineTwentyTimesLosesAndDuplicatesNothing) {
  // GAC_SOAK_KILLS raises the count for scripts/soak.sh (outside CI).
  const char* env = std::getenv("GAC_SOAK_KILLS");
  const char* env_steps = std::getenv("GAC_SOAK_STEPS");
  const int kills = env != nullptr ? std::atoi(env) : 20;
  const int steps = env_steps != nullptr ? std::atoi(env_steps) : 5000;
  KillDuringRun(kills, steps);
}

TEST(Telemetry, TrainerRestartReplaysTheSpool) {
  ScratchDir dir;
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  gacd.Kill();
  {
    auto t = Telemetry::Start(Options(gacd.address(), dir));
    ASSERT_TRUE(t.ok());
    for (int s = 0; s < 300; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-restart", s)));
    std::this_thread::sleep_for(200ms);  // let the sender spool them
    (*t)->Close(0ms);
    EXPECT_EQ((*t)->counters().records_spooled, 300u);
  }
  ASSERT_TRUE(gacd.Restart());
  auto t = Telemetry::Start(Options(gacd.address(), dir));
  ASSERT_TRUE(t.ok());
  EXPECT_GT((*t)->recovery().entries, 0u);  // batches left by the first process
  EXPECT_EQ((*t)->recovery().dropped_entries, 0u);
  EXPECT_EQ((*t)->counters().unacknowledged, 300u);
  for (int s = 300; s < 400; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-restart", s)));
  ASSERT_TRUE((*t)->Flush(30s)) << (*t)->last_error();
  EXPECT_EQ(gacd.Steps("exp-restart"), Range(400));
  EXPECT_GT((*t)->counters().batches_replayed, 0u);
}

TEST(Telemetry, RejectedBatchIsDroppedAndCounted) {
  ScratchDir dir;
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  TelemetryOptions o = Options(gacd.address(), dir);
  o.max_batch_records = 1;
  auto t = Telemetry::Start(o);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-rej", 0)));
  ASSERT_TRUE((*t)->Flush(10s));
  v1::StepRecord bad = MakeStep("exp-rej", 1);
  bad.set_cosine(7.0);  // out of range: gacd rejects it
  ASSERT_TRUE((*t)->Enqueue(std::move(bad)));
  for (int s = 2; s < 10; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-rej", s)));
  ASSERT_TRUE((*t)->Flush(30s)) << (*t)->last_error();
  EXPECT_EQ((*t)->counters().records_rejected, 1u);
  EXPECT_NE((*t)->last_error().find("INVALID_ARGUMENT"), std::string::npos) << (*t)->last_error();
  EXPECT_EQ(gacd.Steps("exp-rej"), (std::vector<std::int64_t>{0, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(Telemetry, FullQueueRefusesWithoutBlocking) {
  ScratchDir dir;
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  gacd.Kill();
  TelemetryOptions o = Options(gacd.address(), dir);
  o.queue_capacity = 100;
  o.spool_dir = "";                    // memory only...
  o.max_unacknowledged_batches = 2;    // ...with a small window
  auto t = Telemetry::Start(o);
  ASSERT_TRUE(t.ok());
  int accepted = 0;
  for (int s = 0; s < 1000; ++s) accepted += (*t)->Enqueue(MakeStep("exp-full", s)) ? 1 : 0;
  const TelemetryCounters c = (*t)->counters();
  EXPECT_EQ(c.enqueued, static_cast<std::uint64_t>(accepted));
  EXPECT_EQ(c.dropped_queue_full, static_cast<std::uint64_t>(1000 - accepted));
  EXPECT_GT(c.dropped_queue_full, 0u);
  EXPECT_LE(accepted, 100 + 2 * 32);
}

// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' zombie), or
// '?' when the process is gone.
char ProcessState(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return '?';
  const std::size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
}

bool WaitForProcessState(int pid, char state, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (ProcessState(pid) != state) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(StalledGacd, TrainerDoesNotWaitAndRemoteDecisionFallsBackOnTime) {
  ScratchDir dir;
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  auto t = Telemetry::Start(Options(gacd.address(), dir));
  ASSERT_TRUE(t.ok());
  auto remote = RemoteController::Create(RemoteOptions(gacd.address(), "exp-stall", 50ms));
  ASSERT_TRUE(remote.ok());
  const controller::AlignmentStats stats{0.1, 1.0, 1.0, true};
  // What is tested is the stalled server, below, not the connection.
  auto d = DecideUntilAnswered(**remote, 0, stats);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->regime, controller::Regime::kProject);  // |c| = 0.1 between the defaults 0.05 and 0.3

  ASSERT_EQ(kill(gacd.process().pid(), SIGSTOP), 0);
  // The stop is asynchronous: wait until the kernel reports gacd stopped, so
  // that a failure below cannot come from a gacd that still runs (or from
  // another process that took its port after it died).
  ASSERT_TRUE(WaitForProcessState(gacd.process().pid(), 'T', 5s))
      << "gacd (pid " << gacd.process().pid() << ") is not stopped: state " << ProcessState(gacd.process().pid());
  // The training thread only enqueues: no call may wait on the stalled server.
  std::chrono::nanoseconds worst{0};
  for (int s = 0; s < 3000; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-stall", s)));
    worst = std::max(worst, std::chrono::steady_clock::now() - t0);
    if (s % 100 == 0) std::this_thread::sleep_for(1ms);
  }
  EXPECT_LT(worst, 20ms) << "an Enqueue waited on the stalled server";
  // Without its deadline a call would wait until SIGCONT. The first two calls
  // must give up at it (a loaded machine may deschedule one for longer: CI
  // saw 210 ms once; the faster of the two must be close to it); then
  // Decide asks no one for a second (max(1 s, 20 deadlines)) and answers
  // UNAVAILABLE at once, and after that one call waits again.
  const auto timed_decide = [&](std::int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*remote)->Decide(step, stats);
    return std::make_pair(std::move(r), std::chrono::nanoseconds(std::chrono::steady_clock::now() - t0));
  };
  std::chrono::nanoseconds fastest = std::chrono::hours(1);
  for (int i = 0; i < 2; ++i) {
    auto [miss, took] = timed_decide(1 + i);
    fastest = std::min(fastest, took);
    EXPECT_EQ(miss.status().code(), base::StatusCode::kDeadlineExceeded) << miss.status().ToString();
    EXPECT_GE(took, 50ms) << "gacd is stopped: only the deadline ends the call";
    EXPECT_LT(took, 50ms + 1s) << "the remote decision must give up at its deadline";
  }
  EXPECT_LT(fastest, 50ms + 150ms) << "the remote decision must give up at its deadline";
  const auto held_from = std::chrono::steady_clock::now();
  int held = 0;
  while (std::chrono::steady_clock::now() - held_from < 800ms) {
    auto [miss, took] = timed_decide(3 + held++);
    EXPECT_EQ(miss.status().code(), base::StatusCode::kUnavailable) << miss.status().ToString();
    EXPECT_NE(miss.status().message().find("not asked"), std::string::npos) << miss.status().ToString();
    EXPECT_LT(took, 20ms) << "a held-off decision asks no one";
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_GT(held, 10);
  std::this_thread::sleep_for(400ms);  // the hold-off (1 s from the second miss) is over
  auto [probe, took] = timed_decide(1000);
  EXPECT_EQ(probe.status().code(), base::StatusCode::kDeadlineExceeded) << probe.status().ToString();
  EXPECT_GE(took, 50ms);
  ASSERT_EQ(kill(gacd.process().pid(), SIGCONT), 0);
  ASSERT_TRUE((*t)->Flush(60s)) << (*t)->last_error();
  EXPECT_EQ(gacd.Steps("exp-stall"), Range(3000));
}

TEST(RemoteController, OutageFailsFastAndRecovers) {
  ScratchDir dir;
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  RemoteControllerOptions ro;
  ro.address = gacd.address();
  ro.token = testing::kWriterToken;
  ro.run = "exp-outage";
  ro.deadline = 200ms;
  auto remote = RemoteController::Create(ro);
  ASSERT_TRUE(remote.ok());
  // Connected first (a loaded machine may need more than one deadline for it).
  ASSERT_TRUE(DecideUntilAnswered(**remote, 0, {0.0, 1, 1, true}).ok());
  gacd.Kill();
  auto miss = (*remote)->Decide(1, {0.0, 1, 1, true});
  EXPECT_FALSE(miss.ok());
  ASSERT_TRUE(gacd.Restart());
  bool recovered = false;
  for (int i = 0; i < 100 && !recovered; ++i) {
    recovered = (*remote)->Decide(2 + i, {0.0, 1, 1, true}).ok();
    if (!recovered) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(recovered);
  RemoteControllerOptions bad = ro;
  bad.token = testing::kReaderToken;  // no write right
  bad.deadline = 10s;                 // a fresh channel: the refusal, not the connect time, is tested
  auto denied = RemoteController::Create(bad);
  ASSERT_TRUE(denied.ok());
  EXPECT_EQ((*denied)->Decide(0, {0.0, 1, 1, true}).status().code(), base::StatusCode::kPermissionDenied);
}

// SetThresholds keeps the run's mode unless asked; SetRunThresholds, its
// deprecated former name, also switches the run to remote.
TEST(RemoteController, SetThresholdsKeepsTheModeUnlessAsked) {
  ScratchDir dir;
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  RemoteControllerOptions ro;
  ro.address = gacd.address();
  ro.token = testing::kAdminToken;
  ro.run = "exp-thresholds";
  auto remote = RemoteController::Create(ro);
  ASSERT_TRUE(remote.ok());
  testing::Client admin(gacd.address(), testing::kAdminToken);
  v1::RunConfig cfg;
  const base::Status first =
      (*remote)->SetThresholds({0.1, 0.4}, controller::AlphaMode::kExact, "test", controller::Mode::kMonitor);
  ASSERT_TRUE(first.ok()) << first.ToString();
  ASSERT_TRUE(admin.GetRunConfig("exp-thresholds", &cfg).ok());
  EXPECT_EQ(cfg.mode(), v1::CONTROL_MODE_MONITOR);
  const base::Status second = (*remote)->SetThresholds({0.2, 0.5}, controller::AlphaMode::kPaper, "test");
  ASSERT_TRUE(second.ok()) << second.ToString();
  ASSERT_TRUE(admin.GetRunConfig("exp-thresholds", &cfg).ok());
  EXPECT_EQ(cfg.mode(), v1::CONTROL_MODE_MONITOR) << "a thresholds change keeps the mode";
  EXPECT_EQ(cfg.thresholds().c_low(), 0.2);
  EXPECT_EQ(cfg.thresholds().alpha_mode(), v1::ALPHA_MODE_PAPER);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ASSERT_TRUE((*remote)->SetRunThresholds({0.3, 0.6}, controller::AlphaMode::kPaper, "test").ok());
#pragma GCC diagnostic pop
  ASSERT_TRUE(admin.GetRunConfig("exp-thresholds", &cfg).ok());
  EXPECT_EQ(cfg.mode(), v1::CONTROL_MODE_REMOTE) << "the former name switched the run to remote";
  EXPECT_EQ(cfg.thresholds().c_low(), 0.3);
}

// ---- several gacd replicas (each on its own SQLite store here; replicas on
// one PostgreSQL database are tested in tests/server/replicas_test.cc) ----

TEST(Addresses, ListsOfReplicas) {
  auto one = SplitGacdAddresses("gacd:7070");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, std::vector<std::string>{"gacd:7070"});
  auto three = SplitGacdAddresses("gacd-0:7070, gacd-1:7070 ,[::1]:7070");
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(*three, (std::vector<std::string>{"gacd-0:7070", "gacd-1:7070", "[::1]:7070"}));
  for (const char* bad : {"", "a:1,,b:2", "a:1,", " , "}) {
    EXPECT_EQ(SplitGacdAddresses(bad).status().code(), base::StatusCode::kInvalidArgument) << bad;
  }
  TelemetryOptions o;
  o.address = "a:1,,b:2";
  EXPECT_EQ(Telemetry::Start(o).status().code(), base::StatusCode::kInvalidArgument);
  RemoteControllerOptions ro;
  ro.address = "";
  ro.run = "exp";
  EXPECT_EQ(RemoteController::Create(ro).status().code(), base::StatusCode::kInvalidArgument);
}

// The sender stays on the replica it connected to while that one works,
// moves to the other when it is killed, and resends there what was not
// acknowledged. (It tries the first address first, but gives each attempt
// only 100 ms: on a loaded machine it may start on the second.)
TEST(Telemetry, MovesToTheNextReplicaWhenOneDies) {
  ScratchDir dir_a, dir_b, spool;
  Gacd a(dir_a), b(dir_b);
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  auto t = Telemetry::Start(Options(a.address() + "," + b.address(), spool));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  for (int s = 0; s < 200; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-failover", s)));
  ASSERT_TRUE((*t)->Flush(60s)) << (*t)->last_error();
  const std::string first = (*t)->address();
  ASSERT_TRUE(first == a.address() || first == b.address()) << first;
  Gacd& used = first == a.address() ? a : b;
  Gacd& other = first == a.address() ? b : a;
  EXPECT_EQ(used.Steps("exp-failover"), Range(200));
  EXPECT_TRUE(other.Steps("exp-failover").empty());

  used.Kill();
  for (int s = 200; s < 400; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-failover", s)));
  ASSERT_TRUE((*t)->Flush(60s)) << (*t)->last_error();
  EXPECT_EQ((*t)->address(), other.address());
  std::vector<std::int64_t> want;
  for (int s = 200; s < 400; ++s) want.push_back(s);
  EXPECT_EQ(other.Steps("exp-failover"), want);
  const TelemetryCounters c = (*t)->counters();
  EXPECT_EQ(c.records_acknowledged, 400u);
  EXPECT_GE(c.failovers, 1u);
}

// A Decide that the preferred replica cannot answer (it died) is answered by
// the next one within the same call, and that one is asked first afterwards.
TEST(RemoteController, AnswersFromAnotherReplicaWithinOneCall) {
  ScratchDir dir_a, dir_b;
  Gacd a(dir_a), b(dir_b);
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  auto remote = RemoteController::Create(RemoteOptions(a.address() + "," + b.address(), "exp-failover", 500ms));
  ASSERT_TRUE(remote.ok());
  const controller::AlignmentStats stats{0.1, 1.0, 1.0, true};
  ASSERT_TRUE((*remote)->Decide(0, stats).ok());
  a.Kill();
  for (int i = 1; i <= 20; ++i) {
    auto d = (*remote)->Decide(i, stats);
    ASSERT_TRUE(d.ok()) << "call " << i << ": " << d.status().ToString();
    EXPECT_EQ(d->regime, controller::Regime::kProject);
  }
  // Both down: an error (the agent decides locally), and no wait beyond the
  // deadline.
  b.Kill();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ((*remote)->Decide(21, stats).status().code(), base::StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms + 200ms);
  ASSERT_TRUE(a.Restart());
  bool recovered = false;
  for (int i = 0; i < 100 && !recovered; ++i) {
    recovered = (*remote)->Decide(22 + i, stats).ok();
    if (!recovered) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(recovered);
}

// The windowed trigger decided in gacd gives the decisions of the local
// controller for the same c_t sequence, also when the replica that answers
// changes mid-run: the window lives with the asker.
TEST(RemoteController, WindowedTriggerDecidesAsTheLocalControllerOnEveryReplica) {
  ScratchDir dir_a, dir_b;
  Gacd a(dir_a), b(dir_b);
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  const controller::Thresholds per_step{0.05, 0.3};
  const controller::TriggerSettings trigger{controller::Trigger::kWindow, 5, {0.2, 0.6}};
  for (Gacd* g : {&a, &b}) {
    RemoteControllerOptions admin = RemoteOptions(g->address(), "exp-window", 10s);
    admin.token = testing::kAdminToken;
    auto r = RemoteController::Create(admin);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE((*r)->SetThresholds(per_step, controller::AlphaMode::kPaper, "test", controller::Mode::kRemote).ok());
    const base::Status st = (*r)->SetTrigger(trigger, controller::AlphaMode::kPaper, "test");
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  auto remote = RemoteController::Create(RemoteOptions(a.address() + "," + b.address(), "exp-window", 2s));
  ASSERT_TRUE(remote.ok());
  auto local = controller::TriggeredController::Create(per_step, controller::AlphaMode::kPaper, trigger);
  ASSERT_TRUE(local.ok());
  // c_t: a sign change, a persistent alignment, an invalid step and a step
  // without a reference in the middle (neither enters the window).
  std::vector<controller::AlignmentStats> steps;
  for (int i = 0; i < 60; ++i) {
    const double c = i < 10 ? (i % 2 ? 0.5 : -0.5) : i < 30 ? 0.45 : i < 40 ? 0.9 : 0.1 * (i % 3);
    steps.push_back({c * 2.0, 4.0, 1.0, true});
  }
  steps[33] = {std::nan(""), 1.0, 1.0, true};
  steps[36] = {0.0, 1.0, 0.0, false};
  int windowed_regimes = 0;
  for (int i = 0; i < static_cast<int>(steps.size()); ++i) {
    if (i == 25) a.Kill();  // the other replica answers from here on
    auto got = (*remote)->Decide(i, steps[static_cast<std::size_t>(i)]);
    ASSERT_TRUE(got.ok()) << "step " << i << ": " << got.status().ToString();
    const controller::Decision want = local->Decide(steps[static_cast<std::size_t>(i)]);
    EXPECT_EQ(got->regime, want.regime) << "step " << i;
    EXPECT_EQ(got->apply_update, want.apply_update) << "step " << i;
    EXPECT_DOUBLE_EQ(got->alpha, want.alpha) << "step " << i;
    EXPECT_DOUBLE_EQ(got->projection_coeff, want.projection_coeff) << "step " << i;
    ASSERT_EQ(got->window_mean.has_value(), want.window_mean.has_value()) << "step " << i;
    if (want.window_mean) {
      EXPECT_DOUBLE_EQ(*got->window_mean, *want.window_mean) << "step " << i;
    }
    // Where the per-step rule would decide otherwise, the window decided.
    if (want.regime != controller::Regime::kInvalid && want.cosine) {
      const auto per = controller::Controller::Create(per_step)->Decide(steps[static_cast<std::size_t>(i)]);
      windowed_regimes += per.regime != want.regime ? 1 : 0;
    }
  }
  EXPECT_GT(windowed_regimes, 10) << "the sequence must tell the two rules apart";
}

// One DNS name that resolves to several replicas: "localhost" names
// 127.0.0.1 and ::1, and a gacd listens on each with the same port. The
// sender streams to one; when it dies, the records go to the other.
TEST(Telemetry, OneNameForSeveralReplicas) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  bool v4 = false, v6 = false;
  if (getaddrinfo("localhost", nullptr, &hints, &found) == 0) {
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      v4 = v4 || ai->ai_family == AF_INET;
      v6 = v6 || ai->ai_family == AF_INET6;
    }
    freeaddrinfo(found);
  }
  if (!v4 || !v6) GTEST_SKIP() << "localhost does not resolve to both 127.0.0.1 and ::1 here";
  ScratchDir dir_a, dir_b, spool;
  const std::string tokens = testing::WriteTestTokens(dir_a);
  auto start = [&](const ScratchDir& dir, const std::string& listen) {
    auto p = std::make_unique<GacdProcess>(std::vector<std::string>{
        "--listen=" + listen, "--http-listen=", "--store=sqlite:" + dir.File("gacd"), "--token-file=" + tokens});
    return p->Start(dir.File("ready")) ? std::move(p) : nullptr;
  };
  auto a = start(dir_a, "127.0.0.1:0");
  ASSERT_NE(a, nullptr);
  const std::string port = a->address().substr(a->address().rfind(':') + 1);
  auto b = start(dir_b, "[::1]:" + port);
  if (b == nullptr) GTEST_SKIP() << "cannot listen on [::1]:" << port << " here";
  auto t = Telemetry::Start(Options("localhost:" + port, spool));
  ASSERT_TRUE(t.ok());
  for (int s = 0; s < 100; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-dns", s)));
  ASSERT_TRUE((*t)->Flush(60s)) << (*t)->last_error();
  const auto steps = [&](const std::string& address) {
    std::vector<v1::StepRecord> recs;
    Client(address, testing::kReaderToken).AllSteps("exp-dns", &recs);
    std::set<std::int64_t> out;
    for (const auto& r : recs) out.insert(r.step());
    return out;
  };
  const bool on_a = steps(a->address()).size() == 100;
  ASSERT_TRUE(on_a || steps(b->address()).size() == 100);
  GacdProcess& survivor = on_a ? *b : *a;
  (on_a ? a : b)->Kill();
  for (int s = 100; s < 200; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-dns", s)));
  ASSERT_TRUE((*t)->Flush(60s)) << (*t)->last_error();
  const std::set<std::int64_t> later = steps(survivor.address());
  for (int s = 100; s < 200; ++s) EXPECT_EQ(later.count(s), 1u) << s;
}


// A replica that goes silent (SIGSTOP: its connection stays open, nothing
// answers, as behind a partition that drops packets) is left after
// ack_timeout: the sender moves to the other replica and resends there.
TEST(Telemetry, SilentReplicaIsLeftAfterTheAckTimeout) {
  ScratchDir dir_a, dir_b;
  Gacd a(dir_a), b(dir_b);
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  TelemetryOptions o = Options(a.address() + "," + b.address(), dir_a);
  o.ack_timeout = 300ms;
  auto t = Telemetry::Start(o);
  ASSERT_TRUE(t.ok());
  for (int s = 0; s < 100; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-silent", s)));
  ASSERT_TRUE((*t)->Flush(30s)) << (*t)->last_error();
  ASSERT_EQ((*t)->address(), a.address());
  ASSERT_EQ(kill(a.process().pid(), SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  // Enough to fill the stream's flow-control window: the sender is blocked
  // in a write when the watchdog cancels the stream.
  for (int s = 100; s < 5000; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-silent", s)));
  const bool flushed = (*t)->Flush(30s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string error = (*t)->last_error();
  ASSERT_EQ(kill(a.process().pid(), SIGCONT), 0);
  ASSERT_TRUE(flushed) << error;
  std::printf("moved to the other replica and delivered %.2f s after the first went silent\n", took);
  EXPECT_LT(took, 10.0);
  EXPECT_EQ((*t)->address(), b.address());
  EXPECT_NE(error.find("no acknowledgement from " + a.address()), std::string::npos) << error;
  std::set<std::int64_t> all;
  for (std::int64_t s : a.Steps("exp-silent")) all.insert(s);
  for (std::int64_t s : b.Steps("exp-silent")) all.insert(s);
  EXPECT_EQ(all.size(), 5000u);
}

// The spool's directory on a tmpfs of `bytes`, unmounted (lazily) when it goes
// out of scope. Mounting needs root (CAP_SYS_ADMIN); ok() says whether it
// worked and why not.
class TinyFilesystem {
 public:
  TinyFilesystem(const std::string& dir, std::size_t bytes) : dir_(dir) {
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      why_ = "mkdir " + dir + ": " + std::strerror(errno);
      return;
    }
    const std::string opts = "size=" + std::to_string(bytes);
    if (mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
      why_ = "mount -t tmpfs -o " + opts + " " + dir + ": " + std::strerror(errno) + " (needs root)";
      return;
    }
    mounted_ = true;
  }
  ~TinyFilesystem() {
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }

 private:
  std::string dir_, why_;
  bool mounted_ = false;
};

// Nanoseconds at quantile q (0..1) of `ns`, sorted in place.
std::int64_t Quantile(std::vector<std::int64_t>& ns, double q) {
  std::sort(ns.begin(), ns.end());
  return ns[std::min(ns.size() - 1, static_cast<std::size_t>(q * static_cast<double>(ns.size())))];
}

// Steps 0..n-1 each exactly once: the sorted list a query returns.
bool ExactlyOnce(const std::vector<std::int64_t>& stored, std::int64_t n) { return stored == Range(n); }

TelemetryOptions TinySpoolOptions(const std::string& address, const std::string& spool_dir) {
  TelemetryOptions o;
  o.address = address;
  o.token = testing::kWriterToken;
  o.spool_dir = spool_dir;
  o.backoff_initial = 20ms;
  o.backoff_max = 200ms;
  return o;  // the default batches (256 records, 50 ms) and queue (65,536 records)
}

// Waits up to `limit` until the sender has spooled what the tiny disk takes:
// records_spooled stops growing for 300 ms.
std::uint64_t WaitForSpoolToFill(Telemetry& t, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  std::uint64_t last = t.counters().records_spooled;
  auto since = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(20ms);
    const std::uint64_t now = t.counters().records_spooled;
    if (now != last) {
      last = now;
      since = std::chrono::steady_clock::now();
    } else if (last > 0 && std::chrono::steady_clock::now() - since > 300ms) {
      break;
    }
  }
  return last;
}

// gacd down, the spool on a 256 KiB filesystem, 30,000 steps, Close: what
// the spool could not take is discarded by Close and counted; the next
// process sends the rest. Nothing is lost uncounted.
TEST(SpoolDiskFull, CloseCountsWhatItDiscardsAndTheNextProcessSendsTheRest) {
  ScratchDir dir;
  TinyFilesystem fs(dir.File("spool"), 256 << 10);
  if (!fs.ok()) GTEST_SKIP() << "no tiny filesystem for the spool: " << fs.why();
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  gacd.Kill();
  constexpr int kSteps = 30000;
  TelemetryCounters c;
  std::string error;
  {
    auto t = Telemetry::Start(TinySpoolOptions(gacd.address(), dir.File("spool")));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    for (int s = 0; s < kSteps; ++s) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-diskfull", s)));
    WaitForSpoolToFill(**t, 10s);
    (*t)->Close(200ms);
    c = (*t)->counters();
    error = (*t)->last_error();
  }
  std::printf("after close: enqueued %llu, spooled %llu, dropped_queue_full %llu, dropped_at_close %llu, "
              "spool_errors %llu, queue_depth %llu\nlast_error: %s\n",
              static_cast<unsigned long long>(c.enqueued), static_cast<unsigned long long>(c.records_spooled),
              static_cast<unsigned long long>(c.dropped_queue_full),
              static_cast<unsigned long long>(c.dropped_at_close), static_cast<unsigned long long>(c.spool_errors),
              static_cast<unsigned long long>(c.queue_depth), error.c_str());
  EXPECT_EQ(c.enqueued, static_cast<std::uint64_t>(kSteps));
  EXPECT_GT(c.records_spooled, 0u);
  EXPECT_LT(c.records_spooled, static_cast<std::uint64_t>(kSteps)) << "the disk was expected to fill";
  EXPECT_EQ(c.records_spooled + c.dropped_at_close, c.enqueued) << "a record neither spooled nor counted";
  EXPECT_EQ(c.queue_depth, 0u);
  EXPECT_NE(error.find("Close discarded " + std::to_string(c.dropped_at_close)), std::string::npos) << error;
  EXPECT_NE(error.find("spool"), std::string::npos) << error;

  ASSERT_TRUE(gacd.Restart());
  auto t = Telemetry::Start(TinySpoolOptions(gacd.address(), dir.File("spool")));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->recovery().dropped_entries, 0u) << (*t)->recovery().detail;
  ASSERT_TRUE((*t)->Flush(60s)) << (*t)->last_error();
  const std::vector<std::int64_t> stored = gacd.Steps("exp-diskfull");
  std::printf("stored %zu of %d; %llu counted as discarded by Close\n", stored.size(), kSteps,
              static_cast<unsigned long long>(c.dropped_at_close));
  // Keep the oldest: the first records_spooled steps, each once.
  EXPECT_TRUE(ExactlyOnce(stored, static_cast<std::int64_t>(c.records_spooled)))
      << stored.size() << " stored, " << c.records_spooled << " spooled";
}

// gacd down and the spool's disk full: the training thread's Enqueue stays
// fast, the queue fills and refuses (counted, in last_error); after the
// heal every accepted step is stored once and the refusals are exported
// with the run (agent_records_dropped).
TEST(SpoolDiskFull, RefusalsAreCountedExportedAndEnqueueStaysFast) {
  ScratchDir dir;
  TinyFilesystem fs(dir.File("spool"), 256 << 10);
  if (!fs.ok()) GTEST_SKIP() << "no tiny filesystem for the spool: " << fs.why();
  Gacd gacd(dir);
  ASSERT_TRUE(gacd.Start());
  gacd.Kill();
  TelemetryOptions o = TinySpoolOptions(gacd.address(), dir.File("spool"));
  o.queue_capacity = 20000;
  auto t = Telemetry::Start(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  int step = 0;
  for (; step < 5000; ++step) ASSERT_TRUE((*t)->Enqueue(MakeStep("exp-diskfull2", step)));
  const std::uint64_t spooled = WaitForSpoolToFill(**t, 10s);
  ASSERT_LT(spooled, 5000u) << "the disk was expected to fill";
  // The training thread with the spool full: one step every 20 µs or so,
  // past the queue's capacity.
  constexpr int kTimed = 30000;
  std::vector<std::int64_t> ns;
  ns.reserve(kTimed);
  std::set<std::int64_t> refused;
  for (int i = 0; i < kTimed; ++i, ++step) {
    v1::StepRecord r = MakeStep("exp-diskfull2", step);
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = (*t)->Enqueue(std::move(r));
    ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    if (!ok) refused.insert(step);
    if (i % 64 == 0) std::this_thread::sleep_for(1ms);
  }
  const std::int64_t p50 = Quantile(ns, 0.5), p99 = Quantile(ns, 0.99), worst = ns.back();
  std::printf("Enqueue with the spool's disk full: p50 %.2f us, p99 %.2f us, max %.1f us over %d calls\n",
              static_cast<double>(p50) / 1e3, static_cast<double>(p99) / 1e3, static_cast<double>(worst) / 1e3,
              kTimed);
  // The target is 5 µs; the bound here leaves room for a loaded CI machine.
  // Under AddressSanitizer the time says nothing about Release.
#if !defined(__SANITIZE_ADDRESS__) && !GAC_TEST_HAS_ASAN
  EXPECT_LT(p99, 50000) << "Enqueue slowed down with the spool full";
#endif
  const TelemetryCounters c = (*t)->counters();
  EXPECT_EQ(c.dropped_queue_full, refused.size());
  EXPECT_GT(c.dropped_queue_full, 0u);
  const std::string error = (*t)->last_error();
  EXPECT_NE(error.find("Enqueue refused " + std::to_string(refused.size())), std::string::npos) << error;
  EXPECT_NE(error.find("spool full"), std::string::npos) << error;

  ASSERT_TRUE(gacd.Restart());
  const auto heal = std::chrono::steady_clock::now();
  ASSERT_TRUE((*t)->Flush(120s)) << (*t)->last_error();
  std::printf("%llu accepted steps delivered %.2f s after gacd came back; %zu refused\n",
              static_cast<unsigned long long>(c.enqueued),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - heal).count(), refused.size());
  std::vector<v1::StepRecord> recs;
  ASSERT_TRUE(Client(gacd.address(), testing::kReaderToken).AllSteps("exp-diskfull2", &recs).ok());
  std::vector<std::int64_t> stored, expected;
  for (const auto& r : recs) stored.push_back(r.step());
  for (std::int64_t s = 0; s < step; ++s) {
    if (refused.count(s) == 0) expected.push_back(s);
  }
  EXPECT_EQ(stored, expected) << "every accepted step once, no refused one";
  ASSERT_FALSE(recs.empty());
  const auto& last = recs.back().scalars();
  ASSERT_TRUE(last.count("agent_records_dropped")) << recs.back().DebugString();
  EXPECT_EQ(last.at("agent_records_dropped"), static_cast<double>(refused.size()));
  (*t)->Close(10s);
  EXPECT_EQ((*t)->counters().dropped_at_close, 0u);
}

}  // namespace
}  // namespace gac::transport
