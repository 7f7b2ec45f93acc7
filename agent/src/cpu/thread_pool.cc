#include "agent/src/cpu/thread_pool.h"

namespace gac::agent {
namespace {

using Clock = std::chrono::steady_clock;

// Spins until done() or kSpin has passed; returns done().
template <typename Done>
bool SpinFor(Done done) {
  const Clock::time_point until = Clock::now() + ThreadPool::kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && Clock::now() >= until) return done();
    CpuRelax();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    base::MutexLock lock(&mu_);
    stop_.store(true);
  }
  wake_.SignalAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunTasks() {
  for (std::int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n_;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    (*fn_)(i);
  }
}

void ThreadPool::ParallelFor(std::int64_t n, const std::function<void(std::int64_t)>& fn,
                             const std::function<void()>* first) {
  if (n <= 0 || workers_.empty() || n == 1) {
    if (first != nullptr) (*first)();
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  fn_ = &fn;
  n_ = n;
  next_.store(0, std::memory_order_relaxed);
  active_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    base::MutexLock lock(&mu_);
    generation_.fetch_add(1, std::memory_order_release);  // publishes fn_, n_, next_, active_
  }
  wake_.SignalAll();
  if (first != nullptr) (*first)();
  RunTasks();
  const auto all_done = [this] { return active_.load(std::memory_order_acquire) == 0; };
  if (!SpinFor(all_done)) {
    base::MutexLock lock(&mu_);
    while (!all_done()) done_.Wait(&mu_);
  }
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  std::uint64_t seen = 0;
  for (;;) {
    const auto new_loop = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    const auto ready = [&] { return stop_.load(std::memory_order_relaxed) || new_loop(); };
    if (!SpinFor(ready)) {
      base::MutexLock lock(&mu_);
      while (!ready()) wake_.Wait(&mu_);
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = generation_.load(std::memory_order_acquire);
    RunTasks();
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      base::MutexLock lock(&mu_);  // the caller checks active_ under mu_ before it sleeps
      done_.Signal();
    }
  }
}

}  // namespace gac::agent
