// Tests of gac_grpo's pieces (examples/grpo) against independent references:
// the task answers, the two policies' forward paths, the losses written out
// per token in double, BAPO's bound search by brute force, the half-batch
// backward, the participation ratio on vectors of known geometry, the
// orthogonal gain, the staleness-bias identities, the version ring, and the
// policy-health signals against a loop over the counted tokens in double
// (test_policy_signals.py checks them against gac.rl's). (The windowed
// trigger is the library's: tests/controller/window_test.cc.)
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "examples/grpo/grpo.h"
#include "examples/grpo/olmo_skip.h"
#include "examples/grpo/policy_signals.h"
#include "examples/grpo/probes.h"

namespace gac::grpo {
namespace {

constexpr int kFirstAnswer = 1 + kPromptDigits;

TEST(DigitTasks, AnswersInBase10AndBase16) {
  const DigitTasks t({10, 8});
  auto digits = [&](int task, int a, int b) {
    const Problem p{task, a, b};
    return t.AnswerDigit(p, 0) * 100 + t.AnswerDigit(p, 1) * 10 + t.AnswerDigit(p, 2);
  };
  EXPECT_EQ(digits(0, 23, 58), 81);   // add
  EXPECT_EQ(digits(0, 99, 99), 198);
  EXPECT_EQ(digits(1, 23, 58), 35);   // |a - b|
  EXPECT_EQ(digits(2, 23, 58), 58);   // max
  EXPECT_EQ(digits(3, 23, 58), 23);   // min
  EXPECT_EQ(digits(4, 23, 58), 184);  // 23 * 8
  EXPECT_EQ(digits(5, 23, 58), 18);   // 2 + 3 + 5 + 8
  EXPECT_EQ(digits(6, 27, 58), 75);   // (2+5)%10, (7+8)%10
  EXPECT_EQ(digits(7, 23, 58), 65);   // (23 - 58) mod 100
  const DigitTasks hex({16, 1});
  const Problem p{0, 0xff, 0xff};      // 0x1fe
  EXPECT_EQ(hex.AnswerDigit(p, 0), 1);
  EXPECT_EQ(hex.AnswerDigit(p, 1), 15);
  EXPECT_EQ(hex.AnswerDigit(p, 2), 14);
}

TEST(DigitTasks, HeldOutIsFixedAndNeverSampled) {
  const DigitTasks a({10, 4}, 400), b({10, 4}, 400);
  ASSERT_EQ(a.heldout().size(), 400u);
  std::set<std::tuple<int, int, int>> held;
  std::vector<int> per_task(4, 0);
  for (std::size_t i = 0; i < a.heldout().size(); ++i) {
    const Problem& p = a.heldout()[i];
    EXPECT_EQ(p.task, b.heldout()[i].task);
    EXPECT_EQ(p.a, b.heldout()[i].a);
    EXPECT_EQ(p.b, b.heldout()[i].b);
    held.insert({p.task, p.a, p.b});
    ++per_task[static_cast<std::size_t>(p.task)];
  }
  EXPECT_EQ(held.size(), 400u);  // distinct
  for (int c : per_task) EXPECT_EQ(c, 100);
  std::mt19937_64 rng(5);
  std::vector<int> sampled(4, 0);
  for (const Problem& p : a.SamplePrompts(4000, rng)) {
    EXPECT_EQ(held.count({p.task, p.a, p.b}), 0u);
    ++sampled[static_cast<std::size_t>(p.task)];
  }
  for (int c : sampled) EXPECT_NEAR(c, 1000, 150);
}

// Token rows for a few problems with arbitrary answers.
at::Tensor SomeTokens(const DigitTasks& t, int n, std::mt19937_64& rng) {
  at::Tensor tokens = at::zeros({n, kSequence}, at::kLong);
  const auto problems = t.SamplePrompts(n, rng);
  for (int i = 0; i < n; ++i) {
    const Problem& p = problems[static_cast<std::size_t>(i)];
    const int base = t.base();
    const int row[kSequence] = {base + p.task, p.a / base, p.a % base, p.b / base, p.b % base,
                                static_cast<int>(rng() % base), static_cast<int>(rng() % base),
                                static_cast<int>(rng() % base)};
    for (int j = 0; j < kSequence; ++j) tokens[i][j] = row[j];
  }
  return tokens;
}

class PolicyForward : public ::testing::TestWithParam<Arch> {};

TEST_P(PolicyForward, AnswerLogitsMatchPositionLogitsAndIgnoreLaterTokens) {
  at::manual_seed(3);
  const TaskOptions task{7, 3};
  const DigitTasks t(task, 60);
  const Policy p = Policy::Init({GetParam(), 16, 2, 2}, task);
  std::mt19937_64 rng(1);
  const at::Tensor tokens = SomeTokens(t, 5, rng);
  const at::Tensor all = p.AnswerLogits(tokens);
  ASSERT_EQ(all.size(0), 3 * 5);
  ASSERT_EQ(all.size(1), 7);
  for (int k = 0; k < kAnswerDigits; ++k) {
    const at::Tensor one = p.PositionLogits(tokens, k);
    EXPECT_TRUE(at::allclose(one, all.narrow(0, 5 * k, 5), 1e-5, 1e-6)) << "position " << k;
    // Answer tokens k.. must not change the logits of position k.
    at::Tensor changed = tokens.clone();
    for (int j = k; j < kAnswerDigits; ++j) changed.select(1, kFirstAnswer + j).fill_(6 - j);
    EXPECT_TRUE(at::allclose(p.PositionLogits(changed, k), one, 1e-5, 1e-6)) << "position " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Arches, PolicyForward, ::testing::Values(Arch::kMlp, Arch::kTransformer));

// A batch of `prompts` x `group` sequences whose ratio r = pi_theta /
// pi_b and advantage per token are the given ones (behaviour log-probs are
// set from the policy's own log-probs).
Rollouts BatchWithRatios(const Policy& policy, const DigitTasks& t, int prompts, int group,
                         const std::vector<double>& ratio, const std::vector<double>& adv) {
  std::mt19937_64 rng(11);
  Rollouts r;
  r.prompts = prompts;
  r.group = group;
  const int n = prompts * group;
  r.tokens = SomeTokens(t, n, rng);
  at::Tensor actions = at::empty({kAnswerDigits * n}, at::kLong);
  for (int k = 0; k < kAnswerDigits; ++k) {
    for (int i = 0; i < n; ++i) actions[k * n + i] = r.tokens[i][kFirstAnswer + k].item<std::int64_t>();
  }
  r.actions = actions;
  at::NoGradGuard no_grad;
  const at::Tensor logp = at::log_softmax(policy.AnswerLogits(r.tokens), 1).gather(1, actions.view({-1, 1})).view({-1});
  r.behaviour_logp = logp - at::log(at::tensor(ratio, at::kDouble).to(at::kFloat));
  r.advantages = at::tensor(adv, at::kDouble).to(at::kFloat);
  r.rewards = at::zeros({n});
  return r;
}

struct LossCase {
  LossKind kind;
  std::vector<double> ratio, adv;
};

// The per-token surrogate of each loss, in double, from its definition.
double ReferenceToken(LossKind kind, double r, double a, double lo, double hi, double c) {
  switch (kind) {
    case LossKind::kIs: return -r * a;
    case LossKind::kTis: return -std::min(r, 2.0) * a;  // the default cap
    case LossKind::kGrpo:
    case LossKind::kBapo: {
      double v = std::max(-r * a, -std::min(std::max(r, lo), hi) * a);
      if (a < 0) v = std::min(v, -c * a);
      return v;
    }
    case LossKind::kM2po: return -r * a;  // no masking in the cases below (m2 <= tau)
  }
  return 0;
}

TEST(Loss, PerTokenValuesMatchTheDefinitions) {
  at::manual_seed(4);
  const TaskOptions task{10, 1};
  const DigitTasks t(task, 100);
  const Policy policy = Policy::Init({Arch::kMlp, 8, 1, 1}, task);
  // 2 prompts x 2 samples x 3 tokens = 12 tokens: ratios inside and outside
  // the clip range and beyond the dual clip (c = 3), both advantage signs.
  const std::vector<double> ratio = {0.5, 0.9, 1.0, 1.1, 1.5, 4.0, 0.5, 0.9, 1.0, 1.1, 1.5, 4.0};
  const std::vector<double> adv = {1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -0.5, -2};
  const Rollouts batch = BatchWithRatios(policy, t, 2, 2, ratio, adv);
  for (LossKind kind : {LossKind::kGrpo, LossKind::kIs, LossKind::kTis}) {
    LossOptions o;
    o.kind = kind;
    o.kl_coef = 0.0;
    o.entropy_coef = 0.0;
    const LossResult res = ComputeLoss(policy, policy, batch, o);
    for (std::size_t i = 0; i < ratio.size(); ++i) {
      const double want = ReferenceToken(kind, ratio[i], adv[i], 0.8, 1.2, 3.0);
      EXPECT_NEAR(res.token_loss[static_cast<std::int64_t>(i)].item<double>(), want, 1e-4)
          << LossName(kind) << " token " << i;
    }
    if (kind == LossKind::kGrpo) {
      // No gradient: A>0 & r>1.2 (1.5, 4.0), A<0 & r<0.8 (0.5), A<0 & r>3 (4.0).
      EXPECT_NEAR(res.clip_fraction, 4.0 / 12.0, 1e-6);
      EXPECT_NEAR(res.dual_clip_fraction, 1.0 / 12.0, 1e-6);
    }
    if (kind == LossKind::kTis) {
      EXPECT_NEAR(res.clip_fraction, 2.0 / 12.0, 1e-6);  // r = 4 > 2, twice
    }
    // Sampler-learner KL k1: mean log(pi_b / pi_theta) = -mean log r.
    double k1 = 0;
    for (double r : ratio) k1 -= std::log(r);
    EXPECT_NEAR(res.sampler_kl, k1 / 12.0, 1e-5);
  }
}

// Truncated IS: the gradient is min(r, C) A grad log pi on every token, so it
// equals the unclipped IS gradient of advantages scaled by min(r, C) / r.
TEST(Loss, TruncatedIsWeighsEachTokenByItsTruncatedRatio) {
  at::manual_seed(6);
  const TaskOptions task{10, 1};
  const DigitTasks t(task, 100);
  const Policy policy = Policy::Init({Arch::kMlp, 8, 1, 1}, task);
  const std::vector<double> ratio = {0.5, 0.9, 1.5, 2.5, 4.0, 1.0, 0.7, 3.0, 1.2, 2.0, 6.0, 0.8};
  const std::vector<double> adv = {1, -1, 0.5, 1, -2, 1, -1, 0.5, 1, -1, 2, -0.5};
  std::vector<double> scaled(adv.size());
  for (std::size_t i = 0; i < adv.size(); ++i) scaled[i] = adv[i] * std::min(ratio[i], 2.0) / ratio[i];
  const auto grads = [&](LossKind kind, const std::vector<double>& a) {
    const Rollouts batch = BatchWithRatios(policy, t, 2, 2, ratio, a);
    for (const at::Tensor& p : policy.params) p.mutable_grad() = at::Tensor();
    LossOptions o;
    o.kind = kind;
    o.kl_coef = 0.0;
    o.entropy_coef = 0.0;
    ComputeLoss(policy, policy, batch, o).loss.backward();
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : policy.params) out.push_back(p.grad().clone());
    return out;
  };
  for (const at::Tensor& p : policy.params) p.requires_grad_(true);
  const std::vector<at::Tensor> tis = grads(LossKind::kTis, adv);
  const std::vector<at::Tensor> is = grads(LossKind::kIs, scaled);
  for (std::size_t k = 0; k < tis.size(); ++k) {
    EXPECT_TRUE(at::allclose(tis[k], is[k], 1e-4, 1e-6)) << "parameter " << k;
  }
  EXPECT_GT(tis[0].abs().sum().item<double>(), 0.0);
}

// BAPO's bounds by brute force: the first (lo, hi) in the recipe's order
// (lo over its grid with hi at the start, then hi over its grid with lo at
// its maximum) whose positive share reaches rho0.
std::pair<double, double> BruteForceBapo(const std::vector<double>& r, const std::vector<double>& a) {
  auto share = [&](double lo, double hi) {
    double pos = 0, all = 0;
    for (std::size_t i = 0; i < r.size(); ++i) {
      const double v = a[i] > 0 ? std::min(r[i], hi) * a[i] : std::max(r[i], lo) * a[i];
      all += std::fabs(v);
      if (a[i] > 0) pos += std::fabs(v);
    }
    return all > 0 ? pos / all : 1.0;
  };
  for (int i = 0; i <= 6; ++i) {
    if (share(0.6 + 0.05 * i, 1.2) >= 0.5) return {0.6 + 0.05 * i, 1.2};
  }
  for (int j = 1; j <= 36; ++j) {
    if (share(0.9, 1.2 + 0.05 * j) >= 0.5) return {0.9, 1.2 + 0.05 * j};
  }
  return {0.9, 3.0};
}

TEST(Loss, BapoRaisesTheLowerBoundFirstThenTheUpper) {
  at::manual_seed(5);
  const TaskOptions task{10, 1};
  const DigitTasks t(task, 100);
  const Policy policy = Policy::Init({Arch::kMlp, 8, 1, 1}, task);
  LossOptions o;
  o.kind = LossKind::kBapo;
  o.kl_coef = 0.0;
  o.entropy_coef = 0.0;
  // Positive tokens with large ratios, negative ones near 1: the share at
  // the start is below 0.5 and grows only with the upper bound.
  const std::vector<double> ratio = {1.0, 1.8, 2.5, 1.0, 1.0, 1.0, 1.1, 1.0, 0.7, 1.0, 1.0, 1.2};
  const std::vector<double> adv = {0.1, 1, 1, -1, -1, -1, -1, -1, -1, -0.2, -0.3, 0.2};
  const Rollouts batch = BatchWithRatios(policy, t, 2, 2, ratio, adv);
  const LossResult res = ComputeLoss(policy, policy, batch, o);
  const auto [lo, hi] = BruteForceBapo(ratio, adv);
  EXPECT_NEAR(res.bapo_lo, lo, 1e-9);
  EXPECT_NEAR(res.bapo_hi, hi, 1e-9);
  EXPECT_NEAR(res.bapo_lo, 0.9, 1e-9);  // this case needs the upper bound to move
  EXPECT_GT(res.bapo_hi, 1.2);
  for (std::size_t i = 0; i < ratio.size(); ++i) {
    EXPECT_NEAR(res.token_loss[static_cast<std::int64_t>(i)].item<double>(),
                ReferenceToken(LossKind::kBapo, ratio[i], adv[i], lo, hi, 3.0), 1e-4);
  }
  // A batch that meets the target at the start keeps the start bounds.
  const std::vector<double> easy_adv = {1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1};
  const std::vector<double> ones(12, 1.0);
  const LossResult easy = ComputeLoss(policy, policy, BatchWithRatios(policy, t, 2, 2, ones, easy_adv), o);
  EXPECT_NEAR(easy.bapo_lo, 0.6, 1e-9);
  EXPECT_NEAR(easy.bapo_hi, 1.2, 1e-9);
}

TEST(Rollouts, GroupsSelectWholeGroupsInOrder) {
  at::manual_seed(6);
  const TaskOptions task{10, 2};
  const DigitTasks t(task, 100);
  const Policy policy = Policy::Init({Arch::kMlp, 8, 1, 1}, task);
  std::mt19937_64 rng(2);
  const Rollouts r = Generate(policy, t, t.SamplePrompts(4, rng), 3);
  const Rollouts s = r.Groups({2, 0});
  ASSERT_EQ(s.sequences(), 6);
  for (int k = 0; k < kAnswerDigits; ++k) {
    for (int i = 0; i < 6; ++i) {
      const int src = (i < 3 ? 2 * 3 : 0) + i % 3;
      EXPECT_EQ(s.actions[k * 6 + i].item<std::int64_t>(), r.actions[k * 12 + src].item<std::int64_t>());
      EXPECT_EQ(s.advantages[k * 6 + i].item<float>(), r.advantages[k * 12 + src].item<float>());
      EXPECT_EQ(s.tokens[i][kFirstAnswer + k].item<std::int64_t>(), s.actions[k * 6 + i].item<std::int64_t>());
    }
  }
}

TEST(Probes, BackwardInHalvesGivesTheFullGradientAndTheHalvesCosine) {
  at::manual_seed(7);
  const TaskOptions task{10, 1};
  const DigitTasks t(task, 100);
  Policy policy = Policy::Init({Arch::kMlp, 16, 2, 1}, task);
  std::mt19937_64 rng(3);
  const Rollouts batch = Generate(policy.Snapshot(), t, t.SamplePrompts(6, rng), 4);
  LossOptions o;  // GRPO: no batch-global statistics, so a half's loss is its own
  const Policy ref = policy.Snapshot();
  // Reference: plain backward of the whole batch, and of each half alone.
  for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
  ComputeLoss(policy, ref, batch, o).loss.backward();
  const GradList full = CopyGrads(policy.params);
  auto half_grad = [&](std::vector<int> ids) {
    for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
    ComputeLoss(policy, ref, batch.Groups(ids), o).loss.backward();
    return CopyGrads(policy.params);
  };
  const double want = Cosine(half_grad({0, 1, 2}), half_grad({3, 4, 5}));
  const double got = BackwardInHalves(policy.params, ComputeLoss(policy, ref, batch, o).token_loss, 6, 4);
  EXPECT_NEAR(got, want, 1e-5);
  const GradList split = CopyGrads(policy.params);
  for (std::size_t i = 0; i < full.size(); ++i) EXPECT_TRUE(at::allclose(split[i], full[i], 1e-4, 1e-7));
}

TEST(Probes, ParticipationRatioOfKnownGeometries) {
  // n orthonormal rows: the centred Gram is I - 11^T/n, eigenvalues 1 (n-1 times) and 0.
  const at::Tensor eye = at::eye(10, at::kDouble);
  EXPECT_NEAR(ParticipationRatio(eye).pr_sample, 9.0, 1e-9);
  // Rows along one direction (random lengths): one eigenvalue.
  at::manual_seed(8);
  const at::Tensor line = at::randn({500, 1}, at::kDouble) * at::randn({1, 50}, at::kDouble);
  EXPECT_NEAR(ParticipationRatio(line).pr_sample, 1.0, 1e-9);
  EXPECT_NEAR(ParticipationRatio(line).pr_pop, 1.0, 0.05);
  // Isotropic Gaussian noise in d = 40 dimensions, many samples: PR -> d,
  // mean cos^2 of two samples -> 1/d.
  const EffectiveDimension iso = ParticipationRatio(at::randn({2000, 40}, at::kDouble));
  EXPECT_NEAR(iso.pr_pop, 40.0, 3.0);
  EXPECT_NEAR(iso.pr_sample, 40.0, 3.0);
  EXPECT_NEAR(iso.mean_pair_cos2, 1.0 / 40.0, 0.003);
  // 200 samples of 1,000-dimensional noise: the sample PR is capped near n,
  // the off-diagonal estimate is not.
  const EffectiveDimension wide = ParticipationRatio(at::randn({200, 1000}, at::kDouble));
  EXPECT_LT(wide.pr_sample, 200.0);
  EXPECT_NEAR(wide.pr_pop, 1000.0, 150.0);
  EXPECT_EQ(ParticipationRatio(at::randn({2, 5})).samples, 0);
}

TEST(Probes, OrthogonalGainGivesAlphaParallelPlusBetaPerpendicular) {
  at::manual_seed(9);
  std::vector<at::Tensor> params = {at::zeros({3, 4}).set_requires_grad(true), at::zeros({5}).set_requires_grad(true)};
  const GradList g = {at::randn({3, 4}), at::randn({5})};
  const GradList p = {at::randn({3, 4}), at::randn({5})};
  const double alpha = 0.3, beta = 0.6;
  const double c = Dot(g, p) / Dot(p, p);
  // What the agent leaves: g - (1 - alpha) c p.
  for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g[i] - p[i] * ((1 - alpha) * c);
  ApplyOrthogonalGain(params, p, alpha, c, beta);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor par = p[i] * c, perp = g[i] - p[i] * c;
    EXPECT_TRUE(at::allclose(params[i].grad(), par * alpha + perp * beta, 1e-5, 1e-6));
  }
}

TEST(Probes, StalenessBiasIdentities) {
  at::manual_seed(10);
  const TaskOptions task{10, 1};
  const DigitTasks t(task, 100);
  Policy policy = Policy::Init({Arch::kMlp, 16, 2, 1}, task);
  const Policy ref = policy.Snapshot();
  std::mt19937_64 rng(4);
  LossOptions o;
  auto grad_of = [&](const Rollouts& b) {
    for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
    ComputeLoss(policy, ref, b, o).loss.backward();
    return CopyGrads(policy.params);
  };
  const GradList prev = grad_of(Generate(ref, t, t.SamplePrompts(8, rng), 4));
  const GradList stale = grad_of(Generate(ref, t, t.SamplePrompts(8, rng), 4));
  for (auto& p : policy.params) p.mutable_grad() = at::Tensor();
  auto measure = [&](double alpha, double beta) {
    std::mt19937_64 r(21);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
    return MeasureStalenessBias(policy, ref, t, 8, 4, o, stale, prev, alpha, beta, r, gen);
  };
  const StalenessBias same = measure(1.0, 1.0);
  EXPECT_NEAR(same.aligned_after, same.aligned_before, 1e-9);
  EXPECT_NEAR(same.bias_after_rel, same.bias_rel, 1e-9);
  // alpha = 0 removes the stale gradient's part along p: what is left along p
  // is minus the on-policy gradient's part.
  const StalenessBias removed = measure(0.0, 1.0);
  EXPECT_NEAR(removed.aligned_after, -removed.on_align, 1e-6);
  EXPECT_NEAR(removed.lambda, same.lambda, 1e-9);  // same fresh batch (same generators)
  // lambda * |b| / |g_on| is b's part along p.
  EXPECT_NEAR(same.lambda * same.bias_rel, same.aligned_before, 1e-6);
  for (const auto& p : policy.params) EXPECT_FALSE(p.grad().defined());
}

// An optimizer update: every parameter moves.
void Perturb(Policy& p) {
  at::NoGradGuard no_grad;
  for (auto& t : p.params) t.add_(at::randn_like(t) * 0.3);
}

// The importance-ratio deviation of rollouts from `lag`'s behaviour policy
// under the learner: mean |log(pi_theta / pi_b)|.
double RatioDeviation(const Policy& learner, const PolicyLag& lag, const DigitTasks& t) {
  std::mt19937_64 rng(5);
  const Rollouts batch = Generate(lag.behaviour(), t, t.SamplePrompts(8, rng), 4);
  return ComputeLoss(learner, learner, batch, LossOptions{}).mean_abs_log_ratio;
}

TEST(PolicyLag, CountedInStepsSSkipsMakeTheNextRolloutOnPolicy) {
  const TaskOptions task{10, 1};
  const DigitTasks t(task, 100);
  at::manual_seed(12);
  Policy p = Policy::Init({Arch::kMlp, 8, 1, 1}, task);
  constexpr int kS = 3;
  PolicyLag lag(p.Snapshot(), kS, LagRule::kSteps);
  for (int i = 0; i < 5; ++i) {  // five applied updates
    Perturb(p);
    lag.Advance(p, true);
  }
  EXPECT_EQ(lag.steps() - lag.behaviour_step(), kS);
  EXPECT_EQ(lag.version() - lag.behaviour_version(), kS);
  EXPECT_GT(RatioDeviation(p, lag, t), 1e-3);
  // Skips: the lag in steps stays s, the lag in updates shrinks by one each.
  for (int k = 1; k <= kS; ++k) {
    lag.Advance(p, false);
    EXPECT_EQ(lag.steps() - lag.behaviour_step(), kS);
    EXPECT_EQ(lag.version() - lag.behaviour_version(), kS - k);
    if (k < kS) {
      EXPECT_GT(RatioDeviation(p, lag, t), 1e-3) << k << " skips";
    }
  }
  // After s consecutive skips the behaviour policy is the learner: ratio 1 on every token.
  EXPECT_EQ(RatioDeviation(p, lag, t), 0.0);
  for (std::size_t i = 0; i < p.params.size(); ++i) EXPECT_TRUE(at::equal(lag.behaviour().params[i], p.params[i]));
  // The next update makes it stale again.
  Perturb(p);
  lag.Advance(p, true);
  EXPECT_GT(RatioDeviation(p, lag, t), 1e-3);
  EXPECT_EQ(lag.version() - lag.behaviour_version(), 1);
}

TEST(PolicyLag, CountedInVersionsASkipDoesNotAdvanceIt) {
  const TaskOptions task{10, 1};
  const DigitTasks t(task, 100);
  at::manual_seed(12);
  Policy p = Policy::Init({Arch::kMlp, 8, 1, 1}, task);
  PolicyLag lag(p.Snapshot(), 2, LagRule::kVersions);
  EXPECT_EQ(lag.behaviour_version(), 0);
  for (int i = 0; i < 3; ++i) {
    Perturb(p);
    lag.Advance(p, true);
  }
  EXPECT_EQ(lag.version(), 3);
  EXPECT_EQ(lag.behaviour_version(), 1);
  for (int i = 0; i < 10; ++i) lag.Advance(p, false);  // however many skips
  EXPECT_EQ(lag.version() - lag.behaviour_version(), 2);
  EXPECT_EQ(lag.steps(), 13);
  EXPECT_GT(RatioDeviation(p, lag, t), 1e-3);
  PolicyLag sync(p.Snapshot(), 0, LagRule::kVersions);
  Perturb(p);
  sync.Advance(p, true);
  EXPECT_EQ(sync.behaviour_version(), 1);
  EXPECT_EQ(RatioDeviation(p, sync, t), 0.0);
}

// An unannounced jump of the lag: the sampler falls behind (its policy stays
// as it was until the learner is that far ahead), then keeps that lag; a
// smaller lag is taken at the next step.
TEST(PolicyLag, ALargerLagIsReachedAsASamplerFallsBehind) {
  const TaskOptions task{10, 1};
  at::manual_seed(13);
  Policy p = Policy::Init({Arch::kMlp, 8, 1, 1}, task);
  PolicyLag lag(p.Snapshot(), 2, LagRule::kSteps);
  for (int i = 0; i < 4; ++i) {
    Perturb(p);
    lag.Advance(p, true);
  }
  ASSERT_EQ(lag.steps() - lag.behaviour_step(), 2);
  const std::int64_t frozen = lag.behaviour_step();
  lag.SetStaleness(6);
  for (int k = 1; k <= 4; ++k) {
    Perturb(p);
    lag.Advance(p, true);
    EXPECT_EQ(lag.behaviour_step(), frozen) << k;  // the sampler's policy stays where it was
    EXPECT_EQ(lag.steps() - lag.behaviour_step(), 2 + k);
  }
  for (int k = 0; k < 3; ++k) {
    Perturb(p);
    lag.Advance(p, true);
    EXPECT_EQ(lag.steps() - lag.behaviour_step(), 6);
  }
  lag.SetStaleness(1);
  Perturb(p);
  lag.Advance(p, true);
  EXPECT_EQ(lag.steps() - lag.behaviour_step(), 1);
}

TEST(PolicyLag, NamesParse) {
  LagRule r = LagRule::kVersions;
  EXPECT_TRUE(ParseLagRule("steps", &r));
  EXPECT_EQ(r, LagRule::kSteps);
  EXPECT_TRUE(ParseLagRule(LagRuleName(LagRule::kVersions), &r));
  EXPECT_EQ(r, LagRule::kVersions);
  EXPECT_FALSE(ParseLagRule("updates", &r));
}

// OLMo-core's rule, by hand: window 8 (warm-up 4 values), 2 sigma. A
// constant loss (sd 0) never skips; the norm 10 after {1, 1.1, 0.9, 1}
// (mean 1, sd 0.0816) does; the next 10 is judged against a history that
// holds the skipped one (mean 2.8, sd 4.02: 7.2 <= 8.05) and is not.
TEST(OlmoSkipRule, SkippedStepsStayInItsHistory) {
  gac::grpo::OlmoSkipRule rule(2.0, 8);
  const double norms[] = {1.0, 1.1, 0.9, 1.0, 10.0, 10.0};
  const bool skip[] = {false, false, false, false, true, false};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(rule.Skip(0.5, norms[i]), skip[i]) << "step " << i + 1;
  // The loss alone: 5 after a history of 0.5 and one 0.6.
  gac::grpo::OlmoSkipRule by_loss(2.0, 8);
  for (double l : {0.5, 0.6, 0.5, 0.5}) EXPECT_FALSE(by_loss.Skip(l, 1.0));
  EXPECT_TRUE(by_loss.Skip(5.0, 1.0));
}


// --- policy-health signals ----------------------------------------------------

// A tensor's values as doubles (read only: the reference below works on
// these with plain loops).
std::vector<double> Values(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// Numpy's linear quantile of sorted values.
double LinearQuantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

// Kish's (sum w)^2 / (n sum w^2) of w = exp(log_w), shifted by the largest.
double KishEss(const std::vector<double>& log_w) {
  const double top = *std::max_element(log_w.begin(), log_w.end());
  double s1 = 0, s2 = 0;
  for (double x : log_w) {
    s1 += std::exp(x - top);
    s2 += std::exp(2 * (x - top));
  }
  return s1 * s1 / (static_cast<double>(log_w.size()) * s2);
}

// The counted tokens of a batch, in row-major order, as plain vectors.
struct CountedTokens {
  std::vector<double> lr, adv, entropy;  // per counted token (adv, entropy: when given)
  std::vector<std::vector<double>> per_sequence;  // each sequence's log-ratios
  bool finite = true;                             // every counted input finite
};

CountedTokens GatherTokens(const SignalInputs& in) {
  const std::int64_t rows = in.logprobs.size(0), cols = in.logprobs.size(1);
  const std::vector<double> lp = Values(in.logprobs), old = Values(in.old_logprobs);
  const std::vector<double> mask = in.mask.defined() ? Values(in.mask) : std::vector<double>(lp.size(), 1.0);
  const std::vector<double> adv = in.advantages.defined() ? Values(in.advantages) : std::vector<double>();
  const std::vector<double> ent = in.entropies.defined() ? Values(in.entropies) : std::vector<double>();
  const bool adv_per_sequence = !adv.empty() && static_cast<std::int64_t>(adv.size()) == rows;
  CountedTokens t;
  t.per_sequence.resize(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::size_t k = static_cast<std::size_t>(i * cols + j);
      if (mask[k] == 0) continue;
      t.lr.push_back(lp[k] - old[k]);
      t.per_sequence[static_cast<std::size_t>(i)].push_back(t.lr.back());
      if (!adv.empty()) t.adv.push_back(adv[adv_per_sequence ? static_cast<std::size_t>(i) : k]);
      if (!ent.empty()) t.entropy.push_back(ent[k]);
    }
  }
  for (const std::vector<double>* v : {&t.lr, &t.adv, &t.entropy}) {
    for (double x : *v) t.finite = t.finite && std::isfinite(x);
  }
  return t;
}

// The sequences' summed log-ratios and staleness, of those with a counted token.
void ReferenceSequences(const SignalInputs& in, const CountedTokens& t, controller::PolicyHealth* out) {
  std::vector<double> seq_lw, stale;
  for (std::size_t i = 0; i < t.per_sequence.size(); ++i) {
    if (t.per_sequence[i].empty()) continue;
    double sum = 0;
    for (double x : t.per_sequence[i]) sum += x;
    seq_lw.push_back(sum);
    if (in.versions.defined()) {
      stale.push_back(static_cast<double>(in.current_version -
                                          in.versions[static_cast<std::int64_t>(i)].item<std::int64_t>()));
    }
  }
  out->ess_sequence = KishEss(seq_lw);
  if (stale.empty()) return;
  out->staleness_min = *std::min_element(stale.begin(), stale.end());
  out->staleness_max = *std::max_element(stale.begin(), stale.end());
  double sum = 0;
  for (double x : stale) sum += x;
  out->staleness_mean = sum / static_cast<double>(stale.size());
}

// The signals of gac.rl's docstring, written out per token in double.
controller::PolicyHealth ReferenceSignals(const SignalInputs& in) {
  const CountedTokens t = GatherTokens(in);
  controller::PolicyHealth out;
  out.tokens = static_cast<std::int64_t>(t.lr.size());
  if (t.lr.empty() || !t.finite) {
    out.invalid = true;
    return out;
  }
  const double n = static_cast<double>(t.lr.size());
  out.ess_token = KishEss(t.lr);
  ReferenceSequences(in, t, &out);
  double low = 0, high = 0, trunc = 0, kl = 0, abs_sum = 0, ent_sum = 0;
  for (std::size_t k = 0; k < t.lr.size(); ++k) {
    const double r = std::exp(t.lr[k]);
    if (in.clip_low && r < 1.0 - *in.clip_low && (t.adv.empty() || t.adv[k] < 0)) ++low;
    if (in.clip_high && r > 1.0 + *in.clip_high && (t.adv.empty() || t.adv[k] > 0)) ++high;
    if (in.truncation && r > *in.truncation) ++trunc;
    kl += std::expm1(t.lr[k]) - t.lr[k];
    abs_sum += std::fabs(t.lr[k]);
    if (!t.entropy.empty()) ent_sum += t.entropy[k];
  }
  if (in.clip_low) out.clip_fraction_low = low / n;
  if (in.clip_high) out.clip_fraction_high = high / n;
  if (in.truncation) out.truncation_fraction = trunc / n;
  std::vector<double> sorted = t.lr;
  std::sort(sorted.begin(), sorted.end());
  out.log_ratio_max = sorted.back();
  out.log_ratio_p99 = LinearQuantile(sorted, 0.99);
  out.log_ratio_p1 = LinearQuantile(sorted, 0.01);
  out.kl_k3 = kl / n;
  out.log_ratio_abs_mean = abs_sum / n;
  if (!t.entropy.empty()) out.entropy_mean = ent_sum / n;
  return out;
}

// Every value absent or present alike and within `rel` of each other.
void ExpectSameHealth(const controller::PolicyHealth& got, const controller::PolicyHealth& want, double rel,
                      const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.invalid, want.invalid) << what;
  using M = std::optional<double> controller::PolicyHealth::*;
  const std::pair<const char*, M> fields[] = {
      {"ess_token", &controller::PolicyHealth::ess_token},
      {"ess_sequence", &controller::PolicyHealth::ess_sequence},
      {"clip_fraction_low", &controller::PolicyHealth::clip_fraction_low},
      {"clip_fraction_high", &controller::PolicyHealth::clip_fraction_high},
      {"truncation_fraction", &controller::PolicyHealth::truncation_fraction},
      {"log_ratio_max", &controller::PolicyHealth::log_ratio_max},
      {"log_ratio_p99", &controller::PolicyHealth::log_ratio_p99},
      {"log_ratio_p1", &controller::PolicyHealth::log_ratio_p1},
      {"kl_k3", &controller::PolicyHealth::kl_k3},
      {"log_ratio_abs_mean", &controller::PolicyHealth::log_ratio_abs_mean},
      {"entropy_mean", &controller::PolicyHealth::entropy_mean},
      {"staleness_min", &controller::PolicyHealth::staleness_min},
      {"staleness_mean", &controller::PolicyHealth::staleness_mean},
      {"staleness_max", &controller::PolicyHealth::staleness_max}};
  for (const auto& [name, member] : fields) {
    const std::optional<double>& g = got.*member;
    const std::optional<double>& w = want.*member;
    ASSERT_EQ(g.has_value(), w.has_value()) << what << ": " << name;
    if (!g) continue;
    EXPECT_TRUE(std::isfinite(*g)) << what << ": " << name;
    EXPECT_LE(std::fabs(*g - *w), rel * std::max(std::fabs(*g), std::fabs(*w))) << what << ": " << name << " " << *g
                                                                                  << " vs " << *w;
  }
}

