// ThreadPool: every task runs once per loop on any mix of spinning and
// sleeping workers; the caller's `first` work runs before it joins the tasks
// while the workers already run them.
#include "agent/src/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace gac::agent {
namespace {

TEST(ThreadPool, EveryTaskOnceWhetherWorkersSpinOrSleep) {
  ThreadPool pool(3);
  ASSERT_EQ(pool.num_threads(), 3);
  for (int loop = 0; loop < 400; ++loop) {
    const std::int64_t n = 1 + loop % 37;
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    pool.ParallelFor(n, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)].fetch_add(1); });
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << "loop " << loop;
    // Every tenth loop the workers have gone to sleep before the next one.
    if (loop % 10 == 9) std::this_thread::sleep_for(ThreadPool::kSpin * 3);
  }
}

TEST(ThreadPool, WorkersRunTasksWhileTheCallerDoesItsFirstWork) {
  ThreadPool pool(2);
  for (int loop = 0; loop < 50; ++loop) {
    std::atomic<int> done{0};
    std::atomic<bool> caller_busy{true};
    std::atomic<int> ran_while_busy{0};
    const std::function<void()> first = [&] {
      // The worker can finish the tasks before the caller is done.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (done.load() < 4 && std::chrono::steady_clock::now() < until) CpuRelax();
      caller_busy.store(false);
    };
    pool.ParallelFor(
        4,
        [&](std::int64_t) {
          if (caller_busy.load()) ran_while_busy.fetch_add(1);
          done.fetch_add(1);
        },
        &first);
    ASSERT_EQ(done.load(), 4);
    EXPECT_EQ(ran_while_busy.load(), 4) << "loop " << loop;
  }
}

TEST(ThreadPool, FirstWorkRunsWithoutWorkersToo) {
  ThreadPool pool(1);
  int order = 0, first_at = -1, task_at = -1;
  const std::function<void()> first = [&] { first_at = order++; };
  pool.ParallelFor(1, [&](std::int64_t) { task_at = order++; }, &first);
  EXPECT_EQ(first_at, 0);
  EXPECT_EQ(task_at, 1);
}

TEST(ThreadPool, DestroyedWhileWorkersSpinOrSleep) {
  for (int i = 0; i < 20; ++i) {
    ThreadPool pool(3);
    pool.ParallelFor(8, [](std::int64_t) {});
    if (i % 2 == 1) std::this_thread::sleep_for(ThreadPool::kSpin * 3);
  }  // each destructor joins its workers: the test ends
}

}  // namespace
}  // namespace gac::agent
