// The history store of gacd: step records, per-layer rows, run metadata and
// per-run controller settings with their audit log.
//
// Three implementations: SQLite (the embedded default; WAL, one write
// connection and one read connection), PostgreSQL (several gacd replicas may
// share one database) and an in-memory fake for tests. All give the same
// answers; tests/server/store_test.cc runs the same conformance suite on each.
//
// Thread safety: every method may be called from any thread. Writes
// (Apply, DeleteIdleRuns) are serialised inside the store; reads run
// concurrently with writes and see only committed transactions. On
// PostgreSQL, writes of other processes sharing the database run concurrently
// too: keys stay unique across them (a replay stored by one is a duplicate
// for the others) and settings changes are compare-and-set on the version.

#ifndef GAC_SERVER_STORE_H_
#define GAC_SERVER_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gac/base/status.h"
#include "gac/v1/control.pb.h"
#include "gac/v1/query.pb.h"
#include "gac/v1/telemetry.pb.h"

namespace gac::server {

// A change of a run's settings, with the audit record that goes with it.
struct ConfigWrite {
  std::string run;
  v1::RunConfig config;   // the new settings (version already incremented)
  v1::ConfigChange change;  // before, after, reason
};

// One unit of a write transaction: either a batch of step records or a
// settings change. Apply fills the result fields.
struct WriteOp {
  const v1::IngestRequest* steps = nullptr;  // not owned
  const ConfigWrite* config = nullptr;       // not owned
  std::int64_t received_ns = 0;              // server receive time of the op
  // Results (steps only): step records newly stored / already present.
  std::uint32_t stored = 0;
  std::uint32_t duplicates = 0;
  // Results (settings only): true when the change was not written because
  // the run's stored version (0 when none is stored) is not
  // change.before().version(), i.e. another gacd sharing the store changed
  // the run first; `stored_config` then holds the stored settings (version 0
  // when none).
  bool config_conflict = false;
  v1::RunConfig stored_config{};
};

// Selects step records for GetSteps. Ordered by (step, rank).
struct StepQuery {
  std::string run;
  std::int64_t start_step = 0;           // inclusive
  std::int64_t end_step = INT64_MAX;     // exclusive
  std::optional<std::uint32_t> rank;     // nullopt = all ranks
  bool include_layers = false;
  // Resume strictly after this (step, rank) key; nullopt = from start_step.
  std::optional<std::pair<std::int64_t, std::uint32_t>> after;
  std::uint32_t limit = 1000;            // at most this many records
};

class Store {
 public:
  virtual ~Store() = default;

  // Writes every op in one transaction: all are durable when OK is returned,
  // none when an error is. Step records are keyed by (run, rank, step) and
  // layer rows by (run, rank, step, layer name): a record whose key is
  // already stored is counted as a duplicate and not rewritten (replays are
  // harmless). Updates each run's RunInfo (first/last step, counts, seen
  // times, world size). A settings op is written (with its audit record)
  // only when the run's stored version equals change.before().version();
  // otherwise it sets config_conflict and the other ops still commit.
  // REQUIRES: the records were validated (server/src/validate.h).
  virtual base::Status Apply(std::vector<WriteOp>* ops) = 0;

  // Every run that has stored settings (version >= 1), for start-up.
  virtual base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> LoadRunConfigs() = 0;

  // Runs ordered by id, strictly after `after_run` ("" = from the first), at
  // most `limit`. RunInfo.config is left empty (the caller fills it).
  virtual base::StatusOr<std::vector<v1::RunInfo>> ListRuns(const std::string& after_run,
                                                       std::uint32_t limit) = 0;
  // NotFound when the run has no stored step.
  virtual base::StatusOr<v1::RunInfo> GetRun(const std::string& run) = 0;

  // Records of the query in (step, rank) order. An unknown run gives an
  // empty result (the caller checks existence with GetRun).
  virtual base::StatusOr<std::vector<v1::StepRecord>> GetSteps(const StepQuery& query) = 0;

