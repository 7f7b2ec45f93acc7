// The SQLite Store: one database file in WAL mode, one write connection and
// one read connection, each behind its own mutex. WAL lets readers see the
// last committed transaction while the writer holds its write transaction, so
// queries never wait for ingest (only for other queries).
//
// Schema (version 1; PRAGMA user_version holds the version):
//   runs            one row per run with stored steps; run_id is the key of
//                   the history tables; the RunInfo counters live here
//   steps           one row per (run_id, step, rank); ordered for GetSteps;
//                   its record columns are those of the record schema
//                   (gac/proto/record_schema.h), read and written by it;
//                   a schema row the table lacks is added as a column when
//                   the file is opened (AddStepColumns)
//   steps_by_rank   index (run_id, rank, step) for rank queries
//   layers          one row per (run_id, step, rank, name); idx keeps the
//                   agent's order of the layers within a step
//   scalars         one row per (run_id, step, rank, name)
//   run_config      serialized v1.RunConfig by run name
//   config_changes  serialized v1.ConfigChange by run name, in insert order
// Settings and audit records are keyed by run name, not run_id: retention
// (DeleteIdleRuns) removes runs and their history, never their settings.
//
// Floating-point columns are declared without a type (BLOB affinity) so that
// SQLite keeps the 8-byte IEEE value exactly as bound: a REAL column stores
// integral values as integers and loses the sign of -0.0.

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gac/base/mutex.h"
#include "gac/proto/record_schema.h"
#include "gac/server/store.h"
#include "server/src/store/step_columns.h"

namespace gac::server {
namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();

// The writer's name -> run_id cache is dropped when it grows past this many
// runs; a miss costs one indexed lookup.
constexpr std::size_t kMaxCachedRuns = 4096;

// (step, rank): a record's key within its run.
struct StepKey {
  std::int64_t step;
  std::int64_t rank;
  bool operator==(const StepKey& o) const { return step == o.step && rank == o.rank; }
};
struct StepKeyHash {
  std::size_t operator()(const StepKey& k) const {
    return std::hash<std::int64_t>()(k.step) * 31 + std::hash<std::int64_t>()(k.rank);
  }
};

// ---------------------------------------------------------------------------
// Schema and migrations
// ---------------------------------------------------------------------------

constexpr char kSchemaV1[] = R"sql(
CREATE TABLE runs (
  run_id        INTEGER PRIMARY KEY,
  name          TEXT NOT NULL UNIQUE,
  first_step    INTEGER NOT NULL,
  last_step     INTEGER NOT NULL,
  step_records  INTEGER NOT NULL,
  first_seen_ns INTEGER NOT NULL,
  last_seen_ns  INTEGER NOT NULL,
  world_size    INTEGER NOT NULL
);
CREATE TABLE steps (
  run_id       INTEGER NOT NULL,
  step         INTEGER NOT NULL,
  rank         INTEGER NOT NULL,
  world_size   INTEGER NOT NULL,
  cosine,
  grad_norm    NOT NULL,
  ref_norm     NOT NULL,
  regime       INTEGER NOT NULL,
  alpha        NOT NULL,
  cosine_after,
  staleness    INTEGER,
  wall_time_ns INTEGER NOT NULL,
  overhead_s   NOT NULL,
  mode         INTEGER NOT NULL,
  fallback     INTEGER NOT NULL,
  received_ns  INTEGER NOT NULL,
  PRIMARY KEY (run_id, step, rank)
) WITHOUT ROWID;
CREATE INDEX steps_by_rank ON steps (run_id, rank, step);
CREATE TABLE layers (
  run_id    INTEGER NOT NULL,
  step      INTEGER NOT NULL,
  rank      INTEGER NOT NULL,
  name      TEXT NOT NULL,
  idx       INTEGER NOT NULL,
  cosine,
  grad_norm NOT NULL,
  ref_norm  NOT NULL,
  PRIMARY KEY (run_id, step, rank, name)
) WITHOUT ROWID;
CREATE TABLE scalars (
  run_id INTEGER NOT NULL,
  step   INTEGER NOT NULL,
  rank   INTEGER NOT NULL,
  name   TEXT NOT NULL,
  value  NOT NULL,
  PRIMARY KEY (run_id, step, rank, name)
) WITHOUT ROWID;
CREATE TABLE run_config (
  run    TEXT PRIMARY KEY,
  config BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE config_changes (
  id      INTEGER PRIMARY KEY AUTOINCREMENT,
  run     TEXT NOT NULL,
  time_ns INTEGER NOT NULL,
  change  BLOB NOT NULL
);
CREATE INDEX config_changes_by_run ON config_changes (run, id);
)sql";

// Brings the schema from version i to i + 1 (kMigrations[i]). Runs inside the
// migration transaction; must not change user_version or journal mode. To
// change the schema, append a function and never edit an existing one.
using Migration = int (*)(sqlite3* db, char** errmsg);

int MigrateToV1(sqlite3* db, char** errmsg) {
  return sqlite3_exec(db, kSchemaV1, nullptr, nullptr, errmsg);
}

constexpr Migration kMigrations[] = {&MigrateToV1};
constexpr int kSchemaVersion = static_cast<int>(std::size(kMigrations));

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// Maps a SQLite result code: lock contention and failed I/O calls are
// retryable (UNAVAILABLE), a file that cannot be opened gets the code of its
// errno (a missing directory is NOT_FOUND), a full disk RESOURCE_EXHAUSTED,
// a read-only file PERMISSION_DENIED, and only a damaged file or one that is
// not a database DATA_LOSS; everything else is INTERNAL.
base::Status SqliteStatus(int rc, int system_errno, std::string message) {
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
      return base::Status::Unavailable(std::move(message));
    case SQLITE_CANTOPEN: {
      const base::StatusCode code = system_errno != 0 ? base::ErrnoToStatusCode(system_errno) : base::StatusCode::kUnavailable;
      return base::Status(code == base::StatusCode::kOk ? base::StatusCode::kUnavailable : code, std::move(message));
    }
    case SQLITE_FULL:
      return base::Status::ResourceExhausted(std::move(message));
    case SQLITE_READONLY:
    case SQLITE_PERM:
      return base::Status::PermissionDenied(std::move(message));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return base::Status::DataLoss(std::move(message));
    default:
      return base::Status::Internal(std::move(message));
  }
}

// "<path>: <what>: <SQLite's message>".
base::Status DbError(const std::string& path, sqlite3* db, int rc, const char* what) {
  std::string message = path + ": " + what + ": ";
  message += db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  return SqliteStatus(rc, db != nullptr ? sqlite3_system_errno(db) : 0, std::move(message));
}

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Db = std::unique_ptr<sqlite3, DbCloser>;

