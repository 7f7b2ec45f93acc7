// Executor: a small fixed pool of threads for the calls that read the store,
// so that gRPC's callback threads never block on the disk.
//
// Thread safety: Post and Stop may be called from any thread.
#ifndef GAC_SERVER_SRC_EXECUTOR_H_
#define GAC_SERVER_SRC_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "gac/base/mutex.h"

namespace gac::server {

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();  // Stop()
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `task`; it runs on one of the threads. After Stop it is dropped.
  void Post(std::function<void()> task) GAC_EXCLUDES(mu_);
  // Runs what is queued, then joins the threads. Idempotent.
  void Stop() GAC_EXCLUDES(mu_);

 private:
  void Run() GAC_EXCLUDES(mu_);

  base::Mutex mu_;
  base::CondVar cv_;
  std::deque<std::function<void()>> tasks_ GAC_GUARDED_BY(mu_);
  bool stopping_ GAC_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // constant after construction
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_EXECUTOR_H_