// A random (B, T) batch: log-probabilities in [-8, 0), log-ratios mostly
// small with some at +-30; a random mask with one sequence all padding and
// the padding holding NaN in every input; advantages per token of both signs
// (some 0); entropies; versions 0..3 behind version 10.
SignalInputs RandomBatch(std::uint64_t seed, std::int64_t rows, std::int64_t cols) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 0.3);
  const std::size_t count = static_cast<std::size_t>(rows * cols);
  std::vector<double> lp(count), old(count), mask(count), adv(count), ent(count);
  const double kNaN = std::nan("");
  for (std::size_t k = 0; k < count; ++k) {
    // Sequence 1 is all padding; token 0 is always counted.
    const bool padded = k / static_cast<std::size_t>(cols) == 1 || (k > 0 && unit(rng) < 0.25);
    mask[k] = padded ? 0.0 : 1.0;
    lp[k] = -8.0 * unit(rng);
    const double u = unit(rng);
    const double log_ratio = u < 0.03 ? 30.0 : (u < 0.06 ? -30.0 : normal(rng));
    old[k] = lp[k] - log_ratio;
    adv[k] = unit(rng) < 0.1 ? 0.0 : normal(rng) * 3;
    ent[k] = 2.0 * unit(rng);
    if (padded) lp[k] = old[k] = adv[k] = ent[k] = kNaN;
  }
  std::vector<std::int64_t> versions(static_cast<std::size_t>(rows));
  for (auto& v : versions) v = 10 - static_cast<std::int64_t>(rng() % 4);
  SignalInputs in;
  in.logprobs = at::tensor(lp, at::kDouble).view({rows, cols});
  in.old_logprobs = at::tensor(old, at::kDouble).view({rows, cols});
  in.mask = at::tensor(mask, at::kDouble).view({rows, cols});
  in.advantages = at::tensor(adv, at::kDouble).view({rows, cols});
  in.entropies = at::tensor(ent, at::kDouble).view({rows, cols});
  in.versions = at::tensor(versions, at::kLong);
  in.current_version = 10;
  in.clip_low = 0.2;
  in.clip_high = 0.28;
  in.truncation = 2.0;
  return in;
}

