// gac_grpo: asynchronous GRPO on digit tasks with the GAC agent.
//
// Every rollout batch (B prompts x G samples) comes from the policy
// `--staleness` optimizer steps behind the learner (a ring of parameter
// snapshots). As in the paper, a skipped update leaves the weights unchanged,
// so after s skips the samplers are on-policy again; `--lag versions` instead
// counts the lag in applied updates (a skip does not advance it: a system
// whose samplers wait for the next weight version). The batch is used for `--epochs` passes of
// `--minibatches` optimizer steps each (PPO-style; 1 x 1 by default). Each
// step: the loss (--loss grpo|m2po|bapo|is) with importance ratios against
// the behaviour policy, backward (as two half-batch backwards whose cosine is
// the noise floor), then the agent (--agent monitor|local|remote) sees the
// raw gradient, then gradient clipping and AdamW unless the update is
// skipped. GAC's trigger is the paper's per-step |c_t| or (--trigger window)
// the signed mean of c_t over --window steps (AgentOptions::trigger, with
// --c-low/--c-high as the thresholds of the mean). The reference
// policy of the KL term is the policy after the supervised warm-up.
//
// Measurements besides c_t: the noise floor every step, the participation
// ratio of per-sample gradients every --pr-every steps, and the staleness
// bias b_t against a fresh on-policy batch every --mech-every steps
// (probes.h). Controls: --random-skip P skips each update with probability P;
// --skip-steps FILE skips exactly the steps listed in FILE (one per line).
//
// Outputs: a per-step CSV (--csv; its last columns are the batch's
// policy-health signals, policy_signals.h), progress lines (--every), and
// with --calibrate-out the |c_t| and |m_t| statistics of this run after
// --calib-skip steps. With --gacd every step is streamed to gacd (c_t,
// regime, alpha, reward, loss, kl, entropy, staleness, the policy-health
// signals); --agent remote also takes the decisions from gacd, after setting
// the run's thresholds there.
//
// --smoke: a few steps on a small batch, every component exercised; exits
// non-zero on a non-finite loss or an agent error (used by ctest).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <ctime>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "examples/grpo/grpo.h"
#include "examples/grpo/olmo_skip.h"
#include "examples/grpo/policy_signals.h"
#include "examples/grpo/probes.h"
#include "gac/agent/agent.h"
#include "gac/controller/calibration.h"
#include "gac/controller/window.h"
#ifdef GAC_GRPO_WITH_GACD  // a build with the gRPC parts (GAC_WITH_SERVER)
#include "gac/transport/remote_controller.h"
#include "gac/transport/step_record.h"
#include "gac/transport/telemetry.h"
#endif