struct StmtFinalizer {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using Stmt = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

// Resets a statement when it goes out of scope, so that no statement keeps a
// read snapshot open (an open snapshot stops WAL checkpoints).
class ScopedReset {
 public:
  explicit ScopedReset(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~ScopedReset() { sqlite3_reset(stmt_); }
  ScopedReset(const ScopedReset&) = delete;
  ScopedReset& operator=(const ScopedReset&) = delete;

 private:
  sqlite3_stmt* const stmt_;
};

// Binds parameters 1, 2, ... in order and remembers the first failure.
// Text is bound SQLITE_STATIC: the buffer must outlive the statement's next
// reset.
class Binder {
 public:
  explicit Binder(sqlite3_stmt* stmt) : stmt_(stmt) {}

  Binder& Int(std::int64_t v) { return Check(sqlite3_bind_int64(stmt_, ++index_, v)); }
  Binder& Double(double v) { return Check(sqlite3_bind_double(stmt_, ++index_, v)); }
  Binder& Null() { return Check(sqlite3_bind_null(stmt_, ++index_)); }
  Binder& OptDouble(bool has, double v) { return has ? Double(v) : Null(); }
  Binder& OptInt(bool has, std::int64_t v) { return has ? Int(v) : Null(); }
  // A record field by its schema type; NULL when absent.
  Binder& Field(const proto::StepField& field, const v1::StepRecord& record) {
    const proto::FieldValue v = field.get(record);
    if (field.type == proto::FieldType::kReal) return OptDouble(v.present, v.real);
    return OptInt(v.present, v.integer);
  }
  Binder& Text(const std::string& s) {
    return Check(
        sqlite3_bind_text(stmt_, ++index_, s.data(), static_cast<int>(s.size()), SQLITE_STATIC));
  }
  Binder& Blob(const std::string& s) {
    return Check(
        sqlite3_bind_blob(stmt_, ++index_, s.data(), static_cast<int>(s.size()), SQLITE_STATIC));
  }
  int rc() const { return rc_; }

 private:
  Binder& Check(int rc) {
    if (rc_ == SQLITE_OK) rc_ = rc;
    return *this;
  }

  sqlite3_stmt* const stmt_;
  int index_ = 0;
  int rc_ = SQLITE_OK;
};

std::string ColumnText(sqlite3_stmt* stmt, int col) {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt, col));
  return text == nullptr ? std::string() : std::string(text, sqlite3_column_bytes(stmt, col));
}

template <typename Message>
bool ParseColumn(sqlite3_stmt* stmt, int col, Message* message) {
  const void* data = sqlite3_column_blob(stmt, col);
  int size = sqlite3_column_bytes(stmt, col);
  return message->ParseFromArray(data, size);
}

// The last column is RunInfo.steps_mode: the mode of the latest step record
// (the primary key's order, read backwards).
#define GAC_RUN_COLUMNS                                                                  \
  "name, first_step, last_step, step_records, first_seen_ns, last_seen_ns, world_size, " \
  "(SELECT mode FROM steps WHERE steps.run_id = runs.run_id ORDER BY step DESC, rank DESC LIMIT 1)"

// Fills `record` (but its run, scalars and layers) from a row whose columns
// are StepColumnList().
void ReadStep(sqlite3_stmt* s, v1::StepRecord* record) {
  for (std::size_t i = 0; i < proto::kStepFieldCount; ++i) {
    const proto::StepField& field = proto::kStepFields[i];
    const int col = static_cast<int>(i);
    proto::FieldValue v;
    v.present = sqlite3_column_type(s, col) != SQLITE_NULL;
    if (field.type == proto::FieldType::kReal) {
      v.real = sqlite3_column_double(s, col);
    } else {
      v.integer = sqlite3_column_int64(s, col);
    }
    if (v.present || field.optional) field.set(v, record);
  }
}

// Fills a RunInfo (but its config) from a row of GAC_RUN_COLUMNS.
void ReadRunInfo(sqlite3_stmt* s, v1::RunInfo* info) {
  info->set_run(ColumnText(s, 0));
  info->set_first_step(sqlite3_column_int64(s, 1));
  info->set_last_step(sqlite3_column_int64(s, 2));
  info->set_step_records(static_cast<std::uint64_t>(sqlite3_column_int64(s, 3)));
  info->set_first_seen_ns(sqlite3_column_int64(s, 4));
  info->set_last_seen_ns(sqlite3_column_int64(s, 5));
  info->set_world_size(static_cast<std::uint32_t>(sqlite3_column_int64(s, 6)));
  info->set_steps_mode(static_cast<v1::ControlMode>(sqlite3_column_int(s, 7)));
}

// Opens one connection. The store serialises each connection with its own
// mutex, so SQLite's per-connection mutex is not needed (NOMUTEX).
base::Status OpenConnection(const std::string& path, int flags, int busy_timeout_ms, Db* out) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  Db db(raw);
  if (rc != SQLITE_OK) return DbError(path, raw, rc, "cannot open database");
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, busy_timeout_ms);
  *out = std::move(db);
  return base::Status();
}

base::Status ExecSql(const std::string& path, sqlite3* db, const std::string& sql) {
  char* errmsg = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &errmsg);
  if (rc == SQLITE_OK) return base::Status();
  std::string message =
      path + ": " + sql + ": " + (errmsg != nullptr ? errmsg : sqlite3_errstr(rc));
  sqlite3_free(errmsg);
  return SqliteStatus(rc, sqlite3_system_errno(db), std::move(message));
}

// Runs a statement that returns one integer (PRAGMA user_version).
base::Status QueryInt(const std::string& path, sqlite3* db, const char* sql, std::int64_t* value) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v2(db, sql, -1, &raw, nullptr);
  Stmt stmt(raw);
  if (rc != SQLITE_OK) return DbError(path, db, rc, sql);
  rc = sqlite3_step(raw);
  if (rc != SQLITE_ROW) return DbError(path, db, rc, sql);
  *value = sqlite3_column_int64(raw, 0);
  return base::Status();
}

base::Status TooNew(const std::string& path, std::int64_t version) {
  return base::Status::FailedPrecondition(path + ": schema version " + std::to_string(version) +
                                    " is newer than this build's " +
                                    std::to_string(kSchemaVersion));
}

