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
#include "gac/status.h"

namespace gac {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

Controller MakeController(double c_low, double c_high, AlphaMode mode = AlphaMode::kPaper) {
  StatusOr<Controller> c = Controller::Create(Thresholds{c_low, c_high}, mode);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

// Statistics whose cosine c = dot / (sqrt(gg*pp) + 1e-8) equals `cosine`
// bit for bit. With gg = pp = 2^60, sqrt(gg*pp) = 2^60 exactly and adding
// 1e-8 (far below half an ulp of 2^60, which is 128) leaves it unchanged, so
// the denominator is a power of two and dot = cosine * 2^60 divides back to
// exactly `cosine` whatever the rounding mode of the multiplication.
AlignmentStats StatsForCosine(double cosine) {
  const double n = std::ldexp(1.0, 60);
  AlignmentStats s;
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
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(StatusTest, OkCodeWithMessageIsStillOk) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
  struct Case {
    Status status;
    StatusCode code;
  };
  const Case cases[] = {
      {Status::Cancelled("m"), StatusCode::kCancelled},
      {Status::Unknown("m"), StatusCode::kUnknown},
      {Status::InvalidArgument("m"), StatusCode::kInvalidArgument},
      {Status::DeadlineExceeded("m"), StatusCode::kDeadlineExceeded},
      {Status::NotFound("m"), StatusCode::kNotFound},
      {Status::AlreadyExists("m"), StatusCode::kAlreadyExists},
      {Status::PermissionDenied("m"), StatusCode::kPermissionDenied},
      {Status::ResourceExhausted("m"), StatusCode::kResourceExhausted},
      {Status::FailedPrecondition("m"), StatusCode::kFailedPrecondition},
      {Status::Aborted("m"), StatusCode::kAborted},
      {Status::OutOfRange("m"), StatusCode::kOutOfRange},
      {Status::Unimplemented("m"), StatusCode::kUnimplemented},
      {Status::Internal("m"), StatusCode::kInternal},
      {Status::Unavailable("m"), StatusCode::kUnavailable},
      {Status::DataLoss("m"), StatusCode::kDataLoss},
      {Status::Unauthenticated("m"), StatusCode::kUnauthenticated},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(StatusCodeName(c.code));
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.message(), "m");
  }
  EXPECT_EQ(std::size(cases), 16u) << "one factory per non-OK code";
}

TEST(StatusTest, EachPredicateIsTrueForItsCodeOnly) {
  using Predicate = bool (Status::*)() const;
  const std::pair<StatusCode, Predicate> predicates[] = {
      {StatusCode::kCancelled, &Status::IsCancelled},
      {StatusCode::kUnknown, &Status::IsUnknown},
      {StatusCode::kInvalidArgument, &Status::IsInvalidArgument},
      {StatusCode::kDeadlineExceeded, &Status::IsDeadlineExceeded},
      {StatusCode::kNotFound, &Status::IsNotFound},
      {StatusCode::kAlreadyExists, &Status::IsAlreadyExists},
      {StatusCode::kPermissionDenied, &Status::IsPermissionDenied},
      {StatusCode::kResourceExhausted, &Status::IsResourceExhausted},
      {StatusCode::kFailedPrecondition, &Status::IsFailedPrecondition},
      {StatusCode::kAborted, &Status::IsAborted},
      {StatusCode::kOutOfRange, &Status::IsOutOfRange},
      {StatusCode::kUnimplemented, &Status::IsUnimplemented},
      {StatusCode::kInternal, &Status::IsInternal},
      {StatusCode::kUnavailable, &Status::IsUnavailable},
      {StatusCode::kDataLoss, &Status::IsDataLoss},
      {StatusCode::kUnauthenticated, &Status::IsUnauthenticated},
  };
  for (int code = 0; code <= 16; ++code) {
    const Status status(static_cast<StatusCode>(code), "m");
    for (const auto& [predicate_code, predicate] : predicates) {
      SCOPED_TRACE(std::string(StatusCodeName(status.code())) + " vs " + StatusCodeName(predicate_code));
      EXPECT_EQ((status.*predicate)(), static_cast<int>(predicate_code) == code);
    }
  }
}

TEST(StatusTest, ErrnoMapsToTheCodeOfWhatWentWrong) {
  EXPECT_EQ(ErrnoToStatusCode(0), StatusCode::kOk);
  EXPECT_EQ(ErrnoToStatusCode(ENOENT), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatusCode(EACCES), StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatusCode(EROFS), StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatusCode(ENOSPC), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatusCode(EMFILE), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatusCode(EEXIST), StatusCode::kAlreadyExists);
  EXPECT_EQ(ErrnoToStatusCode(ENOTDIR), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrnoToStatusCode(EIO), StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoToStatusCode(EINTR), StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoToStatusCode(ETIMEDOUT), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ErrnoToStatusCode(EINVAL), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoToStatusCode(ECANCELED), StatusCode::kCancelled);
  EXPECT_EQ(ErrnoToStatusCode(ENOSYS), StatusCode::kUnimplemented);
  // No errno is data loss: a failed call loses nothing by itself.
  for (int e = 1; e < 200; ++e) EXPECT_NE(ErrnoToStatusCode(e), StatusCode::kDataLoss) << e;
  const Status st = ErrnoToStatus(ENOENT, "cannot open 'x'");
  EXPECT_TRUE(st.IsNotFound());
  EXPECT_EQ(st.message(), std::string("cannot open 'x': ") + std::strerror(ENOENT));
}

TEST(StatusTest, WithPrefixKeepsTheCode) {
  EXPECT_EQ(Status::NotFound("run 7").WithPrefix("GetSteps"), Status::NotFound("GetSteps: run 7"));
  EXPECT_TRUE(Status::Ok().WithPrefix("x").ok());
  EXPECT_NE(Status::NotFound("a"), Status::NotFound("b"));
  EXPECT_NE(Status::NotFound("a"), Status::Internal("a"));
}

TEST(StatusTest, CodesMatchGrpcNumberingAndNames) {
  // The numbering is grpc::StatusCode's; the names are gRPC's canonical ones.
  struct Case {
    StatusCode code;
    int number;
    const char* name;
  };
  const Case cases[] = {
      {StatusCode::kOk, 0, "OK"},
      {StatusCode::kCancelled, 1, "CANCELLED"},
      {StatusCode::kUnknown, 2, "UNKNOWN"},
      {StatusCode::kInvalidArgument, 3, "INVALID_ARGUMENT"},
      {StatusCode::kDeadlineExceeded, 4, "DEADLINE_EXCEEDED"},
      {StatusCode::kNotFound, 5, "NOT_FOUND"},
      {StatusCode::kAlreadyExists, 6, "ALREADY_EXISTS"},
      {StatusCode::kPermissionDenied, 7, "PERMISSION_DENIED"},
      {StatusCode::kResourceExhausted, 8, "RESOURCE_EXHAUSTED"},
      {StatusCode::kFailedPrecondition, 9, "FAILED_PRECONDITION"},
      {StatusCode::kAborted, 10, "ABORTED"},
      {StatusCode::kOutOfRange, 11, "OUT_OF_RANGE"},
      {StatusCode::kUnimplemented, 12, "UNIMPLEMENTED"},
      {StatusCode::kInternal, 13, "INTERNAL"},
      {StatusCode::kUnavailable, 14, "UNAVAILABLE"},
      {StatusCode::kDataLoss, 15, "DATA_LOSS"},
      {StatusCode::kUnauthenticated, 16, "UNAUTHENTICATED"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(static_cast<int>(c.code), c.number);
    EXPECT_STREQ(StatusCodeName(c.code), c.name);
  }
}

TEST(StatusTest, ToStringFormat) {
  EXPECT_EQ(Status::InvalidArgument("bad c_low").ToString(), "INVALID_ARGUMENT: bad c_low");
  EXPECT_EQ(Status(StatusCode::kUnauthenticated, "no token").ToString(), "UNAUTHENTICATED: no token");
  EXPECT_EQ(Status::DataLoss("torn record").ToString(), "DATA_LOSS: torn record");
  EXPECT_EQ(Status(StatusCode::kOk, "dropped").ToString(), "OK");
}

TEST(StatusTest, CopiesAreIndependentValues) {
  Status a = Status::NotFound("run 7");
  Status b = a;
  EXPECT_EQ(b.code(), StatusCode::kNotFound);
  EXPECT_EQ(b.message(), "run 7");
  a = Status::Ok();
  EXPECT_TRUE(a.ok());
  EXPECT_FALSE(b.ok());  // b does not alias a
  EXPECT_EQ(b.message(), "run 7");
}

TEST(StatusOrTest, HoldsValue) {
  StatusOr<int> v = 42;
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v.status().ok());
  EXPECT_EQ(v.value(), 42);
  EXPECT_EQ(*v, 42);
  *v = 7;
  EXPECT_EQ(v.value(), 7);

  StatusOr<std::string> s = std::string("abc");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size(), 3u);
}

