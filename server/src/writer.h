// The single writer of gacd: a bounded queue of write ops drained by one
// thread into store transactions. Ops that queue up while a transaction
// commits go into the next transaction together (group commit), so the
// commit cost is shared when load is high. Callers never wait on the disk:
// Submit returns at once and `done` runs on the writer thread after commit.
//
// Thread safety: Submit and queued_rows may be called from any thread.

#ifndef GAC_SERVER_SRC_WRITER_H_
#define GAC_SERVER_SRC_WRITER_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "gac/base/mutex.h"
#include "gac/server/store.h"

namespace gac::server {

class Metrics;

class Writer {
 public:
  // Called once per op on the writer thread, after its transaction
  // committed (OK, results filled) or failed (the error; nothing stored).
  using Done = std::function<void(const base::Status& status, const WriteOp& op)>;

  // REQUIRES: store outlives the writer. metrics may be null.
  Writer(Store* store, Metrics* metrics, std::size_t max_queue_rows,
         std::size_t max_transaction_rows = 64 * 1024);
  ~Writer();  // Stop()
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Enqueues an op counting `rows` rows (step records plus layer rows) of the
  // queue bound. RESOURCE_EXHAUSTED when the bound would be exceeded (an op
  // larger than the bound is accepted into an empty queue), UNAVAILABLE after
  // Stop. The pointers in `op` must stay valid until `done` has run.
  base::Status Submit(const WriteOp& op, std::size_t rows, Done done) GAC_EXCLUDES(mu_);

  // Commits everything queued, runs the callbacks, and stops the thread.
  // Later Submits fail. Idempotent.
  void Stop() GAC_EXCLUDES(mu_);

  std::size_t queued_rows() const GAC_EXCLUDES(mu_);

 private:
  struct Item {
    WriteOp op;
    std::size_t rows;
    Done done;
  };
  void Run() GAC_EXCLUDES(mu_);

  Store* const store_;
  Metrics* const metrics_;
  const std::size_t max_queue_rows_;
  const std::size_t max_transaction_rows_;

  mutable base::Mutex mu_;
  base::CondVar cv_;
  std::deque<Item> queue_ GAC_GUARDED_BY(mu_);
  std::size_t queued_rows_ GAC_GUARDED_BY(mu_) = 0;
  bool stopping_ GAC_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_WRITER_H_