TEST(PolicySignals, MatchALoopReferenceOnRandomMaskedBatches) {
  int checked = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    // Small batches, and one of 1,600 tokens whose tails come from deeper in the order statistics.
    for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{5, 7}, {3, 1}, {40, 40}}) {
      const SignalInputs in = RandomBatch(seed, rows, cols);
      const std::string what = "seed " + std::to_string(seed) + " " + std::to_string(rows) + "x" + std::to_string(cols);
      const controller::PolicyHealth want = ReferenceSignals(in);
      ASSERT_FALSE(want.invalid) << what;
      ExpectSameHealth(ComputePolicySignals(in), want, 1e-9, what);
      checked += *want.log_ratio_max > 29.9;
    }
  }
  EXPECT_GT(checked, 3);  // the +-30 log-ratios were in play
}

TEST(PolicySignals, MaskTypesAdvantagesPerSequenceAndOmittedInputs) {
  const SignalInputs base = RandomBatch(21, 12, 10);
  const controller::PolicyHealth want = ReferenceSignals(base);
  for (at::ScalarType type : {at::kBool, at::kLong, at::kFloat}) {
    SignalInputs in = base;
    in.mask = base.mask.to(type);
    ExpectSameHealth(ComputePolicySignals(in), want, 1e-9, std::string("mask ") + at::toString(type));
  }
  // Advantages per sequence, (B,) and (B, 1): a sequence's sign rules all its tokens.
  SignalInputs per_seq = base;
  per_seq.advantages = at::linspace(-1.0, 1.0, 12, at::kDouble);
  ExpectSameHealth(ComputePolicySignals(per_seq), ReferenceSignals(per_seq), 1e-9, "advantages (B,)");
  per_seq.advantages = per_seq.advantages.view({12, 1});
  ExpectSameHealth(ComputePolicySignals(per_seq), ReferenceSignals(per_seq), 1e-9, "advantages (B, 1)");
  // Without advantages the sides count every token outside; without a bound, no side.
  SignalInputs bare = base;
  bare.advantages = at::Tensor();
  bare.entropies = at::Tensor();
  bare.versions = at::Tensor();
  bare.clip_low.reset();
  bare.truncation.reset();
  const controller::PolicyHealth got = ComputePolicySignals(bare);
  ExpectSameHealth(got, ReferenceSignals(bare), 1e-9, "bare");
  EXPECT_FALSE(got.clip_fraction_low || got.truncation_fraction || got.entropy_mean || got.staleness_mean);
  EXPECT_GT(*got.clip_fraction_high, *want.clip_fraction_high);  // the sign rule counted fewer
  // A low epsilon of 1 or more: no ratio is below 1 - eps <= 0.
  SignalInputs wide = base;
  wide.clip_low = 1.5;
  EXPECT_EQ(*ComputePolicySignals(wide).clip_fraction_low, 0.0);
}