TEST(StatusOrTest, HoldsError) {
  StatusOr<int> v = Status::NotFound("nope");
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(v.status().message(), "nope");
}

TEST(StatusOrTest, OkStatusWithoutValueBecomesInternal) {
  // Constructing from an OK status is a programming error; it must not
  // produce an "ok" StatusOr without a value.
  StatusOr<int> v = Status::Ok();
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
}

TEST(StatusOrTest, MoveOnlyValue) {
  StatusOr<std::unique_ptr<int>> v = std::make_unique<int>(5);
  ASSERT_TRUE(v.ok());
  std::unique_ptr<int> p = std::move(v).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 5);
}

// ---------------------------------------------------------------------------
// Names and parsing
// ---------------------------------------------------------------------------

TEST(NamesTest, RegimeNamesAndRoundTrip) {
  const std::pair<Regime, const char*> cases[] = {
      {Regime::kSafe, "safe"}, {Regime::kProject, "project"}, {Regime::kSkip, "skip"}, {Regime::kInvalid, "invalid"}};
  for (const auto& [regime, name] : cases) {
    SCOPED_TRACE(name);
    EXPECT_STREQ(RegimeName(regime), name);
    StatusOr<Regime> parsed = ParseRegime(name);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, regime);
  }
}

TEST(NamesTest, AlphaModeNamesAndRoundTrip) {
  const std::pair<AlphaMode, const char*> cases[] = {{AlphaMode::kPaper, "paper"}, {AlphaMode::kExact, "exact"}};
  for (const auto& [mode, name] : cases) {
    SCOPED_TRACE(name);
    EXPECT_STREQ(AlphaModeName(mode), name);
    StatusOr<AlphaMode> parsed = ParseAlphaMode(name);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, mode);
  }
}

