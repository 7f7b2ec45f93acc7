// Interrupt: a request to stop that long-running commands (a followed tail,
// a paged export) look at between calls, and that a follow loop can sleep
// on. gacctl's main turns SIGINT and SIGTERM into Request() from a thread
// that waits for them; tests call it directly.
//
// Thread safety: every method may be called from any thread.
#ifndef GAC_CLI_INTERRUPT_H_
#define GAC_CLI_INTERRUPT_H_

#include <chrono>

#include "gac/base/mutex.h"

namespace gac::cli {

class Interrupt {
 public:
  void Request() GAC_EXCLUDES(mu_) {
    base::MutexLock lock(&mu_);
    requested_ = true;
    cv_.SignalAll();
  }

  bool requested() const GAC_EXCLUDES(mu_) {
    base::MutexLock lock(&mu_);
    return requested_;
  }

  // Waits up to `timeout`; true when a stop was requested (before or during).
  bool WaitFor(std::chrono::milliseconds timeout) GAC_EXCLUDES(mu_) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    base::MutexLock lock(&mu_);
    while (!requested_) {
      if (!cv_.WaitUntil(&mu_, deadline)) break;
    }
    return requested_;
  }

 private:
  mutable base::Mutex mu_;
  base::CondVar cv_;
  bool requested_ GAC_GUARDED_BY(mu_) = false;
};

}  // namespace gac::cli

#endif  // GAC_CLI_INTERRUPT_H_