// bf16 log-probabilities: the log-ratio is the fp64 difference of the bf16
// values (no bf16 subtraction), so the reference on the same values agrees.
TEST(PolicySignals, Bf16LogProbabilitiesAreSubtractedInFp64) {
  SignalInputs in = RandomBatch(31, 16, 12);
  in.logprobs = in.logprobs.to(at::kBFloat16);
  in.old_logprobs = in.old_logprobs.to(at::kBFloat16);
  in.entropies = in.entropies.to(at::kBFloat16);
  const controller::PolicyHealth want = ReferenceSignals(in);
  ExpectSameHealth(ComputePolicySignals(in), want, 1e-9, "bf16");
  // The bf16 difference would differ: its log-ratios are rounded again.
  const at::Tensor m = in.mask != 0;
  const at::Tensor bf16_lr = at::where(m, (in.logprobs - in.old_logprobs).to(at::kDouble), 0.0);
  const double bf16_diff = bf16_lr.abs().sum().item<double>();
  EXPECT_NE(bf16_diff / static_cast<double>(want.tokens), *want.log_ratio_abs_mean);
}

TEST(PolicySignals, ALogRatioBeyondFp64sExpIsHandledInLogSpace) {
  // One token at log r = 800 (exp overflows), the rest 0: the ESS is 1/n
  // (one weight dominates), k3 overflows and is reported as the largest double.
  std::vector<double> lp(8, -1.0);
  lp[3] = 799.0;
  SignalInputs in;
  in.logprobs = at::tensor(lp, at::kDouble).view({2, 4});
  in.old_logprobs = at::full({2, 4}, -1.0, at::kDouble);
  const controller::PolicyHealth h = ComputePolicySignals(in);
  ASSERT_FALSE(h.invalid);
  EXPECT_NEAR(*h.ess_token, 1.0 / 8.0, 1e-15);
  EXPECT_NEAR(*h.ess_sequence, 1.0 / 2.0, 1e-15);
  EXPECT_EQ(*h.kl_k3, std::numeric_limits<double>::max());
  EXPECT_EQ(*h.log_ratio_max, 800.0);
  EXPECT_NEAR(*h.log_ratio_abs_mean, 100.0, 1e-12);
}

