// Whether gacd answers: one call of the standard gRPC health service
// (grpc.health.v1), which gacd serves on its gRPC port without a token. For
// `python -m gac --gacd` and readiness checks.
//
// Thread safety: may be called from any thread.
#ifndef GAC_TRANSPORT_HEALTH_H_
#define GAC_TRANSPORT_HEALTH_H_

#include <chrono>
#include <string>

#include "gac/base/status.h"
#include "gac/transport/channel.h"

namespace gac::transport {

// Asks gacd at `address` (one host:port) on a connection of its own for its
// overall status, waiting at most `deadline`; `token`, when not "", is sent
// as the bearer token. Returns the status's name: "SERVING", "NOT_SERVING"
// (gacd is draining), ... An unreachable gacd is UNAVAILABLE at once (a
// refused connection) or DEADLINE_EXCEEDED (one that does not answer), with
// the address in the message.
base::StatusOr<std::string> CheckGacdHealth(const std::string& address, const ChannelTls& tls,
                                            const std::string& token, std::chrono::milliseconds deadline);

}  // namespace gac::transport

#endif  // GAC_TRANSPORT_HEALTH_H_
