// The one duration syntax of gac's command lines (gacd's flags and config
// file, gacctl's flags): a non-negative decimal number and a unit, `ms`,
// `s`, `m`, `h` or `d` ("500ms", "1.5s", "15m", "12h", "30d"); a bare number
// is seconds ("10", "0.25").
//
// Thread safety: a pure function.
#ifndef GAC_BASE_DURATION_H_
#define GAC_BASE_DURATION_H_

#include <chrono>
#include <string>

#include "gac/base/status.h"

namespace gac::base {

// `text` as a duration, truncated to whole nanoseconds. Zero is valid (the
// caller decides whether it means "off"). InvalidArgument for anything
// else: an empty text, a sign, an exponent, an unknown unit, or a duration
// beyond what std::chrono::nanoseconds holds (about 292 years).
StatusOr<std::chrono::nanoseconds> ParseDuration(const std::string& text);

}  // namespace gac::base

#endif  // GAC_BASE_DURATION_H_
