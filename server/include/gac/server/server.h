// gacd as a library: the gRPC services (ingest, control, admin, query,
// health), the writer, the registry and the HTTP port (/metrics, the JSON
// API and gacd's page), started together from a ServerConfig. gacd_main.cc is a thin wrapper; tests start
// it in-process on OS-chosen ports.
//
// Thread safety: Shutdown may be called from any thread, once or more.

#ifndef GAC_SERVER_SERVER_H_
#define GAC_SERVER_SERVER_H_

#include <chrono>
#include <memory>
#include <string>

#include "gac/base/status.h"
#include "gac/server/config.h"
#include "gac/server/store.h"

namespace gac::server {

class Metrics;

class GacServer {
 public:
  // Opens the store (unless one is given: tests pass NewMemoryStore()):
  // SQLite, or PostgreSQL for a postgresql:// config.store; loads the run
  // settings, and starts serving (with a PostgreSQL store, also listening
  // for settings changes made through other replicas). Errors: bad TLS or
  // token files (InvalidArgument, or the errno's code: NotFound,
  // PermissionDenied), a data directory or database that cannot be created
  // or opened (the errno's code; DataLoss for a damaged file,
  // FailedPrecondition for a newer schema; for PostgreSQL Unavailable,
  // Unauthenticated, NotFound as OpenPostgresStore), an address that cannot
  // be bound (Unavailable).
  static base::StatusOr<std::unique_ptr<GacServer>> Start(const ServerConfig& config,
                                                    std::unique_ptr<Store> store = nullptr);
  ~GacServer();  // Shutdown(0)

  // Stops accepting calls and reports NOT_SERVING; ends open ingest streams
  // after their pending acknowledgements (status UNAVAILABLE, so agents
  // reconnect elsewhere or later); gives other calls up to `drain` to
  // finish, then cancels them; commits everything queued and closes the
  // store. Idempotent.
  void Shutdown(std::chrono::milliseconds drain);

  // Blocks until Shutdown has completed.
  void Wait();

  // "127.0.0.1:PORT" of the gRPC listener, with the port actually bound.
  const std::string& address() const;
  int port() const;
  // Port of the HTTP server (/metrics, /api/v1, the page), or 0 when it is off.
  int metrics_port() const;
  Metrics& metrics();
  Store& store();

 private:
  struct Impl;
  explicit GacServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SERVER_H_