// Adds a `steps` column for each record schema row the table lacks (a field
// added after the file was made); inside the migration transaction.
base::Status AddStepColumns(const std::string& path, sqlite3* db) {
  std::set<std::string> have;
  {
    sqlite3_stmt* raw = nullptr;
    const char* sql = "SELECT name FROM pragma_table_info('steps')";
    int rc = sqlite3_prepare_v2(db, sql, -1, &raw, nullptr);
    Stmt stmt(raw);
    if (rc != SQLITE_OK) return DbError(path, db, rc, sql);
    while ((rc = sqlite3_step(raw)) == SQLITE_ROW) have.insert(ColumnText(raw, 0));
    if (rc != SQLITE_DONE) return DbError(path, db, rc, sql);
  }
  for (const proto::StepField& field : proto::kStepFields) {
    if (have.count(field.column) != 0) continue;
    GAC_RETURN_IF_ERROR(
        ExecSql(path, db, "ALTER TABLE steps ADD COLUMN " + StepColumnDefinition(field, SqlDialect::kSqlite)));
  }
  return base::Status();
}

// Brings the schema to kSchemaVersion in one IMMEDIATE transaction, so that
// two processes opening the same new file do not both create it.
base::Status Migrate(const std::string& path, sqlite3* db) {
  base::Status s = ExecSql(path, db, "BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  std::int64_t version = 0;
  s = QueryInt(path, db, "PRAGMA user_version", &version);
  if (s.ok() && version > kSchemaVersion) s = TooNew(path, version);
  for (std::int64_t v = version; s.ok() && v < kSchemaVersion; ++v) {
    char* errmsg = nullptr;
    int rc = kMigrations[v](db, &errmsg);
    if (rc != SQLITE_OK) {
      s = SqliteStatus(rc, sqlite3_system_errno(db), path + ": migration to schema version " + std::to_string(v + 1) + ": " +
                               (errmsg != nullptr ? errmsg : sqlite3_errstr(rc)));
    }
    sqlite3_free(errmsg);
  }
  if (s.ok() && version < kSchemaVersion) {
    s = ExecSql(path, db, "PRAGMA user_version = " + std::to_string(kSchemaVersion));
  }
  if (s.ok()) s = AddStepColumns(path, db);
  if (s.ok()) s = ExecSql(path, db, "COMMIT");
  if (!s.ok() && sqlite3_get_autocommit(db) == 0) (void)ExecSql(path, db, "ROLLBACK");
  return s;
}

// Returns the value of PRAGMA synchronous for `name` or "" when invalid.
std::string SynchronousMode(const std::string& name) {
  std::string upper;
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const char* mode : {"OFF", "NORMAL", "FULL", "EXTRA"}) {
    if (upper == mode) return upper;
  }
  return std::string();
}

// ---------------------------------------------------------------------------
// SqliteStore
// ---------------------------------------------------------------------------

class SqliteStore final : public Store {
 public:
  static base::StatusOr<std::unique_ptr<Store>> Open(const std::string& path,
                                               const SqliteOptions& options);

  base::Status Apply(std::vector<WriteOp>* ops) override;
  base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> LoadRunConfigs() override;
  base::StatusOr<std::vector<v1::RunInfo>> ListRuns(const std::string& after_run,
                                              std::uint32_t limit) override;
  base::StatusOr<v1::RunInfo> GetRun(const std::string& run) override;
  base::StatusOr<std::vector<v1::StepRecord>> GetSteps(const StepQuery& query) override;
  base::StatusOr<std::vector<v1::StepRecord>> GetRecentSteps(const std::string& run, std::uint32_t rank,
                                                       std::uint32_t window) override;
  base::StatusOr<std::vector<v1::ConfigChange>> ListConfigChanges(const std::string& run,
                                                            std::uint64_t offset,
                                                            std::uint32_t limit) override;
  base::StatusOr<std::uint64_t> DeleteIdleRuns(std::int64_t cutoff_ns) override;

 private:
  // The RunInfo changes of one run within one WriteOp, written once per op.
  struct RunDelta {
    const std::string* name;  // the records' run field; valid during the op
    std::int64_t run_id;
    std::int64_t first_step = kInt64Max;
    std::int64_t last_step = kInt64Min;
    std::int64_t stored = 0;
    std::int64_t world_size = 0;
  };

  explicit SqliteStore(std::string path) : path_(std::move(path)) {}

  // A statement to prepare on a connection, and where it goes.
  struct Statement {
    sqlite3* db;
    Stmt* stmt;
    std::string sql;
  };

  base::Status Prepare(sqlite3* db, const char* sql, Stmt* out);
  base::Status PrepareEach(const std::vector<Statement>& statements);
  base::Status PrepareAll() GAC_REQUIRES(write_mu_, read_mu_);
  base::Status PrepareWriter() GAC_REQUIRES(write_mu_);  // w_
  base::Status PrepareReader() GAC_REQUIRES(read_mu_);   // r_

  // Runs a statement that returns no row, then resets it. The bind result
  // `bind_rc` is checked first.
  base::Status StepOnce(sqlite3* db, sqlite3_stmt* stmt, int bind_rc, const char* what);
  base::Status StepError(sqlite3* db, int rc, const char* what) const {
    return DbError(path_, db, rc, what);
  }

  // Ends the write transaction: COMMIT when `s` is OK, else ROLLBACK. On any
  // failure the run-id cache is dropped, since it may name rolled-back rows.
  // REQUIRES: a transaction open.
  base::Status FinishWrite(base::Status s) GAC_REQUIRES(write_mu_);
  // REQUIRES: a transaction open.
  base::Status ApplySteps(WriteOp* op) GAC_REQUIRES(write_mu_);
  // Points *current at the deltas_ entry of `run` (a record's run field),
  // adding one, with the run resolved, at the run's first record in the op.
  base::Status FindRunDelta(const std::string& run, std::size_t* current) GAC_REQUIRES(write_mu_);
  // INSERT OR IGNORE of a step row; *inserted false when its key was stored.
  base::Status InsertStep(const v1::StepRecord& r, std::int64_t run_id, std::int64_t received_ns, bool* inserted)
      GAC_REQUIRES(write_mu_);
  // The layer and scalar rows of a newly stored step.
  base::Status InsertDetails(const v1::StepRecord& r, std::int64_t run_id) GAC_REQUIRES(write_mu_);
  // Writes each run's deltas_, its seen times moved to `received_ns`.
  base::Status UpdateRuns(std::int64_t received_ns) GAC_REQUIRES(write_mu_);
  base::Status ApplyConfig(WriteOp* op) GAC_REQUIRES(write_mu_);
  base::Status ResolveRun(const std::string& name, std::int64_t* run_id) GAC_REQUIRES(write_mu_);

