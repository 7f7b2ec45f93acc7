// gac_train_demo: trains a small MLP with LibTorch on a synthetic regression
// task, with gradients computed on parameters `--staleness` steps old (the
// asynchronous-RL setting in miniature), the GAC agent running every step.
// Three runs from the same start:
//   1. synchronous (s = 0), agent in monitor mode: calibrates c_low / c_high
//      from the on-policy |c_t| after the warm-up, as the paper anchors them;
//   2. stale (s = --staleness), monitor mode: what alignment looks like;
//   3. stale, GAC in local mode from the end of the warm-up on.
// Prints c_t and the regime every --every steps and a summary table.
//
// With --gacd HOST:PORT every step is streamed to gacd (runs
// <prefix>-sync, -stale and -gac); with --remote as well, the third run's
// decisions come from gacd (its thresholds are set there first, through the
// admin API) and fall back to the local decision on a miss.
//
//   gac_train_demo [--steps N] [--staleness S] [--warmup W] [--lr X]
//                  [--every K] [--seed N]
//                  [--gacd HOST:PORT [--token T] [--run-prefix P] [--remote]]
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>

#include "gac/agent/agent.h"
#include "gac/transport/remote_controller.h"
#include "gac/transport/step_record.h"
#include "gac/transport/telemetry.h"
#include "gac/controller/calibration.h"

namespace {

struct Flags {
  int steps = 300;
  int staleness = 8;
  int warmup = 50;
  int every = 50;
  int seed = 1;
  double lr = 0.2;
  std::string gacd;         // "" = no telemetry
  std::string token;
  std::string run_prefix = "demo";
  bool remote = false;
};

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr,
               "error: %s\nusage: gac_train_demo [--steps N] [--staleness S] [--warmup W] [--lr X]\n"
               "                      [--every K] [--seed N]\n"
               "                      [--gacd HOST:PORT [--token T] [--run-prefix P] [--remote]]\n",
               msg);
  std::exit(2);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") Usage("help requested");
    if (a == "--remote") {
      f.remote = true;
      continue;
    }
    if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
    const char* v = argv[++i];
    if (a == "--gacd" || a == "--token" || a == "--run-prefix") {
      (a == "--gacd" ? f.gacd : a == "--token" ? f.token : f.run_prefix) = v;
      continue;
    }
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (end == v || *end != '\0') Usage(("not a number: " + a + " " + v).c_str());
    if (a == "--steps" && x >= 1) f.steps = static_cast<int>(x);
    else if (a == "--staleness" && x >= 0) f.staleness = static_cast<int>(x);
    else if (a == "--every" && x >= 1) f.every = static_cast<int>(x);
    else if (a == "--seed") f.seed = static_cast<int>(x);
    else if (a == "--warmup" && x >= 0) f.warmup = static_cast<int>(x);
    else if (a == "--lr" && x > 0) f.lr = x;
    else Usage(("unknown flag or bad value: " + a + " " + v).c_str());
  }
  if (f.remote && f.gacd.empty()) Usage("--remote needs --gacd");
  return f;
}

struct RunResult {
  std::string name;
  double final_loss = 0.0;
  gac::controller::CalibrationStats stats;
  std::map<std::string, int> regimes;
  double agent_us_per_step = 0.0;
  std::uint64_t fallbacks = 0;
};

