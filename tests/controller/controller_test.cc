// Tests of gac::Controller, ValidateThresholds and Status/StatusOr.
//
// Expected values are derived from the algorithm as written in docs/ALGORITHM.md
// ("The GAC algorithm, exactly"), never from the implementation: boundaries
// are built so that the cosine is exactly representable, and the projection
// properties are measured on explicit fp64 vectors.
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "gac/controller/controller.h"
#include "gac/base/status.h"

namespace gac {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

controller::Controller MakeController(double c_low, double c_high, controller::AlphaMode mode = controller::AlphaMode::kPaper) {
  base::StatusOr<controller::Controller> c = controller::Controller::Create(controller::Thresholds{c_low, c_high}, mode);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

// Statistics whose cosine c = dot / (sqrt(gg*pp) + 1e-8) equals `cosine`
// bit for bit. With gg = pp = 2^60, sqrt(gg*pp) = 2^60 exactly and adding
// 1e-8 (far below half an ulp of 2^60, which is 128) leaves it unchanged, so
// the denominator is a power of two and dot = cosine * 2^60 divides back to
// exactly `cosine` whatever the rounding mode of the multiplication.
controller::AlignmentStats StatsForCosine(double cosine) {
  const double n = std::ldexp(1.0, 60);
  controller::AlignmentStats s;
  s.dot = std::ldexp(cosine, 60);
  s.grad_sq = n;
  s.ref_sq = n;
  s.has_reference = true;
  return s;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  // Long double accumulation so the reference is not limited by the
  // summation error of a 10k-element fp64 dot product.
  long double acc = 0.0L;
  for (std::size_t i = 0; i < a.size(); ++i) acc += static_cast<long double>(a[i]) * b[i];
  return static_cast<double>(acc);
}

double Cosine(const std::vector<double>& a, const std::vector<double>& b) {
  return Dot(a, b) / std::sqrt(Dot(a, a) * Dot(b, b));
}

// ---------------------------------------------------------------------------
// Status / StatusOr
// ---------------------------------------------------------------------------

TEST(StatusTest, DefaultIsOk) {
  base::Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), base::StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(base::Status::Ok().ok());
}

TEST(StatusTest, OkCodeWithMessageIsStillOk) {
  base::Status s(base::StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
  struct Case {
    base::Status status;
    base::StatusCode code;
  };
  const Case cases[] = {
      {base::Status::Cancelled("m"), base::StatusCode::kCancelled},
      {base::Status::Unknown("m"), base::StatusCode::kUnknown},
      {base::Status::InvalidArgument("m"), base::StatusCode::kInvalidArgument},
      {base::Status::DeadlineExceeded("m"), base::StatusCode::kDeadlineExceeded},
      {base::Status::NotFound("m"), base::StatusCode::kNotFound},
      {base::Status::AlreadyExists("m"), base::StatusCode::kAlreadyExists},
      {base::Status::PermissionDenied("m"), base::StatusCode::kPermissionDenied},
      {base::Status::ResourceExhausted("m"), base::StatusCode::kResourceExhausted},
      {base::Status::FailedPrecondition("m"), base::StatusCode::kFailedPrecondition},
      {base::Status::Aborted("m"), base::StatusCode::kAborted},
      {base::Status::OutOfRange("m"), base::StatusCode::kOutOfRange},
      {base::Status::Unimplemented("m"), base::StatusCode::kUnimplemented},
      {base::Status::Internal("m"), base::StatusCode::kInternal},
      {base::Status::Unavailable("m"), base::StatusCode::kUnavailable},
      {base::Status::DataLoss("m"), base::StatusCode::kDataLoss},
      {base::Status::Unauthenticated("m"), base::StatusCode::kUnauthenticated},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(base::StatusCodeName(c.code));
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.message(), "m");
  }
  EXPECT_EQ(std::size(cases), 16u) << "one factory per non-OK code";
}

TEST(StatusTest, EachPredicateIsTrueForItsCodeOnly) {
  using Predicate = bool (base::Status::*)() const;
  const std::pair<base::StatusCode, Predicate> predicates[] = {
      {base::StatusCode::kCancelled, &base::Status::IsCancelled},
      {base::StatusCode::kUnknown, &base::Status::IsUnknown},
      {base::StatusCode::kInvalidArgument, &base::Status::IsInvalidArgument},
      {base::StatusCode::kDeadlineExceeded, &base::Status::IsDeadlineExceeded},
      {base::StatusCode::kNotFound, &base::Status::IsNotFound},
      {base::StatusCode::kAlreadyExists, &base::Status::IsAlreadyExists},
      {base::StatusCode::kPermissionDenied, &base::Status::IsPermissionDenied},
      {base::StatusCode::kResourceExhausted, &base::Status::IsResourceExhausted},
      {base::StatusCode::kFailedPrecondition, &base::Status::IsFailedPrecondition},
      {base::StatusCode::kAborted, &base::Status::IsAborted},
      {base::StatusCode::kOutOfRange, &base::Status::IsOutOfRange},
      {base::StatusCode::kUnimplemented, &base::Status::IsUnimplemented},
      {base::StatusCode::kInternal, &base::Status::IsInternal},
      {base::StatusCode::kUnavailable, &base::Status::IsUnavailable},
      {base::StatusCode::kDataLoss, &base::Status::IsDataLoss},
      {base::StatusCode::kUnauthenticated, &base::Status::IsUnauthenticated},
  };
  for (int code = 0; code <= 16; ++code) {
    const base::Status status(static_cast<base::StatusCode>(code), "m");
    for (const auto& [predicate_code, predicate] : predicates) {
      SCOPED_TRACE(std::string(base::StatusCodeName(status.code())) + " vs " + base::StatusCodeName(predicate_code));
      EXPECT_EQ((status.*predicate)(), static_cast<int>(predicate_code) == code);
    }
  }
}

TEST(StatusTest, ErrnoMapsToTheCodeOfWhatWentWrong) {
  EXPECT_EQ(base::ErrnoToStatusCode(0), base::StatusCode::kOk);
  EXPECT_EQ(base::ErrnoToStatusCode(ENOENT), base::StatusCode::kNotFound);
  EXPECT_EQ(base::ErrnoToStatusCode(EACCES), base::StatusCode::kPermissionDenied);
  EXPECT_EQ(base::ErrnoToStatusCode(EROFS), base::StatusCode::kPermissionDenied);
  EXPECT_EQ(base::ErrnoToStatusCode(ENOSPC), base::StatusCode::kResourceExhausted);
  EXPECT_EQ(base::ErrnoToStatusCode(EMFILE), base::StatusCode::kResourceExhausted);
  EXPECT_EQ(base::ErrnoToStatusCode(EEXIST), base::StatusCode::kAlreadyExists);
  EXPECT_EQ(base::ErrnoToStatusCode(ENOTDIR), base::StatusCode::kFailedPrecondition);
  EXPECT_EQ(base::ErrnoToStatusCode(EIO), base::StatusCode::kUnavailable);
  EXPECT_EQ(base::ErrnoToStatusCode(EINTR), base::StatusCode::kUnavailable);
  EXPECT_EQ(base::ErrnoToStatusCode(ETIMEDOUT), base::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(base::ErrnoToStatusCode(EINVAL), base::StatusCode::kInvalidArgument);
  EXPECT_EQ(base::ErrnoToStatusCode(ECANCELED), base::StatusCode::kCancelled);
  EXPECT_EQ(base::ErrnoToStatusCode(ENOSYS), base::StatusCode::kUnimplemented);
  // No errno is data loss: a failed call loses nothing by itself.
  for (int e = 1; e < 200; ++e) EXPECT_NE(base::ErrnoToStatusCode(e), base::StatusCode::kDataLoss) << e;
  const base::Status st = base::ErrnoToStatus(ENOENT, "cannot open 'x'");
  EXPECT_TRUE(st.IsNotFound());
  EXPECT_EQ(st.message(), std::string("cannot open 'x': ") + std::strerror(ENOENT));
}

TEST(StatusTest, WithPrefixKeepsTheCode) {
  EXPECT_EQ(base::Status::NotFound("run 7").WithPrefix("GetSteps"), base::Status::NotFound("GetSteps: run 7"));
  EXPECT_TRUE(base::Status::Ok().WithPrefix("x").ok());
  EXPECT_NE(base::Status::NotFound("a"), base::Status::NotFound("b"));
  EXPECT_NE(base::Status::NotFound("a"), base::Status::Internal("a"));
}

TEST(StatusTest, CodesMatchGrpcNumberingAndNames) {
  // The numbering is grpc::StatusCode's; the names are gRPC's canonical ones.
  struct Case {
    base::StatusCode code;
    int number;
    const char* name;
  };
  const Case cases[] = {
      {base::StatusCode::kOk, 0, "OK"},
      {base::StatusCode::kCancelled, 1, "CANCELLED"},
      {base::StatusCode::kUnknown, 2, "UNKNOWN"},
      {base::StatusCode::kInvalidArgument, 3, "INVALID_ARGUMENT"},
      {base::StatusCode::kDeadlineExceeded, 4, "DEADLINE_EXCEEDED"},
      {base::StatusCode::kNotFound, 5, "NOT_FOUND"},
      {base::StatusCode::kAlreadyExists, 6, "ALREADY_EXISTS"},
      {base::StatusCode::kPermissionDenied, 7, "PERMISSION_DENIED"},
      {base::StatusCode::kResourceExhausted, 8, "RESOURCE_EXHAUSTED"},
      {base::StatusCode::kFailedPrecondition, 9, "FAILED_PRECONDITION"},
      {base::StatusCode::kAborted, 10, "ABORTED"},
      {base::StatusCode::kOutOfRange, 11, "OUT_OF_RANGE"},
      {base::StatusCode::kUnimplemented, 12, "UNIMPLEMENTED"},
      {base::StatusCode::kInternal, 13, "INTERNAL"},
      {base::StatusCode::kUnavailable, 14, "UNAVAILABLE"},
      {base::StatusCode::kDataLoss, 15, "DATA_LOSS"},
      {base::StatusCode::kUnauthenticated, 16, "UNAUTHENTICATED"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(static_cast<int>(c.code), c.number);
    EXPECT_STREQ(base::StatusCodeName(c.code), c.name);
  }
}

TEST(StatusTest, ToStringFormat) {
  EXPECT_EQ(base::Status::InvalidArgument("bad c_low").ToString(), "INVALID_ARGUMENT: bad c_low");
  EXPECT_EQ(base::Status(base::StatusCode::kUnauthenticated, "no token").ToString(), "UNAUTHENTICATED: no token");
  EXPECT_EQ(base::Status::DataLoss("torn record").ToString(), "DATA_LOSS: torn record");
  EXPECT_EQ(base::Status(base::StatusCode::kOk, "dropped").ToString(), "OK");
}

TEST(StatusTest, CopiesAreIndependentValues) {
  base::Status a = base::Status::NotFound("run 7");
  base::Status b = a;
  EXPECT_EQ(b.code(), base::StatusCode::kNotFound);
  EXPECT_EQ(b.message(), "run 7");
  a = base::Status::Ok();
  EXPECT_TRUE(a.ok());
  EXPECT_FALSE(b.ok());  // b does not alias a
  EXPECT_EQ(b.message(), "run 7");
}

TEST(StatusOrTest, HoldsValue) {
  base::StatusOr<int> v = 42;
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v.status().ok());
  EXPECT_EQ(v.value(), 42);
  EXPECT_EQ(*v, 42);
  *v = 7;
  EXPECT_EQ(v.value(), 7);

  base::StatusOr<std::string> s = std::string("abc");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size(), 3u);
}

TEST(StatusOrTest, HoldsError) {
  base::StatusOr<int> v = base::Status::NotFound("nope");
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), base::StatusCode::kNotFound);
  EXPECT_EQ(v.status().message(), "nope");
}