  // Sets *run_id to -1 for a run with no stored step.
  base::Status FindRunForRead(const std::string& run, std::int64_t* run_id) GAC_REQUIRES(read_mu_);
  // Reads the scalars (and layers when asked) of `records`, whose steps and
  // ranks are set and all of `rank` when it is given, in two queries (one
  // without layers) whatever the number of records.
  base::Status ReadDetails(std::int64_t run_id, std::optional<std::uint32_t> rank, bool include_layers,
                     std::vector<v1::StepRecord>* records) GAC_REQUIRES(read_mu_);
  // Reads the step rows of a prepared statement whose binding returned
  // bind_rc (an error there is reported, as in StepOnce), then their details.
  base::Status ReadSteps(sqlite3_stmt* stmt, int bind_rc, std::int64_t run_id, const std::string& run,
                   std::optional<std::uint32_t> rank, bool include_layers, std::uint32_t reserve, std::vector<v1::StepRecord>* out)
      GAC_REQUIRES(read_mu_);

  const std::string path_;

  // Declared before the statements: destroyed after them.
  base::Mutex write_mu_;
  Db write_db_ GAC_GUARDED_BY(write_mu_);
  struct {
    Stmt begin, commit, rollback;
    Stmt find_run, insert_run, update_run;
    Stmt insert_step, insert_layer, insert_scalar;
    Stmt find_config, upsert_config, insert_change;
    Stmt idle_runs, delete_steps, delete_layers, delete_scalars, delete_run;
  } w_ GAC_GUARDED_BY(write_mu_);
  // name -> run_id of committed runs rows.
  std::unordered_map<std::string, std::int64_t> run_ids_ GAC_GUARDED_BY(write_mu_);
  std::vector<RunDelta> deltas_ GAC_GUARDED_BY(write_mu_);  // scratch of ApplySteps

  base::Mutex read_mu_;
  Db read_db_ GAC_GUARDED_BY(read_mu_);
  struct {
    Stmt begin, commit;
    Stmt run_id, get_run, list_runs;
    Stmt steps_all, steps_rank, recent, layers_all, layers_rank, scalars_all, scalars_rank;
    Stmt changes, configs;
  } r_ GAC_GUARDED_BY(read_mu_);
};

base::StatusOr<std::unique_ptr<Store>> SqliteStore::Open(const std::string& path,
                                                   const SqliteOptions& options) {
  const std::string synchronous = SynchronousMode(options.synchronous);
  if (synchronous.empty()) {
    return base::Status::InvalidArgument(
        "SqliteOptions.synchronous must be OFF, NORMAL, FULL or EXTRA, not \"" +
        options.synchronous + "\"");
  }
  if (options.busy_timeout_ms < 0) {
    return base::Status::InvalidArgument("SqliteOptions.busy_timeout_ms must be >= 0");
  }
  if (sqlite3_threadsafe() == 0) {
    return base::Status::FailedPrecondition(
        "SQLite was built without thread support (SQLITE_THREADSAFE=0)");
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(path));
  // Not shared yet; the locks are taken for the analysis' sake.
  base::MutexLock write_lock(&store->write_mu_);
  base::MutexLock read_lock(&store->read_mu_);
  base::Status s = OpenConnection(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                            options.busy_timeout_ms, &store->write_db_);
  if (!s.ok()) return s;
  sqlite3* db = store->write_db_.get();

  // The first read of the file: it fails for a file that is not a database.
  // A newer schema is refused before anything is changed in the file.
  std::int64_t version = 0;
  s = QueryInt(path, db, "PRAGMA user_version", &version);
  if (!s.ok()) return s;
  if (version > kSchemaVersion) return TooNew(path, version);

  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &raw, nullptr);
  Stmt journal(raw);
  if (rc == SQLITE_OK) rc = sqlite3_step(raw);
  if (rc != SQLITE_ROW) return DbError(path, db, rc, "PRAGMA journal_mode = WAL");
  if (ColumnText(raw, 0) != "wal") {
    return base::Status::FailedPrecondition(path + ": cannot enable WAL (journal mode is " +
                                      ColumnText(raw, 0) + ")");
  }
  journal.reset();

  // A 32 MiB page cache for the writer; the WAL is truncated back to 64 MiB
  // after checkpoints so that a burst does not leave a huge file behind.
  s = ExecSql(path, db,
              "PRAGMA synchronous = " + synchronous +
                  "; PRAGMA cache_size = -32768; "
                  "PRAGMA journal_size_limit = 67108864; PRAGMA temp_store = MEMORY");
  if (!s.ok()) return s;
  s = Migrate(path, db);
  if (!s.ok()) return s;

  // Opened after the migration, so that it sees the schema and WAL mode.
  s = OpenConnection(path, SQLITE_OPEN_READONLY, options.busy_timeout_ms, &store->read_db_);
  if (!s.ok()) return s;
  s = ExecSql(path, store->read_db_.get(),
              "PRAGMA cache_size = -16384; PRAGMA temp_store = MEMORY");
  if (!s.ok()) return s;
  s = store->PrepareAll();
  if (!s.ok()) return s;
  return std::unique_ptr<Store>(std::move(store));
}

base::Status SqliteStore::Prepare(sqlite3* db, const char* sql, Stmt* out) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
  out->reset(raw);
  if (rc != SQLITE_OK) return DbError(path_, db, rc, sql);
  return base::Status();
}

base::Status SqliteStore::PrepareAll() {
  GAC_RETURN_IF_ERROR(PrepareWriter());
  return PrepareReader();
}

base::Status SqliteStore::PrepareEach(const std::vector<Statement>& statements) {
  for (const Statement& statement : statements) {
    base::Status s = Prepare(statement.db, statement.sql.c_str(), statement.stmt);
    if (!s.ok()) return s;
  }
  return base::Status();
}

