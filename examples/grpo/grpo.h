// The pieces of the async GRPO example trainer (gac_grpo) that touch tensors:
// the synthetic task, the policy, rollouts, the three policy losses and
// AdamW. ATen only (no torch/nn), one training thread.
//
// Task: two-digit addition. A prompt is "a1 a0 + b1 b0 =" (a, b in [0, 99],
// zero-padded), the answer is the three digits of a + b, most significant
// first ("23+58=" -> "081"). The reward is verifiable: the fraction of the
// three answer digits that are right (0, 1/3, 2/3, 1). Held-out accuracy is
// greedy exact match on a fixed set of 1,000 (a, b) pairs that are never
// used as training prompts (the same set for every seed).
//
// Policy: an autoregressive MLP. The distribution of answer digit k is
// softmax(MLP(x_k)) with x_k = [one-hot prompt digits (40) | one-hot answer
// digits before k, zeros after (20) | one-hot k (3)]. Two tanh hidden layers.
#ifndef GAC_EXAMPLES_GRPO_GRPO_H_
#define GAC_EXAMPLES_GRPO_GRPO_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace gac::grpo {

inline constexpr int kPromptDigits = 4;
inline constexpr int kAnswerDigits = 3;
inline constexpr int kVocab = 10;
inline constexpr int kInput = kPromptDigits * kVocab + (kAnswerDigits - 1) * kVocab + kAnswerDigits;  // 63

struct Problem {
  int a = 0, b = 0;
};

// Training and held-out problems. The held-out split depends only on a fixed
// constant, never on the run's seed.
class AdditionTask {
 public:
  explicit AdditionTask(int heldout_size = 1000);
  // `count` training problems drawn uniformly (with replacement).
  std::vector<Problem> SamplePrompts(int count, std::mt19937_64& rng) const;
  const std::vector<Problem>& heldout() const { return heldout_; }
  // Digit k (0 = hundreds) of the answer.
  static int AnswerDigit(const Problem& p, int k);

 private:
  std::vector<Problem> train_;
  std::vector<Problem> heldout_;
};

// The policy's parameters: W1, b1, W2, b2, W3, b3 (requires_grad on the
// learner's copy; snapshots are plain tensors), all on one device. Rollouts,
// losses and the optimizer run on that device; prompts, rewards and
// advantages are built on the CPU and moved there.
struct Policy {
  std::vector<at::Tensor> params;

  // Draws from the global ATen generator on the CPU (the same start on every
  // device), then moves to `device`.
  static Policy Init(int hidden, at::Device device = at::kCPU);
  at::Device device() const { return params.front().device(); }
  Policy Snapshot() const;         // detached clone, no grad
  std::int64_t NumParameters() const;
  // Logits (rows, 10) for inputs (rows, kInput).
  at::Tensor Logits(const at::Tensor& x) const;
};

// A batch of rollouts: `prompts` x `group` sequences of kAnswerDigits tokens.
struct Rollouts {
  int prompts = 0, group = 0;
  // On the policy's device.
  at::Tensor inputs;           // (kAnswerDigits * N, kInput), row k * N + i
  at::Tensor actions;          // (kAnswerDigits * N) int64
  at::Tensor behaviour_logp;   // (kAnswerDigits * N) log pi_b(a_t | s_t)
  at::Tensor rewards;          // (N) float, in [0, 1]
  at::Tensor advantages;       // (kAnswerDigits * N) group-normalised, per token
  double mean_reward = 0.0;
  double exact_match = 0.0;    // fraction of sequences entirely right
};

// Samples G answers per prompt from `behaviour` at temperature 1 and scores
// them. Advantages: (R - mean_G) / (std_G + 1e-6), 0 for a group with equal
// rewards; every token of a sequence carries its sequence's advantage.
Rollouts Generate(const Policy& behaviour, const std::vector<Problem>& prompts, int group);

// Supervised warm-up (the "pretrained" starting point of RL post-training):
// `steps` steps of teacher-forced cross-entropy on `batch` training problems
// with AdamW(lr). Returns the last batch's mean token cross-entropy.
double SupervisedWarmup(Policy& policy, const AdditionTask& task, int steps, int batch, double lr,
                        std::mt19937_64& rng);

// Greedy exact-match accuracy on `problems`.
double Evaluate(const Policy& policy, const std::vector<Problem>& problems);

enum class LossKind { kGrpo, kM2po, kBapo };
const char* LossName(LossKind kind);
bool ParseLoss(const std::string& name, LossKind* kind);

struct LossOptions {
  LossKind kind = LossKind::kGrpo;
  double clip_eps = 0.2;      // GRPO: ratio clipped to [1 - eps, 1 + eps]
  double m2_tau = 0.04;       // M2PO: bound on the mean squared log-ratio
  // BAPO (Xi et al. 2025, arXiv:2510.18927; defaults of its verl recipe):
  // bounds start at [a-, a+] and move up by delta-/delta+ within [.., b-],
  // [.., b+] until the positive tokens carry rho0 of the loss.
  double bapo_rho0 = 0.5;
  double bapo_a_lo = 0.6, bapo_b_lo = 0.9, bapo_delta_lo = 0.02;
  double bapo_a_hi = 1.2, bapo_b_hi = 3.0, bapo_delta_hi = 0.05;
  double kl_coef = 0.001;       // low_var_kl (k3) to the reference policy
  double entropy_coef = 0.001;  // entropy bonus
};

struct LossResult {
  at::Tensor loss;            // scalar with grad: pg - entropy_coef * H + kl_coef * KL
  double pg_loss = 0.0;
  double kl = 0.0;            // mean k3 estimate of KL(pi_theta || pi_ref)
  double entropy = 0.0;       // mean token entropy of pi_theta
  double mean_abs_log_ratio = 0.0;
  double m2 = 0.0;            // mean (log r)^2 before masking
  double clip_fraction = 0.0; // tokens with no gradient from the surrogate (clipped / masked)
  double bapo_lo = 0.0, bapo_hi = 0.0;  // BAPO bounds used this step
};

// The token-level policy loss of `policy` on `batch` (token mean).
//   GRPO: -min(r A, clip(r, 1-eps, 1+eps) A)
//   M2PO: -M r A, M masks the tokens with the largest (log r)^2 until the
//         mean (log r)^2 over the kept tokens is <= tau; no ratio clipping
//   BAPO: -min(r A, clip(r, lo, hi) A) with [lo, hi] adapted per batch
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
