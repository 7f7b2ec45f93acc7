// The PostgreSQL Store: several gacd replicas share one database.
//
// Connections (libpq, binary parameters and results): one for writes, a
// small pool for reads, and one that LISTENs for settings changes. Each is
// re-established on demand after the database went away; while it cannot
// be, calls fail at once with UNAVAILABLE (after one attempt per
// PostgresOptions::reconnect_interval), so Decide, which never reads the
// store, keeps answering from memory.
//
// Schema (version 1; the table gac_schema holds the version), created in the
// connection's current schema (the first of its search_path): the tables of
// the SQLite store (sqlite_store.cc) with PostgreSQL types; floating-point
// columns are float8, which keeps every IEEE value exactly (-0.0 included);
// run_config has a version column for the compare-and-set of settings. The
// record columns of `steps` are those of the record schema
// (gac/proto/record_schema.h): COPY rows and reads walk it.
//
// Ingest (Apply): one transaction per call.
//  1. The runs of the records are locked FOR KEY SHARE (created first when
//     new), so that retention on another replica, which locks idle runs FOR
//     UPDATE SKIP LOCKED, cannot delete a run that is being written.
//  2. Keys repeated within the call count as duplicates; keys already stored
//     are found by one indexed lookup and count as duplicates too.
//  3. The new step, layer and scalar rows go in with COPY (binary): the bulk
//     path, no statement per row.
//  4. Each run's counters are updated once; with several runs their rows are
//     locked in run_id order first, so two replicas never deadlock on them.
// When another replica stores one of the keys between 2 and 3 (a replay
// arriving at two replicas at once), COPY fails on the primary key; the call
// is rolled back and done again on the slow path: COPY into temporary
// tables, then INSERT ... ON CONFLICT DO NOTHING, which waits for the other
// transaction and skips what it stored. A deadlock or serialization failure
// (neither expected) is retried. Acknowledgements go out after COMMIT.
//
// Settings: a change is written only when the stored version is the one it
// was made from (UPDATE ... WHERE version = before), and pg_notify tells
// every replica's listener the new settings (delivered at commit).

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gac/base/mutex.h"
#include "gac/proto/record_schema.h"
#include "gac/server/store.h"
#include "server/src/store/postgres_codec.h"
#include "server/src/store/step_columns.h"

namespace gac::server {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();

// The advisory lock that serialises migrations of replicas starting together
// ("gacschem" in ASCII).
constexpr std::int64_t kMigrationLockKey = 0x6761637363686556;

// Attempts of one Apply: the fast path, then the slow path after a key
// collision with another replica, and retries after a deadlock or a
// serialization failure.
constexpr int kApplyAttempts = 4;

// ---------------------------------------------------------------------------
// Schema and migrations
// ---------------------------------------------------------------------------

constexpr char kSchemaV1[] = R"sql(
CREATE TABLE runs (
  run_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name          text NOT NULL UNIQUE,
  first_step    bigint NOT NULL,
  last_step     bigint NOT NULL,
  step_records  bigint NOT NULL,
  first_seen_ns bigint NOT NULL,
  last_seen_ns  bigint NOT NULL,
  world_size    bigint NOT NULL
);
CREATE TABLE steps (
  run_id       bigint NOT NULL,
  step         bigint NOT NULL,
  rank         bigint NOT NULL,
  world_size   bigint NOT NULL,
  cosine       float8,
  grad_norm    float8 NOT NULL,
  ref_norm     float8 NOT NULL,
  regime       integer NOT NULL,
  alpha        float8 NOT NULL,
  cosine_after float8,
  staleness    bigint,
  wall_time_ns bigint NOT NULL,
  overhead_s   float8 NOT NULL,
  mode         integer NOT NULL,
  fallback     boolean NOT NULL,
  received_ns  bigint NOT NULL,
  PRIMARY KEY (run_id, step, rank)
);
CREATE INDEX steps_by_rank ON steps (run_id, rank, step);
CREATE TABLE layers (
  run_id    bigint NOT NULL,
  step      bigint NOT NULL,
  rank      bigint NOT NULL,
  name      text NOT NULL,
  idx       integer NOT NULL,
  cosine    float8,
  grad_norm float8 NOT NULL,
  ref_norm  float8 NOT NULL,
  PRIMARY KEY (run_id, step, rank, name)
);
CREATE TABLE scalars (
  run_id bigint NOT NULL,
  step   bigint NOT NULL,
  rank   bigint NOT NULL,
  name   text NOT NULL,
  value  float8 NOT NULL,
  PRIMARY KEY (run_id, step, rank, name)
);
CREATE TABLE run_config (
  run     text PRIMARY KEY,
  version bigint NOT NULL,
  config  bytea NOT NULL
);
CREATE TABLE config_changes (
  id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  run     text NOT NULL,
  time_ns bigint NOT NULL,
  change  bytea NOT NULL
);
CREATE INDEX config_changes_by_run ON config_changes (run, id);
)sql";

// Brings the schema from version i to i + 1 (kMigrations[i]), inside the
// migration transaction. To change the schema, append one; never edit one.
constexpr const char* kMigrations[] = {kSchemaV1};
constexpr int kSchemaVersion = static_cast<int>(std::size(kMigrations));

// Column lists, in table order (COPY and the staging tables rely on it).
// The steps columns: run_id, the record schema's, received_ns.
const std::string& PgStepColumns() {
  static const auto* columns = new std::string("run_id, " + StepColumnList() + ", received_ns");
  return *columns;
}
#define GAC_PG_LAYER_COLUMNS "run_id, step, rank, name, idx, cosine, grad_norm, ref_norm"
#define GAC_PG_SCALAR_COLUMNS "run_id, step, rank, name, value"
// The last column is RunInfo.steps_mode: the mode of the latest step record.
#define GAC_PG_RUN_COLUMNS                                                               \
  "name, first_step, last_step, step_records, first_seen_ns, last_seen_ns, world_size, " \
  "(SELECT mode FROM steps WHERE steps.run_id = runs.run_id ORDER BY step DESC, rank DESC LIMIT 1)"

// ---------------------------------------------------------------------------
// Prepared statements. Every parameter is binary; every result too.
// ---------------------------------------------------------------------------

struct StatementDef {
  const char* name;
  std::string sql;
  std::vector<unsigned> types;
};

using pg::kByteaOid;
using pg::kFloat8Oid;
using pg::kInt4Oid;
using pg::kInt8ArrayOid;
using pg::kInt8Oid;
using pg::kTextArrayOid;
using pg::kTextOid;