base::Status SqliteStore::PrepareWriter() {
  sqlite3* w = write_db_.get();
  const std::string columns = StepColumnList();
  return PrepareEach({
      {w, &w_.begin, "BEGIN IMMEDIATE"},
      {w, &w_.commit, "COMMIT"},
      {w, &w_.rollback, "ROLLBACK"},
      {w, &w_.find_run, "SELECT run_id FROM runs WHERE name = ?1"},
      // Sentinels that the first update_run of the op replaces.
      {w, &w_.insert_run,
       "INSERT INTO runs (name, first_step, last_step, step_records, first_seen_ns, "
       "last_seen_ns, world_size) VALUES (?1, 9223372036854775807, -9223372036854775808, 0, "
       "9223372036854775807, -9223372036854775808, 0)"},
      {w, &w_.update_run,
       "UPDATE runs SET first_step = MIN(first_step, ?2), last_step = MAX(last_step, ?3), "
       "step_records = step_records + ?4, world_size = MAX(world_size, ?5), "
       "first_seen_ns = MIN(first_seen_ns, ?6), last_seen_ns = MAX(last_seen_ns, ?6) "
       "WHERE run_id = ?1"},
      {w, &w_.insert_step,
       "INSERT OR IGNORE INTO steps (run_id, " + columns + ", received_ns) VALUES (?1, " +
           StepPlaceholders('?', 2) + ", ?" + std::to_string(2 + proto::kStepFieldCount) + ")"},
      {w, &w_.insert_layer,
       "INSERT OR IGNORE INTO layers (run_id, step, rank, name, idx, cosine, grad_norm, "
       "ref_norm) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"},
      {w, &w_.insert_scalar,
       "INSERT OR IGNORE INTO scalars (run_id, step, rank, name, value) VALUES (?, ?, ?, ?, ?)"},
      {w, &w_.find_config, "SELECT config FROM run_config WHERE run = ?1"},
      {w, &w_.upsert_config,
       "INSERT INTO run_config (run, config) VALUES (?1, ?2) "
       "ON CONFLICT (run) DO UPDATE SET config = excluded.config"},
      {w, &w_.insert_change,
       "INSERT INTO config_changes (run, time_ns, change) VALUES (?1, ?2, ?3)"},
      {w, &w_.idle_runs, "SELECT run_id FROM runs WHERE last_seen_ns < ?1"},
      {w, &w_.delete_steps, "DELETE FROM steps WHERE run_id = ?1"},
      {w, &w_.delete_layers, "DELETE FROM layers WHERE run_id = ?1"},
      {w, &w_.delete_scalars, "DELETE FROM scalars WHERE run_id = ?1"},
      {w, &w_.delete_run, "DELETE FROM runs WHERE run_id = ?1"},
  });
}

base::Status SqliteStore::PrepareReader() {
  sqlite3* r = read_db_.get();
  const std::string columns = StepColumnList();
  return PrepareEach({
      {r, &r_.begin, "BEGIN"},
      {r, &r_.commit, "COMMIT"},
      {r, &r_.run_id, "SELECT run_id FROM runs WHERE name = ?1 AND step_records > 0"},
      {r, &r_.get_run, "SELECT " GAC_RUN_COLUMNS " FROM runs WHERE name = ?1 AND step_records > 0"},
      {r, &r_.list_runs,
       "SELECT " GAC_RUN_COLUMNS " FROM runs WHERE name > ?1 AND step_records > 0 "
       "ORDER BY name LIMIT ?2"},
      // The step range comes first so that a resumed page seeks to `after`;
      // (?4, ?5) is the `after` key, (INT64_MIN, -1) when there is none.
      {r, &r_.steps_all,
       "SELECT " + columns + " FROM steps WHERE run_id = ?1 AND step >= ?2 AND step < ?3 "
       "AND (step > ?4 OR rank > ?5) ORDER BY step, rank LIMIT ?6"},
      {r, &r_.steps_rank,
       "SELECT " + columns + " FROM steps INDEXED BY steps_by_rank WHERE run_id = ?1 "
       "AND rank = ?7 AND step >= ?2 AND step < ?3 AND (step > ?4 OR rank > ?5) "
       "ORDER BY step LIMIT ?6"},
      {r, &r_.recent,
       "SELECT " + columns + " FROM steps INDEXED BY steps_by_rank WHERE run_id = ?1 "
       "AND rank = ?2 ORDER BY step DESC LIMIT ?3"},
      // The details of a page's records: its step range [?2, ?3], every rank
      // or rank ?4. The caller drops rows of keys not on the page.
      {r, &r_.layers_all,
       "SELECT step, rank, name, cosine, grad_norm, ref_norm, idx FROM layers WHERE run_id = ?1 "
       "AND step >= ?2 AND step <= ?3 ORDER BY step, rank"},
      {r, &r_.layers_rank,
       "SELECT step, rank, name, cosine, grad_norm, ref_norm, idx FROM layers WHERE run_id = ?1 "
       "AND step >= ?2 AND step <= ?3 AND rank = ?4 ORDER BY step, rank"},
      {r, &r_.scalars_all,
       "SELECT step, rank, name, value FROM scalars WHERE run_id = ?1 AND step >= ?2 AND step <= ?3"},
      {r, &r_.scalars_rank,
       "SELECT step, rank, name, value FROM scalars WHERE run_id = ?1 AND step >= ?2 AND step <= ?3 "
       "AND rank = ?4"},
      {r, &r_.changes,
       "SELECT change FROM config_changes WHERE run = ?1 ORDER BY id LIMIT ?2 OFFSET ?3"},
      {r, &r_.configs, "SELECT run, config FROM run_config ORDER BY run"},
  });
}

base::Status SqliteStore::StepOnce(sqlite3* db, sqlite3_stmt* stmt, int bind_rc, const char* what) {
  base::Status s;
  if (bind_rc != SQLITE_OK) {
    s = StepError(db, bind_rc, what);
  } else {
    int rc = sqlite3_step(stmt);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) s = StepError(db, rc, what);
  }
  sqlite3_reset(stmt);
  return s;
}

// ---------------------------------------------------------------------------
// Writes
// ---------------------------------------------------------------------------

base::Status SqliteStore::FinishWrite(base::Status s) {
  sqlite3* db = write_db_.get();
  if (s.ok()) s = StepOnce(db, w_.commit.get(), SQLITE_OK, "COMMIT");
  if (!s.ok()) {
    // A failed COMMIT may leave the transaction open (BUSY) or may have
    // rolled it back already (I/O errors).
    if (sqlite3_get_autocommit(db) == 0) {
      (void)StepOnce(db, w_.rollback.get(), SQLITE_OK, "ROLLBACK");
    }
    run_ids_.clear();
  }
  return s;
}

base::Status SqliteStore::Apply(std::vector<WriteOp>* ops) {
  base::MutexLock lock(&write_mu_);
  base::Status s = StepOnce(write_db_.get(), w_.begin.get(), SQLITE_OK, "BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  for (WriteOp& op : *ops) {
    op.stored = 0;
    op.duplicates = 0;
    op.config_conflict = false;
    op.stored_config.Clear();
    if (op.steps != nullptr) s = ApplySteps(&op);
    if (s.ok() && op.config != nullptr) s = ApplyConfig(&op);
    if (!s.ok()) break;
  }
  return FinishWrite(std::move(s));
}

base::Status SqliteStore::ResolveRun(const std::string& name, std::int64_t* run_id) {
  auto it = run_ids_.find(name);
  if (it != run_ids_.end()) {
    *run_id = it->second;
    return base::Status();
  }
  sqlite3* db = write_db_.get();
  sqlite3_stmt* find = w_.find_run.get();
  {
    ScopedReset reset(find);
    int rc = Binder(find).Text(name).rc();
    if (rc == SQLITE_OK) rc = sqlite3_step(find);
    if (rc == SQLITE_ROW) {
      *run_id = sqlite3_column_int64(find, 0);
    } else if (rc == SQLITE_DONE) {
      *run_id = -1;
    } else {
      return StepError(db, rc, "looking up a run");
    }
  }
  if (*run_id < 0) {
    sqlite3_stmt* insert = w_.insert_run.get();
    base::Status s = StepOnce(db, insert, Binder(insert).Text(name).rc(), "inserting a run");
    if (!s.ok()) return s;
    *run_id = sqlite3_last_insert_rowid(db);
  }
  if (run_ids_.size() >= kMaxCachedRuns) run_ids_.clear();
  run_ids_.emplace(name, *run_id);
  return base::Status();
}

