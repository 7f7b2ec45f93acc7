// Uses every installed header and library of gac, the way a project outside
// the tree would; exits non-zero on a wrong answer. argv[1]: a scratch
// directory. run_install_test.cmake fails when an installed header is not
// included here.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gac/controller/calibration.h"
#include "gac/controller/controller.h"
#include "gac/controller/decision_source.h"
#include "gac/controller/policy_health.h"
#include "gac/controller/report_fields.h"
#include "gac/controller/spike.h"
#include "gac/controller/spike_verdict.h"
#include "gac/controller/step_report.h"
#include "gac/controller/window.h"
#include "gac/base/duration.h"
#include "gac/base/file_util.h"
#include "gac/base/mutex.h"
#include "gac/base/status.h"
#include "gac/base/thread_annotations.h"
#include "gac/agent/core.h"
#include "gac/agent/cuda_info.h"
#include "gac/agent/front_passes.h"
#include "gac/agent/options.h"
#ifdef CONSUMER_WITH_AGENT
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "gac/agent/agent.h"
#include "gac/agent/device_reducer.h"
#include "gac/agent/process_group_reducer.h"
#include "gac/agent/reducer.h"
#endif
#ifdef CONSUMER_WITH_NCCL
#include "gac/agent/nccl_reducer.h"
#endif
#ifdef CONSUMER_WITH_GRPC
#include <grpcpp/grpcpp.h>

#include <sstream>

#include "gac/cli/backtest.h"
#include "gac/cli/client.h"
#include "gac/cli/format.h"
#include "gac/cli/gacctl.h"
#include "gac/cli/interrupt.h"
#include "gac/cli/replay.h"
#include "gac/proto/convert.h"
#include "gac/proto/record_schema.h"
#include "gac/proto/step_window.h"
#include "gac/proto/wire_limits.h"
#include "gac/proto/wire_rules.h"
#include "gac/transport/channel.h"
#include "gac/transport/health.h"
#include "gac/transport/remote_controller.h"
#include "gac/transport/scalar_budget.h"
#include "gac/transport/spool.h"
#include "gac/transport/step_record.h"
#include "gac/transport/telemetry.h"
#include "gac/v1/control.grpc.pb.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/query.grpc.pb.h"
#include "gac/v1/query.pb.h"
#include "gac/v1/telemetry.grpc.pb.h"
#include "gac/v1/telemetry.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/health/v1/health.pb.h"
#endif
#ifdef CONSUMER_WITH_SERVER
#include "gac/server/config.h"
#include "gac/server/server.h"
#include "gac/server/store.h"
#endif

namespace {

int failures = 0;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "gac consumer: FAILED: %s\n", what);
    ++failures;
  }
}

// gac/base/mutex.h and gac/base/thread_annotations.h.
class Counter {
 public:
  void Add() GAC_EXCLUDES(mu_) {
    gac::base::MutexLock lock(&mu_);
    ++n_;
  }
  int value() GAC_EXCLUDES(mu_) {
    gac::base::MutexLock lock(&mu_);
    return n_;
  }

 private:
  gac::base::Mutex mu_;
  int n_ GAC_GUARDED_BY(mu_) = 0;
};

