// server_bench: gacd's ingest rate, Decide latency and /metrics render time,
// each against a baseline measured in the same process, reported as ratios
// (see docs/BENCHMARKS.md and its "Targets").
//
//   server_bench [--quick] [--seconds S] [--streams LIST] [--clients LIST] [--json]
//   server_bench --store=postgresql://... [--replicas LIST] [the flags above]
//
// 1. Ingest. N concurrent Ingest streams (default N = 1, 4, 16; one channel,
//    hence one connection, per stream, as N agents would have) send batches
//    of step records with 100 layers each to an in-process gacd on SQLite in
//    a scratch directory, keeping up to kWindow batches unacknowledged per
//    stream. The rate is rows (step + layer rows) acknowledged per second
//    over a window that starts after a warm-up; it is measured for
//    --sync full and normal, each on a fresh database. At the end of each
//    configuration every acknowledgement is checked, and the store must hold
//    exactly the step records sent (GetRun().step_records): a lost or
//    duplicated row fails the benchmark. Baseline: the same rows inserted
//    with the sqlite3 C API directly (WAL, the same two WITHOUT ROWID tables
//    and index as gacd's schema, prepared INSERT OR IGNORE statements, one
//    transaction per batch, the same PRAGMA synchronous), measured just
//    before and just after the gacd runs of that sync mode; a second one
//    with kBigTxnBatches batches per transaction shows the ceiling that
//    gacd's group commit can approach.
// 2. Decide latency. C closed-loop clients (default C = 1, 16, 64), all on
//    gRPC's callback client API (no thread per client), on one channel per
//    group, call ControlService.Decide; the baseline is an echo service
//    (grpc::CallbackGenericService) on its own in-process server, called the
//    same way with a payload of the same bytes. Both go through one
//    grpc::GenericStub with identical channel arguments, so the client side
//    is the same code; measurement rounds alternate between the two.
//    Between the two, gacd's SQLite store alone (Store::Apply from one
//    thread, one batch per transaction, no gRPC) shows where the time goes.
// 3. /metrics. A Metrics with per-layer series on is filled to >= 10,000
//    series; Render() is timed (median), and so is a plain HTTP GET of the
//    same data from an in-process gacd's exporter. ObserveStep, the
//    exporter's cost per ingested record, is timed against the time a row
//    may take at the ingest target.
//
// With --store=postgresql://USER@HOST:PORT/DB (the password from the URI or
// PGPASSWORD) it measures the PostgreSQL store instead, in schemas of its own
// that it drops at the end:
// 1. Ingest as above into gacd on PostgreSQL, with one and with two gacd
//    replicas (--replicas; streams alternate between them) sharing the
//    database; baseline: the same rows written by one connection with COPY
//    (binary) into tables of gacd's shape (keys and index), 1 and 16 batches
//    per transaction, measured before and after the gacd runs.
// 2. Decide latency of a gacd on PostgreSQL against a gacd on SQLite, called
//    the same way in alternating rounds (Decide reads only memory; the ratio
//    should stay near 1).
//
// This is a benchmark, not a test: it asserts nothing about timing. It exits
// non-zero when rows are lost, an RPC fails, or a measurement is invalid.
#include <sqlite3.h>
#include <sys/resource.h>
#include <unistd.h>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <libpq-fe.h>

#include "bench/bench_util.h"
#include "gac/server/config.h"
#include "gac/server/server.h"
#include "gac/server/store.h"
#include "gac/v1/control.grpc.pb.h"
#include "gac/v1/telemetry.grpc.pb.h"
#include "server/src/metrics.h"
#include "server/src/store/postgres_codec.h"

namespace {

namespace v1 = gac::v1;
using Clock = std::chrono::steady_clock;
using gac::bench::CpuModel;
using gac::bench::FlagValue;
using gac::bench::Median;
using gac::bench::Seconds;
using gac::server::GacServer;
using gac::server::ServerConfig;

// Workload shape of the ingest measurement.
constexpr int kLayers = 100;         // layer rows per step record
constexpr int kRecordsPerBatch = 8;  // step records per IngestRequest
constexpr int kWindow = 8;           // batches in flight (sent, not acknowledged) per stream
constexpr std::int64_t kRowsPerRecord = 1 + kLayers;
constexpr std::int64_t kRowsPerBatch = kRecordsPerBatch * kRowsPerRecord;
// Batches per transaction of the second raw SQLite baseline (about what
// gacd's group commit gathers with a few streams).
constexpr int kBigTxnBatches = 16;

// Targets of docs/BENCHMARKS.md.
constexpr double kIngestTarget = 200e3;  // rows/s
constexpr double kDecideRatioTarget = 1.5;
constexpr double kMetricsTargetMs = 50.0;
constexpr std::size_t kMetricsSeries = 10'000;

constexpr char kDecideMethod[] = "/gac.v1.ControlService/Decide";
constexpr char kEchoMethod[] = "/bench.Echo/Echo";


// The q-quantile (nearest rank) of sorted `v`.
double Quantile(const std::vector<double>& v, double q) {
  if (v.empty()) return std::nan("");
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// Process CPU time (user + system), seconds.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// The scratch directory, removed by Fail as well as at a normal exit.
std::string g_scratch;

void RemoveScratch() {
  if (g_scratch.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(g_scratch, ec);
  g_scratch.clear();
}

[[noreturn]] void Fail(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "server_bench: FAILED: %s\n", what.c_str());
  RemoveScratch();
  std::_Exit(1);  // servers and reactors may still be running: skip destructors
}

// ---------------------------------------------------------------------------
// Command line.

struct Args {
  bool quick = false;
  bool json = false;
  double seconds = 0;  // measured seconds per configuration; 0: 5, or 0.4 with --quick
  std::vector<int> streams = {1, 4, 16};
  std::vector<int> clients = {1, 16, 64};
  std::string store;               // a postgresql:// URI: measure the PostgreSQL store
  std::vector<int> replicas = {1, 2};
};

[[noreturn]] void Usage(const char* argv0, int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: %s [--quick] [--seconds S] [--streams LIST] [--clients LIST] [--json]\n"
               "  --quick          smoke run of a few seconds (figures are not meaningful)\n"
               "  --seconds S      measured seconds per configuration (default 5; 0.4 with --quick)\n"
               "  --streams LIST   concurrent ingest streams, comma-separated (default 1,4,16)\n"
               "  --clients LIST   concurrent Decide clients, comma-separated (default 1,16,64)\n"
               "  --json           also print the figures as one JSON object on the last line\n"
               "  --store URI      measure gacd on PostgreSQL (postgresql://USER@HOST:PORT/DB; password\n"
               "                   in the URI or PGPASSWORD) against raw COPY and a gacd on SQLite\n"
               "  --replicas LIST  with --store: gacd replicas sharing the database (default 1,2)\n",
               argv0);
  std::exit(code);
}

std::vector<int> ParseList(const char* argv0, const char* flag, const char* value) {
  if (value == nullptr) Usage(argv0, 2);
  std::vector<int> out;
  std::stringstream ss(value);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1024) {
      std::fprintf(stderr, "%s: %s needs integers in 1..1024, got '%s'\n", argv0, flag, value);
      std::exit(2);
    }
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) Usage(argv0, 2);
  return out;
}

double ParseSeconds(const char* argv0, const char* value) {
  if (value == nullptr) Usage(argv0, 2);
  char* end = nullptr;
  const double v = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(v >= 0.1 && v <= 600)) {
    std::fprintf(stderr, "%s: --seconds needs a number in [0.1, 600], got '%s'\n", argv0, value);
    std::exit(2);
  }
  return v;
}

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* value = nullptr;
    if (a == "--quick") {
      args.quick = true;
    } else if (a == "--json") {
      args.json = true;
    } else if (FlagValue(argc, argv, &i, "--seconds", &value)) {
      args.seconds = ParseSeconds(argv[0], value);
    } else if (FlagValue(argc, argv, &i, "--streams", &value)) {
      args.streams = ParseList(argv[0], "--streams", value);
    } else if (FlagValue(argc, argv, &i, "--clients", &value)) {
      args.clients = ParseList(argv[0], "--clients", value);
    } else if (FlagValue(argc, argv, &i, "--store", &value)) {
      if (value == nullptr || !gac::server::IsPostgresUri(value)) {
        std::fprintf(stderr, "%s: --store needs a postgresql:// URI\n", argv[0]);
        std::exit(2);
      }
      args.store = value;
    } else if (FlagValue(argc, argv, &i, "--replicas", &value)) {
      args.replicas = ParseList(argv[0], "--replicas", value);
    } else if (a == "--help" || a == "-h") {
      Usage(argv[0], 0);
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a.c_str());
      Usage(argv[0], 2);
    }
  }
  if (args.seconds == 0) args.seconds = args.quick ? 0.4 : 5.0;
  return args;
}

