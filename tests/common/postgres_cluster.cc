#include "tests/common/postgres_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gac::testing {
namespace {

bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

bool HasServer(const std::string& dir) {
  return IsExecutable(dir + "/initdb") && IsExecutable(dir + "/pg_ctl") && IsExecutable(dir + "/postgres");
}

std::string TempRoot() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

}  // namespace

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs argv as (uid, gid) when switch_user, with stdout and stderr appended
// to `log`; returns the exit status (-1 when it could not run).
int RunAs(const std::vector<std::string>& argv, bool switch_user, unsigned uid, unsigned gid,
          const std::string& log) {
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) {
      dup2(null_fd, 0);
      close(null_fd);
    }
    if (switch_user) {
      if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(126);
    }
    // English messages whatever the test's locale.
    setenv("LC_ALL", "C", 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool ChownTree(const std::string& path, unsigned uid, unsigned gid) {
  if (chown(path.c_str(), uid, gid) != 0) return false;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (lchown(it->path().c_str(), uid, gid) != 0) return false;
  }
  return !ec;
}

// The major version of the server binaries ("15"), for the template's name.
std::string ServerVersion(const std::string& bindir) {
  const std::string slash = bindir.substr(0, bindir.rfind("/bin"));
  return slash.substr(slash.rfind('/') + 1);
}

}  // namespace

std::string PostgresCluster::BinDir() {
  if (const char* env = std::getenv("GAC_PG_BINDIR"); env != nullptr && *env != '\0') {
    return HasServer(env) ? env : "";
  }
  if (HasServer("/usr/lib/postgresql/15/bin")) return "/usr/lib/postgresql/15/bin";
  std::error_code ec;
  std::string best;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
    const std::string bin = entry.path().string() + "/bin";
    if (HasServer(bin) && bin > best) best = bin;
  }
  return best;
}

std::unique_ptr<PostgresCluster> PostgresCluster::Start(std::string* error) {
  std::unique_ptr<PostgresCluster> c(new PostgresCluster());
  c->bindir_ = BinDir();
  if (c->bindir_.empty()) {
    *error = "PostgreSQL server binaries not found";
    return nullptr;
  }
  c->uid_ = geteuid();
  c->gid_ = getegid();
  if (c->uid_ == 0) {
    // initdb and postgres refuse root.
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) pw = getpwnam("nobody");
    if (pw == nullptr) {
      *error = "running as root, and neither a 'postgres' nor a 'nobody' user exists to run the server";
      return nullptr;
    }
    c->uid_ = pw->pw_uid;
    c->gid_ = pw->pw_gid;
    c->switch_user_ = true;
  }
  std::string tmpl = TempRoot() + "/gac-pg-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    *error = "mkdtemp " + tmpl + " failed";
    return nullptr;
  }
  c->scratch_ = tmpl;
  c->data_ = c->scratch_ + "/data";
  c->log_ = c->scratch_ + "/server.log";  // written by the server's user
  const std::string tools_log = c->scratch_ + "/tools.log";
  if (c->switch_user_ && chown(c->scratch_.c_str(), c->uid_, c->gid_) != 0) {
    *error = "cannot hand " + c->scratch_ + " to uid " + std::to_string(c->uid_);
    return nullptr;
  }

  // The template: initdb once per machine, user and version, under a lock.
  // "-v1": the initdb options below; change it with them.
  const std::string template_dir = TempRoot() + "/gac-pg-template-" + ServerVersion(c->bindir_) + "-uid" +
                                   std::to_string(c->uid_) + "-v1";
  {
    const std::string lock_path = template_dir + ".lock";
    const int lock = open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
    if (lock < 0 || flock(lock, LOCK_EX) != 0) {
      *error = "cannot lock " + lock_path;
      if (lock >= 0) close(lock);
      return nullptr;
    }
    struct stat st {};
    if (stat((template_dir + "/PG_VERSION").c_str(), &st) != 0) {
      std::error_code ec;
      std::filesystem::remove_all(template_dir, ec);
      const std::string building = template_dir + ".building";
      std::filesystem::remove_all(building, ec);
      const std::string pwfile = c->scratch_ + "/pwfile";
      {
        std::ofstream out(pwfile);
        out << kPassword << "\n";
      }
      if (c->switch_user_) (void)chown(pwfile.c_str(), c->uid_, c->gid_);
      // The parent of `building` must be writable by the server's user.
      const std::string parent = building + "-parent";
      std::filesystem::create_directories(parent, ec);
      if (c->switch_user_) (void)chown(parent.c_str(), c->uid_, c->gid_);
      const std::string target = parent + "/data";
      const int rc = RunAs({c->bindir_ + "/initdb", "-D", target, "-U", kUser, "--pwfile=" + pwfile,
                            "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C",
                            "--no-sync"},
                           c->switch_user_, c->uid_, c->gid_, tools_log);
      std::filesystem::remove(pwfile, ec);
      if (rc != 0) {
        *error = "initdb failed (" + std::to_string(rc) + "): " + ReadAll(tools_log);
        flock(lock, LOCK_UN);
        close(lock);
        return nullptr;
      }
      std::filesystem::rename(target, template_dir, ec);
      std::filesystem::remove_all(parent, ec);
      if (ec) {
        *error = "cannot move the template to " + template_dir + ": " + ec.message();
        flock(lock, LOCK_UN);
        close(lock);
        return nullptr;
      }
    }
    const int rc = RunAs({"/bin/cp", "-a", template_dir, c->data_}, c->switch_user_, c->uid_, c->gid_, tools_log);
    flock(lock, LOCK_UN);
    close(lock);
    if (rc != 0) {
      *error = "cannot copy the template " + template_dir + ": " + ReadAll(tools_log);
      return nullptr;
    }
  }
  if (c->switch_user_ && !ChownTree(c->data_, c->uid_, c->gid_)) {
    *error = "cannot hand " + c->data_ + " to uid " + std::to_string(c->uid_);
    return nullptr;
  }
  // A free port; another process may take it between the probe and the
  // server's bind, so a few tries.
  for (int attempt = 0; attempt < 5; ++attempt) {
    c->port_ = FreeLoopbackPort();
    if (c->port_ == 0) continue;
    std::string start_error;
    if (c->Restart(&start_error)) {
      c->StartWatchdog();
      return c;
    }
    *error = start_error;
  }
  return nullptr;
}

