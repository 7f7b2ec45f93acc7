#include "gac/server/config.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string_view>
#include <sstream>

#include "gac/base/duration.h"
#include "gac/proto/convert.h"
#include "gac/server/store.h"
#include "server/src/validate.h"

namespace gac::server {
namespace {

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

base::Status ParseBool(const std::string& v, bool* out) {
  if (v == "true" || v == "1" || v == "yes" || v.empty()) {
    *out = true;
  } else if (v == "false" || v == "0" || v == "no") {
    *out = false;
  } else {
    return base::Status::InvalidArgument("expected true or false, got '" + v + "'");
  }
  return base::Status::Ok();
}

base::Status ParseSize(const std::string& v, std::size_t* out) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || v[0] == '-') {
    return base::Status::InvalidArgument("expected a non-negative integer, got '" + v + "'");
  }
  *out = static_cast<std::size_t>(x);
  return base::Status::Ok();
}

base::Status ParseDouble(const std::string& v, double* out) {
  char* end = nullptr;
  *out = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') return base::Status::InvalidArgument("expected a number, got '" + v + "'");
  return base::Status::Ok();
}

// --store: sqlite:DIR, memory, a postgresql:// URI; or, deprecated, sqlite
// (SQLite at --db or in --data-dir) and "" (the same).
base::Status SetStore(ServerConfig& c, const std::string& v) {
  constexpr std::string_view kSqlite = "sqlite:";
  if (v.compare(0, kSqlite.size(), kSqlite) == 0) {
    if (v.size() == kSqlite.size()) return base::Status::InvalidArgument("sqlite: needs a data directory (sqlite:DIR)");
    c.store = "sqlite";
    c.data_dir = v.substr(kSqlite.size());
    c.db.clear();
    return base::Status::Ok();
  }
  if (v.empty() || v == "sqlite" || v == "memory" || IsPostgresUri(v)) {
    c.store = v;
    return base::Status::Ok();
  }
  return base::Status::InvalidArgument("expected sqlite:DIR, memory or a postgresql:// URI, got '" +
                                 (v.find("://") != std::string::npos ? v.substr(0, v.find("://") + 3) + "..." : v) +
                                 "'");
}

// The deprecated spellings, which still work: what replaces each, as
// {key, value}. A deprecated value of a current key has its own entry.
struct Replacement {
  const char* key;
  const char* value;
};
const Replacement* Deprecated(const std::string& key, const std::string& value) {
  static constexpr Replacement kHttpListen{"http-listen", "HOST:PORT"};
  static constexpr Replacement kSqliteStore{"store", "sqlite:DIR"};
  static constexpr Replacement kSqliteOrMemory{"store", "sqlite:DIR (the database DIR/gacd.db) or --store=memory"};
  if (key == "metrics-listen") return &kHttpListen;
  if (key == "data-dir" || (key == "store" && value == "sqlite")) return &kSqliteStore;
  if (key == "db") return &kSqliteOrMemory;
  return nullptr;
}

using Setter = std::function<base::Status(ServerConfig&, const std::string&)>;