// ---------------------------------------------------------------------------
// Results: the summary table and the JSON object.

struct Line {
  std::string what, value, baseline, ratio, target;
  bool pass;
};

class Report {
 public:
  void Add(Line line) { lines_.push_back(std::move(line)); }
  void Json(const std::string& key, double value) {
    json_ += Format("%s\"%s\":%.6g", json_.empty() ? "" : ",", key.c_str(), std::isfinite(value) ? value : -1.0);
  }

  void PrintTable() const {
    const char* headers[] = {"measurement", "value", "baseline", "ratio", "target", "verdict"};
    std::size_t w[5] = {};
    for (int c = 0; c < 5; ++c) w[c] = std::strlen(headers[c]);
    for (const Line& l : lines_) {
      const std::string* cols[] = {&l.what, &l.value, &l.baseline, &l.ratio, &l.target};
      for (int c = 0; c < 5; ++c) w[c] = std::max(w[c], cols[c]->size());
    }
    auto row = [&](const std::string* cols[5], const char* verdict) {
      std::printf("  %-*s  %*s  %-*s  %*s  %-*s  %s\n", static_cast<int>(w[0]), cols[0]->c_str(),
                  static_cast<int>(w[1]), cols[1]->c_str(), static_cast<int>(w[2]), cols[2]->c_str(),
                  static_cast<int>(w[3]), cols[3]->c_str(), static_cast<int>(w[4]), cols[4]->c_str(), verdict);
    };
    std::string h[5];
    for (int c = 0; c < 5; ++c) h[c] = headers[c];
    const std::string* hp[5] = {&h[0], &h[1], &h[2], &h[3], &h[4]};
    row(hp, headers[5]);
    for (const Line& l : lines_) {
      const std::string* cols[5] = {&l.what, &l.value, &l.baseline, &l.ratio, &l.target};
      row(cols, l.pass ? "PASS" : "MISS");
    }
  }

  void PrintJson() const { std::printf("{%s}\n", json_.c_str()); }

 private:
  std::vector<Line> lines_;
  std::string json_;
};

std::string Rate(double rows_per_s) { return Format("%.1f k rows/s", rows_per_s / 1e3); }

// ---------------------------------------------------------------------------
// Records.

std::vector<std::string> LayerNames(int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back(Format("model.layers.%d.mlp.weight", i));
  return names;
}

std::int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A record as an agent with per-layer telemetry sends it.
void FillRecord(v1::StepRecord* r, const std::string& run, std::uint32_t rank, std::uint32_t world,
                std::int64_t step, const std::vector<std::string>& layers) {
  r->Clear();
  r->set_run(run);
  r->set_rank(rank);
  r->set_world_size(world);
  r->set_step(step);
  r->set_cosine(0.01 + 1e-6 * static_cast<double>(step % 1000));
  r->set_grad_norm(1.5);
  r->set_ref_norm(2.5);
  r->set_regime(v1::REGIME_SAFE);
  r->set_alpha(1.0);
  r->set_wall_time_ns(WallNs());
  r->set_agent_overhead_seconds(2e-6);
  r->set_mode(v1::CONTROL_MODE_LOCAL);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    v1::LayerRecord* l = r->add_layers();
    l->set_name(layers[i]);
    l->set_cosine(0.02 + 1e-4 * static_cast<double>(i));
    l->set_grad_norm(0.1 + 1e-3 * static_cast<double>(i));
    l->set_ref_norm(0.2);
  }
}

// ---------------------------------------------------------------------------
// Scratch space and servers.

std::string MakeScratchDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gac-server-bench-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) Fail("cannot create a scratch directory: " + std::string(std::strerror(errno)));
  return tmpl;
}

std::unique_ptr<GacServer> StartGacd(const ServerConfig& config) {
  auto server = GacServer::Start(config);
  if (!server.ok()) Fail("cannot start gacd: " + server.status().ToString());
  return std::move(*server);
}

ServerConfig BaseConfig() {
  ServerConfig c;
  c.listen = "127.0.0.1:0";
  c.metrics_listen = "";
  c.insecure = true;
  c.drain_timeout = std::chrono::seconds(2);
  return c;
}

// Channel arguments of every client channel: a subchannel pool of its own,
// so that each channel gets its own connection.
grpc::ChannelArguments ClientArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(8 << 20);
  return args;
}

std::shared_ptr<grpc::Channel> Connect(const std::string& address) {
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), ClientArgs());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    Fail("cannot connect to " + address);
  }
  return channel;
}

// The value of an unlabelled sample `name` in a text exposition, or NaN.
double ScrapeValue(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const auto pos = text.find(key);
  if (pos == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + pos + key.size(), nullptr);
}

// Lines of a text exposition that are samples (not comments or blank).
std::size_t CountSeries(const std::string& text) {
  std::size_t n = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start && text[start] != '#') ++n;
    start = end + 1;
  }
  return n;
}

// Counts down to zero; Wait returns then (or false at the deadline).
class Latch {
 public:
  explicit Latch(int count) : count_(count) {}
  void CountDown() {
    std::lock_guard lock(mu_);
    if (--count_ == 0) cv_.notify_all();
  }
  bool WaitFor(std::chrono::seconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
};

// ---------------------------------------------------------------------------
// 1. Ingest.

// Acknowledged totals of every stream of one configuration.
struct IngestTotals {
  std::atomic<std::int64_t> rows{0};  // step + layer rows of acknowledged, newly stored records
};

// One agent's ingest stream: sends batches of kRecordsPerBatch records of
// one (run, rank), consecutive steps, with at most kWindow unacknowledged,
// until StopSending; then half-closes and reads the remaining acks.
// Reactions decide under mu_ and start operations after releasing it.
class IngestStream final : public grpc::ClientBidiReactor<v1::IngestRequest, v1::IngestAck> {
 public:
  IngestStream(v1::IngestService::Stub* stub, std::string run, std::uint32_t rank, std::uint32_t world,
               const std::vector<std::string>* layers, IngestTotals* totals, Latch* done)
      : run_(std::move(run)), rank_(rank), world_(world), totals_(totals), done_(done) {
    request_.mutable_records()->Reserve(kRecordsPerBatch);
    for (int i = 0; i < kRecordsPerBatch; ++i) FillRecord(request_.add_records(), run_, rank_, world_, 0, *layers);
    stub->async()->Ingest(&ctx_, this);
  }

  void Start() {
    StartRead(&ack_);
    Pump();
    StartCall();
  }

  void StopSending() {
    stop_.store(true);
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      if (!ok) broken_ = true;  // the stream failed; OnDone reports why
    }
    Pump();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the server finished the stream; OnDone follows
    {
      std::lock_guard lock(mu_);
      ++acked_batches_;
      if (!error_.empty()) {
        // Keep the first error.
      } else if (ack_.sequence() != acked_batches_) {
        error_ = Format("ack %llu out of order (expected %llu)", static_cast<unsigned long long>(ack_.sequence()),
                        static_cast<unsigned long long>(acked_batches_));
      } else if (ack_.stored() != kRecordsPerBatch || ack_.duplicates() != 0) {
        error_ = Format("ack %llu: stored %u, duplicates %u (expected %d new)",
                        static_cast<unsigned long long>(ack_.sequence()), ack_.stored(), ack_.duplicates(),
                        kRecordsPerBatch);
      }
      acked_records_ += ack_.stored();
      --unacked_;
    }
    totals_->rows.fetch_add(static_cast<std::int64_t>(ack_.stored()) * kRowsPerRecord, std::memory_order_relaxed);
    StartRead(&ack_);
    Pump();
  }

  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard lock(mu_);
      status_ = status;
    }
    done_->CountDown();  // last: the owner may destroy this stream now
  }

  // After OnDone: "" when the stream ended cleanly with every batch acknowledged.
  std::string Check() const {
    if (!status_.ok()) {
      return Format("stream %s/%u ended with %d: %s", run_.c_str(), rank_, static_cast<int>(status_.error_code()),
                    status_.error_message().c_str());
    }
    if (!error_.empty()) return "stream " + run_ + "/" + std::to_string(rank_) + ": " + error_;
    if (acked_batches_ != sent_batches_) {
      return Format("stream %s/%u: %llu batches sent, %llu acknowledged", run_.c_str(), rank_,
                    static_cast<unsigned long long>(sent_batches_), static_cast<unsigned long long>(acked_batches_));
    }
    return "";
  }
  std::uint64_t sent_records() const { return sent_batches_ * kRecordsPerBatch; }
  std::uint64_t acked_records() const { return acked_records_; }

 private:
  // Starts the next write or the half-close when the stream allows it.
  void Pump() {
    enum { kNothing, kWrite, kWritesDone } action = kNothing;
    {
      std::lock_guard lock(mu_);
      if (writing_ || writes_done_ || broken_) return;
      if (stop_.load()) {
        writes_done_ = true;
        action = kWritesDone;
      } else if (unacked_ < kWindow) {
        writing_ = true;
        ++unacked_;
        action = kWrite;
      }
    }
    if (action == kWritesDone) {
      StartWritesDone();
    } else if (action == kWrite) {
      // request_ and the counters below belong to the one write in flight.
      ++sent_batches_;
      request_.set_sequence(sent_batches_);
      const std::int64_t first = static_cast<std::int64_t>(sent_batches_ - 1) * kRecordsPerBatch;
      const std::int64_t now = WallNs();
      for (int i = 0; i < kRecordsPerBatch; ++i) {
        v1::StepRecord* r = request_.mutable_records(i);
        r->set_step(first + i);
        r->set_wall_time_ns(now);
      }
      StartWrite(&request_);
    }
  }

  const std::string run_;
  const std::uint32_t rank_, world_;
  IngestTotals* const totals_;
  Latch* const done_;
  grpc::ClientContext ctx_;
  std::atomic<bool> stop_{false};

  // Owned by the write in flight (writing_).
  v1::IngestRequest request_;
  std::uint64_t sent_batches_ = 0;
  // Owned by the read in flight.
  v1::IngestAck ack_;

  std::mutex mu_;
  int unacked_ = 0;  // guarded by mu_
  bool writing_ = false;
  bool writes_done_ = false;
  bool broken_ = false;
  std::uint64_t acked_batches_ = 0;
  std::uint64_t acked_records_ = 0;
  std::string error_;
  grpc::Status status_;
};

