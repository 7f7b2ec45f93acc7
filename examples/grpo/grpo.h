// The pieces of the async GRPO example trainer (gac_grpo) that touch tensors:
// the synthetic tasks, the two policies, rollouts, the policy losses and
// AdamW. ATen only (no torch/nn), one training thread.
//
// Tasks: two operands a, b of two base-B digits each and a task token; the
// answer is three base-B digits, most significant first. Task 0 is addition
// ("23+58=" -> "081" in base 10); DigitTasks lists the others. The reward is
// verifiable: the fraction of the three answer digits that are right (0,
// 1/3, 2/3, 1). Held-out accuracy is greedy exact match on a fixed set of
// problems (the same for every seed) that are never used as training prompts.
//
// Policies (PolicyOptions): an autoregressive MLP whose input for answer
// digit k is [one-hot task | one-hot prompt digits | one-hot answer digits
// before k, zeros after | one-hot k] with tanh hidden layers, or a small
// pre-LayerNorm causal Transformer over the token sequence
// [task, a1, a0, b1, b0, y0, y1, y2] (digit tokens 0..B-1, task tokens B..).
// Both put a softmax over the B digits on answer position k.
#ifndef GAC_EXAMPLES_GRPO_GRPO_H_
#define GAC_EXAMPLES_GRPO_GRPO_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

namespace gac::grpo {

inline constexpr int kPromptDigits = 4;
inline constexpr int kAnswerDigits = 3;
inline constexpr int kSequence = 1 + kPromptDigits + kAnswerDigits;  // task token, prompt, answer
inline constexpr int kMaxTasks = 8;

struct Problem {
  int task = 0;
  int a = 0, b = 0;  // in [0, base^2)
};

struct TaskOptions {
  int base = 10;   // digit alphabet size B, 2..64
  int tasks = 1;   // the first `tasks` of DigitTasks' list, 1..kMaxTasks
};

// Training and held-out problems. The held-out split depends only on the
// options and a fixed constant, never on the run's seed.
class DigitTasks {
 public:
  // REQUIRES: 2 <= base <= 64, 1 <= tasks <= kMaxTasks, heldout_size at most
  // half of the problems.
  explicit DigitTasks(TaskOptions options, int heldout_size = 1000);

  // `count` training problems: the task uniform, then (a, b) uniform among
  // the pairs that are not held out (with replacement).
  std::vector<Problem> SamplePrompts(int count, std::mt19937_64& rng) const;
  const std::vector<Problem>& heldout() const { return heldout_; }
  // Digit k (0 = most significant) of the answer.
  int AnswerDigit(const Problem& p, int k) const;
  int base() const { return options_.base; }
  int tasks() const { return options_.tasks; }
  // "add", "absdiff", "max", "min", "muldigit", "digitsum", "nocarry", "modsub".
  static const char* TaskName(int task);

 private:
  std::uint64_t Key(const Problem& p) const;

  TaskOptions options_;
  std::vector<Problem> heldout_;
  std::unordered_set<std::uint64_t> heldout_keys_;
};

enum class Arch : std::uint8_t { kMlp = 0, kTransformer = 1 };
const char* ArchName(Arch arch);
bool ParseArch(const std::string& name, Arch* arch);

struct PolicyOptions {
  Arch arch = Arch::kMlp;
  int width = 128;  // MLP hidden width / Transformer model width
  int layers = 2;   // MLP hidden layers / Transformer blocks
  int heads = 4;    // Transformer attention heads; must divide width
};

// The policy's parameters (requires_grad on the learner's copy; snapshots
// are plain tensors), all on one device. Rollouts, losses and the optimizer
// run on that device; token sequences stay on the CPU (int64, (n,
// kSequence)) and are encoded for the device by the forward functions.
struct Policy {
  PolicyOptions options;
  int base = 10, tasks = 1;
  std::vector<at::Tensor> params;

