// gac_train_demo: trains a small MLP with LibTorch on a synthetic regression
// task, with gradients computed on parameters `--staleness` steps old (the
// asynchronous-RL setting in miniature), and runs the GAC agent every step.
// Prints c_t, the regime and the loss per step, then a summary per regime.
//
//   gac_train_demo [--steps N] [--staleness S] [--mode monitor|local]
//                  [--c-low X] [--c-high Y] [--every K] [--seed N]
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>

#include "gac/agent/agent.h"

namespace {

struct Flags {
  int steps = 200;
  int staleness = 8;
  int every = 10;
  int seed = 1;
  double c_low = 0.05;
  double c_high = 0.3;
  gac::agent::Mode mode = gac::agent::Mode::kLocal;
};

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr,
               "error: %s\nusage: gac_train_demo [--steps N] [--staleness S] [--mode monitor|local]\n"
               "                      [--c-low X] [--c-high Y] [--every K] [--seed N]\n",
               msg);
  std::exit(2);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") Usage("help requested");
    if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
    const char* v = argv[++i];
    char* end = nullptr;
    if (a == "--mode") {
      auto m = gac::agent::ParseMode(v);
      if (!m.ok()) Usage(m.status().message().c_str());
      f.mode = *m;
      continue;
    }
    const double x = std::strtod(v, &end);
    if (end == v || *end != '\0') Usage(("not a number: " + a + " " + v).c_str());
    if (a == "--steps" && x >= 1) f.steps = static_cast<int>(x);
    else if (a == "--staleness" && x >= 0) f.staleness = static_cast<int>(x);
    else if (a == "--every" && x >= 1) f.every = static_cast<int>(x);
    else if (a == "--seed") f.seed = static_cast<int>(x);
    else if (a == "--c-low") f.c_low = x;
    else if (a == "--c-high") f.c_high = x;
    else Usage(("unknown flag or bad value: " + a + " " + v).c_str());
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = Parse(argc, argv);
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
  options.thresholds = {flags.c_low, flags.c_high};
  options.mode = flags.mode;
  auto agent_or = gac::agent::Agent::Create(options);
  if (!agent_or.ok()) Usage(agent_or.status().ToString().c_str());
  auto agent = std::move(*agent_or);

  // Ring of past parameter values: gradients are taken `staleness` steps back.
  std::deque<std::vector<at::Tensor>> history;
  auto loss_of = [&](const std::vector<at::Tensor>& w, const at::Tensor& x, const at::Tensor& y) {
    const at::Tensor h = at::tanh(at::addmm(w[1], x, w[0]));
    return (at::addmm(w[3], h, w[2]) - y).square().mean();
  };

  std::printf("gac_train_demo: %d steps, staleness %d, mode %s, c_low %.3g, c_high %.3g, kernels %s\n", flags.steps,
              flags.staleness, gac::agent::ModeName(flags.mode), flags.c_low, flags.c_high, agent->kernel_isa());
  std::printf("%6s %9s %8s %7s %10s %10s\n", "step", "c_t", "regime", "alpha", "|g|", "loss");
  std::map<std::string, int> regimes;
  double agent_seconds = 0.0;
  for (int step = 1; step <= flags.steps; ++step) {
    {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> snap;
      for (const auto& p : params) snap.push_back(p.detach().clone());
      history.push_back(std::move(snap));
      if (static_cast<int>(history.size()) > flags.staleness + 1) history.pop_front();
    }
    // The behaviour parameters: the oldest in the ring (s steps behind).
    std::vector<at::Tensor> stale;
    for (const auto& p : history.front()) stale.push_back(p.clone().set_requires_grad(true));
    const at::Tensor idx = at::randint(n, {64}, at::kLong);
    loss_of(stale, x_all.index_select(0, idx), y_all.index_select(0, idx)).backward();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = stale[i].grad();

    auto report = agent->Step(step, params);
    if (!report.ok()) {
      std::fprintf(stderr, "agent step failed: %s\n", report.status().ToString().c_str());
      return 1;
    }
    agent_seconds += report->stats_seconds + report->apply_seconds;
    const auto& d = report->decision;
    ++regimes[gac::RegimeName(d.regime)];
    if (report->step_optimizer) {
      at::NoGradGuard no_grad;
      for (auto& p : params) p.sub_(p.grad() * 0.2);
    }
    if (step % flags.every == 0 || step == 1) {
      at::NoGradGuard no_grad;
      const double loss = loss_of(params, x_all, y_all).item<double>();
      char c_text[32] = "-";
      if (d.cosine) std::snprintf(c_text, sizeof c_text, "%+.4f", *d.cosine);
      std::printf("%6d %9s %8s %7.3f %10.4g %10.5f\n", step, c_text, gac::RegimeName(d.regime), d.alpha,
                  d.grad_norm, loss);
    }
  }
  std::printf("regimes:");
  for (const auto& [name, count] : regimes) std::printf(" %s=%d", name.c_str(), count);
  std::printf("\nagent time per step: %.1f us\n", 1e6 * agent_seconds / flags.steps);
  return 0;
}
