// How the scalars a step record may carry (gacd's limit,
// gac/proto/wire_limits.h) are shared between a trainer and gac's sender:
// Telemetry adds its counters (agent_records_sent, agent_records_spooled,
// agent_records_replayed, agent_records_dropped, agent_reconnects; see
// gac/transport/telemetry.h) to the last record of each batch when they
// fit, so a trainer that sends at most kMaxTrainerScalars of its own keeps
// them in every batch. Plain constants with no generated message, so that
// the Python package reads them without linking the transport
// (gac._controller.MAX_TRAINER_SCALARS).
//
// Thread safety: constants.
#ifndef GAC_TRANSPORT_SCALAR_BUDGET_H_
#define GAC_TRANSPORT_SCALAR_BUDGET_H_

#include <cstddef>

#include "gac/proto/wire_limits.h"

namespace gac::transport {

// The scalars of Telemetry's own counters.
inline constexpr std::size_t kSenderScalars = 5;
// What is left of a record's scalars for the trainer's.
inline constexpr std::size_t kMaxTrainerScalars = proto::kMaxScalarsPerRecord - kSenderScalars;

}  // namespace gac::transport

#endif  // GAC_TRANSPORT_SCALAR_BUDGET_H_
