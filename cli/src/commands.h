// The commands of gacctl: each is a CommandSpec (name, flags, help) whose
// `prepare` checks the parsed flags and arguments (every error there is a
// usage error, exit 2) and returns the Action that talks to gacd (every error
// there is gacd's or the connection's, exit 1). gacctl.cc parses the command
// line, prints --help from the specs, and maps the results to exit codes.
#ifndef GAC_CLI_SRC_COMMANDS_H_
#define GAC_CLI_SRC_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "cli/src/flags.h"
#include "gac/cli/client.h"
#include "gac/cli/format.h"
#include "gac/cli/gacctl.h"
#include "gac/controller/controller.h"
#include "gac/proto/wire_rules.h"
#include "gac/base/status.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/query.pb.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::cli {

// What an action works with.
class Context {
 public:
  Context(const Environment& env, std::ostream& out, std::ostream& err, ConnectionOptions connection)
      : env_(env), out_(out), err_(err), connection_(std::move(connection)) {}

  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }
  const Environment& env() const { return env_; }
  // The client of gacd, created on first use.
  GacdClient& client();
  // Now, in ns since the Unix epoch (Environment::now).
  std::int64_t NowNs() const;
  bool interrupted() const { return env_.interrupt != nullptr && env_.interrupt->requested(); }
  // A progress line on stderr (replaced by the next; only with env.progress).
  void Progress(const std::string& line);
  // Clears the progress line, if one was written.
  void EndProgress();

 private:
  const Environment& env_;
  std::ostream& out_;
  std::ostream& err_;
  ConnectionOptions connection_;
  std::unique_ptr<GacdClient> client_;
  bool progress_shown_ = false;
};

using Action = std::function<base::Status(Context&)>;

struct CommandSpec {
  std::string name;         // "steps", "config set"
  std::string args;         // "RUN" in the usage line; "" for none
  std::string summary;      // one line, in `gacctl --help`
  std::string description;  // paragraphs after the usage line of `gacctl NAME --help`
  std::vector<FlagSpec> flags;
  std::size_t positionals = 0;  // exact number of arguments (the least, with more_positionals)
  bool more_positionals = false;  // "FILE..." takes any number above positionals
  std::function<base::StatusOr<Action>(const ParsedFlags& flags, const std::vector<std::string>& args)> prepare;
};

// The status of an action stopped by an interrupt (exit 130).
base::Status Interrupted();

// The commands, by file.
std::vector<CommandSpec> RunCommands();     // runs, show, health       (run_commands.cc)
std::vector<CommandSpec> StepCommands();    // steps, tail              (step_commands.cc)
std::vector<CommandSpec> ConfigCommands();  // config *, calibrate      (config_commands.cc)
std::vector<CommandSpec> ReplayCommands();  // replay                   (replay_command.cc)
std::vector<CommandSpec> BacktestCommands();  // backtest               (backtest_command.cc)

// Shared pieces of the commands.

// --format, parsed (table when absent).
base::StatusOr<Format> FormatFlag(const ParsedFlags& flags);
inline FlagSpec FormatFlagSpec() { return {"format", "table|csv|jsonl", "output format (default table)"}; }

// Enum text ("safe", "monitor", "paper"; "unknown" outside the enum) is
// gac::proto::EnumName (gac/proto/wire_rules.h).
// "c_low 0.05, c_high 0.3, alpha paper, mode local".
std::string SettingsText(const v1::RunConfig& config);
// The run's spike guard in words: "off", "|g| > 100", "z > 6 over 128 steps (after 64)", or both.
std::string SpikeText(const v1::RunConfig& config);
// "92.5 %".
std::string Percent(double fraction);
// Why a run summary's calibration has no suggested thresholds, in the
// words of the rule (gac/controller/calibration.h).
std::string NoSuggestionReason(const v1::CalibrationSummary& calibration);
// The step range flags: --start-step and --end-step, the half-open range
// [start_step, end_step) of the wire, and their former names --from (the
// same as --start-step) and --to N (inclusive: --end-step N+1).
std::vector<FlagSpec> StepRangeFlagSpecs();
// Those flags as [*start, *end), *end 0 for no limit.
base::Status StepRangeFlags(const ParsedFlags& flags, std::int64_t* start, std::int64_t* end);

}  // namespace gac::cli

#endif  // GAC_CLI_SRC_COMMANDS_H_
