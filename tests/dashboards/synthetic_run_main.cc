// gac_synthetic_run: streams a synthetic run (synthetic_run.h) into a gacd in
// real time, as an agent would. dashboards/render_panels.py uses it to make
// the panel pictures of docs/OPERATIONS.md from real Prometheus data; it is
// also handy to look at a dashboard without a trainer.
//
//   gac_synthetic_run --target=127.0.0.1:7070 --run=demo --steps=600 --rate=10 --spike-start=200
//
// With --db=FILE instead of --target it writes the run straight into a
// SQLite store file (no gacd; as fast as SQLite takes it), for runs too long
// to stream: the page's browser test loads a 100,000-step run made so.
//
// Exits 0 when every batch was acknowledged (or stored), 1 on a gRPC or
// store error, 2 on bad flags.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "gac/v1/control.grpc.pb.h"
#include "gac/v1/telemetry.grpc.pb.h"
#include "synthetic_run.h"

namespace {

const char kUsage[] =
    "usage: gac_synthetic_run --target=HOST:PORT --run=ID [flags]\n"
    "       gac_synthetic_run --db=FILE --run=ID [flags]   (straight into a SQLite store; no --rate)\n"
    "  --token=T            bearer token (none: gacd --insecure)\n"
    "  --steps=N            steps to send (default 600)\n"
    "  --rate=R             steps per second (default 10; 0 = as fast as acknowledged)\n"
    "  --world=N            reporting ranks (default 2)\n"
    "  --seed=N             noise seed (default 1)\n"
    "  --spike-start=STEP   start of the alignment spike (default: no spike)\n"
    "  --spike-ramp=N       steps up to the peak and back (default 40)\n"
    "  --spike-hold=N       steps at the peak (default 60)\n"
    "  --spike-peak=C       peak c_t (default 0.55)\n"
    "  --no-recover         stay at the peak\n"
    "  --layers=N           per-layer rows per record (default 8)\n"
    "  --remote             remote mode: ask gacd (Decide) every step\n"
    "  --fallback-every=N   remote: every Nth step uses the local decision (default 0)\n"
    "  --policy             send policy-health signals (ESS, clipping, KL...; they drift with the spike)\n";

bool Flag(const std::string& arg, const char* name, std::string* value) {
  const std::string prefix = std::string("--") + name + "=";
  if (arg.rfind(prefix, 0) != 0) return false;
  *value = arg.substr(prefix.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  gac::testing::SyntheticRunOptions o;
  o.run.clear();
  std::string target, db, token, v;
  int steps = 600;
  double rate = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (Flag(a, "target", &v)) {
      target = v;
    } else if (Flag(a, "db", &v)) {
      db = v;
    } else if (Flag(a, "run", &v)) {
      o.run = v;
    } else if (Flag(a, "token", &v)) {
      token = v;
    } else if (Flag(a, "steps", &v)) {
      steps = std::atoi(v.c_str());
    } else if (Flag(a, "rate", &v)) {
      rate = std::atof(v.c_str());
    } else if (Flag(a, "world", &v)) {
      o.world = static_cast<std::uint32_t>(std::atoi(v.c_str()));
    } else if (Flag(a, "seed", &v)) {
      o.seed = std::strtoull(v.c_str(), nullptr, 10);
    } else if (Flag(a, "spike-start", &v)) {
      o.spike = true;
      o.spike_start = std::atoll(v.c_str());
    } else if (Flag(a, "spike-ramp", &v)) {
      o.spike_ramp = std::atoll(v.c_str());
    } else if (Flag(a, "spike-hold", &v)) {
      o.spike_hold = std::atoll(v.c_str());
    } else if (Flag(a, "spike-peak", &v)) {
      o.spike_peak = std::atof(v.c_str());
    } else if (a == "--no-recover") {
      o.recover = false;
    } else if (Flag(a, "layers", &v)) {
      o.layers = std::atoi(v.c_str());
    } else if (a == "--remote") {
      o.remote = true;
    } else if (Flag(a, "fallback-every", &v)) {
      o.fallback_every = std::atoi(v.c_str());
    } else if (a == "--policy") {
      o.policy = true;
    } else {
      std::fprintf(stderr, "gac_synthetic_run: unknown argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (target.empty() == db.empty() || o.run.empty() || steps <= 0 || o.world == 0 || rate < 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (!db.empty()) {
    gac::server::SqliteOptions sqlite;
    sqlite.synchronous = "NORMAL";  // a scratch store: no fsync per transaction
    auto store = gac::server::OpenSqliteStore(db, sqlite);
    gac::base::Status st = store.ok() ? gac::testing::StoreSyntheticRun(**store, o, steps) : store.status();
    if (!st.ok()) {
      std::fprintf(stderr, "gac_synthetic_run: %s: %s\n", db.c_str(), st.ToString().c_str());
      return 1;
    }
    std::fprintf(stderr, "gac_synthetic_run: %s: %d steps stored in %s\n", o.run.c_str(), steps, db.c_str());
    return 0;
  }

  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto ingest = gac::v1::IngestService::NewStub(channel);
  auto control = gac::v1::ControlService::NewStub(channel);
  auto context = [&](grpc::ClientContext& ctx, int seconds) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  };

  gac::testing::SyntheticRun run(o);
  grpc::ClientContext stream_ctx;
  context(stream_ctx, 3600 * 24);
  auto stream = ingest->Ingest(&stream_ctx);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    gac::v1::DecideResponse decision;
    bool have_decision = false;
    if (o.remote) {
      grpc::ClientContext ctx;
      context(ctx, 5);
      const grpc::Status st = control->Decide(&ctx, run.NextDecideRequest(), &decision);
      if (!st.ok()) {
        std::fprintf(stderr, "gac_synthetic_run: Decide: %s\n", st.error_message().c_str());
        return 1;
      }
      have_decision = true;
    }
    gac::v1::IngestRequest batch;
    batch.set_sequence(static_cast<std::uint64_t>(i) + 1);
    for (auto& r : run.NextStep(have_decision ? &decision : nullptr)) *batch.add_records() = std::move(r);
    gac::v1::IngestAck ack;
    if (!stream->Write(batch) || !stream->Read(&ack)) break;
    if (rate > 0) {
      std::this_thread::sleep_until(t0 + std::chrono::microseconds(static_cast<long long>(1e6 * (i + 1) / rate)));
    }
  }
  stream->WritesDone();
  const grpc::Status st = stream->Finish();
  if (!st.ok()) {
    std::fprintf(stderr, "gac_synthetic_run: Ingest: %s\n", st.error_message().c_str());
    return 1;
  }
  std::fprintf(stderr, "gac_synthetic_run: %s: %d steps sent\n", o.run.c_str(), steps);
  return 0;
}