const std::vector<StatementDef>& WriteStatements() {
  static const auto* defs = new std::vector<StatementDef>{
      {"find_runs",
       "SELECT name, run_id FROM runs WHERE name = ANY($1) ORDER BY name FOR KEY SHARE",
       {kTextArrayOid}},
      // Sentinels that the first counter update of the call replaces.
      {"insert_runs",
       "INSERT INTO runs (name, first_step, last_step, step_records, first_seen_ns, last_seen_ns, "
       "world_size) SELECT n, 9223372036854775807, -9223372036854775808, 0, 9223372036854775807, "
       "-9223372036854775808, 0 FROM unnest($1::text[]) AS n ORDER BY n ON CONFLICT (name) DO NOTHING",
       {kTextArrayOid}},
      {"existing_keys",
       "SELECT s.run_id, s.step, s.rank FROM unnest($1::int8[], $2::int8[], $3::int8[]) "
       "AS k(run_id, step, rank) JOIN steps s ON s.run_id = k.run_id AND s.step = k.step "
       "AND s.rank = k.rank",
       {kInt8ArrayOid, kInt8ArrayOid, kInt8ArrayOid}},
      {"lock_runs", "SELECT run_id FROM runs WHERE run_id = ANY($1) ORDER BY run_id FOR NO KEY UPDATE",
       {kInt8ArrayOid}},
      {"update_runs",
       "UPDATE runs AS r SET first_step = LEAST(r.first_step, d.first_step), "
       "last_step = GREATEST(r.last_step, d.last_step), step_records = r.step_records + d.stored, "
       "world_size = GREATEST(r.world_size, d.world_size), "
       "first_seen_ns = LEAST(r.first_seen_ns, d.first_seen), "
       "last_seen_ns = GREATEST(r.last_seen_ns, d.last_seen) "
       "FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::int8[], $7::int8[]) "
       "AS d(run_id, first_step, last_step, stored, world_size, first_seen, last_seen) "
       "WHERE r.run_id = d.run_id",
       {kInt8ArrayOid, kInt8ArrayOid, kInt8ArrayOid, kInt8ArrayOid, kInt8ArrayOid, kInt8ArrayOid,
        kInt8ArrayOid}},
      // The slow path: the staged rows whose step key is new, in key order
      // (so that two replicas wait on each other's keys in one order).
      {"insert_staged",
       "WITH s AS (INSERT INTO steps SELECT * FROM stage_steps ORDER BY run_id, step, rank "
       "ON CONFLICT DO NOTHING RETURNING run_id, step, rank), "
       "l AS (INSERT INTO layers SELECT x.* FROM stage_layers x JOIN s ON x.run_id = s.run_id "
       "AND x.step = s.step AND x.rank = s.rank ON CONFLICT DO NOTHING), "
       "c AS (INSERT INTO scalars SELECT x.* FROM stage_scalars x JOIN s ON x.run_id = s.run_id "
       "AND x.step = s.step AND x.rank = s.rank ON CONFLICT DO NOTHING) "
       "SELECT run_id, step, rank FROM s",
       {}},
      // Settings: compare-and-set on the version.
      {"config_first",
       "INSERT INTO run_config (run, version, config) VALUES ($1, $2, $3) ON CONFLICT (run) "
       "DO UPDATE SET version = excluded.version, config = excluded.config WHERE run_config.version = 0",
       {kTextOid, kInt8Oid, kByteaOid}},
      {"config_next", "UPDATE run_config SET version = $2, config = $3 WHERE run = $1 AND version = $4",
       {kTextOid, kInt8Oid, kByteaOid, kInt8Oid}},
      {"config_get", "SELECT config FROM run_config WHERE run = $1", {kTextOid}},
      {"insert_change", "INSERT INTO config_changes (run, time_ns, change) VALUES ($1, $2, $3)",
       {kTextOid, kInt8Oid, kByteaOid}},
      {"notify", "SELECT pg_notify($1, $2)", {kTextOid, kTextOid}},
      // Retention: idle runs that no writer holds.
      {"idle_runs",
       "SELECT run_id FROM runs WHERE last_seen_ns < $1 ORDER BY name FOR UPDATE SKIP LOCKED",
       {kInt8Oid}},
      {"delete_layers", "DELETE FROM layers WHERE run_id = ANY($1)", {kInt8ArrayOid}},
      {"delete_scalars", "DELETE FROM scalars WHERE run_id = ANY($1)", {kInt8ArrayOid}},
      {"delete_steps", "DELETE FROM steps WHERE run_id = ANY($1)", {kInt8ArrayOid}},
      {"delete_runs", "DELETE FROM runs WHERE run_id = ANY($1)", {kInt8ArrayOid}},
  };
  return *defs;
}

