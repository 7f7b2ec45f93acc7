// HttpServer: gacd's HTTP port. One civetweb server answers
//
//   /metrics      the Prometheus text exposition of Metrics' registry, as
//                 prometheus-cpp's exposer served it (same series, same
//                 exposer_* scrape counters, gzip when the scraper accepts it);
//   /api/v1/...   the JSON API (HttpApi);
//   everything else  gacd's page, compiled into the binary (web_assets.h).
//
// Every request runs on one of civetweb's worker threads: a scrape renders
// the registry there (the hot path of ingest never locks for it), and API
// reads use the store's read side, so neither waits on the writer.
//
// Thread safety: Start and Stop from one thread; the handlers run
// concurrently on the worker threads.
#ifndef GAC_SERVER_SRC_HTTP_HTTP_SERVER_H_
#define GAC_SERVER_SRC_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <memory>
#include <string>

#include "gac/base/status.h"
#include "server/src/core.h"
#include "server/src/http/api.h"

namespace gac::server {

struct HttpServerOptions {
  std::string listen;                  // civetweb's listening_ports syntax: "HOST:PORT"; port 0 = any
  int threads = 8;                     // worker threads (concurrent requests)
  std::size_t max_body_bytes = 4 << 20;  // larger request bodies: 413
  bool api_enabled = true;             // false: the API refuses with `api_disabled_reason`
  std::string api_disabled_reason;
};

class HttpServer {
 public:
  // Starts serving. Unavailable (with civetweb's reason) when the address
  // cannot be bound. `core` must outlive the server.
  static base::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options, Core* core);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Closes the port and waits for the requests in progress. Idempotent;
  // takes about a second (civetweb's accept loop polls).
  void Stop();

  // The port actually bound.
  int port() const { return port_; }

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_HTTP_HTTP_SERVER_H_
