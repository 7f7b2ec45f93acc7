// Writes the binary seeds of tests/fuzz/corpus (the Protobuf requests and
// the spool segments), so that they can be made again after a change of
// the wire contract or the spool format:
//
//   build-sanitize/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
//
// Text seeds (config and token files, page tokens) are kept by hand.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "gac/proto/convert.h"
#include "gac/transport/spool.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/query.pb.h"
#include "gac/v1/telemetry.pb.h"

namespace {

std::string root;

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(root + "/" + target);
  std::ofstream out(root + "/" + target + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

gac::v1::StepRecord Record(const std::string& run, std::int64_t step, std::uint32_t rank = 0) {
  gac::v1::StepRecord r;
  r.set_run(run);
  r.set_step(step);
  r.set_rank(rank);
  r.set_world_size(2);
  r.set_regime(gac::v1::REGIME_PROJECT);
  r.set_mode(gac::v1::CONTROL_MODE_REMOTE);
  r.set_cosine(0.2);
  r.set_cosine_after(0.05);
  r.set_alpha(0.25);
  r.set_grad_norm(3.5);
  r.set_ref_norm(2.0);
  r.set_staleness(4);
  r.set_wall_time_ns(1700000000000000000);
  r.set_agent_overhead_seconds(0.001);
  (*r.mutable_scalars())["reward"] = 0.5;
  (*r.mutable_scalars())["agent_records_sent"] = 12;
  return r;
}

void IngestSeeds() {
  gac::v1::IngestRequest b;
  b.set_sequence(1);
  *b.add_records() = Record("exp-a", 0);
  *b.add_records() = Record("exp-a", 0, 1);
  Seed("ingest_request", "two-ranks", b.SerializeAsString());
  gac::v1::IngestRequest layers;
  layers.set_sequence(7);
  gac::v1::StepRecord r = Record("exp-b/run:1", 123456789);
  for (int i = 0; i < 4; ++i) {
    gac::v1::LayerRecord* l = r.add_layers();
    l->set_name("model.layers." + std::to_string(i) + ".mlp");
    l->set_cosine(0.1 * i);
    l->set_grad_norm(1.0 + i);
    l->set_ref_norm(2.0);
  }
  *layers.add_records() = r;
  Seed("ingest_request", "layers", layers.SerializeAsString());
  gac::v1::IngestRequest first;
  first.set_sequence(2);
  gac::v1::StepRecord f = Record("exp-first", 0);
  f.clear_cosine();
  f.clear_cosine_after();
  f.set_regime(gac::v1::REGIME_SAFE);
  *first.add_records() = f;
  gac::v1::StepRecord big = Record("exp-first", std::numeric_limits<std::int64_t>::max() - 1);
  *first.add_records() = big;
  Seed("ingest_request", "first-and-large-step", first.SerializeAsString());
  gac::v1::IngestRequest bad = b;
  bad.mutable_records(0)->set_cosine(2.0);
  Seed("ingest_request", "bad-cosine", bad.SerializeAsString());
}

void DecideSeeds() {
  const gac::controller::AlignmentStats stats[] = {
      {0.2, 1.0, 1.0, true}, {0.9, 1.0, 1.0, true}, {0.0, 1.0, 0.0, false}, {-3.0, 4.0, 9.0, true},
      {std::numeric_limits<double>::quiet_NaN(), 1.0, 1.0, true}};
  int i = 0;
  for (const auto& s : stats) {
    Seed("decide_request", "stats-" + std::to_string(i), gac::proto::ToDecideRequest("exp-a", 1, i * 10, s).SerializeAsString());
    ++i;
  }
  Seed("decide_request", "exact-run",
       gac::proto::ToDecideRequest("exp-exact", 0, 3, {0.3, 1.0, 1.0, true}).SerializeAsString());
  // Answers to the request of decide_response_fuzzer (run exp-fuzz, step 12):
  // the selector byte picks its statistics.
  i = 0;
  for (const auto& s : stats) {
    const gac::v1::DecideRequest req = gac::proto::ToDecideRequest("exp-fuzz", 0, 12, s);
    const gac::controller::Decision d = gac::controller::Controller::Create(gac::controller::Thresholds{})->Decide(s);
    gac::v1::DecideResponse resp;
    gac::proto::EncodeDecideResponse(req, d, &resp);
    Seed("decide_response", "honest-" + std::to_string(i), std::string(1, static_cast<char>(i)) + resp.SerializeAsString());
    resp.set_alpha(1.5);
    Seed("decide_response", "alpha-" + std::to_string(i), std::string(1, static_cast<char>(i)) + resp.SerializeAsString());
    ++i;
  }
}

void AdminSeeds() {
  gac::v1::GetRunConfigRequest get;
  get.set_run("exp-a");
  Seed("admin_request", "get", std::string(1, '\0') + get.SerializeAsString());
  gac::v1::SetRunConfigRequest set;
  set.set_run("exp-a");
  set.mutable_thresholds()->set_c_low(0.1);
  set.mutable_thresholds()->set_c_high(0.4);
  set.mutable_thresholds()->set_alpha_mode(gac::v1::ALPHA_MODE_EXACT);
  set.set_mode(gac::v1::CONTROL_MODE_REMOTE);
  set.set_reason("calibrated");
  Seed("admin_request", "set", std::string(1, '\1') + set.SerializeAsString());
  set.set_expected_version(3);
  Seed("admin_request", "set-stale", std::string(1, '\1') + set.SerializeAsString());
  gac::v1::ListConfigChangesRequest list;
  list.set_run("exp-a");
  list.set_page_size(1);
  list.set_page_token("o1");
  Seed("admin_request", "list", std::string(1, '\2') + list.SerializeAsString());
}

void QuerySeeds() {
  gac::v1::ListRunsRequest runs;
  runs.set_page_size(2);
  runs.set_page_token("rexp-a");
  Seed("query_request", "list-runs", std::string(1, '\0') + runs.SerializeAsString());
  gac::v1::GetStepsRequest steps;
  steps.set_run("exp-b");
  steps.set_start_step(3);
  steps.set_end_step(90);
  steps.set_page_size(5);
  steps.set_page_token("s9.1");
  steps.set_include_layers(true);
  Seed("query_request", "get-steps", std::string(1, '\1') + steps.SerializeAsString());
  steps.set_rank(1);
  steps.clear_page_token();
  Seed("query_request", "get-steps-rank", std::string(1, '\1') + steps.SerializeAsString());
  gac::v1::GetRunSummaryRequest summary;
  summary.set_run("exp-a");
  summary.set_window(10);
  Seed("query_request", "summary", std::string(1, '\2') + summary.SerializeAsString());
}

void SpoolSeeds() {
  // Segments written by the spool itself, then read back as files.
  const std::string dir = root + "/../spool-seed-tmp";
  std::filesystem::remove_all(dir);
  gac::transport::SpoolOptions o;
  o.dir = dir;
  {
    auto spool = gac::transport::Spool::Open(o, nullptr);
    if (!spool.ok()) std::abort();
    for (std::uint64_t seq = 1; seq <= 3; ++seq) {
      gac::v1::IngestRequest b;
      b.set_sequence(seq);
      *b.add_records() = Record("exp-a", static_cast<std::int64_t>(seq));
      if (!(*spool)->Append(seq, b.SerializeAsString()).ok()) std::abort();
    }
  }
  std::string segment;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    segment.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::filesystem::remove_all(dir);
  // Input: length and text of ACKED, two-byte length and bytes of a first
  // segment, a second segment.
  auto input = [](const std::string& acked, const std::string& first, const std::string& second) {
    std::string in(1, static_cast<char>(acked.size()));
    in += acked;
    in += static_cast<char>(first.size() & 0xff);
    in += static_cast<char>(first.size() >> 8);
    return in + first + second;
  };
  Seed("spool", "three-entries", input("", segment, ""));
  Seed("spool", "one-acknowledged", input("1", segment, ""));
  Seed("spool", "torn-tail", input("", segment.substr(0, segment.size() - 7), ""));
  std::string damaged = segment;
  damaged[30] ^= 0x40;
  Seed("spool", "checksum-mismatch", input("", damaged, ""));
  Seed("spool", "two-segments", input("", segment.substr(0, segment.size() / 2), segment));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  root = argv[1];
  IngestSeeds();
  DecideSeeds();
  AdminSeeds();
  QuerySeeds();
  SpoolSeeds();
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
