// A broken or hostile gacd must not hurt a trainer: a fake ControlService
// answers Decide with what no controller gives (alpha outside [0, 1], a
// non-finite coefficient, an unknown regime, the answer for another run or
// step, bytes that are no message, or no answer at all). RemoteController
// refuses each with a reason; with GAC_TEST_AGENT the agent in remote mode
// falls back to its local decision, counts the fallback, says why, and
// changes the gradients exactly as a local agent does.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <vector>
#include <string>
#include <thread>

#include "gac/controller/controller.h"
#include "gac/base/mutex.h"
#include "gac/proto/convert.h"
#include "gac/transport/remote_controller.h"
#include "gac/v1/control.grpc.pb.h"

#ifdef GAC_TEST_AGENT
#include <ATen/ATen.h>

#include "gac/agent/agent.h"
#endif

namespace gac::transport {
namespace {

using namespace std::chrono_literals;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// What the fake gacd does with one Decide request: fill `bytes` with the
// answer, or return false to never answer (the call ends only when the
// client cancels it or its deadline passes).
using Answer = std::function<bool(const v1::DecideRequest& request, std::string* bytes)>;

// A ControlService that answers as told, on an OS-chosen loopback port.
class FakeGacd final : public v1::ControlService::WithRawCallbackMethod_Decide<v1::ControlService::Service> {
 public:
  explicit FakeGacd(Answer answer) : answer_(std::move(answer)) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~FakeGacd() override { server_->Shutdown(std::chrono::system_clock::now()); }

  const std::string& address() const { return address_; }
  int hung() {
    base::MutexLock lock(&mu_);
    return hung_;
  }

  grpc::ServerUnaryReactor* Decide(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                   grpc::ByteBuffer* response) override {
    v1::DecideRequest request;
    if (!grpc::SerializationTraits<v1::DecideRequest>::Deserialize(const_cast<grpc::ByteBuffer*>(raw), &request)
             .ok()) {
      grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
      r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "fake gacd: malformed request"));
      return r;
    }
    std::string bytes;
    if (!answer_(request, &bytes)) {
      {
        base::MutexLock lock(&mu_);
        ++hung_;
      }
      return new Hanging();
    }
    grpc::Slice slice(bytes);
    *response = grpc::ByteBuffer(&slice, 1);
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

 private:
  // Never answers; finishes only when gRPC cancels the call.
  class Hanging final : public grpc::ServerUnaryReactor {
   public:
    void OnCancel() override { Finish(grpc::Status::CANCELLED); }
    void OnDone() override { delete this; }
  };

