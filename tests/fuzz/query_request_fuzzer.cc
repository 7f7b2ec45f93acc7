// gacd's QueryService after the bytes arrive, through server/src/queries.h
// as its handlers call it: the first byte picks ListRuns, GetSteps or
// GetRunSummary, the rest is the request, over a store holding a few runs.
// Properties: a page never exceeds its size, a next page token decodes and
// continues strictly after the page, a reader sees only readable runs.
#include <cstdint>
#include <memory>

#include "server/src/queries.h"
#include "server/src/validate.h"
#include "tests/fuzz/fuzz_util.h"

namespace gac::fuzz {
namespace {

struct World {
  std::unique_ptr<server::Store> store = server::NewMemoryStore();
  server::RunRegistry registry{[] {
                                 v1::Thresholds t;
                                 t.set_c_low(0.05);
                                 t.set_c_high(0.3);
                                 return t;
                               }(),
                               v1::CONTROL_MODE_LOCAL};
  server::Principal reader;  // read on exp-* only
  std::vector<std::unique_ptr<v1::IngestRequest>> batches;

  World() {
    reader.name = "reader";
    reader.rights = server::kRead;
    reader.run_patterns = {"exp-*"};
    const char* runs[] = {"exp-a", "exp-b", "other-c", "exp-d/1", "x"};
    std::uint64_t seq = 0;
    for (const char* run : runs) {
      auto b = std::make_unique<v1::IngestRequest>();
      b->set_sequence(++seq);
      for (int step = 0; step < 40; ++step) {
        for (std::uint32_t rank = 0; rank < 2; ++rank) {
          v1::StepRecord* r = b->add_records();
          r->set_run(run);
          r->set_step(step * 3);
          r->set_rank(rank);
          r->set_world_size(2);
          r->set_regime(step % 7 == 0 ? v1::REGIME_SKIP : v1::REGIME_SAFE);
          if (step > 0) r->set_cosine(0.01 * (step % 50));
          r->set_grad_norm(1.0);
          r->set_ref_norm(1.0);
          v1::LayerRecord* l = r->add_layers();
          l->set_name("layer.0");
          l->set_grad_norm(0.5);
        }
      }
      std::vector<server::WriteOp> ops(1);
      ops[0].steps = b.get();
      if (!store->Apply(&ops).ok()) std::abort();
      batches.push_back(std::move(b));
    }
  }
};

}  // namespace
}  // namespace gac::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  static fuzz::World* world = new fuzz::World();
  fuzz::Input in(data, size);
  const std::uint8_t kind = in.Byte() % 3;
  if (kind == 0) {
    v1::ListRunsRequest req;
    if (!in.ParseRest(&req)) return 0;
    auto page = server::ListRunsPage(*world->store, world->registry, world->reader, req);
    if (!page.ok()) {
      GAC_FUZZ_CHECK(page.status().IsInvalidArgument(), page.status().ToString());
      return 0;
    }
    const std::uint32_t limit = *server::PageSize(req.page_size(), server::kRunPages);
    GAC_FUZZ_CHECK(static_cast<std::uint32_t>(page->runs_size()) <= limit, "page within its size");
    for (const v1::RunInfo& r : page->runs()) {
      GAC_FUZZ_CHECK(world->reader.Allows(server::kRead, r.run()), "only readable runs: " + r.run());
    }
    if (!page->next_page_token().empty()) {
      auto after = server::DecodeRunToken(page->next_page_token());
      GAC_FUZZ_CHECK(after.ok(), "next token decodes");
      GAC_FUZZ_CHECK(page->runs_size() > 0 && *after == page->runs(page->runs_size() - 1).run(),
                     "next page starts after the last run");
    }
    return 0;
  }
  if (kind == 1) {
    v1::GetStepsRequest req;
    if (!in.ParseRest(&req)) return 0;
    base::StatusOr<server::StepQuery> q = server::StepQueryFromRequest(req);
    if (!q.ok()) {
      GAC_FUZZ_CHECK(q.status().IsInvalidArgument(), q.status().ToString());
      return 0;
    }
    auto page = server::GetStepsPage(*world->store, *q);
    if (!page.ok()) {
      GAC_FUZZ_CHECK(page.status().IsNotFound(), page.status().ToString());
      return 0;
    }
    GAC_FUZZ_CHECK(static_cast<std::uint32_t>(page->steps_size()) < q->limit, "page within its size");
    for (int i = 0; i < page->steps_size(); ++i) {
      const v1::StepRecord& r = page->steps(i);
      GAC_FUZZ_CHECK(r.step() >= q->start_step && r.step() < q->end_step, "within the asked range");
      if (q->rank) GAC_FUZZ_CHECK(r.rank() == *q->rank, "the asked rank");
      if (q->after) {
        GAC_FUZZ_CHECK(std::make_pair(r.step(), r.rank()) > *q->after, "strictly after the page token");
      }
      if (i > 0) {
        const v1::StepRecord& p = page->steps(i - 1);
        GAC_FUZZ_CHECK(std::make_pair(p.step(), p.rank()) < std::make_pair(r.step(), r.rank()), "(step, rank) order");
      }
      GAC_FUZZ_CHECK(req.include_layers() || r.layers_size() == 0, "layers only when asked");
    }
    if (!page->next_page_token().empty()) {
      auto after = server::DecodeStepToken(page->next_page_token());
      GAC_FUZZ_CHECK(after.ok(), "next token decodes");
      const v1::StepRecord& last = page->steps(page->steps_size() - 1);
      GAC_FUZZ_CHECK(*after == std::make_pair(last.step(), last.rank()), "next page starts after the last record");
    }
    return 0;
  }
  v1::GetRunSummaryRequest req;
  if (!in.ParseRest(&req)) return 0;
  if (!server::ValidateRunId(req.run()).ok()) return 0;
  auto summary = server::GetRunSummary(*world->store, world->registry, req.run(), req.window());
  if (!summary.ok()) {
    GAC_FUZZ_CHECK(summary.status().IsNotFound(), summary.status().ToString());
    return 0;
  }
  std::uint64_t counted = 0;
  for (const auto& [regime, count] : summary->steps_by_regime()) counted += count;
  GAC_FUZZ_CHECK(req.window() == 0 || counted <= req.window(), "at most the window");
  return 0;
}
