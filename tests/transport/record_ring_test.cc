// The telemetry queue's ring (transport/src/record_ring.h) against a
// std::deque doing the same pushes and pops.
#include "transport/src/record_ring.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <string>

#include "gac/v1/telemetry.pb.h"

namespace gac::transport {
namespace {

TEST(Ring, IsAFifoThroughGrowthAndWrapAround) {
  Ring<std::string> ring;
  std::deque<std::string> reference;
  std::mt19937 rng(7);
  int next = 0;
  for (int round = 0; round < 20000; ++round) {
    // Bursts of pushes that outgrow the ring a few times, and drains.
    const bool push = reference.empty() || std::uniform_int_distribution<int>(0, 99)(rng) < (round < 10000 ? 60 : 45);
    if (push) {
      std::string v = "record " + std::to_string(next++);
      reference.push_back(v);
      ring.push_back(std::move(v));
    } else {
      ASSERT_EQ(ring.front(), reference.front()) << "round " << round;
      std::string out = std::move(ring.front());
      ring.pop_front();
      reference.pop_front();
    }
    ASSERT_EQ(ring.size(), reference.size());
    ASSERT_EQ(ring.empty(), reference.empty());
    ASSERT_GE(ring.capacity(), ring.size());
    ASSERT_EQ(ring.capacity() & (ring.capacity() - 1), 0u) << "a power of two";
  }
  ring.clear();
  EXPECT_TRUE(ring.empty());
}

// Once grown to the deepest queue, pushing and popping at that depth keeps
// the same slots: the ring does not grow (nor allocate) again.
TEST(Ring, SteadyStateKeepsItsSlots) {
  Ring<v1::StepRecord> ring;
  for (int i = 0; i < 100; ++i) {
    v1::StepRecord r;
    r.set_step(i);
    ring.push_back(std::move(r));
  }
  const std::size_t grown = ring.capacity();
  EXPECT_EQ(grown, 128u);
  for (int i = 100; i < 100000; ++i) {
    EXPECT_EQ(ring.front().step(), i - 100);
    v1::StepRecord out = std::move(ring.front());
    ring.pop_front();
    v1::StepRecord r;
    r.set_step(i);
    r.set_run("exp");
    ring.push_back(std::move(r));
  }
  EXPECT_EQ(ring.capacity(), grown);
  EXPECT_EQ(ring.size(), 100u);
  EXPECT_EQ(ring.front().step(), 99900);
  EXPECT_EQ(ring.front().run(), "exp");
}

}  // namespace
}  // namespace gac::transport