  Answer answer_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  base::Mutex mu_;
  int hung_ GAC_GUARDED_BY(mu_) = 0;
};

// The honest answer to `request` (the default thresholds), serialised after
// `damage` changed it.
Answer Damaged(std::function<void(v1::DecideResponse*)> damage) {
  return [damage](const v1::DecideRequest& request, std::string* bytes) {
    const controller::Controller controller = *controller::Controller::Create(controller::Thresholds{}, controller::AlphaMode::kPaper);
    v1::DecideResponse response;
    proto::EncodeDecideResponse(request, controller.Decide(proto::StatsFromProto(request)), &response);
    damage(&response);
    response.SerializeToString(bytes);
    return true;
  };
}

Answer Honest() {
  return Damaged([](v1::DecideResponse*) {});
}

struct HostileCase {
  const char* name;
  Answer answer;
  const char* reason;  // in the refusal's message
};

// Statistics for which the honest controller projects (cosine 0.6 with the
// default thresholds 0.05 / 0.3 would skip; 0.2 projects).
constexpr controller::AlignmentStats kProjecting{0.2, 1.0, 1.0, true};

std::vector<HostileCase> HostileCases() {
  return {
      {"alpha above 1", Damaged([](v1::DecideResponse* r) { r->set_alpha(1.5); }), "alpha must be in [0, 1]"},
      {"negative alpha", Damaged([](v1::DecideResponse* r) { r->set_alpha(-0.25); }), "alpha must be in [0, 1]"},
      {"NaN alpha", Damaged([](v1::DecideResponse* r) { r->set_alpha(kNaN); }), "alpha must be in [0, 1]"},
      {"infinite coefficient", Damaged([](v1::DecideResponse* r) { r->set_projection_coeff(kInf); }),
       "projection_coeff must be finite"},
      {"NaN coefficient", Damaged([](v1::DecideResponse* r) { r->set_projection_coeff(kNaN); }),
       "projection_coeff must be finite"},
      {"coefficient larger than alpha gives", Damaged([](v1::DecideResponse* r) { r->set_projection_coeff(40.0); }),
       "projection_coeff"},
      {"unknown regime", Damaged([](v1::DecideResponse* r) { r->set_regime(static_cast<v1::Regime>(42)); }),
       "regime must be"},
      {"answer for another run", Damaged([](v1::DecideResponse* r) { r->set_run("exp-other"); }),
       "answer for run 'exp-other'"},
      {"answer for another step", Damaged([](v1::DecideResponse* r) { r->set_step(r->step() - 1); }),
       "asked for run"},
      {"answer that does not say what it answers", Damaged([](v1::DecideResponse* r) {
         r->clear_run();
         r->clear_step();
       }),
       "answer for run ''"},
      {"bytes that are no DecideResponse",
       [](const v1::DecideRequest&, std::string* bytes) {
         *bytes = std::string("\xff\xff\xff\xff\x0f garbage", 13);
         return true;
       },
       ""},
  };
}

RemoteControllerOptions Options(const std::string& address, std::chrono::milliseconds deadline = 2000ms) {
  RemoteControllerOptions o;
  o.address = address;
  o.run = "exp-hostile";
  o.deadline = deadline;
  return o;
}

TEST(HostileGacd, HonestAnswerIsTaken) {
  FakeGacd gacd(Honest());
  auto remote = RemoteController::Create(Options(gacd.address()));
  ASSERT_TRUE(remote.ok());
  base::StatusOr<controller::Decision> d = (*remote)->Decide(7, kProjecting);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const controller::Decision local = controller::Controller::Create(controller::Thresholds{}, controller::AlphaMode::kPaper)->Decide(kProjecting);
  EXPECT_EQ(d->regime, controller::Regime::kProject);
  EXPECT_EQ(d->alpha, local.alpha);
  EXPECT_EQ(d->projection_coeff, local.projection_coeff);
}

TEST(HostileGacd, EveryAbsurdAnswerIsRefusedWithItsReason) {
  // Each case's fake gacd stays up until the test ends: a case that got the
  // port of an earlier, stopped one would share gRPC's pooled connection to
  // that address while it closes, and fail with UNAVAILABLE ("handshaker
  // shutdown") instead of reading the answer.
  std::vector<std::unique_ptr<FakeGacd>> servers;
  for (HostileCase& c : HostileCases()) {
    SCOPED_TRACE(c.name);
    servers.push_back(std::make_unique<FakeGacd>(c.answer));
    FakeGacd& gacd = *servers.back();
    auto remote = RemoteController::Create(Options(gacd.address()));
    ASSERT_TRUE(remote.ok());
    base::StatusOr<controller::Decision> d = (*remote)->Decide(7, kProjecting);
    if (!d.ok() && d.status().code() == base::StatusCode::kUnavailable && !std::string(c.reason).empty()) {
      // What is tested is how an answer is read; a connection that failed
      // before any answer came is asked again, once, on a new controller.
      remote = RemoteController::Create(Options(gacd.address()));
      ASSERT_TRUE(remote.ok());
      d = (*remote)->Decide(7, kProjecting);
    }
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find(c.reason), std::string::npos) << d.status().ToString();
    if (std::string(c.reason).empty()) continue;  // a transport error, not a decoded answer
    EXPECT_EQ(d.status().code(), base::StatusCode::kInvalidArgument) << d.status().ToString();
    EXPECT_NE(d.status().message().find("gacd Decide answered nonsense"), std::string::npos);
  }
}

