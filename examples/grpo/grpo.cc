#include "examples/grpo/grpo.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace gac::grpo {
namespace {

// Writes the prompt part of an input row.
void FillPrompt(float* row, const Problem& p) {
  const int digits[kPromptDigits] = {p.a / 10, p.a % 10, p.b / 10, p.b % 10};
  for (int d = 0; d < kPromptDigits; ++d) row[d * kVocab + digits[d]] = 1.0f;
}

// Input rows for answer position k given the previous answer tokens.
// prev: (N, k) tokens, row-major.
void FillPosition(float* rows, const std::vector<Problem>& problems, int repeat, int k,
                  const std::vector<std::int64_t>& prev, int prev_stride) {
  const int n = static_cast<int>(problems.size()) * repeat;
  for (int i = 0; i < n; ++i) {
    float* row = rows + static_cast<std::int64_t>(i) * kInput;
    FillPrompt(row, problems[i / repeat]);
    for (int j = 0; j < k; ++j) {
      row[kPromptDigits * kVocab + j * kVocab + prev[static_cast<std::size_t>(i) * prev_stride + j]] = 1.0f;
    }
    row[kPromptDigits * kVocab + (kAnswerDigits - 1) * kVocab + k] = 1.0f;
  }
}

}  // namespace

AdditionTask::AdditionTask(int heldout_size) {
  std::vector<Problem> all;
  for (int a = 0; a < 100; ++a) {
    for (int b = 0; b < 100; ++b) all.push_back({a, b});
  }
  std::mt19937_64 rng(0x6ac6a7);  // fixed: the split is the same for every seed
  std::shuffle(all.begin(), all.end(), rng);
  heldout_.assign(all.begin(), all.begin() + heldout_size);
  train_.assign(all.begin() + heldout_size, all.end());
}

std::vector<Problem> AdditionTask::SamplePrompts(int count, std::mt19937_64& rng) const {
  std::uniform_int_distribution<std::size_t> pick(0, train_.size() - 1);
  std::vector<Problem> out(static_cast<std::size_t>(count));
  for (auto& p : out) p = train_[pick(rng)];
  return out;
}

int AdditionTask::AnswerDigit(const Problem& p, int k) {
  const int sum = p.a + p.b;
  return k == 0 ? sum / 100 : k == 1 ? (sum / 10) % 10 : sum % 10;
}

Policy Policy::Init(int hidden, at::Device device) {
  Policy p;
  auto layer = [&](std::int64_t in, std::int64_t out, double gain) {
    p.params.push_back(
        (at::randn({in, out}) * (gain / std::sqrt(static_cast<double>(in)))).to(device).set_requires_grad(true));
    p.params.push_back(at::zeros({out}, at::TensorOptions().device(device)).set_requires_grad(true));
  };
  layer(kInput, hidden, 1.0);
  layer(hidden, hidden, 1.0);
  layer(hidden, kVocab, 0.1);  // near-uniform initial policy
  return p;
}

Policy Policy::Snapshot() const {
  at::NoGradGuard no_grad;
  Policy s;
  for (const auto& t : params) s.params.push_back(t.detach().clone());
  return s;
}

std::int64_t Policy::NumParameters() const {
  std::int64_t n = 0;
  for (const auto& t : params) n += t.numel();
  return n;
}

at::Tensor Policy::Logits(const at::Tensor& x) const {
  const at::Tensor h1 = at::tanh(at::addmm(params[1], x, params[0]));
  const at::Tensor h2 = at::tanh(at::addmm(params[3], h1, params[2]));
  return at::addmm(params[5], h2, params[4]);
}

