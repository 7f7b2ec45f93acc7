// gacd: the gac telemetry server. See `gacd --help` and docs/OPERATIONS.md.

#include <csignal>
#include <cstdio>
#include <string>
#include <pthread.h>

#include "gac/server/server.h"
#include "gac/server/store.h"

int main(int argc, char** argv) {
  using gac::server::GacServer;
  auto flags = gac::server::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "gacd: %s\n", flags.status().message().c_str());
    return 2;
  }
  if (flags->help) {
    std::fputs(gac::server::Usage().c_str(), stdout);
    return 0;
  }
  for (const std::string& note : flags->deprecations) std::fprintf(stderr, "gacd: warning: %s\n", note.c_str());
  const gac::server::ServerConfig* config = &flags->config;
  // Every thread inherits the blocked set; the main thread takes the signals
  // synchronously with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = GacServer::Start(*config);
  if (!server.ok()) {
    // Whatever stops the start is configuration (files, addresses, the
    // store and its database): exit 2, which systemd does not restart.
    std::fprintf(stderr, "gacd: cannot start: %s\n", server.status().ToString().c_str());
    return 2;
  }
  const std::string store = config->StoreDescription();
  std::fprintf(stderr, "gacd: serving gRPC on %s%s, store %s%s\n", (*server)->address().c_str(),
               config->tls_cert.empty() ? "" : " (TLS)", store.c_str(),
               config->insecure ? ", INSECURE: no authentication" : "");
  if ((*server)->metrics_port() != 0) {
    const std::string http = "http://" + config->metrics_listen.substr(0, config->metrics_listen.rfind(':')) + ":" +
                             std::to_string((*server)->metrics_port());
    std::fprintf(stderr, "gacd: Prometheus metrics on %s/metrics, the page on %s/, the JSON API under %s/api/v1\n",
                 http.c_str(), http.c_str(), http.c_str());
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "gacd: %s: draining (up to %llds) and committing\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
               static_cast<long long>(config->drain_timeout.count()));
  (*server)->Shutdown(config->drain_timeout);
  std::fprintf(stderr, "gacd: stopped\n");
  return 0;
}
