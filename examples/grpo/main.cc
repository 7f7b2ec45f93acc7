// gac_grpo: asynchronous GRPO on two-digit addition with the GAC agent.
//
// Every step: the rollouts of B prompts x G samples come from the policy of
// `--staleness` steps ago (a ring of parameter snapshots), the loss
// (--loss grpo|m2po|bapo) uses importance ratios against that behaviour
// policy, backward, then the agent (--agent monitor|local|remote) sees the
// raw gradient, then gradient clipping and AdamW (unless the agent says
// skip). The reference policy of the KL term is the initial policy.
//
// Outputs: a per-step CSV (--csv), progress lines (--every), and with
// --calibrate-out the |c_t| statistics of this run after --calib-skip steps
// and the thresholds gac::SuggestThresholds derives from them. With --gacd
// every step is streamed to gacd (c_t, regime, alpha, reward, loss, kl,
// entropy, staleness); --agent remote also takes the decisions from gacd,
// after setting the run's thresholds there.
//
// --smoke: a few steps on a small batch, every component exercised; exits
// non-zero on a non-finite loss or an agent error (used by ctest).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "examples/grpo/grpo.h"
#include "gac/agent/agent.h"
#include "gac/controller/calibration.h"
#ifdef GAC_GRPO_WITH_GACD  // a build with the gRPC parts (GAC_WITH_SERVER)
#include "gac/transport/remote_controller.h"
#include "gac/transport/step_record.h"
#include "gac/transport/telemetry.h"
#endif

namespace {

using gac::grpo::LossKind;

struct Flags {
  int steps = 400;
  int staleness = 0;
  int prompts = 32;
  int group = 8;
  int hidden = 128;
  int seed = 1;
  int eval_every = 25;
  int every = 50;
  int calib_skip = 50;
  int sft_steps = 0;
  int sft_batch = 64;
  double sft_lr = 3e-3;
  double lr = 3e-3;
  double weight_decay = 0.01;
  double clip_grad = 1.0;
  double c_low = 0.05, c_high = 0.3;
  gac::AlphaMode alpha_mode = gac::AlphaMode::kPaper;
  gac::grpo::LossOptions loss;
  gac::agent::Mode mode = gac::agent::Mode::kMonitor;
  std::string csv, calibrate_out, gacd, token, run;
  std::string device = "auto";
  bool smoke = false;
};

[[noreturn]] void Usage(const std::string& msg) {
  std::fprintf(stderr,
               "error: %s\n"
               "usage: gac_grpo [--steps N] [--staleness S] [--loss grpo|m2po|bapo]\n"
               "                [--agent monitor|local|remote] [--c-low X --c-high X] [--alpha-mode paper|exact]\n"
               "                [--seed N] [--device auto|cpu|cuda]\n"
               "                [--lr X] [--prompts B] [--group G] [--hidden H] [--clip-grad X]\n"
               "                [--weight-decay X] [--kl-coef X] [--entropy-coef X] [--m2-tau X]\n"
               "                [--clip-eps X] [--eval-every N] [--every N] [--csv FILE]\n"
               "                [--calibrate-out FILE] [--calib-skip N]\n"
               "                [--sft-steps N] [--sft-batch B] [--sft-lr X]\n"
               "                [--gacd HOST:PORT [--token T] [--run ID]] [--smoke]\n",
               msg.c_str());
  std::exit(2);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") Usage("help requested");
    if (a == "--smoke") {
      f.smoke = true;
      continue;
    }
    if (i + 1 >= argc) Usage("missing value for " + a);
    const std::string v = argv[++i];
    if (a == "--csv") { f.csv = v; continue; }
    if (a == "--calibrate-out") { f.calibrate_out = v; continue; }
    if (a == "--gacd") { f.gacd = v; continue; }
    if (a == "--token") { f.token = v; continue; }
    if (a == "--run") { f.run = v; continue; }
    if (a == "--device") {
      if (v != "auto" && v != "cpu" && v != "cuda") Usage("unknown device " + v + " (auto, cpu or cuda)");
      f.device = v;
      continue;
    }
    if (a == "--loss") {
      if (!gac::grpo::ParseLoss(v, &f.loss.kind)) Usage("unknown loss " + v);
      continue;
    }
    if (a == "--alpha-mode") {
      auto m = gac::ParseAlphaMode(v.c_str());
      if (!m.ok()) Usage("unknown alpha mode " + v);
      f.alpha_mode = *m;
      continue;
    }
    if (a == "--agent") {
      auto m = gac::agent::ParseMode(v.c_str());
      if (!m.ok()) Usage("unknown agent mode " + v);
      f.mode = *m;
      continue;
    }
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !std::isfinite(x)) Usage("not a number: " + a + " " + v);
    if (a == "--steps" && x >= 1) f.steps = static_cast<int>(x);
    else if (a == "--staleness" && x >= 0) f.staleness = static_cast<int>(x);
    else if (a == "--prompts" && x >= 1) f.prompts = static_cast<int>(x);
    else if (a == "--group" && x >= 2) f.group = static_cast<int>(x);
    else if (a == "--hidden" && x >= 1) f.hidden = static_cast<int>(x);
    else if (a == "--seed") f.seed = static_cast<int>(x);
    else if (a == "--eval-every" && x >= 1) f.eval_every = static_cast<int>(x);
    else if (a == "--every" && x >= 1) f.every = static_cast<int>(x);
    else if (a == "--calib-skip" && x >= 0) f.calib_skip = static_cast<int>(x);
    else if (a == "--sft-steps" && x >= 0) f.sft_steps = static_cast<int>(x);
    else if (a == "--sft-batch" && x >= 1) f.sft_batch = static_cast<int>(x);
    else if (a == "--sft-lr" && x > 0) f.sft_lr = x;
    else if (a == "--lr" && x > 0) f.lr = x;
    else if (a == "--weight-decay" && x >= 0) f.weight_decay = x;
    else if (a == "--clip-grad" && x > 0) f.clip_grad = x;
    else if (a == "--c-low" && x > 0) f.c_low = x;
    else if (a == "--c-high" && x > 0) f.c_high = x;
    else if (a == "--kl-coef" && x >= 0) f.loss.kl_coef = x;
    else if (a == "--entropy-coef" && x >= 0) f.loss.entropy_coef = x;
    else if (a == "--m2-tau" && x > 0) f.loss.m2_tau = x;
    else if (a == "--clip-eps" && x > 0 && x < 1) f.loss.clip_eps = x;
    else Usage("unknown flag or bad value: " + a + " " + v);
  }
  if (f.smoke) {
    f.steps = 6;
    f.prompts = 4;
    f.group = 4;
    f.hidden = 16;
    f.eval_every = 3;
    f.every = 1;
    f.calib_skip = 0;
    f.sft_steps = std::min(f.sft_steps, 3);
    if (f.staleness == 0) f.staleness = 2;
  }
  if (f.mode == gac::agent::Mode::kRemote && f.gacd.empty()) Usage("--agent remote needs --gacd");
