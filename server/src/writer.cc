#include "server/src/writer.h"

#include <chrono>
#include <vector>

#include "server/src/metrics.h"

namespace gac::server {

Writer::Writer(Store* store, Metrics* metrics, std::size_t max_queue_rows, std::size_t max_transaction_rows)
    : store_(store),
      metrics_(metrics),
      max_queue_rows_(max_queue_rows),
      max_transaction_rows_(max_transaction_rows),
      thread_([this] { Run(); }) {}

Writer::~Writer() { Stop(); }

base::Status Writer::Submit(const WriteOp& op, std::size_t rows, Done done) {
  {
    base::MutexLock lock(&mu_);
    if (stopping_) return base::Status::Unavailable("gacd is shutting down");
    if (!queue_.empty() && queued_rows_ + rows > max_queue_rows_) {
      return base::Status::ResourceExhausted("write queue full (" + std::to_string(queued_rows_) + " rows); retry later");
    }
    queue_.push_back(Item{op, rows, std::move(done)});
    queued_rows_ += rows;
    if (metrics_ != nullptr) metrics_->SetQueueRows(queued_rows_);
  }
  cv_.Signal();
  return base::Status::Ok();
}

void Writer::Stop() {
  {
    base::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.Signal();
  if (thread_.joinable()) thread_.join();
}

std::size_t Writer::queued_rows() const {
  base::MutexLock lock(&mu_);
  return queued_rows_;
}

void Writer::Run() {
  std::vector<Item> batch;
  std::vector<WriteOp> ops;
  for (;;) {
    {
      base::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping and drained
      std::size_t rows = 0;
      while (!queue_.empty() && (batch.empty() || rows + queue_.front().rows <= max_transaction_rows_)) {
        rows += queue_.front().rows;
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    ops.clear();
    for (const Item& item : batch) ops.push_back(item.op);
    const auto start = std::chrono::steady_clock::now();
    const base::Status status = store_->Apply(&ops);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (metrics_ != nullptr) metrics_->ObserveWriteSeconds(seconds);
    std::size_t done_rows = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      done_rows += batch[i].rows;
      if (batch[i].done) batch[i].done(status, ops[i]);
    }
    batch.clear();
    {
      base::MutexLock lock(&mu_);
      queued_rows_ -= done_rows;
      if (metrics_ != nullptr) metrics_->SetQueueRows(queued_rows_);
    }
  }
}

}  // namespace gac::server
