#include "examples/grpo/grpo.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gac::grpo {
namespace {

constexpr int kTaskColumn = 0;
constexpr int kFirstPromptColumn = 1;
constexpr int kFirstAnswerColumn = 1 + kPromptDigits;

int AnswerValue(const Problem& p, int base) {
  const int square = base * base;
  switch (p.task) {
    case 0: return p.a + p.b;
    case 1: return std::abs(p.a - p.b);
    case 2: return std::max(p.a, p.b);
    case 3: return std::min(p.a, p.b);
    case 4: return p.a * (p.b % base);
    case 5: return p.a / base + p.a % base + p.b / base + p.b % base;
    case 6: return ((p.a / base + p.b / base) % base) * base + (p.a % base + p.b % base) % base;
    case 7: return (p.a - p.b + square) % square;
  }
  return 0;
}

// Writes the task token and the prompt digits of `p` into a token row.
void FillPrompt(std::int64_t* row, const Problem& p, int base) {
  row[kTaskColumn] = base + p.task;
  const int digits[kPromptDigits] = {p.a / base, p.a % base, p.b / base, p.b % base};
  for (int d = 0; d < kPromptDigits; ++d) row[kFirstPromptColumn + d] = digits[d];
}

// Token rows (n, kSequence) for `problems`, each repeated `repeat` times;
// answers zero.
at::Tensor PromptTokens(const std::vector<Problem>& problems, int repeat, int base) {
  const std::int64_t n = static_cast<std::int64_t>(problems.size()) * repeat;
  at::Tensor tokens = at::zeros({n, kSequence}, at::kLong);
  std::int64_t* t = tokens.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) FillPrompt(t + i * kSequence, problems[i / repeat], base);
  return tokens;
}

// --- MLP -------------------------------------------------------------------

int MlpInput(int base, int tasks) { return tasks + kPromptDigits * base + (kAnswerDigits - 1) * base + kAnswerDigits; }

// One-hot input rows for answer position k of every token row, written at
// `x` (n rows of MlpInput floats, zeroed by the caller).
void EncodeMlpPosition(const at::Tensor& tokens, int k, int base, int tasks, float* x) {
  const std::int64_t n = tokens.size(0);
  const int width = MlpInput(base, tasks);
  const std::int64_t* t = tokens.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t* row = t + i * kSequence;
    float* out = x + i * width;
    out[row[kTaskColumn] - base] = 1.0f;
    for (int d = 0; d < kPromptDigits; ++d) out[tasks + d * base + row[kFirstPromptColumn + d]] = 1.0f;
    for (int j = 0; j < k; ++j) out[tasks + kPromptDigits * base + j * base + row[kFirstAnswerColumn + j]] = 1.0f;
    out[tasks + kPromptDigits * base + (kAnswerDigits - 1) * base + k] = 1.0f;
  }
}

at::Tensor MlpForward(const Policy& p, const at::Tensor& x) {
  at::Tensor h = x;
  const std::size_t hidden_layers = p.params.size() / 2 - 1;
  for (std::size_t l = 0; l < hidden_layers; ++l) h = at::tanh(at::addmm(p.params[2 * l + 1], h, p.params[2 * l]));
  return at::addmm(p.params.back(), h, p.params[p.params.size() - 2]);
}

// --- Transformer -------------------------------------------------------------
//
// Parameter layout: token embedding (base + tasks, d), position embedding
// (kSequence, d), then per block [ln1 w, ln1 b, W_qkv (d, 3d), b_qkv, W_o (d,
// d), b_o, ln2 w, ln2 b, W_1 (d, 4d), b_1, W_2 (4d, d), b_2], then final ln
// w, b, W_out (d, base), b_out.
constexpr int kBlockParams = 12;

