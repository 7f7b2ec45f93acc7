// Uses the installed headers and libraries; exits non-zero on a wrong answer.
#include <cmath>
#include <cstdio>

#include "gac/controller/controller.h"
#ifdef CONSUMER_WITH_AGENT
#include <ATen/ATen.h>

#include "gac/agent/agent.h"
#endif
#ifdef CONSUMER_WITH_SERVER
#include <grpcpp/grpcpp.h>

#include "gac/agent/telemetry.h"
#include "gac/server/server.h"
#include "grpc/health/v1/health.grpc.pb.h"
#endif

int main() {
  auto ctl = gac::Controller::Create({0.05, 0.3});
  if (!ctl.ok()) return 1;
  const gac::Decision d = ctl->Decide({0.5, 1.0, 1.0, true});  // cosine 0.5: skip
  if (d.regime != gac::Regime::kSkip) return 2;
#ifdef CONSUMER_WITH_AGENT
  auto agent = gac::agent::Agent::Create({});
  if (!agent.ok()) return 3;
  at::Tensor w = at::zeros({8}).set_requires_grad(true);
  w.mutable_grad() = at::ones({8});
  if (!(*agent)->Step(1, {w}).ok()) return 4;
  w.mutable_grad() = at::ones({8});
  auto r = (*agent)->Step(2, {w});
  if (!r.ok() || !r->decision.cosine || std::fabs(*r->decision.cosine - 1.0) > 1e-6) return 5;
#endif
#ifdef CONSUMER_WITH_SERVER
  gac::server::ServerConfig config;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "";
  config.insecure = true;
  config.db = ":memory:";
  auto server = gac::server::GacServer::Start(config);
  if (!server.ok()) return 6;
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckResponse health;
  if (!stub->Check(&ctx, {}, &health).ok() || health.status() != health.SERVING) return 7;
  gac::agent::TelemetryOptions topts;
  topts.address = (*server)->address();
  auto telemetry = gac::agent::Telemetry::Start(topts);
  if (!telemetry.ok()) return 8;
  gac::v1::StepRecord record;
  record.set_run("consumer");
  record.set_regime(gac::v1::REGIME_SAFE);
  record.set_alpha(1.0);
  if (!(*telemetry)->Enqueue(std::move(record)) || !(*telemetry)->Flush(std::chrono::seconds(30))) return 9;
#endif
  std::printf("gac consumer: ok\n");
  return 0;
}
