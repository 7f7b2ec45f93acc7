// m_t of stored step records: the signed mean of the last W window cosines
// of a record's run and rank, up to and including the record, computed from
// the stored c_t with the agent's controller::AlignmentWindow. gacd's
// gac_window_mean gauge takes a record's cosine and W from here, and the
// steps of gacd's HTTP API and of gacctl steps are computed by
// StepWindowMeans, so all three give the same numbers.
//
// A step record carries no m_t: a listing that starts inside a run (a page
// of steps, an export from --start-step) first reads, for each rank, the
// rank's stored records before its first listed one, back far enough to
// hold W window cosines (or back to the run's first step), as
// StepWindowMeans does through the reader it is given. W is the run's
// current window setting: after a change of W, every step of a listing is
// read with the new W (the gauge, which follows the steps as they arrive,
// keeps the old values held when W changes; the two agree again once W
// newer cosines have been stored).
//
// Thread safety: StepWindowMeans is a value with no synchronisation, used by
// one thread. The functions are pure.
#ifndef GAC_PROTO_STEP_WINDOW_H_
#define GAC_PROTO_STEP_WINDOW_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "gac/base/status.h"
#include "gac/controller/window.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::proto {

// The cosine a stored record puts in its rank's window: its c_t when it has
// one, finite, on a valid step (regime not INVALID); absent otherwise. This
// is controller::StepCosine of the step's statistics as a record keeps them:
// non-finite statistics are stored as an INVALID step, a step without a
// reference without c_t.
std::optional<double> RecordWindowCosine(const v1::StepRecord& record);

// W of a run's settings as m_t is computed with it: WindowFromProto, held
// to [1, controller::kMaxWindow] (stored settings were validated; a
// hand-edited database does not make a window of 0).
int ListingWindow(const v1::RunConfig& config);

// Calls `visit` with every stored record of `rank` (of the run being listed)
// whose step is in [start, end), in step order; layers are not needed.
using RankStepsReader = std::function<base::Status(std::uint32_t rank, std::int64_t start, std::int64_t end,
                                                   const std::function<void(const v1::StepRecord&)>& visit)>;

// m_t of the records of one listing, given in the listing's order.
class StepWindowMeans {
 public:
  // `window` is W (REQUIRES: controller::ValidateWindow(window).ok());
  // `first_step` is the run's first stored step (RunInfo.first_step), where
  // a look-back stops; `read` reads the records before a listing.
  StepWindowMeans(int window, std::int64_t first_step, RankStepsReader read);

  // m_t at `record`: the mean of the last W window cosines of its rank up to
  // and including the record's own (RecordWindowCosine; a record without one
  // leaves the window as it was); absent while fewer than W are held. The
  // first record of a rank starts the rank's window from the stored records
  // before it: the newest of them holding W window cosines, read in
  // widening step ranges (W steps, then 4x as many before those, ...) until
  // they hold that many or reach `first_step`.
  // REQUIRES: a rank's records come in increasing step order, none of its
  // stored records in between left out (a listing's pages in order).
  // Errors: the reader's; the rank's window is then not started.
  base::StatusOr<std::optional<double>> Next(const v1::StepRecord& record);
  // Next of each of `records` (a listing's page), in order.
  base::StatusOr<std::vector<std::optional<double>>> Next(
      const google::protobuf::RepeatedPtrField<v1::StepRecord>& records);

 private:
  base::StatusOr<controller::AlignmentWindow> LookBack(std::uint32_t rank, std::int64_t before) const;

  const int window_;
  const std::int64_t first_step_;
  const RankStepsReader read_;
  std::map<std::uint32_t, controller::AlignmentWindow> ranks_;
};

}  // namespace gac::proto

#endif  // GAC_PROTO_STEP_WINDOW_H_