// Hidden states (n, s, d) after the final LayerNorm for the first s tokens
// of each row.
at::Tensor TransformerHidden(const Policy& p, const at::Tensor& tokens) {
  const std::int64_t n = tokens.size(0), s = tokens.size(1);
  const std::int64_t d = p.options.width, heads = p.options.heads, dh = d / heads;
  const at::Tensor ids = tokens.to(p.device());
  at::Tensor x = p.params[0].index_select(0, ids.reshape({-1})).view({n, s, d}) + p.params[1].narrow(0, 0, s);
  const at::Tensor causal =
      at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(p.device())).triu(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  for (int b = 0; b < p.options.layers; ++b) {
    const at::Tensor* w = &p.params[2 + static_cast<std::size_t>(b) * kBlockParams];
    const at::Tensor h = at::layer_norm(x, {d}, w[0], w[1]);
    const at::Tensor qkv = at::addmm(w[3], h.view({n * s, d}), w[2]).view({n, s, 3, heads, dh}).permute({2, 0, 3, 1, 4});
    const at::Tensor att = at::softmax(at::matmul(qkv[0], qkv[1].transpose(-2, -1)).mul(scale).masked_fill(causal, -1e9), -1);
    const at::Tensor o = at::matmul(att, qkv[2]).transpose(1, 2).reshape({n * s, d});
    x = x + at::addmm(w[5], o, w[4]).view({n, s, d});
    const at::Tensor h2 = at::layer_norm(x, {d}, w[6], w[7]).view({n * s, d});
    x = x + at::addmm(w[11], at::gelu(at::addmm(w[9], h2, w[8])), w[10]).view({n, s, d});
  }
  const std::size_t f = 2 + static_cast<std::size_t>(p.options.layers) * kBlockParams;
  return at::layer_norm(x, {d}, p.params[f], p.params[f + 1]);
}

at::Tensor TransformerHead(const Policy& p, const at::Tensor& hidden) {
  const std::size_t f = p.params.size() - 2;
  return at::addmm(p.params[f + 1], hidden, p.params[f]);
}

}  // namespace

// --- tasks -------------------------------------------------------------------

DigitTasks::DigitTasks(TaskOptions options, int heldout_size) : options_(options) {
  if (options.base < 2 || options.base > 64) throw std::invalid_argument("base must be in [2, 64]");
  if (options.tasks < 1 || options.tasks > kMaxTasks) throw std::invalid_argument("tasks must be in [1, 8]");
  const int square = options.base * options.base;
  const std::int64_t per_task = static_cast<std::int64_t>(square) * square;
  if (heldout_size > per_task * options.tasks / 2) throw std::invalid_argument("held-out set too large");
  std::mt19937_64 rng(0x6ac6a7);  // fixed: the split is the same for every seed
  std::uniform_int_distribution<int> operand(0, square - 1);
  for (int t = 0; t < options.tasks; ++t) {
    const int count = heldout_size / options.tasks + (t < heldout_size % options.tasks ? 1 : 0);
    for (int added = 0; added < count;) {
      const Problem p{t, operand(rng), operand(rng)};
      if (heldout_keys_.insert(Key(p)).second) {
        heldout_.push_back(p);
        ++added;
      }
    }
  }
}

std::uint64_t DigitTasks::Key(const Problem& p) const {
  const std::uint64_t square = static_cast<std::uint64_t>(options_.base) * options_.base;
  return (static_cast<std::uint64_t>(p.task) * square + static_cast<std::uint64_t>(p.a)) * square +
         static_cast<std::uint64_t>(p.b);
}

std::vector<Problem> DigitTasks::SamplePrompts(int count, std::mt19937_64& rng) const {
  std::uniform_int_distribution<int> task(0, options_.tasks - 1);
  std::uniform_int_distribution<int> operand(0, options_.base * options_.base - 1);
  std::vector<Problem> out(static_cast<std::size_t>(count));
  for (auto& p : out) {
    do {
      p = Problem{options_.tasks == 1 ? 0 : task(rng), operand(rng), operand(rng)};
    } while (heldout_keys_.count(Key(p)) != 0);
  }
  return out;
}