namespace {

using gac::grpo::LossKind;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Flags {
  int steps = 400;
  int staleness = 0;
  // An unannounced change of the sampler's lag (the detectors' experiment):
  // from optimizer step jump_at on, the sampler lags by jump_staleness; the
  // telemetry is not told (its staleness stays `staleness`); the CSV's
  // staleness column is the lag the step had.
  int jump_staleness = -1, jump_at = 0;
  int prompts = 32;
  int group = 8;
  int epochs = 1, minibatches = 1;
  gac::grpo::TaskOptions task;
  gac::grpo::PolicyOptions policy;
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
  double beta = 1.0;
  double random_skip = 0.0;
  std::string skip_steps;
  gac::grpo::LagRule lag = gac::grpo::LagRule::kSteps;
  bool window_trigger = false;
  int window = 20;
  bool noise_floor = true;
  int pr_every = 0, pr_groups = 8;
  int mech_every = 0, mech_prompts = 0;
  gac::controller::AlphaMode alpha_mode = gac::controller::AlphaMode::kPaper;
  // The agent's spike guard (off unless --spike-sigma or --max-grad-norm).
  double spike_sigma = 0.0, max_grad_norm = 0.0;
  int spike_window = 128, spike_warmup = 0;
  // Injected gradient spikes: from step inject_after on, each step's
  // gradient is multiplied by inject_scale with probability inject_rate
  // (a gradient that missed its loss-scale unscaling), drawn from a stream
  // of its own, so runs with and without the guard inject at the same steps.
  // With inject_relative = W > 0 the factor makes the step's gradient norm
  // inject_scale times the mean raw norm of the last W steps not injected.
  double inject_rate = 0.0, inject_scale = 1e3;
  int inject_after = 50, inject_relative = 0;
  // OLMo-core's skip-step rule in the trainer (examples/grpo/olmo_skip.h),
  // for comparison with gac's guard: off unless --olmo-skip-sigma.
  double olmo_skip_sigma = 0.0;
  int olmo_skip_window = 128;
  gac::grpo::LossOptions loss;
  gac::agent::Mode mode = gac::agent::Mode::kMonitor;
  std::string csv, calibrate_out, gacd, token, run;
  std::string device = "auto";
  bool smoke = false;
};

[[noreturn]] void Usage(const std::string& msg) {
  std::fprintf(stderr,
               "error: %s\n"
               "usage: gac_grpo [--steps N] [--staleness S] [--jump-staleness S --jump-at STEP]\n"
               "                [--loss grpo|m2po|bapo|is|tis] [--tis-cap C]\n"
               "                [--agent monitor|local|remote] [--c-low X --c-high X] [--alpha-mode paper|exact]\n"
               "                [--trigger step|window] [--window W] [--beta X] [--random-skip P]\n"
               "                [--skip-steps FILE] [--lag steps|versions]\n"
               "                [--seed N] [--device auto|cpu|cuda]\n"
               "                [--task-base B] [--tasks T] [--arch mlp|transformer] [--width W] [--layers L]\n"
               "                [--heads H] [--lr X] [--prompts B] [--group G] [--epochs K] [--minibatches M]\n"
               "                [--clip-grad X] [--weight-decay X] [--kl-coef X] [--entropy-coef X] [--m2-tau X]\n"
               "                [--clip-eps X] [--dual-clip C] [--eval-every N] [--every N] [--csv FILE]\n"
               "                [--noise-floor 0|1] [--pr-every N] [--pr-groups N] [--mech-every N]\n"
               "                [--mech-prompts N] [--calibrate-out FILE] [--calib-skip N]\n"
               "                [--sft-steps N] [--sft-batch B] [--sft-lr X]\n"
               "                [--spike-sigma X] [--spike-window N] [--spike-warmup N] [--max-grad-norm X]\n"
               "                [--inject-spikes P] [--inject-scale X] [--inject-after N] [--inject-relative W]\n"
               "                [--olmo-skip-sigma X] [--olmo-skip-window N]\n"
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
    if (a == "--skip-steps") { f.skip_steps = v; continue; }
    if (a == "--lag") {
      if (!gac::grpo::ParseLagRule(v, &f.lag)) Usage("unknown lag rule " + v + " (steps or versions)");
      continue;
    }
    if (a == "--device") {
      if (v != "auto" && v != "cpu" && v != "cuda") Usage("unknown device " + v + " (auto, cpu or cuda)");
      f.device = v;
      continue;
    }
    if (a == "--loss") {
      if (!gac::grpo::ParseLoss(v, &f.loss.kind)) Usage("unknown loss " + v);
      continue;
    }
    if (a == "--arch") {
      if (!gac::grpo::ParseArch(v, &f.policy.arch)) Usage("unknown arch " + v);
      continue;
    }
    if (a == "--trigger") {
      if (v != "step" && v != "per_step" && v != "window") Usage("unknown trigger " + v + " (step or window)");
      f.window_trigger = v == "window";
      continue;
    }
    if (a == "--alpha-mode") {
      auto m = gac::controller::ParseAlphaMode(v.c_str());
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
    else if (a == "--jump-staleness" && x >= 0) f.jump_staleness = static_cast<int>(x);
    else if (a == "--jump-at" && x >= 1) f.jump_at = static_cast<int>(x);
    else if (a == "--prompts" && x >= 1) f.prompts = static_cast<int>(x);
    else if (a == "--group" && x >= 2) f.group = static_cast<int>(x);
    else if (a == "--epochs" && x >= 1) f.epochs = static_cast<int>(x);
    else if (a == "--minibatches" && x >= 1) f.minibatches = static_cast<int>(x);
    else if (a == "--task-base" && x >= 2 && x <= 64) f.task.base = static_cast<int>(x);
    else if (a == "--tasks" && x >= 1 && x <= gac::grpo::kMaxTasks) f.task.tasks = static_cast<int>(x);
    else if ((a == "--width" || a == "--hidden") && x >= 1) f.policy.width = static_cast<int>(x);
    else if (a == "--layers" && x >= 1) f.policy.layers = static_cast<int>(x);
    else if (a == "--heads" && x >= 1) f.policy.heads = static_cast<int>(x);
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
    else if (a == "--beta" && x > 0) f.beta = x;
    else if (a == "--random-skip" && x >= 0 && x < 1) f.random_skip = x;
    else if (a == "--window" && x >= 1 && x <= gac::controller::kMaxWindow) f.window = static_cast<int>(x);
    else if (a == "--noise-floor" && (x == 0 || x == 1)) f.noise_floor = x == 1;
    else if (a == "--pr-every" && x >= 0) f.pr_every = static_cast<int>(x);
    else if (a == "--pr-groups" && x >= 1) f.pr_groups = static_cast<int>(x);
    else if (a == "--mech-every" && x >= 0) f.mech_every = static_cast<int>(x);
    else if (a == "--mech-prompts" && x >= 1) f.mech_prompts = static_cast<int>(x);
    else if (a == "--kl-coef" && x >= 0) f.loss.kl_coef = x;
    else if (a == "--entropy-coef" && x >= 0) f.loss.entropy_coef = x;
    else if (a == "--m2-tau" && x > 0) f.loss.m2_tau = x;
    else if (a == "--tis-cap" && x > 0) f.loss.tis_cap = x;
    else if (a == "--clip-eps" && x > 0 && x < 1) f.loss.clip_eps = x;
    else if (a == "--dual-clip" && (x == 0 || x > 1)) f.loss.dual_clip_c = x;
    else if (a == "--spike-sigma" && x > 0) f.spike_sigma = x;
    else if (a == "--spike-window" && x >= 2 && x <= gac::controller::kMaxSpikeWindow) f.spike_window = static_cast<int>(x);
    else if (a == "--spike-warmup" && x >= 2) f.spike_warmup = static_cast<int>(x);
    else if (a == "--max-grad-norm" && x > 0) f.max_grad_norm = x;
    else if (a == "--inject-spikes" && x >= 0 && x < 1) f.inject_rate = x;
    else if (a == "--inject-scale" && x > 0) f.inject_scale = x;
    else if (a == "--inject-after" && x >= 0) f.inject_after = static_cast<int>(x);
    else if (a == "--inject-relative" && x >= 0 && x <= 100000) f.inject_relative = static_cast<int>(x);
    else if (a == "--olmo-skip-sigma" && x > 0) f.olmo_skip_sigma = x;
    else if (a == "--olmo-skip-window" && x >= 4) f.olmo_skip_window = static_cast<int>(x);
    else Usage("unknown flag or bad value: " + a + " " + v);
  }
  if (f.smoke) {
    f.steps = 8;
    f.prompts = 4;
    f.group = 4;
    f.policy.width = 16;
    f.eval_every = 3;
    f.every = 1;
    f.calib_skip = 0;
    f.pr_every = 3;
    f.pr_groups = 2;
    f.mech_every = 2;
    f.window = 3;
    f.sft_steps = std::min(f.sft_steps, 3);
    if (f.staleness == 0) f.staleness = 2;
  }
  if (f.mech_prompts == 0) f.mech_prompts = f.prompts;
  if (f.prompts % f.minibatches != 0) Usage("--prompts must be a multiple of --minibatches");
  if (f.policy.arch == gac::grpo::Arch::kTransformer && f.policy.width % f.policy.heads != 0) {
    Usage("--heads must divide --width");
  }
  if (f.mode == gac::agent::Mode::kRemote && f.gacd.empty()) Usage("--agent remote needs --gacd");
  if ((f.jump_staleness >= 0) != (f.jump_at > 0)) Usage("--jump-staleness and --jump-at go together");
#ifndef GAC_GRPO_WITH_GACD
  if (!f.gacd.empty()) Usage("--gacd: this build has no gRPC parts (configure with GAC_WITH_SERVER=ON)");
#endif
  if (f.run.empty()) {
    f.run = std::string("grpo-") + gac::grpo::LossName(f.loss.kind) + "-" + gac::agent::ModeName(f.mode) + "-s" +
            std::to_string(f.staleness) + "-seed" + std::to_string(f.seed);
  }
  return f;
}

// Quantile of |values| (linear interpolation); NaN when empty.
double AbsQuantile(std::vector<double> values, double q) {
  for (double& v : values) v = std::fabs(v);
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return !std::isfinite(v); }), values.end());
  if (values.empty()) return kNaN;
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

