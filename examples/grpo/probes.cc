#include "examples/grpo/probes.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>

namespace gac::grpo {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Gradients of `output` with respect to every parameter, zeros for those it
// does not reach.
GradList GradientsOf(const at::Tensor& output, const std::vector<at::Tensor>& params, bool retain_graph) {
  torch::autograd::variable_list grads =
      torch::autograd::grad({output}, params, /*grad_outputs=*/{}, retain_graph, /*create_graph=*/false,
                            /*allow_unused=*/true);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) grads[i] = at::zeros_like(params[i].detach());
  }
  return grads;
}

// Rows (token index k * n + i) whose sequence answers one of the first
// `first_prompts` prompts.
at::Tensor FirstGroupsMask(int prompts, int group, int first_prompts, const at::Tensor& like) {
  const std::int64_t n = static_cast<std::int64_t>(prompts) * group;
  at::Tensor seq = at::zeros({n});
  seq.narrow(0, 0, static_cast<std::int64_t>(first_prompts) * group).fill_(1.0);
  return seq.repeat({kAnswerDigits}).to(like.options());
}

}  // namespace

GradList CopyGrads(const std::vector<at::Tensor>& params) {
  GradList out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(p.grad().defined() ? p.grad().detach().clone() : at::zeros_like(p.detach()));
  return out;
}

double Dot(const GradList& a, const GradList& b) {
  double sum = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += at::dot(a[i].reshape({-1}).to(at::kDouble), b[i].reshape({-1}).to(at::kDouble)).item<double>();
  return sum;
}

double Cosine(const GradList& a, const GradList& b) {
  const double den = std::sqrt(Dot(a, a) * Dot(b, b));
  return den > 0.0 ? Dot(a, b) / den : kNaN;
}

double BackwardInHalves(const std::vector<at::Tensor>& params, const at::Tensor& token_loss, int prompts, int group) {
  for (const auto& p : params) p.mutable_grad() = at::Tensor();
  if (prompts < 2) {
    token_loss.mean().backward();
    return kNaN;
  }
  const double count = static_cast<double>(token_loss.numel());
  const at::Tensor first = FirstGroupsMask(prompts, group, prompts / 2, token_loss);
  (token_loss * first).sum().div(count).backward({}, /*retain_graph=*/true);
  const GradList half = CopyGrads(params);
  for (const auto& p : params) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  (token_loss * (1.0 - first)).sum().div(count).backward();
  const GradList other = CopyGrads(params);
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) params[i].mutable_grad().add_(half[i]);
  }
  return Cosine(half, other);
}

EffectiveDimension MeasureEffectiveDimension(const Policy& policy, const Policy& reference, const Rollouts& batch,
                                             int groups, const LossOptions& options) {
  std::vector<int> ids;
  for (int g = 0; g < std::min(groups, batch.prompts); ++g) ids.push_back(g);
  const Rollouts sub = batch.Groups(ids);
  const int n = sub.sequences();
  if (n < 3) return {};
  const LossResult loss = ComputeLoss(policy, reference, sub, options);
  const at::Tensor per_sequence = loss.token_loss.view({kAnswerDigits, n}).sum(0);
  std::vector<at::Tensor> rows;
  rows.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    GradList g = GradientsOf(per_sequence[i], policy.params, /*retain_graph=*/i + 1 < n);
    std::vector<at::Tensor> flat;
    for (const auto& t : g) flat.push_back(t.reshape({-1}));
    rows.push_back(at::cat(flat).to(at::kDouble).cpu());
  }
  return ParticipationRatio(at::stack(rows));
}

EffectiveDimension ParticipationRatio(const at::Tensor& per_sample) {
  EffectiveDimension out;
  const std::int64_t n = per_sample.size(0);
  if (n < 3) return out;
  at::Tensor grads = per_sample.to(at::kDouble);
  grads = grads - grads.mean(0, /*keepdim=*/true);       // centred: the noise, not the mean gradient
  const at::Tensor gram = at::matmul(grads, grads.t());  // (n, n)
  const at::Tensor diag = gram.diagonal();
  const double trace = diag.sum().item<double>();
  const double frob2 = gram.square().sum().item<double>();
  const double off2 = frob2 - diag.square().sum().item<double>();
  const double nn = static_cast<double>(n);
  out.samples = static_cast<int>(n);
  out.pr_sample = frob2 > 0.0 ? trace * trace / frob2 : kNaN;
  // After centring, E[K_ii] = (n-1)/n tr(S) and E[K_ij^2] = tr(S^2) (1 + O(1/n)) for i != j.
  const double tr_s = trace / (nn - 1.0);
  const double tr_s2 = off2 / (nn * (nn - 1.0));
  out.pr_pop = tr_s2 > 0.0 ? tr_s * tr_s / tr_s2 : kNaN;
  const at::Tensor norms = diag.sqrt();
  const at::Tensor cos = gram / (norms.unsqueeze(1) * norms.unsqueeze(0) + 1e-300);
  out.mean_pair_cos2 = (cos.square().sum().item<double>() - nn) / (nn * (nn - 1.0));
  return out;
}

StalenessBias MeasureStalenessBias(const Policy& policy, const Policy& reference, const DigitTasks& tasks,
                                   int prompts, int group, const LossOptions& options, const GradList& stale,
                                   const GradList& prev, double alpha, double beta, std::mt19937_64& rng,
                                   at::Generator generator) {
  StalenessBias out;
  const Rollouts fresh = Generate(policy, tasks, tasks.SamplePrompts(prompts, rng), group, generator);
  const LossResult loss = ComputeLoss(policy, reference, fresh, options);
  const GradList on = GradientsOf(loss.loss, policy.params, /*retain_graph=*/false);

  at::NoGradGuard no_grad;
  const double prev_norm = std::sqrt(Dot(prev, prev));
  const double on_norm = std::sqrt(Dot(on, on));
  GradList bias, after;
  for (std::size_t i = 0; i < stale.size(); ++i) bias.push_back(stale[i] - on[i]);
  // g' = alpha g_par + beta g_perp = beta g + (alpha - beta) <g, u> u.
  const double g_par = prev_norm > 0.0 ? Dot(stale, prev) / prev_norm : 0.0;
  for (std::size_t i = 0; i < stale.size(); ++i) {
    at::Tensor g = stale[i] * beta;
    if (prev_norm > 0.0) g = g + prev[i] * ((alpha - beta) * g_par / prev_norm);
    after.push_back(g - on[i]);
  }
  const double bias_norm = std::sqrt(Dot(bias, bias));
  out.bias_rel = on_norm > 0.0 ? bias_norm / on_norm : kNaN;
  out.lambda = Cosine(bias, prev);
  out.on_align = Cosine(on, prev);
  out.aligned_before = prev_norm > 0.0 && on_norm > 0.0 ? Dot(bias, prev) / prev_norm / on_norm : kNaN;
  out.aligned_after = prev_norm > 0.0 && on_norm > 0.0 ? Dot(after, prev) / prev_norm / on_norm : kNaN;
  out.bias_after_rel = on_norm > 0.0 ? std::sqrt(Dot(after, after)) / on_norm : kNaN;
  return out;
}

void ApplyOrthogonalGain(const std::vector<at::Tensor>& params, const GradList& prev, double alpha,
                         double dot_over_pp, double beta) {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined()) continue;
    params[i].mutable_grad().mul_(beta).add_(prev[i], alpha * (1.0 - beta) * dot_over_pp);
  }
}

}  // namespace gac::grpo
