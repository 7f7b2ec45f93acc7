// What the benchmark programs share: timing, medians, the machine's CPU name
// and "--flag V" / "--flag=V" command-line values. Header-only, std-only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <string>
#include <vector>

namespace gac::bench {

inline double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median of v (NaN for none).
inline double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 != 0 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The "model name" of /proc/cpuinfo, or "unknown".
inline std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

// Whether argv[*i] is `flag`, given as "--flag V" or "--flag=V". If so,
// *value is V (null when "--flag" is the last argument) and *i has moved past
// a separate V.
inline bool FlagValue(int argc, char** argv, int* i, const char* flag, const char** value) {
  const std::string a = argv[*i];
  const std::string prefix = std::string(flag) + "=";
  if (a.rfind(prefix, 0) == 0) {
    *value = argv[*i] + prefix.size();
    return true;
  }
  if (a != flag) return false;
  *value = *i + 1 < argc ? argv[*i + 1] : nullptr;
  ++*i;
  return true;
}

}  // namespace gac::bench
