// The agent's telemetry cost on the training thread: Telemetry::Enqueue of a
// step record (with 4 trainer scalars) while the sender streams to a live
// in-process gacd, against building and storing the same record in a plain
// vector (the work any telemetry needs). Target: <= 5 us per step.
//
//   ./build/bench/transport_bench [--quick]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <unistd.h>
#include <string>
#include <vector>

#include "gac/transport/telemetry.h"
#include "gac/server/server.h"

namespace {

using Clock = std::chrono::steady_clock;

gac::v1::StepRecord Record(std::int64_t step) {
  gac::v1::StepRecord r;
  r.set_run("bench-transport");
  r.set_step(step);
  r.set_world_size(1);
  r.set_cosine(0.01);
  r.set_grad_norm(1.5);
  r.set_ref_norm(1.4);
  r.set_regime(gac::v1::REGIME_SAFE);
  r.set_alpha(1.0);
  r.set_mode(gac::v1::CONTROL_MODE_LOCAL);
  auto& s = *r.mutable_scalars();
  s["reward"] = 0.5;
  s["loss"] = 1.25;
  s["kl"] = 0.01;
  s["entropy"] = 2.0;
  return r;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int steps = quick ? 5'000 : 100'000;
  const std::string dir = std::filesystem::temp_directory_path() / ("gac-transport-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);

  gac::server::ServerConfig config;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "";
  config.insecure = true;
  config.data_dir = dir + "/gacd";
  auto server = gac::server::GacServer::Start(config);
  if (!server.ok()) {
    std::fprintf(stderr, "cannot start gacd: %s\n", server.status().ToString().c_str());
    return 1;
  }
  gac::transport::TelemetryOptions o;
  o.address = (*server)->address();
  o.spool_dir = dir + "/spool";
  o.queue_capacity = static_cast<std::size_t>(steps) + 1;
  auto telemetry = gac::transport::Telemetry::Start(o);
  if (!telemetry.ok()) {
    std::fprintf(stderr, "cannot start telemetry: %s\n", telemetry.status().ToString().c_str());
    return 1;
  }

  // Baseline: build each record and keep it.
  std::vector<double> base_ns, enq_ns;
  base_ns.reserve(static_cast<std::size_t>(steps));
  enq_ns.reserve(static_cast<std::size_t>(steps));
  std::vector<gac::v1::StepRecord> kept;
  kept.reserve(static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    kept.push_back(Record(s));
    base_ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  }
  kept.clear();
  // Enqueue: build the record and hand it to the sender, one step at a time
  // with a little work in between, as a trainer would.
  int refused = 0;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    refused += (*telemetry)->Enqueue(Record(s)) ? 0 : 1;
    enq_ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
    if (s % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  const bool flushed = (*telemetry)->Flush(std::chrono::seconds(120));
  const auto c = (*telemetry)->counters();
  auto run = (*server)->store().GetRun("bench-transport");
  const std::uint64_t stored = run.ok() ? run->step_records() : 0;

  std::printf("gac transport bench: %d steps, live in-process gacd (SQLite, sync full), spool on\n\n", steps);
  std::printf("%-44s %9s %9s %9s\n", "per step on the training thread", "p50 ns", "p99 ns", "max ns");
  std::printf("%-44s %9.0f %9.0f %9.0f\n", "baseline: build record, push to a vector", Percentile(base_ns, 0.5),
              Percentile(base_ns, 0.99), Percentile(base_ns, 1.0));
  std::printf("%-44s %9.0f %9.0f %9.0f\n", "Telemetry::Enqueue(build record)", Percentile(enq_ns, 0.5),
              Percentile(enq_ns, 0.99), Percentile(enq_ns, 1.0));
  std::printf("\nratio p50 enqueue / baseline: %.2f\n", Percentile(enq_ns, 0.5) / Percentile(base_ns, 0.5));
  const double p99_us = Percentile(enq_ns, 0.99) / 1000.0;
  std::printf("enqueue p99 %.2f us, target <= 5 us: %s\n", p99_us, p99_us <= 5.0 ? "PASS" : "MISS");
  std::printf("delivered: %llu acknowledged, %llu stored, %d refused, flushed=%s\n",
              static_cast<unsigned long long>(c.records_acknowledged), static_cast<unsigned long long>(stored), refused,
              flushed ? "yes" : "no");
  (*telemetry)->Close(std::chrono::seconds(5));
  (*server)->Shutdown(std::chrono::seconds(1));
  std::filesystem::remove_all(dir);
  if (!flushed || stored != static_cast<std::uint64_t>(steps) || refused != 0) {
    std::fprintf(stderr, "FAIL: not every record arrived exactly once\n");
    return 1;
  }
  return 0;
}