// "%.6g" or "" for NaN / absent, for the CSV.
std::string Num(double v) {
  if (!std::isfinite(v)) return "";
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

// The policy-health columns, appended after the CSV's other columns, named
// and ordered as gac::controller::kPolicyReals (an empty cell: absent).
// ",name" for each policy-health column.
std::string PolicyHeader() {
  std::string out;
  for (const gac::controller::PolicyReal& column : gac::controller::kPolicyReals) {
    out += ',';
    out += column.name;
  }
  return out;
}

// ",value" for each policy-health column ("%.6g", empty when absent).
std::string PolicyCells(const gac::controller::PolicyHealth& health) {
  std::string out;
  for (const gac::controller::PolicyReal& column : gac::controller::kPolicyReals) {
    const std::optional<double>& v = health.*column.member;
    out += ',';
    if (v) out += Num(*v);
  }
  return out;
}

// The factor of an injected gradient spike: `scale`, or, with a window W > 0,
// the factor that makes the step's gradient norm `scale` times the mean raw
// norm of the last W steps that were not injected (`scale` until one was
// seen, or for a zero norm).
class SpikeFactor {
 public:
  SpikeFactor(double scale, int window) : scale_(scale), window_(static_cast<std::size_t>(window)) {}
  bool relative() const { return window_ > 0; }
  double Factor(double norm) const {
    if (!relative() || recent_.empty() || !(norm > 0.0)) return scale_;
    return scale_ * (sum_ / static_cast<double>(recent_.size())) / norm;
  }
  void Observe(double norm) {
    if (!relative() || !std::isfinite(norm)) return;
    recent_.push_back(norm);
    sum_ += norm;
    if (recent_.size() > window_) {
      sum_ -= recent_.front();
      recent_.pop_front();
    }
  }

 private:
  double scale_;
  std::size_t window_;
  std::deque<double> recent_;
  double sum_ = 0.0;
};

// ||g|| over the parameters' gradients.
double GradNorm(const std::vector<at::Tensor>& params) {
  double sq = 0.0;
  for (const auto& p : params) {
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sq);
}

// The prompt groups of minibatch `mb` of `minibatches` in `order`.
std::vector<int> MinibatchGroups(const std::vector<int>& order, int mb, int minibatches) {
  const std::size_t per = order.size() / static_cast<std::size_t>(minibatches);
  return std::vector<int>(order.begin() + static_cast<std::ptrdiff_t>(per * mb),
                          order.begin() + static_cast<std::ptrdiff_t>(per * (mb + 1)));
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = Parse(argc, argv);
  std::set<int> forced_skips;  // --skip-steps
  if (!flags.skip_steps.empty()) {
    std::ifstream in(flags.skip_steps);
    if (!in) Usage("cannot read " + flags.skip_steps);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      char* end = nullptr;
      const long v = std::strtol(line.c_str(), &end, 10);
      if (end == line.c_str() || *end != '\0' || v < 1) Usage(flags.skip_steps + ": not a step number: " + line);
      forced_skips.insert(static_cast<int>(v));
    }
  }
  at::set_num_threads(1);  // tiny matrices: threading costs more than it gains
  at::manual_seed(static_cast<std::uint64_t>(flags.seed));
  std::mt19937_64 rng(static_cast<std::uint64_t>(flags.seed) * 0x9e3779b97f4a7c15ull + 1);
  // Streams of their own, so the controls and probes leave the run's prompts and samples unchanged.
  std::mt19937_64 skip_rng(static_cast<std::uint64_t>(flags.seed) * 0x9e3779b97f4a7c15ull + 2);
  std::mt19937_64 probe_rng(static_cast<std::uint64_t>(flags.seed) * 0x9e3779b97f4a7c15ull + 3);
  std::mt19937_64 inject_rng(static_cast<std::uint64_t>(flags.seed) * 0x9e3779b97f4a7c15ull + 4);
  SpikeFactor spike_factor(flags.inject_scale, flags.inject_relative);
  std::optional<gac::grpo::OlmoSkipRule> olmo_rule;
  if (flags.olmo_skip_sigma > 0.0) olmo_rule.emplace(flags.olmo_skip_sigma, flags.olmo_skip_window);
  at::Generator probe_gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(flags.seed) + 7919);

  // CPU by default; CUDA when this LibTorch has it and a GPU is visible.
  const bool cuda = flags.device == "cuda" || (flags.device == "auto" && at::hasCUDA());
  if (cuda && !at::hasCUDA()) Usage("--device cuda: this LibTorch build has no CUDA, or no GPU is visible");
  const at::Device device = cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  if (cuda && flags.mech_every > 0) Usage("--mech-every: the probe samples with a CPU generator; use --device cpu");

  const gac::grpo::DigitTasks tasks(flags.task);
  gac::grpo::Policy policy = gac::grpo::Policy::Init(flags.policy, flags.task, device);
  if (flags.sft_steps > 0) {
    const double ce = gac::grpo::SupervisedWarmup(policy, tasks, flags.sft_steps, flags.sft_batch, flags.sft_lr, rng);
    std::printf("supervised warm-up: %d steps, cross-entropy %.4f, held-out accuracy %.4f\n", flags.sft_steps, ce,
                gac::grpo::Evaluate(policy, tasks, tasks.heldout()));
  } else {
    std::printf("start: held-out accuracy %.4f\n", gac::grpo::Evaluate(policy, tasks, tasks.heldout()));
  }
  const gac::grpo::Policy reference = policy.Snapshot();
  gac::grpo::AdamW optimizer(policy.params, flags.lr, flags.weight_decay);

  gac::agent::AgentOptions options;
  options.thresholds = {flags.c_low, flags.c_high};
  options.alpha_mode = flags.alpha_mode;
  options.mode = flags.mode;
  options.num_threads = 1;
  // The window is kept whatever the trigger: every report carries m_t.
  options.trigger.trigger =
      flags.window_trigger ? gac::controller::Trigger::kWindow : gac::controller::Trigger::kPerStep;
  options.trigger.window = flags.window;
  options.trigger.window_thresholds = options.thresholds;
  options.spike.max_grad_norm = flags.max_grad_norm;
  options.spike.zscore = flags.spike_sigma > 0.0;
  if (options.spike.zscore) options.spike.sigma = flags.spike_sigma;
  options.spike.window = flags.spike_window;
  options.spike.warmup = flags.spike_warmup;
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
    // gacd decides with the run's settings there: set them first, and the
    // run's mode to remote (the mode this trainer runs in).
    const gac::base::Status st = (*remote)->SetThresholds({flags.c_low, flags.c_high}, flags.alpha_mode,
                                                    "gac_grpo: thresholds calibrated from the synchronous run",
                                                    gac::controller::Mode::kRemote);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    // The trigger too: with --trigger window gacd decides on m_t, with the
    // same thresholds applied to |m_t| (and per step otherwise).
    const gac::base::Status tr = (*remote)->SetTrigger(options.trigger, flags.alpha_mode,
                                                       "gac_grpo: the trigger of this run");
    if (!tr.ok()) {
      std::fprintf(stderr, "%s\n", tr.ToString().c_str());
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
                 "step,version,staleness,reward,exact,heldout_acc,loss,pg_loss,kl,entropy,sampler_kl,cosine,"
                 "window_mean,noise_cos,regime,alpha,grad_norm,stepped,clip_frac,dual_clip_frac,m2,abs_log_ratio,"
                 "bapo_lo,bapo_hi,pr_sample,pr_pop,pair_cos2,bias_rel,lambda,on_align,aligned_before,aligned_after,"
                 "bias_after_rel,lag_updates,grad_scale,drift,injected,grad_norm_z,inject_factor%s\n",
                 PolicyHeader().c_str());
  }
  std::printf("gac_grpo: run %s, loss %s, agent %s, trigger %s, device %s, staleness %d (%s), %d steps, "
              "%d prompts x %d samples, %d epochs x %d minibatches, %s width %d layers %d, base %d, %d tasks, "
              "%lld parameters, lr %g, c_low %.4g, c_high %.4g, alpha %s, beta %g, random skip %g\n",
              flags.run.c_str(), gac::grpo::LossName(flags.loss.kind), gac::agent::ModeName(flags.mode),
              flags.window_trigger ? ("window " + std::to_string(flags.window)).c_str() : "step",
              device.str().c_str(), flags.staleness, gac::grpo::LagRuleName(flags.lag), flags.steps, flags.prompts, flags.group, flags.epochs,
              flags.minibatches, gac::grpo::ArchName(flags.policy.arch), flags.policy.width, flags.policy.layers,
              flags.task.base, flags.task.tasks, static_cast<long long>(policy.NumParameters()), flags.lr,
              flags.c_low, flags.c_high, gac::controller::AlphaModeName(flags.alpha_mode), flags.beta, flags.random_skip);
  std::printf("%6s %7s %7s %8s %9s %9s %8s %7s %8s\n", "step", "reward", "heldout", "entropy", "c_t", "noise",
              "regime", "alpha", "|g|");

  gac::grpo::PolicyLag lag(policy.Snapshot(), flags.staleness, flags.lag);
  // m_t of every run, for the detectors and the CSV: the agent's own window
  // holds the same cosines (checked in --smoke), but in remote mode the
  // decision is gacd's.
  gac::controller::AlignmentWindow detector(flags.window);
  gac::grpo::GradList prev_raw;                    // the previous raw gradient (beta, the bias probe)
  std::vector<double> calib_c, calib_m, calib_noise;
  std::map<std::string, int> regimes;
  double last_heldout = gac::grpo::Evaluate(policy, tasks, tasks.heldout());
  double reward_tail = 0.0, pr_sum = 0.0;
  int reward_tail_n = 0, skipped = 0, pr_n = 0, injected_steps = 0, injected_judged = 0;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const auto start = std::chrono::steady_clock::now();
  int step = 0;
  while (step < flags.steps) {
    const std::int64_t behaviour_version = lag.behaviour_version(), behaviour_step = lag.behaviour_step();
    const gac::grpo::Rollouts batch =
        gac::grpo::Generate(lag.behaviour(), tasks, tasks.SamplePrompts(flags.prompts, rng), flags.group);
    for (int epoch = 0; epoch < flags.epochs && step < flags.steps; ++epoch) {
      std::vector<int> order(static_cast<std::size_t>(flags.prompts));
      std::iota(order.begin(), order.end(), 0);
      if (flags.minibatches > 1) std::shuffle(order.begin(), order.end(), rng);
      for (int mb = 0; mb < flags.minibatches && step < flags.steps; ++mb) {
        ++step;
        if (step == flags.jump_at) lag.SetStaleness(flags.jump_staleness);  // takes effect from the next rollouts
        // The behaviour policy's lag, in the lag rule's unit, and in applied updates.
        const int lag_updates = static_cast<int>(lag.version() - behaviour_version);
        const int behind = flags.lag == gac::grpo::LagRule::kSteps ? static_cast<int>(step - 1 - behaviour_step)
                                                                    : lag_updates;
        const gac::grpo::Rollouts sub =
            flags.minibatches == 1 ? batch : batch.Groups(MinibatchGroups(order, mb, flags.minibatches));
        // The drift over the lag window: how far the learner's weights have
        // moved since the behaviour policy's, ||theta - theta_behaviour||
        // (0 on-policy), what the lr-scaled controls are matched on.
        double drift = 0.0;
        {
          at::NoGradGuard no_grad;
          const std::vector<at::Tensor>& old_params = lag.behaviour().params;
          for (std::size_t i = 0; i < policy.params.size(); ++i) {
            drift += (policy.params[i] - old_params[i]).square().sum().item<double>();
          }
          drift = std::sqrt(drift);
        }

        // Loss and gradient (with the noise floor).
        const gac::grpo::LossResult loss = gac::grpo::ComputeLoss(policy, reference, sub, flags.loss);
        if (!std::isfinite(loss.loss.item<double>())) {
          std::fprintf(stderr, "step %d: non-finite loss\n", step);
          return 1;
        }
        // The batch's policy-health signals, against the learner's version
        // now (the batch's sequences share one behaviour version).
        const gac::controller::PolicyHealth health = gac::grpo::ComputePolicySignals(
            gac::grpo::BatchSignalInputs(sub, loss, flags.loss, behaviour_version, lag.version()));
        if (flags.smoke && (health.invalid || !health.ess_token || !health.kl_k3 || !health.entropy_mean)) {
          std::fprintf(stderr, "step %d: the policy-health signals of a finite batch are missing\n", step);
          return 1;
        }
        double noise_cos = kNaN;
        if (flags.noise_floor) {
          noise_cos = gac::grpo::BackwardInHalves(policy.params, loss.token_loss, sub.prompts, sub.group);
        } else {
          for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
          loss.loss.backward();
        }
        const bool injected = step > flags.inject_after && flags.inject_rate > 0.0 && unit(inject_rng) < flags.inject_rate;
        const double raw_norm = spike_factor.relative() ? GradNorm(policy.params) : kNaN;
        double inject_factor = kNaN;
        if (injected) {
          ++injected_steps;
          inject_factor = spike_factor.Factor(raw_norm);
          at::NoGradGuard no_grad;
          for (auto& p : policy.params) p.mutable_grad().mul_(inject_factor);
        } else {
          spike_factor.Observe(raw_norm);
        }
        const gac::grpo::GradList raw = gac::grpo::CopyGrads(policy.params);
        gac::grpo::EffectiveDimension dim;
        if (flags.pr_every > 0 && step % flags.pr_every == 0) {
          dim = gac::grpo::MeasureEffectiveDimension(policy, reference, sub, flags.pr_groups, flags.loss);
          if (std::isfinite(dim.pr_pop)) {
            pr_sum += dim.pr_pop;
            ++pr_n;
          }
        }

        // GAC.
        auto report = agent->Step(step, policy.params, loss.loss.item<double>());
        if (!report.ok()) {
          std::fprintf(stderr, "step %d: agent: %s\n", step, report.status().ToString().c_str());
          return 1;
        }
        report->policy = health;  // the record carries them
        const gac::controller::Decision& d = report->decision;
        if (report->gradient_modified && flags.beta != 1.0) {
          gac::grpo::ApplyOrthogonalGain(policy.params, prev_raw, d.alpha, *d.cosine * d.grad_norm / d.ref_norm,
                                         flags.beta);
        }
        gac::grpo::StalenessBias bias;
        const bool probe = flags.mech_every > 0 && step % flags.mech_every == 0 && !prev_raw.empty();
        if (probe) {
          // What GAC applies (or, in monitor mode, would apply) to this gradient.
          const bool project = d.regime == gac::controller::Regime::kProject;
          bias = gac::grpo::MeasureStalenessBias(policy, reference, tasks, flags.mech_prompts, flags.group, flags.loss,
                                                 raw, prev_raw, project ? d.alpha : 1.0,
                                                 project ? flags.beta : 1.0, probe_rng, probe_gen);
        }
        const bool random_skip = flags.random_skip > 0.0 && unit(skip_rng) < flags.random_skip;
        const bool olmo_skip = olmo_rule && olmo_rule->Skip(loss.loss.item<double>(), d.grad_norm);
        const bool stepped = report->step_optimizer && !random_skip && !olmo_skip && forced_skips.count(step) == 0;
        // |gradient applied| / |raw gradient| (before clipping): 0 on a skip.
        double grad_scale = 0.0;
        if (stepped) {
          double applied = 0.0;
          for (const auto& p : policy.params) applied += p.grad().to(at::kDouble).pow(2).sum().item<double>();
          grad_scale = d.grad_norm > 0.0 ? std::sqrt(applied) / d.grad_norm : 1.0;
          gac::grpo::ClipGradNorm(policy.params, flags.clip_grad);
          optimizer.Step(policy.params);
        } else {
          ++skipped;
        }
        lag.Advance(policy, stepped);
        // The agent's snapshot: the raw gradient, also after a skip; kept after an invalid step.
        if (d.regime != gac::controller::Regime::kInvalid && d.regime != gac::controller::Regime::kSpike) prev_raw = raw;

        // Bookkeeping.
        // A spike enters no window (as in the agent's).
        if (d.cosine && d.regime != gac::controller::Regime::kSpike) detector.Add(*d.cosine);
        const std::optional<double> m = detector.mean();
        // --smoke with the guard on: an injected step it judged (past its
        // warm-up) must be a spike; a non-finite z-score is a bug.
        if (flags.smoke && injected && d.spike_verdict.grad_norm) {
          ++injected_judged;
          if (d.regime != gac::controller::Regime::kSpike || !std::isfinite(d.spike_verdict.grad_norm->z)) {
            std::fprintf(stderr, "step %d: an injected spike (z %g) was not skipped\n", step, d.spike_verdict.grad_norm->z);
            return 1;
          }
        }
        if (flags.smoke && flags.mode != gac::agent::Mode::kRemote && d.window_mean != m) {
          std::fprintf(stderr, "step %d: the report's window mean differs from the trainer's\n", step);
          return 1;
        }
        if (step > flags.calib_skip) {
          if (d.cosine) calib_c.push_back(*d.cosine);
          if (m) calib_m.push_back(*m);
          if (std::isfinite(noise_cos)) calib_noise.push_back(noise_cos);
        }
        ++regimes[gac::controller::RegimeName(d.regime)];
        const bool eval_now = step % flags.eval_every == 0 || step == flags.steps;
        if (eval_now) last_heldout = gac::grpo::Evaluate(policy, tasks, tasks.heldout());
        if (step > flags.steps - 20) {
          reward_tail += sub.mean_reward;
          ++reward_tail_n;
        }
#ifdef GAC_GRPO_WITH_GACD
        if (telemetry) {
          telemetry->Enqueue(gac::transport::MakeStepRecord(
              *report, {flags.run, 0, 1},
              {{"reward", sub.mean_reward}, {"loss", loss.pg_loss}, {"kl", loss.kl}, {"entropy", loss.entropy},
               {"heldout_acc", last_heldout}, {"noise_cos", noise_cos},
               {"sampler_kl", loss.sampler_kl}},
              flags.jump_at > 0 ? flags.staleness : behind));  // an unannounced jump stays unannounced
        }
#endif
        if (csv != nullptr) {
          std::fprintf(
              csv,
              "%d,%lld,%d,%.5f,%.5f,%s,%.6g,%.6g,%.6g,%.6g,%.6g,%s,%s,%s,%s,%.5f,%.6g,%d,%.5f,%.5f,%.6g,%.6g,%.3f,%.3f,"
              "%s,%s,%s,%s,%s,%s,%s,%s,%s,%d,%.6g,%.6g,%d,%s,%s%s\n",
              step, static_cast<long long>(lag.version()), behind, sub.mean_reward, sub.exact_match,
              eval_now ? Num(last_heldout).c_str() : "", loss.loss.item<double>(), loss.pg_loss, loss.kl,
              loss.entropy, loss.sampler_kl, d.cosine ? Num(*d.cosine).c_str() : "", m ? Num(*m).c_str() : "",
              Num(noise_cos).c_str(), gac::controller::RegimeName(d.regime), d.alpha, d.grad_norm, stepped ? 1 : 0,
              loss.clip_fraction, loss.dual_clip_fraction, loss.m2, loss.mean_abs_log_ratio, loss.bapo_lo,
              loss.bapo_hi, dim.samples ? Num(dim.pr_sample).c_str() : "", dim.samples ? Num(dim.pr_pop).c_str() : "",
              dim.samples ? Num(dim.mean_pair_cos2).c_str() : "", probe ? Num(bias.bias_rel).c_str() : "",
              probe ? Num(bias.lambda).c_str() : "", probe ? Num(bias.on_align).c_str() : "",
              probe ? Num(bias.aligned_before).c_str() : "", probe ? Num(bias.aligned_after).c_str() : "",
              probe ? Num(bias.bias_after_rel).c_str() : "", lag_updates, grad_scale, drift, injected ? 1 : 0,
              d.spike_verdict.grad_norm ? Num(d.spike_verdict.grad_norm->z).c_str() : "",
              injected ? Num(inject_factor).c_str() : "", PolicyCells(health).c_str());
          std::fflush(csv);  // followed live (scripts/demo_run.sh's progress line)
        }
        if (step % flags.every == 0 || step == 1) {
          char c_text[32] = "-";
          if (d.cosine) std::snprintf(c_text, sizeof c_text, "%+.4f", *d.cosine);
          char n_text[32] = "-";
          if (std::isfinite(noise_cos)) std::snprintf(n_text, sizeof n_text, "%+.4f", noise_cos);
          std::printf("%6d %7.3f %7.3f %8.4f %9s %9s %8s %7.3f %8.4g\n", step, sub.mean_reward, last_heldout,
                      loss.entropy, c_text, n_text, gac::controller::RegimeName(d.regime), d.alpha, d.grad_norm);
        }
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (csv != nullptr) std::fclose(csv);
  if (flags.smoke && flags.spike_sigma > 0.0 && flags.inject_rate > 0.0 && injected_judged == 0) {
    std::fprintf(stderr, "--smoke: no injected step after the spike guard's warm-up: nothing was checked\n");
    return 1;
  }

  const gac::controller::CalibrationStats stats = gac::controller::ComputeCalibration(calib_c, flags.c_low);
  std::string regime_text;
  for (const auto& [name, count] : regimes) regime_text += name + "=" + std::to_string(count) + " ";
  // CPU seconds of the whole process (warm-up included): the cost of a run on a shared machine.
  const double cpu_seconds = static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
  std::printf("summary: run=%s final_reward=%.4f heldout_acc=%.4f steps_per_s=%.1f cpu_s=%.1f q90=%.4f max=%.4f "
              "frac_le_c_low=%.3f window_q90=%.4f noise_q90=%.4f pr_pop=%.1f skipped=%d fallbacks=%llu "
              "injected=%d regimes: %s\n",
              flags.run.c_str(), reward_tail_n ? reward_tail / reward_tail_n : 0.0, last_heldout,
              flags.steps / seconds, cpu_seconds, stats.q90, stats.max, stats.frac_le_c_low, AbsQuantile(calib_m, 0.9),
              AbsQuantile(calib_noise, 0.9), pr_n ? pr_sum / pr_n : kNaN, skipped,
              static_cast<unsigned long long>(agent->fallbacks()), injected_steps, regime_text.c_str());
  if (!flags.calibrate_out.empty()) {
    auto t = gac::controller::SuggestThresholds(stats, flags.smoke ? 1 : 20);
    if (!t.ok()) {
      std::fprintf(stderr, "calibration failed: %s\n", t.status().ToString().c_str());
      return 1;
    }
    std::FILE* f = std::fopen(flags.calibrate_out.c_str(), "w");
    if (f == nullptr) Usage("cannot write " + flags.calibrate_out);
    std::fprintf(f, "c_low=%.6g\nc_high=%.6g\nq90=%.6g\nmax=%.6g\ncount=%zu\nwindow=%d\nwindow_q90=%.6g\n"
                    "window_max=%.6g\nnoise_q90=%.6g\n",
                 t->c_low, t->c_high, stats.q90, stats.max, stats.count, flags.window, AbsQuantile(calib_m, 0.9),
                 AbsQuantile(calib_m, 1.0), AbsQuantile(calib_noise, 0.9));
    std::fclose(f);
    std::printf("calibration: q0.9 %.4f, max %.4f over %zu steps -> c_low %.4g, c_high %.4g; window mean q0.9 "
                "%.4f, max %.4f\n",
                stats.q90, stats.max, stats.count, t->c_low, t->c_high, AbsQuantile(calib_m, 0.9),
                AbsQuantile(calib_m, 1.0));
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