struct IngestResult {
  double rows_per_s = 0;
  double window_s = 0;
  double cpu_util = 0;           // process CPU seconds per wall second in the window
  double mean_txn_rows = 0;      // rows per store transaction (group commit)
  double writer_busy = 0;        // fraction of the run's wall time inside Store::Apply
  std::uint64_t records = 0;     // step records stored (verified)
};

// `streams` streams of one run into gacd replicas started from `configs`
// (stream i goes to replica i mod replicas), which share one store.
IngestResult RunIngest(const std::vector<ServerConfig>& configs, const std::string& run, int streams, double warmup,
                       double seconds) {
  std::vector<std::unique_ptr<GacServer>> servers;
  for (const ServerConfig& c : configs) servers.push_back(StartGacd(c));
  const std::vector<std::string> layers = LayerNames(kLayers);

  IngestTotals totals;
  Latch done(streams);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::IngestService::Stub>> stubs;
  std::vector<std::unique_ptr<IngestStream>> reactors;
  for (int i = 0; i < streams; ++i) {
    channels.push_back(Connect(servers[static_cast<std::size_t>(i) % servers.size()]->address()));
    stubs.push_back(v1::IngestService::NewStub(channels.back()));
    reactors.push_back(std::make_unique<IngestStream>(stubs.back().get(), run, static_cast<std::uint32_t>(i),
                                                      static_cast<std::uint32_t>(streams), &layers, &totals, &done));
  }
  const auto start = Clock::now();
  for (auto& r : reactors) r->Start();
  std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
  const auto t0 = Clock::now();
  const double cpu0 = CpuSeconds();
  const std::int64_t rows0 = totals.rows.load();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const std::int64_t rows1 = totals.rows.load();
  const auto t1 = Clock::now();
  const double cpu1 = CpuSeconds();
  for (auto& r : reactors) r->StopSending();
  if (!done.WaitFor(std::chrono::seconds(60))) Fail("ingest streams did not finish within 60 s");
  const double total_s = Seconds(start, Clock::now());

  IngestResult result;
  std::uint64_t sent = 0, acked = 0;
  for (auto& r : reactors) {
    const std::string error = r->Check();
    if (!error.empty()) Fail("ingest: " + error);
    sent += r->sent_records();
    acked += r->acked_records();
  }
  for (const auto& server : servers) {
    auto info = server->store().GetRun(run);
    if (!info.ok()) Fail("ingest: GetRun(" + run + "): " + info.status().ToString());
    if (info->step_records() != sent || acked != sent) {
      Fail(Format("ingest: rows lost: %llu step records sent, %llu acknowledged, %llu in the store",
                  static_cast<unsigned long long>(sent), static_cast<unsigned long long>(acked),
                  static_cast<unsigned long long>(info->step_records())));
    }
  }
  // Transactions and writer time of every replica (the writer-busy share is
  // per replica).
  double txns = 0, apply_s = 0;
  for (const auto& server : servers) {
    const std::string text = server->metrics().Render();
    txns += ScrapeValue(text, "gac_store_write_seconds_count");
    apply_s += ScrapeValue(text, "gac_store_write_seconds_sum");
  }
  for (const auto& server : servers) server->Shutdown(std::chrono::milliseconds(0));
  apply_s /= static_cast<double>(servers.size());

  result.window_s = Seconds(t0, t1);
  result.rows_per_s = static_cast<double>(rows1 - rows0) / result.window_s;
  result.cpu_util = (cpu1 - cpu0) / result.window_s;
  result.mean_txn_rows = txns > 0 ? static_cast<double>(sent) * kRowsPerRecord / txns : std::nan("");
  result.writer_busy = apply_s / total_s;
  result.records = sent;
  return result;
}

// The raw SQLite baseline: the rows of RunIngest, written by one thread with
// the C API into gacd's two row tables, `batches_per_txn` batches of
// kRecordsPerBatch records per transaction.
class RawSqlite {
 public:
  RawSqlite(const std::string& path, const std::string& sync, int batches_per_txn)
      : batches_per_txn_(batches_per_txn) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
      Fail("raw SQLite: cannot open " + path);
    }
    // The write connection's settings of gacd's store (sqlite_store.cc).
    Exec("PRAGMA journal_mode = WAL");
    Exec("PRAGMA synchronous = " + sync);
    Exec("PRAGMA cache_size = -32768; PRAGMA journal_size_limit = 67108864; PRAGMA temp_store = MEMORY");
    Exec(
        "CREATE TABLE steps (run_id INTEGER NOT NULL, step INTEGER NOT NULL, rank INTEGER NOT NULL, "
        "world_size INTEGER NOT NULL, cosine, grad_norm NOT NULL, ref_norm NOT NULL, regime INTEGER NOT NULL, "
        "alpha NOT NULL, cosine_after, staleness INTEGER, wall_time_ns INTEGER NOT NULL, overhead_s NOT NULL, "
        "mode INTEGER NOT NULL, fallback INTEGER NOT NULL, received_ns INTEGER NOT NULL, "
        "PRIMARY KEY (run_id, step, rank)) WITHOUT ROWID;"
        "CREATE INDEX steps_by_rank ON steps (run_id, rank, step);"
        "CREATE TABLE layers (run_id INTEGER NOT NULL, step INTEGER NOT NULL, rank INTEGER NOT NULL, "
        "name TEXT NOT NULL, idx INTEGER NOT NULL, cosine, grad_norm NOT NULL, ref_norm NOT NULL, "
        "PRIMARY KEY (run_id, step, rank, name)) WITHOUT ROWID;");
    begin_ = Prepare("BEGIN IMMEDIATE");
    commit_ = Prepare("COMMIT");
    step_ = Prepare(
        "INSERT OR IGNORE INTO steps (run_id, step, rank, world_size, cosine, grad_norm, ref_norm, regime, alpha, "
        "cosine_after, staleness, wall_time_ns, overhead_s, mode, fallback, received_ns) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    layer_ = Prepare(
        "INSERT OR IGNORE INTO layers (run_id, step, rank, name, idx, cosine, grad_norm, ref_norm) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  }
  ~RawSqlite() {
    for (sqlite3_stmt* s : {begin_, commit_, step_, layer_}) sqlite3_finalize(s);
    sqlite3_close_v2(db_);
  }

  // Inserts batches for warmup + seconds; returns rows/s over the last `seconds`.
  double Run(double warmup, double seconds) {
    const auto start = Clock::now();
    Clock::time_point t0;
    std::int64_t rows0 = -1;
    for (;;) {
      const auto now = Clock::now();
      const double elapsed = Seconds(start, now);
      if (rows0 < 0 && elapsed >= warmup) {
        t0 = now;
        rows0 = rows_;
      }
      if (rows0 >= 0 && Seconds(t0, now) >= seconds) return static_cast<double>(rows_ - rows0) / Seconds(t0, now);
      Transaction();
    }
  }

 private:
  void Exec(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      const std::string msg = err != nullptr ? err : "?";
      sqlite3_free(err);
      Fail("raw SQLite: " + sql + ": " + msg);
    }
  }
  sqlite3_stmt* Prepare(const char* sql) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, nullptr) != SQLITE_OK) {
      Fail(std::string("raw SQLite: prepare: ") + sqlite3_errmsg(db_));
    }
    return s;
  }
  void Step(sqlite3_stmt* s) {
    const int rc = sqlite3_step(s);
    if (rc != SQLITE_DONE) Fail(std::string("raw SQLite: step: ") + sqlite3_errmsg(db_));
    sqlite3_reset(s);
  }

  // One transaction: batches_per_txn_ * kRecordsPerBatch step rows with
  // kLayers layer rows each.
  void Transaction() {
    Step(begin_);
    const std::int64_t now = WallNs();
    for (int i = 0; i < batches_per_txn_ * kRecordsPerBatch; ++i, ++step_index_) {
      const std::int64_t step = step_index_;
      sqlite3_bind_int64(step_, 1, 1);
      sqlite3_bind_int64(step_, 2, step);
      sqlite3_bind_int64(step_, 3, 0);
      sqlite3_bind_int64(step_, 4, 1);
      sqlite3_bind_double(step_, 5, 0.01 + 1e-6 * static_cast<double>(step % 1000));
      sqlite3_bind_double(step_, 6, 1.5);
      sqlite3_bind_double(step_, 7, 2.5);
      sqlite3_bind_int64(step_, 8, v1::REGIME_SAFE);
      sqlite3_bind_double(step_, 9, 1.0);
      sqlite3_bind_null(step_, 10);
      sqlite3_bind_null(step_, 11);
      sqlite3_bind_int64(step_, 12, now);
      sqlite3_bind_double(step_, 13, 2e-6);
      sqlite3_bind_int64(step_, 14, v1::CONTROL_MODE_LOCAL);
      sqlite3_bind_int64(step_, 15, 0);
      sqlite3_bind_int64(step_, 16, now);
      Step(step_);
      for (int l = 0; l < kLayers; ++l) {
        const std::string& name = layers_[static_cast<std::size_t>(l)];
        sqlite3_bind_int64(layer_, 1, 1);
        sqlite3_bind_int64(layer_, 2, step);
        sqlite3_bind_int64(layer_, 3, 0);
        sqlite3_bind_text(layer_, 4, name.data(), static_cast<int>(name.size()), SQLITE_STATIC);
        sqlite3_bind_int64(layer_, 5, l);
        sqlite3_bind_double(layer_, 6, 0.02 + 1e-4 * l);
        sqlite3_bind_double(layer_, 7, 0.1 + 1e-3 * l);
        sqlite3_bind_double(layer_, 8, 0.2);
        Step(layer_);
      }
    }
    Step(commit_);
    rows_ += batches_per_txn_ * kRowsPerBatch;
  }

  const int batches_per_txn_;
  const std::vector<std::string> layers_ = LayerNames(kLayers);
  sqlite3* db_ = nullptr;
  sqlite3_stmt* begin_ = nullptr;
  sqlite3_stmt* commit_ = nullptr;
  sqlite3_stmt* step_ = nullptr;
  sqlite3_stmt* layer_ = nullptr;
  std::int64_t step_index_ = 0;
  std::int64_t rows_ = 0;
};

