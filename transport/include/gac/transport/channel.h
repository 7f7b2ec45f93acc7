// The gRPC channel to gacd that the telemetry sender and the remote
// controller share: plaintext or TLS, with a reconnect backoff suited to an
// agent (gRPC's default waits up to 2 minutes before retrying a restarted
// server; the agent should find it within its own backoff).
//
// Thread safety: a channel may be used from any thread.
#ifndef GAC_TRANSPORT_CHANNEL_H_
#define GAC_TRANSPORT_CHANNEL_H_

#include <chrono>
#include <memory>
#include <string>

namespace grpc {
class Channel;
}

namespace gac::transport {

// A channel to gacd at `address` (host:port). `tls_root_certs`: PEM roots to
// verify gacd's certificate; "" = plaintext. Reconnect attempts start after
// 100 ms and back off to at most `max_backoff`.
std::shared_ptr<grpc::Channel> MakeGacdChannel(const std::string& address, const std::string& tls_root_certs,
                                               std::chrono::milliseconds max_backoff);

}  // namespace gac::transport

#endif  // GAC_TRANSPORT_CHANNEL_H_
