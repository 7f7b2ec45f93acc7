#include "gac/server/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "gac/file_util.h"
#include "gac/mutex.h"
#include "server/src/core.h"
#include "server/src/http/http_server.h"
#include "server/src/metrics.h"
#include "server/src/services/services.h"
#include "server/src/settings_sync.h"

namespace gac::server {
namespace {

// The largest request metadata gacd accepts (gRPC's default is 8 KiB).
constexpr int kMaxMetadataBytes = 16 * 1024;

}  // namespace

struct GacServer::Impl {
  Core core;
  std::unique_ptr<IngestServiceImpl> ingest;
  std::unique_ptr<ControlServiceImpl> control;
  std::unique_ptr<AdminServiceImpl> admin;
  std::unique_ptr<QueryServiceImpl> query;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<HttpServer> http;  // /metrics, the JSON API and the page
  std::string address;
  int port = 0;
  int metrics_port = 0;

  std::thread housekeeping;
  std::unique_ptr<SettingsSync> settings_sync;
  Mutex mu;
  CondVar cv;
  bool shutting_down GAC_GUARDED_BY(mu) = false;
  bool shut_down GAC_GUARDED_BY(mu) = false;

  // Once a second: idle runs leave /metrics; once a minute: retention.
  void Housekeeping() GAC_EXCLUDES(mu) {
    auto next_retention = std::chrono::steady_clock::now();
    for (;;) {
      {
        MutexLock lock(&mu);
        if (!shutting_down) cv.WaitFor(&mu, std::chrono::seconds(1));
        if (shutting_down) return;
      }
      core.metrics->ExpireIdle(std::chrono::system_clock::now());
      if (core.config.retention.count() > 0 && std::chrono::steady_clock::now() >= next_retention) {
        const std::int64_t cutoff =
            NowNs() - std::chrono::duration_cast<std::chrono::nanoseconds>(core.config.retention).count();
        auto deleted = core.store->DeleteIdleRuns(cutoff);
        if (!deleted.ok()) std::fprintf(stderr, "gacd: retention: %s\n", deleted.status().ToString().c_str());
        next_retention = std::chrono::steady_clock::now() + std::chrono::minutes(1);
      }
    }
  }
};

GacServer::GacServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GacServer::~GacServer() { Shutdown(std::chrono::milliseconds(0)); }

StatusOr<std::unique_ptr<GacServer>> GacServer::Start(const ServerConfig& config, std::unique_ptr<Store> store) {
  Status st = ValidateConfig(config);
  if (!st.ok()) return st;
  auto impl = std::make_unique<Impl>();
  Core& core = impl->core;
  core.config = config;
  if (!config.insecure) {
    StatusOr<Authenticator> auth = Authenticator::FromFile(config.token_file);
    if (!auth.ok()) return auth.status();
    core.auth = std::move(*auth);
  }
  if (store == nullptr && IsPostgresUri(config.store)) {
    auto opened = OpenPostgresStore(config.store);
    if (!opened.ok()) return opened.status();
    store = std::move(*opened);
  }
  if (store == nullptr) {
    if (config.db == ":memory:") {
      store = NewMemoryStore();
    } else {
      if (config.db.empty()) {
        st = MakeDirs(config.data_dir, "data directory");
        if (!st.ok()) return st;
      }
      const std::string path = config.DatabasePath();
      SqliteOptions opts;
      opts.synchronous = config.sync == "normal" ? "NORMAL" : "FULL";
      auto opened = OpenSqliteStore(path, opts);
      if (!opened.ok()) return opened.status();
      store = std::move(*opened);
    }
  }
  core.store = std::move(store);
  MetricsOptions mopts;
  mopts.per_layer = config.per_layer_metrics;
  mopts.max_layers_per_run = config.max_layers_per_run;
  mopts.max_runs = config.max_runs_exported;
  mopts.run_ttl = config.run_ttl;
  core.metrics = std::make_unique<Metrics>(mopts);
  core.registry = std::make_unique<RunRegistry>(config.default_thresholds, config.default_mode);
  auto configs = core.store->LoadRunConfigs();
  if (!configs.ok()) return configs.status();
  core.registry->Load(*configs);
  core.writer = std::make_unique<Writer>(core.store.get(), core.metrics.get(), config.max_queue_rows);
  core.executor = std::make_unique<Executor>(2);

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!config.tls_cert.empty()) {
    StatusOr<std::string> key = ReadFileToString(config.tls_key, "TLS key");
    if (!key.ok()) return key.status();
    StatusOr<std::string> cert = ReadFileToString(config.tls_cert, "TLS certificate");
    if (!cert.ok()) return cert.status();
    if (key->empty() || cert->empty()) {
      return Status::InvalidArgument("TLS key '" + config.tls_key + "' or certificate '" + config.tls_cert + "' is empty");
    }
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    pair.private_key = std::move(*key);
    pair.cert_chain = std::move(*cert);
    grpc::SslServerCredentialsOptions opts;
    opts.pem_key_cert_pairs.push_back(pair);
    if (!config.tls_client_ca.empty()) {  // mTLS: a client without a certificate of these CAs cannot connect
      StatusOr<std::string> ca = ReadFileToString(config.tls_client_ca, "TLS client CA");
      if (!ca.ok()) return ca.status();
      if (ca->empty()) return Status::InvalidArgument("TLS client CA '" + config.tls_client_ca + "' is empty");
      opts.pem_root_certs = std::move(*ca);
      opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(opts);
  }

  impl->ingest = std::make_unique<IngestServiceImpl>(&core);
  impl->control = std::make_unique<ControlServiceImpl>(&core);
  impl->admin = std::make_unique<AdminServiceImpl>(&core);
  impl->query = std::make_unique<QueryServiceImpl>(&core);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, creds, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  // Request metadata (headers) above this is refused before any handler
  // runs; a bearer token needs well under 1 KiB.
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, kMaxMetadataBytes);
  // No bandwidth probing: HTTP/2 receive windows stay at their 64 KiB
  // default instead of growing to megabytes. A client that writes but never
  // reads its acks stops gacd's reads once 64 batches await their acks
  // (ingest_service.cc); with probing, gRPC's transport went on taking in
  // its unread batches, 7 to 28 MiB a stream before flow control held it;
  // without, under 1.5 MiB. 64 KiB per round trip still carries far more
  // than a trainer's telemetry on one stream.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.RegisterService(impl->ingest.get());
  builder.RegisterService(impl->control.get());
  builder.RegisterService(impl->admin.get());
  builder.RegisterService(impl->query.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || port == 0) {
    core.writer->Stop();
    return Status::Unavailable("cannot listen on '" + config.listen + "' (address in use or invalid?)");
  }
  impl->port = port;
  const auto colon = config.listen.rfind(':');
  impl->address = config.listen.substr(0, colon) + ":" + std::to_string(port);
  impl->server->GetHealthCheckService()->SetServingStatus(true);