double RawSqliteRate(const std::string& path, const std::string& sync, int batches_per_txn, double warmup,
                     double seconds) {
  double rate = 0;
  {
    RawSqlite raw(path, sync, batches_per_txn);
    rate = raw.Run(warmup, seconds);
  }
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix, ec);
  return rate;
}

// The store alone: gacd's SQLite store written through Store::Apply by one
// thread, one batch of the gacd runs' rows per transaction, without gRPC, the
// writer or the metrics. Between gacd and the raw baseline, it shows where
// the time goes.
double StoreApplyRate(gac::server::Store* store, double warmup, double seconds) {
  const std::vector<std::string> layers = LayerNames(kLayers);
  v1::IngestRequest batch;
  std::int64_t step = 0, rows = 0, rows0 = -1;
  const auto start = Clock::now();
  Clock::time_point t0;
  double rate = 0;
  for (;;) {
    const auto now = Clock::now();
    if (rows0 < 0 && Seconds(start, now) >= warmup) {
      t0 = now;
      rows0 = rows;
    }
    if (rows0 >= 0 && Seconds(t0, now) >= seconds) {
      rate = static_cast<double>(rows - rows0) / Seconds(t0, now);
      break;
    }
    batch.Clear();
    for (int i = 0; i < kRecordsPerBatch; ++i) FillRecord(batch.add_records(), "bench-store", 0, 1, step++, layers);
    std::vector<gac::server::WriteOp> ops(1);
    ops[0].steps = &batch;
    ops[0].received_ns = WallNs();
    const gac::base::Status st = store->Apply(&ops);
    if (!st.ok() || ops[0].stored != static_cast<std::uint32_t>(kRecordsPerBatch)) {
      Fail("store Apply: " + st.ToString());
    }
    rows += kRowsPerBatch;
  }
  return rate;
}

double SqliteStoreApplyRate(const std::string& path, const std::string& sync, double warmup, double seconds) {
  gac::server::SqliteOptions options;
  options.synchronous = sync;
  auto store = gac::server::OpenSqliteStore(path, options);
  if (!store.ok()) Fail("store: " + store.status().ToString());
  const double rate = StoreApplyRate(store->get(), warmup, seconds);
  store->reset();
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix, ec);
  return rate;
}

void BenchIngest(const Args& args, const std::string& scratch, Report* report) {
  const double warmup = args.quick ? 0.2 : 1.0;
  std::printf("1. ingest: %d layers per step record, %d records per batch (%lld rows), up to %d batches\n"
              "   unacknowledged per stream, one connection per stream, %.1f s measured after %.1f s warm-up\n",
              kLayers, kRecordsPerBatch, static_cast<long long>(kRowsPerBatch), kWindow, args.seconds, warmup);
  std::fflush(stdout);
  int config_index = 0;
  for (const std::string sync : {"full", "normal"}) {
    const std::string upper = sync == "full" ? "FULL" : "NORMAL";
    // The baselines bracket the gacd runs (before and after; mean), so that
    // drift of the disk or the load over the runs affects both sides. The
    // ratio is against one transaction per batch; the large transactions
    // show the ceiling that gacd's group commit can approach.
    const double raw_warmup = args.quick ? 0.05 : 0.5;
    const double raw_seconds = args.quick ? 0.2 : std::min(args.seconds, 3.0);
    const std::string raw_db = scratch + "/raw.db";
    const double raw_before = RawSqliteRate(raw_db, upper, 1, raw_warmup, raw_seconds);
    const double big_before = RawSqliteRate(raw_db, upper, kBigTxnBatches, raw_warmup, raw_seconds);
    std::vector<IngestResult> results;
    for (int n : args.streams) {
      const std::string dir = scratch + "/gacd-" + std::to_string(config_index++);
      ServerConfig config = BaseConfig();
      config.data_dir = dir;
      config.sync = sync;
      results.push_back(RunIngest({config}, Format("bench-ingest-%s-n%d", sync.c_str(), n), n, warmup, args.seconds));
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    const double big_after = RawSqliteRate(raw_db, upper, kBigTxnBatches, raw_warmup, raw_seconds);
    const double raw_after = RawSqliteRate(raw_db, upper, 1, raw_warmup, raw_seconds);
    const double raw = 0.5 * (raw_before + raw_after);
    const double big = 0.5 * (big_before + big_after);
    const double store = SqliteStoreApplyRate(scratch + "/store.db", upper, raw_warmup, raw_seconds);
    std::printf("   sync=%-6s Store::Apply alone, 1 batch per transaction, no gRPC: %s = %.2f x raw\n", sync.c_str(),
                Rate(store).c_str(), store / raw);
    report->Json("ingest_store_apply_" + sync + "_rows_per_s", store);
    std::printf("   sync=%-6s raw SQLite, 1 batch (%lld rows) per transaction: %s (before %s, after %s)\n", sync.c_str(),
                static_cast<long long>(kRowsPerBatch), Rate(raw).c_str(), Rate(raw_before).c_str(),
                Rate(raw_after).c_str());
    std::printf("   sync=%-6s raw SQLite, %d batches (%lld rows) per transaction: %s (before %s, after %s)\n",
                sync.c_str(), kBigTxnBatches, static_cast<long long>(kBigTxnBatches * kRowsPerBatch),
                Rate(big).c_str(), Rate(big_before).c_str(), Rate(big_after).c_str());
    report->Json("ingest_raw_sqlite_" + sync + "_rows_per_s", raw);
    report->Json("ingest_raw_sqlite_big_txn_" + sync + "_rows_per_s", big);
    for (std::size_t i = 0; i < results.size(); ++i) {
      const IngestResult& r = results[i];
      const int n = args.streams[i];
      std::printf("   sync=%-6s N=%-3d gacd %s = %.2f x raw (%.2f x large transactions); %llu step records\n"
                  "                     stored and verified; process CPU %.0f %% of one core, %.0f rows per store\n"
                  "                     transaction, writer thread inside Store::Apply %.0f %% of the time\n",
                  sync.c_str(), n, Rate(r.rows_per_s).c_str(), r.rows_per_s / raw, r.rows_per_s / big,
                  static_cast<unsigned long long>(r.records), 100 * r.cpu_util, r.mean_txn_rows, 100 * r.writer_busy);
      report->Add({Format("ingest sync=%s N=%d streams", sync.c_str(), n), Rate(r.rows_per_s),
                   "raw SQLite " + Rate(raw), Format("%.2f", r.rows_per_s / raw), ">= 200 k rows/s",
                   r.rows_per_s >= kIngestTarget});
      const std::string key = Format("ingest_%s_n%d", sync.c_str(), n);
      report->Json(key + "_rows_per_s", r.rows_per_s);
      report->Json(key + "_ratio_raw", r.rows_per_s / raw);
      report->Json(key + "_ratio_raw_big_txn", r.rows_per_s / big);
      report->Json(key + "_cpu_util", r.cpu_util);
      report->Json(key + "_rows_per_txn", r.mean_txn_rows);
    }
    std::fflush(stdout);
  }
  std::printf("\n");
}

// ---------------------------------------------------------------------------
// 1 (--store). Ingest into PostgreSQL.

// A superuser-or-owner connection of the benchmark: schemas and the raw
// baseline.
class PgConnection {
 public:
  explicit PgConnection(const std::string& uri) : conn_(PQconnectdb(uri.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) {
      Fail("PostgreSQL " + gac::server::DescribePostgresUri(uri) + ": " + PQerrorMessage(conn_));
    }
    PQsetNoticeProcessor(conn_, [](void*, const char*) {}, nullptr);
  }
  ~PgConnection() { PQfinish(conn_); }
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;

  // Runs `sql`; false (and no failure) when the database refuses it.
  bool TryExec(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return ok;
  }
  void Exec(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    const ExecStatusType st = PQresultStatus(r);
    const std::string error = PQresultErrorMessage(r);
    PQclear(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) Fail("PostgreSQL: " + sql.substr(0, 80) + ": " + error);
  }
  std::string Value(const std::string& sql) {
    PGresult* r = PQexec(conn_, sql.c_str());
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) == 0) {
      const std::string error = PQresultErrorMessage(r);
      PQclear(r);
      Fail("PostgreSQL: " + sql + ": " + error);
    }
    std::string value = PQgetvalue(r, 0, 0);
    PQclear(r);
    return value;
  }
  void Copy(const std::string& sql, const std::string& data) {
    PGresult* r = PQexec(conn_, sql.c_str());
    if (PQresultStatus(r) != PGRES_COPY_IN) Fail("PostgreSQL: " + sql + ": " + PQresultErrorMessage(r));
    PQclear(r);
    if (PQputCopyData(conn_, data.data(), static_cast<int>(data.size())) != 1 || PQputCopyEnd(conn_, nullptr) != 1) {
      Fail("PostgreSQL: COPY: " + std::string(PQerrorMessage(conn_)));
    }
    while (PGresult* rest = PQgetResult(conn_)) {
      const bool ok = PQresultStatus(rest) == PGRES_COMMAND_OK;
      const std::string error = PQresultErrorMessage(rest);
      PQclear(rest);
      if (!ok) Fail("PostgreSQL: COPY: " + error);
    }
  }

 private:
  PGconn* conn_;
};

