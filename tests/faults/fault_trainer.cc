// The trainer host of the network fault suite (tests/faults/faults.py): a
// training loop that streams one step record per step through the agent's
// telemetry sender (spool, acks, failover between replicas) and asks gacd's
// remote controller for every `decide_every`-th decision, falling back to
// the local decision on a miss, as an agent in remote mode does.
//
// It runs for --seconds at --rate steps per second while the suite injects a
// fault from outside, then flushes, and writes what the suite checks to
// --out (JSON): the training thread's time in every Enqueue and Decide call
// (CLOCK_MONOTONIC start and duration, so the suite can pick the calls made
// during the fault), the sender's progress every 20 ms (from another
// thread), its counters and last_error, the steps Enqueue refused, and the
// steps the store holds afterwards, read back from a replica.
//
// Usage: fault_trainer --address=A[,B] --token=T --run=R --spool-dir=D
//   [--spool-max-bytes=N] [--queue-capacity=N] [--seconds=S] [--rate=N]
//   [--decide-every=N] [--decide-deadline-ms=N] [--flush-seconds=S]
//   [--ack-timeout-ms=N] (TelemetryOptions::ack_timeout; its default if absent)
//   --ready=FILE --out=FILE
// Exit status: 0 when it ran (the checks are the suite's), 2 on bad usage.

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gac/base/mutex.h"
#include "gac/controller/controller.h"
#include "gac/transport/remote_controller.h"
#include "gac/transport/telemetry.h"
#include "tests/common/test_util.h"

namespace {

using namespace std::chrono_literals;

// The calling thread's context switches so far, voluntary (it waited, e.g.
// for a lock) and involuntary (the scheduler preempted it), and its page
// faults served without I/O (first touches of memory).
struct ThreadEvents {
  long waited, preempted, faults;
};
ThreadEvents ThreadEventsSoFar() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return {u.ru_nvcsw, u.ru_nivcsw, u.ru_minflt};
}

std::int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

template <typename T>
std::string JsonArray(const std::vector<T>& v) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
  out << "]";
  return out.str();
}

struct Flags {
  std::map<std::string, std::string> values;
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
  double Number(const std::string& name, double fallback) const {
    auto it = values.find(name);
    return it == values.end() ? fallback : std::atof(it->second.c_str());
  }
};