// Answers step 0 honestly (so that a test can wait until it is connected:
// a call whose deadline passes while connecting never reaches the server)
// and never answers any other step.
Answer HangsAfterStepZero() {
  return [honest = Honest()](const v1::DecideRequest& request, std::string* bytes) {
    return request.step() == 0 && honest(request, bytes);
  };
}

// Decides step 0 until the fake gacd's answer arrives.
void WaitUntilConnected(RemoteController& remote) {
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  base::StatusOr<controller::Decision> d = remote.Decide(0, kProjecting);
  while (!d.ok() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(50ms);
    d = remote.Decide(0, kProjecting);
  }
  ASSERT_TRUE(d.ok()) << d.status().ToString();
}

// The number of requests the fake gacd left hanging, once it reaches
// `want` (its handler may run after the client gave up) or after 5 s.
int HungEventually(FakeGacd& gacd, int want) {
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  while (gacd.hung() < want && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(10ms);
  return gacd.hung();
}

TEST(HostileGacd, AnAnswerThatNeverComesEndsAtTheDeadline) {
  FakeGacd gacd(HangsAfterStepZero());
  auto remote = RemoteController::Create(Options(gacd.address(), 100ms));
  ASSERT_TRUE(remote.ok());
  WaitUntilConnected(**remote);
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    base::StatusOr<controller::Decision> d = (*remote)->Decide(1 + i, kProjecting);
    const auto waited = std::chrono::steady_clock::now() - t0;
    ASSERT_FALSE(d.ok());
    if (i < 2) {
      EXPECT_EQ(d.status().code(), base::StatusCode::kDeadlineExceeded) << d.status().ToString();
      // The call waits for its deadline, not for the server (generous bound
      // for a loaded machine; the server would hang forever).
      EXPECT_LT(waited, 5s);
    } else {
      // Two misses in a row: the next call asks no one.
      EXPECT_EQ(d.status().code(), base::StatusCode::kUnavailable) << d.status().ToString();
      EXPECT_NE(d.status().message().find("not asked"), std::string::npos) << d.status().ToString();
      EXPECT_LT(waited, 100ms);
    }
  }
  EXPECT_EQ(HungEventually(gacd, 2), 2);
}

#ifdef GAC_TEST_AGENT

// The agent in remote mode next to a local agent on the same gradients.
struct AgentPair {
  std::shared_ptr<RemoteController> remote;
  std::unique_ptr<agent::Agent> agent, local;
  at::Tensor param = at::zeros({4096}).set_requires_grad(true);
  at::Tensor local_param = at::zeros({4096}).set_requires_grad(true);

  AgentPair(const std::string& address, std::chrono::milliseconds deadline) {
    remote = std::shared_ptr<RemoteController>(std::move(*RemoteController::Create(Options(address, deadline))));
    agent::AgentOptions o;
    o.num_threads = 1;
    o.mode = controller::Mode::kRemote;
    o.decision_source = remote;
    agent = std::move(*agent::Agent::Create(o));
    agent::AgentOptions lo;
    lo.num_threads = 1;
    local = std::move(*agent::Agent::Create(lo));
  }

  // Steps both agents with gradient g; returns the remote agent's report.
  controller::StepReport Step(std::int64_t step, const at::Tensor& g) {
    param.mutable_grad() = g.clone();
    local_param.mutable_grad() = g.clone();
    base::StatusOr<controller::StepReport> r = agent->Step(step, {param});
    base::StatusOr<controller::StepReport> rl = local->Step(step, {local_param});
    EXPECT_TRUE(r.ok() && rl.ok());
    if (!r.ok() || !rl.ok()) return {};
    EXPECT_EQ(r->decision.regime, rl->decision.regime);
    EXPECT_EQ(r->step_optimizer, rl->step_optimizer);
    EXPECT_TRUE(at::equal(param.grad(), local_param.grad())) << "step " << step;
    return *r;
  }
};

