#include "examples/grpo/policy_signals.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace gac::grpo {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kDoubleMax = std::numeric_limits<double>::max();
// The tails: numpy-linear quantiles of the masked log-ratios.
constexpr double kQHigh = 0.99;
constexpr double kQLow = 0.01;

// The values read back in the one transfer, in this order.
enum Slot : std::size_t {
  kTokens,
  kSequences,
  kBadLogprobs,
  kBadAdvantages,
  kBadEntropies,
  kEssToken,
  kEssSequence,
  kClipLow,
  kClipHigh,
  kTruncation,
  kLogRatioMax,
  kLogRatioP99,
  kLogRatioP1,
  kKlK3,
  kLogRatioAbsMean,
  kEntropyMean,
  kStalenessMin,
  kStalenessMean,
  kStalenessMax,
  kSlots
};

// The 0-dim fp64 tensors to read back, by slot (device-side until Read).
class Readback {
 public:
  void Put(Slot slot, const at::Tensor& value) { put_.emplace_back(slot, value.to(at::kDouble)); }
  // The one device-to-host transfer.
  std::array<std::optional<double>, kSlots> Read() const {
    std::vector<at::Tensor> values;
    for (const auto& [slot, value] : put_) values.push_back(value.reshape({}));
    const at::Tensor host = at::stack(values).to(at::kCPU).contiguous();
    const double* v = host.data_ptr<double>();
    std::array<std::optional<double>, kSlots> out{};
    for (std::size_t i = 0; i < put_.size(); ++i) out[put_[i].first] = v[i];
    return out;
  }

 private:
  std::vector<std::pair<Slot, at::Tensor>> put_;
};

bool SameShape(const at::Tensor& t, at::IntArrayRef shape) { return t.sizes() == shape; }

void CheckTensors(const SignalInputs& in) {
  const at::Tensor& lp = in.logprobs;
  TORCH_CHECK(lp.defined() && in.old_logprobs.defined(), "policy signals: logprobs and old_logprobs are required");
  TORCH_CHECK(lp.dim() == 2, "policy signals: logprobs must be (B, T), got ", lp.sizes());
  const at::IntArrayRef shape = lp.sizes();
  const auto floating_on_device = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_floating_point(), "policy signals: ", name, " must be floating point, got ", t.scalar_type());
    TORCH_CHECK(t.device() == lp.device(), "policy signals: ", name, " is on ", t.device(), ", logprobs on ",
                lp.device());
  };
  floating_on_device(lp, "logprobs");
  floating_on_device(in.old_logprobs, "old_logprobs");
  TORCH_CHECK(SameShape(in.old_logprobs, shape), "policy signals: old_logprobs has shape ", in.old_logprobs.sizes(),
              ", logprobs ", shape);
  if (in.mask.defined()) {
    TORCH_CHECK(!in.mask.is_complex() && SameShape(in.mask, shape) && in.mask.device() == lp.device(),
                "policy signals: mask must be a real (B, T) tensor on the log-probabilities' device");
  }
  if (in.advantages.defined()) {
    floating_on_device(in.advantages, "advantages");
    const bool ok = SameShape(in.advantages, shape) || SameShape(in.advantages, {shape[0]}) ||
                    SameShape(in.advantages, {shape[0], 1});
    TORCH_CHECK(ok, "policy signals: advantages must be (B, T) or (B,), got ", in.advantages.sizes());
  }
  if (in.entropies.defined()) {
    floating_on_device(in.entropies, "entropies");
    TORCH_CHECK(SameShape(in.entropies, shape), "policy signals: entropies has shape ", in.entropies.sizes());
  }
  if (in.versions.defined()) {
    const at::Tensor& v = in.versions;
    TORCH_CHECK(!v.is_floating_point() && !v.is_complex() && v.scalar_type() != at::kBool,
                "policy signals: versions must be integers, got ", v.scalar_type());
    TORCH_CHECK(SameShape(v, {shape[0]}), "policy signals: versions must be (B,), got ", v.sizes());
    TORCH_CHECK(v.device() == lp.device() || v.device().is_cpu(),
                "policy signals: versions must be on the log-probabilities' device or the CPU");
  }
}

