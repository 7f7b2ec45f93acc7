#include "gac/base/duration.h"

#include <cstdint>
#include <limits>

namespace gac::base {
namespace {

__extension__ typedef unsigned __int128 U128;  // GCC and clang

// Nanoseconds per unit; 0 for an unknown unit.
std::int64_t UnitNs(const std::string& unit) {
  if (unit == "ms") return 1000000;
  if (unit == "s" || unit.empty()) return 1000000000;
  if (unit == "m") return std::int64_t{60} * 1000000000;
  if (unit == "h") return std::int64_t{3600} * 1000000000;
  if (unit == "d") return std::int64_t{86400} * 1000000000;
  return 0;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

StatusOr<std::chrono::nanoseconds> ParseDuration(const std::string& text) {
  const auto bad = [&] {
    return Status::InvalidArgument("bad duration '" + text + "' (a number and ms, s, m, h or d: 500ms, 10s, 15m, 30d)");
  };
  std::size_t i = 0;
  // The digits, exactly: the integer part and up to 18 digits of fraction
  // (finer than a nanosecond of a day), in 128-bit arithmetic.
  U128 whole = 0, fraction = 0, fraction_scale = 1;
  bool any_digit = false;
  constexpr U128 kCap = static_cast<U128>(std::numeric_limits<std::int64_t>::max());
  for (; i < text.size() && IsDigit(text[i]); ++i) {
    whole = whole * 10 + static_cast<unsigned>(text[i] - '0');
    if (whole > kCap) return Status::InvalidArgument("duration '" + text + "' is too long");
    any_digit = true;
  }
  if (i < text.size() && text[i] == '.') {
    ++i;
    for (int kept = 0; i < text.size() && IsDigit(text[i]); ++i) {
      if (kept < 18) {
        fraction = fraction * 10 + static_cast<unsigned>(text[i] - '0');
        fraction_scale *= 10;
        ++kept;
      }
      any_digit = true;
    }
  }
  if (!any_digit) return bad();
  const std::int64_t unit_ns = UnitNs(text.substr(i));
  if (unit_ns == 0) return bad();
  const U128 ns = whole * static_cast<U128>(unit_ns) + fraction * static_cast<U128>(unit_ns) / fraction_scale;
  if (ns > kCap) return Status::InvalidArgument("duration '" + text + "' is too long (at most about 292 years)");
  return std::chrono::nanoseconds(static_cast<std::int64_t>(ns));
}

}  // namespace gac::base