#ifndef GAC_GRPO_WITH_GACD
  if (!f.gacd.empty()) Usage("--gacd: this build has no gRPC parts (configure with GAC_WITH_SERVER=ON)");
#endif
  if (f.run.empty()) {
    f.run = std::string("grpo-") + gac::grpo::LossName(f.loss.kind) + "-" + gac::agent::ModeName(f.mode) + "-s" +
            std::to_string(f.staleness) + "-seed" + std::to_string(f.seed);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = Parse(argc, argv);
  at::set_num_threads(1);  // tiny matrices: threading costs more than it gains
  at::manual_seed(static_cast<std::uint64_t>(flags.seed));
  std::mt19937_64 rng(static_cast<std::uint64_t>(flags.seed) * 0x9e3779b97f4a7c15ull + 1);

  // CPU by default; CUDA when this LibTorch has it and a GPU is visible.
  const bool cuda = flags.device == "cuda" || (flags.device == "auto" && at::hasCUDA());
  if (cuda && !at::hasCUDA()) Usage("--device cuda: this LibTorch build has no CUDA, or no GPU is visible");
  const at::Device device = cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);

  const gac::grpo::AdditionTask task;
  gac::grpo::Policy policy = gac::grpo::Policy::Init(flags.hidden, device);
  if (flags.sft_steps > 0) {
    const double ce = gac::grpo::SupervisedWarmup(policy, task, flags.sft_steps, flags.sft_batch, flags.sft_lr, rng);
    std::printf("supervised warm-up: %d steps, cross-entropy %.4f, held-out accuracy %.4f\n", flags.sft_steps, ce,
                gac::grpo::Evaluate(policy, task.heldout()));
  }
  const gac::grpo::Policy reference = policy.Snapshot();
  gac::grpo::AdamW optimizer(policy.params, flags.lr, flags.weight_decay);

  gac::agent::AgentOptions options;
  options.thresholds = {flags.c_low, flags.c_high};
  options.alpha_mode = flags.alpha_mode;
  options.mode = flags.mode;
  options.num_threads = 1;
