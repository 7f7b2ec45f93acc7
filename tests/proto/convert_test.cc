// Tests of gac/proto/convert.h. Expected wire values are spelled out from the
// .proto files, not taken from the functions under test; decisions come from
// the controller and must survive the trip through a DecideResponse bit for
// bit, while answers no controller gives are refused.
#include "gac/proto/convert.h"

#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>

namespace gac::proto {
namespace {

TEST(ConvertTest, RegimesMapOneToOneAndUnspecifiedIsRefused) {
  EXPECT_EQ(ToProto(controller::Regime::kSafe), v1::REGIME_SAFE);
  EXPECT_EQ(ToProto(controller::Regime::kProject), v1::REGIME_PROJECT);
  EXPECT_EQ(ToProto(controller::Regime::kSkip), v1::REGIME_SKIP);
  EXPECT_EQ(ToProto(controller::Regime::kInvalid), v1::REGIME_INVALID);
  for (controller::Regime r : controller::kAllRegimes) {
    base::StatusOr<controller::Regime> back = FromProto(ToProto(r));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, r);
  }
  EXPECT_TRUE(FromProto(v1::REGIME_UNSPECIFIED).status().IsInvalidArgument());
  EXPECT_TRUE(FromProto(static_cast<v1::Regime>(99)).status().IsInvalidArgument());
}

TEST(ConvertTest, AlphaModesMapAndUnspecifiedReadsAsPaper) {
  EXPECT_EQ(ToProto(controller::AlphaMode::kPaper), v1::ALPHA_MODE_PAPER);
  EXPECT_EQ(ToProto(controller::AlphaMode::kExact), v1::ALPHA_MODE_EXACT);
  EXPECT_EQ(*FromProto(v1::ALPHA_MODE_PAPER), controller::AlphaMode::kPaper);
  EXPECT_EQ(*FromProto(v1::ALPHA_MODE_EXACT), controller::AlphaMode::kExact);
  EXPECT_EQ(*FromProto(v1::ALPHA_MODE_UNSPECIFIED), controller::AlphaMode::kPaper);
  EXPECT_TRUE(FromProto(static_cast<v1::AlphaMode>(7)).status().IsInvalidArgument());
}

TEST(ConvertTest, ModesMapOneToOneAndUnspecifiedIsRefused) {
  EXPECT_EQ(ToProto(controller::Mode::kMonitor), v1::CONTROL_MODE_MONITOR);
  EXPECT_EQ(ToProto(controller::Mode::kLocal), v1::CONTROL_MODE_LOCAL);
  EXPECT_EQ(ToProto(controller::Mode::kRemote), v1::CONTROL_MODE_REMOTE);
  for (controller::Mode m : {controller::Mode::kMonitor, controller::Mode::kLocal, controller::Mode::kRemote}) EXPECT_EQ(*FromProto(ToProto(m)), m);
  EXPECT_TRUE(FromProto(v1::CONTROL_MODE_UNSPECIFIED).status().IsInvalidArgument());
  EXPECT_TRUE(FromProto(static_cast<v1::ControlMode>(42)).status().IsInvalidArgument());
}

TEST(ConvertTest, ThresholdsRoundTripAndAreValidated) {
  const v1::Thresholds t = ToProto(controller::Thresholds{0.07, 0.4}, controller::AlphaMode::kExact);
  EXPECT_EQ(t.c_low(), 0.07);
  EXPECT_EQ(t.c_high(), 0.4);
  EXPECT_EQ(t.alpha_mode(), v1::ALPHA_MODE_EXACT);
  base::StatusOr<controller::Thresholds> back = ThresholdsFromProto(t);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->c_low, 0.07);
  EXPECT_EQ(back->c_high, 0.4);
  base::StatusOr<controller::Controller> c = ControllerFromProto(t);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->mode(), controller::AlphaMode::kExact);
  v1::Thresholds bad = t;
  bad.set_c_low(0.5);  // above c_high
  EXPECT_TRUE(ThresholdsFromProto(bad).status().IsInvalidArgument());
  EXPECT_TRUE(ControllerFromProto(bad).status().IsInvalidArgument());
  bad = t;
  bad.set_c_high(std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(ThresholdsFromProto(bad).status().IsInvalidArgument());
  bad = t;
  bad.set_alpha_mode(static_cast<v1::AlphaMode>(5));
  EXPECT_TRUE(ThresholdsFromProto(bad).status().IsInvalidArgument());
}