const std::map<std::string, Setter>& Setters() {
  static const auto* setters = new std::map<std::string, Setter>{
      {"listen", [](ServerConfig& c, const std::string& v) { c.listen = v; return base::Status::Ok(); }},
      {"http-listen", [](ServerConfig& c, const std::string& v) { c.metrics_listen = v; return base::Status::Ok(); }},
      {"metrics-listen", [](ServerConfig& c, const std::string& v) { c.metrics_listen = v; return base::Status::Ok(); }},
      {"data-dir", [](ServerConfig& c, const std::string& v) { c.data_dir = v; return base::Status::Ok(); }},
      {"db", [](ServerConfig& c, const std::string& v) { c.db = v; return base::Status::Ok(); }},
      {"store", SetStore},
      {"token-file", [](ServerConfig& c, const std::string& v) { c.token_file = v; return base::Status::Ok(); }},
      {"insecure", [](ServerConfig& c, const std::string& v) { return ParseBool(v, &c.insecure); }},
      {"tls-cert", [](ServerConfig& c, const std::string& v) { c.tls_cert = v; return base::Status::Ok(); }},
      {"tls-key", [](ServerConfig& c, const std::string& v) { c.tls_key = v; return base::Status::Ok(); }},
      {"tls-client-ca", [](ServerConfig& c, const std::string& v) { c.tls_client_ca = v; return base::Status::Ok(); }},
      {"ready-file", [](ServerConfig& c, const std::string& v) { c.ready_file = v; return base::Status::Ok(); }},
      {"sync",
       [](ServerConfig& c, const std::string& v) {
         if (v != "full" && v != "normal") return base::Status::InvalidArgument("expected full or normal, got '" + v + "'");
         c.sync = v;
         return base::Status::Ok();
       }},
      {"retention",
       [](ServerConfig& c, const std::string& v) {
         GAC_ASSIGN_OR_RETURN(auto d, ParseSeconds(v));
         c.retention = d;
         return base::Status::Ok();
       }},
      {"run-ttl",
       [](ServerConfig& c, const std::string& v) {
         GAC_ASSIGN_OR_RETURN(auto d, ParseSeconds(v));
         c.run_ttl = d;
         return base::Status::Ok();
       }},
      {"drain-timeout",
       [](ServerConfig& c, const std::string& v) {
         GAC_ASSIGN_OR_RETURN(auto d, ParseSeconds(v));
         c.drain_timeout = d;
         return base::Status::Ok();
       }},
      {"max-runs-exported", [](ServerConfig& c, const std::string& v) { return ParseSize(v, &c.max_runs_exported); }},
      {"per-layer-metrics", [](ServerConfig& c, const std::string& v) { return ParseBool(v, &c.per_layer_metrics); }},
      {"max-layers-per-run", [](ServerConfig& c, const std::string& v) { return ParseSize(v, &c.max_layers_per_run); }},
      {"max-message-bytes", [](ServerConfig& c, const std::string& v) { return ParseSize(v, &c.max_message_bytes); }},
      {"max-queue-rows", [](ServerConfig& c, const std::string& v) { return ParseSize(v, &c.max_queue_rows); }},
      {"c-low",
       [](ServerConfig& c, const std::string& v) {
         double x;
         base::Status st = ParseDouble(v, &x);
         c.default_thresholds.set_c_low(x);
         return st;
       }},
      {"c-high",
       [](ServerConfig& c, const std::string& v) {
         double x;
         base::Status st = ParseDouble(v, &x);
         c.default_thresholds.set_c_high(x);
         return st;
       }},
      {"alpha-mode",
       [](ServerConfig& c, const std::string& v) {
         GAC_ASSIGN_OR_RETURN(controller::AlphaMode mode, controller::ParseAlphaMode(v.c_str()));
         c.default_thresholds.set_alpha_mode(proto::ToProto(mode));
         return base::Status::Ok();
       }},
      {"mode",
       [](ServerConfig& c, const std::string& v) {
         GAC_ASSIGN_OR_RETURN(controller::Mode mode, controller::ParseMode(v.c_str()));
         c.default_mode = proto::ToProto(mode);
         return base::Status::Ok();
       }},
  };
  return *setters;
}

// `where` is "--" for a flag, "FILE:LINE: " for a config file line. A
// deprecated key or value adds a note to `notes`.
base::Status Set(ServerConfig& config, const std::string& key, const std::string& value, const std::string& where,
           std::vector<std::string>* notes) {
  const auto& setters = Setters();
  auto it = setters.find(key);
  if (it == setters.end()) return base::Status::InvalidArgument(where + "unknown option '" + key + "' (see --help)");
  base::Status st = it->second(config, value);
  if (!st.ok()) return base::Status::InvalidArgument(where + key + ": " + st.message());
  if (const Replacement* r = Deprecated(key, value); r != nullptr) {
    const bool flag = where == "--";
    const std::string old_spelling = key == "store" ? key + (flag ? "=" : " = ") + value : key;
    notes->push_back(where + old_spelling + " is deprecated; use " + (flag ? "--" : "") + r->key +
                     (flag ? "=" : " = ") + r->value);
  }
  return base::Status::Ok();
}