TEST(StatusOrTest, OkStatusWithoutValueBecomesInternal) {
  // Constructing from an OK status is a programming error; it must not
  // produce an "ok" StatusOr without a value.
  base::StatusOr<int> v = base::Status::Ok();
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), base::StatusCode::kInternal);
}

TEST(StatusOrTest, MoveOnlyValue) {
  base::StatusOr<std::unique_ptr<int>> v = std::make_unique<int>(5);
  ASSERT_TRUE(v.ok());
  std::unique_ptr<int> p = std::move(v).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 5);
}

// ---------------------------------------------------------------------------
// Names and parsing
// ---------------------------------------------------------------------------

TEST(NamesTest, RegimeNamesAndRoundTrip) {
  const std::pair<controller::Regime, const char*> cases[] = {
      {controller::Regime::kSafe, "safe"}, {controller::Regime::kProject, "project"}, {controller::Regime::kSkip, "skip"}, {controller::Regime::kInvalid, "invalid"}};
  for (const auto& [regime, name] : cases) {
    SCOPED_TRACE(name);
    EXPECT_STREQ(controller::RegimeName(regime), name);
    base::StatusOr<controller::Regime> parsed = controller::ParseRegime(name);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, regime);
  }
}

TEST(NamesTest, AlphaModeNamesAndRoundTrip) {
  const std::pair<controller::AlphaMode, const char*> cases[] = {{controller::AlphaMode::kPaper, "paper"}, {controller::AlphaMode::kExact, "exact"}};
  for (const auto& [mode, name] : cases) {
    SCOPED_TRACE(name);
    EXPECT_STREQ(controller::AlphaModeName(mode), name);
    base::StatusOr<controller::AlphaMode> parsed = controller::ParseAlphaMode(name);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, mode);
  }
}