void CheckBounds(const SignalInputs& in) {
  for (const auto& [bound, name] : {std::pair{in.clip_low, "clip_low"}, {in.clip_high, "clip_high"}}) {
    TORCH_CHECK(!bound || *bound >= 0.0, "policy signals: ", name, " must be >= 0, got ", *bound);
  }
  TORCH_CHECK(!in.truncation || *in.truncation > 0.0, "policy signals: truncation must be > 0, got ",
              *in.truncation);
}

// The batch's masked log-ratios and counts, fp64 on the tensors' device.
struct Masked {
  std::int64_t count = 0;  // B * T
  at::Tensor m;            // (B, T) bool: the counted tokens
  at::Tensor raw;          // (B, T) log r as given, padding included
  at::Tensor lr;           // (B, T) log r, padding 0
  at::Tensor lw;           // (B, T) log r, padding -inf (log of a weight 0)
  at::Tensor seq_lr;       // (B) sum of each sequence's log r
  at::Tensor per_seq;      // (B) int64 masked tokens per sequence
  at::Tensor has;          // (B) bool: the sequence has a masked token
  at::Tensor n, n_seq;     // 0-dim fp64: tokens, sequences
};

Masked MaskBatch(const SignalInputs& in) {
  Masked b;
  const at::Tensor lp = in.logprobs.detach();
  b.count = lp.numel();
  if (!in.mask.defined()) {
    b.m = at::ones_like(lp, lp.options().dtype(at::kBool));
  } else {
    b.m = in.mask.scalar_type() == at::kBool ? in.mask : in.mask != 0;
  }
  // The fp64 difference: exact for bf16 and fp16 inputs.
  b.raw = lp.to(at::kDouble) - in.old_logprobs.detach().to(at::kDouble);
  b.lr = at::where(b.m, b.raw, 0.0);
  b.lw = at::where(b.m, b.raw, -kInf);
  b.seq_lr = b.lr.sum(1);
  b.per_seq = b.m.sum(1);
  b.has = b.per_seq > 0;
  b.n = b.per_seq.sum().to(at::kDouble);
  b.n_seq = at::count_nonzero(b.has).to(at::kDouble);
  return b;
}

// Non-finite values at masked tokens (padding holds 0).
at::Tensor CountNonFinite(const at::Tensor& masked) {
  return at::count_nonzero(at::logical_not(masked.abs() <= kDoubleMax));
}

// The numpy-linear quantile q of the n masked log-ratios from `ordered`, the
// k of them nearest one end (descending from the top, or ascending from the
// bottom): order statistics by index, no host value needed.
at::Tensor Quantile(const Masked& b, double q, const at::Tensor& ordered, bool descending) {
  const std::int64_t k = ordered.size(0);
  const at::Tensor last = (b.n - 1.0).clamp_min(0.0);
  const at::Tensor last_i = last.to(at::kLong);
  const at::Tensor pos = last * q;
  const at::Tensor lo = at::floor(pos);
  const at::Tensor frac = pos - lo;
  at::Tensor i_lo = lo.to(at::kLong);
  at::Tensor i_hi = at::minimum(i_lo + 1, last_i);
  if (descending) {  // ascending index i is descending index n - 1 - i
    i_lo = last_i - i_lo;
    i_hi = last_i - i_hi;
  }
  const at::Tensor a = ordered.index_select(0, i_lo.clamp(0, k - 1).reshape({1})).reshape({});
  const at::Tensor c = ordered.index_select(0, i_hi.clamp(0, k - 1).reshape({1})).reshape({});
  return a + frac * (c - a);
}

// Kish's ESS (sum w)^2 / (count sum w^2) of the weights exp(log_w), shifted
// by the largest log-weight: every term in [0, 1].
at::Tensor Ess(const at::Tensor& log_w, const at::Tensor& largest, const at::Tensor& count) {
  const at::Tensor shifted = at::exp(log_w - largest);
  return shifted.sum().square() / (count * at::dot(shifted, shifted));
}