base::Status LoadConfigFile(const std::string& path, ServerConfig& config, std::vector<std::string>* notes) {
  std::ifstream in(path);
  if (!in) return base::Status::InvalidArgument("cannot read config file '" + path + "'");
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    line = Trim(line);
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    const auto eq = line.find('=');
    if (eq == std::string::npos) return base::Status::InvalidArgument(where + "expected 'key = value'");
    base::Status st = Set(config, Trim(line.substr(0, eq)), Trim(line.substr(eq + 1)), where, notes);
    if (!st.ok()) return st;
  }
  return base::Status::Ok();
}

}  // namespace

ServerConfig::ServerConfig() {
  default_thresholds.set_c_low(0.05);
  default_thresholds.set_c_high(0.3);
  default_thresholds.set_alpha_mode(v1::ALPHA_MODE_PAPER);
}

std::string Usage() {
  return R"(usage: gacd [--flag=value ...]

  --config FILE             "key = value" lines with the flag names below
  --listen HOST:PORT        gRPC address (default 127.0.0.1:7070; port 0 = any)
  --http-listen HOST:PORT   HTTP address: /metrics, the JSON API and the page (default 127.0.0.1:9464; "" = off)
  --store STORE             where the history is kept (default sqlite:gacd-data):
                              sqlite:DIR  SQLite at DIR/gacd.db (DIR is created)
                              postgresql://USER@HOST:PORT/DB  PostgreSQL, which several gacd may
                                share (password: PGPASSWORD or a passfile)
                              memory      in memory, not persisted
  --token-file FILE         bearer tokens: "name token rights runs" per line
  --insecure                no authentication (loopback addresses only; for local use)
  --tls-cert FILE --tls-key FILE  serve gRPC over TLS
  --tls-client-ca FILE      with TLS: require client certificates signed by these CAs (mTLS)
  --sync full|normal        SQLite commit durability (default full: fsync per commit)
  --retention DURATION      delete runs idle this long (e.g. 30d; default 0 = keep)
  --run-ttl DURATION        idle runs leave /metrics after this (default 15m)
  --max-runs-exported N     runs exported at once (default 1000)
  --per-layer-metrics       export per-layer series (default off)
  --max-layers-per-run N    per-layer series cap per run (default 64)
  --max-message-bytes N     largest accepted message (default 4194304)
  --max-queue-rows N        writer queue bound in rows (default 1048576)
  --drain-timeout DURATION  on SIGTERM/SIGINT, time given to open calls (default 10s)
  --c-low X --c-high X      default thresholds (0.05, 0.3)
  --alpha-mode paper|exact  default alpha mode (paper)
  --mode monitor|local|remote  default control mode of new runs (local)
  --ready-file FILE         written once serving: "grpc=HOST:PORT" and "http=HOST:PORT"

deprecated (still accepted; gacd logs a note):
  --metrics-listen HOST:PORT  = --http-listen HOST:PORT
  --data-dir DIR            = --store=sqlite:DIR
  --db PATH                 the SQLite file PATH (":memory:" = --store=memory)
  --store sqlite            SQLite at --db, or in --data-dir
)";
}

base::StatusOr<std::chrono::seconds> ParseSeconds(const std::string& text) {
  // The syntax is gac's one (gac/base/duration.h); gacd's settings are whole seconds.
  GAC_ASSIGN_OR_RETURN(std::chrono::nanoseconds d, base::ParseDuration(text));
  if (d.count() % 1000000000 != 0) {
    return base::Status::InvalidArgument("duration '" + text + "' is not a whole number of seconds");
  }
  return std::chrono::duration_cast<std::chrono::seconds>(d);
}