int DigitTasks::AnswerDigit(const Problem& p, int k) const {
  int value = AnswerValue(p, options_.base);
  for (int j = kAnswerDigits - 1; j > k; --j) value /= options_.base;
  return value % options_.base;
}

const char* DigitTasks::TaskName(int task) {
  static const char* const kNames[kMaxTasks] = {"add", "absdiff", "max", "min", "muldigit", "digitsum", "nocarry",
                                                "modsub"};
  return task >= 0 && task < kMaxTasks ? kNames[task] : "?";
}

// --- policies ----------------------------------------------------------------

const char* ArchName(Arch arch) { return arch == Arch::kMlp ? "mlp" : "transformer"; }

bool ParseArch(const std::string& name, Arch* arch) {
  if (name == "mlp") *arch = Arch::kMlp;
  else if (name == "transformer") *arch = Arch::kTransformer;
  else return false;
  return true;
}

const char* LagRuleName(LagRule rule) { return rule == LagRule::kSteps ? "steps" : "versions"; }

bool ParseLagRule(const std::string& name, LagRule* rule) {
  if (name == "steps") *rule = LagRule::kSteps;
  else if (name == "versions") *rule = LagRule::kVersions;
  else return false;
  return true;
}

PolicyLag::PolicyLag(Policy initial, int staleness, LagRule rule) : staleness_(staleness), rule_(rule) {
  ring_.push_back({std::move(initial), 0, 0});
}

void PolicyLag::Advance(const Policy& learner, bool updated) {
  ++steps_;
  if (updated) ++version_;
  if (rule_ == LagRule::kVersions && !updated) return;
  // A skip leaves the weights as they were: the same tensors again.
  ring_.push_back({updated ? learner.Snapshot() : ring_.back().policy, steps_, version_});
  while (static_cast<int>(ring_.size()) > staleness_ + 1) ring_.pop_front();
}

Policy Policy::Init(const PolicyOptions& options, const TaskOptions& task, at::Device device) {
  Policy p;
  p.options = options;
  p.base = task.base;
  p.tasks = task.tasks;
  auto weight = [&](std::int64_t in, std::int64_t out, double gain) {
    p.params.push_back((at::randn({in, out}) * (gain / std::sqrt(static_cast<double>(in)))).to(device));
  };
  auto constant = [&](std::int64_t size, double value) {
    p.params.push_back(at::full({size}, value, at::TensorOptions().device(device)));
  };
  const std::int64_t w = options.width;
  if (options.arch == Arch::kMlp) {
    std::int64_t in = MlpInput(task.base, task.tasks);
    for (int l = 0; l < options.layers; ++l, in = w) {
      weight(in, w, 1.0);
      constant(w, 0.0);
    }
    weight(in, task.base, 0.1);  // near-uniform initial policy
    constant(task.base, 0.0);
  } else {
    if (options.heads < 1 || w % options.heads != 0) throw std::invalid_argument("heads must divide the width");
    p.params.push_back((at::randn({task.base + task.tasks, w}) * 0.02).to(device));  // token embedding
    p.params.push_back((at::randn({kSequence, w}) * 0.02).to(device));               // position embedding
    const double residual_gain = 1.0 / std::sqrt(2.0 * options.layers);
    for (int b = 0; b < options.layers; ++b) {
      constant(w, 1.0);
      constant(w, 0.0);
      weight(w, 3 * w, 1.0);
      constant(3 * w, 0.0);
      weight(w, w, residual_gain);
      constant(w, 0.0);
      constant(w, 1.0);
      constant(w, 0.0);
      weight(w, 4 * w, 1.0);
      constant(4 * w, 0.0);
      weight(4 * w, w, residual_gain);
      constant(w, 0.0);
    }
    constant(w, 1.0);
    constant(w, 0.0);
    weight(w, task.base, 0.1);  // near-uniform initial policy
    constant(task.base, 0.0);
  }
  for (auto& t : p.params) t.set_requires_grad(true);
  return p;
}

