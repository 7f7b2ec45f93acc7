#include "server/src/executor.h"

namespace gac::server {

Executor::Executor(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

Executor::~Executor() { Stop(); }

void Executor::Post(std::function<void()> task) {
  {
    base::MutexLock lock(&mu_);
    if (stopping_) return;
    tasks_.push_back(std::move(task));
  }
  cv_.Signal();
}

void Executor::Stop() {
  {
    base::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void Executor::Run() {
  for (;;) {
    std::function<void()> task;
    {
      base::MutexLock lock(&mu_);
      while (!stopping_ && tasks_.empty()) cv_.Wait(&mu_);
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace gac::server