TEST(ConvertTest, DecideRequestCarriesTheStatisticsExactly) {
  const controller::AlignmentStats stats{-0.123456789012345, 3.25e-7, 1e300, true};
  const v1::DecideRequest req = ToDecideRequest("exp-1", 3, 77, stats);
  EXPECT_EQ(req.run(), "exp-1");
  EXPECT_EQ(req.rank(), 3u);
  EXPECT_EQ(req.step(), 77);
  EXPECT_EQ(req.dot(), stats.dot);
  EXPECT_EQ(req.grad_sq(), stats.grad_sq);
  EXPECT_EQ(req.ref_sq(), stats.ref_sq);
  EXPECT_TRUE(req.has_reference());
  v1::DecideRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(req.SerializeAsString()));
  const controller::AlignmentStats back = StatsFromProto(parsed);
  EXPECT_EQ(back.dot, stats.dot);
  EXPECT_EQ(back.grad_sq, stats.grad_sq);
  EXPECT_EQ(back.ref_sq, stats.ref_sq);
  EXPECT_EQ(back.has_reference, stats.has_reference);
}

// Every decision the controller makes survives the wire unchanged.
TEST(ConvertTest, ControllerDecisionsSurviveTheWireBitForBit) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> cos_dist(-1.0, 1.0);
  std::uniform_real_distribution<double> norm_dist(0.01, 10.0);
  for (controller::AlphaMode mode : {controller::AlphaMode::kPaper, controller::AlphaMode::kExact}) {
    const controller::Controller c = *controller::Controller::Create({0.05, 0.3}, mode);
    for (int i = 0; i < 2000; ++i) {
      const double gn = norm_dist(rng), pn = norm_dist(rng);
      controller::AlignmentStats s{cos_dist(rng) * gn * pn * (i % 5 == 0 ? 0.1 : 0.5), gn * gn, pn * pn, i % 17 != 0};
      if (i % 97 == 0) s.dot = std::numeric_limits<double>::infinity();
      const controller::Decision d = c.Decide(s);
      v1::DecideResponse resp;
      EncodeDecision(d, &resp);
      v1::DecideResponse wire;
      ASSERT_TRUE(wire.ParseFromString(resp.SerializeAsString()));
      base::StatusOr<controller::Decision> back = DecodeDecision(wire, s);
      ASSERT_TRUE(back.ok()) << i << ": " << back.status().ToString();
      EXPECT_EQ(back->regime, d.regime);
      EXPECT_EQ(back->cosine.has_value(), d.cosine.has_value());
      if (d.cosine) {
        EXPECT_EQ(*back->cosine, *d.cosine);
      }
      EXPECT_EQ(back->cosine_after.has_value(), d.cosine_after.has_value());
      if (d.cosine_after) {
        EXPECT_EQ(*back->cosine_after, *d.cosine_after);
      }
      EXPECT_EQ(back->alpha, d.alpha);
      EXPECT_EQ(back->projection_coeff, d.projection_coeff);
      EXPECT_EQ(back->apply_update, d.apply_update);
      EXPECT_EQ(back->grad_norm, std::sqrt(s.grad_sq));
      EXPECT_EQ(back->ref_norm, std::sqrt(s.ref_sq));
    }
  }
}

