#include "gac/transport/channel.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>

namespace gac::transport {

std::shared_ptr<grpc::Channel> MakeGacdChannel(const std::string& address, const std::string& tls_root_certs,
                                               std::chrono::milliseconds max_backoff) {
  return MakeGacdChannel(address, ChannelTls{tls_root_certs, "", ""}, max_backoff);
}

std::shared_ptr<grpc::Channel> MakeGacdChannel(const std::string& address, const ChannelTls& tls,
                                               std::chrono::milliseconds max_backoff, bool own_connection) {
  grpc::ChannelArguments args;
  if (own_connection) {
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // A ping every 10 s, unanswered for 5 s, closes the connection: a peer
    // gone silent (a partition that drops packets) fails every operation on
    // it within about 15 s, also one that a cancellation would not end
    // until TCP gives up. gacd allows pings down to every 5 s.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(std::max<std::int64_t>(max_backoff.count(), 100)));
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!tls.root_certs.empty()) {
    grpc::SslCredentialsOptions opts;
    opts.pem_root_certs = tls.root_certs;
    opts.pem_cert_chain = tls.cert_chain;
    opts.pem_private_key = tls.private_key;
    creds = grpc::SslCredentials(opts);
  }
  args.SetLoadBalancingPolicyName("round_robin");
  return grpc::CreateCustomChannel(address, creds, args);
}

base::StatusOr<std::vector<std::string>> SplitGacdAddresses(const std::string& addresses) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t comma = addresses.find(',', begin);
    std::string part = addresses.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const auto first = part.find_first_not_of(" \t");
    const auto last = part.find_last_not_of(" \t");
    part = first == std::string::npos ? "" : part.substr(first, last - first + 1);
    if (part.empty()) {
      return base::Status::InvalidArgument(addresses.empty() ? std::string("gacd address is empty")
                                                       : "gacd address list '" + addresses + "' has an empty entry");
    }
    out.push_back(std::move(part));
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

}  // namespace gac::transport
