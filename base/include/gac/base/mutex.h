// Mutex, SharedMutex and CondVar: the standard library's, annotated for
// clang's thread-safety analysis (gac/base/thread_annotations.h), so members
// marked GAC_GUARDED_BY(mu_) are checked at compile time. Same cost as
// std::mutex / std::shared_mutex / std::condition_variable.
//
//   gac::base::Mutex mu_;
//   int count_ GAC_GUARDED_BY(mu_);
//   void Add() GAC_EXCLUDES(mu_) { gac::MutexLock lock(&mu_); ++count_; }
//
// Thread safety: these are the synchronisation primitives themselves.
#ifndef GAC_BASE_MUTEX_H_
#define GAC_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "gac/base/thread_annotations.h"

namespace gac::base {

class GAC_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() GAC_ACQUIRE() { mu_.lock(); }
  void Unlock() GAC_RELEASE() { mu_.unlock(); }
  // For the analysis only: states that the caller holds the lock (a
  // callback documented to run under it).
  void AssertHeld() GAC_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction.
class GAC_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) GAC_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() GAC_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Waits on a condition under a Mutex. Every Wait* is called with that mutex
// held (the analysis checks it); it is released while waiting and held
// again on return. Wait in a loop on the condition: a wait may end early.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // A wait with a deadline a day away, which ends like any early wakeup:
  // libstdc++ 12's out-of-line condition_variable::wait is versioned
  // GLIBCXX_3.4.30, newer than the libstdc++ (GCC 11) of the Python wheels'
  // manylinux_2_34 floor; wait_until is inline, over pthread_cond_clockwait.
  void Wait(Mutex* mu) GAC_REQUIRES(mu) { WaitFor(mu, std::chrono::hours(24)); }
  // False when `deadline` has passed (the condition may still hold).
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline) GAC_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) GAC_REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A reader-writer lock: many readers or one writer.
class GAC_CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() GAC_ACQUIRE() { mu_.lock(); }
  void Unlock() GAC_RELEASE() { mu_.unlock(); }
  void ReaderLock() GAC_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void ReaderUnlock() GAC_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class GAC_SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) GAC_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterMutexLock() GAC_RELEASE() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

class GAC_SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) GAC_ACQUIRE_SHARED(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() GAC_RELEASE() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace gac::base

#endif  // GAC_BASE_MUTEX_H_