// The remote decision's optional reals are mapped in C++ (convert.cc's
// kDecidedReals): every optional double of the response, set to a value a
// controller could give, comes back from DecodeDecision and EncodeDecision
// unchanged, so one added to the response without its mapping fails here.
TEST(ConvertTest, EveryOptionalRealOfTheResponseIsMapped) {
  const controller::AlignmentStats stats{0.0, 4.0, 1.0, true};  // cosine 0: safe
  v1::DecideResponse sent;
  EncodeDecision(controller::Controller::Create({0.05, 0.3}, controller::AlphaMode::kPaper)->Decide(stats), &sent);
  const google::protobuf::Descriptor* message = v1::DecideResponse::descriptor();
  const google::protobuf::Reflection* reflection = sent.GetReflection();
  std::set<std::string> reals;
  for (int i = 0; i < message->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = message->field(i);
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_DOUBLE || !f->has_presence()) continue;
    reals.insert(f->name());
    reflection->SetDouble(&sent, f, 0.125 * static_cast<double>(reals.size()));  // a distinct cosine each
  }
  EXPECT_EQ(reals, (std::set<std::string>{"cosine", "cosine_after", "window_mean", "grad_norm_z", "loss_z"}));
  base::StatusOr<controller::Decision> d = DecodeDecision(sent, stats);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  v1::DecideResponse back;
  EncodeDecision(*d, &back);
  for (int i = 0; i < message->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = message->field(i);
    if (f->type() != google::protobuf::FieldDescriptor::TYPE_DOUBLE || !f->has_presence()) continue;
    ASSERT_TRUE(reflection->HasField(back, f)) << f->name() << " is not mapped";
    EXPECT_EQ(reflection->GetDouble(back, f), reflection->GetDouble(sent, f)) << f->name();
  }
}

// Each of them crosses the wire in its own field, and is absent there when
// the decision has none; a remote verdict's score carries its z only.
TEST(ConvertTest, EveryOptionalRealOfADecisionCrossesTheWire) {
  const controller::AlignmentStats stats{0.0, 4.0, 1.0, true};  // cosine 0: safe
  controller::Decision d = controller::Controller::Create({0.05, 0.3}, controller::AlphaMode::kPaper)->Decide(stats);
  ASSERT_EQ(d.regime, controller::Regime::kSafe);
  d.cosine_after = -0.25;
  d.window_mean = 0.125;
  d.spike_verdict.grad_norm = controller::SpikeScore{2.5, 9.0};
  d.spike_verdict.loss = controller::SpikeScore{-1e6, std::nullopt};
  v1::DecideResponse resp;
  EncodeDecision(d, &resp);
  ASSERT_TRUE(resp.has_cosine() && resp.has_cosine_after() && resp.has_window_mean() && resp.has_grad_norm_z() &&
              resp.has_loss_z());
  EXPECT_EQ(resp.cosine(), 0.0);
  EXPECT_EQ(resp.cosine_after(), -0.25);
  EXPECT_EQ(resp.window_mean(), 0.125);
  EXPECT_EQ(resp.grad_norm_z(), 2.5);
  EXPECT_EQ(resp.loss_z(), -1e6);
  v1::DecideResponse wire;
  ASSERT_TRUE(wire.ParseFromString(resp.SerializeAsString()));
  base::StatusOr<controller::Decision> back = DecodeDecision(wire, stats);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->cosine, std::optional<double>(0.0));
  EXPECT_EQ(back->cosine_after, std::optional<double>(-0.25));
  EXPECT_EQ(back->window_mean, std::optional<double>(0.125));
  ASSERT_TRUE(back->spike_verdict.grad_norm && back->spike_verdict.loss);
  EXPECT_EQ(back->spike_verdict.grad_norm->z, 2.5);
  EXPECT_FALSE(back->spike_verdict.grad_norm->bound.has_value());
  EXPECT_EQ(back->spike_verdict.loss->z, -1e6);

  // A response reused for a decision without them has none left.
  const controller::Decision first =
      controller::Controller::Create({0.05, 0.3}, controller::AlphaMode::kPaper)->Decide({0.0, 4.0, 0.0, false});
  EncodeDecision(first, &resp);
  EXPECT_FALSE(resp.has_cosine() || resp.has_cosine_after() || resp.has_window_mean() || resp.has_grad_norm_z() ||
               resp.has_loss_z());
  back = DecodeDecision(resp, {0.0, 4.0, 0.0, false});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->cosine || back->cosine_after || back->window_mean || back->spike_verdict.grad_norm ||
               back->spike_verdict.loss);
}

