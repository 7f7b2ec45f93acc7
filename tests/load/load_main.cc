// gac_load: a sustained load on a real gacd process, with faults, and the
// figures of docs/RELIABILITY.md. Phases:
//
//  1. load: `--streams` telemetry senders (one ingest stream each, with a
//     spool) send per-layer step records at `--rate` steps/s each,
//     `--decide` clients ask Decide in a loop, /metrics is scraped every
//     second, `--queriers` clients page through the history, and gacd is
//     killed with SIGKILL at `--kill-at` seconds and restarted on the same
//     ports. Then every step that Enqueue accepted must be stored exactly
//     once. Reported: rows/s, Decide p50/p99, errors by code, gacd's
//     resident memory and open files every second.
//  2. runs: `--runs` distinct run ids: /metrics exports at most
//     --max-runs-exported of them, and gacd's memory stays bounded.
//  3. flood: `--flood` TCP connections opened at once (half of them start
//     HTTP/2 and stall), and 200 gRPC channels: Decide keeps answering, and
//     gacd's open files come back down afterwards.
//  4. stalled: `--stalled` ingest streams that write and never read their
//     acks: their writes stop (flow control), gacd's memory stays flat, and
//     a normal sender is still served.
//
//   gac_load [--short] [--seconds 120] [--streams 256] [--decide 64] ...
//
// --short is the form ctest runs (load_short). Exit status 0 when every
// check held.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gac/base/mutex.h"
#include "gac/proto/convert.h"
#include "gac/transport/remote_controller.h"
#include "gac/transport/telemetry.h"
#include "tests/common/test_util.h"


// clang spells "built with AddressSanitizer" as a feature, GCC as a macro.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GAC_LOAD_HAS_ASAN 1
#endif
#endif
#ifndef GAC_LOAD_HAS_ASAN
#define GAC_LOAD_HAS_ASAN 0
#endif
namespace gac::load {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using testing::Client;
using testing::GacdProcess;
using testing::ScratchDir;

struct Options {
  double seconds = 120;
  int streams = 256;
  int ranks = 8;  // streams per run (its ranks)
  double rate = 20;  // steps/s per stream
  int layers = 8;
  int decide = 64;
  double decide_rate = 50;  // calls/s per client
  int decide_deadline_ms = 1000;
  int queriers = 2;
  double kill_at = -1;  // < 0: seconds / 2; 0: no kill
  int runs = 10000;
  int max_runs_exported = 1000;
  int flood = 2000;
  int stalled = 64;
  std::string sync = "full";
  std::string csv;  // gacd's memory and open files per second
};

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--short") {
      o->seconds = 20;
      o->streams = 32;
      o->rate = 20;
      o->layers = 4;
      o->decide = 8;
      o->decide_rate = 20;
      o->queriers = 1;
      o->runs = 1500;
      o->max_runs_exported = 500;
      o->flood = 300;
      o->stalled = 8;
      o->sync = "normal";
      continue;
    }
    std::string value;
    if (const auto eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1);
      a.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    }
    auto num = [&] { return std::atof(value.c_str()); };
    if (a == "--seconds") o->seconds = num();
    else if (a == "--streams") o->streams = static_cast<int>(num());
    else if (a == "--ranks") o->ranks = static_cast<int>(num());
    else if (a == "--rate") o->rate = num();
    else if (a == "--layers") o->layers = static_cast<int>(num());
    else if (a == "--decide") o->decide = static_cast<int>(num());
    else if (a == "--decide-rate") o->decide_rate = num();
    else if (a == "--decide-deadline-ms") o->decide_deadline_ms = static_cast<int>(num());
    else if (a == "--queriers") o->queriers = static_cast<int>(num());
    else if (a == "--kill-at") o->kill_at = num();
    else if (a == "--runs") o->runs = static_cast<int>(num());
    else if (a == "--max-runs-exported") o->max_runs_exported = static_cast<int>(num());
    else if (a == "--flood") o->flood = static_cast<int>(num());
    else if (a == "--stalled") o->stalled = static_cast<int>(num());
    else if (a == "--sync") o->sync = value;
    else if (a == "--csv") o->csv = value;
    else {
      std::fprintf(stderr, "gac_load: unknown flag %s (see the header of tests/load/load_main.cc)\n", a.c_str());
      return false;
    }
  }
  if (o->kill_at < 0) o->kill_at = o->seconds / 2;
  if (o->ranks < 1 || o->streams < 1 || o->streams % o->ranks != 0) {
    std::fprintf(stderr, "gac_load: --streams must be a multiple of --ranks\n");
    return false;
  }
  return true;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A failed check: printed, and the exit status becomes 1.
