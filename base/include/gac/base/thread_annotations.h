// Clang thread-safety annotations (-Wthread-safety). They state which mutex
// guards a member and which locks a function needs, so the compiler checks
// the locking rules that would otherwise live only in comments. Other
// compilers ignore them. Use them with gac::base::Mutex (gac/base/mutex.h): the
// standard library's mutexes carry no annotations.
#ifndef GAC_BASE_THREAD_ANNOTATIONS_H_
#define GAC_BASE_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define GAC_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define GAC_THREAD_ANNOTATION(x)
#endif

// A type that is a lock ("mutex").
#define GAC_CAPABILITY(name) GAC_THREAD_ANNOTATION(capability(name))
// An RAII type that holds a lock for its lifetime.
#define GAC_SCOPED_CAPABILITY GAC_THREAD_ANNOTATION(scoped_lockable)
// The member may be read or written only with `mu` held.
#define GAC_GUARDED_BY(mu) GAC_THREAD_ANNOTATION(guarded_by(mu))
// What the member points to may be used only with `mu` held.
#define GAC_PT_GUARDED_BY(mu) GAC_THREAD_ANNOTATION(pt_guarded_by(mu))
// The caller must hold (exclusively / shared) the listed locks.
#define GAC_REQUIRES(...) GAC_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define GAC_REQUIRES_SHARED(...) GAC_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// The caller must not hold the listed locks (the function takes them).
#define GAC_EXCLUDES(...) GAC_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function acquires / releases the lock.
#define GAC_ACQUIRE(...) GAC_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define GAC_ACQUIRE_SHARED(...) GAC_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define GAC_RELEASE(...) GAC_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define GAC_RELEASE_SHARED(...) GAC_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define GAC_RELEASE_GENERIC(...) GAC_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define GAC_TRY_ACQUIRE(...) GAC_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// Tells the analysis the lock is held here (checked at run time by the mutex).
#define GAC_ASSERT_CAPABILITY(x) GAC_THREAD_ANNOTATION(assert_capability(x))
// Opts a function out of the analysis (say why where it is used).
#define GAC_NO_THREAD_SAFETY_ANALYSIS GAC_THREAD_ANNOTATION(no_thread_safety_analysis)

#endif  // GAC_BASE_THREAD_ANNOTATIONS_H_