#ifdef GAC_GRPO_WITH_GACD
  std::unique_ptr<gac::transport::Telemetry> telemetry;
  if (!flags.gacd.empty()) {
    gac::transport::TelemetryOptions t;
    t.address = flags.gacd;
    t.token = flags.token;
    auto started = gac::transport::Telemetry::Start(t);
    if (!started.ok()) Usage("telemetry: " + started.status().ToString());
    telemetry = std::move(*started);
  }
  if (flags.mode == gac::agent::Mode::kRemote) {
    gac::transport::RemoteControllerOptions ro;
    ro.address = flags.gacd;
    ro.token = flags.token;
    ro.run = flags.run;
    auto remote = gac::transport::RemoteController::Create(ro);
    if (!remote.ok()) Usage("remote controller: " + remote.status().ToString());
    // gacd decides with the run's settings there: set them first.
    const gac::Status st = (*remote)->SetRunThresholds(
        {flags.c_low, flags.c_high}, flags.alpha_mode, "gac_grpo: thresholds calibrated from the synchronous run");
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    options.decision_source = std::move(*remote);
  }
#endif
  auto agent_or = gac::agent::Agent::Create(options);
  if (!agent_or.ok()) Usage("agent: " + agent_or.status().ToString());
  auto agent = std::move(*agent_or);

  std::FILE* csv = nullptr;
  if (!flags.csv.empty()) {
    csv = std::fopen(flags.csv.c_str(), "w");
    if (csv == nullptr) Usage("cannot write " + flags.csv);
    std::fprintf(csv,
                 "step,staleness,reward,exact,heldout_acc,loss,pg_loss,kl,entropy,cosine,regime,alpha,grad_norm,"
                 "stepped,clip_frac,m2,abs_log_ratio,bapo_lo,bapo_hi\n");
  }
  std::printf("gac_grpo: run %s, loss %s, agent %s, device %s, staleness %d, %d steps, %d prompts x %d samples, "
              "%lld parameters, lr %g, c_low %.4g, c_high %.4g, alpha %s\n",
              flags.run.c_str(), gac::grpo::LossName(flags.loss.kind), gac::agent::ModeName(flags.mode),
              device.str().c_str(),
              flags.staleness, flags.steps, flags.prompts, flags.group,
              static_cast<long long>(policy.NumParameters()), flags.lr, flags.c_low, flags.c_high,
              gac::AlphaModeName(flags.alpha_mode));
  std::printf("%6s %7s %7s %8s %9s %8s %7s %8s\n", "step", "reward", "heldout", "entropy", "c_t", "regime", "alpha",
              "|g|");

  gac::CalibrationWindow window(static_cast<std::size_t>(flags.steps), static_cast<std::size_t>(flags.calib_skip));
  std::deque<gac::grpo::Policy> ring;  // the last staleness+1 policy versions; front() = behaviour
  std::map<std::string, int> regimes;
  double last_heldout = gac::grpo::Evaluate(policy, task.heldout());
  double reward_tail = 0.0;
  int reward_tail_n = 0, skipped = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int step = 1; step <= flags.steps; ++step) {
    ring.push_back(policy.Snapshot());
    if (static_cast<int>(ring.size()) > flags.staleness + 1) ring.pop_front();
    const int behind = static_cast<int>(ring.size()) - 1;  // versions the behaviour policy lags

    const auto prompts = task.SamplePrompts(flags.prompts, rng);
    const gac::grpo::Rollouts batch = gac::grpo::Generate(ring.front(), prompts, flags.group);
    for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
    const gac::grpo::LossResult loss = gac::grpo::ComputeLoss(policy, reference, batch, flags.loss);
    if (!std::isfinite(loss.loss.item<double>())) {
      std::fprintf(stderr, "step %d: non-finite loss\n", step);
      return 1;
    }
    loss.loss.backward();

    auto report = agent->Step(step, policy.params);
    if (!report.ok()) {
      std::fprintf(stderr, "step %d: agent: %s\n", step, report.status().ToString().c_str());
      return 1;
    }
    const gac::Decision& d = report->decision;
    if (d.cosine) window.Add(*d.cosine);
    ++regimes[gac::RegimeName(d.regime)];
    if (report->step_optimizer) {
      gac::grpo::ClipGradNorm(policy.params, flags.clip_grad);
      optimizer.Step(policy.params);
    } else {
      ++skipped;
    }

    const bool eval_now = step % flags.eval_every == 0 || step == flags.steps;
    if (eval_now) last_heldout = gac::grpo::Evaluate(policy, task.heldout());
    if (step > flags.steps - 20) {
      reward_tail += batch.mean_reward;
      ++reward_tail_n;
    }
#ifdef GAC_GRPO_WITH_GACD
    if (telemetry) {
      telemetry->Enqueue(gac::transport::MakeStepRecord(
          *report, {flags.run, 0, 1}, agent->options().mode,
          {{"reward", batch.mean_reward}, {"loss", loss.pg_loss}, {"kl", loss.kl}, {"entropy", loss.entropy},
           {"heldout_acc", last_heldout}},
          behind));
    }
#endif
    if (csv != nullptr) {
      char cos_text[32] = "";
      if (d.cosine) std::snprintf(cos_text, sizeof cos_text, "%.6f", *d.cosine);
      char eval_text[32] = "";
      if (eval_now) std::snprintf(eval_text, sizeof eval_text, "%.4f", last_heldout);
      std::fprintf(csv, "%d,%d,%.5f,%.5f,%s,%.6g,%.6g,%.6g,%.6g,%s,%s,%.5f,%.6g,%d,%.5f,%.6g,%.6g,%.3f,%.3f\n", step,
                   behind, batch.mean_reward, batch.exact_match, eval_text, loss.loss.item<double>(), loss.pg_loss,
                   loss.kl, loss.entropy, cos_text, gac::RegimeName(d.regime), d.alpha, d.grad_norm,
                   report->step_optimizer ? 1 : 0, loss.clip_fraction, loss.m2, loss.mean_abs_log_ratio, loss.bapo_lo,
                   loss.bapo_hi);
      std::fflush(csv);  // followed live (scripts/demo_run.sh's progress line)
    }
    if (step % flags.every == 0 || step == 1) {
      char c_text[32] = "-";
      if (d.cosine) std::snprintf(c_text, sizeof c_text, "%+.4f", *d.cosine);
      std::printf("%6d %7.3f %7.3f %8.4f %9s %8s %7.3f %8.4g\n", step, batch.mean_reward, last_heldout, loss.entropy,
                  c_text, gac::RegimeName(d.regime), d.alpha, d.grad_norm);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (csv != nullptr) std::fclose(csv);

  const gac::CalibrationStats stats = window.Stats(flags.c_low);
  std::string regime_text;
  for (const auto& [name, count] : regimes) regime_text += name + "=" + std::to_string(count) + " ";
  std::printf("summary: run=%s final_reward=%.4f heldout_acc=%.4f steps_per_s=%.1f q90=%.4f max=%.4f "
              "frac_le_c_low=%.3f skipped=%d fallbacks=%llu regimes: %s\n",
              flags.run.c_str(), reward_tail_n ? reward_tail / reward_tail_n : 0.0, last_heldout,
              flags.steps / seconds, stats.q90, stats.max, stats.frac_le_c_low, skipped,
              static_cast<unsigned long long>(agent->fallbacks()), regime_text.c_str());
  if (!flags.calibrate_out.empty()) {
    auto t = gac::SuggestThresholds(stats, flags.smoke ? 1 : 20);
    if (!t.ok()) {
      std::fprintf(stderr, "calibration failed: %s\n", t.status().ToString().c_str());
      return 1;
    }
    std::FILE* f = std::fopen(flags.calibrate_out.c_str(), "w");
    if (f == nullptr) Usage("cannot write " + flags.calibrate_out);
    std::fprintf(f, "c_low=%.6g\nc_high=%.6g\nq90=%.6g\nmax=%.6g\ncount=%zu\n", t->c_low, t->c_high, stats.q90,
                 stats.max, stats.count);
    std::fclose(f);
    std::printf("calibration: q0.9 %.4f, max %.4f over %zu steps -> c_low %.4g, c_high %.4g\n", stats.q90, stats.max,
                stats.count, t->c_low, t->c_high);
  }
#ifdef GAC_GRPO_WITH_GACD
  if (telemetry) {
    const bool flushed = telemetry->Flush(std::chrono::seconds(30));
    const auto c = telemetry->counters();
    std::printf("telemetry: %llu records sent, %llu acknowledged, %llu dropped\n",
                static_cast<unsigned long long>(c.records_sent),
                static_cast<unsigned long long>(c.records_acknowledged),
                static_cast<unsigned long long>(c.dropped_queue_full));
    telemetry->Close(std::chrono::seconds(5));
    if (!flushed) return 1;
  }
#endif
  return 0;
}
