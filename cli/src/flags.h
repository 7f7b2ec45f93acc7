// gacctl's flag syntax: --name=value, --name value, switches (--layers),
// short forms (-f, -n 5), "--" before arguments that start with a dash.
// A flag given twice keeps its last value. Every error is InvalidArgument
// with a one-line message naming the flag, which gacctl reports as a usage
// error (exit status 2).
#ifndef GAC_CLI_SRC_FLAGS_H_
#define GAC_CLI_SRC_FLAGS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gac/base/status.h"

namespace gac::cli {

struct FlagSpec {
  std::string name;        // "from" for --from
  std::string value_name;  // "N" for --from N; "" for a switch
  std::string help;        // one line for --help
  char short_name = 0;     // 'f' for -f; 0 for none
  // Non-empty: the flag is a former name kept as an alias, and this says
  // what to use instead ("use --start-step"); gacctl prints it on stderr.
  std::string deprecated = {};
};

// A deprecated alias of a flag: `note` says what to use instead.
inline FlagSpec DeprecatedFlag(std::string name, std::string value_name, std::string note) {
  return FlagSpec{std::move(name), std::move(value_name), "deprecated: " + note, 0, note};
}

class ParsedFlags {
 public:
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The value of --name (empty for a switch); nullptr when not given.
  const std::string* Get(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // One line per deprecated flag given: "--from is deprecated: use --start-step".
  const std::vector<std::string>& deprecation_notes() const { return notes_; }

 private:
  friend base::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs);
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  std::vector<std::string> notes_;
};

base::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs);

// Typed values of flags; `flag` ("--from") names the flag in errors.
base::StatusOr<std::int64_t> ParseIntFlag(const std::string& flag, const std::string& text, std::int64_t min,
                                    std::int64_t max);
// A finite number.
base::StatusOr<double> ParseRealFlag(const std::string& flag, const std::string& text);
// The parts of a comma-separated list ("a,b,,c": "a", "b", "", "c"); one
// part, "" for "".
std::vector<std::string> SplitCommas(const std::string& text);
// Comma-separated finite numbers ("0.03,0.05,0.07").
base::StatusOr<std::vector<double>> ParseRealListFlag(const std::string& flag, const std::string& text);
// A duration as gac::base::ParseDuration reads it ("500ms", "10s", "2m", "1h",
// "1d"; a bare number is seconds), above zero, in whole milliseconds (at
// least 1).
base::StatusOr<std::chrono::milliseconds> ParseDurationFlag(const std::string& flag, const std::string& text);

// The optional values of a parsed flag set, typed (nullopt when absent).
base::StatusOr<std::optional<std::int64_t>> OptionalInt(const ParsedFlags& flags, const std::string& name,
                                                  std::int64_t min, std::int64_t max);
base::StatusOr<std::optional<double>> OptionalReal(const ParsedFlags& flags, const std::string& name);

}  // namespace gac::cli

#endif  // GAC_CLI_SRC_FLAGS_H_