Policy Policy::Snapshot() const {
  at::NoGradGuard no_grad;
  Policy s;
  s.options = options;
  s.base = base;
  s.tasks = tasks;
  for (const auto& t : params) s.params.push_back(t.detach().clone());
  return s;
}

std::int64_t Policy::NumParameters() const {
  std::int64_t n = 0;
  for (const auto& t : params) n += t.numel();
  return n;
}

at::Tensor Policy::PositionLogits(const at::Tensor& tokens, int k) const {
  const at::Tensor t = tokens.contiguous();
  if (options.arch == Arch::kTransformer) {
    const at::Tensor hidden = TransformerHidden(*this, t.narrow(1, 0, kFirstAnswerColumn + k));
    return TransformerHead(*this, hidden.select(1, kFirstAnswerColumn + k - 1));
  }
  at::Tensor x = at::zeros({t.size(0), MlpInput(base, tasks)});
  EncodeMlpPosition(t, k, base, tasks, x.data_ptr<float>());
  return MlpForward(*this, x.to(device()));
}

at::Tensor Policy::AnswerLogits(const at::Tensor& tokens) const {
  const at::Tensor t = tokens.contiguous();
  const std::int64_t n = t.size(0);
  if (options.arch == Arch::kTransformer) {
    // Position kFirstAnswerColumn - 1 + k predicts answer digit k; the last
    // answer token is never an input.
    const at::Tensor hidden = TransformerHidden(*this, t.narrow(1, 0, kSequence - 1));
    const at::Tensor rows = hidden.narrow(1, kFirstAnswerColumn - 1, kAnswerDigits).transpose(0, 1).reshape(
        {kAnswerDigits * n, options.width});
    return TransformerHead(*this, rows);
  }
  const int width = MlpInput(base, tasks);
  at::Tensor x = at::zeros({kAnswerDigits * n, width});
  for (int k = 0; k < kAnswerDigits; ++k) EncodeMlpPosition(t, k, base, tasks, x.data_ptr<float>() + k * n * width);
  return MlpForward(*this, x.to(device()));
}

// --- rollouts ----------------------------------------------------------------

Rollouts Rollouts::Groups(const std::vector<int>& prompt_ids) const {
  const std::int64_t n = sequences();
  const std::int64_t m = static_cast<std::int64_t>(prompt_ids.size()) * group;
  at::Tensor seq = at::empty({m}, at::kLong);
  at::Tensor rows = at::empty({kAnswerDigits * m}, at::kLong);
  std::int64_t* sp = seq.data_ptr<std::int64_t>();
  std::int64_t* rp = rows.data_ptr<std::int64_t>();
  for (std::size_t g = 0; g < prompt_ids.size(); ++g) {
    for (int j = 0; j < group; ++j) sp[static_cast<std::int64_t>(g) * group + j] = static_cast<std::int64_t>(prompt_ids[g]) * group + j;
  }
  for (int k = 0; k < kAnswerDigits; ++k) {
    for (std::int64_t i = 0; i < m; ++i) rp[k * m + i] = k * n + sp[i];
  }
  Rollouts r;
  r.prompts = static_cast<int>(prompt_ids.size());
  r.group = group;
  r.tokens = tokens.index_select(0, seq);
  const at::Tensor device_rows = rows.to(actions.device());
  r.actions = actions.index_select(0, device_rows);
  r.behaviour_logp = behaviour_logp.index_select(0, device_rows);
  r.advantages = advantages.index_select(0, device_rows);
  r.rewards = rewards.index_select(0, seq);
  r.mean_reward = m > 0 ? r.rewards.mean().item<double>() : 0.0;
  r.exact_match = m > 0 ? (r.rewards >= 1.0f - 1e-6f).to(at::kFloat).mean().item<double>() : 0.0;
  return r;
}