// What a broken or hostile gacd might answer: each is refused with a
// message that names the field.
TEST(ConvertTest, AnswersNoControllerGivesAreRefused) {
  const controller::AlignmentStats stats{0.2, 1.0, 1.0, true};  // cosine 0.2: project with (0.05, 0.3)
  const controller::Decision honest = controller::Controller::Create({0.05, 0.3}, controller::AlphaMode::kPaper)->Decide(stats);
  ASSERT_EQ(honest.regime, controller::Regime::kProject);
  v1::DecideResponse good;
  EncodeDecision(honest, &good);
  ASSERT_TRUE(DecodeDecision(good, stats).ok());

  struct Case {
    const char* what;
    void (*damage)(v1::DecideResponse*);
    const char* field;
  };
  const Case cases[] = {
      {"unknown regime", [](v1::DecideResponse* r) { r->set_regime(static_cast<v1::Regime>(9)); }, "regime"},
      {"unspecified regime", [](v1::DecideResponse* r) { r->set_regime(v1::REGIME_UNSPECIFIED); }, "regime"},
      {"alpha above 1", [](v1::DecideResponse* r) { r->set_alpha(1.5); }, "alpha"},
      {"negative alpha", [](v1::DecideResponse* r) { r->set_alpha(-0.1); }, "alpha"},
      {"NaN alpha", [](v1::DecideResponse* r) { r->set_alpha(std::nan("")); }, "alpha"},
      {"infinite coefficient",
       [](v1::DecideResponse* r) { r->set_projection_coeff(std::numeric_limits<double>::infinity()); },
       "projection_coeff"},
      {"coefficient not from alpha", [](v1::DecideResponse* r) { r->set_projection_coeff(50.0); },
       "projection_coeff"},
      {"coefficient on a safe step",
       [](v1::DecideResponse* r) {
         r->set_regime(v1::REGIME_SAFE);
         r->set_projection_coeff(0.1);
       },
       "projection_coeff"},
      {"skip that applies", [](v1::DecideResponse* r) {
         r->set_regime(v1::REGIME_SKIP);
         r->set_projection_coeff(0.0);
         r->set_apply_update(true);
       }, "apply_update"},
      {"project that does not apply", [](v1::DecideResponse* r) { r->set_apply_update(false); }, "apply_update"},
      {"cosine above 1", [](v1::DecideResponse* r) { r->set_cosine(1.5); }, "cosine"},
      {"NaN cosine after", [](v1::DecideResponse* r) { r->set_cosine_after(std::nan("")); }, "cosine_after"},
      {"window mean below -1", [](v1::DecideResponse* r) { r->set_window_mean(-1.01); }, "window_mean"},
      {"infinite norm z", [](v1::DecideResponse* r) { r->set_grad_norm_z(-std::numeric_limits<double>::infinity()); },
       "grad_norm_z"},
      {"NaN loss z", [](v1::DecideResponse* r) { r->set_loss_z(std::nan("")); }, "loss_z"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::DecideResponse bad = good;
    c.damage(&bad);
    base::StatusOr<controller::Decision> d = DecodeDecision(bad, stats);
    ASSERT_FALSE(d.ok());
    EXPECT_TRUE(d.status().IsInvalidArgument()) << d.status().ToString();
    EXPECT_NE(d.status().message().find(c.field), std::string::npos) << d.status().ToString();
  }
  // PROJECT for a step without a reference.
  base::StatusOr<controller::Decision> d = DecodeDecision(good, controller::AlignmentStats{0.0, 1.0, 0.0, false});
  EXPECT_TRUE(d.status().IsInvalidArgument()) << d.status().ToString();
}

// An answer names the run and step it answers; one for another run or
// step, or one that does not say, is refused.
TEST(ConvertTest, AnswerForAnotherRunOrStepIsRefused) {
  const controller::AlignmentStats stats{0.2, 1.0, 1.0, true};
  const v1::DecideRequest request = ToDecideRequest("exp-a", 3, 41, stats);
  const controller::Decision honest = controller::Controller::Create({0.05, 0.3}, controller::AlphaMode::kPaper)->Decide(stats);
  v1::DecideResponse good;
  EncodeDecideResponse(request, honest, &good);
  EXPECT_EQ(good.run(), "exp-a");
  EXPECT_EQ(good.step(), 41);
  base::StatusOr<controller::Decision> d = DecodeDecideResponse(request, good);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->projection_coeff, honest.projection_coeff);

  v1::DecideResponse other_run = good;
  other_run.set_run("exp-b");
  v1::DecideResponse other_step = good;
  other_step.set_step(40);
  v1::DecideResponse silent = good;
  silent.clear_run();
  silent.clear_step();
  v1::DecideResponse huge = good;
  huge.set_run(std::string(100000, '\n'));
  for (const v1::DecideResponse* bad : {&other_run, &other_step, &silent, &huge}) {
    d = DecodeDecideResponse(request, *bad);
    ASSERT_FALSE(d.ok());
    EXPECT_TRUE(d.status().IsInvalidArgument()) << d.status().ToString();
    EXPECT_NE(d.status().message().find("asked for run 'exp-a' step 41"), std::string::npos)
        << d.status().ToString();
    // What the other side sent is cut short and made printable.
    EXPECT_LT(d.status().message().size(), 400u);
    EXPECT_EQ(d.status().message().find('\n'), std::string::npos);
  }
  // The checks of DecodeDecision still apply to a well-addressed answer.
  v1::DecideResponse absurd = good;
  absurd.set_alpha(2.0);
  EXPECT_TRUE(DecodeDecideResponse(request, absurd).status().IsInvalidArgument());
}