bool IsLoopbackAddress(const std::string& address) {
  std::string host = address;
  if (!host.empty() && host[0] == '[') {
    const auto close = host.find(']');
    host = close == std::string::npos ? host : host.substr(1, close - 1);
  } else if (const auto colon = host.rfind(':'); colon != std::string::npos) {
    host.resize(colon);
  }
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

base::Status ValidateConfig(const ServerConfig& c) {
  if (c.listen.empty()) return base::Status::InvalidArgument("--listen must not be empty");
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return base::Status::InvalidArgument("--tls-cert and --tls-key must be given together");
  }
  if (!c.tls_client_ca.empty() && c.tls_cert.empty()) {
    return base::Status::InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key (client certificates are checked over TLS)");
  }
  if (c.insecure && !c.token_file.empty()) {
    return base::Status::InvalidArgument("--insecure and --token-file exclude each other");
  }
  if (!c.insecure && c.token_file.empty()) {
    return base::Status::InvalidArgument(
        "no --token-file given: pass one, or --insecure for local use without authentication");
  }
  if (c.insecure && !IsLoopbackAddress(c.listen)) {
    return base::Status::InvalidArgument("--insecure is allowed only on a loopback --listen address, got '" +
                                   c.listen + "'");
  }
  base::StatusOr<controller::Thresholds> t = proto::ThresholdsFromProto(c.default_thresholds);
  if (!t.ok()) return base::Status::InvalidArgument("default thresholds: " + t.status().message());
  if (IsPostgresUri(c.store) && !c.db.empty()) {
    return base::Status::InvalidArgument("--db names a SQLite file; it does not go with --store=postgresql://...");
  }
  if (c.store == "memory" && !c.db.empty() && c.db != ":memory:") {
    return base::Status::InvalidArgument("--db names a SQLite file; it does not go with --store=memory");
  }
  if (c.max_message_bytes < 1024) return base::Status::InvalidArgument("--max-message-bytes must be >= 1024");
  if (c.max_queue_rows == 0) return base::Status::InvalidArgument("--max-queue-rows must be > 0");
  if (c.max_layers_per_run == 0 && c.per_layer_metrics) {
    return base::Status::InvalidArgument("--max-layers-per-run must be > 0 with --per-layer-metrics");
  }
  return base::Status::Ok();
}

std::string ServerConfig::DatabasePath() const { return db.empty() ? data_dir + "/gacd.db" : db; }

bool ServerConfig::UsesMemoryStore() const { return store == "memory" || (db == ":memory:" && !IsPostgresUri(store)); }

std::string ServerConfig::StoreDescription() const {
  if (IsPostgresUri(store)) return DescribePostgresUri(store);
  if (UsesMemoryStore()) return "in memory (not persisted)";
  return DatabasePath();
}

base::StatusOr<Flags> ParseFlags(int argc, const char* const* argv) {
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_file;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      Flags help;
      help.help = true;
      return help;
    }
    if (arg.rfind("--", 0) != 0) return base::Status::InvalidArgument("unexpected argument '" + arg + "' (see --help)");
    arg = arg.substr(2);
    std::string key = arg, value;
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      key = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (key != "insecure" && key != "per-layer-metrics") {
      if (i + 1 >= argc) return base::Status::InvalidArgument("--" + key + " needs a value");
      value = argv[++i];
    }
    if (key == "config") {
      config_file = value;
    } else {
      flags.emplace_back(key, value);
    }
  }
  Flags parsed;
  ServerConfig& config = parsed.config;
  if (!config_file.empty()) GAC_RETURN_IF_ERROR(LoadConfigFile(config_file, config, &parsed.deprecations));
  for (const auto& [key, value] : flags) GAC_RETURN_IF_ERROR(Set(config, key, value, "--", &parsed.deprecations));
  GAC_RETURN_IF_ERROR(ValidateConfig(config));
  return parsed;
}

}  // namespace gac::server
