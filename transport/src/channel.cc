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
                                               std::chrono::milliseconds max_backoff) {
  grpc::ChannelArguments args;
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
  return grpc::CreateCustomChannel(address, creds, args);
}

}  // namespace gac::transport