TEST(NamesTest, ParseErrors) {
  for (const char* bad : {"", "Safe", "SAFE", "safe ", "projection", "unknown"}) {
    SCOPED_TRACE(bad);
    base::StatusOr<controller::Regime> r = controller::ParseRegime(bad);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), base::StatusCode::kInvalidArgument);
    // The message quotes what was given so a typo in a config is findable.
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
  }
  for (const char* bad : {"", "Paper", "EXACT", "exactly", "safe"}) {
    SCOPED_TRACE(bad);
    base::StatusOr<controller::AlphaMode> m = controller::ParseAlphaMode(bad);
    EXPECT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), base::StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << m.status().message();
  }
  EXPECT_EQ(controller::ParseRegime(nullptr).status().code(), base::StatusCode::kInvalidArgument);
  EXPECT_EQ(controller::ParseAlphaMode(nullptr).status().code(), base::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// ValidateThresholds / Controller::Create
// ---------------------------------------------------------------------------

struct BadThresholdsCase {
  const char* name;
  double c_low;
  double c_high;
  const char* must_mention;  // substring the message must contain
};

void PrintTo(const BadThresholdsCase& c, std::ostream* os) {
  *os << c.name << " (c_low=" << c.c_low << ", c_high=" << c.c_high << ")";
}

class BadThresholdsTest : public ::testing::TestWithParam<BadThresholdsCase> {};

TEST_P(BadThresholdsTest, Rejected) {
  const BadThresholdsCase& c = GetParam();
  const controller::Thresholds t{c.c_low, c.c_high};
  base::Status s = controller::ValidateThresholds(t);
  EXPECT_EQ(s.code(), base::StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(c.must_mention), std::string::npos) << s.message();

  for (controller::AlphaMode mode : {controller::AlphaMode::kPaper, controller::AlphaMode::kExact}) {
    base::StatusOr<controller::Controller> ctl = controller::Controller::Create(t, mode);
    EXPECT_FALSE(ctl.ok());
    EXPECT_EQ(ctl.status().code(), base::StatusCode::kInvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, BadThresholdsTest,
    ::testing::Values(BadThresholdsCase{"c_low_zero", 0.0, 0.3, "c_low"},
                      BadThresholdsCase{"c_low_negative", -0.05, 0.3, "c_low"},
                      BadThresholdsCase{"c_low_negative_zero", -0.0, 0.3, "c_low"},
                      BadThresholdsCase{"c_low_equals_c_high", 0.3, 0.3, "c_high"},
                      BadThresholdsCase{"c_low_above_c_high", 0.5, 0.3, "c_high"},
                      BadThresholdsCase{"c_high_above_one", 0.05, 1.0000001, "c_high"},
                      BadThresholdsCase{"c_high_two", 0.05, 2.0, "c_high"},
                      BadThresholdsCase{"c_low_nan", kNaN, 0.3, "finite"},
                      BadThresholdsCase{"c_high_nan", 0.05, kNaN, "finite"},
                      BadThresholdsCase{"c_low_inf", kInf, 0.3, "finite"},
                      BadThresholdsCase{"c_low_minus_inf", -kInf, 0.3, "finite"},
                      BadThresholdsCase{"c_high_inf", 0.05, kInf, "finite"}),
    [](const ::testing::TestParamInfo<BadThresholdsCase>& info) { return std::string(info.param.name); });

TEST(ValidateThresholdsTest, AcceptsValid) {
  for (const controller::Thresholds& t : {controller::Thresholds{}, controller::Thresholds{0.05, 0.3}, controller::Thresholds{0.05, 1.0}, controller::Thresholds{1e-9, 2e-9},
                              controller::Thresholds{0.999, 1.0}}) {
    SCOPED_TRACE(std::to_string(t.c_low) + " " + std::to_string(t.c_high));
    EXPECT_TRUE(controller::ValidateThresholds(t).ok()) << controller::ValidateThresholds(t).ToString();
    base::StatusOr<controller::Controller> ctl = controller::Controller::Create(t, controller::AlphaMode::kExact);
    ASSERT_TRUE(ctl.ok());
    EXPECT_EQ(ctl->thresholds().c_low, t.c_low);
    EXPECT_EQ(ctl->thresholds().c_high, t.c_high);
    EXPECT_EQ(ctl->mode(), controller::AlphaMode::kExact);
  }
}

TEST(ValidateThresholdsTest, DefaultsAreThePapers) {
  const controller::Thresholds t;
  EXPECT_EQ(t.c_low, 0.05);
  EXPECT_EQ(t.c_high, 0.3);
  base::StatusOr<controller::Controller> ctl = controller::Controller::Create(t);
  ASSERT_TRUE(ctl.ok());
  EXPECT_EQ(ctl->mode(), controller::AlphaMode::kPaper);
}

// ---------------------------------------------------------------------------
// Decide: regime boundaries
// ---------------------------------------------------------------------------

struct DecideCase {
  std::string name;
  controller::AlignmentStats stats;
  controller::Regime regime;
  bool has_cosine;
  double cosine;  // compared exactly when has_cosine
};

// The default thresholds (0.05, 0.3) for every row.
std::vector<DecideCase> BoundaryCases() {
  const double lo = 0.05;
  const double hi = 0.3;
  const double above_lo = std::nextafter(lo, 1.0);
  const double below_lo = std::nextafter(lo, 0.0);
  const double below_hi = std::nextafter(hi, 0.0);
  const double above_hi = std::nextafter(hi, 1.0);
  auto row = [](const char* name, double c, controller::Regime r) { return DecideCase{name, StatsForCosine(c), r, true, c}; };
  std::vector<DecideCase> rows = {
      row("zero", 0.0, controller::Regime::kSafe),
      row("inside_safe", 0.01, controller::Regime::kSafe),
      row("just_below_c_low", below_lo, controller::Regime::kSafe),
      row("exactly_c_low", lo, controller::Regime::kSafe),
      row("just_above_c_low", above_lo, controller::Regime::kProject),
      row("mid_band", 0.17, controller::Regime::kProject),
      row("just_below_c_high", below_hi, controller::Regime::kProject),
      row("exactly_c_high", hi, controller::Regime::kSkip),
      row("just_above_c_high", above_hi, controller::Regime::kSkip),
      row("one", 1.0, controller::Regime::kSkip),
      // Negative cosines: the regimes depend on |c| only.
      row("neg_inside_safe", -0.01, controller::Regime::kSafe),
      row("neg_exactly_c_low", -lo, controller::Regime::kSafe),
      row("neg_just_above_c_low", -above_lo, controller::Regime::kProject),
      row("neg_mid_band", -0.17, controller::Regime::kProject),
      row("neg_just_below_c_high", -below_hi, controller::Regime::kProject),
      row("neg_exactly_c_high", -hi, controller::Regime::kSkip),
      row("neg_one", -1.0, controller::Regime::kSkip),
  };
  // A zero gradient against a real reference: c = 0 / (0 + 1e-8) = 0, safe.
  rows.push_back({"zero_gg", controller::AlignmentStats{0.0, 0.0, 4.0, true}, controller::Regime::kSafe, true, 0.0});
  // No reference: safe, and there is no cosine to report.
  rows.push_back({"no_reference", controller::AlignmentStats{0.0, 1.0, 0.0, false}, controller::Regime::kSafe, false, 0.0});
  rows.push_back({"no_reference_nonzero_fields", controller::AlignmentStats{0.9, 1.0, 1.0, false}, controller::Regime::kSafe, false, 0.0});
  rows.push_back({"pp_zero", controller::AlignmentStats{0.0, 1.0, 0.0, true}, controller::Regime::kSafe, false, 0.0});
  rows.push_back({"pp_zero_gg_zero", controller::AlignmentStats{0.0, 0.0, 0.0, true}, controller::Regime::kSafe, false, 0.0});
  // A subnormal pp with c in the projection band: (1 - alpha) dot / pp
  // overflows to -inf (|g| = 1e153, |p| = 2.2e-162, c = -0.076). The
  // reference is numerically zero: safe, as pp == 0 (found by fuzzing).
  rows.push_back({"pp_subnormal_coefficient_overflows",
                  controller::AlignmentStats{-9.3132275225116241e-10, 1e306, 4.94065645841247e-324, true}, controller::Regime::kSafe, false,
                  0.0});
  // Non-finite inputs, in each field: invalid. A non-finite gradient must never
  // be stepped, reference or not.
  const struct {
    const char* name;
    double value;
  } bad[] = {{"nan", kNaN}, {"inf", kInf}, {"minus_inf", -kInf}};
  for (const auto& b : bad) {
    for (int field = 0; field < 3; ++field) {
      for (bool has_ref : {true, false}) {
        controller::AlignmentStats s = StatsForCosine(0.17);
        s.has_reference = has_ref;
        (field == 0 ? s.dot : field == 1 ? s.grad_sq : s.ref_sq) = b.value;
        const std::string name =
            std::string(field == 0 ? "dot_" : field == 1 ? "gg_" : "pp_") + b.name + (has_ref ? "" : "_no_ref");
        rows.push_back({name, s, controller::Regime::kInvalid, false, 0.0});
      }
    }
  }
  return rows;
}

void PrintTo(const DecideCase& c, std::ostream* os) {
  *os << c.name << " (dot=" << c.stats.dot << ", gg=" << c.stats.grad_sq << ", pp=" << c.stats.ref_sq
      << ", has_reference=" << c.stats.has_reference << ")";
}

class DecideBoundaryTest : public ::testing::TestWithParam<DecideCase> {};

TEST_P(DecideBoundaryTest, RegimeAndFields) {
  const DecideCase& c = GetParam();
  for (controller::AlphaMode mode : {controller::AlphaMode::kPaper, controller::AlphaMode::kExact}) {
    SCOPED_TRACE(controller::AlphaModeName(mode));
    const controller::Controller ctl = MakeController(0.05, 0.3, mode);
    const controller::Decision d = ctl.Decide(c.stats);
    EXPECT_EQ(d.regime, c.regime) << controller::RegimeName(d.regime);
    ASSERT_EQ(d.cosine.has_value(), c.has_cosine);
    if (c.has_cosine) {
      EXPECT_EQ(*d.cosine, c.cosine);
    }
    switch (c.regime) {
      case controller::Regime::kSafe:
        EXPECT_TRUE(d.apply_update);
        EXPECT_EQ(d.alpha, 1.0);
        EXPECT_EQ(d.projection_coeff, 0.0);
        // Safe leaves the gradient untouched: the applied cosine is c itself.
        EXPECT_EQ(d.cosine_after.has_value(), c.has_cosine);
        if (c.has_cosine && d.cosine_after) {
          EXPECT_EQ(*d.cosine_after, c.cosine);
        }
        break;
      case controller::Regime::kProject:
        EXPECT_TRUE(d.apply_update);
        EXPECT_GT(d.alpha, 0.0);
        // One ulp above c_low alpha is 1 up to rounding; away from it, < 1.
        EXPECT_LE(d.alpha, 1.0 + 1e-12);
        if (std::fabs(c.cosine) > 0.05 * (1.0 + 1e-9)) {
          EXPECT_LT(d.alpha, 1.0 - 1e-9);
        }
        // g' = g - (1 - alpha) (dot/pp) p.
        EXPECT_DOUBLE_EQ(d.projection_coeff, (1.0 - d.alpha) * c.stats.dot / c.stats.ref_sq);
        ASSERT_TRUE(d.cosine_after.has_value());
        // The projection reduces |c| but keeps its sign.
        EXPECT_LE(std::fabs(*d.cosine_after), std::fabs(c.cosine) * (1.0 + 1e-12));
        EXPECT_GE(std::fabs(*d.cosine_after), 0.05 * (1.0 - 1e-12));
        EXPECT_EQ(std::signbit(*d.cosine_after), std::signbit(c.cosine));
        break;
      case controller::Regime::kSkip:
      case controller::Regime::kInvalid:
      case controller::Regime::kSpike:  // the guard's, never Decide's: no case expects it
        EXPECT_FALSE(d.apply_update);
        EXPECT_FALSE(d.cosine_after.has_value());
        EXPECT_EQ(d.projection_coeff, 0.0);
        break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, DecideBoundaryTest, ::testing::ValuesIn(BoundaryCases()),
                         [](const ::testing::TestParamInfo<DecideCase>& info) { return info.param.name; });

TEST(DecideTest, NegativeSumOfSquaresIsInvalid) {
  // gg and pp are sums of squares; a negative one (a corrupted or hostile
  // stats message) must not turn into a NaN projection that gets applied.
  const controller::Controller ctl = MakeController(0.05, 0.3);
  for (const controller::AlignmentStats& s : {controller::AlignmentStats{0.5, -1.0, 1.0, true}, controller::AlignmentStats{0.5, 1.0, -1.0, true},
                                  controller::AlignmentStats{0.5, -1.0, -1.0, true}, controller::AlignmentStats{0.0, -1.0, 0.0, false}}) {
    SCOPED_TRACE(std::to_string(s.grad_sq) + " " + std::to_string(s.ref_sq));
    const controller::Decision d = ctl.Decide(s);
    EXPECT_EQ(d.regime, controller::Regime::kInvalid);
    EXPECT_FALSE(d.apply_update);
    EXPECT_FALSE(d.cosine.has_value());
    EXPECT_EQ(d.projection_coeff, 0.0);
  }
}

TEST(DecideTest, BoundaryFollowsConfiguredThresholds) {
  // The same cosine lands in different regimes with different thresholds.
  const controller::AlignmentStats s = StatsForCosine(0.25);
  EXPECT_EQ(MakeController(0.25, 0.5).Decide(s).regime, controller::Regime::kSafe);
  EXPECT_EQ(MakeController(0.1, 0.5).Decide(s).regime, controller::Regime::kProject);
  EXPECT_EQ(MakeController(0.1, 0.25).Decide(s).regime, controller::Regime::kSkip);
  // With c_high == 1 nothing short of a perfectly aligned gradient is skipped.
  const controller::Controller wide = MakeController(0.05, 1.0);
  EXPECT_EQ(wide.Decide(StatsForCosine(std::nextafter(1.0, 0.0))).regime, controller::Regime::kProject);
  EXPECT_EQ(wide.Decide(StatsForCosine(1.0)).regime, controller::Regime::kSkip);
  EXPECT_EQ(wide.Decide(StatsForCosine(-1.0)).regime, controller::Regime::kSkip);
}

TEST(DecideTest, EpsilonInTheDenominator) {
  // |g| = |p| = 1e-4, true cosine 0.4: with the paper's 1e-8 in the
  // denominator c = 0.4e-8 / (1e-8 + 1e-8) = 0.2, which is in the projection
  // band of the defaults although the true cosine is above c_high.
  const controller::AlignmentStats s{0.4e-8, 1e-8, 1e-8, true};
  const controller::Decision d = MakeController(0.05, 0.3).Decide(s);
  ASSERT_TRUE(d.cosine.has_value());
  EXPECT_NEAR(*d.cosine, 0.2, 1e-12);
  EXPECT_EQ(d.regime, controller::Regime::kProject);
  EXPECT_NEAR(d.alpha, 0.05 / 0.2, 1e-12);
  // cosine_after is the geometric cosine of (g', p): the true cosine 0.4 with
  // its parallel part scaled by alpha = 0.25.
  const double ac = 0.25 * 0.4;
  EXPECT_NEAR(*d.cosine_after, ac / std::sqrt(ac * ac + 1.0 - 0.4 * 0.4), 1e-9);
}

TEST(DecideTest, NormsReported) {
  const controller::Decision d = MakeController(0.05, 0.3).Decide(controller::AlignmentStats{1.0, 9.0, 16.0, true});
  EXPECT_EQ(d.grad_norm, 3.0);
  EXPECT_EQ(d.ref_norm, 4.0);
  const controller::Decision first = MakeController(0.05, 0.3).Decide(controller::AlignmentStats{0.0, 25.0, 0.0, false});
  EXPECT_EQ(first.grad_norm, 5.0);
  EXPECT_EQ(first.ref_norm, 0.0);
}

TEST(AlphaTest, PaperAndExactFormulas) {
  // Independent closed forms from docs/ALGORITHM.md, over the band and both signs.
  const double lo = 0.05;
  const controller::Controller paper = MakeController(lo, 1.0, controller::AlphaMode::kPaper);
  const controller::Controller exact = MakeController(lo, 1.0, controller::AlphaMode::kExact);
  for (double c : {0.051, 0.1, 0.2, 0.3, 0.5, 0.9, 0.99}) {
    for (double sign : {1.0, -1.0}) {
      SCOPED_TRACE(sign * c);
      EXPECT_NEAR(paper.Alpha(sign * c), lo / c, 1e-15);
      const double want = lo * std::sqrt(1.0 - c * c) / (c * std::sqrt(1.0 - lo * lo));
      EXPECT_NEAR(exact.Alpha(sign * c), want, 1e-15);
      // Exact mode projects harder than paper mode: sqrt(1-c^2) < sqrt(1-lo^2).
      EXPECT_LT(exact.Alpha(sign * c), paper.Alpha(sign * c));
    }
  }
}

TEST(CosineAfterProjectionTest, ClosedForm) {
  // g = c u + s w (s = sqrt(1-c^2)); scaling the u part by alpha gives
  // cos = alpha c / sqrt(alpha^2 c^2 + s^2).
  for (double c : {-0.9, -0.2, 0.0, 0.1, 0.3, 0.7}) {
    for (double alpha : {0.0, 0.1, 0.5, 1.0}) {
      SCOPED_TRACE(std::to_string(c) + " " + std::to_string(alpha));
      const double want = alpha * c / std::sqrt(alpha * alpha * c * c + 1.0 - c * c);
      EXPECT_NEAR(controller::CosineAfterProjection(c, alpha), want, 1e-15);
    }
  }
  // alpha = 1 leaves the cosine unchanged.
  EXPECT_NEAR(controller::CosineAfterProjection(0.42, 1.0), 0.42, 1e-15);
  // Parallel gradient fully removed: g' = 0, reported as 0 rather than NaN.
  EXPECT_EQ(controller::CosineAfterProjection(1.0, 0.0), 0.0);
}

// ---------------------------------------------------------------------------
// Decide: projection properties on explicit random vectors
// ---------------------------------------------------------------------------

struct PropertyCase {
  std::size_t dim;
  double c_low;
  double c_high;
  int trials;
};

void PrintTo(const PropertyCase& c, std::ostream* os) {
  *os << "dim=" << c.dim << " c_low=" << c.c_low << " c_high=" << c.c_high << " trials=" << c.trials;
}

class ProjectionPropertyTest : public ::testing::TestWithParam<std::tuple<PropertyCase, controller::AlphaMode>> {};

TEST_P(ProjectionPropertyTest, MeasuredCosineAfterProjection) {
  const auto& [pc, mode] = GetParam();
  const controller::Controller ctl = MakeController(pc.c_low, pc.c_high, mode);
  std::mt19937_64 rng(0x9ac0000 + pc.dim * 31 + static_cast<int>(mode));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> band(pc.c_low, pc.c_high);
  // Norms between 1e2 and 1e5, so that the 1e-8 in the cosine's denominator
  // is below 1e-12 relative and the measured cosine can be held to 1e-9.
  std::uniform_real_distribution<double> log_norm(2.0, 5.0);
  std::bernoulli_distribution coin(0.5);

  const std::size_t n = pc.dim;
  std::vector<double> u(n), w(n), g(n), p(n), g2(n);
  int checked = 0;
  for (int trial = 0; trial < pc.trials; ++trial) {
    // Random orthonormal pair (u, w) by Gram-Schmidt.
    for (std::size_t i = 0; i < n; ++i) u[i] = normal(rng);
    const double nu = std::sqrt(Dot(u, u));
    for (double& x : u) x /= nu;
    for (std::size_t i = 0; i < n; ++i) w[i] = normal(rng);
    const double uw = Dot(u, w);
    for (std::size_t i = 0; i < n; ++i) w[i] -= uw * u[i];
    const double nw = std::sqrt(Dot(w, w));
    for (double& x : w) x /= nw;

    double c = band(rng);
    if (c <= pc.c_low || c >= pc.c_high) continue;  // open band only
    if (coin(rng)) c = -c;
    const double g_norm = std::pow(10.0, log_norm(rng));
    const double p_norm = std::pow(10.0, log_norm(rng));
    const double s = std::sqrt(1.0 - c * c);
    for (std::size_t i = 0; i < n; ++i) {
      g[i] = g_norm * (c * u[i] + s * w[i]);
      p[i] = p_norm * u[i];
    }
    const controller::AlignmentStats stats{Dot(g, p), Dot(g, g), Dot(p, p), true};
    const double c_measured = Cosine(g, p);
    SCOPED_TRACE("trial " + std::to_string(trial) + " c=" + std::to_string(c_measured));

    const controller::Decision d = ctl.Decide(stats);
    ASSERT_EQ(d.regime, controller::Regime::kProject);
    ASSERT_TRUE(d.apply_update);
    ASSERT_TRUE(d.cosine.has_value());
    EXPECT_NEAR(*d.cosine, c_measured, 1e-10);

    for (std::size_t i = 0; i < n; ++i) g2[i] = g[i] - d.projection_coeff * p[i];
    const double after = Cosine(g2, p);

    // The target, from the closed forms in docs/ALGORITHM.md.
    const double lo = pc.c_low;
    const double want_abs =
        mode == controller::AlphaMode::kExact ? lo : lo / std::sqrt(lo * lo + 1.0 - c_measured * c_measured);
    EXPECT_NEAR(after, std::copysign(want_abs, c_measured), 1e-9 * want_abs);
    if (mode == controller::AlphaMode::kPaper) {
      EXPECT_NEAR(d.alpha, lo / std::fabs(c_measured), 1e-9 * d.alpha);
    }
    ASSERT_TRUE(d.cosine_after.has_value());
    EXPECT_NEAR(*d.cosine_after, after, 1e-9 * want_abs);

    // Only the component along p changes: it is scaled by alpha.
    const double pp = stats.ref_sq;
    const double par_before = stats.dot / pp;
    const double par_after = Dot(g2, p) / pp;
    EXPECT_NEAR(par_after, d.alpha * par_before, 1e-9 * std::fabs(par_before));
    double perp_diff2 = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double perp_before = g[i] - par_before * p[i];
      const double perp_after = g2[i] - par_after * p[i];
      perp_diff2 += (perp_after - perp_before) * (perp_after - perp_before);
    }
    EXPECT_LE(std::sqrt(perp_diff2), 1e-10 * g_norm);
    ++checked;
  }
  // Only a draw exactly on c_low is skipped; nearly every trial must count.
  EXPECT_GE(checked, pc.trials - 1);
}

INSTANTIATE_TEST_SUITE_P(
    Dims, ProjectionPropertyTest,
    ::testing::Combine(::testing::Values(PropertyCase{2, 0.05, 0.3, 2000}, PropertyCase{3, 0.05, 0.3, 2000},
                                         PropertyCase{17, 0.1, 0.9, 1000}, PropertyCase{256, 0.2, 1.0, 300},
                                         PropertyCase{1000, 0.05, 0.3, 100}, PropertyCase{10000, 0.05, 0.99, 20}),
                       ::testing::Values(controller::AlphaMode::kPaper, controller::AlphaMode::kExact)),
    [](const ::testing::TestParamInfo<std::tuple<PropertyCase, controller::AlphaMode>>& info) {
      const PropertyCase& pc = std::get<0>(info.param);
      return "dim" + std::to_string(pc.dim) + "_" + controller::AlphaModeName(std::get<1>(info.param));
    });

TEST(DecideRandomTest, RegimesAgreeWithReference) {
  // Random scalar triples across all regimes: the regime must be the one the
  // docs/ALGORITHM.md rules give for the cosine computed here.
  const double lo = 0.05;
  const double hi = 0.3;
  const controller::Controller ctl = MakeController(lo, hi, controller::AlphaMode::kExact);
  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<double> cos_dist(-1.0, 1.0);
  std::uniform_real_distribution<double> log_norm(-6.0, 6.0);
  int counts[4] = {0, 0, 0, 0};
  for (int trial = 0; trial < 20000; ++trial) {
    const double c = cos_dist(rng) * (trial % 2 ? 1.0 : 0.4);  // half the trials near the band
    const double gn = std::pow(10.0, log_norm(rng));
    const double pn = std::pow(10.0, log_norm(rng));
    const controller::AlignmentStats s{c * gn * pn, gn * gn, pn * pn, true};
    const double ref_c = s.dot / (std::sqrt(s.grad_sq * s.ref_sq) + 1e-8);
    const controller::Regime want = std::fabs(ref_c) <= lo ? controller::Regime::kSafe : std::fabs(ref_c) >= hi ? controller::Regime::kSkip
                                                                                       : controller::Regime::kProject;
    const controller::Decision d = ctl.Decide(s);
    ASSERT_EQ(d.regime, want) << "trial " << trial << " c=" << ref_c;
    ASSERT_TRUE(d.cosine.has_value());
    // |g|*|p| and sqrt(gg*pp) may differ in the last bit.
    EXPECT_DOUBLE_EQ(*d.cosine, ref_c);
    EXPECT_EQ(d.apply_update, want != controller::Regime::kSkip);
    ++counts[static_cast<int>(d.regime)];
  }
  // The sample must actually exercise the three regimes.
  EXPECT_GT(counts[0], 1000);
  EXPECT_GT(counts[1], 1000);
  EXPECT_GT(counts[2], 1000);
}

TEST(RegimeForCosineTest, AgreesWithDecideOnTheReportedCosine) {
  // gacctl replays recorded steps from their reported c_t alone: the regime
  // of that cosine must be the regime Decide chose, for every threshold pair,
  // including cosines that sit exactly on a threshold.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> cos_dist(-0.6, 0.6);
  std::uniform_real_distribution<double> log_norm(-3.0, 3.0);
  const controller::Controller controllers[] = {MakeController(0.05, 0.3), MakeController(0.02, 0.1),
                                    MakeController(0.1, 1.0, controller::AlphaMode::kExact)};
  for (const controller::Controller& ctl : controllers) {
    for (int trial = 0; trial < 5000; ++trial) {
      const double gn = std::pow(10.0, log_norm(rng));
      const double pn = std::pow(10.0, log_norm(rng));
      const double c = cos_dist(rng);
      const controller::Decision d = ctl.Decide(controller::AlignmentStats{c * gn * pn, gn * gn, pn * pn, true});
      ASSERT_TRUE(d.cosine.has_value());
      ASSERT_EQ(ctl.RegimeForCosine(*d.cosine), d.regime) << "c=" << *d.cosine;
    }
    const controller::Thresholds& t = ctl.thresholds();
    EXPECT_EQ(ctl.RegimeForCosine(t.c_low), controller::Regime::kSafe);
    EXPECT_EQ(ctl.RegimeForCosine(-t.c_low), controller::Regime::kSafe);
    EXPECT_EQ(ctl.RegimeForCosine(std::nextafter(t.c_low, 1.0)), controller::Regime::kProject);
    EXPECT_EQ(ctl.RegimeForCosine(std::nextafter(t.c_high, 0.0)), controller::Regime::kProject);
    EXPECT_EQ(ctl.RegimeForCosine(t.c_high), controller::Regime::kSkip);
    EXPECT_EQ(ctl.RegimeForCosine(-t.c_high), controller::Regime::kSkip);
  }
}

TEST(DecideTest, HugeNormsDoNotOverflowTheCosine) {
  // gg * pp = 1e400 overflows a double; the cosine must still be 0.5.
  const controller::Controller ctl = MakeController(0.05, 0.3, controller::AlphaMode::kPaper);
  const controller::Decision d = ctl.Decide(controller::AlignmentStats{0.5e200, 1e200, 1e200, true});
  ASSERT_TRUE(d.cosine.has_value());
  EXPECT_DOUBLE_EQ(*d.cosine, 0.5);
  EXPECT_EQ(d.regime, controller::Regime::kSkip);
}

}  // namespace
}  // namespace gac