base::Status SqliteStore::ApplySteps(WriteOp* op) {
  deltas_.clear();
  std::size_t current = 0;  // index into deltas_ of the last record's run
  for (const v1::StepRecord& r : op->steps->records()) {
    GAC_RETURN_IF_ERROR(FindRunDelta(r.run(), &current));
    RunDelta& delta = deltas_[current];
    bool inserted = false;
    GAC_RETURN_IF_ERROR(InsertStep(r, delta.run_id, op->received_ns, &inserted));
    if (!inserted) {
      // Stored before, with its layers and scalars: nothing is rewritten.
      ++op->duplicates;
      continue;
    }
    ++op->stored;
    ++delta.stored;
    delta.first_step = std::min<std::int64_t>(delta.first_step, r.step());
    delta.last_step = std::max<std::int64_t>(delta.last_step, r.step());
    delta.world_size =
        std::max<std::int64_t>(delta.world_size, std::max<std::uint32_t>(r.world_size(), 1));
    GAC_RETURN_IF_ERROR(InsertDetails(r, delta.run_id));
  }
  return UpdateRuns(op->received_ns);
}

base::Status SqliteStore::FindRunDelta(const std::string& run, std::size_t* current) {
  if (!deltas_.empty() && *deltas_[*current].name == run) return base::Status();
  *current = 0;
  while (*current < deltas_.size() && *deltas_[*current].name != run) ++*current;
  if (*current == deltas_.size()) {
    std::int64_t run_id = 0;
    base::Status s = ResolveRun(run, &run_id);
    if (!s.ok()) return s;
    deltas_.push_back(RunDelta{&run, run_id});
  }
  return base::Status();
}

base::Status SqliteStore::InsertStep(const v1::StepRecord& r, std::int64_t run_id, std::int64_t received_ns,
                                     bool* inserted) {
  sqlite3* db = write_db_.get();
  sqlite3_stmt* insert_step = w_.insert_step.get();
  Binder step_binder(insert_step);
  step_binder.Int(run_id);
  for (const proto::StepField& field : proto::kStepFields) step_binder.Field(field, r);
  const int bind_rc = step_binder.Int(received_ns).rc();
  base::Status s = StepOnce(db, insert_step, bind_rc, "inserting a step record");
  if (!s.ok()) return s;
  *inserted = sqlite3_changes(db) != 0;
  return base::Status();
}

base::Status SqliteStore::InsertDetails(const v1::StepRecord& r, std::int64_t run_id) {
  sqlite3* db = write_db_.get();
  sqlite3_stmt* insert_layer = w_.insert_layer.get();
  sqlite3_stmt* insert_scalar = w_.insert_scalar.get();
  std::int64_t idx = 0;
  for (const v1::LayerRecord& layer : r.layers()) {
    const int bind_rc = Binder(insert_layer)
                            .Int(run_id)
                            .Int(r.step())
                            .Int(r.rank())
                            .Text(layer.name())
                            .Int(idx++)
                            .OptDouble(layer.has_cosine(), layer.cosine())
                            .Double(layer.grad_norm())
                            .Double(layer.ref_norm())
                            .rc();
    base::Status s = StepOnce(db, insert_layer, bind_rc, "inserting a layer record");
    if (!s.ok()) return s;
  }
  for (const auto& [name, value] : r.scalars()) {
    const int bind_rc = Binder(insert_scalar)
                            .Int(run_id)
                            .Int(r.step())
                            .Int(r.rank())
                            .Text(name)
                            .Double(value)
                            .rc();
    base::Status s = StepOnce(db, insert_scalar, bind_rc, "inserting a scalar");
    if (!s.ok()) return s;
  }
  return base::Status();
}

base::Status SqliteStore::UpdateRuns(std::int64_t received_ns) {
  // Seen times move for duplicates too: a replay is a report of the run.
  sqlite3* db = write_db_.get();
  sqlite3_stmt* update = w_.update_run.get();
  for (const RunDelta& delta : deltas_) {
    int bind_rc = Binder(update)
                      .Int(delta.run_id)
                      .Int(delta.first_step)
                      .Int(delta.last_step)
                      .Int(delta.stored)
                      .Int(delta.world_size)
                      .Int(received_ns)
                      .rc();
    base::Status s = StepOnce(db, update, bind_rc, "updating a run");
    if (!s.ok()) return s;
  }
  return base::Status();
}

base::Status SqliteStore::ApplyConfig(WriteOp* op_ptr) {
  WriteOp& op = *op_ptr;
  sqlite3* db = write_db_.get();
  const ConfigWrite& write = *op.config;
  {
    // Compare-and-set on the version (store.h): inside the write transaction,
    // so the read and the write see the same state.
    sqlite3_stmt* find = w_.find_config.get();
    ScopedReset reset(find);
    int rc = Binder(find).Text(write.run).rc();
    if (rc == SQLITE_OK) rc = sqlite3_step(find);
    v1::RunConfig stored;
    if (rc == SQLITE_ROW) {
      if (!ParseColumn(find, 0, &stored)) {
        return base::Status::DataLoss(path_ + ": unreadable settings of run \"" + write.run + "\"");
      }
    } else if (rc != SQLITE_DONE) {
      return StepError(db, rc, "reading run settings");
    }
    if (stored.version() != write.change.before().version()) {
      op.config_conflict = true;
      op.stored_config = std::move(stored);
      return base::Status();
    }
  }
  const std::string config = write.config.SerializeAsString();
  const std::string change = write.change.SerializeAsString();
  sqlite3_stmt* upsert = w_.upsert_config.get();
  base::Status s = StepOnce(db, upsert, Binder(upsert).Text(write.run).Blob(config).rc(),
                      "writing run settings");
  if (!s.ok()) return s;
  sqlite3_stmt* insert = w_.insert_change.get();
  return StepOnce(db, insert, Binder(insert).Text(write.run).Int(op.received_ns).Blob(change).rc(),
                  "writing an audit record");
}