TEST(PolicySignals, NonFiniteMaskedInputsAreInvalidNeverNaN) {
  const SignalInputs base = RandomBatch(41, 6, 5);
  const std::int64_t tokens = ReferenceSignals(base).tokens;
  // A counted token (sequence 0 has one: row 1 is the padded one).
  std::int64_t k = 0;
  while (base.mask.view({-1})[k].item<double>() == 0) ++k;
  const auto spoiled = [&](at::Tensor SignalInputs::*member, double value) {
    SignalInputs in = base;
    in.*member = (base.*member).clone();
    (in.*member).view({-1})[k] = value;
    return in;
  };
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::string, SignalInputs>> cases = {
      {"NaN learner log-prob", spoiled(&SignalInputs::logprobs, nan)},
      {"-inf behaviour log-prob", spoiled(&SignalInputs::old_logprobs, -inf)},
      {"+inf learner log-prob", spoiled(&SignalInputs::logprobs, inf)},
      {"NaN advantage", spoiled(&SignalInputs::advantages, nan)},
      {"inf entropy", spoiled(&SignalInputs::entropies, inf)},
  };
  for (const auto& [what, in] : cases) {
    const controller::PolicyHealth h = ComputePolicySignals(in);
    EXPECT_TRUE(h.invalid) << what;
    EXPECT_EQ(h.tokens, tokens) << what;
    ExpectSameHealth(h, ReferenceSignals(in), 0.0, what);  // every value absent
  }
  // Both log-probs -inf: the log-ratio is NaN.
  SignalInputs both = spoiled(&SignalInputs::logprobs, -inf);
  both.old_logprobs = both.old_logprobs.clone();
  both.old_logprobs.view({-1})[k] = -inf;
  EXPECT_TRUE(ComputePolicySignals(both).invalid);
}

