// gacd's Ingest path after the bytes arrive: parse a gac.v1.IngestRequest,
// ValidateIngestRequest, and for a valid batch the store write and the
// metrics of the stored records. Properties: a batch that passed validation
// is stored (every record new in an empty store, or a duplicate in the
// shared SQLite one), reads back, and its metrics render.
#include <chrono>
#include <cstdint>
#include <memory>

#include "gac/server/store.h"
#include "server/src/metrics.h"
#include "server/src/validate.h"
#include "tests/fuzz/fuzz_util.h"

namespace gac::fuzz {
namespace {

struct Shared {
  ScratchDir dir;
  std::unique_ptr<server::Store> sqlite;
  int applied = 0;
  Shared() {
    server::SqliteOptions o;
    o.synchronous = "OFF";
    auto opened = server::OpenSqliteStore(dir.path() + "/gacd.db", o);
    GAC_FUZZ_CHECK(opened.ok(), opened.status().ToString());
    sqlite = std::move(*opened);
  }
};

Shared& Get() {
  static Shared* shared = new Shared();
  return *shared;
}

}  // namespace
}  // namespace gac::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  v1::IngestRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const server::Limits limits;
  const base::Status valid = server::ValidateIngestRequest(request, limits);
  if (!valid.ok()) {
    GAC_FUZZ_CHECK(valid.IsInvalidArgument(), valid.ToString());
    return 0;
  }
  // Every record of a valid batch passes the per-record check too.
  for (const v1::StepRecord& r : request.records()) {
    GAC_FUZZ_CHECK(server::ValidateStepRecord(r, limits).ok(), r.ShortDebugString());
  }

  auto memory = server::NewMemoryStore();
  std::vector<server::WriteOp> ops(1);
  ops[0].steps = &request;
  ops[0].received_ns = 1;
  base::Status st = memory->Apply(&ops);
  GAC_FUZZ_CHECK(st.ok(), st.ToString());
  GAC_FUZZ_CHECK(ops[0].stored == static_cast<std::uint32_t>(request.records_size()) && ops[0].duplicates == 0,
                 "a valid batch in an empty store is stored whole");
  for (const v1::StepRecord& r : request.records()) {
    server::StepQuery q;
    q.run = r.run();
    q.start_step = r.step();
    q.rank = r.rank();
    q.include_layers = true;
    q.limit = 1;
    auto back = memory->GetSteps(q);
    GAC_FUZZ_CHECK(back.ok() && back->size() == 1 && (*back)[0].step() == r.step(),
                   "a stored record reads back: " + r.ShortDebugString());
    GAC_FUZZ_CHECK((*back)[0].layers_size() == r.layers_size(), "its layers read back");
  }

  // The SQLite store keeps what earlier inputs wrote: a record is new or a
  // duplicate, never lost. Emptied now and then so that it stays small.
  fuzz::Shared& shared = fuzz::Get();
  std::vector<server::WriteOp> sql_ops(1);
  sql_ops[0].steps = &request;
  sql_ops[0].received_ns = 1;
  st = shared.sqlite->Apply(&sql_ops);
  GAC_FUZZ_CHECK(st.ok(), st.ToString());
  GAC_FUZZ_CHECK(sql_ops[0].stored + sql_ops[0].duplicates == static_cast<std::uint32_t>(request.records_size()),
                 "every record is stored or a duplicate");
  if (++shared.applied % 512 == 0) {
    auto deleted = shared.sqlite->DeleteIdleRuns(INT64_MAX);
    GAC_FUZZ_CHECK(deleted.ok(), deleted.status().ToString());
  }

  server::MetricsOptions mo;
  mo.per_layer = true;
  server::Metrics metrics(mo);
  const auto now = std::chrono::system_clock::now();
  for (const v1::StepRecord& r : request.records()) metrics.ObserveStep(r, now);
  metrics.ObserveIngest(ops[0].stored, 0, 0);
  GAC_FUZZ_CHECK(!metrics.Render().empty(), "metrics render");
  return 0;
}
