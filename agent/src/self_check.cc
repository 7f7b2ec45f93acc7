#include "agent/src/self_check.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

namespace gac::agent {

namespace {

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::map<int, bool>& Registry() {
  static std::map<int, bool> verdicts;  // device -> passed
  return verdicts;
}

}  // namespace

SelfCheckState SelfCheckStateOf(int device) {
  const std::lock_guard<std::mutex> lock(RegistryMutex());
  const auto it = Registry().find(device);
  if (it == Registry().end()) return SelfCheckState::kUnchecked;
  return it->second ? SelfCheckState::kPassed : SelfCheckState::kFailed;
}

void RecordSelfCheck(int device, bool passed) {
  const std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().emplace(device, passed);  // the first verdict stands
}

SelfCheckResult CompareSums(const double* kernels, const double* reference, std::size_t num_groups, bool with_p) {
  SelfCheckResult r;
  r.conclusive = with_p;
  for (std::size_t set = 0; set <= num_groups; ++set) {
    const double* k = kernels + 3 * set;
    const double* f = reference + 3 * set;
    const std::string where = set == 0 ? "" : " of layer " + std::to_string(set - 1);
    for (double v : {k[0], k[1], k[2], f[0], f[1], f[2]}) {
      if (!std::isfinite(v)) {
        r.conclusive = false;  // invalid gradients: no verdict on this step
        return r;
      }
    }
    const auto note = [&](double difference, const char* what) {
      if (r.worst.empty() || difference > r.max_difference) {
        r.max_difference = difference;
        r.worst = what + where;
      }
    };
    const auto relative = [](double a, double b) { return b == 0.0 ? std::fabs(a) : std::fabs(a - b) / std::fabs(b); };
    note(relative(k[1], f[1]), "|g|^2");
    if (with_p) {
      note(relative(k[2], f[2]), "|p|^2");
      const double scale = std::sqrt(f[1] * f[2]);
      note(scale == 0.0 ? std::fabs(k[0]) : std::fabs(k[0] - f[0]) / scale, "<g,p>");
    }
  }
  return r;
}

}  // namespace gac::agent