TEST(PolicySignals, NoTokenIsInvalid) {
  SignalInputs in = RandomBatch(51, 4, 3);
  in.mask = at::zeros({4, 3}, at::kBool);
  controller::PolicyHealth h = ComputePolicySignals(in);
  EXPECT_TRUE(h.invalid);
  EXPECT_EQ(h.tokens, 0);
  ExpectSameHealth(h, ReferenceSignals(in), 0.0, "empty mask");
  SignalInputs empty;
  empty.logprobs = at::zeros({0, 5}, at::kDouble);
  empty.old_logprobs = at::zeros({0, 5}, at::kDouble);
  h = ComputePolicySignals(empty);
  EXPECT_TRUE(h.invalid);
  EXPECT_FALSE(h.ess_token.has_value());
}

TEST(PolicySignals, ProgrammingErrorsThrow) {
  const SignalInputs base = RandomBatch(61, 4, 3);
  SignalInputs in = base;
  in.old_logprobs = at::zeros({4, 2}, at::kDouble);
  EXPECT_THROW(ComputePolicySignals(in), c10::Error);
  in = base;
  in.clip_high = -0.1;
  EXPECT_THROW(ComputePolicySignals(in), c10::Error);
  in = base;
  in.truncation = 0.0;
  EXPECT_THROW(ComputePolicySignals(in), c10::Error);
  in = base;
  in.versions = at::zeros({4}, at::kDouble);
  EXPECT_THROW(ComputePolicySignals(in), c10::Error);
  in = base;
  in.current_version = 5;  // versions 7..10 are ahead of it
  EXPECT_THROW(ComputePolicySignals(in), c10::Error);
  in = base;
  in.logprobs = at::zeros({4, 3}, at::kLong);
  EXPECT_THROW(ComputePolicySignals(in), c10::Error);
}