base::StatusOr<std::uint64_t> SqliteStore::DeleteIdleRuns(std::int64_t cutoff_ns) {
  base::MutexLock lock(&write_mu_);
  sqlite3* db = write_db_.get();
  base::Status s = StepOnce(db, w_.begin.get(), SQLITE_OK, "BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  std::vector<std::int64_t> ids;
  {
    sqlite3_stmt* idle = w_.idle_runs.get();
    ScopedReset reset(idle);
    int rc = Binder(idle).Int(cutoff_ns).rc();
    while (rc == SQLITE_OK && (rc = sqlite3_step(idle)) == SQLITE_ROW) {
      ids.push_back(sqlite3_column_int64(idle, 0));
      rc = SQLITE_OK;
    }
    if (rc != SQLITE_DONE) s = StepError(db, rc, "listing idle runs");
  }
  for (std::int64_t id : ids) {
    for (const auto& [stmt, what] : {std::pair{w_.delete_layers.get(), "deleting layers"},
                                     std::pair{w_.delete_scalars.get(), "deleting scalars"},
                                     std::pair{w_.delete_steps.get(), "deleting steps"},
                                     std::pair{w_.delete_run.get(), "deleting a run"}}) {
      if (s.ok()) s = StepOnce(db, stmt, Binder(stmt).Int(id).rc(), what);
    }
  }
  s = FinishWrite(std::move(s));
  if (!s.ok()) return s;
  // Deleted run ids may be reused by new runs.
  if (!ids.empty()) run_ids_.clear();
  return static_cast<std::uint64_t>(ids.size());
}

// ---------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------

// A read transaction on the read connection: the statements inside it see one
// snapshot. Ends (COMMIT; nothing to write) when it goes out of scope.
class ReadTransaction {
 public:
  // Runs `begin` now and, if that succeeded (rc() == SQLITE_DONE), `commit`
  // at the end of the scope.
  ReadTransaction(sqlite3_stmt* begin, sqlite3_stmt* commit) : commit_(commit), rc_(sqlite3_step(begin)) {
    sqlite3_reset(begin);
  }
  ~ReadTransaction() {
    if (rc_ != SQLITE_DONE) return;
    sqlite3_step(commit_);
    sqlite3_reset(commit_);
  }
  ReadTransaction(const ReadTransaction&) = delete;
  ReadTransaction& operator=(const ReadTransaction&) = delete;
  int rc() const { return rc_; }

 private:
  sqlite3_stmt* const commit_;
  const int rc_;
};

base::Status SqliteStore::FindRunForRead(const std::string& run, std::int64_t* run_id) {
  sqlite3_stmt* stmt = r_.run_id.get();
  ScopedReset reset(stmt);
  int rc = Binder(stmt).Text(run).rc();
  if (rc == SQLITE_OK) rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) {
    *run_id = sqlite3_column_int64(stmt, 0);
    return base::Status();
  }
  if (rc == SQLITE_DONE) {
    *run_id = -1;
    return base::Status();
  }
  return StepError(read_db_.get(), rc, "looking up a run");
}

base::Status SqliteStore::ReadDetails(std::int64_t run_id, std::optional<std::uint32_t> rank, bool include_layers,
                                std::vector<v1::StepRecord>* records) {
  if (records->empty()) return base::Status();
  sqlite3* db = read_db_.get();
  std::int64_t lo = kInt64Max;
  std::int64_t hi = kInt64Min;
  std::unordered_map<StepKey, v1::StepRecord*, StepKeyHash> by_key;
  by_key.reserve(records->size());
  for (v1::StepRecord& record : *records) {
    lo = std::min<std::int64_t>(lo, record.step());
    hi = std::max<std::int64_t>(hi, record.step());
    by_key.emplace(StepKey{record.step(), record.rank()}, &record);
  }
  const auto find = [&](sqlite3_stmt* stmt) -> v1::StepRecord* {
    const auto it = by_key.find(StepKey{sqlite3_column_int64(stmt, 0), sqlite3_column_int64(stmt, 1)});
    return it == by_key.end() ? nullptr : it->second;
  };
  const auto bind = [&](sqlite3_stmt* stmt) {
    Binder binder(stmt);
    binder.Int(run_id).Int(lo).Int(hi);
    if (rank.has_value()) binder.Int(*rank);
    return binder.rc();
  };
  {
    sqlite3_stmt* stmt = rank.has_value() ? r_.scalars_rank.get() : r_.scalars_all.get();
    ScopedReset reset(stmt);
    int rc = bind(stmt);
    while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      if (v1::StepRecord* record = find(stmt)) {
        (*record->mutable_scalars())[ColumnText(stmt, 2)] = sqlite3_column_double(stmt, 3);
      }
      rc = SQLITE_OK;
    }
    if (rc != SQLITE_DONE) return StepError(db, rc, "reading scalars");
  }
  if (!include_layers) return base::Status();
  // The rows come in the primary key's order, (step, rank, name): no sort of
  // the page's layer rows in SQLite. Each record's layers are put back in
  // the order they were sent (idx) here, one small sort per record.
  sqlite3_stmt* stmt = rank.has_value() ? r_.layers_rank.get() : r_.layers_all.get();
  ScopedReset reset(stmt);
  int rc = bind(stmt);
  std::vector<std::int64_t> order;
  v1::StepRecord* current = nullptr;
  const auto put_in_order = [&order](v1::StepRecord* record) {
    if (record == nullptr || std::is_sorted(order.begin(), order.end())) return;
    auto* layers = record->mutable_layers();
    std::vector<int> by_idx(order.size());
    for (std::size_t i = 0; i < by_idx.size(); ++i) by_idx[i] = static_cast<int>(i);
    std::sort(by_idx.begin(), by_idx.end(), [&order](int a, int b) { return order[a] < order[b]; });
    google::protobuf::RepeatedPtrField<v1::LayerRecord> sorted;
    sorted.Reserve(layers->size());
    for (int i : by_idx) sorted.Add(std::move(*layers->Mutable(i)));
    layers->Swap(&sorted);
  };
  while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    v1::StepRecord* record = find(stmt);
    if (record != current) {
      put_in_order(current);
      current = record;
      order.clear();
    }
    if (record != nullptr) {
      v1::LayerRecord* layer = record->add_layers();
      layer->set_name(ColumnText(stmt, 2));
      if (sqlite3_column_type(stmt, 3) != SQLITE_NULL) layer->set_cosine(sqlite3_column_double(stmt, 3));
      layer->set_grad_norm(sqlite3_column_double(stmt, 4));
      layer->set_ref_norm(sqlite3_column_double(stmt, 5));
      order.push_back(sqlite3_column_int64(stmt, 6));
    }
    rc = SQLITE_OK;
  }
  if (rc != SQLITE_DONE) return StepError(db, rc, "reading layers");
  put_in_order(current);
  return base::Status();
}