TEST(ConvertTest, StatusCrossesTheRpcBoundaryUnchanged) {
  for (int code = 0; code <= 16; ++code) {
    const base::Status st(static_cast<base::StatusCode>(code), "message " + std::to_string(code));
    const grpc::Status wire = ToGrpcStatus(st);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(wire.error_message(), code == 0 ? "" : st.message());
    EXPECT_EQ(FromGrpcStatus(wire), st);
  }
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "no run"), "gacd GetSteps"),
            base::Status::NotFound("gacd GetSteps: no run"));
  // A code gRPC does not define (20 is still inside the enum's range of
  // values: 99 would be undefined behaviour to make).
  EXPECT_TRUE(FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd")).IsUnknown());
}

// The HTTP API's statuses: the classes of the list (400, 401, 403,
// 404, 409, 413, 503) for the codes gacd returns, every code mapped, and no
// error mapped to a 2xx.
TEST(ConvertTest, EveryCodeHasAnHttpStatus) {
  const std::pair<base::StatusCode, int> expected[] = {
      {base::StatusCode::kOk, 200},
      {base::StatusCode::kCancelled, 499},
      {base::StatusCode::kUnknown, 500},
      {base::StatusCode::kInvalidArgument, 400},
      {base::StatusCode::kDeadlineExceeded, 504},
      {base::StatusCode::kNotFound, 404},
      {base::StatusCode::kAlreadyExists, 409},
      {base::StatusCode::kPermissionDenied, 403},
      {base::StatusCode::kResourceExhausted, 413},
      {base::StatusCode::kFailedPrecondition, 400},
      {base::StatusCode::kAborted, 409},
      {base::StatusCode::kOutOfRange, 400},
      {base::StatusCode::kUnimplemented, 501},
      {base::StatusCode::kInternal, 500},
      {base::StatusCode::kUnavailable, 503},
      {base::StatusCode::kDataLoss, 500},
      {base::StatusCode::kUnauthenticated, 401},
  };
  ASSERT_EQ(std::size(expected), 17u);
  for (const auto& [code, http] : expected) {
    EXPECT_EQ(ToHttpStatus(code), http) << base::StatusCodeName(code);
    if (code != base::StatusCode::kOk) {
      EXPECT_GE(ToHttpStatus(code), 400) << base::StatusCodeName(code);
    }
  }
}

}  // namespace
}  // namespace gac::proto