Rollouts Generate(const Policy& behaviour, const std::vector<Problem>& prompts, int group) {
  at::NoGradGuard no_grad;
  const int n = static_cast<int>(prompts.size()) * group;
  const at::Device device = behaviour.device();
  Rollouts r;
  r.prompts = static_cast<int>(prompts.size());
  r.group = group;
  at::Tensor inputs = at::zeros({kAnswerDigits * n, kInput});  // filled here, on the CPU
  std::vector<at::Tensor> actions, behaviour_logp;  // per position, on the device
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(n) * kAnswerDigits);
  float* x = inputs.data_ptr<float>();
  for (int k = 0; k < kAnswerDigits; ++k) {
    FillPosition(x + static_cast<std::int64_t>(k) * n * kInput, prompts, group, k, tokens, kAnswerDigits);
    const at::Tensor xk = inputs.narrow(0, static_cast<std::int64_t>(k) * n, n).to(device);
    const at::Tensor logp = at::log_softmax(behaviour.Logits(xk), 1);
    const at::Tensor a = at::multinomial(logp.exp(), 1);  // (n, 1)
    actions.push_back(a.view({n}));
    behaviour_logp.push_back(logp.gather(1, a).view({n}));
    const at::Tensor a_host = a.cpu().contiguous();  // the next position's inputs need these tokens
    const std::int64_t* ap = a_host.data_ptr<std::int64_t>();
    for (int i = 0; i < n; ++i) tokens[static_cast<std::size_t>(i) * kAnswerDigits + k] = ap[i];
  }
  r.inputs = inputs.to(device);
  r.actions = at::cat(actions);
  r.behaviour_logp = at::cat(behaviour_logp);
  r.rewards = at::empty({n});
  float* rew = r.rewards.data_ptr<float>();
  int exact = 0;
  double total = 0.0;
  for (int i = 0; i < n; ++i) {
    int right = 0;
    for (int k = 0; k < kAnswerDigits; ++k) {
      right += tokens[static_cast<std::size_t>(i) * kAnswerDigits + k] == AdditionTask::AnswerDigit(prompts[i / group], k);
    }
    rew[i] = static_cast<float>(right) / kAnswerDigits;
    total += rew[i];
    exact += right == kAnswerDigits;
  }
  r.mean_reward = total / n;
  r.exact_match = static_cast<double>(exact) / n;
  const at::Tensor grouped = r.rewards.view({r.prompts, group});
  const at::Tensor mean = grouped.mean(1, /*keepdim=*/true);
  const at::Tensor std = grouped.std(1, /*unbiased=*/false, /*keepdim=*/true);
  const at::Tensor adv = ((grouped - mean) / (std + 1e-6)).view({n});
  r.advantages = adv.repeat({kAnswerDigits}).to(device);  // token k of sequence i sits at k * n + i
  return r;
}

double SupervisedWarmup(Policy& policy, const AdditionTask& task, int steps, int batch, double lr,
                        std::mt19937_64& rng) {
  AdamW optimizer(policy.params, lr, 0.0);
  double last = 0.0;
  for (int s = 0; s < steps; ++s) {
    const auto problems = task.SamplePrompts(batch, rng);
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(batch) * kAnswerDigits);
    at::Tensor targets = at::empty({kAnswerDigits * batch}, at::kLong);
    std::int64_t* tp = targets.data_ptr<std::int64_t>();
    for (int i = 0; i < batch; ++i) {
      for (int k = 0; k < kAnswerDigits; ++k) {
        const int d = AdditionTask::AnswerDigit(problems[i], k);
        tokens[static_cast<std::size_t>(i) * kAnswerDigits + k] = d;
        tp[k * batch + i] = d;
      }
    }
    at::Tensor x = at::zeros({kAnswerDigits * batch, kInput});
    for (int k = 0; k < kAnswerDigits; ++k) {
      FillPosition(x.data_ptr<float>() + static_cast<std::int64_t>(k) * batch * kInput, problems, 1, k, tokens,
                   kAnswerDigits);
    }
    for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
    const at::Tensor loss =
        at::nll_loss(at::log_softmax(policy.Logits(x.to(policy.device())), 1), targets.to(policy.device()));
    loss.backward();
    optimizer.Step(policy.params);
    last = loss.item<double>();
  }
  for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
  return last;
}