std::atomic<int> failures{0};
void Check(bool ok, const std::string& what) {
  std::printf("  %s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) failures.fetch_add(1);
}

// Errors by "method code".
class ErrorCounts {
 public:
  void Add(const std::string& method, const std::string& code) {
    base::MutexLock lock(&mu_);
    ++counts_[method + " " + code];
  }
  std::string Text() const {
    base::MutexLock lock(&mu_);
    std::string out;
    for (const auto& [k, n] : counts_) out += "    " + k + ": " + std::to_string(n) + "\n";
    return out.empty() ? "    none\n" : out;
  }

 private:
  mutable base::Mutex mu_;
  std::map<std::string, std::uint64_t> counts_ GAC_GUARDED_BY(mu_);
};

std::string CodeName(grpc::StatusCode code) { return base::StatusCodeName(static_cast<base::StatusCode>(code)); }

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

// gacd as a process that can be killed and restarted on its ports.
class Gacd {
 public:
  Gacd(const ScratchDir& dir, const Options& o) : dir_(dir), o_(o), tokens_(testing::WriteTestTokens(dir)) {}

  bool Start() {
    const std::string grpc_port = address_.empty() ? "0" : address_.substr(address_.rfind(':') + 1);
    const std::string metrics_port = metrics_.empty() ? "0" : metrics_.substr(metrics_.rfind(':') + 1);
    auto p = std::make_unique<GacdProcess>(std::vector<std::string>{
        "--listen=127.0.0.1:" + grpc_port, "--http-listen=127.0.0.1:" + metrics_port,
        "--store=sqlite:" + dir_.File("gacd"), "--token-file=" + tokens_, "--per-layer-metrics",
        "--max-layers-per-run=64", "--sync=" + o_.sync, "--drain-timeout=2s",
        "--max-runs-exported=" + std::to_string(o_.max_runs_exported)});
    if (!p->Start(dir_.File("ready"))) {
      std::fprintf(stderr, "gac_load: gacd did not start: %s\n", p->error().c_str());
      return false;
    }
    base::MutexLock lock(&mu_);
    address_ = p->address();
    metrics_ = p->metrics_address();
    proc_ = std::move(p);
    return true;
  }
  void Kill() {
    base::MutexLock lock(&mu_);
    proc_->Kill();
  }
  int Terminate() {
    base::MutexLock lock(&mu_);
    return proc_->Terminate();
  }
  int pid() {
    base::MutexLock lock(&mu_);
    return proc_ ? proc_->pid() : -1;
  }
  std::string Log() {
    base::MutexLock lock(&mu_);
    return proc_->Log();
  }
  const std::string& address() const { return address_; }  // constant after the first Start
  const std::string& metrics_address() const { return metrics_; }

 private:
  const ScratchDir& dir_;
  const Options& o_;
  std::string tokens_;
  base::Mutex mu_;
  std::unique_ptr<GacdProcess> proc_ GAC_GUARDED_BY(mu_);
  std::string address_, metrics_;
};

// gacd's resident memory (KiB) and open files, from /proc.
struct Usage {
  double t = 0;
  long rss_kib = 0;
  long anon_kib = 0;  // of which anonymous memory (not SQLite's mapped files)
  int fds = 0;
};

Usage Sample(int pid, double t) {
  Usage u;
  u.t = t;
  if (pid <= 0) return u;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) u.rss_kib = std::atol(line.c_str() + 6);
    if (line.rfind("RssAnon:", 0) == 0) u.anon_kib = std::atol(line.c_str() + 8);
  }
  if (DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (readdir(d) != nullptr) ++u.fds;
    closedir(d);
    u.fds -= 2;  // . and ..
  }
  return u;
}