// A trainer batch (2 prompts x 2 samples x 3 tokens) with these ratios and
// advantages per token row, and its signals under each loss.
class TrainerBatch {
 public:
  // Off BAPO's grid of bounds (0.6..0.9 and 1.2..3.0 in steps of 0.05), so
  // that fp32 log-probabilities do not decide a comparison.
  const std::vector<double> ratio = {0.52, 0.93, 1.0, 1.07, 1.53, 4.1, 0.72, 0.88, 1.0, 2.96, 1.27, 3.9};
  const std::vector<double> adv = {1, -1, 1, -1, 1, 1, -1, -1, 1, 1, 1, -2};

  TrainerBatch() : task_{10, 1}, tasks_(task_, 100) {
    at::manual_seed(8);
    policy_ = Policy::Init({Arch::kMlp, 8, 1, 1}, task_);
    batch_ = BatchWithRatios(policy_, tasks_, 2, 2, ratio, adv);
  }
  // The loss's result and the batch's signals, behaviour version 3, learner 7.
  std::pair<controller::PolicyHealth, LossResult> Signals(LossKind kind) const {
    LossOptions o;
    o.kind = kind;
    const LossResult loss = ComputeLoss(policy_, policy_, batch_, o);
    return {ComputePolicySignals(BatchSignalInputs(batch_, loss, o, 3, 7)), loss};
  }