double Evaluate(const Policy& policy, const std::vector<Problem>& problems) {
  at::NoGradGuard no_grad;
  const int n = static_cast<int>(problems.size());
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(n) * kAnswerDigits);
  for (int k = 0; k < kAnswerDigits; ++k) {
    at::Tensor x = at::zeros({n, kInput});
    FillPosition(x.data_ptr<float>(), problems, 1, k, tokens, kAnswerDigits);
    const at::Tensor a = policy.Logits(x.to(policy.device())).argmax(1).cpu().contiguous();
    const std::int64_t* ap = a.data_ptr<std::int64_t>();
    for (int i = 0; i < n; ++i) tokens[static_cast<std::size_t>(i) * kAnswerDigits + k] = ap[i];
  }
  int exact = 0;
  for (int i = 0; i < n; ++i) {
    bool ok = true;
    for (int k = 0; k < kAnswerDigits; ++k) {
      ok = ok && tokens[static_cast<std::size_t>(i) * kAnswerDigits + k] == AdditionTask::AnswerDigit(problems[i], k);
    }
    exact += ok;
  }
  return static_cast<double>(exact) / n;
}

const char* LossName(LossKind kind) {
  switch (kind) {
    case LossKind::kGrpo: return "grpo";
    case LossKind::kM2po: return "m2po";
    case LossKind::kBapo: return "bapo";
  }
  return "?";
}

bool ParseLoss(const std::string& name, LossKind* kind) {
  if (name == "grpo") *kind = LossKind::kGrpo;
  else if (name == "m2po") *kind = LossKind::kM2po;
  else if (name == "bapo") *kind = LossKind::kBapo;
  else return false;
  return true;
}

namespace {

// M2PO mask: keep the tokens with the smallest (log r)^2, as many as possible
// while their mean stays <= tau (the mean of the k smallest grows with k).
at::Tensor M2Mask(const at::Tensor& sq_log_ratio, double tau) {
  const std::int64_t n = sq_log_ratio.numel();
  at::Tensor mask = at::ones_like(sq_log_ratio);
  if (n == 0 || sq_log_ratio.mean().item<double>() <= tau) return mask;
  const auto sorted = at::sort(sq_log_ratio, /*dim=*/0, /*descending=*/false);
  const at::Tensor values = std::get<0>(sorted).to(at::kDouble).cpu().contiguous();
  const at::Tensor order = std::get<1>(sorted).contiguous();
  const double* v = values.data_ptr<double>();
  double sum = 0.0;
  std::int64_t keep = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if ((sum + v[i]) / static_cast<double>(i + 1) > tau) break;
    sum += v[i];
    keep = i + 1;
  }
  mask.index_fill_(0, order.narrow(0, keep, n - keep), 0.0);
  return mask;
}

// Share of |clipped objective| carried by positive-advantage tokens.
double PositiveShare(const at::Tensor& ratio, const at::Tensor& adv, double lo, double hi) {
  const at::Tensor pos = adv > 0;
  const at::Tensor obj = at::where(pos, at::minimum(ratio, at::full_like(ratio, hi)) * adv,
                                   at::maximum(ratio, at::full_like(ratio, lo)) * adv)
                             .abs();
  const double total = obj.sum().item<double>();
  if (total <= 0.0) return 1.0;
  return (obj * pos).sum().item<double>() / total;
}

}  // namespace