// `uri` with its connections' search_path set to `schema`: gacd's tables go
// there.
std::string InSchema(const std::string& uri, const std::string& schema) {
  return uri + (uri.find('?') == std::string::npos ? "?" : "&") + "options=-csearch_path%3D" + schema;
}

// The benchmark's schemas in the database, dropped at exit.
class Schemas {
 public:
  explicit Schemas(const std::string& uri) : uri_(uri), admin_(uri) {}
  ~Schemas() {
    for (const std::string& s : made_) admin_.Exec("DROP SCHEMA IF EXISTS " + s + " CASCADE");
  }
  // A new empty schema; returns the URI whose connections use it.
  std::string Fresh() {
    const std::string name = Format("gac_bench_%d_%zu", static_cast<int>(getpid()), made_.size());
    admin_.Exec("DROP SCHEMA IF EXISTS " + name + " CASCADE");
    admin_.Exec("CREATE SCHEMA " + name);
    made_.push_back(name);
    return InSchema(uri_, name);
  }
  void DropLast() {
    admin_.Exec("DROP SCHEMA IF EXISTS " + made_.back() + " CASCADE");
    made_.pop_back();
  }
  PgConnection& admin() { return admin_; }

 private:
  const std::string uri_;
  PgConnection admin_;
  std::vector<std::string> made_;
};

// The raw PostgreSQL baseline: the rows of RunIngest written by one
// connection with COPY (binary) into tables of the shape of gacd's steps and
// layers (same columns, keys and index), `batches_per_txn` batches per
// transaction. Batches go to kBaselineRanks ranks in turn, consecutive steps
// per rank, as 16 streams' batches reach gacd's store: the same spread of
// keys over the indexes.
class RawPostgres {
 public:
  RawPostgres(const std::string& uri, int batches_per_txn) : conn_(uri), batches_per_txn_(batches_per_txn) {
    conn_.Exec(
        "CREATE TABLE steps (run_id bigint NOT NULL, step bigint NOT NULL, rank bigint NOT NULL, "
        "world_size bigint NOT NULL, cosine float8, grad_norm float8 NOT NULL, ref_norm float8 NOT NULL, "
        "regime integer NOT NULL, alpha float8 NOT NULL, cosine_after float8, staleness bigint, "
        "wall_time_ns bigint NOT NULL, overhead_s float8 NOT NULL, mode integer NOT NULL, fallback boolean NOT NULL, "
        "received_ns bigint NOT NULL, PRIMARY KEY (run_id, step, rank));"
        "CREATE INDEX steps_by_rank ON steps (run_id, rank, step);"
        "CREATE TABLE layers (run_id bigint NOT NULL, step bigint NOT NULL, rank bigint NOT NULL, name text NOT NULL, "
        "idx integer NOT NULL, cosine float8, grad_norm float8 NOT NULL, ref_norm float8 NOT NULL, "
        "PRIMARY KEY (run_id, step, rank, name))");
  }

  // Inserts for warmup + seconds; returns rows/s over the last `seconds`.
  double Run(double warmup, double seconds) {
    const auto start = Clock::now();
    Clock::time_point t0;
    std::int64_t rows0 = -1;
    for (;;) {
      const auto now = Clock::now();
      if (rows0 < 0 && Seconds(start, now) >= warmup) {
        t0 = now;
        rows0 = rows_;
      }
      if (rows0 >= 0 && Seconds(t0, now) >= seconds) return static_cast<double>(rows_ - rows0) / Seconds(t0, now);
      Transaction();
    }
  }

 private:
  static constexpr int kBaselineRanks = 16;

  void Transaction() {
    const std::int64_t now = WallNs();
    steps_.Clear();
    layers_copy_.Clear();
    for (int i = 0; i < batches_per_txn_ * kRecordsPerBatch; ++i, ++record_index_) {
      const std::int64_t batch = record_index_ / kRecordsPerBatch;
      const std::int64_t rank = batch % kBaselineRanks;
      const std::int64_t step = (batch / kBaselineRanks) * kRecordsPerBatch + record_index_ % kRecordsPerBatch;
      steps_.Row(16)
          .Int8(1)
          .Int8(step)
          .Int8(rank)
          .Int8(1)
          .Float8(0.01 + 1e-6 * static_cast<double>(step % 1000))
          .Float8(1.5)
          .Float8(2.5)
          .Int4(v1::REGIME_SAFE)
          .Float8(1.0)
          .Null()
          .Null()
          .Int8(now)
          .Float8(2e-6)
          .Int4(v1::CONTROL_MODE_LOCAL)
          .Bool(false)
          .Int8(now);
      for (int l = 0; l < kLayers; ++l) {
        layers_copy_.Row(8)
            .Int8(1)
            .Int8(step)
            .Int8(rank)
            .Text(layer_names_[static_cast<std::size_t>(l)])
            .Int4(l)
            .Float8(0.02 + 1e-4 * l)
            .Float8(0.1 + 1e-3 * l)
            .Float8(0.2);
      }
    }
    conn_.Exec("BEGIN");
    conn_.Copy("COPY steps FROM STDIN (FORMAT binary)", steps_.Finish());
    conn_.Copy("COPY layers FROM STDIN (FORMAT binary)", layers_copy_.Finish());
    conn_.Exec("COMMIT");
    rows_ += batches_per_txn_ * kRowsPerBatch;
  }

  PgConnection conn_;
  const int batches_per_txn_;
  const std::vector<std::string> layer_names_ = LayerNames(kLayers);
  gac::server::pg::CopyStream steps_, layers_copy_;
  std::int64_t record_index_ = 0;
  std::int64_t rows_ = 0;
};

