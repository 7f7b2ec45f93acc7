// gacctl: the command line over gacd's gRPC API. See `gacctl --help`.
//
// SIGINT and SIGTERM are taken by a thread of their own: the first asks the
// running command to stop between calls (a followed tail ends cleanly, an
// export stops with status 130); a second one ends the process at once.
// gRPC's own log lines (a failed TLS handshake...) are dropped unless
// GRPC_VERBOSITY asks for them: the error gacctl prints says the same in one
// line.
#include <grpc/support/log.h>
#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gac/cli/gacctl.h"

int main(int argc, char** argv) {
  if (std::getenv("GRPC_VERBOSITY") == nullptr) {
    gpr_set_log_function([](gpr_log_func_args*) {});
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // Blocked before any thread starts, so every thread (gRPC's too) inherits it.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  gac::cli::Interrupt interrupt;
  std::thread([&interrupt, signals] {
    for (int count = 0;; ++count) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) return;
      if (count > 0) _exit(gac::cli::kExitInterrupted);
      interrupt.Request();
    }
  }).detach();

  gac::cli::Environment env;
  env.getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  env.interrupt = &interrupt;
  env.progress = isatty(STDERR_FILENO) == 1 && isatty(STDOUT_FILENO) == 0;
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  const int rc = gac::cli::RunGacctl(args, env, std::cout, std::cerr);
  std::cout.flush();
  // The signal thread may still wait: leave without joining it.
  std::_Exit(rc);
}
