// gacd's configuration: command-line flags and an optional config file.
//
// The config file (--config FILE) holds "key = value" lines with the flag
// names as keys ('#' starts a comment); flags given on the command line
// override it. The old spellings --metrics-listen (now --http-listen),
// --data-dir and --db (now --store=sqlite:DIR or --store=memory) and
// --store=sqlite still work, with a deprecation note in Flags. Durations accept a number with an optional unit s, m, h or d.

#ifndef GAC_SERVER_CONFIG_H_
#define GAC_SERVER_CONFIG_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "gac/base/status.h"
#include "gac/v1/control.pb.h"

namespace gac::server {

struct ServerConfig {
  std::string listen = "127.0.0.1:7070";          // gRPC address; port 0 = OS-chosen
  std::string metrics_listen = "127.0.0.1:9464";  // HTTP port (--http-listen): /metrics, JSON API, page; "" = none
  // The store (--store): "" or "sqlite" = SQLite at DatabasePath(); "memory"
  // = the in-memory store; or a postgresql://... URI (replicas may share it).
  // --store=sqlite:DIR sets store = "sqlite", data_dir = DIR and clears db.
  std::string store;
  std::string data_dir = "gacd-data";             // SQLite: created if missing
  std::string db;                                 // "" = <data_dir>/gacd.db; ":memory:" = in-memory store
  std::string token_file;                         // bearer tokens (see auth.h)
  bool insecure = false;                          // no auth; only on loopback addresses
  std::string tls_cert, tls_key;                  // PEM files; both or neither
  std::string tls_client_ca;                      // PEM CA file: clients need a certificate it signed (mTLS)
  std::string sync = "full";                      // SQLite synchronous: full | normal
  std::chrono::seconds retention{0};              // delete runs idle this long; 0 = keep
  std::chrono::seconds run_ttl{15 * 60};          // idle runs leave /metrics after this
  std::size_t max_runs_exported = 1000;
  bool per_layer_metrics = false;
  std::size_t max_layers_per_run = 64;
  std::size_t max_message_bytes = 4 << 20;        // gRPC receive limit
  std::size_t max_queue_rows = 1 << 20;           // writer queue bound (rows); beyond: RESOURCE_EXHAUSTED
  std::chrono::seconds drain_timeout{10};         // SIGTERM: time given to open calls
  v1::Thresholds default_thresholds;              // for runs without settings
  v1::ControlMode default_mode = v1::CONTROL_MODE_LOCAL;
  std::string ready_file;                         // written with the bound ports once serving

  ServerConfig();

  // The SQLite file: `db`, or <data_dir>/gacd.db when it is empty.
  std::string DatabasePath() const;
  // True when the store is the in-memory one (nothing persisted).
  bool UsesMemoryStore() const;
  // The store for logs: the SQLite file, the PostgreSQL URI without its
  // password, or "in memory (not persisted)".
  std::string StoreDescription() const;
};

struct Flags {
  bool help = false;    // --help / -h was given: print Usage(); config is not set
  ServerConfig config;  // the validated configuration otherwise
  // One line per deprecated flag or config key used (it still works), e.g.
  // "--data-dir is deprecated; use --store=sqlite:DIR", for the log.
  std::vector<std::string> deprecations;
};

// Parses argv (argv[0] skipped). Returns InvalidArgument with the offending
// flag for unknown flags, bad values, and inconsistent settings (TLS half
// given, neither a token file nor --insecure, --insecure on a non-loopback
// address, thresholds out of range).
base::StatusOr<Flags> ParseFlags(int argc, const char* const* argv);

// Checks a complete configuration (called by ParseFlags).
base::Status ValidateConfig(const ServerConfig& config);

std::string Usage();

// A duration flag in whole seconds: base::ParseDuration's syntax ("30d",
// "12h", "15m", "10s", "10" = seconds); a fraction of a second is refused.
base::StatusOr<std::chrono::seconds> ParseSeconds(const std::string& text);

// True for 127.0.0.0/8, [::1] and "localhost" host parts of host:port.
bool IsLoopbackAddress(const std::string& address);

}  // namespace gac::server

#endif  // GAC_SERVER_CONFIG_H_
