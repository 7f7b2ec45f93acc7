// gacctl, the command line over gacd's gRPC API, as a function: the program
// is RunGacctl(argv[1..], the process's environment, stdout, stderr), and
// tests run the very same commands in-process with a fixed clock.
//
//   gacctl runs | show RUN | steps RUN | tail RUN [-f] | health
//   gacctl config get|set|history RUN | calibrate RUN | replay RUN
//
// `gacctl --help` and `gacctl COMMAND --help` describe every command, flag
// and output column. Exit status: 0 success; 1 gacd refused or failed the
// request, or could not be reached (one line on stderr: the gRPC status
// name and gacd's text); 2 a usage error (one line naming the flag or
// argument); 130 an export stopped by SIGINT/SIGTERM before its end (a
// followed tail that is interrupted ends with 0).
//
// Thread safety: RunGacctl may run on several threads at once with
// separate streams; it reads the environment only through `Environment`.
#ifndef GAC_CLI_GACCTL_H_
#define GAC_CLI_GACCTL_H_

#include <chrono>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gac/cli/interrupt.h"

namespace gac::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInterrupted = 130;

// What gacctl takes from its process.
struct Environment {
  // An environment variable (GAC_ADDRESS, GAC_TOKEN), or nullopt when unset.
  std::function<std::optional<std::string>(const std::string&)> getenv = [](const std::string&) {
    return std::optional<std::string>();
  };
  // The time that ages ("12s ago") are measured from.
  std::function<std::chrono::system_clock::time_point()> now = [] { return std::chrono::system_clock::now(); };
  // Stops a followed tail or an export between calls; nullptr: never.
  Interrupt* interrupt = nullptr;
  // Progress lines on stderr during long reads (main: stderr is a terminal
  // and stdout is not).
  bool progress = false;
};

// Runs one gacctl command line (`args` without the program name) and
// returns the exit status.
int RunGacctl(const std::vector<std::string>& args, const Environment& env, std::ostream& out, std::ostream& err);

// The commands ("runs", "config get", ...), in the order of `gacctl --help`.
std::vector<std::string> CommandNames();

}  // namespace gac::cli

#endif  // GAC_CLI_GACCTL_H_