  // Draws from the global ATen generator on the CPU (the same start on every
  // device), then moves to `device`.
  static Policy Init(const PolicyOptions& options, const TaskOptions& task, at::Device device = at::kCPU);
  at::Device device() const { return params.front().device(); }
  Policy Snapshot() const;  // detached clone, no grad
  std::int64_t NumParameters() const;
  // Logits (n, base) of answer digit k; answer tokens k.. are ignored.
  at::Tensor PositionLogits(const at::Tensor& tokens, int k) const;
  // Logits (kAnswerDigits * n, base) of every answer digit, row k * n + i.
  at::Tensor AnswerLogits(const at::Tensor& tokens) const;
};

// How the sampler's lag is counted.
//   kSteps (the default, as the paper models it): the behaviour policy of
//     optimizer step t is the learner after step t - 1 - s, so the learner is
//     s steps ahead of it. A skipped update leaves the weights unchanged: after
//     s consecutive skips the behaviour policy is the learner again (a
//     pipelined system whose samplers receive the weights of every step).
//   kVersions: the lag is s applied updates; a skipped update does not advance
//     it, so the sampler stays s updates behind however many steps are skipped
//     (a system that bounds staleness in weight versions and whose samplers
//     wait for the next version).
enum class LagRule : std::uint8_t { kSteps = 0, kVersions = 1 };
const char* LagRuleName(LagRule rule);
bool ParseLagRule(const std::string& name, LagRule* rule);

// The policies the sampler may lag by: a ring of snapshots (a snapshot taken
// after a skip shares the previous one's tensors).
class PolicyLag {
 public:
  PolicyLag(Policy initial, int staleness, LagRule rule);
  // After an optimizer step; `updated` is false when the update was skipped.
  // `learner` is read only when updated.
  void Advance(const Policy& learner, bool updated);
  // The policy the next rollouts come from.
  const Policy& behaviour() const { return ring_.front().policy; }
  // From now on the sampler lags by `staleness`. A larger lag is reached as a
  // sampler that falls behind reaches it: the behaviour policy stays where it
  // is until the learner is that far ahead; a smaller one at the next Advance.
  void SetStaleness(int staleness) { staleness_ = staleness; }
  int staleness() const { return staleness_; }
  std::int64_t steps() const { return steps_; }        // optimizer steps so far
  std::int64_t version() const { return version_; }    // applied updates so far
  std::int64_t behaviour_step() const { return ring_.front().step; }
  std::int64_t behaviour_version() const { return ring_.front().version; }

 private:
  struct Entry {
    Policy policy;
    std::int64_t step = 0, version = 0;
  };
  int staleness_;
  LagRule rule_;
  std::int64_t steps_ = 0, version_ = 0;
  std::deque<Entry> ring_;
};

// A batch of rollouts: `prompts` x `group` sequences; sequence i answers
// prompt i / group.
struct Rollouts {
  int prompts = 0, group = 0;
  at::Tensor tokens;          // (N, kSequence) int64 on the CPU
  // On the policy's device; token row k * N + i is answer digit k of sequence i.
  at::Tensor actions;         // (kAnswerDigits * N) int64
  at::Tensor behaviour_logp;  // (kAnswerDigits * N) log pi_b(a_t | s_t)
  at::Tensor advantages;      // (kAnswerDigits * N) group-normalised, per token
  at::Tensor rewards;         // (N) float on the CPU, in [0, 1]
  double mean_reward = 0.0;
  double exact_match = 0.0;   // fraction of sequences entirely right