double RawPostgresRate(Schemas* schemas, int batches_per_txn, double warmup, double seconds) {
  double rate = 0;
  {
    RawPostgres raw(schemas->Fresh(), batches_per_txn);
    rate = raw.Run(warmup, seconds);
  }
  schemas->DropLast();
  return rate;
}

void BenchIngestPostgres(const Args& args, Report* report) {
  const double warmup = args.quick ? 0.2 : 1.0;
  Schemas schemas(args.store);
  std::printf("1. ingest into PostgreSQL (%s, server %s): %d layers per step record, %d records per batch\n"
              "   (%lld rows), up to %d batches unacknowledged per stream, one connection per stream, streams\n"
              "   alternating between the replicas, %.1f s measured after %.1f s warm-up\n",
              gac::server::DescribePostgresUri(args.store).c_str(), schemas.admin().Value("SHOW server_version").c_str(),
              kLayers, kRecordsPerBatch, static_cast<long long>(kRowsPerBatch), kWindow, args.seconds, warmup);
  std::printf("   server settings: synchronous_commit=%s fsync=%s shared_buffers=%s\n",
              schemas.admin().Value("SHOW synchronous_commit").c_str(), schemas.admin().Value("SHOW fsync").c_str(),
              schemas.admin().Value("SHOW shared_buffers").c_str());
  std::fflush(stdout);
  const double raw_warmup = args.quick ? 0.05 : 0.5;
  const double raw_seconds = args.quick ? 0.2 : std::min(args.seconds, 3.0);
  const double raw_before = RawPostgresRate(&schemas, 1, raw_warmup, raw_seconds);
  const double big_before = RawPostgresRate(&schemas, kBigTxnBatches, raw_warmup, raw_seconds);
  struct Measured {
    int replicas, streams;
    IngestResult result;
  };
  std::vector<Measured> results;
  for (int replicas : args.replicas) {
    for (int n : args.streams) {
      const std::string uri = schemas.Fresh();
      std::vector<ServerConfig> configs;
      for (int r = 0; r < replicas; ++r) {
        ServerConfig config = BaseConfig();
        config.store = uri;
        configs.push_back(config);
      }
      results.push_back({replicas, n, RunIngest(configs, Format("bench-ingest-r%d-n%d", replicas, n), n, warmup,
                                                args.seconds)});
      schemas.DropLast();
    }
  }
  const double big_after = RawPostgresRate(&schemas, kBigTxnBatches, raw_warmup, raw_seconds);
  const double raw_after = RawPostgresRate(&schemas, 1, raw_warmup, raw_seconds);
  const double raw = 0.5 * (raw_before + raw_after);
  const double big = 0.5 * (big_before + big_after);
  double store = 0;
  {
    auto opened = gac::server::OpenPostgresStore(schemas.Fresh());
    if (!opened.ok()) Fail("store: " + opened.status().ToString());
    store = StoreApplyRate(opened->get(), raw_warmup, raw_seconds);
    opened->reset();
    schemas.DropLast();
  }
  std::printf("   Store::Apply alone, 1 batch per transaction, no gRPC: %s = %.2f x raw COPY, 1 batch per "
              "transaction\n",
              Rate(store).c_str(), store / raw);
  std::printf("   raw COPY, 1 batch (%lld rows) per transaction: %s (before %s, after %s)\n",
              static_cast<long long>(kRowsPerBatch), Rate(raw).c_str(), Rate(raw_before).c_str(),
              Rate(raw_after).c_str());
  std::printf("   raw COPY, %d batches (%lld rows) per transaction: %s (before %s, after %s)\n", kBigTxnBatches,
              static_cast<long long>(kBigTxnBatches * kRowsPerBatch), Rate(big).c_str(), Rate(big_before).c_str(),
              Rate(big_after).c_str());
  report->Json("pg_ingest_store_apply_rows_per_s", store);
  report->Json("pg_ingest_raw_copy_rows_per_s", raw);
  report->Json("pg_ingest_raw_copy_big_txn_rows_per_s", big);
  for (const Measured& m : results) {
    const IngestResult& r = m.result;
    std::printf("   replicas=%d N=%-3d gacd %s = %.2f x raw bulk COPY (%.2f x 1 batch per transaction); %llu\n"
                "                     step records stored and verified; process CPU %.0f %% of one core, %.0f rows\n"
                "                     per store transaction, each writer inside Store::Apply %.0f %% of the time\n",
                m.replicas, m.streams, Rate(r.rows_per_s).c_str(), r.rows_per_s / big, r.rows_per_s / raw,
                static_cast<unsigned long long>(r.records), 100 * r.cpu_util, r.mean_txn_rows, 100 * r.writer_busy);
    const bool at_target_streams = m.streams >= 16;
    report->Add({Format("PostgreSQL ingest, %d replica(s), N=%d", m.replicas, m.streams), Rate(r.rows_per_s),
                 "raw bulk COPY " + Rate(big), Format("%.2f", r.rows_per_s / big),
                 at_target_streams ? ">= 0.7x raw at 16 streams" : "(reported)",
                 !at_target_streams || r.rows_per_s >= 0.7 * big});
    const std::string key = Format("pg_ingest_r%d_n%d", m.replicas, m.streams);
    report->Json(key + "_rows_per_s", r.rows_per_s);
    report->Json(key + "_ratio_raw_big_txn", r.rows_per_s / big);
    report->Json(key + "_ratio_raw", r.rows_per_s / raw);
    report->Json(key + "_cpu_util", r.cpu_util);
    report->Json(key + "_rows_per_txn", r.mean_txn_rows);
  }
  std::printf("\n");
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// 2. Decide latency against a bare echo.

// Echoes the request bytes of every call, whatever its method.
class EchoService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* /*ctx*/) override {
    return new Reactor();
  }

 private:
  class Reactor final : public grpc::ServerGenericBidiReactor {
   public:
    Reactor() { StartRead(&buffer_); }
    void OnReadDone(bool ok) override {
      if (ok) {
        StartWriteAndFinish(&buffer_, grpc::WriteOptions(), grpc::Status::OK);
      } else {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
      }
    }
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer buffer_;
  };
};

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string DecideRequestBytes(std::uint32_t rank) {
  v1::DecideRequest req;
  req.set_run("bench-decide-run");
  req.set_rank(rank);
  req.set_step(123456);
  req.set_dot(0.25);
  req.set_grad_sq(4.0);
  req.set_ref_sq(9.0);
  req.set_has_reference(true);
  return req.SerializeAsString();
}

struct LoopResult {
  std::vector<double> latencies_us;  // calls completed inside the windows
  double calls = 0;                  // completed inside the windows
  double seconds = 0;                // total window time
};

// `clients` closed-loop callers of one method on one channel: each starts its
// next call from the completion callback of the previous one.
class ClosedLoop {
 public:
  ClosedLoop(std::shared_ptr<grpc::Channel> channel, std::string method, int clients)
      : stub_(std::move(channel)), method_(std::move(method)), slots_(static_cast<std::size_t>(clients)) {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      // Echo and Decide send the same bytes (the echo ignores them).
      slots_[i].request = ToByteBuffer(DecideRequestBytes(static_cast<std::uint32_t>(i)));
    }
  }

  // Runs every client for warmup + seconds, recording the calls that
  // complete in the last `seconds`; adds them to `out`.
  void Run(double warmup, double seconds, LoopResult* out) {
    recording_.store(false);
    stop_.store(false);
    completed_.store(0);
    active_ = static_cast<int>(slots_.size());
    for (Slot& s : slots_) s.latencies_us.clear();
    for (std::size_t i = 0; i < slots_.size(); ++i) Issue(i);
    std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
    const auto t0 = Clock::now();
    const std::int64_t c0 = completed_.load();
    recording_.store(true);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    recording_.store(false);
    const std::int64_t c1 = completed_.load();
    const auto t1 = Clock::now();
    stop_.store(true);
    {
      std::unique_lock lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::seconds(30), [this] { return active_ == 0; })) {
        Fail("Decide/echo clients did not stop within 30 s");
      }
    }
    if (errors_.load() != 0) Fail(method_ + ": " + std::to_string(errors_.load()) + " calls failed: " + first_error_);
    for (Slot& s : slots_) out->latencies_us.insert(out->latencies_us.end(), s.latencies_us.begin(), s.latencies_us.end());
    out->calls += static_cast<double>(c1 - c0);
    out->seconds += Seconds(t0, t1);
  }

  // One synchronous call; returns the response bytes.
  std::string CallOnce() {
    grpc::ClientContext ctx;
    grpc::ByteBuffer response;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    stub_.UnaryCall(&ctx, method_, grpc::StubOptions(), &slots_[0].request, &response, [&](grpc::Status s) {
      std::lock_guard lock(mu);
      status = std::move(s);
      done = true;
      cv.notify_all();
    });
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
    if (!status.ok()) Fail(method_ + ": " + status.error_message());
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    std::string bytes;
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    return bytes;
  }

 private:
  struct Slot {
    std::unique_ptr<grpc::ClientContext> ctx;
    grpc::ByteBuffer request, response;
    Clock::time_point start;
    std::vector<double> latencies_us;
  };

  void Issue(std::size_t i) {
    Slot& s = slots_[i];
    // The previous call's context is destroyed here, inside that call's
    // completion callback; the callback holds its own reference to the call.
    s.ctx = std::make_unique<grpc::ClientContext>();
    s.response.Clear();
    s.start = Clock::now();
    stub_.UnaryCall(s.ctx.get(), method_, grpc::StubOptions(), &s.request, &s.response,
                    [this, i](grpc::Status status) { Done(i, status); });
  }

  void Done(std::size_t i, const grpc::Status& status) {
    Slot& s = slots_[i];
    const auto end = Clock::now();
    if (!status.ok()) {
      if (errors_.fetch_add(1) == 0) first_error_ = status.error_message();
    } else if (recording_.load(std::memory_order_relaxed)) {
      s.latencies_us.push_back(1e6 * Seconds(s.start, end));
      completed_.fetch_add(1, std::memory_order_relaxed);
    }
    if (!stop_.load() && errors_.load() == 0) {
      Issue(i);
      return;
    }
    std::lock_guard lock(mu_);
    if (--active_ == 0) cv_.notify_all();
  }

  grpc::GenericStub stub_;
  const std::string method_;
  std::vector<Slot> slots_;
  std::atomic<bool> recording_{false};
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> completed_{0};
  std::atomic<int> errors_{0};
  std::string first_error_;  // written by the first failing call only
  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;  // guarded by mu_
};