// Samples gacd once a second until stopped.
class Sampler {
 public:
  explicit Sampler(Gacd* gacd) : gacd_(gacd), start_(Clock::now()) {
    thread_ = std::thread([this] {
      base::MutexLock lock(&mu_);
      while (!stop_) {
        samples_.push_back(Sample(gacd_->pid(), Seconds(Clock::now() - start_)));
        cv_.WaitFor(&mu_, 1s);
      }
    });
  }
  ~Sampler() { Stop(); }
  void Stop() {
    {
      base::MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    if (thread_.joinable()) thread_.join();
  }
  Usage Now() { return Sample(gacd_->pid(), Seconds(Clock::now() - start_)); }
  std::vector<Usage> samples() {
    base::MutexLock lock(&mu_);
    return samples_;
  }

 private:
  Gacd* gacd_;
  Clock::time_point start_;
  base::Mutex mu_;
  base::CondVar cv_;
  bool stop_ GAC_GUARDED_BY(mu_) = false;
  std::vector<Usage> samples_ GAC_GUARDED_BY(mu_);
  std::thread thread_;
};

v1::StepRecord Record(const std::string& run, std::uint32_t rank, std::uint32_t world, std::int64_t step,
                      int layers) {
  v1::StepRecord r = testing::MakeStep(run, step, 0.01 * static_cast<double>(step % 40), rank, world);
  r.set_regime(step % 11 == 0 ? v1::REGIME_PROJECT : v1::REGIME_SAFE);
  r.set_mode(v1::CONTROL_MODE_REMOTE);
  r.set_staleness(4);
  (*r.mutable_scalars())["reward"] = 0.5;
  for (int i = 0; i < layers; ++i) {
    v1::LayerRecord* l = r.add_layers();
    l->set_name("model.layers." + std::to_string(i));
    l->set_cosine(0.02 * i);
    l->set_grad_norm(1.0 + i);
    l->set_ref_norm(1.0);
  }
  return r;
}

// ---- phase 1: load with a kill ----

struct Stream {
  std::string run;
  std::uint32_t rank = 0;
  std::unique_ptr<transport::Telemetry> telemetry;
  std::int64_t next_step = 0;
  std::vector<std::int64_t> accepted;  // producer thread only, read after join
  std::uint64_t refused = 0;
};

void LoadPhase(const Options& o, const ScratchDir& dir, Gacd& gacd, Sampler& sampler) {
  std::printf("load: %d streams (%d runs x %d ranks) at %.0f steps/s each with %d layers, %d Decide clients, "
              "%d queriers, /metrics every second, %.0f s, gacd killed at %.0f s\n",
              o.streams, o.streams / o.ranks, o.ranks, o.rate, o.layers, o.decide, o.queriers, o.seconds,
              o.kill_at);
  std::fflush(stdout);
  std::vector<Stream> streams(static_cast<std::size_t>(o.streams));
  for (int i = 0; i < o.streams; ++i) {
    Stream& s = streams[static_cast<std::size_t>(i)];
    s.run = "exp-load-" + std::to_string(i / o.ranks);
    s.rank = static_cast<std::uint32_t>(i % o.ranks);
    transport::TelemetryOptions t;
    t.address = gacd.address();
    t.token = testing::kWriterToken;
    t.spool_dir = dir.File("spool-" + std::to_string(i));
    t.backoff_initial = 50ms;
    t.backoff_max = 1000ms;
    auto started = transport::Telemetry::Start(t);
    if (!started.ok()) {
      Check(false, "telemetry starts: " + started.status().ToString());
      return;
    }
    s.telemetry = std::move(*started);
  }
  ErrorCounts errors;
  std::atomic<bool> running{true};
  const auto start = Clock::now();

  // Producers: 16 threads, each pacing its share of the streams.
  const int producers = std::min(16, o.streams);
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      const auto period = std::chrono::duration<double>(1.0 / o.rate);
      auto next = Clock::now();
      while (running.load()) {
        for (int i = p; i < o.streams; i += producers) {
          Stream& s = streams[static_cast<std::size_t>(i)];
          const std::int64_t step = s.next_step++;
          if (s.telemetry->Enqueue(Record(s.run, s.rank, static_cast<std::uint32_t>(o.ranks), step, o.layers))) {
            s.accepted.push_back(step);
          } else {
            ++s.refused;
          }
        }
        next += std::chrono::duration_cast<Clock::duration>(period);
        std::this_thread::sleep_until(next);
      }
    });
  }

  // Decide clients.
  base::Mutex lat_mu;
  std::vector<double> latencies;
  std::atomic<std::uint64_t> decided{0};
  for (int c = 0; c < o.decide; ++c) {
    threads.emplace_back([&, c] {
      transport::RemoteControllerOptions r;
      r.address = gacd.address();
      r.token = testing::kWriterToken;
      r.run = "exp-load-" + std::to_string(c % std::max(1, o.streams / o.ranks));
      r.rank = static_cast<std::uint32_t>(c);
      r.deadline = std::chrono::milliseconds(o.decide_deadline_ms);
      auto remote = transport::RemoteController::Create(r);
      if (!remote.ok()) return;
      std::vector<double> mine;
      const auto period = std::chrono::duration<double>(1.0 / o.decide_rate);
      auto next = Clock::now();
      for (std::int64_t step = 0; running.load(); ++step) {
        const auto t0 = Clock::now();
        base::StatusOr<controller::Decision> d = (*remote)->Decide(step, {0.3, 1.0, 1.0, step > 0});
        const double s = Seconds(Clock::now() - t0);
        if (d.ok()) {
          mine.push_back(s);
          decided.fetch_add(1);
        } else {
          errors.Add("Decide", base::StatusCodeName(d.status().code()));
        }
        next += std::chrono::duration_cast<Clock::duration>(period);
        std::this_thread::sleep_until(next);
      }
      base::MutexLock lock(&lat_mu);
      latencies.insert(latencies.end(), mine.begin(), mine.end());
    });
  }

  // /metrics every second.
  std::atomic<std::uint64_t> scrapes{0};
  threads.emplace_back([&] {
    auto next = Clock::now();
    while (running.load()) {
      const auto body = testing::HttpGet(gacd.metrics_address(), "/metrics");
      if (body && body->find("gac_ingest_rows_total") != std::string::npos) {
        scrapes.fetch_add(1);
      } else {
        errors.Add("/metrics", body ? "incomplete" : "no answer");
      }
      next += 1s;
      std::this_thread::sleep_until(next);
    }
  });

  // Queriers page through the history of the runs, with and without layers.
  std::atomic<std::uint64_t> pages{0};
  for (int q = 0; q < o.queriers; ++q) {
    threads.emplace_back([&, q] {
      Client client(gacd.address(), testing::kReaderToken);
      for (int pass = 0; running.load(); ++pass) {
        v1::GetStepsRequest req;
        req.set_run("exp-load-" + std::to_string((q + pass) % std::max(1, o.streams / o.ranks)));
        req.set_page_size(500);
        req.set_include_layers(pass % 2 == 0);
        while (running.load()) {
          v1::GetStepsResponse resp;
          const grpc::Status st = client.GetSteps(req, &resp);
          if (!st.ok()) {
            errors.Add("GetSteps", CodeName(st.error_code()));
            std::this_thread::sleep_for(200ms);
            break;
          }
          pages.fetch_add(1);
          if (resp.next_page_token().empty()) break;
          req.set_page_token(resp.next_page_token());
        }
        v1::ListRunsRequest runs;
        runs.set_page_size(7);
        v1::ListRunsResponse listed;
        const grpc::Status st = client.ListRuns(runs, &listed);
        if (!st.ok()) errors.Add("ListRuns", CodeName(st.error_code()));
      }
    });
  }

  // The fault: SIGKILL, then a restart on the same ports.
  double restart_seconds = -1;
  if (o.kill_at > 0) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(o.kill_at)));
    gacd.Kill();
    const auto t0 = Clock::now();
    if (!gacd.Start()) {
      Check(false, "gacd restarts after SIGKILL");
      running.store(false);
    }
    restart_seconds = Seconds(Clock::now() - t0);
    std::printf("  gacd killed with SIGKILL at %.1f s, serving again %.2f s later\n", Seconds(t0 - start),
                restart_seconds);
    std::fflush(stdout);
  }
  std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(o.seconds)));
  running.store(false);
  for (std::thread& t : threads) t.join();
  const double elapsed = Seconds(Clock::now() - start);

  std::uint64_t acked_in_load = 0;
  for (Stream& s : streams) acked_in_load += s.telemetry->counters().records_acknowledged;
  // Everything accepted reaches gacd.
  const auto flush_start = Clock::now();
  bool flushed = true;
  std::uint64_t accepted = 0, refused = 0, reconnects = 0, replayed = 0, acked = 0;
  for (Stream& s : streams) {
    flushed &= s.telemetry->Flush(120s);
    const transport::TelemetryCounters c = s.telemetry->counters();
    acked += c.records_acknowledged;
    reconnects += c.reconnects;
    replayed += c.records_replayed;
    if (c.records_rejected > 0) errors.Add("Ingest", "rejected records");
    accepted += s.accepted.size();
    refused += s.refused;
    s.telemetry->Close(0ms);
  }
  const double flush_seconds = Seconds(Clock::now() - flush_start);

  // Stored exactly once: every accepted step of every stream, nothing else.
  Client reader(gacd.address(), testing::kReaderToken);
  std::uint64_t missing = 0, extra = 0, layerless = 0, stored = 0;
  std::map<std::string, std::map<std::uint32_t, const Stream*>> by_run;
  for (const Stream& s : streams) by_run[s.run][s.rank] = &s;
  for (const auto& [run, ranks] : by_run) {
    std::vector<v1::StepRecord> recs;
    const grpc::Status st = reader.AllSteps(run, &recs, true);
    if (!st.ok()) {
      errors.Add("GetSteps (check)", CodeName(st.error_code()));
      ++missing;
      continue;
    }
    std::map<std::uint32_t, std::vector<std::int64_t>> got;
    for (const v1::StepRecord& r : recs) {
      got[r.rank()].push_back(r.step());
      if (r.layers_size() != o.layers) ++layerless;
    }
    stored += recs.size();
    for (const auto& [rank, s] : ranks) {
      std::vector<std::int64_t>& steps = got[rank];
      std::multiset<std::int64_t> have(steps.begin(), steps.end());
      for (std::int64_t step : s->accepted) {
        auto it = have.find(step);
        if (it == have.end()) {
          ++missing;
        } else {
          have.erase(it);
        }
      }
      extra += have.size();  // duplicates, or steps never accepted
    }
  }

  std::vector<double> lat;
  {
    base::MutexLock lock(&lat_mu);
    lat = latencies;
  }
  const double rows = static_cast<double>(acked_in_load) * (1.0 + o.layers);
  std::printf("  %.1f s of load, then %.1f s to flush what was queued and spooled\n", elapsed, flush_seconds);
  std::printf("  ingest: %llu step records accepted (%llu refused by full queues), %llu acknowledged during "
              "the load: %.0f records/s, %.0f rows/s with their layers; %llu acknowledged in all\n",
              static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(refused),
              static_cast<unsigned long long>(acked_in_load), static_cast<double>(acked_in_load) / elapsed,
              rows / elapsed, static_cast<unsigned long long>(acked));
  std::printf("  telemetry: %llu reconnects, %llu records replayed\n", static_cast<unsigned long long>(reconnects),
              static_cast<unsigned long long>(replayed));
  std::printf("  Decide: %llu answered, p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
              static_cast<unsigned long long>(decided.load()), 1e3 * Percentile(lat, 0.5), 1e3 * Percentile(lat, 0.99),
              lat.empty() ? NAN : 1e3 * *std::max_element(lat.begin(), lat.end()));
  std::printf("  /metrics: %llu scrapes; GetSteps: %llu pages\n", static_cast<unsigned long long>(scrapes.load()),
              static_cast<unsigned long long>(pages.load()));
  std::printf("  errors by code:\n%s", errors.Text().c_str());
  Check(flushed, "every accepted record acknowledged after the run");
  Check(missing == 0 && extra == 0,
        "every accepted step stored exactly once (" + std::to_string(stored) + " stored, " +
            std::to_string(missing) + " missing, " + std::to_string(extra) + " extra)");
  Check(layerless == 0, "every stored record has its layers");
  Check(refused == 0, "no record refused by a full queue");
  Check(decided.load() > 0 && !lat.empty(), "Decide answered");
  const std::vector<Usage> samples = sampler.samples();
  long peak = 0;
  for (const Usage& u : samples) peak = std::max(peak, u.rss_kib);
  std::printf("  gacd resident memory: peak %.1f MiB over %zu samples\n", peak / 1024.0, samples.size());
}

