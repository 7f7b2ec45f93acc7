// A real PostgreSQL server for the tests, started by them: initdb and pg_ctl
// of Debian's postgresql package (/usr/lib/postgresql/15/bin, or the
// directory in $GAC_PG_BINDIR), in a scratch directory that is removed
// afterwards, listening on a free loopback port only, with password
// authentication on TCP. initdb refuses to run as root, so when the tests run
// as root the cluster runs as Debian's unprivileged `postgres` user.
//
// The data directory is copied from a template made by initdb once per
// machine and PostgreSQL version (under $TMPDIR, built under a lock), which
// saves initdb's second or two per test process. A watchdog process stops
// the server and removes the directory when the test process ends without
// doing so (a test killed at its timeout).
//
// Tests skip, with the reason logged, only when the PostgreSQL binaries are
// not installed; any other failure to start is a test failure.
//
// Thread safety: one thread at a time.
#ifndef GAC_TESTS_COMMON_POSTGRES_CLUSTER_H_
#define GAC_TESTS_COMMON_POSTGRES_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

namespace gac::testing {

// A loopback TCP port that is free now (0 when none could be found); the
// caller binds it a moment later, so another process may take it meanwhile.
int FreeLoopbackPort();

class PostgresCluster {
 public:
  static constexpr const char* kUser = "gac";
  static constexpr const char* kPassword = "gac-test-password";

  // The directory with initdb, pg_ctl and postgres; "" when not installed.
  static std::string BinDir();

  // initdb (or the template) and start. Null with *error filled on failure.
  static std::unique_ptr<PostgresCluster> Start(std::string* error);

  // One cluster per test process, started at the first call and stopped at
  // exit; null with *error filled when it cannot start.
  static PostgresCluster* Shared(std::string* error);

  ~PostgresCluster();  // immediate stop, scratch directory removed
  PostgresCluster(const PostgresCluster&) = delete;
  PostgresCluster& operator=(const PostgresCluster&) = delete;

  int port() const { return port_; }
  // postgresql://gac:PASSWORD@127.0.0.1:PORT/DATABASE
  std::string Uri(const std::string& database, const std::string& password = kPassword) const;

  // A new empty database with a name not used before in this cluster;
  // returns its URI, or "" with *error filled.
  std::string NewDatabase(std::string* error);

  // Runs `sql` on `database` as the superuser; false with *error filled on
  // failure. `value` (if not null) receives the first column of the first
  // row ("" when none).
  bool Exec(const std::string& database, const std::string& sql, std::string* error, std::string* value = nullptr);

  // The database goes away (fast shutdown: connections are cut) and comes
  // back on the same port.
  bool Stop(std::string* error);
  bool Restart(std::string* error);
  bool running() const { return running_; }

  // The server's log so far.
  std::string Log() const;

 private:
  PostgresCluster() = default;
  bool PgCtl(const std::vector<std::string>& args, std::string* error);
  void StartWatchdog();

  std::string bindir_, scratch_, data_, log_;
  int port_ = 0;
  bool running_ = false;
  int databases_ = 0;
  unsigned uid_ = 0, gid_ = 0;  // who runs the server (the caller unless root)
  bool switch_user_ = false;
  int watchdog_fd_ = -1;  // its end stops the server (StartWatchdog)
};

}  // namespace gac::testing

// Starts `var` (a PostgresCluster*, the process's shared cluster) or skips
// the test when PostgreSQL is not installed; fails it when it cannot start.
#define GAC_SHARED_POSTGRES_OR_SKIP(var)                                                                   \
  ::gac::testing::PostgresCluster* var = nullptr;                                                          \
  do {                                                                                                     \
    if (::gac::testing::PostgresCluster::BinDir().empty()) {                                              \
      GTEST_SKIP() << "PostgreSQL server binaries not installed (Debian: postgresql; or set "             \
                      "GAC_PG_BINDIR): skipping";                                                          \
    }                                                                                                      \
    std::string gac_pg_error;                                                                              \
    var = ::gac::testing::PostgresCluster::Shared(&gac_pg_error);                                          \
    ASSERT_NE(var, nullptr) << "cannot start PostgreSQL: " << gac_pg_error;                               \
  } while (false)

// As GAC_SHARED_POSTGRES_OR_SKIP, and `uri` (a std::string) names a new
// empty database of it.
#define GAC_NEW_POSTGRES_DATABASE_OR_SKIP(cluster, uri)                              \
  GAC_SHARED_POSTGRES_OR_SKIP(cluster);                                              \
  std::string uri;                                                                   \
  do {                                                                               \
    std::string gac_pg_db_error;                                                     \
    uri = cluster->NewDatabase(&gac_pg_db_error);                                    \
    ASSERT_FALSE(uri.empty()) << "cannot create a database: " << gac_pg_db_error;    \
  } while (false)

#endif  // GAC_TESTS_COMMON_POSTGRES_CLUSTER_H_