struct LatencySummary {
  double p50_us, p99_us, rpc_per_s;
  std::size_t samples;
};

LatencySummary Summarise(LoopResult r) {
  std::sort(r.latencies_us.begin(), r.latencies_us.end());
  return {Quantile(r.latencies_us, 0.50), Quantile(r.latencies_us, 0.99), r.calls / r.seconds, r.latencies_us.size()};
}

// `clients` closed-loop callers of `method` at `address` and as many of the
// baseline's, each group on a connection of its own, in `rounds` rounds
// that alternate which goes first (so that drift hits both), each after its
// own warm-up. Returns the summaries of the two.
std::pair<LatencySummary, LatencySummary> MeasurePair(const std::string& address, const char* method,
                                                      const std::string& baseline_address, const char* baseline_method,
                                                      int clients, int rounds, double warmup, double seconds) {
  ClosedLoop a(Connect(address), method, clients);
  ClosedLoop b(Connect(baseline_address), baseline_method, clients);
  LoopResult ra, rb;
  for (int r = 0; r < rounds; ++r) {
    if (r % 2 == 0) {
      b.Run(warmup, seconds / rounds, &rb);
      a.Run(warmup, seconds / rounds, &ra);
    } else {
      a.Run(warmup, seconds / rounds, &ra);
      b.Run(warmup, seconds / rounds, &rb);
    }
  }
  std::pair<LatencySummary, LatencySummary> out{Summarise(std::move(ra)), Summarise(std::move(rb))};
  if (out.first.samples == 0 || out.second.samples == 0) Fail("no call completed in a measurement window");
  return out;
}

void BenchDecide(const Args& args, const std::string& scratch, Report* report) {
  const int rounds = args.quick ? 1 : 2;
  const double warmup = args.quick ? 0.1 : 0.3;
  std::printf("2. Decide: closed-loop clients on the callback API, one channel (connection) per client group,\n"
              "   %d alternating round(s) of %.1f s per service after %.1f s warm-up each; baseline: generic echo\n",
              rounds, args.seconds / rounds, warmup);
  std::fflush(stdout);

  ServerConfig config = BaseConfig();
  config.data_dir = scratch + "/gacd-decide";
  auto gacd = StartGacd(config);

  EchoService echo_service;
  grpc::ServerBuilder builder;
  int echo_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &echo_port);
  builder.RegisterCallbackGenericService(&echo_service);
  std::unique_ptr<grpc::Server> echo_server = builder.BuildAndStart();
  if (echo_server == nullptr || echo_port == 0) Fail("cannot start the echo server");
  const std::string echo_address = "127.0.0.1:" + std::to_string(echo_port);

  // Sanity: both answer, and Decide answers a real decision.
  {
    ClosedLoop probe(Connect(gacd->address()), kDecideMethod, 1);
    v1::DecideResponse resp;
    if (!resp.ParseFromString(probe.CallOnce()) || resp.regime() == v1::REGIME_UNSPECIFIED) {
      Fail("Decide returned no decision");
    }
    ClosedLoop echo_probe(Connect(echo_address), kEchoMethod, 1);
    if (echo_probe.CallOnce() != DecideRequestBytes(0)) Fail("the echo service did not echo");
  }
  std::printf("   payload %zu bytes (a serialized DecideRequest) both ways for the echo\n", DecideRequestBytes(0).size());

  for (int clients : args.clients) {
    const auto [ds, es] =
        MeasurePair(gacd->address(), kDecideMethod, echo_address, kEchoMethod, clients, rounds, warmup, args.seconds);
    const double ratio = ds.p99_us / es.p99_us;
    std::printf("   C=%-3d Decide p50 %7.1f us  p99 %7.1f us  %8.0f rpc/s | echo p50 %7.1f us  p99 %7.1f us"
                "  %8.0f rpc/s | p99 ratio %.2f, p50 ratio %.2f\n",
                clients, ds.p50_us, ds.p99_us, ds.rpc_per_s, es.p50_us, es.p99_us, es.rpc_per_s, ratio,
                ds.p50_us / es.p50_us);
    std::fflush(stdout);
    report->Add({Format("Decide p99, C=%d clients", clients),
                 Format("%.0f us (p50 %.0f, %.1f k rpc/s)", ds.p99_us, ds.p50_us, ds.rpc_per_s / 1e3),
                 Format("echo p99 %.0f us (p50 %.0f, %.1f k rpc/s)", es.p99_us, es.p50_us, es.rpc_per_s / 1e3),
                 Format("%.2f", ratio), "<= 1.5x echo p99", ratio <= kDecideRatioTarget});
    const std::string key = Format("decide_c%d", clients);
    report->Json(key + "_p50_us", ds.p50_us);
    report->Json(key + "_p99_us", ds.p99_us);
    report->Json(key + "_rpc_per_s", ds.rpc_per_s);
    report->Json(key + "_echo_p50_us", es.p50_us);
    report->Json(key + "_echo_p99_us", es.p99_us);
    report->Json(key + "_echo_rpc_per_s", es.rpc_per_s);
    report->Json(key + "_p99_ratio", ratio);
  }
  echo_server->Shutdown(std::chrono::system_clock::now());
  gacd->Shutdown(std::chrono::milliseconds(0));
  std::printf("\n");
}

// 2 (--store). Decide on a gacd whose store is PostgreSQL against one on
// SQLite: the same calls, alternating rounds. Decide reads the run settings
// from memory on both.
void BenchDecideStores(const Args& args, const std::string& scratch, Report* report) {
  const int rounds = args.quick ? 1 : 2;
  const double warmup = args.quick ? 0.1 : 0.3;
  std::printf("2. Decide on a gacd with the PostgreSQL store against one with the SQLite store: closed-loop\n"
              "   clients on the callback API, %d alternating round(s) of %.1f s per gacd after %.1f s warm-up each\n",
              rounds, args.seconds / rounds, warmup);
  std::fflush(stdout);
  Schemas schemas(args.store);
  // The ingest before leaves dirty buffers that a checkpoint would write
  // during the measurement, on the CPUs and disk both gacd share: write them
  // now (needs a superuser or pg_checkpoint; skipped otherwise).
  if (!schemas.admin().TryExec("CHECKPOINT")) std::printf("   (no CHECKPOINT: not allowed for this role)\n");
  ServerConfig sqlite_config = BaseConfig();
  sqlite_config.data_dir = scratch + "/gacd-decide";
  auto on_sqlite = StartGacd(sqlite_config);
  ServerConfig pg_config = BaseConfig();
  pg_config.store = schemas.Fresh();
  auto on_postgres = StartGacd(pg_config);
  for (GacServer* server : {on_sqlite.get(), on_postgres.get()}) {
    ClosedLoop probe(Connect(server->address()), kDecideMethod, 1);
    v1::DecideResponse resp;
    if (!resp.ParseFromString(probe.CallOnce()) || resp.regime() == v1::REGIME_UNSPECIFIED) {
      Fail("Decide returned no decision");
    }
  }
  for (int clients : args.clients) {
    const auto [ps, ls] = MeasurePair(on_postgres->address(), kDecideMethod, on_sqlite->address(), kDecideMethod,
                                      clients, rounds, warmup, args.seconds);
    const double ratio = ps.p99_us / ls.p99_us;
    std::printf("   C=%-3d PostgreSQL store: Decide p50 %7.1f us  p99 %7.1f us  %8.0f rpc/s | SQLite store: p50 %7.1f us"
                "  p99 %7.1f us  %8.0f rpc/s | p99 ratio %.2f\n",
                clients, ps.p50_us, ps.p99_us, ps.rpc_per_s, ls.p50_us, ls.p99_us, ls.rpc_per_s, ratio);
    std::fflush(stdout);
    report->Add({Format("Decide p99 on PostgreSQL, C=%d", clients),
                 Format("%.0f us (p50 %.0f, %.1f k rpc/s)", ps.p99_us, ps.p50_us, ps.rpc_per_s / 1e3),
                 Format("on SQLite p99 %.0f us (p50 %.0f)", ls.p99_us, ls.p50_us), Format("%.2f", ratio),
                 "unchanged: <= 1.25x", ratio <= 1.25});
    const std::string key = Format("pg_decide_c%d", clients);
    report->Json(key + "_p99_us", ps.p99_us);
    report->Json(key + "_sqlite_p99_us", ls.p99_us);
    report->Json(key + "_p99_ratio", ratio);
  }
  on_postgres->Shutdown(std::chrono::milliseconds(0));
  on_sqlite->Shutdown(std::chrono::milliseconds(0));
  std::printf("\n");
}

