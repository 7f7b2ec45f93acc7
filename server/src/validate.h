// Checks of everything that arrives over the wire, before it touches the
// store, the registry or the metrics. Each function returns OK or an
// INVALID_ARGUMENT status whose message names the offending field (and the
// record index within a batch).

#ifndef GAC_SERVER_SRC_VALIDATE_H_
#define GAC_SERVER_SRC_VALIDATE_H_

#include <cstddef>
#include <string_view>

#include "gac/proto/wire_rules.h"
#include "gac/base/status.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::server {

// The wire contract's limits (gac/proto/wire_rules.h); tests lower them.
struct Limits {
  std::size_t max_records_per_batch = proto::kMaxRecordsPerBatch;
  std::size_t max_layers_per_record = proto::kMaxLayersPerRecord;
  std::size_t max_scalars_per_record = proto::kMaxScalarsPerRecord;
  std::size_t max_reason_bytes = 1024;
};

// proto::CheckRunId: 1-128 characters of [A-Za-z0-9._:/-].
base::Status ValidateRunId(std::string_view run);
// proto::CheckName: 1-256 printable ASCII characters (0x21-0x7e) and space.
base::Status ValidateName(std::string_view what, std::string_view name);

base::Status ValidateStepRecord(const v1::StepRecord& record, const Limits& limits);
// Sequence >= 1, 1..max records, each record valid, no (run, rank, step)
// repeated within the batch.
base::Status ValidateIngestRequest(const v1::IngestRequest& request, const Limits& limits);
// Step >= 0, valid run id, gg and pp >= 0, and |dot| <= sqrt(gg * pp) up to
// rounding when they are finite (non-finite statistics are valid: they give
// REGIME_INVALID).
base::Status ValidateDecideRequest(const v1::DecideRequest& request);

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_VALIDATE_H_
