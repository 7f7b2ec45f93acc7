// A fixed set of worker threads that runs one parallel loop at a time.
//
// ParallelFor(n, fn) calls fn(i) for every i in [0, n), on the calling thread
// and the workers, and returns when all calls are done. Tasks are claimed
// from an atomic counter, so uneven tasks balance themselves. Not reentrant:
// one ParallelFor at a time per pool (the agent owns its pool).
#ifndef GAC_AGENT_SRC_THREAD_POOL_H_
#define GAC_AGENT_SRC_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gac::agent {

class ThreadPool {
 public:
  // num_threads counts the caller: 1 means no workers.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void ParallelFor(std::int64_t n, const std::function<void(std::int64_t)>& fn);
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void WorkerLoop();
  void RunTasks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  // Guarded by mu_.
  std::uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  // Valid while a loop runs.
  const std::function<void(std::int64_t)>* fn_ = nullptr;
  std::int64_t n_ = 0;
  std::atomic<std::int64_t> next_{0};
};

}  // namespace gac::agent

#endif  // GAC_AGENT_SRC_THREAD_POOL_H_