const std::vector<StatementDef>& ReadStatements() {
  const std::string columns = StepColumnList();
  static const auto* defs = new std::vector<StatementDef>{
      {"run_id", "SELECT run_id FROM runs WHERE name = $1 AND step_records > 0", {kTextOid}},
      {"get_run", "SELECT " GAC_PG_RUN_COLUMNS " FROM runs WHERE name = $1 AND step_records > 0",
       {kTextOid}},
      {"list_runs",
       "SELECT " GAC_PG_RUN_COLUMNS " FROM runs WHERE name > $1 AND step_records > 0 "
       "ORDER BY name LIMIT $2",
       {kTextOid, kInt8Oid}},
      // ($4, $5) is the `after` key, (INT64_MIN, -1) when there is none.
      {"steps_all",
       "SELECT " + columns + " FROM steps WHERE run_id = $1 AND step >= $2 AND step < $3 "
       "AND (step, rank) > ($4, $5) ORDER BY step, rank LIMIT $6",
       {kInt8Oid, kInt8Oid, kInt8Oid, kInt8Oid, kInt8Oid, kInt8Oid}},
      {"steps_rank",
       "SELECT " + columns + " FROM steps WHERE run_id = $1 AND rank = $7 "
       "AND step >= $2 AND step < $3 AND (step, rank) > ($4, $5) ORDER BY step LIMIT $6",
       {kInt8Oid, kInt8Oid, kInt8Oid, kInt8Oid, kInt8Oid, kInt8Oid, kInt8Oid}},
      // LIMIT NULL is no limit.
      {"recent",
       "SELECT " + columns + " FROM steps WHERE run_id = $1 AND rank = $2 "
       "ORDER BY step DESC LIMIT $3",
       {kInt8Oid, kInt8Oid, kInt8Oid}},
      // The details of the records of a step range ($4: one rank, or NULL).
      {"scalars_range",
       "SELECT step, rank, name, value FROM scalars WHERE run_id = $1 AND step >= $2 AND step <= $3 "
       "AND ($4::int8 IS NULL OR rank = $4)",
       {kInt8Oid, kInt8Oid, kInt8Oid, kInt8Oid}},
      {"layers_range",
       "SELECT step, rank, name, cosine, grad_norm, ref_norm FROM layers WHERE run_id = $1 "
       "AND step >= $2 AND step <= $3 AND ($4::int8 IS NULL OR rank = $4) ORDER BY step, rank, idx",
       {kInt8Oid, kInt8Oid, kInt8Oid, kInt8Oid}},
      {"changes",
       "SELECT change FROM config_changes WHERE run = $1 ORDER BY id LIMIT $2 OFFSET $3",
       {kTextOid, kInt8Oid, kInt8Oid}},
      {"configs", "SELECT run, config FROM run_config WHERE version >= 1 ORDER BY run", {}},
  };
  return *defs;
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

// libpq's messages end in a newline and may span lines ("...\n\tIs the
// server running...?"): one line, parts separated by "; ".
std::string OneLine(std::string_view text) {
  std::string out;
  bool pending = false;
  for (char c : text) {
    if (c == '\n' || c == '\r') {
      pending = !out.empty();
      continue;
    }
    if (pending) {
      out += "; ";
      pending = false;
      if (c == '\t' || c == ' ') continue;
    }
    if (c == '\t') c = ' ';
    out += c;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out;
}

bool Contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// The code of a SQLSTATE: connection loss, shutdown, lock conflicts and
// full resources are retryable (UNAVAILABLE), a full disk RESOURCE_EXHAUSTED,
// authorisation PERMISSION_DENIED, only damaged data DATA_LOSS.
base::StatusCode SqlStateCode(std::string_view state) {
  if (state.size() != 5) return base::StatusCode::kUnavailable;
  const std::string_view cls = state.substr(0, 2);
  if (cls == "08" || cls == "40" || cls == "57" || cls == "58" || cls == "55") return base::StatusCode::kUnavailable;
  if (state == "53100") return base::StatusCode::kResourceExhausted;
  if (cls == "53") return base::StatusCode::kUnavailable;
  if (state == "25006") return base::StatusCode::kUnavailable;  // a read-only (standby) server
  if (cls == "28") return base::StatusCode::kUnauthenticated;
  if (state == "42501") return base::StatusCode::kPermissionDenied;
  if (state == "3D000") return base::StatusCode::kNotFound;
  if (state == "XX001" || state == "XX002") return base::StatusCode::kDataLoss;
  return base::StatusCode::kInternal;
}

// A connection that could not be made has no SQLSTATE in libpq; the text
// tells a refused password or a missing database from an unreachable server.
base::StatusCode ConnectFailureCode(std::string_view message) {
  if (Contains(message, "password authentication failed") || Contains(message, "no password supplied") ||
      Contains(message, "authentication failed") || (Contains(message, "role") && Contains(message, "does not exist"))) {
    return base::StatusCode::kUnauthenticated;
  }
  if (Contains(message, "database") && Contains(message, "does not exist")) return base::StatusCode::kNotFound;
  if (Contains(message, "permission denied")) return base::StatusCode::kPermissionDenied;
  return base::StatusCode::kUnavailable;
}

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

struct ConnDeleter {
  void operator()(PGconn* c) const { PQfinish(c); }
};
using Conn = std::unique_ptr<PGconn, ConnDeleter>;

// Binary parameters of one statement, kept alive until the call.
class Params {
 public:
  Params& Int8(std::int64_t v) {
    std::string b;
    pg::PutInt64(&b, v);
    return Add(std::move(b));
  }
  Params& Text(std::string_view v) { return Add(std::string(v)); }
  Params& Bytea(std::string v) { return Add(std::move(v)); }
  Params& Array(const pg::ArrayParam& a) { return Add(a.Encode()); }
  Params& Null() {
    values_.emplace_back();
    null_.push_back(true);
    return *this;
  }

  int size() const { return static_cast<int>(values_.size()); }
  // Pointers into the buffers; valid while this object is not changed.
  void Pointers(std::vector<const char*>* values, std::vector<int>* lengths, std::vector<int>* formats) const {
    values->clear();
    lengths->clear();
    formats->clear();
    for (std::size_t i = 0; i < values_.size(); ++i) {
      values->push_back(null_[i] ? nullptr : values_[i].data());
      lengths->push_back(static_cast<int>(values_[i].size()));
      formats->push_back(1);
    }
  }

 private:
  Params& Add(std::string v) {
    values_.push_back(std::move(v));
    null_.push_back(false);
    return *this;
  }
  std::vector<std::string> values_;
  std::vector<bool> null_;
};

// Binary result columns.
std::int64_t Int8At(const PGresult* r, int row, int col) { return pg::ReadInt64(PQgetvalue(r, row, col)); }
std::int32_t Int4At(const PGresult* r, int row, int col) { return pg::ReadInt32(PQgetvalue(r, row, col)); }
double Float8At(const PGresult* r, int row, int col) { return pg::ReadFloat64(PQgetvalue(r, row, col)); }
bool BoolAt(const PGresult* r, int row, int col) { return PQgetvalue(r, row, col)[0] != 0; }
bool NullAt(const PGresult* r, int row, int col) { return PQgetisnull(r, row, col) != 0; }
std::string_view TextAt(const PGresult* r, int row, int col) {
  return std::string_view(PQgetvalue(r, row, col), static_cast<std::size_t>(PQgetlength(r, row, col)));
}

// The store's settings-change channel: one per schema, so that two
// deployments in two schemas of one database do not hear each other.
std::string ChannelName(const std::string& schema) { return ("gac_settings." + schema).substr(0, 63); }

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

bool Unhex(std::string_view hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  out->clear();
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

// ---------------------------------------------------------------------------
// Session: one connection, its prepared statements, and its reconnection
// ---------------------------------------------------------------------------

// Not thread-safe: its owner guards it with a mutex.
class Session {
 public:
  // `setup` (e.g. CREATE TEMP TABLE) runs after each connection is made,
  // before the statements are prepared.
  Session(const std::string* uri, const std::string* description, std::chrono::milliseconds reconnect_interval,
          const std::vector<StatementDef>* statements, std::string setup = "")
      : uri_(uri),
        description_(description),
        reconnect_interval_(reconnect_interval),
        statements_(statements),
        setup_(std::move(setup)) {}

  // Makes sure the connection is up: reconnects when it was lost or when the
  // server closed it while it was idle (a restart, a failover), at most once
  // per reconnect interval; between attempts, returns the last error.
  base::Status Ensure() {
    if (conn_ != nullptr && PQstatus(conn_.get()) == CONNECTION_OK) {
      if (PQtransactionStatus(conn_.get()) == PQTRANS_IDLE) {
        pollfd p{PQsocket(conn_.get()), POLLIN, 0};
        // Readable while idle: notifications, or the server's goodbye. Read
        // it; libpq marks the connection bad on end of file.
        if (poll(&p, 1, 0) > 0) PQconsumeInput(conn_.get());
      }
      if (PQstatus(conn_.get()) == CONNECTION_OK) return base::Status();
      conn_.reset();
    }
    const auto now = Clock::now();
    if (!last_error_.ok() && now < next_attempt_) return last_error_;
    base::Status s = Connect();
    last_error_ = s;
    if (!s.ok()) {
      conn_.reset();
      next_attempt_ = now + reconnect_interval_;
    }
    return s;
  }

  // Drops the connection (after an error that left it unusable).
  void Drop() { conn_.reset(); }

  PGconn* conn() const { return conn_.get(); }
  bool connected() const { return conn_ != nullptr && PQstatus(conn_.get()) == CONNECTION_OK; }
  // SQLSTATE of the last failed call ("" when none or unknown).
  const std::string& last_sqlstate() const { return last_sqlstate_; }

  // The error of a failed call: "<database>: <what>: <message> (SQLSTATE x)".
  base::Status Error(const PGresult* result, const char* what) {
    const char* state = result != nullptr ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
    const char* primary = result != nullptr ? PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
    last_sqlstate_ = state != nullptr ? state : "";
    std::string message = *description_ + ": " + what + ": ";
    if (primary != nullptr) {
      message += OneLine(primary);
    } else {
      message += OneLine(conn_ != nullptr ? PQerrorMessage(conn_.get()) : "no connection");
    }
    if (!last_sqlstate_.empty()) message += " (SQLSTATE " + last_sqlstate_ + ")";
    base::StatusCode code = last_sqlstate_.empty() ? base::StatusCode::kUnavailable : SqlStateCode(last_sqlstate_);
    if (!connected()) code = base::StatusCode::kUnavailable;
    return base::Status(code, std::move(message));
  }

  // A statement without parameters (text result), expecting `want`.
  base::StatusOr<Result> Exec(const std::string& sql, ExecStatusType want, const char* what) {
    Result r(PQexec(conn_.get(), sql.c_str()));
    if (PQresultStatus(r.get()) != want) return Error(r.get(), what);
    return r;
  }
  base::Status Command(const std::string& sql, const char* what) {
    base::StatusOr<Result> r = Exec(sql, PGRES_COMMAND_OK, what);
    return r.status();
  }

  // A prepared statement with binary parameters and results.
  base::StatusOr<Result> Run(const char* name, const Params& params, const char* what) {
    params.Pointers(&values_, &lengths_, &formats_);
    Result r(PQexecPrepared(conn_.get(), name, params.size(), values_.data(), lengths_.data(), formats_.data(), 1));
    const ExecStatusType st = PQresultStatus(r.get());
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) return Error(r.get(), what);
    return r;
  }

  // COPY `sql` FROM STDIN with the given binary stream.
  base::Status Copy(const char* sql, const std::string& data, const char* what) {
    Result r(PQexec(conn_.get(), sql));
    if (PQresultStatus(r.get()) != PGRES_COPY_IN) return Error(r.get(), what);
    r.reset();
    if (PQputCopyData(conn_.get(), data.data(), static_cast<int>(data.size())) != 1 ||
        PQputCopyEnd(conn_.get(), nullptr) != 1) {
      base::Status s = Error(nullptr, what);
      // Collect the result that ends the COPY.
      while (PGresult* rest = PQgetResult(conn_.get())) PQclear(rest);
      return s;
    }
    base::Status s;
    while (PGresult* rest = PQgetResult(conn_.get())) {
      Result owned(rest);
      if (s.ok() && PQresultStatus(rest) != PGRES_COMMAND_OK) s = Error(rest, what);
    }
    return s;
  }

 private:
  base::Status Connect() {
    // Defaults that the URI may override: a bounded connection wait,
    // keepalives that notice a vanished server within about a minute when
    // idle, tcp_user_timeout that gives up on a statement whose packets go
    // unanswered for 10 s (a partition that drops them: TCP alone would
    // retransmit for about 15 minutes, and gacd would hold its writer, and
    // its streams' acknowledgements, that long instead of failing with
    // UNAVAILABLE), and gacd's name in pg_stat_activity.
    const char* keywords[] = {"connect_timeout", "keepalives_idle", "keepalives_interval", "keepalives_count",
                              "tcp_user_timeout", "fallback_application_name", "client_encoding", "dbname", nullptr};
    const char* values[] = {"10", "30", "10", "3", "10000", "gacd", "UTF8", uri_->c_str(), nullptr};
    conn_.reset(PQconnectdbParams(keywords, values, /*expand_dbname=*/1));
    if (conn_ == nullptr) return base::Status::ResourceExhausted(*description_ + ": cannot allocate a connection");
    if (PQstatus(conn_.get()) != CONNECTION_OK) {
      const std::string message = OneLine(PQerrorMessage(conn_.get()));
      return base::Status(ConnectFailureCode(message), *description_ + ": cannot connect: " + message);
    }
    // Notices (e.g. of CREATE ... IF NOT EXISTS) are not errors; keep them
    // off gacd's stderr.
    PQsetNoticeProcessor(conn_.get(), [](void*, const char*) {}, nullptr);
    if (!setup_.empty()) {
      base::Status s = Command(setup_, "setting up the connection");
      if (!s.ok()) return s;
    }
    for (const StatementDef& def : *statements_) {
      Result r(PQprepare(conn_.get(), def.name, def.sql.c_str(), static_cast<int>(def.types.size()),
                         def.types.empty() ? nullptr : reinterpret_cast<const Oid*>(def.types.data())));
      if (PQresultStatus(r.get()) != PGRES_COMMAND_OK) return Error(r.get(), def.name);
    }
    return base::Status();
  }

  const std::string* const uri_;
  const std::string* const description_;
  const std::chrono::milliseconds reconnect_interval_;
  const std::vector<StatementDef>* const statements_;
  const std::string setup_;
  Conn conn_;
  base::Status last_error_;
  Clock::time_point next_attempt_{};
  std::string last_sqlstate_;
  std::vector<const char*> values_;
  std::vector<int> lengths_;
  std::vector<int> formats_;
};

// Rolls back a transaction left open by an error (when the connection still
// works); a connection in an unknown state is dropped.
void EndFailedTransaction(Session* session) {
  if (!session->connected()) {
    session->Drop();
    return;
  }
  const PGTransactionStatusType t = PQtransactionStatus(session->conn());
  if (t == PQTRANS_IDLE) return;
  if (t == PQTRANS_INERROR || t == PQTRANS_INTRANS) {
    Result r(PQexec(session->conn(), "ROLLBACK"));
    if (PQresultStatus(r.get()) == PGRES_COMMAND_OK) return;
  }
  session->Drop();
}

// ---------------------------------------------------------------------------
// Reading rows
// ---------------------------------------------------------------------------

// Fills `record` (but its run, scalars and layers) from a row whose columns
// are StepColumnList(). Column types by field type: kInteger bigint, kReal
// float8, kEnum integer, kBool boolean.
void ReadStep(const PGresult* r, int row, v1::StepRecord* record) {
  for (std::size_t i = 0; i < proto::kStepFieldCount; ++i) {
    const proto::StepField& field = proto::kStepFields[i];
    const int col = static_cast<int>(i);
    proto::FieldValue v;
    v.present = !NullAt(r, row, col);
    if (!v.present) {
      if (field.optional) field.set(v, record);
      continue;
    }
    switch (field.type) {
      case proto::FieldType::kReal: v.real = Float8At(r, row, col); break;
      case proto::FieldType::kEnum: v.integer = Int4At(r, row, col); break;
      case proto::FieldType::kBool: v.integer = BoolAt(r, row, col) ? 1 : 0; break;
      case proto::FieldType::kInteger:
      case proto::FieldType::kText: v.integer = Int8At(r, row, col); break;
    }
    field.set(v, record);
  }
}

// Appends a record field to a COPY row in its column's type (see ReadStep).
void CopyField(const proto::StepField& field, const v1::StepRecord& record, pg::CopyStream* copy) {
  const proto::FieldValue v = field.get(record);
  if (!v.present) {
    copy->Null();
    return;
  }
  switch (field.type) {
    case proto::FieldType::kReal: copy->Float8(v.real); return;
    case proto::FieldType::kEnum: copy->Int4(static_cast<std::int32_t>(v.integer)); return;
    case proto::FieldType::kBool: copy->Bool(v.integer != 0); return;
    case proto::FieldType::kInteger:
    case proto::FieldType::kText: copy->Int8(v.integer); return;
  }
}

// A stored step's key: (run_id, step, rank).
using StepKey = std::tuple<std::int64_t, std::int64_t, std::int64_t>;
struct StepKeyHash {
  std::size_t operator()(const StepKey& k) const {
    return std::hash<std::int64_t>()(std::get<0>(k) * 1000003 + std::get<1>(k)) ^
           (static_cast<std::size_t>(std::get<2>(k)) * 0x9e3779b97f4a7c15ull);
  }
};
using StepKeySet = std::unordered_set<StepKey, StepKeyHash>;

// The keys of a result whose first columns are run_id, step, rank.
StepKeySet StepKeysOf(const PGresult* r) {
  StepKeySet keys;
  for (int row = 0; row < PQntuples(r); ++row) keys.emplace(Int8At(r, row, 0), Int8At(r, row, 1), Int8At(r, row, 2));
  return keys;
}

void ReadRunInfo(const PGresult* r, int row, v1::RunInfo* info) {
  info->set_run(std::string(TextAt(r, row, 0)));
  info->set_first_step(Int8At(r, row, 1));
  info->set_last_step(Int8At(r, row, 2));
  info->set_step_records(static_cast<std::uint64_t>(Int8At(r, row, 3)));
  info->set_first_seen_ns(Int8At(r, row, 4));
  info->set_last_seen_ns(Int8At(r, row, 5));
  info->set_world_size(static_cast<std::uint32_t>(Int8At(r, row, 6)));
  if (!NullAt(r, row, 7)) info->set_steps_mode(static_cast<v1::ControlMode>(Int4At(r, row, 7)));
}

// ---------------------------------------------------------------------------
// PostgresStore
// ---------------------------------------------------------------------------

class PostgresStore final : public Store {
 public:
  static base::StatusOr<std::unique_ptr<Store>> Open(const std::string& uri, const PostgresOptions& options);

  base::Status Apply(std::vector<WriteOp>* ops) override;
  base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> LoadRunConfigs() override;
  base::StatusOr<std::vector<v1::RunInfo>> ListRuns(const std::string& after_run, std::uint32_t limit) override;
  base::StatusOr<v1::RunInfo> GetRun(const std::string& run) override;
  base::StatusOr<std::vector<v1::StepRecord>> GetSteps(const StepQuery& query) override;
  base::StatusOr<std::vector<v1::StepRecord>> GetRecentSteps(const std::string& run, std::uint32_t rank,
                                                       std::uint32_t window) override;
  base::StatusOr<std::vector<v1::ConfigChange>> ListConfigChanges(const std::string& run, std::uint64_t offset,
                                                            std::uint32_t limit) override;
  base::StatusOr<std::uint64_t> DeleteIdleRuns(std::int64_t cutoff_ns) override;
  base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> WaitForConfigChanges(
      std::chrono::milliseconds timeout) override;

 private:
  // A record of one Apply that is not a repeat of an earlier one in the call.
  struct Candidate {
    const v1::StepRecord* record;
    WriteOp* op;
    std::int64_t run_id = 0;
    bool is_new = false;
  };
  // The counter changes of one run within one Apply.
  struct RunDelta {
    std::int64_t run_id = 0;
    std::int64_t first_step = kInt64Max;
    std::int64_t last_step = kInt64Min;
    std::int64_t stored = 0;
    std::int64_t world_size = 0;
    std::int64_t first_seen = kInt64Max;
    std::int64_t last_seen = kInt64Min;
  };
  // By name: the lock order of find_runs.
  using RunDeltas = std::map<std::string_view, RunDelta>;
  struct Reader {
    base::Mutex mu;
    std::unique_ptr<Session> session GAC_PT_GUARDED_BY(mu);
  };

  PostgresStore(std::string uri, const PostgresOptions& options)
      : uri_(std::move(uri)), description_(DescribePostgresUri(uri_)), options_(options) {}

  // Creates or migrates the schema on a connection of its own; sets channel_.
  base::Status Migrate();

  // One attempt of Apply; `slow` takes the INSERT ... ON CONFLICT path.
  base::Status ApplyOnce(std::vector<WriteOp>* ops, bool slow) GAC_REQUIRES(write_mu_);
  // The step records of one attempt, in the steps of "Ingest" above.
  base::Status WriteSteps(std::vector<WriteOp>* ops, bool slow) GAC_REQUIRES(write_mu_);
  // The records whose key did not come earlier in the call (the others count
  // as duplicates of their op), and every run's seen times.
  static void CollectCandidates(std::vector<WriteOp>* ops, std::vector<Candidate>* candidates, RunDeltas* deltas);
  // Sets the run ids of `deltas` and `candidates` (ResolveRuns).
  base::Status AssignRunIds(RunDeltas* deltas, std::vector<Candidate>* candidates) GAC_REQUIRES(write_mu_);
  // The keys of `candidates` stored before (REQUIRES: candidates not empty).
  base::StatusOr<StepKeySet> FindStoredKeys(const std::vector<Candidate>& candidates) GAC_REQUIRES(write_mu_);
  // Encodes the rows of the candidates not in `existing` into the COPY
  // streams; on the fast path they are new.
  void EncodeRows(const StepKeySet& existing, bool slow, std::vector<Candidate>* candidates) GAC_REQUIRES(write_mu_);
  // COPYs the encoded rows into the tables, or into the staging tables when
  // `slow`. REQUIRES: a step row encoded.
  base::Status CopyRows(bool slow) GAC_REQUIRES(write_mu_);
  // The slow path: the staged rows whose key is new go in; their candidates
  // are marked new.
  base::Status InsertStaged(std::vector<Candidate>* candidates) GAC_REQUIRES(write_mu_);
  // Counts every candidate as stored or duplicate, in its op and its run.
  static void CountResults(const std::vector<Candidate>& candidates, RunDeltas* deltas);
  // Updates each run's counters once, the rows locked in run_id order.
  base::Status UpdateRunCounters(const RunDeltas& deltas) GAC_REQUIRES(write_mu_);
  base::Status WriteConfig(WriteOp* op) GAC_REQUIRES(write_mu_);
  // Fills the run_id of every name (creating runs) and locks them FOR KEY SHARE.
  base::Status ResolveRuns(const std::vector<std::string_view>& names,
                     std::unordered_map<std::string_view, std::int64_t>* ids) GAC_REQUIRES(write_mu_);
  // BEGIN on a working connection: reconnects once when the connection was
  // found broken at BEGIN (nothing of the transaction was sent yet).
  base::Status Begin(Session* session, const char* begin);

  // A reader of the pool, round robin.
  Reader& PickReader();
  // Reads the scalars (and layers when asked) of `records` of run `run_id`,
  // all between steps lo and hi of `rank` (nullopt = every rank).
  base::Status ReadDetails(Session* session, std::int64_t run_id, std::int64_t lo, std::int64_t hi,
                     std::optional<std::uint32_t> rank, bool include_layers, std::vector<v1::StepRecord>* records);
  // The read of GetSteps and GetRecentSteps in one REPEATABLE READ snapshot.
  base::StatusOr<std::vector<v1::StepRecord>> ReadSteps(const std::string& run, const char* statement,
                                                  const std::function<Params(std::int64_t run_id)>& params,
                                                  std::optional<std::uint32_t> rank, bool include_layers);

  const std::string uri_;
  const std::string description_;
  const PostgresOptions options_;
  std::string channel_;  // constant after Open

  base::Mutex write_mu_;
  std::unique_ptr<Session> write_ GAC_PT_GUARDED_BY(write_mu_);
  pg::CopyStream steps_copy_ GAC_GUARDED_BY(write_mu_);
  pg::CopyStream layers_copy_ GAC_GUARDED_BY(write_mu_);
  pg::CopyStream scalars_copy_ GAC_GUARDED_BY(write_mu_);

  std::vector<std::unique_ptr<Reader>> readers_;  // constant after Open
  std::atomic<std::size_t> next_reader_{0};

  base::Mutex listen_mu_;
  std::unique_ptr<Session> listen_ GAC_PT_GUARDED_BY(listen_mu_);
  bool listening_ GAC_GUARDED_BY(listen_mu_) = false;
};

base::StatusOr<std::unique_ptr<Store>> PostgresStore::Open(const std::string& uri, const PostgresOptions& options) {
  if (!IsPostgresUri(uri)) {
    return base::Status::InvalidArgument("not a PostgreSQL URI (postgresql://...): " + DescribePostgresUri(uri));
  }
  char* error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(uri.c_str(), &error);
  if (parsed == nullptr) {
    std::string message = error != nullptr ? OneLine(error) : "cannot parse";
    PQfreemem(error);
    // libpq quotes the URI, password and all.
    for (std::size_t at; (at = message.find(uri)) != std::string::npos;) message.replace(at, uri.size(), "...");
    return base::Status::InvalidArgument("bad PostgreSQL URI " + DescribePostgresUri(uri) + ": " + message);
  }
  PQconninfoFree(parsed);
  if (options.read_connections < 1) return base::Status::InvalidArgument("PostgresOptions.read_connections must be >= 1");
  if (options.reconnect_interval.count() < 0) {
    return base::Status::InvalidArgument("PostgresOptions.reconnect_interval must be >= 0");
  }
  std::unique_ptr<PostgresStore> store(new PostgresStore(uri, options));
  GAC_RETURN_IF_ERROR(store->Migrate());
  {
    // Not shared yet; the lock is taken for the analysis' sake. The staging
    // tables of the slow ingest path live as long as the connection.
    base::MutexLock lock(&store->write_mu_);
    store->write_ = std::make_unique<Session>(
        &store->uri_, &store->description_, options.reconnect_interval, &WriteStatements(),
        "CREATE TEMP TABLE IF NOT EXISTS stage_steps (LIKE steps) ON COMMIT DELETE ROWS; "
        "CREATE TEMP TABLE IF NOT EXISTS stage_layers (LIKE layers) ON COMMIT DELETE ROWS; "
        "CREATE TEMP TABLE IF NOT EXISTS stage_scalars (LIKE scalars) ON COMMIT DELETE ROWS");
    GAC_RETURN_IF_ERROR(store->write_->Ensure());
  }
  for (int i = 0; i < options.read_connections; ++i) {
    auto reader = std::make_unique<Reader>();
    base::MutexLock lock(&reader->mu);
    reader->session = std::make_unique<Session>(&store->uri_, &store->description_, options.reconnect_interval,
                                                &ReadStatements());
    GAC_RETURN_IF_ERROR(reader->session->Ensure());
    store->readers_.push_back(std::move(reader));
  }
  {
    base::MutexLock lock(&store->listen_mu_);
    static const std::vector<StatementDef> kNone;
    store->listen_ =
        std::make_unique<Session>(&store->uri_, &store->description_, options.reconnect_interval, &kNone);
  }
  return std::unique_ptr<Store>(std::move(store));
}

base::Status PostgresStore::Migrate() {
  static const std::vector<StatementDef> kNone;
  Session session(&uri_, &description_, std::chrono::milliseconds(0), &kNone);
  GAC_RETURN_IF_ERROR(session.Ensure());
  base::Status s = session.Command("BEGIN", "BEGIN");
  // Replicas that start together wait here for the first one's migration.
  if (s.ok()) {
    s = session.Exec("SELECT pg_advisory_xact_lock(" + std::to_string(kMigrationLockKey) + ")", PGRES_TUPLES_OK,
                     "taking the migration lock")
            .status();
  }
  std::int64_t version = 0;
  std::string schema;
  if (s.ok()) {
    base::StatusOr<Result> r = session.Exec("SELECT current_schema(), to_regclass('gac_schema') IS NOT NULL",
                                      PGRES_TUPLES_OK, "reading the schema version");
    if (!r.ok()) {
      s = r.status();
    } else if (PQgetisnull(r->get(), 0, 0)) {
      s = base::Status::FailedPrecondition(description_ +
                                     ": no schema to create the tables in (the search_path names none that exists)");
    } else {
      schema = PQgetvalue(r->get(), 0, 0);
      if (PQgetvalue(r->get(), 0, 1)[0] == 't') {
        base::StatusOr<Result> v = session.Exec("SELECT max(version) FROM gac_schema", PGRES_TUPLES_OK,
                                          "reading the schema version");
        if (!v.ok()) {
          s = v.status();
        } else if (!PQgetisnull(v->get(), 0, 0)) {
          version = std::strtoll(PQgetvalue(v->get(), 0, 0), nullptr, 10);
        }
      }
    }
  }
  if (s.ok() && version > kSchemaVersion) {
    s = base::Status::FailedPrecondition(description_ + ": schema version " + std::to_string(version) +
                                   " is newer than this build's " + std::to_string(kSchemaVersion));
  }
  if (s.ok() && version == 0) {
    s = session.Command("CREATE TABLE IF NOT EXISTS gac_schema (version integer NOT NULL)",
                        "creating the schema version table");
    if (s.ok()) s = session.Command("INSERT INTO gac_schema (version) VALUES (0)", "creating the schema version");
  }
  for (std::int64_t v = version; s.ok() && v < kSchemaVersion; ++v) {
    const std::string what = "migrating to schema version " + std::to_string(v + 1);
    s = session.Command(kMigrations[v], what.c_str());
  }
  if (s.ok() && version < kSchemaVersion) {
    s = session.Command("UPDATE gac_schema SET version = " + std::to_string(kSchemaVersion),
                        "writing the schema version");
  }
  // A record schema row the steps table lacks (a field added after the
  // database was made) becomes a column; replicas of an older build keep
  // working, their inserts leaving it NULL or its default.
  if (s.ok()) {
    base::StatusOr<Result> r = session.Exec(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND "
        "table_name = 'steps'",
        PGRES_TUPLES_OK, "reading the steps columns");
    if (!r.ok()) {
      s = r.status();
    } else {
      std::set<std::string> have;
      for (int i = 0; i < PQntuples(r->get()); ++i) have.insert(PQgetvalue(r->get(), i, 0));
      for (const proto::StepField& field : proto::kStepFields) {
        if (!s.ok() || have.count(field.column) != 0) continue;
        const std::string what = std::string("adding the steps column ") + field.column;
        s = session.Command("ALTER TABLE steps ADD COLUMN " + StepColumnDefinition(field, SqlDialect::kPostgres),
                            what.c_str());
      }
    }
  }
  if (s.ok()) s = session.Command("COMMIT", "COMMIT");
  if (!s.ok()) return s;
  channel_ = ChannelName(schema);
  return base::Status();
}

// ---------------------------------------------------------------------------
// Writes
// ---------------------------------------------------------------------------

base::Status PostgresStore::Begin(Session* session, const char* begin) {
  GAC_RETURN_IF_ERROR(session->Ensure());
  base::Status s = session->Command(begin, "BEGIN");
  if (s.ok() || session->connected()) return s;
  // The connection broke under BEGIN (it went away since the last check).
  session->Drop();
  GAC_RETURN_IF_ERROR(session->Ensure());
  return session->Command(begin, "BEGIN");
}

base::Status PostgresStore::Apply(std::vector<WriteOp>* ops) {
  base::MutexLock lock(&write_mu_);
  bool slow = false;
  base::Status s;
  for (int attempt = 0; attempt < kApplyAttempts; ++attempt) {
    s = ApplyOnce(ops, slow);
    if (s.ok()) return s;
    EndFailedTransaction(write_.get());
    const std::string& state = write_->last_sqlstate();
    if (state == "23505") {
      slow = true;  // another replica stored one of the keys meanwhile
    } else if (state != "40P01" && state != "40001") {
      break;
    }
  }
  return s;
}

base::Status PostgresStore::ApplyOnce(std::vector<WriteOp>* ops, bool slow) {
  for (WriteOp& op : *ops) {
    op.stored = 0;
    op.duplicates = 0;
    op.config_conflict = false;
    op.stored_config.Clear();
  }
  GAC_RETURN_IF_ERROR(Begin(write_.get(), "BEGIN"));
  base::Status s = WriteSteps(ops, slow);
  for (WriteOp& op : *ops) {
    if (s.ok() && op.config != nullptr) s = WriteConfig(&op);
  }
  if (s.ok()) s = write_->Command("COMMIT", "COMMIT");
  return s;
}

base::Status PostgresStore::ResolveRuns(const std::vector<std::string_view>& names,
                                  std::unordered_map<std::string_view, std::int64_t>* ids) {
  std::vector<std::string_view> missing = names;
  for (int round = 0; round < 3 && !missing.empty(); ++round) {
    pg::ArrayParam array(kTextOid);
    for (std::string_view name : missing) array.Text(name);
    if (round > 0) {
      GAC_ASSIGN_OR_RETURN(Result inserted, write_->Run("insert_runs", Params().Array(array), "creating runs"));
    }
    GAC_ASSIGN_OR_RETURN(Result found, write_->Run("find_runs", Params().Array(array), "looking up runs"));
    const PGresult* r = found.get();
    for (int row = 0; row < PQntuples(r); ++row) {
      auto it = std::find(missing.begin(), missing.end(), TextAt(r, row, 0));
      if (it != missing.end()) (*ids)[*it] = Int8At(r, row, 1);
    }
    missing.erase(std::remove_if(missing.begin(), missing.end(),
                                 [ids](std::string_view name) { return ids->count(name) != 0; }),
                  missing.end());
  }
  if (!missing.empty()) {
    // Created and deleted again by retention elsewhere, three times: give up
    // this time; the agent resends.
    return base::Status::Unavailable(description_ + ": run \"" + std::string(missing.front()) +
                               "\" was deleted while it was being written; retry");
  }
  return base::Status();
}

base::Status PostgresStore::WriteSteps(std::vector<WriteOp>* ops, bool slow) {
  std::vector<Candidate> candidates;
  RunDeltas deltas;
  CollectCandidates(ops, &candidates, &deltas);
  if (deltas.empty()) return base::Status();
  GAC_RETURN_IF_ERROR(AssignRunIds(&deltas, &candidates));
  // Keys stored before (the fast path): duplicates, not written.
  StepKeySet existing;
  if (!slow && !candidates.empty()) {
    GAC_ASSIGN_OR_RETURN(existing, FindStoredKeys(candidates));
  }
  EncodeRows(existing, slow, &candidates);
  if (steps_copy_.rows() > 0) {
    GAC_RETURN_IF_ERROR(CopyRows(slow));
    if (slow) GAC_RETURN_IF_ERROR(InsertStaged(&candidates));
  }
  CountResults(candidates, &deltas);
  return UpdateRunCounters(deltas);
}

void PostgresStore::CollectCandidates(std::vector<WriteOp>* ops, std::vector<Candidate>* candidates,
                                      RunDeltas* deltas) {
  struct KeyHash {
    std::size_t operator()(const std::tuple<std::string_view, std::uint32_t, std::int64_t>& k) const {
      return std::hash<std::string_view>()(std::get<0>(k)) ^
             (std::hash<std::int64_t>()(std::get<2>(k)) * 1000003u + std::get<1>(k));
    }
  };
  std::unordered_set<std::tuple<std::string_view, std::uint32_t, std::int64_t>, KeyHash> seen;
  for (WriteOp& op : *ops) {
    if (op.steps == nullptr) continue;
    for (const v1::StepRecord& r : op.steps->records()) {
      // Seen times move for duplicates too: a replay is a report of the run.
      RunDelta& d = (*deltas)[r.run()];
      d.first_seen = std::min(d.first_seen, op.received_ns);
      d.last_seen = std::max(d.last_seen, op.received_ns);
      if (!seen.emplace(r.run(), r.rank(), r.step()).second) {
        ++op.duplicates;
        continue;
      }
      candidates->push_back(Candidate{&r, &op});
    }
  }
}

base::Status PostgresStore::AssignRunIds(RunDeltas* deltas, std::vector<Candidate>* candidates) {
  std::vector<std::string_view> names;
  for (const auto& [name, delta] : *deltas) names.push_back(name);
  std::unordered_map<std::string_view, std::int64_t> ids;
  GAC_RETURN_IF_ERROR(ResolveRuns(names, &ids));
  for (auto& [name, delta] : *deltas) delta.run_id = ids.at(name);
  for (Candidate& c : *candidates) c.run_id = ids.at(c.record->run());
  return base::Status();
}

base::StatusOr<StepKeySet> PostgresStore::FindStoredKeys(const std::vector<Candidate>& candidates) {
  pg::ArrayParam run_ids(pg::kInt8Oid), steps(pg::kInt8Oid), ranks(pg::kInt8Oid);
  for (const Candidate& c : candidates) {
    run_ids.Int8(c.run_id);
    steps.Int8(c.record->step());
    ranks.Int8(c.record->rank());
  }
  base::StatusOr<Result> found = write_->Run("existing_keys", Params().Array(run_ids).Array(steps).Array(ranks),
                                             "looking up stored keys");
  if (!found.ok()) return found.status();
  return StepKeysOf(found->get());
}

void PostgresStore::EncodeRows(const StepKeySet& existing, bool slow, std::vector<Candidate>* candidates) {
  steps_copy_.Clear();
  layers_copy_.Clear();
  scalars_copy_.Clear();
  for (Candidate& c : *candidates) {
    const v1::StepRecord& r = *c.record;
    if (!slow && existing.count({c.run_id, r.step(), r.rank()}) != 0) continue;
    c.is_new = !slow;  // the slow path learns it from the INSERT
    steps_copy_.Row(static_cast<int>(proto::kStepFieldCount) + 2).Int8(c.run_id);
    for (const proto::StepField& field : proto::kStepFields) CopyField(field, r, &steps_copy_);
    steps_copy_.Int8(c.op->received_ns);
    std::int32_t idx = 0;
    for (const v1::LayerRecord& layer : r.layers()) {
      layers_copy_.Row(8)
          .Int8(c.run_id)
          .Int8(r.step())
          .Int8(r.rank())
          .Text(layer.name())
          .Int4(idx++)
          .OptFloat8(layer.has_cosine(), layer.cosine())
          .Float8(layer.grad_norm())
          .Float8(layer.ref_norm());
    }
    for (const auto& [name, value] : r.scalars()) {
      scalars_copy_.Row(5).Int8(c.run_id).Int8(r.step()).Int8(r.rank()).Text(name).Float8(value);
    }
  }
}

base::Status PostgresStore::CopyRows(bool slow) {
  const std::string steps_sql = std::string(slow ? "COPY stage_steps (" : "COPY steps (") + PgStepColumns() +
                                ") FROM STDIN (FORMAT binary)";
  GAC_RETURN_IF_ERROR(write_->Copy(steps_sql.c_str(), steps_copy_.Finish(), "writing step records"));
  if (layers_copy_.rows() > 0) {
    const char* sql = slow ? "COPY stage_layers (" GAC_PG_LAYER_COLUMNS ") FROM STDIN (FORMAT binary)"
                           : "COPY layers (" GAC_PG_LAYER_COLUMNS ") FROM STDIN (FORMAT binary)";
    GAC_RETURN_IF_ERROR(write_->Copy(sql, layers_copy_.Finish(), "writing layer records"));
  }
  if (scalars_copy_.rows() > 0) {
    const char* sql = slow ? "COPY stage_scalars (" GAC_PG_SCALAR_COLUMNS ") FROM STDIN (FORMAT binary)"
                           : "COPY scalars (" GAC_PG_SCALAR_COLUMNS ") FROM STDIN (FORMAT binary)";
    GAC_RETURN_IF_ERROR(write_->Copy(sql, scalars_copy_.Finish(), "writing scalars"));
  }
  return base::Status();
}

base::Status PostgresStore::InsertStaged(std::vector<Candidate>* candidates) {
  GAC_ASSIGN_OR_RETURN(Result inserted, write_->Run("insert_staged", Params(), "writing step records"));
  const StepKeySet stored = StepKeysOf(inserted.get());
  for (Candidate& c : *candidates) c.is_new = stored.count({c.run_id, c.record->step(), c.record->rank()}) != 0;
  return base::Status();
}

void PostgresStore::CountResults(const std::vector<Candidate>& candidates, RunDeltas* deltas) {
  for (const Candidate& c : candidates) {
    if (!c.is_new) {
      ++c.op->duplicates;
      continue;
    }
    ++c.op->stored;
    RunDelta& d = (*deltas)[c.record->run()];
    d.first_step = std::min<std::int64_t>(d.first_step, c.record->step());
    d.last_step = std::max<std::int64_t>(d.last_step, c.record->step());
    ++d.stored;
    d.world_size = std::max<std::int64_t>(d.world_size, std::max<std::uint32_t>(c.record->world_size(), 1));
  }
}

base::Status PostgresStore::UpdateRunCounters(const RunDeltas& deltas) {
  std::vector<const RunDelta*> ordered;
  for (const auto& [name, delta] : deltas) ordered.push_back(&delta);
  std::sort(ordered.begin(), ordered.end(), [](const RunDelta* a, const RunDelta* b) { return a->run_id < b->run_id; });
  pg::ArrayParam run_id(pg::kInt8Oid), first_step(pg::kInt8Oid), last_step(pg::kInt8Oid), stored(pg::kInt8Oid),
      world_size(pg::kInt8Oid), first_seen(pg::kInt8Oid), last_seen(pg::kInt8Oid);
  for (const RunDelta* d : ordered) {
    run_id.Int8(d->run_id);
    first_step.Int8(d->first_step);
    last_step.Int8(d->last_step);
    stored.Int8(d->stored);
    world_size.Int8(d->world_size);
    first_seen.Int8(d->first_seen);
    last_seen.Int8(d->last_seen);
  }
  if (ordered.size() > 1) {
    GAC_ASSIGN_OR_RETURN(Result locked, write_->Run("lock_runs", Params().Array(run_id), "locking runs"));
  }
  base::StatusOr<Result> updated = write_->Run(
      "update_runs",
      Params().Array(run_id).Array(first_step).Array(last_step).Array(stored).Array(world_size).Array(first_seen).Array(
          last_seen),
      "updating runs");
  return updated.status();
}

base::Status PostgresStore::WriteConfig(WriteOp* op) {
  const ConfigWrite& write = *op->config;
  const std::uint64_t before = write.change.before().version();
  std::string config = write.config.SerializeAsString();
  base::StatusOr<Result> written =
      before == 0
          ? write_->Run("config_first",
                        Params().Text(write.run).Int8(static_cast<std::int64_t>(write.config.version())).Bytea(config),
                        "writing run settings")
          : write_->Run("config_next",
                        Params()
                            .Text(write.run)
                            .Int8(static_cast<std::int64_t>(write.config.version()))
                            .Bytea(config)
                            .Int8(static_cast<std::int64_t>(before)),
                        "writing run settings");
  if (!written.ok()) return written.status();
  if (std::string_view(PQcmdTuples(written->get())) != "1") {
    // Another replica changed the run first: report what is stored.
    op->config_conflict = true;
    GAC_ASSIGN_OR_RETURN(Result stored, write_->Run("config_get", Params().Text(write.run), "reading run settings"));
    if (PQntuples(stored.get()) > 0) {
      const std::string_view bytes = TextAt(stored.get(), 0, 0);
      if (!op->stored_config.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return base::Status::DataLoss(description_ + ": unreadable settings of run \"" + write.run + "\"");
      }
    }
    return base::Status();
  }
  base::StatusOr<Result> audit = write_->Run(
      "insert_change", Params().Text(write.run).Int8(op->received_ns).Bytea(write.change.SerializeAsString()),
      "writing an audit record");
  if (!audit.ok()) return audit.status();
  // Every replica's listener gets the new settings when this commits.
  base::StatusOr<Result> notified =
      write_->Run("notify", Params().Text(channel_).Text(Hex(config) + ":" + write.run), "notifying replicas");
  return notified.status();
}

base::StatusOr<std::uint64_t> PostgresStore::DeleteIdleRuns(std::int64_t cutoff_ns) {
  base::MutexLock lock(&write_mu_);
  GAC_RETURN_IF_ERROR(Begin(write_.get(), "BEGIN"));
  base::StatusOr<Result> idle = write_->Run("idle_runs", Params().Int8(cutoff_ns), "listing idle runs");
  base::Status s = idle.status();
  std::uint64_t count = 0;
  if (s.ok()) {
    pg::ArrayParam ids(pg::kInt8Oid);
    for (int row = 0; row < PQntuples(idle->get()); ++row) ids.Int8(Int8At(idle->get(), row, 0));
    count = ids.size();
    if (count > 0) {
      for (const auto& [statement, what] : {std::pair{"delete_layers", "deleting layers"},
                                            std::pair{"delete_scalars", "deleting scalars"},
                                            std::pair{"delete_steps", "deleting steps"},
                                            std::pair{"delete_runs", "deleting runs"}}) {
        if (s.ok()) s = write_->Run(statement, Params().Array(ids), what).status();
      }
    }
  }
  if (s.ok()) s = write_->Command("COMMIT", "COMMIT");
  if (!s.ok()) {
    EndFailedTransaction(write_.get());
    return s;
  }
  return count;
}

// ---------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------

PostgresStore::Reader& PostgresStore::PickReader() {
  return *readers_[next_reader_.fetch_add(1, std::memory_order_relaxed) % readers_.size()];
}

base::Status PostgresStore::ReadDetails(Session* session, std::int64_t run_id, std::int64_t lo, std::int64_t hi,
                                  std::optional<std::uint32_t> rank, bool include_layers,
                                  std::vector<v1::StepRecord>* records) {
  if (records->empty()) return base::Status();
  std::map<std::pair<std::int64_t, std::uint32_t>, v1::StepRecord*> by_key;
  for (v1::StepRecord& r : *records) by_key[{r.step(), r.rank()}] = &r;
  const auto params = [&] {
    Params p;
    p.Int8(run_id).Int8(lo).Int8(hi);
    if (rank.has_value()) {
      p.Int8(*rank);
    } else {
      p.Null();
    }
    return p;
  };
  {
    GAC_ASSIGN_OR_RETURN(Result scalars, session->Run("scalars_range", params(), "reading scalars"));
    const PGresult* r = scalars.get();
    for (int row = 0; row < PQntuples(r); ++row) {
      auto it = by_key.find({Int8At(r, row, 0), static_cast<std::uint32_t>(Int8At(r, row, 1))});
      if (it == by_key.end()) continue;  // a record of the range outside the page
      (*it->second->mutable_scalars())[std::string(TextAt(r, row, 2))] = Float8At(r, row, 3);
    }
  }
  if (!include_layers) return base::Status();
  GAC_ASSIGN_OR_RETURN(Result layers, session->Run("layers_range", params(), "reading layers"));
  const PGresult* r = layers.get();
  for (int row = 0; row < PQntuples(r); ++row) {
    auto it = by_key.find({Int8At(r, row, 0), static_cast<std::uint32_t>(Int8At(r, row, 1))});
    if (it == by_key.end()) continue;
    v1::LayerRecord* layer = it->second->add_layers();
    layer->set_name(std::string(TextAt(r, row, 2)));
    if (!NullAt(r, row, 3)) layer->set_cosine(Float8At(r, row, 3));
    layer->set_grad_norm(Float8At(r, row, 4));
    layer->set_ref_norm(Float8At(r, row, 5));
  }
  return base::Status();
}

base::StatusOr<std::vector<v1::StepRecord>> PostgresStore::ReadSteps(
    const std::string& run, const char* statement, const std::function<Params(std::int64_t run_id)>& params,
    std::optional<std::uint32_t> rank, bool include_layers) {
  std::vector<v1::StepRecord> out;
  Reader& reader = PickReader();
  base::MutexLock lock(&reader.mu);
  Session* session = reader.session.get();
  // One snapshot for the records and their details.
  GAC_RETURN_IF_ERROR(Begin(session, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"));
  base::Status s;
  std::int64_t run_id = -1;
  {
    base::StatusOr<Result> found = session->Run("run_id", Params().Text(run), "looking up a run");
    if (!found.ok()) {
      s = found.status();
    } else if (PQntuples(found->get()) > 0) {
      run_id = Int8At(found->get(), 0, 0);
    }
  }
  if (s.ok() && run_id >= 0) {
    base::StatusOr<Result> rows = session->Run(statement, params(run_id), "reading step records");
    if (!rows.ok()) {
      s = rows.status();
    } else {
      const PGresult* r = rows->get();
      out.reserve(static_cast<std::size_t>(PQntuples(r)));
      for (int row = 0; row < PQntuples(r); ++row) {
        v1::StepRecord& record = out.emplace_back();
        record.set_run(run);
        ReadStep(r, row, &record);
      }
    }
  }
  if (s.ok() && !out.empty()) {
    std::int64_t lo = kInt64Max, hi = kInt64Min;
    for (const v1::StepRecord& r : out) {
      lo = std::min(lo, r.step());
      hi = std::max(hi, r.step());
    }
    s = ReadDetails(session, run_id, lo, hi, rank, include_layers, &out);
  }
  if (s.ok()) s = session->Command("COMMIT", "COMMIT");
  if (!s.ok()) {
    EndFailedTransaction(session);
    return s;
  }
  return out;
}

base::StatusOr<std::vector<v1::StepRecord>> PostgresStore::GetSteps(const StepQuery& query) {
  if (query.limit == 0 || query.start_step >= query.end_step) return std::vector<v1::StepRecord>();
  std::int64_t low = query.start_step;
  std::int64_t after_step = kInt64Min;
  std::int64_t after_rank = -1;
  if (query.after.has_value()) {
    after_step = query.after->first;
    after_rank = query.after->second;
    low = std::max(low, after_step);
  }
  const auto params = [&](std::int64_t run_id) {
    Params p;
    p.Int8(run_id).Int8(low).Int8(query.end_step).Int8(after_step).Int8(after_rank).Int8(query.limit);
    if (query.rank.has_value()) p.Int8(*query.rank);
    return p;
  };
  return ReadSteps(query.run, query.rank.has_value() ? "steps_rank" : "steps_all", params, query.rank,
                   query.include_layers);
}

base::StatusOr<std::vector<v1::StepRecord>> PostgresStore::GetRecentSteps(const std::string& run, std::uint32_t rank,
                                                                    std::uint32_t window) {
  const auto params = [&](std::int64_t run_id) {
    Params p;
    p.Int8(run_id).Int8(rank);
    if (window == 0) {
      p.Null();  // LIMIT NULL: all
    } else {
      p.Int8(window);
    }
    return p;
  };
  base::StatusOr<std::vector<v1::StepRecord>> out = ReadSteps(run, "recent", params, rank, /*include_layers=*/false);
  if (out.ok()) std::reverse(out->begin(), out->end());
  return out;
}

base::StatusOr<std::vector<v1::RunInfo>> PostgresStore::ListRuns(const std::string& after_run, std::uint32_t limit) {
  std::vector<v1::RunInfo> out;
  Reader& reader = PickReader();
  base::MutexLock lock(&reader.mu);
  GAC_RETURN_IF_ERROR(reader.session->Ensure());
  GAC_ASSIGN_OR_RETURN(Result rows, reader.session->Run("list_runs", Params().Text(after_run).Int8(limit), "listing runs"));
  for (int row = 0; row < PQntuples(rows.get()); ++row) ReadRunInfo(rows.get(), row, &out.emplace_back());
  return out;
}

base::StatusOr<v1::RunInfo> PostgresStore::GetRun(const std::string& run) {
  Reader& reader = PickReader();
  base::MutexLock lock(&reader.mu);
  GAC_RETURN_IF_ERROR(reader.session->Ensure());
  GAC_ASSIGN_OR_RETURN(Result rows, reader.session->Run("get_run", Params().Text(run), "reading a run"));
  if (PQntuples(rows.get()) == 0) return base::Status::NotFound("run \"" + run + "\" has no stored step");
  v1::RunInfo info;
  ReadRunInfo(rows.get(), 0, &info);
  return info;
}

base::StatusOr<std::vector<v1::ConfigChange>> PostgresStore::ListConfigChanges(const std::string& run,
                                                                         std::uint64_t offset,
                                                                         std::uint32_t limit) {
  std::vector<v1::ConfigChange> out;
  const std::int64_t sql_offset =
      offset > static_cast<std::uint64_t>(kInt64Max) ? kInt64Max : static_cast<std::int64_t>(offset);
  Reader& reader = PickReader();
  base::MutexLock lock(&reader.mu);
  GAC_RETURN_IF_ERROR(reader.session->Ensure());
  base::StatusOr<Result> rows =
      reader.session->Run("changes", Params().Text(run).Int8(limit).Int8(sql_offset), "listing audit records");
  if (!rows.ok()) return rows.status();
  for (int row = 0; row < PQntuples(rows->get()); ++row) {
    const std::string_view bytes = TextAt(rows->get(), row, 0);
    if (!out.emplace_back().ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return base::Status::DataLoss(description_ + ": unreadable audit record of run \"" + run + "\"");
    }
  }
  return out;
}

base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> PostgresStore::LoadRunConfigs() {
  std::vector<std::pair<std::string, v1::RunConfig>> out;
  Reader& reader = PickReader();
  base::MutexLock lock(&reader.mu);
  GAC_RETURN_IF_ERROR(reader.session->Ensure());
  GAC_ASSIGN_OR_RETURN(Result rows, reader.session->Run("configs", Params(), "loading run settings"));
  for (int row = 0; row < PQntuples(rows.get()); ++row) {
    std::pair<std::string, v1::RunConfig> entry;
    entry.first = std::string(TextAt(rows.get(), row, 0));
    const std::string_view bytes = TextAt(rows.get(), row, 1);
    if (!entry.second.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return base::Status::DataLoss(description_ + ": unreadable settings of run \"" + entry.first + "\"");
    }
    if (entry.second.version() >= 1) out.push_back(std::move(entry));
  }
  return out;
}

base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> PostgresStore::WaitForConfigChanges(
    std::chrono::milliseconds timeout) {
  std::vector<std::pair<std::string, v1::RunConfig>> out;
  base::MutexLock lock(&listen_mu_);
  Session* session = listen_.get();
  if (!session->connected()) listening_ = false;
  base::Status s = session->Ensure();
  if (!s.ok()) {
    listening_ = false;
    return s;
  }
  if (!listening_) {
    char* quoted = PQescapeIdentifier(session->conn(), channel_.data(), channel_.size());
    if (quoted == nullptr) return session->Error(nullptr, "quoting the channel name");
    const std::string listen = std::string("LISTEN ") + quoted;
    PQfreemem(quoted);
    s = session->Command(listen, "listening for settings changes");
    if (!s.ok()) {
      if (!session->connected()) session->Drop();
      return s;
    }
    listening_ = true;
  }
  const auto collect = [&] {
    while (PGnotify* n = PQnotifies(session->conn())) {
      const std::string_view payload(n->extra);
      const auto colon = payload.find(':');
      std::string bytes;
      v1::RunConfig config;
      if (colon != std::string_view::npos && Unhex(payload.substr(0, colon), &bytes) &&
          config.ParseFromString(bytes)) {
        out.emplace_back(std::string(payload.substr(colon + 1)), std::move(config));
      }
      PQfreemem(n);
    }
  };
  if (PQconsumeInput(session->conn()) == 0) {
    listening_ = false;
    base::Status error = session->Error(nullptr, "listening for settings changes");
    session->Drop();
    return error;
  }
  collect();
  if (!out.empty() || timeout.count() <= 0) return out;
  pollfd p{PQsocket(session->conn()), POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(std::min<std::int64_t>(timeout.count(), 60'000))) > 0) {
    if (PQconsumeInput(session->conn()) == 0 || PQstatus(session->conn()) != CONNECTION_OK) {
      listening_ = false;
      base::Status error = session->Error(nullptr, "listening for settings changes");
      session->Drop();
      return error;
    }
    collect();
  }
  return out;
}

}  // namespace

bool IsPostgresUri(const std::string& store) {
  return store.rfind("postgresql://", 0) == 0 || store.rfind("postgres://", 0) == 0;
}

std::string DescribePostgresUri(const std::string& uri) {
  PQconninfoOption* options = PQconninfoParse(uri.c_str(), nullptr);
  if (options == nullptr) return "postgresql://(unparsable URI)";
  std::string user, host, port, dbname;
  for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const std::string_view key(o->keyword);
    if (key == "user") user = o->val;
    if (key == "host" || (key == "hostaddr" && host.empty())) host = o->val;
    if (key == "port") port = o->val;
    if (key == "dbname") dbname = o->val;
  }
  PQconninfoFree(options);
  std::string out = "postgresql://";
  if (!user.empty()) out += user + "@";
  out += host;
  if (!port.empty()) out += ":" + port;
  out += "/" + dbname;
  return out;
}

base::StatusOr<std::unique_ptr<Store>> OpenPostgresStore(const std::string& uri, const PostgresOptions& options) {
  return PostgresStore::Open(uri, options);
}

int PostgresSchemaVersion() { return kSchemaVersion; }

#undef GAC_PG_LAYER_COLUMNS
#undef GAC_PG_SCALAR_COLUMNS
#undef GAC_PG_RUN_COLUMNS

}  // namespace gac::server
