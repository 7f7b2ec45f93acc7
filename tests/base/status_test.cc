// Tests of gac/base/status.h: StatusOr's checked value() and GAC_ASSIGN_OR_RETURN.
#include "gac/base/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

namespace gac {
namespace {

base::StatusOr<int> Half(int n) {
  if (n % 2 != 0) return base::Status::InvalidArgument(std::to_string(n) + " is odd");
  return n / 2;
}

// Halves twice through the macro; the first error is returned unchanged.
base::StatusOr<int> Quarter(int n) {
  GAC_ASSIGN_OR_RETURN(int half, Half(n));
  GAC_ASSIGN_OR_RETURN(const int quarter, Half(half));
  return quarter;
}

base::Status QuarterInto(int n, int* out) {
  GAC_ASSIGN_OR_RETURN(*out, Quarter(n));
  return base::Status::Ok();
}

TEST(StatusOr, AssignOrReturnMovesTheValueOrReturnsTheFirstError) {
  ASSERT_TRUE(Quarter(12).ok());
  EXPECT_EQ(*Quarter(12), 3);
  const base::StatusOr<int> odd_first = Quarter(7);
  ASSERT_FALSE(odd_first.ok());
  EXPECT_EQ(odd_first.status(), base::Status::InvalidArgument("7 is odd"));
  const base::StatusOr<int> odd_second = Quarter(6);
  ASSERT_FALSE(odd_second.ok());
  EXPECT_EQ(odd_second.status(), base::Status::InvalidArgument("3 is odd"));

  int out = -1;
  EXPECT_TRUE(QuarterInto(8, &out).ok());
  EXPECT_EQ(out, 2);
  out = -1;
  EXPECT_TRUE(QuarterInto(10, &out).IsInvalidArgument());
  EXPECT_EQ(out, -1);  // untouched on an error
}

TEST(StatusOr, AssignOrReturnTakesMoveOnlyValues) {
  auto make = [](bool ok) -> base::StatusOr<std::unique_ptr<int>> {
    if (!ok) return base::Status::NotFound("none");
    return std::make_unique<int>(5);
  };
  auto use = [&](bool ok) -> base::StatusOr<int> {
    GAC_ASSIGN_OR_RETURN(std::unique_ptr<int> p, make(ok));
    return *p;
  };
  EXPECT_EQ(*use(true), 5);
  EXPECT_TRUE(use(false).status().IsNotFound());
}

TEST(StatusOrDeathTest, ValueOfAnErrorStopsTheProcessWithItsMessage) {
  const base::StatusOr<int> odd = Half(3);
  EXPECT_DEATH((void)odd.value(), "StatusOr::value\\(\\) on an error: INVALID_ARGUMENT: 3 is odd");
  base::StatusOr<std::string> missing = base::Status::NotFound("no such run");
  EXPECT_DEATH((void)std::move(missing).value(), "NOT_FOUND: no such run");
  EXPECT_EQ(Half(4).value(), 2);
}

}  // namespace
}  // namespace gac