// ---------------------------------------------------------------------------
// 3. /metrics.

// GET 127.0.0.1:port/metrics; returns the body.
std::string HttpGetMetrics(int port) {
  std::string body;
  const std::string error = gac::bench::HttpGet(port, "/metrics", &body);
  if (!error.empty()) Fail("GET /metrics: " + error);
  return body;
}

// Feeds `runs` runs with `layers` layers (rank 0) into `metrics`.
void FillMetrics(gac::server::Metrics& metrics, int runs, int layers) {
  const auto names = LayerNames(layers);
  const auto now = std::chrono::system_clock::now();
  v1::RunConfig config;
  config.mutable_thresholds()->set_c_low(0.05);
  config.mutable_thresholds()->set_c_high(0.5);
  config.mutable_thresholds()->set_alpha_mode(v1::ALPHA_MODE_PAPER);
  config.set_mode(v1::CONTROL_MODE_LOCAL);
  v1::StepRecord r;
  for (int i = 0; i < runs; ++i) {
    const std::string run = Format("bench-metrics-run-%03d", i);
    FillRecord(&r, run, 0, 1, 1000, names);
    (*r.mutable_scalars())["loss"] = 1.25;
    (*r.mutable_scalars())["reward"] = 0.5;
    metrics.ObserveConfig(run, config, now);
    metrics.ObserveStep(r, now);
  }
}

void BenchMetrics(const Args& args, const std::string& scratch, Report* report) {
  const int runs = 100, layers = 50;  // 2 layer series per layer: 10,000, plus ~17 per run
  const int reps = args.quick ? 3 : 15;
  std::printf("3. /metrics: %d runs x %d layers, per-layer series on; median of %d\n", runs, layers, reps);
  std::fflush(stdout);

  gac::server::MetricsOptions options;
  options.per_layer = true;
  options.max_layers_per_run = 64;
  gac::server::Metrics metrics(options);
  FillMetrics(metrics, runs, layers);
  std::string text = metrics.Render();  // warm-up
  const std::size_t series = CountSeries(text);
  if (series < kMetricsSeries) Fail(Format("only %zu series rendered (want >= %zu)", series, kMetricsSeries));
  std::vector<double> render_ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    text = metrics.Render();
    render_ms.push_back(1e3 * Seconds(t0, Clock::now()));
  }
  const double render = Median(render_ms);

  ServerConfig config = BaseConfig();
  config.data_dir = scratch + "/gacd-metrics";
  config.metrics_listen = "127.0.0.1:0";
  config.per_layer_metrics = true;
  config.max_layers_per_run = 64;
  auto gacd = StartGacd(config);
  if (gacd->metrics_port() == 0) Fail("gacd reports no /metrics port");
  FillMetrics(gacd->metrics(), runs, layers);
  std::string body = HttpGetMetrics(gacd->metrics_port());  // warm-up
  const std::size_t scraped_series = CountSeries(body);
  if (scraped_series < series) Fail(Format("scrape has %zu series, Render() %zu", scraped_series, series));
  std::vector<double> scrape_ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    body = HttpGetMetrics(gacd->metrics_port());
    scrape_ms.push_back(1e3 * Seconds(t0, Clock::now()));
  }
  const double scrape = Median(scrape_ms);
  gacd->Shutdown(std::chrono::milliseconds(0));

  std::printf("   Render(): %zu series, %zu bytes, median %.2f ms (min %.2f, max %.2f)\n", series, text.size(), render,
              *std::min_element(render_ms.begin(), render_ms.end()),
              *std::max_element(render_ms.begin(), render_ms.end()));
  std::printf("   HTTP GET /metrics: %zu series, %zu bytes, median %.2f ms (min %.2f, max %.2f)\n", scraped_series,
              body.size(), scrape, *std::min_element(scrape_ms.begin(), scrape_ms.end()),
              *std::max_element(scrape_ms.begin(), scrape_ms.end()));
  report->Add({Format("/metrics Render(), %zu series", series), Format("%.2f ms", render), "", "", "<= 50 ms",
               render <= kMetricsTargetMs});
  report->Add({Format("/metrics HTTP scrape, %zu series", scraped_series), Format("%.2f ms", scrape), "", "",
               "<= 50 ms", scrape <= kMetricsTargetMs});
  // The exporter's cost on the ingest path: ObserveStep per record, against
  // the time one record may take at the ingest target.
  const double budget_ns = 1e9 / kIngestTarget;
  const auto observe_ns = [&](int layers_per_record, bool per_layer) {
    gac::server::MetricsOptions o;
    o.per_layer = per_layer;
    o.max_layers_per_run = 64;
    gac::server::Metrics m(o);
    std::vector<v1::StepRecord> records(100);
    for (int i = 0; i < 100; ++i) {
      FillRecord(&records[static_cast<std::size_t>(i)], Format("bench-observe-%03d", i), 0, 1, 1,
                 LayerNames(layers_per_record));
      (*records[static_cast<std::size_t>(i)].mutable_scalars())["reward"] = 0.5;
    }
    const int calls = args.quick ? 2000 : 200000;
    const auto now = std::chrono::system_clock::now();
    for (const auto& r : records) m.ObserveStep(r, now);  // creates the series
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) m.ObserveStep(records[static_cast<std::size_t>(i % 100)], now);
    return 1e9 * Seconds(t0, Clock::now()) / calls;
  };
  const double plain_ns = observe_ns(0, false);
  const double layered_ns = observe_ns(64, true);
  std::printf("   ObserveStep per record: %.0f ns without layers, %.0f ns with 64 per-layer series\n"
              "   (%.1f %% and %.1f %% of the %.0f ns a row may take at the ingest target)\n\n",
              plain_ns, layered_ns, 100 * plain_ns / budget_ns, 100 * layered_ns / budget_ns, budget_ns);
  report->Json("metrics_observe_step_ns", plain_ns);
  report->Json("metrics_observe_step_64_layers_ns", layered_ns);
  report->Json("metrics_series", static_cast<double>(series));
  report->Json("metrics_render_ms", render);
  report->Json("metrics_scrape_ms", scrape);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  const auto start = Clock::now();
  g_scratch = MakeScratchDir();
  const std::string scratch = g_scratch;

  std::printf("gac server_bench%s\n", args.quick ? " --quick (smoke run; figures are not meaningful)" : "");
  std::printf("cpu: %s, %u hardware threads; SQLite %s; gRPC %s; scratch %s\n\n", CpuModel().c_str(),
              std::thread::hardware_concurrency(), sqlite3_libversion(), grpc::Version().c_str(), scratch.c_str());
  std::fflush(stdout);

  Report report;
  if (!args.store.empty()) {
    BenchIngestPostgres(args, &report);
    BenchDecideStores(args, scratch, &report);
  } else {
    BenchIngest(args, scratch, &report);
    BenchDecide(args, scratch, &report);
    BenchMetrics(args, scratch, &report);
  }

  std::printf("Summary (targets from docs/BENCHMARKS.md; %.0f s in all):\n", Seconds(start, Clock::now()));
  report.PrintTable();
  report.Json("total_seconds", Seconds(start, Clock::now()));
  if (args.json) report.PrintJson();
  RemoveScratch();
  return 0;
}