Rollouts Generate(const Policy& behaviour, const DigitTasks& tasks, const std::vector<Problem>& prompts, int group,
                  c10::optional<at::Generator> generator) {
  at::NoGradGuard no_grad;
  const int n = static_cast<int>(prompts.size()) * group;
  Rollouts r;
  r.prompts = static_cast<int>(prompts.size());
  r.group = group;
  r.tokens = PromptTokens(prompts, group, tasks.base());
  std::int64_t* tok = r.tokens.data_ptr<std::int64_t>();
  std::vector<at::Tensor> actions, behaviour_logp;  // per position, on the device
  for (int k = 0; k < kAnswerDigits; ++k) {
    const at::Tensor logp = at::log_softmax(behaviour.PositionLogits(r.tokens, k), 1);
    const at::Tensor a = at::multinomial(logp.exp(), 1, /*replacement=*/false, generator);  // (n, 1)
    actions.push_back(a.view({n}));
    behaviour_logp.push_back(logp.gather(1, a).view({n}));
    const at::Tensor a_host = a.cpu().contiguous();  // the next position's inputs need these tokens
    const std::int64_t* ap = a_host.data_ptr<std::int64_t>();
    for (int i = 0; i < n; ++i) tok[static_cast<std::int64_t>(i) * kSequence + kFirstAnswerColumn + k] = ap[i];
  }
  r.actions = at::cat(actions);
  r.behaviour_logp = at::cat(behaviour_logp);
  r.rewards = at::empty({n});
  float* rew = r.rewards.data_ptr<float>();
  int exact = 0;
  double total = 0.0;
  for (int i = 0; i < n; ++i) {
    int right = 0;
    for (int k = 0; k < kAnswerDigits; ++k) {
      right += tok[static_cast<std::int64_t>(i) * kSequence + kFirstAnswerColumn + k] ==
               tasks.AnswerDigit(prompts[static_cast<std::size_t>(i / group)], k);
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
  r.advantages = adv.repeat({kAnswerDigits}).to(behaviour.device());  // token k of sequence i sits at k * n + i
  return r;
}

double SupervisedWarmup(Policy& policy, const DigitTasks& tasks, int steps, int batch, double lr,
                        std::mt19937_64& rng) {
  AdamW optimizer(policy.params, lr, 0.0);
  double last = 0.0;
  for (int s = 0; s < steps; ++s) {
    const auto problems = tasks.SamplePrompts(batch, rng);
    at::Tensor tokens = PromptTokens(problems, 1, tasks.base());
    at::Tensor targets = at::empty({kAnswerDigits * batch}, at::kLong);
    std::int64_t* tok = tokens.data_ptr<std::int64_t>();
    std::int64_t* tp = targets.data_ptr<std::int64_t>();
    for (int i = 0; i < batch; ++i) {
      for (int k = 0; k < kAnswerDigits; ++k) {
        const int d = tasks.AnswerDigit(problems[static_cast<std::size_t>(i)], k);
        tok[static_cast<std::int64_t>(i) * kSequence + kFirstAnswerColumn + k] = d;
        tp[k * batch + i] = d;
      }
    }
    for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
    const at::Tensor loss = at::nll_loss(at::log_softmax(policy.AnswerLogits(tokens), 1), targets.to(policy.device()));
    loss.backward();
    optimizer.Step(policy.params);
    last = loss.item<double>();
  }
  for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
  return last;
}

double Evaluate(const Policy& policy, const DigitTasks& tasks, const std::vector<Problem>& problems) {
  at::NoGradGuard no_grad;
  const int n = static_cast<int>(problems.size());
  at::Tensor tokens = PromptTokens(problems, 1, tasks.base());
  std::int64_t* tok = tokens.data_ptr<std::int64_t>();
  for (int k = 0; k < kAnswerDigits; ++k) {
    const at::Tensor a = policy.PositionLogits(tokens, k).argmax(1).cpu().contiguous();
    const std::int64_t* ap = a.data_ptr<std::int64_t>();
    for (int i = 0; i < n; ++i) tok[static_cast<std::int64_t>(i) * kSequence + kFirstAnswerColumn + k] = ap[i];
  }
  int exact = 0;
  for (int i = 0; i < n; ++i) {
    bool ok = true;
    for (int k = 0; k < kAnswerDigits; ++k) {
      ok = ok && tok[static_cast<std::int64_t>(i) * kSequence + kFirstAnswerColumn + k] ==
                     tasks.AnswerDigit(problems[static_cast<std::size_t>(i)], k);
    }
    exact += ok;
  }
  return static_cast<double>(exact) / n;
}

// --- losses ------------------------------------------------------------------

const char* LossName(LossKind kind) {
  switch (kind) {
    case LossKind::kGrpo: return "grpo";
    case LossKind::kM2po: return "m2po";
    case LossKind::kBapo: return "bapo";
    case LossKind::kIs: return "is";
    case LossKind::kTis: return "tis";
  }
  return "?";
}

bool ParseLoss(const std::string& name, LossKind* kind) {
  if (name == "grpo") *kind = LossKind::kGrpo;
  else if (name == "m2po") *kind = LossKind::kM2po;
  else if (name == "bapo") *kind = LossKind::kBapo;
  else if (name == "is") *kind = LossKind::kIs;
  else if (name == "tis") *kind = LossKind::kTis;
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

// Share of sum |clipped r A| carried by positive-advantage tokens, in the
// BAPO recipe's accounting: min(r, hi) A for A > 0, max(r, lo) A for A < 0.
double PositiveShare(const at::Tensor& ratio, const at::Tensor& adv, double lo, double hi) {
  const at::Tensor pos = adv > 0;
  const at::Tensor contribution =
      at::where(pos, at::clamp_max(ratio, hi) * adv, at::clamp_min(ratio, lo) * adv).abs();
  const double total = contribution.sum().item<double>();
  if (total <= 0.0) return 1.0;
  return (contribution * pos).sum().item<double>() / total;
}

// The bounds BAPO uses for this batch: the lower bound first, then the upper
// one, each in steps of `step` up to its maximum, until the positive share
// reaches rho0. In this accounting a higher lower bound never raises the
// positive share, so when the start misses the target the lower bound ends
// at its maximum before the upper one moves (as in the authors' recipe).
std::pair<double, double> BapoBounds(const at::Tensor& ratio, const at::Tensor& adv, const LossOptions& o) {
  double lo = o.bapo_lo_start, hi = o.bapo_hi_start;
  double share = PositiveShare(ratio, adv, lo, hi);
  for (int i = 1; share < o.bapo_rho0 && lo < o.bapo_lo_max - 1e-12; ++i) {
    lo = std::min(o.bapo_lo_start + i * o.bapo_step, o.bapo_lo_max);
    share = PositiveShare(ratio, adv, lo, hi);
  }
  for (int i = 1; share < o.bapo_rho0 && hi < o.bapo_hi_max - 1e-12; ++i) {
    hi = std::min(o.bapo_hi_start + i * o.bapo_step, o.bapo_hi_max);
    share = PositiveShare(ratio, adv, lo, hi);
  }
  return {lo, hi};
}

// PPO's per-token loss -min(r A, clip(r, lo, hi) A), and for A < 0 at most
// -c A (dual clip, c > 0). Fills the fractions of tokens without gradient.
at::Tensor ClippedSurrogate(const at::Tensor& ratio, const at::Tensor& adv, double lo, double hi, double dual_c,
                            LossResult* out) {
  const at::Tensor r = ratio.detach();
  at::Tensor pg = at::maximum(-ratio * adv, -at::clamp(ratio, lo, hi) * adv);
  at::Tensor no_grad = ((adv > 0) & (r > hi)) | ((adv < 0) & (r < lo));
  if (dual_c > 0.0) {
    const at::Tensor held = (adv < 0) & (r > dual_c);
    pg = at::where(adv < 0, at::minimum(pg, -dual_c * adv), pg);
    out->dual_clip_fraction = held.to(at::kFloat).mean().item<double>();
    no_grad = no_grad | held;
  }
  out->clip_fraction = no_grad.to(at::kFloat).mean().item<double>();
  return pg;
}

}  // namespace

LossResult ComputeLoss(const Policy& policy, const Policy& reference, const Rollouts& batch,
                       const LossOptions& options) {
  LossResult out;
  const at::Tensor logp_all = at::log_softmax(policy.AnswerLogits(batch.tokens), 1);
  const at::Tensor actions = batch.actions.view({-1, 1});
  const at::Tensor logp = logp_all.gather(1, actions).view({-1});
  const at::Tensor log_ratio = at::clamp(logp - batch.behaviour_logp, -20.0, 20.0);
  const at::Tensor ratio = log_ratio.exp();
  const at::Tensor& adv = batch.advantages;
  const at::Tensor lr_detached = log_ratio.detach();
  out.sampler_kl = (batch.behaviour_logp - logp.detach()).mean().item<double>();
  out.mean_abs_log_ratio = lr_detached.abs().mean().item<double>();
  out.m2 = lr_detached.square().mean().item<double>();

  at::Tensor pg;  // per-token surrogate loss
  switch (options.kind) {
    case LossKind::kGrpo:
      pg = ClippedSurrogate(ratio, adv, 1.0 - options.clip_eps, 1.0 + options.clip_eps, options.dual_clip_c, &out);
      break;
    case LossKind::kBapo: {
      const auto [lo, hi] = BapoBounds(ratio.detach(), adv, options);
      pg = ClippedSurrogate(ratio, adv, lo, hi, options.dual_clip_c, &out);
      out.bapo_lo = lo;
      out.bapo_hi = hi;
      break;
    }
    case LossKind::kM2po: {
      const at::Tensor mask = M2Mask(lr_detached.square(), options.m2_tau);
      pg = -mask * ratio * adv;
      out.clip_fraction = 1.0 - mask.mean().item<double>();
      break;
    }
    case LossKind::kIs:
      pg = -ratio * adv;
      break;
    case LossKind::kTis: {
      // The value -min(r, C) A; the gradient min(r, C) A grad log pi: the
      // weight r scaled down to C where it is larger, a constant factor.
      const at::Tensor r = ratio.detach();
      pg = -(at::clamp_max(r, options.tis_cap) / r) * ratio * adv;
      out.clip_fraction = (r > options.tis_cap).to(at::kFloat).mean().item<double>();
      break;
    }
  }

  const at::Tensor token_entropy = -(logp_all.exp() * logp_all).sum(1);
  at::Tensor token_kl = at::zeros_like(logp);
  if (options.kl_coef > 0.0) {
    at::Tensor ref_logp;
    {
      at::NoGradGuard no_grad;
      ref_logp = at::log_softmax(reference.AnswerLogits(batch.tokens), 1).gather(1, actions).view({-1});
    }
    // low_var_kl (k3): exp(ref - logp) - (ref - logp) - 1, clamped as in verl.
    const at::Tensor d = at::clamp(ref_logp - logp, -20.0, 20.0);
    token_kl = at::clamp(d.exp() - d - 1.0, -10.0, 10.0);
  }
  out.token_loss = pg - options.entropy_coef * token_entropy + options.kl_coef * token_kl;
  out.loss = out.token_loss.mean();
  out.pg_loss = pg.detach().mean().item<double>();
  out.kl = token_kl.detach().mean().item<double>();
  out.entropy = token_entropy.detach().mean().item<double>();
  out.logp = logp.detach();
  out.token_entropy = token_entropy.detach();
  return out;
}

// --- optimizer ---------------------------------------------------------------

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
