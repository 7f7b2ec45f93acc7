// A fixed set of worker threads that runs one parallel loop at a time.
//
// ParallelFor(n, fn) calls fn(i) for every i in [0, n), on the calling thread
// and the workers, and returns when all calls are done. Tasks are claimed
// from an atomic counter, so uneven tasks balance themselves. Not reentrant:
// one ParallelFor at a time per pool (the agent owns its pool).
//
// Waking a sleeping thread costs tens to hundreds of microseconds on a busy
// or virtualised machine, as much as a whole pass over a few MB. So workers
// spin for a short while (kSpin) after a loop before they sleep (the agent's
// apply pass follows its statistics pass), and the caller spins for the
// workers' last tasks before it sleeps.
#ifndef GAC_AGENT_SRC_CPU_THREAD_POOL_H_
#define GAC_AGENT_SRC_CPU_THREAD_POOL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "gac/base/mutex.h"

namespace gac::agent {

// One iteration of a spin-wait loop.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

class ThreadPool {
 public:
  // How long a worker waits for the next loop awake before it sleeps.
  static constexpr std::chrono::microseconds kSpin{200};

  // num_threads counts the caller: 1 means no workers.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // With `first`, the caller runs first() after the loop has started (the
  // workers already claim tasks) and only then joins the tasks: for work the
  // tasks depend on, published as it progresses (tasks wait for it themselves).
  void ParallelFor(std::int64_t n, const std::function<void(std::int64_t)>& fn,
                   const std::function<void()>* first = nullptr);
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void WorkerLoop();
  void RunTasks();

  std::vector<std::thread> workers_;
  // Orders a sleeper's last check against the publishing of a loop or its
  // end; it guards no field (those below are atomics, read by spinners
  // without it).
  base::Mutex mu_;
  base::CondVar wake_;
  base::CondVar done_;
  // Changed under mu_ (so that sleepers miss nothing), read without it by spinners.
  std::atomic<std::uint64_t> generation_{0};  // one per loop
  std::atomic<bool> stop_{false};
  std::atomic<int> active_{0};                // workers still in the current loop
  // Valid while a loop runs.
  const std::function<void(std::int64_t)>* fn_ = nullptr;
  std::int64_t n_ = 0;
  std::atomic<std::int64_t> next_{0};
};

}  // namespace gac::agent

#endif  // GAC_AGENT_SRC_CPU_THREAD_POOL_H_
