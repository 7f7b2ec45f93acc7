#include "gac/server/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>

#include <cstdio>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include "gac/base/file_util.h"
#include "gac/base/mutex.h"
#include "server/src/core.h"
#include "server/src/data_lock.h"
#include "server/src/http/http_server.h"
#include "server/src/metrics.h"
#include "server/src/services/services.h"
#include "server/src/settings_sync.h"

namespace gac::server {
namespace {

// The largest request metadata gacd accepts (gRPC's default is 8 KiB).
constexpr int kMaxMetadataBytes = 16 * 1024;

// The bearer tokens of the token file, or every call allowed (--insecure).
base::StatusOr<Authenticator> LoadCredentials(const ServerConfig& config) {
  if (config.insecure) return Authenticator::Insecure();
  return Authenticator::FromFile(config.token_file);
}

// The store the configuration names: PostgreSQL, the in-memory store, or
// SQLite (creating its data directory when the file is not named).
// For SQLite, takes `lock` on the store's files first (server/src/data_lock.h):
// `<database>.lock` beside the database file, whichever flag named it.
base::StatusOr<std::unique_ptr<Store>> OpenStore(const ServerConfig& config, DataLock* lock) {
  if (IsPostgresUri(config.store)) return OpenPostgresStore(config.store);
  if (config.UsesMemoryStore()) return NewMemoryStore();
  if (config.db.empty()) GAC_RETURN_IF_ERROR(base::MakeDirs(config.data_dir, "data directory"));
  GAC_ASSIGN_OR_RETURN(*lock, DataLock::Acquire(config.DatabasePath() + ".lock"));
  SqliteOptions opts;
  opts.synchronous = config.sync == "normal" ? "NORMAL" : "FULL";
  return OpenSqliteStore(config.DatabasePath(), opts);
}

// The core over `store`, with the run settings stored in it loaded into the
// registry and the metrics.
base::StatusOr<std::unique_ptr<Core>> AssembleCore(const ServerConfig& config, Authenticator auth,
                                             std::unique_ptr<Store> store) {
  GAC_ASSIGN_OR_RETURN(auto stored, store->LoadRunConfigs());
  Core::Parts parts;
  parts.config = config;
  parts.auth = std::move(auth);
  MetricsOptions mopts;
  mopts.per_layer = config.per_layer_metrics;
  mopts.max_layers_per_run = config.max_layers_per_run;
  mopts.max_runs = config.max_runs_exported;
  mopts.run_ttl = config.run_ttl;
  parts.metrics = std::make_unique<Metrics>(mopts);
  parts.registry = std::make_unique<RunRegistry>(config.default_thresholds, config.default_mode);
  parts.registry->Load(stored);
  const auto now = std::chrono::system_clock::now();
  for (const auto& [run, cfg] : stored) parts.metrics->ObserveConfig(run, cfg, now);
  parts.writer = std::make_unique<Writer>(store.get(), parts.metrics.get(), config.max_queue_rows);
  parts.executor = std::make_unique<Executor>(2);
  parts.store = std::move(store);
  return std::make_unique<Core>(std::move(parts));
}

// gRPC's server credentials: plaintext, TLS, or TLS that requires client
// certificates signed by the client CA (mTLS).
base::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadTlsCredentials(const ServerConfig& config) {
  if (config.tls_cert.empty()) return grpc::InsecureServerCredentials();
  GAC_ASSIGN_OR_RETURN(std::string key, base::ReadFileToString(config.tls_key, "TLS key"));
  GAC_ASSIGN_OR_RETURN(std::string cert, base::ReadFileToString(config.tls_cert, "TLS certificate"));
  if (key.empty() || cert.empty()) {
    return base::Status::InvalidArgument("TLS key '" + config.tls_key + "' or certificate '" + config.tls_cert + "' is empty");
  }
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  pair.private_key = std::move(key);
  pair.cert_chain = std::move(cert);
  grpc::SslServerCredentialsOptions opts;
  opts.pem_key_cert_pairs.push_back(pair);
  if (!config.tls_client_ca.empty()) {  // mTLS: a client without a certificate of these CAs cannot connect
    GAC_ASSIGN_OR_RETURN(std::string ca, base::ReadFileToString(config.tls_client_ca, "TLS client CA"));
    if (ca.empty()) return base::Status::InvalidArgument("TLS client CA '" + config.tls_client_ca + "' is empty");
    opts.pem_root_certs = std::move(ca);
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

// "HOST:PORT" of `listen` with the port actually bound.
std::string BoundAddress(const std::string& listen, int port) {
  return listen.substr(0, listen.rfind(':')) + ":" + std::to_string(port);
}

}  // namespace

struct GacServer::Impl {
  Impl(std::unique_ptr<Core> c, DataLock lock) : data_lock(std::move(lock)), core(std::move(c)) {}

  // Declared before the core, so released after the store is closed.
  DataLock data_lock;
  const std::unique_ptr<Core> core;
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
  base::Mutex mu;
  base::CondVar cv;
  bool shutting_down GAC_GUARDED_BY(mu) = false;
  bool shut_down GAC_GUARDED_BY(mu) = false;

  // Serves the gRPC services on config.listen. Unavailable when the address
  // cannot be bound.
  base::Status StartGrpc(const std::shared_ptr<grpc::ServerCredentials>& creds) {
    const ServerConfig& config = core->config();
    ingest = std::make_unique<IngestServiceImpl>(core.get());
    control = std::make_unique<ControlServiceImpl>(core.get());
    admin = std::make_unique<AdminServiceImpl>(core.get());
    query = std::make_unique<QueryServiceImpl>(core.get());
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
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
    // Agents ping every 10 s (transport/src/channel.cc) to find a connection
    // that went silent (a partition that drops packets); gRPC's server
    // default would answer pings more often than every 5 minutes without
    // data with GOAWAY. Allowed down to 5 s, also without calls.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.RegisterService(ingest.get());
    builder.RegisterService(control.get());
    builder.RegisterService(admin.get());
    builder.RegisterService(query.get());
    server = builder.BuildAndStart();
    if (server == nullptr || port == 0) {
      return base::Status::Unavailable("cannot listen on '" + config.listen + "' (address in use or invalid?)");
    }
    address = BoundAddress(config.listen, port);
    server->GetHealthCheckService()->SetServingStatus(true);
    return base::Status::Ok();
  }

  // Serves /metrics, the JSON API and the page on config.metrics_listen
  // (nothing when it is empty).
  base::Status StartHttp() {
    const ServerConfig& config = core->config();
    if (config.metrics_listen.empty()) return base::Status::Ok();
    HttpServerOptions hopts;
    hopts.listen = config.metrics_listen;
    hopts.max_body_bytes = config.max_message_bytes;
    // Without tokens, the API (which can change a run's settings) stays on loopback.
    hopts.api_enabled = !config.insecure || IsLoopbackAddress(config.metrics_listen);
    hopts.api_disabled_reason = "gacd runs --insecure: its HTTP API answers on a loopback --http-listen only (" +
                                config.metrics_listen + " is not); give gacd a --token-file";
    GAC_ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> started, HttpServer::Start(hopts, core.get()));
    http = std::move(started);
    metrics_port = http->port();
    return base::Status::Ok();
  }

  // Housekeeping, and the settings changed through other replicas sharing
  // the store.
  void StartBackground() {
    housekeeping = std::thread([this] { Housekeeping(); });
    settings_sync = std::make_unique<SettingsSync>(&core->store(), &core->registry(), &core->metrics());
    settings_sync->Start();
  }

  // The ready file, written whole (renamed into place): the bound addresses.
  void WriteReadyFile() const {
    const ServerConfig& config = core->config();
    if (config.ready_file.empty()) return;
    const std::string tmp = config.ready_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << "grpc=" << address << "\n";
      if (metrics_port != 0) {
        const std::string http_address = BoundAddress(config.metrics_listen, metrics_port);
        out << "http=" << http_address << "\n";
        out << "metrics=" << http_address << "\n";  // the older name of the line above
      }
    }
    std::rename(tmp.c_str(), config.ready_file.c_str());
  }