// One training run. GAC acts (local mode) from step `gac_from` on when
// `gac_from` > 0; before that, and always when it is 0, it only monitors.
RunResult Run(const Flags& flags, const std::string& name, int staleness, gac::controller::Thresholds thresholds,
              int gac_from, gac::transport::Telemetry* telemetry, const std::string& run_id) {
  at::manual_seed(flags.seed);
  const std::int64_t in = 32, hidden = 128, out = 8, n = 8192;
  const at::Tensor teacher = at::randn({in, out});
  const at::Tensor x_all = at::randn({n, in});
  const at::Tensor y_all = at::tanh(x_all.mm(teacher));
  std::vector<at::Tensor> params = {(at::randn({in, hidden}) * 0.2).set_requires_grad(true),
                                    at::zeros({hidden}).set_requires_grad(true),
                                    (at::randn({hidden, out}) * 0.1).set_requires_grad(true),
                                    at::zeros({out}).set_requires_grad(true)};
  gac::agent::AgentOptions options;
  options.thresholds = thresholds;
  options.mode = gac::agent::Mode::kMonitor;
  gac::agent::Mode acting = gac::agent::Mode::kLocal;
  if (flags.remote && gac_from > 0) {
    gac::transport::RemoteControllerOptions ro;
    ro.address = flags.gacd;
    ro.token = flags.token;
    ro.run = run_id;
    auto remote = gac::transport::RemoteController::Create(ro);
    // gacd decides with the run's settings there: set them first.
    // The run on gacd in remote mode too, the mode this run acts in.
    gac::base::Status st = remote.ok() ? (*remote)->SetThresholds(thresholds, gac::controller::AlphaMode::kPaper,
                                                            "gac_train_demo: calibrated from the synchronous run",
                                                            gac::controller::Mode::kRemote)
                                 : remote.status();
    if (st.ok()) {
      options.decision_source = std::move(*remote);
      acting = gac::agent::Mode::kRemote;
    } else {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
    }
  }
  auto agent_or = gac::agent::Agent::Create(options);
  if (!agent_or.ok()) Usage(agent_or.status().ToString().c_str());
  auto agent = std::move(*agent_or);
  auto loss_of = [&](const std::vector<at::Tensor>& w, const at::Tensor& x, const at::Tensor& y) {
    const at::Tensor h = at::tanh(at::addmm(w[1], x, w[0]));
    return (at::addmm(w[3], h, w[2]) - y).square().mean();
  };

  std::printf("\n== %s: staleness %d, GAC %s, c_low %.4g, c_high %.4g ==\n", name.c_str(), staleness,
              gac_from > 0 ? (std::string(acting == gac::agent::Mode::kRemote ? "deciding remotely in gacd"
                                                                               : "acting in-process") +
                              " from step " + std::to_string(gac_from))
                                 .c_str()
                           : "monitoring",
              thresholds.c_low, thresholds.c_high);
  std::printf("%6s %9s %8s %7s %10s %10s\n", "step", "c_t", "regime", "alpha", "|g|", "loss");
  RunResult result;
  result.name = name;
  gac::controller::CalibrationWindow window(static_cast<std::size_t>(flags.steps), static_cast<std::size_t>(flags.warmup));
  std::deque<std::vector<at::Tensor>> history;  // the last staleness+1 parameter versions
  double agent_seconds = 0.0;
  for (int step = 1; step <= flags.steps; ++step) {
    if (gac_from > 0 && step == gac_from) (void)agent->set_mode(acting);
    {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> version;
      for (const auto& p : params) version.push_back(p.detach().clone());
      history.push_back(std::move(version));
      if (static_cast<int>(history.size()) > staleness + 1) history.pop_front();
    }
    // The behaviour parameters: the oldest version in the ring.
    std::vector<at::Tensor> stale;
    for (const auto& p : history.front()) stale.push_back(p.clone().set_requires_grad(true));
    const at::Tensor idx = at::randint(n, {64}, at::kLong);
    const at::Tensor batch_loss = loss_of(stale, x_all.index_select(0, idx), y_all.index_select(0, idx));
    batch_loss.backward();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = stale[i].grad();

    auto report = agent->Step(step, params);
    if (!report.ok()) {
      std::fprintf(stderr, "agent step failed: %s\n", report.status().ToString().c_str());
      std::exit(1);
    }
    agent_seconds += report->agent_overhead_seconds();
    if (telemetry != nullptr) {
      telemetry->Enqueue(gac::transport::MakeStepRecord(*report, {run_id, 0, 1}, {{"loss", batch_loss.item<double>()}},
                                                        staleness));
    }
    const auto& d = report->decision;
    if (d.cosine) window.Add(*d.cosine);
    if (gac_from > 0 && step >= gac_from) ++result.regimes[gac::controller::RegimeName(d.regime)];
    if (report->step_optimizer) {
      at::NoGradGuard no_grad;
      for (auto& p : params) p.sub_(p.grad() * flags.lr);
    }
    if (step % flags.every == 0 || step == 1) {
      at::NoGradGuard no_grad;
      char c_text[32] = "-";
      if (d.cosine) std::snprintf(c_text, sizeof c_text, "%+.4f", *d.cosine);
      std::printf("%6d %9s %8s %7.3f %10.4g %10.5f\n", step, c_text, gac::controller::RegimeName(d.regime), d.alpha,
                  d.grad_norm, loss_of(params, x_all, y_all).item<double>());
    }
  }
  at::NoGradGuard no_grad;
  result.final_loss = loss_of(params, x_all, y_all).item<double>();
  result.stats = window.Stats(thresholds.c_low);
  result.agent_us_per_step = 1e6 * agent_seconds / flags.steps;
  result.fallbacks = agent->fallbacks();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = Parse(argc, argv);
  std::printf("gac_train_demo: %d steps, warm-up %d, learning rate %g\n", flags.steps, flags.warmup,
              flags.lr);
  std::unique_ptr<gac::transport::Telemetry> telemetry;
  if (!flags.gacd.empty()) {
    gac::transport::TelemetryOptions t;
    t.address = flags.gacd;
    t.token = flags.token;
    auto started = gac::transport::Telemetry::Start(t);
    if (!started.ok()) Usage(started.status().ToString().c_str());
    telemetry = std::move(*started);
    std::printf("streaming every step to gacd at %s (runs %s-sync, %s-stale, %s-gac)\n", flags.gacd.c_str(),
                flags.run_prefix.c_str(), flags.run_prefix.c_str(), flags.run_prefix.c_str());
  }
  const RunResult sync =
      Run(flags, "synchronous", 0, gac::controller::Thresholds{}, 0, telemetry.get(), flags.run_prefix + "-sync");
  auto calibrated = gac::controller::SuggestThresholds(sync.stats);
  if (!calibrated.ok()) {
    std::fprintf(stderr, "calibration failed: %s\n", calibrated.status().ToString().c_str());
    return 1;
  }
  std::printf("\ncalibrated from the synchronous run: q0.9(|c_t|) %.4f, max %.4f -> c_low %.4f, c_high %.4f\n",
              sync.stats.q90, sync.stats.max, calibrated->c_low, calibrated->c_high);
  const RunResult stale =
      Run(flags, "stale", flags.staleness, *calibrated, 0, telemetry.get(), flags.run_prefix + "-stale");
  const RunResult gac_run = Run(flags, "stale + GAC", flags.staleness, *calibrated, flags.warmup + 1,
                                telemetry.get(), flags.run_prefix + "-gac");

  std::printf("\n%-14s %10s %10s %10s %12s   %s\n", "run", "final loss", "q0.9|c_t|", "max|c_t|", "agent us/step",
              "GAC regimes after warm-up");
  for (const RunResult* r : {&sync, &stale, &gac_run}) {
    std::string regimes;
    for (const auto& [name, count] : r->regimes) regimes += name + "=" + std::to_string(count) + " ";
    std::printf("%-14s %10.5f %10.4f %10.4f %12.1f   %s\n", r->name.c_str(), r->final_loss, r->stats.q90, r->stats.max,
                r->agent_us_per_step, regimes.empty() ? "(monitor only)" : regimes.c_str());
  }
  if (flags.remote) {
    std::printf("remote decisions that fell back to the local one: %llu\n",
                static_cast<unsigned long long>(gac_run.fallbacks));
  }
  if (telemetry) {
    const bool flushed = telemetry->Flush(std::chrono::seconds(30));
    const auto c = telemetry->counters();
    std::printf("telemetry: %llu records sent, %llu acknowledged by gacd, %llu dropped%s\n",
                static_cast<unsigned long long>(c.records_sent), static_cast<unsigned long long>(c.records_acknowledged),
                static_cast<unsigned long long>(c.dropped_queue_full), flushed ? "" : " (not all acknowledged yet)");
    telemetry->Close(std::chrono::seconds(5));
    if (!flushed) return 1;
  }
  return 0;
}