void PostgresCluster::StartWatchdog() {
  // A process that outlives a test killed by its timeout (or a crash) and
  // then stops the server and removes the scratch directory: it waits for
  // the end of a pipe whose write end only this process holds (close-on-exec,
  // so gacd processes the tests start do not hold it too).
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return;
  const std::string script = "read _; \"$0\" -D \"$1\" stop -m immediate -w >/dev/null 2>&1; rm -rf \"$2\"";
  const std::string pg_ctl = bindir_ + "/pg_ctl";
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[0], 0);  // the duplicate is not close-on-exec
    const int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
      dup2(null_fd, 1);
      dup2(null_fd, 2);
    }
    setsid();  // not in the test's process group: a kill of the group spares it
    if (switch_user_ && (setgroups(0, nullptr) != 0 || setgid(gid_) != 0 || setuid(uid_) != 0)) _exit(126);
    execl("/bin/sh", "sh", "-c", script.c_str(), pg_ctl.c_str(), data_.c_str(), scratch_.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[0]);
  if (pid > 0) {
    watchdog_fd_ = fds[1];
  } else {
    close(fds[1]);
  }
}

PostgresCluster* PostgresCluster::Shared(std::string* error) {
  static std::unique_ptr<PostgresCluster> shared;
  static std::string shared_error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    shared = Start(&shared_error);
  }
  if (shared == nullptr) *error = shared_error;
  return shared.get();
}

PostgresCluster::~PostgresCluster() {
  if (running_) {
    std::string ignored;
    PgCtl({"stop", "-m", "immediate", "-w"}, &ignored);
  }
  std::error_code ec;
  if (!scratch_.empty()) std::filesystem::remove_all(scratch_, ec);
  if (watchdog_fd_ >= 0) close(watchdog_fd_);  // the watchdog finds nothing left to do
}

bool PostgresCluster::PgCtl(const std::vector<std::string>& args, std::string* error) {
  std::vector<std::string> argv = {bindir_ + "/pg_ctl", "-D", data_};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string out = scratch_ + "/pg_ctl.out";
  std::error_code ec;
  std::filesystem::remove(out, ec);
  const int rc = RunAs(argv, switch_user_, uid_, gid_, out);
  if (rc != 0) {
    *error = "pg_ctl " + args.front() + " failed (" + std::to_string(rc) + "): " + ReadAll(out) + "\nserver log:\n" + Log();
    return false;
  }
  return true;
}

bool PostgresCluster::Restart(std::string* error) {
  if (running_) return true;
  // TCP on loopback only, no Unix socket; fsync off: a test server needs no
  // durability across power loss, and the tests' speed depends on it.
  const std::string options = "-p " + std::to_string(port_) +
                              " -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c fsync=off "
                              "-c full_page_writes=off -c max_connections=200 -c lc_messages=C";
  if (!PgCtl({"start", "-w", "-t", "60", "-l", log_, "-o", options}, error)) return false;
  running_ = true;
  return true;
}

bool PostgresCluster::Stop(std::string* error) {
  if (!running_) return true;
  if (!PgCtl({"stop", "-m", "fast", "-w", "-t", "60"}, error)) return false;
  running_ = false;
  return true;
}

std::string PostgresCluster::Uri(const std::string& database, const std::string& password) const {
  return std::string("postgresql://") + kUser + ":" + password + "@127.0.0.1:" + std::to_string(port_) + "/" +
         database;
}

bool PostgresCluster::Exec(const std::string& database, const std::string& sql, std::string* error,
                           std::string* value) {
  PGconn* conn = PQconnectdb(Uri(database).c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    *error = PQerrorMessage(conn);
    PQfinish(conn);
    return false;
  }
  PQsetNoticeProcessor(conn, [](void*, const char*) {}, nullptr);
  PGresult* r = PQexec(conn, sql.c_str());
  const ExecStatusType st = PQresultStatus(r);
  const bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
  if (!ok) *error = sql + ": " + PQresultErrorMessage(r);
  if (ok && value != nullptr) {
    *value = st == PGRES_TUPLES_OK && PQntuples(r) > 0 && PQnfields(r) > 0 ? PQgetvalue(r, 0, 0) : "";
  }
  PQclear(r);
  PQfinish(conn);
  return ok;
}

std::string PostgresCluster::NewDatabase(std::string* error) {
  const std::string name = "gac_test_" + std::to_string(++databases_);
  if (!Exec("postgres", "CREATE DATABASE " + name, error)) return "";
  return Uri(name);
}

std::string PostgresCluster::Log() const { return ReadAll(log_); }

}  // namespace gac::testing