  // The last `window` records of `rank` (0 = all), in step order, without
  // layers. For summaries.
  virtual base::StatusOr<std::vector<v1::StepRecord>> GetRecentSteps(const std::string& run,
                                                               std::uint32_t rank,
                                                               std::uint32_t window) = 0;

  // Audit records of a run, oldest first, skipping the first `offset`, at
  // most `limit`.
  virtual base::StatusOr<std::vector<v1::ConfigChange>> ListConfigChanges(const std::string& run,
                                                                    std::uint64_t offset,
                                                                    std::uint32_t limit) = 0;

  // Retention: deletes every run (its steps, layers and scalars; not its
  // settings or audit log) whose last_seen_ns < cutoff_ns. Returns the
  // number of runs deleted.
  virtual base::StatusOr<std::uint64_t> DeleteIdleRuns(std::int64_t cutoff_ns) = 0;

  // Settings changes committed through any process sharing the store (this
  // one included), as (run, settings), for stores that several gacd share:
  // waits up to `timeout` for the next ones (an empty result when none came).
  // After an error (UNAVAILABLE: the database went away) changes may have
  // been missed: the caller reloads with LoadRunConfigs once a later call
  // succeeds, since that call listens again. Stores that only one process
  // uses return UNIMPLEMENTED at once. Called from one thread at a time.
  virtual base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> WaitForConfigChanges(
      std::chrono::milliseconds timeout) {
    (void)timeout;
    return base::Status::Unimplemented("this store is not shared between processes");
  }
};

struct SqliteOptions {
  // PRAGMA synchronous for the write connection: "FULL" fsyncs the WAL at
  // every commit (survives power loss); "NORMAL" survives a crash of gacd
  // (kill -9) but an OS crash may lose the last commits.
  std::string synchronous = "FULL";
  int busy_timeout_ms = 5000;
};

// Opens (creating if needed) the database at `path`, enables WAL, and brings
// the schema to the current version (migrating older versions; a newer
// version than this build knows is FailedPrecondition). A file that cannot be
// opened gets its errno's code (NotFound for a missing directory,
// PermissionDenied...); a file that is not a database, or is damaged, DataLoss.
base::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path,
                                                 const SqliteOptions& options = {});

// The current schema version written by OpenSqliteStore.
int SqliteSchemaVersion();

struct PostgresOptions {
  // Read connections (queries run on them in parallel; writes use one more
  // connection and settings changes are listened to on another).
  int read_connections = 2;
  // After a failed connection attempt, calls fail at once (UNAVAILABLE) for
  // this long before the next attempt, so that an unreachable database costs
  // each call nothing.
  std::chrono::milliseconds reconnect_interval{250};
};

// True when `store` names a PostgreSQL database: a postgresql:// or
// postgres:// URI (libpq's connection URI).
bool IsPostgresUri(const std::string& store);

// The URI without its password or other options, for logs and errors:
// "postgresql://user@host:port/dbname".
std::string DescribePostgresUri(const std::string& uri);

// Connects to the database of `uri` (libpq: the password may come from the
// URI, PGPASSWORD or a password file), and brings the schema to the current
// version under an advisory lock, so that replicas starting together migrate
// once (a newer version than this build knows is FailedPrecondition). Errors
// are one line naming the database without its password: an unreachable
// server is UNAVAILABLE, a refused password UNAUTHENTICATED, a missing
// database NOT_FOUND, a malformed URI INVALID_ARGUMENT.
base::StatusOr<std::unique_ptr<Store>> OpenPostgresStore(const std::string& uri,
                                                   const PostgresOptions& options = {});

// The current schema version written by OpenPostgresStore.
int PostgresSchemaVersion();

// An in-memory store with the same semantics, for tests.
std::unique_ptr<Store> NewMemoryStore();

}  // namespace gac::server

#endif  // GAC_SERVER_STORE_H_