// ---- phase 2: many runs ----

int CountRunLabels(const std::string& exposition, const std::string& prefix) {
  std::set<std::string> runs;
  std::istringstream in(exposition);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("run=\"" + prefix);
    if (at == std::string::npos || line[0] == '#') continue;
    const auto end = line.find('"', at + 5);
    runs.insert(line.substr(at + 5, end - at - 5));
  }
  return static_cast<int>(runs.size());
}

void RunsPhase(const Options& o, const ScratchDir& dir, Gacd& gacd, Sampler& sampler) {
  std::printf("runs: %d distinct runs, at most %d exported\n", o.runs, o.max_runs_exported);
  std::fflush(stdout);
  const Usage before = sampler.Now();
  const auto start = Clock::now();
  constexpr int kSenders = 8;
  std::vector<std::unique_ptr<transport::Telemetry>> senders;
  for (int i = 0; i < kSenders; ++i) {
    transport::TelemetryOptions t;
    t.address = gacd.address();
    t.token = testing::kWriterToken;
    t.spool_dir = dir.File("runs-spool-" + std::to_string(i));
    auto s = transport::Telemetry::Start(t);
    if (!s.ok()) return Check(false, "telemetry starts");
    senders.push_back(std::move(*s));
  }
  long peak = before.rss_kib;
  for (int r = 0; r < o.runs; ++r) {
    for (std::int64_t step = 0; step < 3; ++step) {
      while (!senders[static_cast<std::size_t>(r % kSenders)]->Enqueue(
          Record("exp-many-" + std::to_string(r), 0, 1, step, 2))) {
        std::this_thread::sleep_for(1ms);  // the queue is full: let the sender catch up
      }
    }
    if (r % 1000 == 999) peak = std::max(peak, sampler.Now().rss_kib);
  }
  bool flushed = true;
  for (auto& s : senders) flushed &= s->Flush(120s);
  const double seconds = Seconds(Clock::now() - start);
  const auto body = testing::HttpGet(gacd.metrics_address(), "/metrics");
  const Usage after = sampler.Now();
  peak = std::max(peak, after.rss_kib);
  int listed = 0;
  Client reader(gacd.address(), testing::kReaderToken);
  v1::ListRunsRequest req;
  req.set_page_size(1000);
  for (;;) {
    v1::ListRunsResponse resp;
    if (!reader.ListRuns(req, &resp).ok()) break;
    for (const auto& run : resp.runs()) listed += run.run().rfind("exp-many-", 0) == 0;
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  const int exported = body ? CountRunLabels(*body, "exp-") : -1;
  std::printf("  %d runs stored in %.1f s; /metrics carries %d run labels; gacd resident memory %.1f -> %.1f MiB "
              "(peak %.1f)\n",
              listed, seconds, exported, before.rss_kib / 1024.0, after.rss_kib / 1024.0, peak / 1024.0);
  Check(flushed && listed == o.runs, "every run stored and listed");
  Check(exported >= 0 && exported <= o.max_runs_exported, "the run label bound holds on /metrics");
  // Bounded: the exported series are capped, so the growth is the store's
  // caches and the registry's small entries, not one series set per run.
  Check(after.rss_kib - before.rss_kib < 256 * 1024, "gacd's memory grows by less than 256 MiB");
}

// ---- phase 3: connection flood ----

void FloodPhase(const Options& o, Gacd& gacd, Sampler& sampler) {
  std::printf("flood: %d TCP connections at once (half start HTTP/2 and stall) and 200 gRPC channels\n", o.flood);
  std::fflush(stdout);
  rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  const Usage before = sampler.Now();
  const int port = std::atoi(gacd.address().substr(gacd.address().rfind(':') + 1).c_str());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> fds;
  int refused = 0;
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  for (int i = 0; i < o.flood; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      ++refused;
      continue;
    }
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ++refused;
      close(fd);
      continue;
    }
    if (i % 2 == 0) (void)!write(fd, kPreface, sizeof kPreface - 1);
    fds.push_back(fd);
  }
  // gRPC channels that each check health.
  std::vector<std::unique_ptr<Client>> channels;
  int healthy = 0;
  for (int i = 0; i < 200; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    channels.push_back(std::make_unique<Client>(gacd.address(), testing::kWriterToken,
                                                grpc::InsecureChannelCredentials(), args));
    grpc::health::v1::HealthCheckResponse h;
    healthy += channels.back()->Health(&h).ok();
  }
  const Usage during = sampler.Now();
  // Decide still answers, within its deadline.
  Client client(gacd.address(), testing::kWriterToken);
  std::vector<double> lat;
  int errors = 0;
  for (int i = 0; i < 200; ++i) {
    v1::DecideRequest d;
    d.set_run("exp-flood");
    d.set_step(i);
    v1::DecideResponse r;
    const auto t0 = Clock::now();
    if (client.Decide(d, &r).ok()) {
      lat.push_back(Seconds(Clock::now() - t0));
    } else {
      ++errors;
    }
  }
  for (int fd : fds) close(fd);
  channels.clear();
  // The connections' files are released (gacd notices the closes).
  Usage after = sampler.Now();
  for (int i = 0; i < 100 && after.fds > before.fds + 20; ++i) {
    std::this_thread::sleep_for(100ms);
    after = sampler.Now();
  }
  std::printf("  %zu connections open (%d refused), %d/200 channels healthy; gacd open files %d -> %d -> %d, "
              "memory %.1f -> %.1f MiB; Decide during the flood: p50 %.2f ms, p99 %.2f ms, %d errors\n",
              fds.size(), refused, healthy, before.fds, during.fds, after.fds, before.rss_kib / 1024.0,
              during.rss_kib / 1024.0, 1e3 * Percentile(lat, 0.5), 1e3 * Percentile(lat, 0.99), errors);
  Check(errors == 0 && healthy == 200, "gacd keeps serving during the flood");
  Check(after.fds <= before.fds + 20, "gacd's open files come back down");
}

