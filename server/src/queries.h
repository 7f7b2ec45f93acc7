// The read side of gacd, shared by its gRPC services and its HTTP API: the
// checks of a query's parameters, paging with opaque page tokens, and the
// run summary (regime counts and the calibration statistics of the paper's
// Table 3). Plain functions over a Store and the RunRegistry: no gRPC, so
// they are tested without a server.
//
// The functions that read the store block on it: call them off the RPC
// threads. Thread safety: as safe as the Store and RunRegistry they read
// (both are safe for concurrent use).
#ifndef GAC_SERVER_SRC_QUERIES_H_
#define GAC_SERVER_SRC_QUERIES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gac/server/store.h"
#include "gac/base/status.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/query.pb.h"
#include "server/src/auth.h"
#include "server/src/registry.h"

namespace gac::server {

// Page sizes of each listing: the default when 0 is asked, and the largest.
struct PageLimits {
  std::uint32_t default_size;
  std::uint32_t max_size;
};
inline constexpr PageLimits kRunPages{100, 1000};
inline constexpr PageLimits kStepPages{1000, 10000};
inline constexpr PageLimits kConfigChangePages{100, 1000};

// `requested`, or the default for 0; InvalidArgument above the maximum.
base::StatusOr<std::uint32_t> PageSize(std::uint32_t requested, PageLimits limits);

// Page tokens: opaque to clients, checked strictly (InvalidArgument
// "malformed page_token"). "" decodes to the first page.
std::string EncodeRunToken(const std::string& last_run);  // runs after this id
base::StatusOr<std::string> DecodeRunToken(const std::string& token);
std::string EncodeStepToken(std::int64_t step, std::uint32_t rank);  // records after this key
base::StatusOr<std::pair<std::int64_t, std::uint32_t>> DecodeStepToken(const std::string& token);
std::string EncodeOffsetToken(std::uint64_t offset);  // entries from this offset
base::StatusOr<std::uint64_t> DecodeOffsetToken(const std::string& token);

// One page of runs that `principal` may read, in id order, each with its
// current settings; next_page_token set when more may follow. Runs the
// principal may not read are skipped (and scanned past).
base::StatusOr<v1::ListRunsResponse> ListRunsPage(Store& store, const RunRegistry& registry, const Principal& principal,
                                            const v1::ListRunsRequest& request);

// The most bytes of records one GetSteps page carries (their serialized
// size): a page ends early, with a next_page_token, rather than pass it, so
// that it stays under a client's default 4 MiB receive limit whatever the
// records' layers (query.proto says so too). A page holds at least one
// record.
inline constexpr std::size_t kMaxStepsPageBytes = 3 << 20;

// A GetSteps request checked (run id, step range, page size and token) and
// turned into the store query of one page plus one record (to know whether
// a next page exists).
base::StatusOr<StepQuery> StepQueryFromRequest(const v1::GetStepsRequest& request);
// One page of records of `query` (from StepQueryFromRequest): at most
// query.limit - 1 records and at most `max_bytes` of them (see
// kMaxStepsPageBytes). NotFound for an unknown run.
base::StatusOr<v1::GetStepsResponse> GetStepsPage(Store& store, const StepQuery& query,
                                            std::size_t max_bytes = kMaxStepsPageBytes);

// m_t of each record of `page` (of run `run`), index for index: the signed
// mean of the last W window cosines of the record's rank up to the record,
// W the run's current window setting, the records before the page read from
// `store` (gac/proto/step_window.h). Absent while the rank holds fewer than
// W. Costs one more read per rank of the page (records of the W steps
// before it), more when the rank's steps before the page lack cosines.
base::StatusOr<std::vector<std::optional<double>>> PageWindowMeans(Store& store, const RunRegistry& registry,
                                                                   const std::string& run,
                                                                   const v1::GetStepsResponse& page);

// The summary of a run from its stored info, its settings and its last
// steps of rank 0 (in step order): regime counts, the calibration
// statistics of |c_t| with the current c_low, the thresholds those
// statistics suggest (when there are enough), and the latest step.
v1::RunSummary SummarizeRun(const v1::RunInfo& info, const v1::RunConfig& config,
                            const std::vector<v1::StepRecord>& steps);
// Reads what SummarizeRun needs (the last `window` steps of rank 0; 0 =
// all). NotFound for an unknown run.
base::StatusOr<v1::RunSummary> GetRunSummary(Store& store, const RunRegistry& registry, const std::string& run,
                                       std::uint32_t window);

// One page of a run's audit log, oldest first.
base::StatusOr<v1::ListConfigChangesResponse> ListConfigChangesPage(Store& store,
                                                              const v1::ListConfigChangesRequest& request);

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_QUERIES_H_