  int sequences() const { return prompts * group; }
  // The groups of the given prompts, in that order (a minibatch or a half).
  Rollouts Groups(const std::vector<int>& prompt_ids) const;
};

// Samples G answers per prompt from `behaviour` at temperature 1 (with
// `generator` when given, else ATen's default) and scores them. Advantages:
// (R - mean_G) / (std_G + 1e-6), 0 for a group with equal rewards; every
// token of a sequence carries its sequence's advantage.
Rollouts Generate(const Policy& behaviour, const DigitTasks& tasks, const std::vector<Problem>& prompts, int group,
                  c10::optional<at::Generator> generator = c10::nullopt);

// Supervised warm-up (the "pretrained" starting point of RL post-training):
// `steps` steps of teacher-forced cross-entropy on `batch` training problems
// with AdamW(lr). Returns the last batch's mean token cross-entropy.
double SupervisedWarmup(Policy& policy, const DigitTasks& tasks, int steps, int batch, double lr,
                        std::mt19937_64& rng);

// Greedy exact-match accuracy on `problems`.
double Evaluate(const Policy& policy, const DigitTasks& tasks, const std::vector<Problem>& problems);

enum class LossKind { kGrpo, kM2po, kBapo, kIs, kTis };
const char* LossName(LossKind kind);
bool ParseLoss(const std::string& name, LossKind* kind);

struct LossOptions {
  LossKind kind = LossKind::kGrpo;
  double clip_eps = 0.2;     // GRPO: ratio clipped to [1 - eps, 1 + eps]
  // Dual clip (Ye et al. 2020; verl's clip_ratio_c) for GRPO and BAPO: a
  // token with a negative advantage contributes at most c * |A| to the loss,
  // so a ratio far above 1 cannot push it without bound. 0 turns it off.
  double dual_clip_c = 3.0;
  double m2_tau = 0.04;      // M2PO: bound on the mean squared log-ratio
  // Truncated IS: the importance weight min(r, C), as V-trace's truncated
  // weights (Espeholt et al. 2018) and the truncated IS correction of
  // asynchronous RL trainers for sampler-learner mismatch.
  double tis_cap = 2.0;
  // BAPO (Xi et al. 2025, arXiv:2510.18927), as the authors' verl recipe does
  // it (github.com/WooooDyy/BAPO, recipe/bapo/policy_loss.py): the ratio
  // bounds start at [lo_start, hi_start]; while positive-advantage tokens
  // carry less than rho0 of sum |clipped r A|, the lower bound is raised in
  // steps of bapo_step up to lo_max, and only then the upper bound up to
  // hi_max. rho0 and the ranges are the README's: 0.5, [0.6, 0.9], [1.2, 3.0];
  // the step 0.05 is the recipe's.
  double bapo_rho0 = 0.5;
  double bapo_lo_start = 0.6, bapo_lo_max = 0.9;
  double bapo_hi_start = 1.2, bapo_hi_max = 3.0;
  double bapo_step = 0.05;
  double kl_coef = 0.001;       // low_var_kl (k3) to the reference policy
  double entropy_coef = 0.001;  // entropy bonus
};

struct LossResult {
  // Per token, with grad: pg - entropy_coef * H + kl_coef * KL; the loss is
  // its mean (so a sum over a subset of tokens divided by the batch's token
  // count is that subset's share of the gradient).
  at::Tensor token_loss;
  at::Tensor loss;            // token_loss.mean()
  // Per token, detached, for the policy-health signals (policy_signals.h):
  // the learner's log pi(a_t | s_t) (not clamped) and its entropy.
  at::Tensor logp;
  at::Tensor token_entropy;
  double pg_loss = 0.0;
  double kl = 0.0;            // mean k3 estimate of KL(pi_theta || pi_ref)
  double entropy = 0.0;       // mean token entropy of pi_theta
  double sampler_kl = 0.0;    // mean log(pi_b / pi_theta): sampler-learner KL (k1)
  double mean_abs_log_ratio = 0.0;
  double m2 = 0.0;            // mean (log r)^2 before masking
  double clip_fraction = 0.0; // tokens with no gradient from the surrogate (clipped / masked); TIS: truncated
  double dual_clip_fraction = 0.0;  // negative-advantage tokens held at -c A
  double bapo_lo = 0.0, bapo_hi = 0.0;  // BAPO bounds used this batch
};

// The token-level policy loss of `policy` on `batch` (token mean).
//   GRPO: -min(r A, clip(r, 1-eps, 1+eps) A), dual-clipped for A < 0
//   M2PO: -M r A, M masks the tokens with the largest (log r)^2 until the
//         mean (log r)^2 over the kept tokens is <= tau; no ratio clipping
//   BAPO: -min(r A, clip(r, lo, hi) A) with [lo, hi] adapted per batch,
//         dual-clipped for A < 0
//   IS:   -r A, the unclipped importance-sampling surrogate
//   TIS:  -min(r, C) A, its gradient min(r, C) A grad log pi on every token
//         (the weight truncated, not the token dropped)
// The log-ratio is clamped to [-20, 20] before exp (as verl does).
LossResult ComputeLoss(const Policy& policy, const Policy& reference, const Rollouts& batch,
                       const LossOptions& options);

// AdamW (decoupled weight decay), the PyTorch update rule.
class AdamW {
 public:
  AdamW(const std::vector<at::Tensor>& params, double lr, double weight_decay, double beta1 = 0.9,
        double beta2 = 0.999, double eps = 1e-8);
  void Step(const std::vector<at::Tensor>& params);

 private:
  double lr_, weight_decay_, beta1_, beta2_, eps_;
  std::int64_t t_ = 0;
  std::vector<at::Tensor> m_, v_;
};

// Scales the gradients so that their global L2 norm is at most max_norm;
// returns the norm before clipping.
double ClipGradNorm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace gac::grpo

#endif  // GAC_EXAMPLES_GRPO_GRPO_H_