// gac/controller/decision_source.h: a source that always skips.
class AlwaysSkip final : public gac::controller::DecisionSource {
 public:
  gac::base::StatusOr<gac::controller::Decision> Decide(std::int64_t, const gac::controller::AlignmentStats& stats) override {
    gac::controller::Decision d;
    d.cosine = stats.dot / std::sqrt(stats.grad_sq * stats.ref_sq);
    d.regime = gac::controller::Regime::kSkip;
    d.apply_update = false;
    return d;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string scratch = argc > 1 ? argv[1] : "/tmp";
  // Controller, calibration, status, files, mutex.
  auto ctl = gac::controller::Controller::Create({0.05, 0.3});
  Check(ctl.ok(), "Controller::Create");
  const gac::controller::Decision d = ctl->Decide({0.5, 1.0, 1.0, true});  // cosine 0.5: skip
  Check(d.regime == gac::controller::Regime::kSkip, "a cosine of 0.5 skips");
  // What the build carries: the CUDA passes' images when it has them.
  const gac::agent::CudaBuildInfo cuda = gac::agent::GetCudaBuildInfo();
  Check(cuda.kernels == !cuda.archs.empty(), "GetCudaBuildInfo");
  // The windowed trigger: two steps of cosine 0.5 in a window of 2 project
  // with the window's thresholds (0.2, 0.6).
  auto windowed = gac::controller::TriggeredController::Create(
      {0.05, 0.3}, gac::controller::AlphaMode::kPaper,
      {gac::controller::Trigger::kWindow, 2, {0.2, 0.6}});
  Check(windowed.ok(), "TriggeredController::Create");
  windowed->Decide({0.5, 1.0, 1.0, true});
  const gac::controller::Decision w = windowed->Decide({0.5, 1.0, 1.0, true});
  Check(w.regime == gac::controller::Regime::kProject && w.window_mean && std::fabs(*w.window_mean - 0.5) < 1e-6,
        "the windowed trigger projects on the mean");
  gac::controller::CalibrationWindow window(100);
  for (int i = 0; i < 50; ++i) window.Add(0.01 * (i % 10));
  Check(gac::controller::SuggestThresholds(window.Stats(0.05)).ok(), "SuggestThresholds");
  Check(gac::base::Status::NotFound("x").IsNotFound(), "Status predicates");
  Check(gac::base::MakeDirs(scratch + "/consumer-dir/a", "scratch directory").ok(), "MakeDirs");
  Check(gac::base::ReadFileToString(scratch + "/consumer-dir/none", "file").status().IsNotFound(), "ReadFileToString");
  Counter counter;
  counter.Add();
  Check(counter.value() == 1, "MutexLock");
  gac::controller::StepReport report;
  report.step = 3;
  report.decision = ctl->Decide({0.1, 1.0, 1.0, true});  // cosine 0.1: project
  Check(gac::base::ParseDuration("1.5s").ok() && *gac::base::ParseDuration("1.5s") == std::chrono::milliseconds(1500),
        "ParseDuration");
  report.layers.push_back(gac::controller::LayerStats{"layer", 0.1, 1.0, 1.0});
  Check(report.layers[0].cosine().has_value(), "LayerStats::cosine");
  gac::controller::PolicyHealth policy;
  policy.tokens = 96;
  for (const gac::controller::PolicyReal& signal : gac::controller::kPolicyReals) policy.*signal.member = 0.5;
  report.policy = policy;
  const gac::controller::ReportField* ess = gac::controller::FindReportField("ess_token");
  Check(ess != nullptr && ess->get(report).present && ess->get(report).real == 0.5, "PolicyHealth in the report");

  {
    // The torch-free core over a plain buffer: one parameter of 8 floats.
    struct Buffer final : gac::agent::GradientSource {
      std::vector<float> grad = std::vector<float>(8, 1.0f);
      std::int64_t size8 = 8, stride1 = 1;
      std::size_t size() const override { return 1; }
      gac::agent::TensorView View() {
        gac::agent::TensorView v;
        v.data = grad.data();
        v.sizes = &size8;
        v.strides = &stride1;
        v.ndim = 1;
        v.numel = 8;
        v.contiguous = v.non_overlapping_and_dense = gac::agent::IsContiguous(&size8, &stride1, 1);
        return v;
      }
      gac::base::Status Describe(std::size_t, const void** id, gac::agent::TensorView* p,
                                 gac::agent::TensorView* g) override {
        *id = this;
        *p = *g = View();
        return gac::base::Status::Ok();
      }
      gac::base::Status Gather(std::size_t, std::size_t, const void** ids, gac::agent::TensorView* g,
                               bool* absent) override {
        ids[0] = this;
        g[0] = View();
        absent[0] = false;
        return gac::base::Status::Ok();
      }
    } buffer;
    auto core = gac::agent::AgentCore::Create(gac::agent::AgentOptions{});
    Check(core.ok() && (*core)->Step(1, buffer).ok(), "AgentCore::Step 1");
    auto r = core.ok() ? (*core)->Step(2, buffer) : gac::base::Status::Internal("no core");
    Check(r.ok() && r->decision.cosine && std::fabs(*r->decision.cosine - 1.0) < 1e-6, "AgentCore: cosine of equal gradients");

    // The front's own passes (FrontPasses): here a constant |g|^2 of 4.
    struct Front final : gac::agent::FrontPasses {
      gac::base::Status Statistics(const std::vector<char>&, bool, double* out) override {
        out[0] = out[2] = 0.0;
        out[1] = 4.0;
        return gac::base::Status::Ok();
      }
      gac::base::Status Apply(bool, float, bool) override { return gac::base::Status::Ok(); }
      std::int64_t snapshot_bytes() const override { return 0; }
      const char* name() const override { return "consumer"; }
    };
    gac::agent::AgentOptions front_options;
    front_options.passes = gac::agent::PassesChoice::kFront;
    front_options.front_passes = [](const gac::agent::FrontPassesRequest&)
        -> gac::base::StatusOr<std::unique_ptr<gac::agent::FrontPasses>> {
      return std::unique_ptr<gac::agent::FrontPasses>(new Front());
    };
    auto front = gac::agent::AgentCore::Create(front_options);
    auto f = front.ok() ? (*front)->Step(1, buffer) : gac::base::Status::Internal("no core");
    Check(f.ok() && f->passes == "consumer" && f->decision.grad_norm == 2.0, "AgentCore on the front's passes");
  }
#ifdef CONSUMER_WITH_AGENT
  {
    gac::agent::AgentOptions options;
    options.mode = gac::agent::Mode::kRemote;
    options.decision_source = std::make_shared<AlwaysSkip>();
    // A Gloo group of one: the reducer sums over a single rank.
    auto store = c10::make_intrusive<c10d::FileStore>(scratch + "/consumer-gloo", 1);
    auto pg_options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
    pg_options->devices = {c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")};
    c10::intrusive_ptr<c10d::Backend> gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, pg_options);
    std::shared_ptr<gac::agent::Reducer> reducer = std::make_shared<gac::agent::ProcessGroupReducer>(gloo);
    options.reducer = reducer;
    Check(reducer->world_size() == 1, "ProcessGroupReducer world size");
    Check(dynamic_cast<gac::agent::DeviceReducer*>(reducer.get()) == nullptr, "a CPU reducer is no DeviceReducer");
    auto agent = gac::agent::Agent::Create(options);
    Check(agent.ok(), "Agent::Create");
    at::Tensor w = at::zeros({8}).set_requires_grad(true);
    w.mutable_grad() = at::ones({8});
    Check((*agent)->Step(1, {w}).ok(), "Agent::Step 1");
    w.mutable_grad() = at::ones({8});
    auto r = (*agent)->Step(2, {w});
    Check(r.ok() && r->decision.cosine && std::fabs(*r->decision.cosine - 1.0) < 1e-6, "cosine of equal gradients");
    Check(r.ok() && r->decision.regime == gac::controller::Regime::kSkip && !r->step_optimizer, "the decision source decides");
    if (r.ok()) report = *r;
  }
#endif
  {
    const gac::controller::ReportField* regime = gac::controller::FindReportField("regime");
    Check(regime != nullptr && gac::controller::ReportEnumName(regime->type, regime->get(report).integer) ==
                                   std::string(gac::controller::RegimeName(report.decision.regime)),
          "the report's field table");
  }
#ifdef CONSUMER_WITH_NCCL
  Check(gac::agent::NcclReducer::Create(nullptr, nullptr).status().IsInvalidArgument(),
        "NcclReducer refuses a null communicator");
#endif
#ifdef CONSUMER_WITH_GRPC
  {
    const gac::v1::StepRecord record = gac::transport::MakeStepRecord(report, {"consumer", 0, 1}, {{"reward", 1.0}});
    Check(record.step() == report.step && record.regime() == gac::proto::ToProto(report.decision.regime),
          "MakeStepRecord");
    gac::v1::DecideResponse response;
    gac::proto::EncodeDecision(d, &response);
    Check(gac::proto::DecodeDecision(response, {0.5, 1.0, 1.0, true}).ok(), "Encode/DecodeDecision");
    Check(gac::proto::FindStepField("step")->get(record).integer == record.step() &&
              gac::proto::CheckRunId("consumer").ok(),
          "record schema and wire rules");
    gac::proto::StepWindowMeans means(1, 0, [](std::uint32_t, std::int64_t, std::int64_t,
                                               const std::function<void(const gac::v1::StepRecord&)>&) {
      return gac::base::Status::Ok();
    });
    gac::v1::StepRecord valid = record;
    valid.set_regime(gac::v1::REGIME_SAFE);
    valid.set_cosine(0.25);
    const auto m = means.Next(valid);
    Check(m.ok() && m->has_value() && **m == 0.25, "StepWindowMeans");
    gac::transport::SpoolRecovery recovery;
    gac::transport::SpoolOptions spool_options;
    spool_options.dir = scratch + "/consumer-spool";
    Check(gac::transport::Spool::Open(spool_options, &recovery).ok(), "Spool::Open");
    auto channel = gac::transport::MakeGacdChannel("127.0.0.1:1", "", std::chrono::milliseconds(100));
    Check(channel != nullptr, "MakeGacdChannel");
    // gac::cli: replay, rows, the client, the command line.
    gac::cli::Replayer replayer(*gac::controller::Controller::Create({0.1, 0.3}));
    replayer.Add({0, std::nullopt, gac::controller::Regime::kSafe, 1.0});
    replayer.Add({1, 0.2, gac::controller::Regime::kSkip, 1.0});
    Check(replayer.replayed().count(gac::controller::Regime::kProject) == 1 && replayer.differing_count() == 1, "Replayer");
    Check(gac::cli::ThresholdGrid({0.05}, {0.3}).ok(), "ThresholdGrid");
    // A run that learns and then falls below 0.7 of its peak for good.
    const gac::cli::RunOutcome outcome =
        gac::cli::ClassifyOutcome(0.2, {{20, 0.5}, {40, 0.8}, {60, 0.3}, {80, 0.2}});
    Check(outcome.outcome == gac::cli::Outcome::kCollapsed && outcome.collapse_step == 60, "ClassifyOutcome");
    Check(gac::cli::ValidateAlertSettings(gac::cli::AlertSettings{}).ok(), "ValidateAlertSettings");
    std::ostringstream csv;
    auto rows = gac::cli::RowWriter::Create(*gac::cli::ParseFormat("csv"), &csv, {{"step", "STEP", true, 0}});
    rows->Add({gac::cli::Cell::Int(7)});
    rows->Flush();
    Check(csv.str() == "step\n7\n", "RowWriter");
    gac::cli::ConnectionOptions conn;
    conn.address = "127.0.0.1:1";
    conn.timeout = std::chrono::milliseconds(500);
    gac::cli::GacdClient client(conn);
    Check(client.Health("").status().IsUnavailable(), "GacdClient to nothing");
    gac::cli::Interrupt interrupt;
    interrupt.Request();
    Check(interrupt.WaitFor(std::chrono::milliseconds(1)), "Interrupt");
    std::ostringstream out, err;
    Check(gac::cli::RunGacctl({"--version"}, {}, out, err) == gac::cli::kExitOk, "gacctl --version");
  }
#endif
#ifdef CONSUMER_WITH_SERVER
  {
    gac::server::ServerConfig config;
    config.listen = "127.0.0.1:0";
    config.metrics_listen = "";
    config.insecure = true;
    config.store = "memory";
    auto server = gac::server::GacServer::Start(config);
    Check(server.ok(), "GacServer::Start");
    if (!server.ok()) return 1;
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckResponse health;
    Check(stub->Check(&ctx, {}, &health).ok() && health.status() == health.SERVING, "health");
    auto serving = gac::transport::CheckGacdHealth((*server)->address(), {}, "", std::chrono::seconds(10));
    Check(serving.ok(), "CheckGacdHealth");
    gac::transport::TelemetryOptions topts;
    topts.address = (*server)->address();
    auto telemetry = gac::transport::Telemetry::Start(topts);
    Check(telemetry.ok(), "Telemetry::Start");
    gac::v1::StepRecord record = gac::transport::MakeStepRecord(report, {"consumer", 0, 1});
    Check((*telemetry)->Enqueue(std::move(record)) && (*telemetry)->Flush(std::chrono::seconds(30)), "Flush");
    gac::transport::RemoteControllerOptions ro;
    ro.address = (*server)->address();
    ro.run = "consumer";
    ro.deadline = std::chrono::seconds(5);
    auto remote = gac::transport::RemoteController::Create(ro);
    Check(remote.ok() && (*remote)->Decide(4, {0.5, 1.0, 1.0, true}).ok(), "RemoteController::Decide");
    auto runs = (*server)->store().ListRuns("", 10);
    Check(runs.ok() && runs->size() == 1 && (*runs)[0].run() == "consumer", "Store::ListRuns");
    auto info = (*server)->store().GetRun("consumer");
    Check(info.ok() && info->step_records() == 1, "Store::GetRun");
    auto store = gac::server::NewMemoryStore();
    Check(store->GetRun("consumer").status().code() == gac::base::StatusCode::kNotFound, "NewMemoryStore");
    std::ostringstream steps, steps_err;
    Check(gac::cli::RunGacctl({"steps", "consumer", "--format", "csv", "--address", (*server)->address()}, {}, steps,
                              steps_err) == gac::cli::kExitOk &&
              steps.str().rfind("run,step,rank,", 0) == 0 && steps.str().find("\nconsumer,") != std::string::npos,
          "gacctl steps");
    const char* help_argv[] = {"gacd", "--help"};
    auto flags = gac::server::ParseFlags(2, help_argv);
    Check(flags.ok() && flags->help, "ParseFlags --help");
  }
#endif
  if (failures != 0) return 1;
  std::printf("gac consumer: ok\n");
  return 0;
}