LossResult ComputeLoss(const Policy& policy, const Policy& reference, const Rollouts& batch,
                       const LossOptions& options) {
  LossResult out;
  const at::Tensor logp_all = at::log_softmax(policy.Logits(batch.inputs), 1);
  const at::Tensor actions = batch.actions.view({-1, 1});
  const at::Tensor logp = logp_all.gather(1, actions).view({-1});
  const at::Tensor log_ratio = logp - batch.behaviour_logp;
  const at::Tensor ratio = log_ratio.exp();
  const at::Tensor& adv = batch.advantages;
  const at::Tensor lr_detached = log_ratio.detach();
  const at::Tensor ratio_detached = ratio.detach();
  out.mean_abs_log_ratio = lr_detached.abs().mean().item<double>();
  out.m2 = lr_detached.square().mean().item<double>();

  at::Tensor pg;  // per-token surrogate loss
  switch (options.kind) {
    case LossKind::kGrpo: {
      const at::Tensor clipped = at::clamp(ratio, 1.0 - options.clip_eps, 1.0 + options.clip_eps);
      pg = -at::minimum(ratio * adv, clipped * adv);
      const at::Tensor no_grad =
          ((adv > 0) & (ratio_detached > 1.0 + options.clip_eps)) | ((adv < 0) & (ratio_detached < 1.0 - options.clip_eps));
      out.clip_fraction = no_grad.to(at::kFloat).mean().item<double>();
      break;
    }
    case LossKind::kM2po: {
      const at::Tensor mask = M2Mask(lr_detached.square(), options.m2_tau);
      pg = -mask * ratio * adv;
      out.clip_fraction = 1.0 - mask.mean().item<double>();
      break;
    }
    case LossKind::kBapo: {
      double lo = options.bapo_a_lo, hi = options.bapo_a_hi;
      while (PositiveShare(ratio_detached, adv, lo, hi) < options.bapo_rho0) {
        const bool move_hi = hi + options.bapo_delta_hi <= options.bapo_b_hi + 1e-12;
        const bool move_lo = lo + options.bapo_delta_lo <= options.bapo_b_lo + 1e-12;
        if (!move_hi && !move_lo) break;
        if (move_hi) hi += options.bapo_delta_hi;
        if (move_lo) lo += options.bapo_delta_lo;
      }
      const at::Tensor clipped = at::clamp(ratio, lo, hi);
      pg = -at::minimum(ratio * adv, clipped * adv);
      const at::Tensor no_grad = ((adv > 0) & (ratio_detached > hi)) | ((adv < 0) & (ratio_detached < lo));
      out.clip_fraction = no_grad.to(at::kFloat).mean().item<double>();
      out.bapo_lo = lo;
      out.bapo_hi = hi;
      break;
    }
  }
  const at::Tensor pg_loss = pg.mean();

  const at::Tensor entropy = -(logp_all.exp() * logp_all).sum(1).mean();
  at::Tensor kl = at::zeros({}, logp.options());
  if (options.kl_coef > 0.0) {
    at::Tensor ref_logp;
    {
      at::NoGradGuard no_grad;
      ref_logp = at::log_softmax(reference.Logits(batch.inputs), 1).gather(1, actions).view({-1});
    }
    // low_var_kl (k3): exp(ref - logp) - (ref - logp) - 1, clamped as in verl.
    const at::Tensor d = at::clamp(ref_logp - logp, -20.0, 20.0);
    kl = at::clamp(d.exp() - d - 1.0, -10.0, 10.0).mean();
  }
  out.loss = pg_loss - options.entropy_coef * entropy + options.kl_coef * kl;
  out.pg_loss = pg_loss.item<double>();
  out.kl = kl.item<double>();
  out.entropy = entropy.item<double>();
  return out;
}

AdamW::AdamW(const std::vector<at::Tensor>& params, double lr, double weight_decay, double beta1, double beta2,
             double eps)
    : lr_(lr), weight_decay_(weight_decay), beta1_(beta1), beta2_(beta2), eps_(eps) {
  for (const auto& p : params) {
    m_.push_back(at::zeros_like(p.detach()));
    v_.push_back(at::zeros_like(p.detach()));
  }
}

void AdamW::Step(const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  ++t_;
  const double bc1 = 1.0 - std::pow(beta1_, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(beta2_, static_cast<double>(t_));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    at::Tensor p = params[i].detach();
    m_[i].mul_(beta1_).add_(g, 1.0 - beta1_);
    v_[i].mul_(beta2_).addcmul_(g, g, 1.0 - beta2_);
    p.mul_(1.0 - lr_ * weight_decay_);
    const at::Tensor denom = (v_[i] / bc2).sqrt_().add_(eps_);
    p.addcdiv_(m_[i], denom, -lr_ / bc1);
  }
}

double ClipGradNorm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  double sq = 0.0;
  for (const auto& p : params) {
    if (p.grad().defined()) sq += p.grad().to(at::kDouble).square().sum().item<double>();
  }
  const double norm = std::sqrt(sq);
  if (std::isfinite(norm) && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const auto& p : params) {
      if (p.grad().defined()) p.grad().mul_(scale);
    }
  }
  return norm;
}

}  // namespace gac::grpo
