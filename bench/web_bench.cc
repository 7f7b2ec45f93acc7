// web_bench: gacd's HTTP steps endpoint (GET /api/v1/runs/{run}/steps,
// JSON) against gRPC's QueryService.GetSteps of the same records, in the
// same process and the same run (see docs/BENCHMARKS.md).
//
//   web_bench [--quick] [--steps N] [--layers L] [--rounds R] [--json]
//
// A synthetic run of N steps (default 100,000) of one rank with L layers
// each (default 50) is written straight into a SQLite store in a scratch
// directory; an in-process gacd serves it. Both clients read the whole run
// in pages of P step records (P = 1,000 and 10,000), asked by step range so
// that neither has to decode a page to find the next: gRPC through a
// grpc::GenericStub (the response bytes are counted, not parsed), HTTP with
// one plain GET per page (the JSON body's bytes are counted, not parsed).
// Each configuration (with and without the layers) is read R times
// (default 3), the order of the two clients alternating; the medians give
// records/s and bytes/s of each, and the ratios HTTP / gRPC. The target of
// the issue is HTTP bytes/s >= 0.5x gRPC's; records/s is the stricter
// ratio, since a JSON record is larger than its protobuf.
//
// This is a benchmark, not a test: it asserts nothing about timing. It exits
// non-zero when a page is refused or holds the wrong number of records.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "gac/server/config.h"
#include "gac/server/server.h"
#include "gac/server/store.h"
#include "gac/v1/query.pb.h"
#include "tests/dashboards/synthetic_run.h"

namespace {

using Clock = std::chrono::steady_clock;
using gac::bench::Median;
using gac::bench::Seconds;

constexpr const char* kRun = "bench";

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "web_bench: %s\n", what.c_str());
  std::exit(1);
}

// Occurrences of `needle` in `text`.
std::size_t Count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

class GrpcReader {
 public:
  explicit GrpcReader(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);  // a page of 10,000 records with 50 layers is ~20 MB
    stub_ = std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }

  // One page: its serialized response.
  grpc::ByteBuffer Page(std::int64_t from, std::int64_t to, bool layers) {
    gac::v1::GetStepsRequest req;
    req.set_run(kRun);
    req.set_start_step(from);
    req.set_end_step(to);
    req.set_rank(0);
    req.set_include_layers(layers);
    req.set_page_size(static_cast<std::uint32_t>(to - from));
    const std::string bytes = req.SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    std::promise<grpc::Status> done;
    stub_->UnaryCall(&ctx, "/gac.v1.QueryService/GetSteps", grpc::StubOptions(), &request, &response,
                     [&](grpc::Status s) { done.set_value(std::move(s)); });
    const grpc::Status st = done.get_future().get();
    if (!st.ok()) Fail("GetSteps: " + st.error_message());
    return response;
  }

 private:
  std::unique_ptr<grpc::GenericStub> stub_;
};

std::string HttpPage(int port, std::int64_t from, std::int64_t to, bool layers) {
  std::string body;
  const std::string path = std::string("/api/v1/runs/") + kRun + "/steps?start_step=" + std::to_string(from) +
                           "&end_step=" + std::to_string(to) + "&rank=0&page_size=" + std::to_string(to - from) +
                           (layers ? "&layers=1" : "");
  const std::string error = gac::bench::HttpGet(port, path, &body);
  if (!error.empty()) Fail("GET " + path + ": " + error);
  return body;
}

struct Pass {
  double seconds = 0;
  double bytes = 0;
};