 private:
  TaskOptions task_;
  DigitTasks tasks_;
  Policy policy_;
  Rollouts batch_;
};

// The trainer's batch: token row k * N + i is digit k of sequence i, one
// behaviour version for the batch.
TEST(PolicySignals, TheTrainersBatchHasItsLayout) {
  const TrainerBatch b;
  const auto [grpo, loss] = b.Signals(LossKind::kGrpo);
  ASSERT_FALSE(grpo.invalid);
  EXPECT_EQ(grpo.tokens, 12);
  // Sequence i holds tokens i, 4 + i, 8 + i: its weight is their ratios' product.
  std::vector<double> seq_log_w(4, 0.0), token_log_w;
  double kl = 0;
  for (std::size_t k = 0; k < b.ratio.size(); ++k) {
    seq_log_w[k % 4] += std::log(b.ratio[k]);
    token_log_w.push_back(std::log(b.ratio[k]));
    kl += b.ratio[k] - 1 - std::log(b.ratio[k]);
  }
  EXPECT_NEAR(*grpo.ess_sequence, KishEss(seq_log_w), 1e-5);
  EXPECT_NEAR(*grpo.ess_token, KishEss(token_log_w), 1e-5);
  EXPECT_NEAR(*grpo.kl_k3, kl / 12.0, 1e-5);
  EXPECT_NEAR(*grpo.log_ratio_max, std::log(4.1), 1e-5);
  EXPECT_NEAR(*grpo.entropy_mean, loss.entropy, 1e-5);
  EXPECT_EQ(*grpo.staleness_min, 4.0);
  EXPECT_EQ(*grpo.staleness_mean, 4.0);
  EXPECT_EQ(*grpo.staleness_max, 4.0);
}

// Each loss's effective bounds: GRPO's epsilon, BAPO's adapted bounds, no
// clip side without ratio clipping, TIS's truncation at its cap.
TEST(PolicySignals, TheTrainersLossesGiveTheirBounds) {
  const TrainerBatch b;
  const controller::PolicyHealth grpo = b.Signals(LossKind::kGrpo).first;
  // eps 0.2: r < 0.8 with A < 0: 0.72 (token 6); r > 1.2 with A > 0: 1.53, 4.1, 2.96, 1.27.
  EXPECT_DOUBLE_EQ(*grpo.clip_fraction_low, 1.0 / 12.0);
  EXPECT_DOUBLE_EQ(*grpo.clip_fraction_high, 4.0 / 12.0);
  EXPECT_FALSE(grpo.truncation_fraction.has_value());
  const auto [bapo, bapo_loss] = b.Signals(LossKind::kBapo);
  double low = 0, high = 0;
  for (std::size_t k = 0; k < b.ratio.size(); ++k) {
    low += b.ratio[k] < bapo_loss.bapo_lo && b.adv[k] < 0;
    high += b.ratio[k] > bapo_loss.bapo_hi && b.adv[k] > 0;
  }
  EXPECT_DOUBLE_EQ(*bapo.clip_fraction_low, low / 12.0);
  EXPECT_DOUBLE_EQ(*bapo.clip_fraction_high, high / 12.0);
  for (LossKind kind : {LossKind::kM2po, LossKind::kIs, LossKind::kTis}) {
    const controller::PolicyHealth h = b.Signals(kind).first;
    EXPECT_FALSE(h.clip_fraction_low || h.clip_fraction_high) << LossName(kind);
    EXPECT_EQ(h.truncation_fraction.has_value(), kind == LossKind::kTis) << LossName(kind);
    EXPECT_NEAR(*h.ess_token, *grpo.ess_token, 1e-12) << LossName(kind);
  }
  // r > 2: 4.1, 2.96, 3.9.
  EXPECT_DOUBLE_EQ(*b.Signals(LossKind::kTis).first.truncation_fraction, 3.0 / 12.0);
}

}  // namespace
}  // namespace gac::grpo
