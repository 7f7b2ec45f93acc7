// gac::base::ParseDuration, the one duration syntax of gacd and gacctl.
#include "gac/base/duration.h"

#include <gtest/gtest.h>

namespace gac {
namespace {

using std::chrono::nanoseconds;

TEST(ParseDuration, EveryUnit) {
  EXPECT_EQ(*base::ParseDuration("500ms"), std::chrono::milliseconds(500));
  EXPECT_EQ(*base::ParseDuration("10s"), std::chrono::seconds(10));
  EXPECT_EQ(*base::ParseDuration("15m"), std::chrono::minutes(15));
  EXPECT_EQ(*base::ParseDuration("12h"), std::chrono::hours(12));
  EXPECT_EQ(*base::ParseDuration("30d"), std::chrono::hours(30 * 24));
  EXPECT_EQ(*base::ParseDuration("10"), std::chrono::seconds(10)) << "a bare number is seconds";
  EXPECT_EQ(*base::ParseDuration("0"), nanoseconds(0));
}

TEST(ParseDuration, FractionsAreExact) {
  EXPECT_EQ(*base::ParseDuration("1.5"), std::chrono::milliseconds(1500));
  EXPECT_EQ(*base::ParseDuration("0.1s"), std::chrono::milliseconds(100));
  EXPECT_EQ(*base::ParseDuration("1.5h"), std::chrono::minutes(90));
  EXPECT_EQ(*base::ParseDuration(".25m"), std::chrono::seconds(15));
  EXPECT_EQ(*base::ParseDuration("0.0000000015s"), nanoseconds(1)) << "truncated to whole nanoseconds";
}

TEST(ParseDuration, RefusesWhatIsNotADuration) {
  for (const char* bad : {"", "s", "ms", ".", "-1s", "+1s", "1e3s", "10x", "1 s", "1ss", "1.2.3s", "nan", "inf"}) {
    const auto d = base::ParseDuration(bad);
    EXPECT_TRUE(d.status().IsInvalidArgument()) << "'" << bad << "'";
  }
}

TEST(ParseDuration, RefusesWhatNanosecondsCannotHold) {
  EXPECT_TRUE(base::ParseDuration("106751d").ok());
  EXPECT_TRUE(base::ParseDuration("106752d").status().IsInvalidArgument());
  EXPECT_TRUE(base::ParseDuration("99999999999999999999999s").status().IsInvalidArgument());
  EXPECT_EQ(base::ParseDuration("9223372036854775807ms").status().message().find("too long") != std::string::npos, true);
}

}  // namespace
}  // namespace gac
