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
#include <vector>

#include "gac/base/status.h"

namespace grpc {
class Channel;
}

namespace gac::transport {

// A channel to gacd at `address` (host:port). `tls_root_certs`: PEM roots to
// verify gacd's certificate; "" = plaintext. Reconnect attempts start after
// 100 ms and back off to at most `max_backoff`. A name that resolves to
// several addresses (gacd replicas behind one DNS name, e.g. a Kubernetes
// headless Service) gets a connection to each, and calls go to those that
// are up (round robin), so a replica that fails is left at once.
std::shared_ptr<grpc::Channel> MakeGacdChannel(const std::string& address, const std::string& tls_root_certs,
                                               std::chrono::milliseconds max_backoff);

// TLS settings of a channel, PEM text: the roots that verify gacd, and the
// agent's own certificate chain and key for a gacd that requires client
// certificates (mTLS; gacd --tls-client-ca). Plaintext when root_certs is "".
struct ChannelTls {
  std::string root_certs;
  std::string cert_chain;
  std::string private_key;
};
// As above, with a client certificate when `tls` has one. `own_connection`:
// the channel keeps its connections to itself (gRPC otherwise shares one
// connection among channels to the same target with the same settings), so
// a new channel means a new TCP connection: what replaces a connection whose
// peer went silent (packets dropped), which TCP may take minutes to give up.
// Such a channel also pings gacd every 10 s and closes a connection whose
// ping goes unanswered for 5 s.
std::shared_ptr<grpc::Channel> MakeGacdChannel(const std::string& address, const ChannelTls& tls,
                                               std::chrono::milliseconds max_backoff, bool own_connection = false);

// The gacd addresses of a TelemetryOptions or RemoteControllerOptions
// address: one host:port, or several replicas sharing one store as a
// comma-separated list ("gacd-0:7070,gacd-1:7070"; spaces around the commas
// are ignored). INVALID_ARGUMENT for an empty list or an empty entry.
base::StatusOr<std::vector<std::string>> SplitGacdAddresses(const std::string& addresses);

}  // namespace gac::transport

#endif  // GAC_TRANSPORT_CHANNEL_H_