// Gradients whose consecutive cosine is about 0.2: the local decision
// projects, so a smuggled coefficient would show in the gradients.
std::vector<at::Tensor> ProjectingGradients(int n) {
  at::manual_seed(15);
  const at::Tensor base = at::randn({4096});
  std::vector<at::Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(base + 2.0 * at::randn({4096}));
  return out;
}

// Waits (up to 20 s) until the fake gacd's answer, refused for `reason`, is
// what a Decide gets: on a loaded machine the first handshake can fail, and
// gRPC then fails calls fast for a while ("connections to all backends
// failing"), a transport error this test is not about.
void WaitForTheAnswer(RemoteController& remote, const std::string& reason) {
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  std::string last;
  while (std::chrono::steady_clock::now() < give_up) {
    base::StatusOr<controller::Decision> d = remote.Decide(0, kProjecting);
    last = d.ok() ? "accepted" : d.status().ToString();
    if (!d.ok() && d.status().message().find(reason) != std::string::npos) return;
    std::this_thread::sleep_for(100ms);
  }
  ADD_FAILURE() << "the fake gacd's answer never arrived; last: " << last;
}

TEST(HostileGacdAgent, FallsBackToTheLocalDecisionCountsAndSaysWhy) {
  const std::vector<at::Tensor> grads = ProjectingGradients(4);
  for (HostileCase& c : HostileCases()) {
    SCOPED_TRACE(c.name);
    FakeGacd gacd(c.answer);
    AgentPair pair(gacd.address(), 2000ms);
    WaitForTheAnswer(*pair.remote, c.reason);
    bool projected = false;
    for (int step = 1; step <= 4; ++step) {
      const controller::StepReport r = pair.Step(step, grads[static_cast<std::size_t>(step - 1)]);
      projected |= r.decision.regime == controller::Regime::kProject;
      EXPECT_TRUE(r.fallback) << "step " << step;
      EXPECT_NE(r.remote_error.find(c.reason), std::string::npos) << r.remote_error;
    }
    EXPECT_TRUE(projected) << "the gradients should make the local decision project";
    EXPECT_EQ(pair.agent->fallbacks(), 4u);
  }
}

TEST(HostileGacdAgent, AnswerThatNeverComesFallsBackAtTheDeadline) {
  const std::vector<at::Tensor> grads = ProjectingGradients(3);
  FakeGacd gacd(HangsAfterStepZero());
  AgentPair pair(gacd.address(), 100ms);
  WaitUntilConnected(*pair.remote);
  for (int step = 1; step <= 3; ++step) {
    const controller::StepReport r = pair.Step(step, grads[static_cast<std::size_t>(step - 1)]);
    EXPECT_TRUE(r.fallback);
    // The third follows two misses in a row: gacd is not asked.
    EXPECT_NE(r.remote_error.find(step < 3 ? "DEADLINE_EXCEEDED" : "not asked"), std::string::npos) << r.remote_error;
    // A deadline that is not applied shows as a call that hangs: bounded
    // loosely, since any machine can be slow (the third is not asked at all,
    // as the message says).
    if (step < 3) {
      EXPECT_LT(r.decide_seconds, 5.0);
    }
  }
  EXPECT_EQ(pair.agent->fallbacks(), 3u);
  EXPECT_EQ(HungEventually(gacd, 2), 2);
}

TEST(HostileGacdAgent, HonestGacdIsFollowed) {
  const std::vector<at::Tensor> grads = ProjectingGradients(4);
  FakeGacd gacd(Honest());
  AgentPair pair(gacd.address(), 2000ms);
  for (int step = 1; step <= 4; ++step) {
    const controller::StepReport r = pair.Step(step, grads[static_cast<std::size_t>(step - 1)]);
    EXPECT_FALSE(r.fallback) << r.remote_error;
  }
  EXPECT_EQ(pair.agent->fallbacks(), 0u);
}

#endif  // GAC_TEST_AGENT

}  // namespace
}  // namespace gac::transport
