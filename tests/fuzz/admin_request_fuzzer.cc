// gacd's AdminService after the bytes arrive, through the same domain calls
// as its handlers: the first byte picks GetRunConfig, SetRunConfig or
// ListConfigChanges, the rest is the request. SetRunConfig goes through
// Core::ChangeRunConfig (registry, writer, in-memory store). Properties: an
// accepted change is what Decide then uses and is the last entry of the
// run's audit log; a refused one changes nothing; every page token handed
// out decodes.
#include <cstdint>
#include <memory>

#include "gac/base/mutex.h"
#include "gac/proto/convert.h"
#include "server/src/core.h"
#include "server/src/queries.h"
#include "server/src/validate.h"
#include "tests/fuzz/fuzz_util.h"

namespace gac::fuzz {
namespace {

std::unique_ptr<server::Core> MakeCore() {
  server::Core::Parts parts;
  parts.store = server::NewMemoryStore();
  parts.metrics = std::make_unique<server::Metrics>();
  parts.registry =
      std::make_unique<server::RunRegistry>(parts.config.default_thresholds, parts.config.default_mode);
  parts.writer = std::make_unique<server::Writer>(parts.store.get(), parts.metrics.get(), 1 << 20);
  parts.executor = std::make_unique<server::Executor>(1);
  return std::make_unique<server::Core>(std::move(parts));
}

// ChangeRunConfig, waiting for its durable result.
base::StatusOr<v1::RunConfig> Change(server::Core& core, const v1::SetRunConfigRequest& request) {
  static const server::Principal* admin = [] {
    auto* p = new server::Principal;
    p->name = "fuzz-admin";
    p->rights = server::kRead | server::kWrite | server::kAdmin;
    p->run_patterns = {"*"};
    return p;
  }();
  base::Mutex mu;
  base::CondVar cv;
  bool done = false;
  base::StatusOr<v1::RunConfig> result = base::Status::Internal("not answered");
  core.ChangeRunConfig(request, *admin, [&](const base::StatusOr<v1::RunConfig>& r) {
    base::MutexLock lock(&mu);
    result = r;
    done = true;
    cv.SignalAll();
  });
  base::MutexLock lock(&mu);
  while (!done) cv.Wait(&mu);
  return result;
}

void CheckToken(const std::string& token) {
  if (!token.empty()) GAC_FUZZ_CHECK(server::DecodeOffsetToken(token).ok(), "a page token handed out decodes");
}

}  // namespace
}  // namespace gac::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gac;
  static std::unique_ptr<server::Core> core = fuzz::MakeCore();
  static int changes = 0;
  fuzz::Input in(data, size);
  const std::uint8_t kind = in.Byte() % 3;
  if (kind == 0) {
    v1::GetRunConfigRequest req;
    if (!in.ParseRest(&req)) return 0;
    if (!server::ValidateRunId(req.run()).ok()) return 0;
    const v1::RunConfig c = core->registry().Get(req.run());
    GAC_FUZZ_CHECK(proto::ThresholdsFromProto(c.thresholds()).ok(), "settings in use are valid");
    return 0;
  }
  if (kind == 1) {
    v1::SetRunConfigRequest req;
    if (!in.ParseRest(&req)) return 0;
    if (!server::ValidateRunId(req.run()).ok()) return 0;
    // A fresh core now and then keeps the audit logs small.
    if (++changes % 4096 == 0) core = fuzz::MakeCore();
    const v1::RunConfig before = core->registry().Get(req.run());
    base::StatusOr<v1::RunConfig> after = fuzz::Change(*core, req);
    const v1::RunConfig now = core->registry().Get(req.run());
    if (!after.ok()) {
      GAC_FUZZ_CHECK(after.status().IsInvalidArgument() || after.status().IsAborted(), after.status().ToString());
      GAC_FUZZ_CHECK(now.SerializeAsString() == before.SerializeAsString(), "a refused change changes nothing");
      return 0;
    }
    GAC_FUZZ_CHECK(after->version() == before.version() + 1, "versions go up by one");
    GAC_FUZZ_CHECK(now.SerializeAsString() == after->SerializeAsString(), "Decide uses the accepted settings");
    GAC_FUZZ_CHECK(proto::ControllerFromProto(now.thresholds()).ok(), "accepted settings make a controller");
    auto log = core->store().ListConfigChanges(req.run(), after->version() - 1, 2);
    GAC_FUZZ_CHECK(log.ok() && log->size() == 1, "the change is the last audit entry");
    GAC_FUZZ_CHECK((*log)[0].after().SerializeAsString() == after->SerializeAsString() &&
                       (*log)[0].reason() == req.reason(),
                   "the audit entry is the change");
    return 0;
  }
  v1::ListConfigChangesRequest req;
  if (!in.ParseRest(&req)) return 0;
  base::StatusOr<v1::ListConfigChangesResponse> page = server::ListConfigChangesPage(core->store(), req);
  if (!page.ok()) {
    GAC_FUZZ_CHECK(page.status().IsInvalidArgument(), page.status().ToString());
    return 0;
  }
  fuzz::CheckToken(page->next_page_token());
  return 0;
}