// The tails (from the top and bottom k order statistics, k covering the 1%
// nearest each end) and both ESS.
void PutRatioShape(const Masked& b, Readback* out) {
  const at::Tensor lw = b.lw.reshape({-1});
  const std::int64_t k = std::min(b.count, (b.count - 1) / 100 + 2);
  const at::Tensor top = std::get<0>(lw.topk(k, 0, /*largest=*/true, /*sorted=*/true));
  const at::Tensor bottom =
      std::get<0>(at::where(b.m, b.raw, kInf).reshape({-1}).topk(k, 0, /*largest=*/false, /*sorted=*/true));
  const at::Tensor top_max = top.select(0, 0);
  out->Put(kEssToken, Ess(lw, top_max, b.n));
  const at::Tensor seq_lw = at::where(b.has, b.seq_lr, -kInf);
  out->Put(kEssSequence, Ess(seq_lw, seq_lw.max(), b.n_seq));
  out->Put(kLogRatioMax, top_max);
  out->Put(kLogRatioP99, Quantile(b, kQHigh, top, /*descending=*/true));
  out->Put(kLogRatioP1, Quantile(b, kQLow, bottom, /*descending=*/false));
}

// Masked tokens outside a bound and, with advantages, of the sign that clips.
at::Tensor TokensWhere(const at::Tensor& outside, const at::Tensor& adv, double sign) {
  if (!adv.defined()) return at::count_nonzero(outside);
  if (adv.size(1) == 1) return (outside.sum(1) * (adv.select(1, 0) * sign > 0)).sum();
  return at::count_nonzero(outside & (adv * sign > 0));
}

// The fractions clipped and truncated. The clip bounds hold 0 between them
// (log(1 - clip_low) <= 0 <= log(1 + clip_high)), so padding (lr 0) is never
// outside; truncation tests lw (padding -inf).
void PutFractions(const SignalInputs& in, const Masked& b, Readback* out) {
  at::Tensor adv;
  if (in.advantages.defined()) {
    adv = in.advantages.detach();
    if (adv.dim() == 1) adv = adv.unsqueeze(1);
    out->Put(kBadAdvantages, at::count_nonzero(b.m & at::logical_not(at::isfinite(adv))));
  }
  if (in.clip_low) {
    const double bound = 1.0 - *in.clip_low > 0.0 ? std::log(1.0 - *in.clip_low) : -kInf;
    out->Put(kClipLow, TokensWhere(b.lr < bound, adv, -1.0) / b.n);
  }
  if (in.clip_high) out->Put(kClipHigh, TokensWhere(b.lr > std::log1p(*in.clip_high), adv, 1.0) / b.n);
  if (in.truncation) out->Put(kTruncation, at::count_nonzero(b.lw > std::log(*in.truncation)) / b.n);
}

void PutMeans(const SignalInputs& in, const Masked& b, Readback* out) {
  // k3 = (r - 1) - log r, summed as sum expm1(lr) - sum lr (padding: 0 in both).
  out->Put(kKlK3, (at::expm1(b.lr).sum() - b.seq_lr.sum()) / b.n);
  out->Put(kLogRatioAbsMean, b.lr.abs().sum() / b.n);
  if (in.entropies.defined()) {
    const at::Tensor entropy = at::where(b.m, in.entropies.detach().to(at::kDouble), 0.0);
    out->Put(kBadEntropies, CountNonFinite(entropy));
    out->Put(kEntropyMean, entropy.sum() / b.n);
  }
  if (in.versions.defined()) {
    const at::Tensor version = in.versions.to(b.m.device(), at::kLong, /*non_blocking=*/true);
    const at::Tensor stale = at::rsub(version, in.current_version).to(at::kDouble);
    out->Put(kStalenessMin, at::where(b.has, stale, kInf).min());
    out->Put(kStalenessMean, at::where(b.has, stale, 0.0).sum() / b.n_seq);
    out->Put(kStalenessMax, at::where(b.has, stale, -kInf).max());
  }
}