struct Progress {
  std::int64_t t_ns;
  gac::transport::TelemetryCounters c;
  std::string address;
  std::string error;  // last_error when it changed since the sample before; "" otherwise
};

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "fault_trainer: expected --name=value, got '%s'\n", arg.c_str());
      return 2;
    }
    flags.values[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  for (const char* required : {"address", "token", "run", "spool-dir", "ready", "out"}) {
    if (flags.Get(required).empty()) {
      std::fprintf(stderr, "fault_trainer: --%s is required\n", required);
      return 2;
    }
  }
  const std::string run = flags.Get("run");
  const double seconds = flags.Number("seconds", 10);
  const double rate = flags.Number("rate", 400);
  const int decide_every = static_cast<int>(flags.Number("decide-every", 5));
  const auto deadline = std::chrono::milliseconds(static_cast<int>(flags.Number("decide-deadline-ms", 50)));

  gac::transport::TelemetryOptions o;
  o.address = flags.Get("address");
  o.token = flags.Get("token");
  o.spool_dir = flags.Get("spool-dir");
  o.spool_max_bytes = static_cast<std::uint64_t>(flags.Number("spool-max-bytes", 256.0 * (1 << 20)));
  o.queue_capacity = static_cast<std::size_t>(flags.Number("queue-capacity", 1 << 16));
  o.max_batch_records = 64;
  o.flush_interval = 20ms;
  o.backoff_initial = 50ms;
  o.backoff_max = 1000ms;
  if (flags.values.count("ack-timeout-ms")) {
    o.ack_timeout = std::chrono::milliseconds(static_cast<int>(flags.Number("ack-timeout-ms", 15000)));
  }
  auto telemetry = gac::transport::Telemetry::Start(o);
  if (!telemetry.ok()) {
    std::fprintf(stderr, "fault_trainer: %s\n", telemetry.status().ToString().c_str());
    return 1;
  }
  gac::transport::Telemetry& t = **telemetry;
  gac::transport::RemoteControllerOptions ro;
  ro.address = o.address;
  ro.token = o.token;
  ro.run = run;
  ro.deadline = deadline;
  auto remote = gac::transport::RemoteController::Create(ro);
  if (!remote.ok()) {
    std::fprintf(stderr, "fault_trainer: %s\n", remote.status().ToString().c_str());
    return 1;
  }

  // The sender's progress, sampled by a thread of its own.
  std::vector<Progress> progress;
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    std::string last;
    while (sampling.load()) {
      std::string error = t.last_error();
      if (error == last) {
        error.clear();
      } else {
        last = error;
      }
      progress.push_back(Progress{MonotonicNs(), t.counters(), t.address(), error});
      std::this_thread::sleep_for(20ms);
    }
  });

  {
    std::ofstream ready(flags.Get("ready"));
    ready << MonotonicNs() << "\n";
  }

  // The training loop.
  // enqueue_switched: whether the thread waited (bit 0), was preempted (bit
  // 1) or took a page fault (bit 2) during the Enqueue call, read outside the
  // timed interval.
  // baseline_ns: the same thread's time in a call that does no more than
  // lock a mutex and append one number to a reserved vector, timed after a
  // pause of the same length as the one before each Enqueue (half a step:
  // the loop sleeps until the step's time, enqueues, sleeps until the half
  // step, runs the baseline). Whatever a thread pays for waking up on this
  // machine (a vCPU that went idle, caches and TLBs that went cold) shows in
  // both; what is Enqueue's own shows as their difference.
  std::vector<std::int64_t> enqueue_t, enqueue_ns, enqueue_switched, baseline_t, baseline_ns, decide_t, decide_ns,
      decide_ok, refused;
  const std::int64_t steps = static_cast<std::int64_t>(seconds * rate);
  for (auto* v : {&enqueue_t, &enqueue_ns, &enqueue_switched, &baseline_t, &baseline_ns}) {
    v->reserve(static_cast<std::size_t>(steps));
  }
  gac::base::Mutex baseline_mu;
  std::vector<std::int64_t> baseline_sink;
  baseline_sink.reserve(static_cast<std::size_t>(steps));
  const auto local = gac::controller::Controller::Create(gac::controller::Thresholds{});
  if (!local.ok()) return 1;
  std::uint64_t fallbacks = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t step = 0; step < steps; ++step) {
    std::this_thread::sleep_until(start + std::chrono::nanoseconds(static_cast<std::int64_t>(1e9 * step / rate)));
    const gac::controller::AlignmentStats stats{0.1, 1.0, 1.0, true};
    if (decide_every > 0 && step % decide_every == 0) {
      const std::int64_t t0 = MonotonicNs();
      auto d = (*remote)->Decide(step, stats);
      decide_ns.push_back(MonotonicNs() - t0);
      decide_t.push_back(t0);
      decide_ok.push_back(d.ok() ? 1 : 0);
      if (!d.ok()) {
        (void)local->Decide(stats);  // the local decision the agent falls back to
        ++fallbacks;
      }
    }
    gac::v1::StepRecord r = gac::testing::MakeStep(run, step);
    const ThreadEvents e0 = ThreadEventsSoFar();
    const std::int64_t t0 = MonotonicNs();
    const bool ok = t.Enqueue(std::move(r));
    enqueue_ns.push_back(MonotonicNs() - t0);
    const ThreadEvents e1 = ThreadEventsSoFar();
    enqueue_switched.push_back((e1.waited > e0.waited ? 1 : 0) | (e1.preempted > e0.preempted ? 2 : 0) |
                               (e1.faults > e0.faults ? 4 : 0));
    enqueue_t.push_back(t0);
    if (!ok) refused.push_back(step);

    std::this_thread::sleep_until(start + std::chrono::nanoseconds(static_cast<std::int64_t>(1e9 * (step + 0.5) / rate)));
    const std::int64_t b0 = MonotonicNs();
    {
      gac::base::MutexLock lock(&baseline_mu);
      baseline_sink.push_back(step);
    }
    baseline_ns.push_back(MonotonicNs() - b0);
    baseline_t.push_back(b0);
  }
  const std::int64_t trained_ns = MonotonicNs();

  const bool flushed = t.Flush(std::chrono::seconds(static_cast<int>(flags.Number("flush-seconds", 120))));
  const std::int64_t flushed_ns = MonotonicNs();
  t.Close(1s);
  sampling = false;
  sampler.join();
  const gac::transport::TelemetryCounters c = t.counters();

  // What the store holds, from the first replica that answers.
  std::vector<std::int64_t> stored;
  double exported_dropped = -1;
  std::string read_error;
  std::stringstream addresses(o.address);
  for (std::string address; std::getline(addresses, address, ',');) {
    std::vector<gac::v1::StepRecord> recs;
    grpc::Status st = gac::testing::Client(address, flags.Get("reader-token", o.token)).AllSteps(run, &recs);
    if (!st.ok()) {
      read_error += address + ": " + st.error_message() + "; ";
      continue;
    }
    for (const auto& rec : recs) {
      stored.push_back(rec.step());
      auto it = rec.scalars().find("agent_records_dropped");
      if (it != rec.scalars().end()) exported_dropped = std::max(exported_dropped, it->second);
    }
    read_error.clear();
    break;
  }

  std::ofstream out(flags.Get("out"));
  out << "{\"steps\":" << steps << ",\"flushed\":" << (flushed ? "true" : "false") << ",\"trained_ns\":" << trained_ns
      << ",\"flushed_ns\":" << flushed_ns << ",\"fallbacks\":" << fallbacks << ",\"last_error\":" << JsonString(t.last_error())
      << ",\"read_error\":" << JsonString(read_error) << ",\"exported_dropped\":" << exported_dropped
      << ",\"counters\":{\"enqueued\":" << c.enqueued << ",\"dropped_queue_full\":" << c.dropped_queue_full
      << ",\"dropped_at_close\":" << c.dropped_at_close << ",\"records_acknowledged\":" << c.records_acknowledged
      << ",\"records_rejected\":" << c.records_rejected << ",\"records_spooled\":" << c.records_spooled
      << ",\"records_replayed\":" << c.records_replayed << ",\"reconnects\":" << c.reconnects
      << ",\"failovers\":" << c.failovers << ",\"spool_errors\":" << c.spool_errors << "}"
      << ",\"refused\":" << JsonArray(refused) << ",\"stored\":" << JsonArray(stored)
      << ",\"enqueue_t\":" << JsonArray(enqueue_t) << ",\"enqueue_ns\":" << JsonArray(enqueue_ns)
      << ",\"enqueue_switched\":" << JsonArray(enqueue_switched) << ",\"baseline_t\":" << JsonArray(baseline_t)
      << ",\"baseline_ns\":" << JsonArray(baseline_ns)
      << ",\"decide_t\":" << JsonArray(decide_t) << ",\"decide_ns\":" << JsonArray(decide_ns)
      << ",\"decide_ok\":" << JsonArray(decide_ok) << ",\"progress\":[";
  for (std::size_t i = 0; i < progress.size(); ++i) {
    const Progress& p = progress[i];
    out << (i ? "," : "") << "[" << p.t_ns << "," << p.c.enqueued << "," << p.c.records_acknowledged << ","
        << p.c.queue_depth << "," << JsonString(p.address) << "," << JsonString(p.error) << "]";
  }
  out << "]}\n";
  return out ? 0 : 1;
}