  if (!config.metrics_listen.empty()) {
    HttpServerOptions hopts;
    hopts.listen = config.metrics_listen;
    hopts.max_body_bytes = config.max_message_bytes;
    // Without tokens, the API (which can change a run's settings) stays on loopback.
    hopts.api_enabled = !config.insecure || IsLoopbackAddress(config.metrics_listen);
    hopts.api_disabled_reason = "gacd runs --insecure: its HTTP API answers on a loopback --metrics-listen only (" +
                                config.metrics_listen + " is not); give gacd a --token-file";
    auto http = HttpServer::Start(hopts, &core);
    if (!http.ok()) {
      impl->server->Shutdown();
      core.writer->Stop();
      return http.status();
    }
    impl->http = std::move(*http);
    impl->metrics_port = impl->http->port();
  }
  for (const auto& [run, cfg] : *configs) core.metrics->ObserveConfig(run, cfg, std::chrono::system_clock::now());
  Impl* raw = impl.get();
  impl->housekeeping = std::thread([raw] { raw->Housekeeping(); });
  // Settings changed through other replicas sharing the store.
  impl->settings_sync = std::make_unique<SettingsSync>(core.store.get(), core.registry.get(), core.metrics.get());
  impl->settings_sync->Start();

  if (!config.ready_file.empty()) {
    const std::string tmp = config.ready_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << "grpc=" << impl->address << "\n";
      if (impl->metrics_port != 0) {
        const std::string& m = config.metrics_listen;
        out << "metrics=" << m.substr(0, m.rfind(':')) << ":" << impl->metrics_port << "\n";
      }
    }
    std::rename(tmp.c_str(), config.ready_file.c_str());
  }
  return std::unique_ptr<GacServer>(new GacServer(std::move(impl)));
}

void GacServer::Shutdown(std::chrono::milliseconds drain) {
  Impl& s = *impl_;
  {
    MutexLock lock(&s.mu);
    if (s.shutting_down) {
      while (!s.shut_down) s.cv.Wait(&s.mu);
      return;
    }
    s.shutting_down = true;
  }
  s.cv.SignalAll();
  s.server->GetHealthCheckService()->SetServingStatus(false);
  // Open streams end once their batches are acknowledged, unary calls once
  // answered; then the server stops, cutting off only what outlived the
  // drain time (and stream reads left pending after Finish).
  std::thread http_stop([&s] {  // civetweb takes ~1-2 s to stop; requests in progress finish first
    if (s.http != nullptr) s.http->Stop();
  });
  s.ingest->DrainStreams();
  s.core.WaitForCalls(std::chrono::steady_clock::now() + drain);
  s.server->Shutdown(std::chrono::system_clock::now());
  s.server->Wait();
  s.core.executor->Stop();
  if (s.settings_sync) s.settings_sync->Stop();
  s.core.writer->Stop();  // commits everything queued
  if (s.housekeeping.joinable()) s.housekeeping.join();
  http_stop.join();
  {
    MutexLock lock(&s.mu);
    s.shut_down = true;
  }
  s.cv.SignalAll();
}

void GacServer::Wait() {
  MutexLock lock(&impl_->mu);
  while (!impl_->shut_down) impl_->cv.Wait(&impl_->mu);
}

const std::string& GacServer::address() const { return impl_->address; }
int GacServer::port() const { return impl_->port; }
int GacServer::metrics_port() const { return impl_->metrics_port; }
Metrics& GacServer::metrics() { return *impl_->core.metrics; }
Store& GacServer::store() { return *impl_->core.store; }

}  // namespace gac::server