// ---- phase 4: streams that never read ----

void StalledPhase(const Options& o, const ScratchDir& dir, Gacd& gacd, Sampler& sampler) {
  std::printf("stalled: %d ingest streams that write and never read their acks\n", o.stalled);
  std::fflush(stdout);
  const Usage before = sampler.Now();
  struct Stalled {
    std::unique_ptr<Client> client;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::atomic<std::uint64_t> written{0};
    std::thread thread;
  };
  std::vector<std::unique_ptr<Stalled>> stalled;
  for (int i = 0; i < o.stalled; ++i) {
    auto s = std::make_unique<Stalled>();
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // A plain HTTP/2 receive window (64 KiB): gRPC's bandwidth probing would
    // otherwise grow it and let the client's transport take megabytes of
    // acks that the application never reads.
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    s->client = std::make_unique<Client>(gacd.address(), testing::kWriterToken, grpc::InsecureChannelCredentials(), args);
    s->ctx = s->client->Context(600000);
    Stalled* raw = s.get();
    s->thread = std::thread([raw, i] {
      auto stream = raw->client->ingest().Ingest(raw->ctx.get());
      for (std::uint64_t b = 1;; ++b) {
        // One record per batch: many small acks, so the acks fill the
        // client's receive window early.
        const v1::IngestRequest batch = testing::MakeBatch(
            b, {testing::MakeStep("exp-stalled-" + std::to_string(i), static_cast<std::int64_t>(b))});
        if (!stream->Write(batch)) break;  // blocks once flow control is exhausted
        raw->written.fetch_add(1);
      }
      stream->Finish();
    });
    stalled.push_back(std::move(s));
  }
  auto total = [&] {
    std::uint64_t n = 0;
    for (auto& s : stalled) n += s->written.load();
    return n;
  };
  // The writers run until flow control holds them: the count stops moving.
  const auto start = Clock::now();
  std::uint64_t last = 0, held = 0;
  int still = 0;
  while (still < 3 && Clock::now() - start < 120s) {
    std::this_thread::sleep_for(1s);
    held = total();
    still = held == last ? still + 1 : 0;
    last = held;
  }
  const double held_after = Seconds(Clock::now() - start);
  const Usage mid = sampler.Now();
  const Usage self = Sample(getpid(), 0);
  // Meanwhile an ordinary sender is served.
  transport::TelemetryOptions t;
  t.address = gacd.address();
  t.token = testing::kWriterToken;
  t.spool_dir = dir.File("stalled-spool");
  auto normal = transport::Telemetry::Start(t);
  bool served = normal.ok();
  if (served) {
    for (int s = 0; s < 100; ++s) (*normal)->Enqueue(testing::MakeStep("exp-beside-stalled", s));
    served = (*normal)->Flush(30s);
    (*normal)->Close(0ms);
  }
  std::this_thread::sleep_for(3s);
  const std::uint64_t later = total();
  const Usage late = sampler.Now();
  for (auto& s : stalled) s->ctx->TryCancel();
  for (auto& s : stalled) s->thread.join();
  std::printf("  held by flow control after %.0f s at %llu batches (%.0f per stream), %llu later; gacd memory "
              "%.1f -> %.1f -> %.1f MiB (anonymous %.1f -> %.1f -> %.1f MiB)\n",
              held_after, static_cast<unsigned long long>(held), static_cast<double>(held) / std::max(1, o.stalled),
              static_cast<unsigned long long>(later), before.rss_kib / 1024.0, mid.rss_kib / 1024.0,
              late.rss_kib / 1024.0, before.anon_kib / 1024.0, mid.anon_kib / 1024.0, late.anon_kib / 1024.0);
  // The unread acks wait in the writers' own receive buffers, not in gacd
  // (which keeps at most 64 a stream).
  std::printf("  the writers' own process (holding the unread acks): %.1f MiB anonymous\n", self.anon_kib / 1024.0);
  // What gacd took on for them: before gacd stopped growing its HTTP/2
  // receive windows by bandwidth probing (server.cc), 7 to 14 MiB a stream
  // with 8 of them and 28 MiB with 64; about 1 MiB since.
  const double per_stream_mib =
      static_cast<double>(mid.anon_kib - before.anon_kib) / 1024.0 / static_cast<double>(std::max(1, o.stalled));
  std::printf("  gacd's anonymous memory per stalled stream: %.2f MiB\n", per_stream_mib);
  Check(still >= 3 && later == held, "the writers that never read are held back by flow control");
#if defined(__SANITIZE_ADDRESS__) || GAC_LOAD_HAS_ASAN
  // ASan's redzones and its quarantine of freed memory (256 MiB by default)
  // make gacd's memory say nothing about its buffers; the batch count above
  // (held at the same ~7,600 a stream as in Release) still checks the bound.
  std::printf("  (the 3 MiB per stream check is left to builds without AddressSanitizer)\n");
#else
  Check(per_stream_mib <= 3.0, "gacd holds at most 3 MiB for each stream that never reads");
#endif
  Check(late.rss_kib <= mid.rss_kib + 16 * 1024, "gacd's memory stays flat while they stall");
  Check(served, "an ordinary sender is served beside them");
}