struct Row {
  bool layers;
  std::int64_t page;
  double grpc_s, http_s, grpc_bytes, http_bytes;
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t steps = 100000;
  int layers = 50, rounds = 3;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const char* v = nullptr;
    const std::string a = argv[i];
    if (a == "--quick") {
      steps = 3000;
      layers = 8;
      rounds = 1;
    } else if (a == "--json") {
      json = true;
    } else if (gac::bench::FlagValue(argc, argv, &i, "--steps", &v) && v != nullptr) {
      steps = std::atoll(v);
    } else if (gac::bench::FlagValue(argc, argv, &i, "--layers", &v) && v != nullptr) {
      layers = std::atoi(v);
    } else if (gac::bench::FlagValue(argc, argv, &i, "--rounds", &v) && v != nullptr) {
      rounds = std::atoi(v);
    } else {
      std::fprintf(stderr, "usage: web_bench [--quick] [--steps N] [--layers L] [--rounds R] [--json]\n");
      return 2;
    }
  }
  if (steps < 1000 || layers < 0 || rounds < 1) Fail("need --steps >= 1000, --layers >= 0, --rounds >= 1");

  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/web_bench-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) Fail("cannot create a scratch directory: " + std::string(std::strerror(errno)));
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{dir};

  std::printf("web_bench: %s, %u hardware threads\n", gac::bench::CpuModel().c_str(),
              std::thread::hardware_concurrency());
  std::printf("writing a run of %lld steps x %d layers into %s/gacd.db ...\n", static_cast<long long>(steps), layers,
              dir.c_str());
  std::fflush(stdout);
  const auto t0 = Clock::now();
  {
    gac::server::SqliteOptions sqlite;
    sqlite.synchronous = "NORMAL";
    auto store = gac::server::OpenSqliteStore(dir + "/gacd.db", sqlite);
    if (!store.ok()) Fail(store.status().ToString());
    gac::testing::SyntheticRunOptions o;
    o.run = kRun;
    o.world = 1;
    o.layers = layers;
    o.spike = true;
    o.spike_start = steps / 2;
    const gac::base::Status st = gac::testing::StoreSyntheticRun(**store, o, steps);
    if (!st.ok()) Fail(st.ToString());
  }
  std::printf("  stored in %.1f s\n", Seconds(t0, Clock::now()));

  gac::server::ServerConfig config;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "127.0.0.1:0";
  config.insecure = true;
  config.db = dir + "/gacd.db";
  auto gacd = gac::server::GacServer::Start(config);
  if (!gacd.ok()) Fail("cannot start gacd: " + gacd.status().ToString());
  const int http_port = (*gacd)->metrics_port();
  GrpcReader grpc_reader((*gacd)->address());

  // The pages hold what they should (checked once, not timed).
  {
    gac::v1::GetStepsResponse page;
    std::vector<grpc::Slice> slices;
    grpc::ByteBuffer buffer = grpc_reader.Page(0, 1000, true);
    if (!buffer.Dump(&slices).ok()) Fail("cannot read a response");
    std::string bytes;
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    if (!page.ParseFromString(bytes) || page.steps_size() != 1000 || page.steps(999).step() != 999) {
      Fail("GetSteps returned a wrong page");
    }
    const std::string body = HttpPage(http_port, 0, 1000, true);
    // Step 0 has no reference, hence no layer records.
    if (Count(body, "\"rank\":") != 1000 || Count(body, "\"name\":") != 999 * static_cast<std::size_t>(layers)) {
      Fail("the steps endpoint returned a wrong page: " + body.substr(0, 300));
    }
  }

  std::vector<Row> rows;
  for (bool with_layers : {true, false}) {
    for (std::int64_t page : {std::int64_t{1000}, std::int64_t{10000}}) {
      std::vector<double> grpc_s, http_s;
      double grpc_bytes = 0, http_bytes = 0;
      const auto grpc_pass = [&] {
        Pass p;
        const auto start = Clock::now();
        for (std::int64_t from = 0; from < steps; from += page) {
          p.bytes += static_cast<double>(grpc_reader.Page(from, std::min(from + page, steps), with_layers).Length());
        }
        p.seconds = Seconds(start, Clock::now());
        return p;
      };
      const auto http_pass = [&] {
        Pass p;
        const auto start = Clock::now();
        for (std::int64_t from = 0; from < steps; from += page) {
          p.bytes += static_cast<double>(HttpPage(http_port, from, std::min(from + page, steps), with_layers).size());
        }
        p.seconds = Seconds(start, Clock::now());
        return p;
      };
      for (int r = 0; r < rounds; ++r) {
        Pass g, h;
        if (r % 2 == 0) {
          g = grpc_pass();
          h = http_pass();
        } else {
          h = http_pass();
          g = grpc_pass();
        }
        grpc_s.push_back(g.seconds);
        http_s.push_back(h.seconds);
        grpc_bytes = g.bytes;
        http_bytes = h.bytes;
      }
      rows.push_back({with_layers, page, Median(grpc_s), Median(http_s), grpc_bytes, http_bytes});
      const Row& row = rows.back();
      std::printf("%s, pages of %5lld: gRPC %.2f s (%.0f MB), HTTP %.2f s (%.0f MB)\n",
                  with_layers ? "with layers   " : "without layers", static_cast<long long>(page), row.grpc_s,
                  row.grpc_bytes / 1e6, row.http_s, row.http_bytes / 1e6);
      std::fflush(stdout);
    }
  }
  (*gacd)->Shutdown(std::chrono::milliseconds(0));

  std::printf("\n%lld steps of one rank, %d layers each; medians of %d rounds\n\n", static_cast<long long>(steps),
              layers, rounds);
  std::printf("| records | page | gRPC records/s | HTTP records/s | gRPC MB/s | HTTP MB/s | bytes HTTP/gRPC | "
              "HTTP/gRPC bytes/s | HTTP/gRPC records/s |\n|---|---|---|---|---|---|---|---|---|\n");
  std::string json_out = "{";
  for (const Row& r : rows) {
    const double n = static_cast<double>(steps);
    const double bytes_ratio = (r.http_bytes / r.http_s) / (r.grpc_bytes / r.grpc_s);
    const double records_ratio = r.grpc_s / r.http_s;
    std::printf("| %s | %lld | %.0f | %.0f | %.0f | %.0f | %.2f | **%.2f** | %.2f |\n",
                r.layers ? "with layers" : "without layers", static_cast<long long>(r.page), n / r.grpc_s,
                n / r.http_s, r.grpc_bytes / r.grpc_s / 1e6, r.http_bytes / r.http_s / 1e6,
                r.http_bytes / r.grpc_bytes, bytes_ratio, records_ratio);
    const std::string key = std::string(r.layers ? "layers" : "plain") + "_" + std::to_string(r.page);
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s\"%s_bytes_ratio\":%.3f,\"%s_records_ratio\":%.3f", json_out.size() > 1 ? "," : "",
                  key.c_str(), bytes_ratio, key.c_str(), records_ratio);
    json_out += buf;
  }
  if (json) std::printf("\n%s}\n", json_out.c_str());
  return 0;
}