base::Status SqliteStore::ReadSteps(sqlite3_stmt* stmt, int bind_rc, std::int64_t run_id, const std::string& run,
                              std::optional<std::uint32_t> rank, bool include_layers, std::uint32_t reserve,
                              std::vector<v1::StepRecord>* out) {
  {
    ScopedReset reset(stmt);
    if (bind_rc != SQLITE_OK) return StepError(read_db_.get(), bind_rc, "binding a step query");
    out->reserve(std::min<std::uint32_t>(reserve, 4096));
    int rc;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      v1::StepRecord& record = out->emplace_back();
      record.set_run(run);
      ReadStep(stmt, &record);
    }
    if (rc != SQLITE_DONE) return StepError(read_db_.get(), rc, "reading step records");
  }
  return ReadDetails(run_id, rank, include_layers, out);
}

base::StatusOr<std::vector<v1::StepRecord>> SqliteStore::GetSteps(const StepQuery& query) {
  std::vector<v1::StepRecord> out;
  if (query.limit == 0 || query.start_step >= query.end_step) return out;
  base::MutexLock lock(&read_mu_);
  ReadTransaction txn(r_.begin.get(), r_.commit.get());
  if (txn.rc() != SQLITE_DONE) return StepError(read_db_.get(), txn.rc(), "BEGIN");
  std::int64_t run_id = -1;
  base::Status s = FindRunForRead(query.run, &run_id);
  if (!s.ok()) return s;
  if (run_id < 0) return out;

  std::int64_t low = query.start_step;
  std::int64_t after_step = kInt64Min;
  std::int64_t after_rank = -1;
  if (query.after.has_value()) {
    after_step = query.after->first;
    after_rank = query.after->second;
    low = std::max(low, after_step);
  }
  sqlite3_stmt* stmt = query.rank.has_value() ? r_.steps_rank.get() : r_.steps_all.get();
  Binder binder(stmt);
  binder.Int(run_id).Int(low).Int(query.end_step).Int(after_step).Int(after_rank).Int(query.limit);
  if (query.rank.has_value()) binder.Int(*query.rank);
  s = ReadSteps(stmt, binder.rc(), run_id, query.run, query.rank, query.include_layers, query.limit, &out);
  if (!s.ok()) return s;
  return out;
}

base::StatusOr<std::vector<v1::StepRecord>> SqliteStore::GetRecentSteps(const std::string& run,
                                                                  std::uint32_t rank,
                                                                  std::uint32_t window) {
  std::vector<v1::StepRecord> out;
  base::MutexLock lock(&read_mu_);
  ReadTransaction txn(r_.begin.get(), r_.commit.get());
  if (txn.rc() != SQLITE_DONE) return StepError(read_db_.get(), txn.rc(), "BEGIN");
  std::int64_t run_id = -1;
  base::Status s = FindRunForRead(run, &run_id);
  if (!s.ok()) return s;
  if (run_id < 0) return out;
  sqlite3_stmt* stmt = r_.recent.get();
  // LIMIT -1 is no limit.
  const int rc = Binder(stmt).Int(run_id).Int(rank).Int(window == 0 ? -1 : std::int64_t{window}).rc();
  s = ReadSteps(stmt, rc, run_id, run, rank, /*include_layers=*/false, window, &out);
  if (!s.ok()) return s;
  std::reverse(out.begin(), out.end());
  return out;
}

base::StatusOr<std::vector<v1::RunInfo>> SqliteStore::ListRuns(const std::string& after_run,
                                                         std::uint32_t limit) {
  std::vector<v1::RunInfo> out;
  base::MutexLock lock(&read_mu_);
  sqlite3_stmt* stmt = r_.list_runs.get();
  ScopedReset reset(stmt);
  int rc = Binder(stmt).Text(after_run).Int(limit).rc();
  while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    ReadRunInfo(stmt, &out.emplace_back());
    rc = SQLITE_OK;
  }
  if (rc != SQLITE_DONE) return StepError(read_db_.get(), rc, "listing runs");
  return out;
}

base::StatusOr<v1::RunInfo> SqliteStore::GetRun(const std::string& run) {
  base::MutexLock lock(&read_mu_);
  sqlite3_stmt* stmt = r_.get_run.get();
  ScopedReset reset(stmt);
  int rc = Binder(stmt).Text(run).rc();
  if (rc == SQLITE_OK) rc = sqlite3_step(stmt);
  if (rc == SQLITE_DONE) return base::Status::NotFound("run \"" + run + "\" has no stored step");
  if (rc != SQLITE_ROW) return StepError(read_db_.get(), rc, "reading a run");
  v1::RunInfo info;
  ReadRunInfo(stmt, &info);
  return info;
}

base::StatusOr<std::vector<v1::ConfigChange>> SqliteStore::ListConfigChanges(const std::string& run,
                                                                       std::uint64_t offset,
                                                                       std::uint32_t limit) {
  std::vector<v1::ConfigChange> out;
  base::MutexLock lock(&read_mu_);
  sqlite3_stmt* stmt = r_.changes.get();
  ScopedReset reset(stmt);
  const std::int64_t sql_offset = offset > static_cast<std::uint64_t>(kInt64Max)
                                      ? kInt64Max
                                      : static_cast<std::int64_t>(offset);
  int rc = Binder(stmt).Text(run).Int(limit).Int(sql_offset).rc();
  while (rc == SQLITE_OK && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    if (!ParseColumn(stmt, 0, &out.emplace_back())) {
      return base::Status::DataLoss(path_ + ": unreadable audit record of run \"" + run + "\"");
    }
    rc = SQLITE_OK;
  }
  if (rc != SQLITE_DONE) return StepError(read_db_.get(), rc, "listing audit records");
  return out;
}

base::StatusOr<std::vector<std::pair<std::string, v1::RunConfig>>> SqliteStore::LoadRunConfigs() {
  std::vector<std::pair<std::string, v1::RunConfig>> out;
  base::MutexLock lock(&read_mu_);
  sqlite3_stmt* stmt = r_.configs.get();
  ScopedReset reset(stmt);
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    std::pair<std::string, v1::RunConfig> entry;
    entry.first = ColumnText(stmt, 0);
    if (!ParseColumn(stmt, 1, &entry.second)) {
      return base::Status::DataLoss(path_ + ": unreadable settings of run \"" + entry.first + "\"");
    }
    if (entry.second.version() >= 1) out.push_back(std::move(entry));
  }
  if (rc != SQLITE_DONE) return StepError(read_db_.get(), rc, "loading run settings");
  return out;
}

}  // namespace

base::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path,
                                                 const SqliteOptions& options) {
  return SqliteStore::Open(path, options);
}

int SqliteSchemaVersion() { return kSchemaVersion; }

#undef GAC_RUN_COLUMNS

}  // namespace gac::server