  // Once a second: idle runs leave /metrics; once a minute: retention.
  void Housekeeping() GAC_EXCLUDES(mu) {
    const ServerConfig& config = core->config();
    auto next_retention = std::chrono::steady_clock::now();
    for (;;) {
      {
        base::MutexLock lock(&mu);
        if (!shutting_down) cv.WaitFor(&mu, std::chrono::seconds(1));
        if (shutting_down) return;
      }
      core->metrics().ExpireIdle(std::chrono::system_clock::now());
      if (config.retention.count() > 0 && std::chrono::steady_clock::now() >= next_retention) {
        const std::int64_t cutoff =
            NowNs() - std::chrono::duration_cast<std::chrono::nanoseconds>(config.retention).count();
        auto deleted = core->store().DeleteIdleRuns(cutoff);
        if (!deleted.ok()) std::fprintf(stderr, "gacd: retention: %s\n", deleted.status().ToString().c_str());
        next_retention = std::chrono::steady_clock::now() + std::chrono::minutes(1);
      }
    }
  }
};

GacServer::GacServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GacServer::~GacServer() { Shutdown(std::chrono::milliseconds(0)); }

base::StatusOr<std::unique_ptr<GacServer>> GacServer::Start(const ServerConfig& config, std::unique_ptr<Store> store) {
  GAC_RETURN_IF_ERROR(ValidateConfig(config));
  GAC_ASSIGN_OR_RETURN(Authenticator auth, LoadCredentials(config));
  DataLock lock;
  if (store == nullptr) {
    GAC_ASSIGN_OR_RETURN(std::unique_ptr<Store> opened, OpenStore(config, &lock));
    store = std::move(opened);
  }
  GAC_ASSIGN_OR_RETURN(std::unique_ptr<Core> core, AssembleCore(config, std::move(auth), std::move(store)));
  GAC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds, LoadTlsCredentials(config));
  // On an error from here, destroying `impl` stops what started (the writer
  // commits what is queued: nothing, as nothing was served).
  auto impl = std::make_unique<Impl>(std::move(core), std::move(lock));
  GAC_RETURN_IF_ERROR(impl->StartGrpc(creds));
  if (base::Status st = impl->StartHttp(); !st.ok()) {
    impl->server->Shutdown();
    return st;
  }
  impl->StartBackground();
  impl->WriteReadyFile();
  return std::unique_ptr<GacServer>(new GacServer(std::move(impl)));
}

void GacServer::Shutdown(std::chrono::milliseconds drain) {
  Impl& s = *impl_;
  {
    base::MutexLock lock(&s.mu);
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
  s.core->WaitForCalls(std::chrono::steady_clock::now() + drain);
  s.server->Shutdown(std::chrono::system_clock::now());
  s.server->Wait();
  s.core->executor().Stop();
  if (s.settings_sync) s.settings_sync->Stop();
  s.core->writer().Stop();  // commits everything queued
  if (s.housekeeping.joinable()) s.housekeeping.join();
  http_stop.join();
  {
    base::MutexLock lock(&s.mu);
    s.shut_down = true;
  }
  s.cv.SignalAll();
}

void GacServer::Wait() {
  base::MutexLock lock(&impl_->mu);
  while (!impl_->shut_down) impl_->cv.Wait(&impl_->mu);
}

const std::string& GacServer::address() const { return impl_->address; }
int GacServer::port() const { return impl_->port; }
int GacServer::metrics_port() const { return impl_->metrics_port; }
Metrics& GacServer::metrics() { return impl_->core->metrics(); }
Store& GacServer::store() { return impl_->core->store(); }

}  // namespace gac::server