int Main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 2;
  signal(SIGPIPE, SIG_IGN);
  ScratchDir dir;
  Gacd gacd(dir, o);
  if (!gacd.Start()) return 1;
  Sampler sampler(&gacd);
  const auto start = Clock::now();
  if (o.seconds > 0) LoadPhase(o, dir, gacd, sampler);
  if (o.runs > 0) RunsPhase(o, dir, gacd, sampler);
  if (o.flood > 0) FloodPhase(o, gacd, sampler);
  if (o.stalled > 0) StalledPhase(o, dir, gacd, sampler);
  sampler.Stop();
  const int rc = gacd.Terminate();
  Check(rc == 0, "gacd ends cleanly on SIGTERM (status " + std::to_string(rc) + ")");
  const std::vector<Usage> samples = sampler.samples();
  if (!o.csv.empty()) {
    std::ofstream out(o.csv);
    out << "seconds,gacd_rss_mib,gacd_open_files\n";
    for (const Usage& u : samples) out << u.t << "," << u.rss_kib / 1024.0 << "," << u.fds << "\n";
  }
  std::printf("gacd resident memory over time (MiB, one sample every 10 s):");
  for (std::size_t i = 0; i < samples.size(); i += 10) std::printf(" %.0f", samples[i].rss_kib / 1024.0);
  std::printf("\n%s after %.0f s: %d check(s) failed\n", failures.load() == 0 ? "PASSED" : "FAILED",
              Seconds(Clock::now() - start), failures.load());
  if (failures.load() != 0) std::printf("gacd's log:\n%s\n", gacd.Log().c_str());
  return failures.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gac::load

int main(int argc, char** argv) { return gac::load::Main(argc, argv); }
