// A FIFO over one growing ring of slots (gac::transport, internal): the
// telemetry queue between the training threads' Enqueue and the sender.
//
// A slot is moved into and out of, never destroyed, so once the ring has
// grown to the deepest queue a run reaches, push_back allocates nothing: a
// std::deque allocates a block every few records and frees it on the other
// thread, and the heap's growing and trimming then showed up as page faults
// inside Enqueue, on the training thread (tests/faults: the partition case).
// The ring never shrinks: it holds at most the queue's capacity in (empty)
// slots.
//
// Thread safety: none; the owner locks.

#ifndef GAC_TRANSPORT_SRC_RECORD_RING_H_
#define GAC_TRANSPORT_SRC_RECORD_RING_H_

#include <cstddef>
#include <utility>
#include <vector>

namespace gac::transport {

template <typename T>
class Ring {
 public:
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // The slots held; a power of two (0 before the first push_back).
  std::size_t capacity() const { return slots_.size(); }

  void push_back(T&& value) {
    if (size_ == slots_.size()) Grow();
    slots_[(head_ + size_) & (slots_.size() - 1)] = std::move(value);
    ++size_;
  }
  // REQUIRES: !empty().
  T& front() { return slots_[head_]; }
  // The front's slot keeps whatever moving out of it left there.
  // REQUIRES: !empty().
  void pop_front() {
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
  }
  // Empties the ring; the slots stay (moved from, or holding old values).
  void clear() {
    while (!empty()) {
      front() = T();
      pop_front();
    }
    head_ = 0;
  }

 private:
  void Grow() {
    std::vector<T> bigger(slots_.empty() ? 64 : 2 * slots_.size());
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = std::move(slots_[(head_ + i) & (slots_.size() - 1)]);
    slots_ = std::move(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace gac::transport

#endif  // GAC_TRANSPORT_SRC_RECORD_RING_H_
