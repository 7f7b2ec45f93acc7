// Tests of gac/status.h: StatusOr's checked value() and GAC_ASSIGN_OR_RETURN.
#include "gac/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

namespace gac {
namespace {

StatusOr<int> Half(int n) {
  if (n % 2 != 0) return Status::InvalidArgument(std::to_string(n) + " is odd");
  return n / 2;
}

// Halves twice through the macro; the first error is returned unchanged.
StatusOr<int> Quarter(int n) {
  GAC_ASSIGN_OR_RETURN(int half, Half(n));
  GAC_ASSIGN_OR_RETURN(const int quarter, Half(half));
  return quarter;
}

Status QuarterInto(int n, int* out) {
  GAC_ASSIGN_OR_RETURN(*out, Quarter(n));
  return Status::Ok();
}

TEST(StatusOr, AssignOrReturnMovesTheValueOrReturnsTheFirstError) {
  ASSERT_TRUE(Quarter(12).ok());
  EXPECT_EQ(*Quarter(12), 3);
  const StatusOr<int> odd_first = Quarter(7);
  ASSERT_FALSE(odd_first.ok());
  EXPECT_EQ(odd_first.status(), Status::InvalidArgument("7 is odd"));
  const StatusOr<int> odd_second = Quarter(6);
  ASSERT_FALSE(odd_second.ok());
  EXPECT_EQ(odd_second.status(), Status::InvalidArgument("3 is odd"));

  int out = -1;
  EXPECT_TRUE(QuarterInto(8, &out).ok());
  EXPECT_EQ(out, 2);
  out = -1;
  EXPECT_TRUE(QuarterInto(10, &out).IsInvalidArgument());
  EXPECT_EQ(out, -1);  // untouched on an error
}

TEST(StatusOr, AssignOrReturnTakesMoveOnlyValues) {
  auto make = [](bool ok) -> StatusOr<std::unique_ptr<int>> {
    if (!ok) return Status::NotFound("none");
    return std::make_unique<int>(5);
  };
  auto use = [&](bool ok) -> StatusOr<int> {
    GAC_ASSIGN_OR_RETURN(std::unique_ptr<int> p, make(ok));
    return *p;
  };
  EXPECT_EQ(*use(true), 5);
  EXPECT_TRUE(use(false).status().IsNotFound());
}

TEST(StatusOrDeathTest, ValueOfAnErrorStopsTheProcessWithItsMessage) {
  const StatusOr<int> odd = Half(3);
  EXPECT_DEATH((void)odd.value(), "StatusOr::value\\(\\) on an error: INVALID_ARGUMENT: 3 is odd");
  StatusOr<std::string> missing = Status::NotFound("no such run");
  EXPECT_DEATH((void)std::move(missing).value(), "NOT_FOUND: no such run");
  EXPECT_EQ(Half(4).value(), 2);
}

}  // namespace
}  // namespace gac