TEST(NamesTest, ParseErrors) {
  for (const char* bad : {"", "Safe", "SAFE", "safe ", "projection", "unknown"}) {
    SCOPED_TRACE(bad);
    StatusOr<Regime> r = ParseRegime(bad);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    // The message quotes what was given so a typo in a config is findable.
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
  }
  for (const char* bad : {"", "Paper", "EXACT", "exactly", "safe"}) {
    SCOPED_TRACE(bad);
    StatusOr<AlphaMode> m = ParseAlphaMode(bad);
    EXPECT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << m.status().message();
  }
  EXPECT_EQ(ParseRegime(nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseAlphaMode(nullptr).status().code(), StatusCode::kInvalidArgument);
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
  const Thresholds t{c.c_low, c.c_high};
  Status s = ValidateThresholds(t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(c.must_mention), std::string::npos) << s.message();

  for (AlphaMode mode : {AlphaMode::kPaper, AlphaMode::kExact}) {
    StatusOr<Controller> ctl = Controller::Create(t, mode);
    EXPECT_FALSE(ctl.ok());
    EXPECT_EQ(ctl.status().code(), StatusCode::kInvalidArgument);
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
  for (const Thresholds& t : {Thresholds{}, Thresholds{0.05, 0.3}, Thresholds{0.05, 1.0}, Thresholds{1e-9, 2e-9},
                              Thresholds{0.999, 1.0}}) {
    SCOPED_TRACE(std::to_string(t.c_low) + " " + std::to_string(t.c_high));
    EXPECT_TRUE(ValidateThresholds(t).ok()) << ValidateThresholds(t).ToString();
    StatusOr<Controller> ctl = Controller::Create(t, AlphaMode::kExact);
    ASSERT_TRUE(ctl.ok());
    EXPECT_EQ(ctl->thresholds().c_low, t.c_low);
    EXPECT_EQ(ctl->thresholds().c_high, t.c_high);
    EXPECT_EQ(ctl->mode(), AlphaMode::kExact);
  }
}

TEST(ValidateThresholdsTest, DefaultsAreThePapers) {
  const Thresholds t;
  EXPECT_EQ(t.c_low, 0.05);
  EXPECT_EQ(t.c_high, 0.3);
  StatusOr<Controller> ctl = Controller::Create(t);
  ASSERT_TRUE(ctl.ok());
  EXPECT_EQ(ctl->mode(), AlphaMode::kPaper);
}

// ---------------------------------------------------------------------------
// Decide: regime boundaries
// ---------------------------------------------------------------------------

struct DecideCase {
  std::string name;
  AlignmentStats stats;
  Regime regime;
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
  auto row = [](const char* name, double c, Regime r) { return DecideCase{name, StatsForCosine(c), r, true, c}; };
  std::vector<DecideCase> rows = {
      row("zero", 0.0, Regime::kSafe),
      row("inside_safe", 0.01, Regime::kSafe),
      row("just_below_c_low", below_lo, Regime::kSafe),
      row("exactly_c_low", lo, Regime::kSafe),
      row("just_above_c_low", above_lo, Regime::kProject),
      row("mid_band", 0.17, Regime::kProject),
      row("just_below_c_high", below_hi, Regime::kProject),
      row("exactly_c_high", hi, Regime::kSkip),
      row("just_above_c_high", above_hi, Regime::kSkip),
      row("one", 1.0, Regime::kSkip),
      // Negative cosines: the regimes depend on |c| only.
      row("neg_inside_safe", -0.01, Regime::kSafe),
      row("neg_exactly_c_low", -lo, Regime::kSafe),
      row("neg_just_above_c_low", -above_lo, Regime::kProject),
      row("neg_mid_band", -0.17, Regime::kProject),
      row("neg_just_below_c_high", -below_hi, Regime::kProject),
      row("neg_exactly_c_high", -hi, Regime::kSkip),
      row("neg_one", -1.0, Regime::kSkip),
  };
  // A zero gradient against a real reference: c = 0 / (0 + 1e-8) = 0, safe.
  rows.push_back({"zero_gg", AlignmentStats{0.0, 0.0, 4.0, true}, Regime::kSafe, true, 0.0});
  // No reference: safe, and there is no cosine to report.
  rows.push_back({"no_reference", AlignmentStats{0.0, 1.0, 0.0, false}, Regime::kSafe, false, 0.0});
  rows.push_back({"no_reference_nonzero_fields", AlignmentStats{0.9, 1.0, 1.0, false}, Regime::kSafe, false, 0.0});
  rows.push_back({"pp_zero", AlignmentStats{0.0, 1.0, 0.0, true}, Regime::kSafe, false, 0.0});
  rows.push_back({"pp_zero_gg_zero", AlignmentStats{0.0, 0.0, 0.0, true}, Regime::kSafe, false, 0.0});
  // A subnormal pp with c in the projection band: (1 - alpha) dot / pp
  // overflows to -inf (|g| = 1e153, |p| = 2.2e-162, c = -0.076). The
  // reference is numerically zero: safe, as pp == 0 (found by fuzzing).
  rows.push_back({"pp_subnormal_coefficient_overflows",
                  AlignmentStats{-9.3132275225116241e-10, 1e306, 4.94065645841247e-324, true}, Regime::kSafe, false,
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
        AlignmentStats s = StatsForCosine(0.17);
        s.has_reference = has_ref;
        (field == 0 ? s.dot : field == 1 ? s.grad_sq : s.ref_sq) = b.value;
        const std::string name =
            std::string(field == 0 ? "dot_" : field == 1 ? "gg_" : "pp_") + b.name + (has_ref ? "" : "_no_ref");
        rows.push_back({name, s, Regime::kInvalid, false, 0.0});
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
  for (AlphaMode mode : {AlphaMode::kPaper, AlphaMode::kExact}) {
    SCOPED_TRACE(AlphaModeName(mode));
    const Controller ctl = MakeController(0.05, 0.3, mode);
    const Decision d = ctl.Decide(c.stats);
    EXPECT_EQ(d.regime, c.regime) << RegimeName(d.regime);
    ASSERT_EQ(d.cosine.has_value(), c.has_cosine);
    if (c.has_cosine) {
      EXPECT_EQ(*d.cosine, c.cosine);
    }
    switch (c.regime) {
      case Regime::kSafe:
        EXPECT_TRUE(d.apply_update);
        EXPECT_EQ(d.alpha, 1.0);
        EXPECT_EQ(d.projection_coeff, 0.0);
        // Safe leaves the gradient untouched: the applied cosine is c itself.
        EXPECT_EQ(d.cosine_after.has_value(), c.has_cosine);
        if (c.has_cosine && d.cosine_after) {
          EXPECT_EQ(*d.cosine_after, c.cosine);
        }
        break;
      case Regime::kProject:
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
      case Regime::kSkip:
      case Regime::kInvalid:
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
  const Controller ctl = MakeController(0.05, 0.3);
  for (const AlignmentStats& s : {AlignmentStats{0.5, -1.0, 1.0, true}, AlignmentStats{0.5, 1.0, -1.0, true},
                                  AlignmentStats{0.5, -1.0, -1.0, true}, AlignmentStats{0.0, -1.0, 0.0, false}}) {
    SCOPED_TRACE(std::to_string(s.grad_sq) + " " + std::to_string(s.ref_sq));
    const Decision d = ctl.Decide(s);
    EXPECT_EQ(d.regime, Regime::kInvalid);
    EXPECT_FALSE(d.apply_update);
    EXPECT_FALSE(d.cosine.has_value());
    EXPECT_EQ(d.projection_coeff, 0.0);
  }
}

TEST(DecideTest, BoundaryFollowsConfiguredThresholds) {
  // The same cosine lands in different regimes with different thresholds.
  const AlignmentStats s = StatsForCosine(0.25);
  EXPECT_EQ(MakeController(0.25, 0.5).Decide(s).regime, Regime::kSafe);
  EXPECT_EQ(MakeController(0.1, 0.5).Decide(s).regime, Regime::kProject);
  EXPECT_EQ(MakeController(0.1, 0.25).Decide(s).regime, Regime::kSkip);
  // With c_high == 1 nothing short of a perfectly aligned gradient is skipped.
  const Controller wide = MakeController(0.05, 1.0);
  EXPECT_EQ(wide.Decide(StatsForCosine(std::nextafter(1.0, 0.0))).regime, Regime::kProject);
  EXPECT_EQ(wide.Decide(StatsForCosine(1.0)).regime, Regime::kSkip);
  EXPECT_EQ(wide.Decide(StatsForCosine(-1.0)).regime, Regime::kSkip);
}

TEST(DecideTest, EpsilonInTheDenominator) {
  // |g| = |p| = 1e-4, true cosine 0.4: with the paper's 1e-8 in the
  // denominator c = 0.4e-8 / (1e-8 + 1e-8) = 0.2, which is in the projection
  // band of the defaults although the true cosine is above c_high.
  const AlignmentStats s{0.4e-8, 1e-8, 1e-8, true};
  const Decision d = MakeController(0.05, 0.3).Decide(s);
  ASSERT_TRUE(d.cosine.has_value());
  EXPECT_NEAR(*d.cosine, 0.2, 1e-12);
  EXPECT_EQ(d.regime, Regime::kProject);
  EXPECT_NEAR(d.alpha, 0.05 / 0.2, 1e-12);
  // cosine_after is the geometric cosine of (g', p): the true cosine 0.4 with
  // its parallel part scaled by alpha = 0.25.
  const double ac = 0.25 * 0.4;
  EXPECT_NEAR(*d.cosine_after, ac / std::sqrt(ac * ac + 1.0 - 0.4 * 0.4), 1e-9);
}

TEST(DecideTest, NormsReported) {
  const Decision d = MakeController(0.05, 0.3).Decide(AlignmentStats{1.0, 9.0, 16.0, true});
  EXPECT_EQ(d.grad_norm, 3.0);
  EXPECT_EQ(d.ref_norm, 4.0);
  const Decision first = MakeController(0.05, 0.3).Decide(AlignmentStats{0.0, 25.0, 0.0, false});
  EXPECT_EQ(first.grad_norm, 5.0);
  EXPECT_EQ(first.ref_norm, 0.0);
}

TEST(AlphaTest, PaperAndExactFormulas) {
  // Independent closed forms from docs/ALGORITHM.md, over the band and both signs.
  const double lo = 0.05;
  const Controller paper = MakeController(lo, 1.0, AlphaMode::kPaper);
  const Controller exact = MakeController(lo, 1.0, AlphaMode::kExact);
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
      EXPECT_NEAR(CosineAfterProjection(c, alpha), want, 1e-15);
    }
  }
  // alpha = 1 leaves the cosine unchanged.
  EXPECT_NEAR(CosineAfterProjection(0.42, 1.0), 0.42, 1e-15);
  // Parallel gradient fully removed: g' = 0, reported as 0 rather than NaN.
  EXPECT_EQ(CosineAfterProjection(1.0, 0.0), 0.0);
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

class ProjectionPropertyTest : public ::testing::TestWithParam<std::tuple<PropertyCase, AlphaMode>> {};

TEST_P(ProjectionPropertyTest, MeasuredCosineAfterProjection) {
  const auto& [pc, mode] = GetParam();
  const Controller ctl = MakeController(pc.c_low, pc.c_high, mode);
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
    const AlignmentStats stats{Dot(g, p), Dot(g, g), Dot(p, p), true};
    const double c_measured = Cosine(g, p);
    SCOPED_TRACE("trial " + std::to_string(trial) + " c=" + std::to_string(c_measured));

    const Decision d = ctl.Decide(stats);
    ASSERT_EQ(d.regime, Regime::kProject);
    ASSERT_TRUE(d.apply_update);
    ASSERT_TRUE(d.cosine.has_value());
    EXPECT_NEAR(*d.cosine, c_measured, 1e-10);

    for (std::size_t i = 0; i < n; ++i) g2[i] = g[i] - d.projection_coeff * p[i];
    const double after = Cosine(g2, p);

    // The target, from the closed forms in docs/ALGORITHM.md.
    const double lo = pc.c_low;
    const double want_abs =
        mode == AlphaMode::kExact ? lo : lo / std::sqrt(lo * lo + 1.0 - c_measured * c_measured);
    EXPECT_NEAR(after, std::copysign(want_abs, c_measured), 1e-9 * want_abs);
    if (mode == AlphaMode::kPaper) {
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
                       ::testing::Values(AlphaMode::kPaper, AlphaMode::kExact)),
    [](const ::testing::TestParamInfo<std::tuple<PropertyCase, AlphaMode>>& info) {
      const PropertyCase& pc = std::get<0>(info.param);
      return "dim" + std::to_string(pc.dim) + "_" + AlphaModeName(std::get<1>(info.param));
    });

TEST(DecideRandomTest, RegimesAgreeWithReference) {
  // Random scalar triples across all regimes: the regime must be the one the
  // docs/ALGORITHM.md rules give for the cosine computed here.
  const double lo = 0.05;
  const double hi = 0.3;
  const Controller ctl = MakeController(lo, hi, AlphaMode::kExact);
  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<double> cos_dist(-1.0, 1.0);
  std::uniform_real_distribution<double> log_norm(-6.0, 6.0);
  int counts[4] = {0, 0, 0, 0};
  for (int trial = 0; trial < 20000; ++trial) {
    const double c = cos_dist(rng) * (trial % 2 ? 1.0 : 0.4);  // half the trials near the band
    const double gn = std::pow(10.0, log_norm(rng));
    const double pn = std::pow(10.0, log_norm(rng));
    const AlignmentStats s{c * gn * pn, gn * gn, pn * pn, true};
    const double ref_c = s.dot / (std::sqrt(s.grad_sq * s.ref_sq) + 1e-8);
    const Regime want = std::fabs(ref_c) <= lo ? Regime::kSafe : std::fabs(ref_c) >= hi ? Regime::kSkip
                                                                                       : Regime::kProject;
    const Decision d = ctl.Decide(s);
    ASSERT_EQ(d.regime, want) << "trial " << trial << " c=" << ref_c;
    ASSERT_TRUE(d.cosine.has_value());
    // |g|*|p| and sqrt(gg*pp) may differ in the last bit.
    EXPECT_DOUBLE_EQ(*d.cosine, ref_c);
    EXPECT_EQ(d.apply_update, want != Regime::kSkip);
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
  const Controller controllers[] = {MakeController(0.05, 0.3), MakeController(0.02, 0.1),
                                    MakeController(0.1, 1.0, AlphaMode::kExact)};
  for (const Controller& ctl : controllers) {
    for (int trial = 0; trial < 5000; ++trial) {
      const double gn = std::pow(10.0, log_norm(rng));
      const double pn = std::pow(10.0, log_norm(rng));
      const double c = cos_dist(rng);
      const Decision d = ctl.Decide(AlignmentStats{c * gn * pn, gn * gn, pn * pn, true});
      ASSERT_TRUE(d.cosine.has_value());
      ASSERT_EQ(ctl.RegimeForCosine(*d.cosine), d.regime) << "c=" << *d.cosine;
    }
    const Thresholds& t = ctl.thresholds();
    EXPECT_EQ(ctl.RegimeForCosine(t.c_low), Regime::kSafe);
    EXPECT_EQ(ctl.RegimeForCosine(-t.c_low), Regime::kSafe);
    EXPECT_EQ(ctl.RegimeForCosine(std::nextafter(t.c_low, 1.0)), Regime::kProject);
    EXPECT_EQ(ctl.RegimeForCosine(std::nextafter(t.c_high, 0.0)), Regime::kProject);
    EXPECT_EQ(ctl.RegimeForCosine(t.c_high), Regime::kSkip);
    EXPECT_EQ(ctl.RegimeForCosine(-t.c_high), Regime::kSkip);
  }
}

TEST(DecideTest, HugeNormsDoNotOverflowTheCosine) {
  // gg * pp = 1e400 overflows a double; the cosine must still be 0.5.
  const Controller ctl = MakeController(0.05, 0.3, AlphaMode::kPaper);
  const Decision d = ctl.Decide(AlignmentStats{0.5e200, 1e200, 1e200, true});
  ASSERT_TRUE(d.cosine.has_value());
  EXPECT_DOUBLE_EQ(*d.cosine, 0.5);
  EXPECT_EQ(d.regime, Regime::kSkip);
}

}  // namespace
}  // namespace gac