// The health from the values read back: invalid for data that gives none,
// an fp64 overflow as the largest double, never a NaN.
controller::PolicyHealth Finish(const std::array<std::optional<double>, kSlots>& got, const SignalInputs& in) {
  controller::PolicyHealth h;
  h.tokens = static_cast<std::int64_t>(*got[kTokens]);
  TORCH_CHECK(!in.versions.defined() || h.tokens == 0 || *got[kStalenessMin] >= 0.0,
              "policy signals: a sequence's version is ahead of current_version ", in.current_version);
  bool invalid = h.tokens == 0;
  for (Slot s : {kBadLogprobs, kBadAdvantages, kBadEntropies}) invalid = invalid || got[s].value_or(0.0) > 0.0;
  for (std::size_t s = kEssToken; s < kSlots; ++s) invalid = invalid || (got[s] && std::isnan(*got[s]));
  if (invalid) {
    h.invalid = true;
    return h;
  }
  const auto value = [&](Slot s) -> std::optional<double> {
    if (!got[s] || std::isfinite(*got[s])) return got[s];
    return std::copysign(kDoubleMax, *got[s]);
  };
  h.ess_token = value(kEssToken);
  h.ess_sequence = value(kEssSequence);
  h.clip_fraction_low = value(kClipLow);
  h.clip_fraction_high = value(kClipHigh);
  h.truncation_fraction = value(kTruncation);
  h.log_ratio_max = value(kLogRatioMax);
  h.log_ratio_p99 = value(kLogRatioP99);
  h.log_ratio_p1 = value(kLogRatioP1);
  h.kl_k3 = value(kKlK3);
  h.log_ratio_abs_mean = value(kLogRatioAbsMean);
  h.entropy_mean = value(kEntropyMean);
  h.staleness_min = value(kStalenessMin);
  h.staleness_mean = value(kStalenessMean);
  h.staleness_max = value(kStalenessMax);
  return h;
}

}  // namespace

controller::PolicyHealth ComputePolicySignals(const SignalInputs& in) {
  CheckTensors(in);
  CheckBounds(in);
  if (in.logprobs.numel() == 0) {
    controller::PolicyHealth empty;
    empty.invalid = true;
    return empty;
  }
  at::NoGradGuard no_grad;
  const Masked b = MaskBatch(in);
  Readback out;
  out.Put(kTokens, b.n);
  out.Put(kSequences, b.n_seq);
  out.Put(kBadLogprobs, CountNonFinite(b.lr));
  PutRatioShape(b, &out);
  PutFractions(in, b, &out);
  PutMeans(in, b, &out);
  return Finish(out.Read(), in);
}

SignalInputs BatchSignalInputs(const Rollouts& batch, const LossResult& loss, const LossOptions& options,
                               std::int64_t behaviour_version, std::int64_t current_version) {
  const std::int64_t n = batch.sequences();
  // Token row k * n + i is answer digit k of sequence i: (kAnswerDigits, n), transposed.
  const auto per_sequence = [n](const at::Tensor& t) { return t.detach().view({kAnswerDigits, n}).t(); };
  SignalInputs in;
  in.logprobs = per_sequence(loss.logp);
  in.old_logprobs = per_sequence(batch.behaviour_logp);
  in.advantages = per_sequence(batch.advantages);
  in.entropies = per_sequence(loss.token_entropy);
  switch (options.kind) {
    case LossKind::kGrpo:
      in.clip_low = options.clip_eps;
      in.clip_high = options.clip_eps;
      break;
    case LossKind::kBapo:
      in.clip_low = 1.0 - loss.bapo_lo;
      in.clip_high = loss.bapo_hi - 1.0;
      break;
    case LossKind::kTis: in.truncation = options.tis_cap; break;
    case LossKind::kM2po:
    case LossKind::kIs: break;
  }
  in.versions = at::full({n}, behaviour_version, at::TensorOptions().dtype(at::kLong));
  in.current_version = current_version;
  return in;
}

}  // namespace gac::grpo
