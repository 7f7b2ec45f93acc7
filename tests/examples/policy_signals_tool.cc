// gac_grpo_signals: the example trainer's policy-health signals
// (examples/grpo/policy_signals.h) of a batch read from stdin, for
// test_policy_signals.py to compare with python/gac/rl.py's on the same
// tensors. Not a user tool.
//
// Input, whitespace-separated: "shape B T", then any of
//   logprobs DTYPE v...  old_logprobs DTYPE v...   (B*T values; DTYPE float64, float32 or bfloat16)
//   mask v...  entropies v...                      (B*T values)
//   advantages N v...                              (N = B*T or B)
//   versions v...  current_version C              (B integers)
//   clip_low X  clip_high X  truncation X
// and "end". Values as strtod reads them (nan, inf, -inf included).
// Output: one "name value" line per signal (%.17g, or "none"), then tokens
// and invalid (0/1). Exit 2 on bad input.
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "examples/grpo/policy_signals.h"

namespace {

[[noreturn]] void Fail(const std::string& msg) {
  std::fprintf(stderr, "gac_grpo_signals: %s\n", msg.c_str());
  std::exit(2);
}

double ReadNumber() {
  std::string word;
  if (!(std::cin >> word)) Fail("unexpected end of input");
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  if (end == word.c_str() || *end != '\0') Fail("not a number: " + word);
  return v;
}

at::Tensor ReadTensor(std::int64_t count, at::ScalarType type) {
  std::vector<double> values(static_cast<std::size_t>(count));
  for (double& v : values) v = ReadNumber();
  return at::tensor(values, at::kDouble).to(type);
}

at::ScalarType ReadDtype() {
  std::string name;
  std::cin >> name;
  if (name == "float64") return at::kDouble;
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  Fail("unknown dtype " + name);
}

gac::grpo::SignalInputs ReadInputs() {
  std::string key;
  std::int64_t rows = 0, cols = 0;
  if (!(std::cin >> key >> rows >> cols) || key != "shape" || rows < 0 || cols < 0) Fail("expected: shape B T");
  gac::grpo::SignalInputs in;
  while (std::cin >> key && key != "end") {
    if (key == "logprobs") {
      const at::ScalarType type = ReadDtype();
      in.logprobs = ReadTensor(rows * cols, type).view({rows, cols});
    } else if (key == "old_logprobs") {
      const at::ScalarType type = ReadDtype();
      in.old_logprobs = ReadTensor(rows * cols, type).view({rows, cols});
    } else if (key == "mask") {
      in.mask = ReadTensor(rows * cols, at::kDouble).view({rows, cols});
    } else if (key == "entropies") {
      in.entropies = ReadTensor(rows * cols, at::kDouble).view({rows, cols});
    } else if (key == "advantages") {
      const auto count = static_cast<std::int64_t>(ReadNumber());
      in.advantages = ReadTensor(count, at::kDouble);
      if (count == rows * cols) in.advantages = in.advantages.view({rows, cols});
    } else if (key == "versions") {
      in.versions = ReadTensor(rows, at::kLong);
    } else if (key == "current_version") {
      in.current_version = static_cast<std::int64_t>(ReadNumber());
    } else if (key == "clip_low") {
      in.clip_low = ReadNumber();
    } else if (key == "clip_high") {
      in.clip_high = ReadNumber();
    } else if (key == "truncation") {
      in.truncation = ReadNumber();
    } else {
      Fail("unknown key " + key);
    }
  }
  if (key != "end") Fail("no \"end\"");
  return in;
}

}  // namespace

int main() {
  const gac::controller::PolicyHealth h = gac::grpo::ComputePolicySignals(ReadInputs());
  const std::pair<const char*, std::optional<double>> values[] = {
      {"ess_token", h.ess_token},
      {"ess_sequence", h.ess_sequence},
      {"clip_fraction_low", h.clip_fraction_low},
      {"clip_fraction_high", h.clip_fraction_high},
      {"truncation_fraction", h.truncation_fraction},
      {"log_ratio_max", h.log_ratio_max},
      {"log_ratio_p99", h.log_ratio_p99},
      {"log_ratio_p1", h.log_ratio_p1},
      {"kl_k3", h.kl_k3},
      {"log_ratio_abs_mean", h.log_ratio_abs_mean},
      {"entropy_mean", h.entropy_mean},
      {"staleness_min", h.staleness_min},
      {"staleness_mean", h.staleness_mean},
      {"staleness_max", h.staleness_max},
  };
  for (const auto& [name, v] : values) {
    if (v) {
      std::printf("%s %.17g\n", name, *v);
    } else {
      std::printf("%s none\n", name);
    }
  }
  std::printf("tokens %lld\ninvalid %d\n", static_cast<long long>(h.tokens), h.invalid ? 1 : 0);
  return 0;
}
