#include "cli/src/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "gac/base/duration.h"

namespace gac::cli {

const std::string* ParsedFlags::Get(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

base::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs) {
  ParsedFlags parsed;
  auto find_long = [&](const std::string& name) -> const FlagSpec* {
    for (const FlagSpec& s : specs) {
      if (s.name == name) return &s;
    }
    return nullptr;
  };
  auto find_short = [&](char c) -> const FlagSpec* {
    for (const FlagSpec& s : specs) {
      if (s.short_name != 0 && s.short_name == c) return &s;
    }
    return nullptr;
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      parsed.positional_.insert(parsed.positional_.end(), args.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      parsed.positional_.push_back(arg);
      continue;
    }
    const FlagSpec* spec = nullptr;
    std::optional<std::string> inline_value;
    std::string shown;  // the flag as written, for errors
    if (arg[1] == '-') {
      const auto eq = arg.find('=');
      const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) inline_value = arg.substr(eq + 1);
      spec = find_long(name);
      shown = "--" + name;
    } else if (arg.size() == 2) {
      spec = find_short(arg[1]);
      shown = arg;
    }
    if (spec == nullptr) return base::Status::InvalidArgument("unknown flag '" + (shown.empty() ? arg : shown) + "'");
    if (!spec->deprecated.empty()) {
      const std::string note = "--" + spec->name + " is deprecated: " + spec->deprecated;
      if (std::find(parsed.notes_.begin(), parsed.notes_.end(), note) == parsed.notes_.end()) {
        parsed.notes_.push_back(note);
      }
    }
    if (spec->value_name.empty()) {
      if (inline_value) return base::Status::InvalidArgument(shown + " takes no value");
      parsed.values_[spec->name] = "";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) return base::Status::InvalidArgument(shown + " needs a value (" + spec->value_name + ")");
      inline_value = args[++i];
    }
    parsed.values_[spec->name] = *inline_value;
  }
  return parsed;
}

base::StatusOr<std::int64_t> ParseIntFlag(const std::string& flag, const std::string& text, std::int64_t min,
                                    std::int64_t max) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == nullptr || *end != '\0' || errno == ERANGE) {
    return base::Status::InvalidArgument(flag + ": expected an integer, got '" + text + "'");
  }
  if (v < min || v > max) {
    return base::Status::InvalidArgument(flag + ": " + text + " is outside [" + std::to_string(min) + ", " +
                                   std::to_string(max) + "]");
  }
  return static_cast<std::int64_t>(v);
}

base::StatusOr<double> ParseRealFlag(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == nullptr || *end != '\0' || !std::isfinite(v)) {
    return base::Status::InvalidArgument(flag + ": expected a number, got '" + text + "'");
  }
  return v;
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const auto comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return parts;
}

base::StatusOr<std::vector<double>> ParseRealListFlag(const std::string& flag, const std::string& text) {
  std::vector<double> values;
  for (const std::string& part : SplitCommas(text)) {
    GAC_ASSIGN_OR_RETURN(double v, ParseRealFlag(flag, part));
    values.push_back(v);
  }
  return values;
}

base::StatusOr<std::chrono::milliseconds> ParseDurationFlag(const std::string& flag, const std::string& text) {
  base::StatusOr<std::chrono::nanoseconds> d = base::ParseDuration(text);
  // At most 10^12 ms (about 31 years): a deadline of now + the duration
  // must not overflow the clock.
  constexpr std::chrono::nanoseconds kLongest = std::chrono::milliseconds(1000000000000);
  if (!d.ok() || d->count() <= 0 || *d > kLongest) {
    return base::Status::InvalidArgument(flag + ": expected a duration above zero and at most 1e12 ms, such as 500ms, "
                                         "10s or 2m, got '" + text + "'");
  }
  // To the nearest millisecond, at least one.
  const auto ms = std::chrono::round<std::chrono::milliseconds>(*d);
  return std::max(ms, std::chrono::milliseconds(1));
}

base::StatusOr<std::optional<std::int64_t>> OptionalInt(const ParsedFlags& flags, const std::string& name,
                                                  std::int64_t min, std::int64_t max) {
  const std::string* text = flags.Get(name);
  if (text == nullptr) return std::optional<std::int64_t>();
  GAC_ASSIGN_OR_RETURN(std::int64_t v, ParseIntFlag("--" + name, *text, min, max));
  return std::optional<std::int64_t>(v);
}

base::StatusOr<std::optional<double>> OptionalReal(const ParsedFlags& flags, const std::string& name) {
  const std::string* text = flags.Get(name);
  if (text == nullptr) return std::optional<double>();
  GAC_ASSIGN_OR_RETURN(double v, ParseRealFlag("--" + name, *text));
  return std::optional<double>(v);
}

}  // namespace gac::cli
