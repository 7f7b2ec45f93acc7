// gacctl end to end: the program, run as a process against a real gacd fed
// with synthetic runs (tests/dashboards/synthetic_run.h). Golden outputs of
// each format; a round trip of every stored field through CSV and JSON
// Lines (and pandas, where installed); tail -f following new steps; the
// settings commands with gacd's own errors; replay against a recomputation
// written here; calibration against statistics computed here; the error of
// every kind of bad input; TLS; the bash completion against --help.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fcntl.h>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "gac/cli/format.h"
#include "gac/cli/gacctl.h"
#include "gac/proto/record_schema.h"
#include "tests/common/test_util.h"
#include "tests/dashboards/synthetic_run.h"

extern char** environ;

namespace gac::testing {
namespace {

constexpr std::int64_t kBaseNs = 1714564800000000000;  // 2024-05-01T12:00:00Z

// ---- running gacctl ----

struct Result {
  int rc = -1;
  std::string out, err;
};

std::vector<std::string> Environ(const std::map<std::string, std::string>& env) {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    if (v.rfind("GAC_ADDRESS=", 0) == 0 || v.rfind("GAC_TOKEN=", 0) == 0) continue;
    if (env.count(v.substr(0, v.find('='))) > 0) continue;
    out.push_back(v);
  }
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

// Starts `argv` with stdout and stderr into files; returns the pid.
pid_t Spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            const std::string& out_path, const std::string& err_path) {
  std::vector<std::string> args = argv, envs = Environ(env);
  std::vector<char*> cargv, cenv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, cargv[0], &fa, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result RunCommand(const ScratchDir& dir, const std::vector<std::string>& argv,
                  const std::map<std::string, std::string>& env) {
  static int counter = 0;
  const std::string out = dir.File("out." + std::to_string(counter)), err = dir.File("err." + std::to_string(counter));
  ++counter;
  Result r;
  const pid_t pid = Spawn(argv, env, out, err);
  if (pid < 0) {
    r.err = "cannot start " + argv[0];
    return r;
  }
  r.rc = WaitExit(pid);
  r.out = Slurp(out);
  r.err = Slurp(err);
  return r;
}

std::vector<std::string> Argv(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {GACCTL_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// One line on stderr, nothing on stdout: how every error looks.
void ExpectOneLineError(const Result& r, int rc, const std::string& has, const std::string& what) {
  EXPECT_EQ(r.rc, rc) << what << "\nstdout: " << r.out << "\nstderr: " << r.err;
  EXPECT_EQ(r.out, "") << what;
  ASSERT_FALSE(r.err.empty()) << what;
  EXPECT_EQ(r.err.back(), '\n') << what;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << ": " << r.err;
  EXPECT_EQ(r.err.rfind("gacctl", 0), 0u) << what << ": " << r.err;
  EXPECT_NE(r.err.find(has), std::string::npos) << what << ": expected '" << has << "' in: " << r.err;
}

// ---- synthetic runs ----

std::vector<v1::StepRecord> SyntheticRecords(SyntheticRunOptions o, int steps) {
  SyntheticRun run(std::move(o));
  std::vector<v1::StepRecord> out;
  for (int i = 0; i < steps; ++i) {
    const auto now = std::chrono::system_clock::time_point(std::chrono::nanoseconds(kBaseNs + i * 1000000000LL));
    for (auto& r : run.NextStep(nullptr, now)) out.push_back(std::move(r));
  }
  return out;
}

base::Status Feed(Client& client, const std::vector<v1::StepRecord>& records) {
  std::vector<v1::IngestRequest> batches;
  for (std::size_t i = 0; i < records.size(); i += 500) {
    const auto end = records.begin() + static_cast<std::ptrdiff_t>(std::min(records.size(), i + 500));
    batches.push_back(MakeBatch(batches.size() + 1, {records.begin() + static_cast<std::ptrdiff_t>(i), end}));
  }
  // A stream the transport breaks (seen once under ASan as "Socket closed"
  // right after gacd started) is sent again: ingest is idempotent, and the
  // fixture's data, not the stream's fate, is what these tests need.
  grpc::Status st;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<v1::IngestAck> acks;
    st = client.Ingest(batches, &acks);
    if (st.ok() && acks.size() == batches.size()) return base::Status::Ok();
    if (st.ok()) return base::Status::Internal("ingest: missing acks");
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE && st.error_code() != grpc::StatusCode::INTERNAL) break;
  }
  return base::Status::Internal("ingest: " + st.error_message());
}

SyntheticRunOptions GoldenRun() {
  SyntheticRunOptions o;
  o.run = "exp-golden";
  o.world = 2;
  o.seed = 3;
  o.spike = true;
  o.spike_start = 4;
  o.spike_ramp = 3;
  o.spike_hold = 3;
  o.spike_peak = 0.5;
  o.layers = 2;
  return o;
}

// exp-spike: 300 steps of 2 ranks with 4 layers and an alignment spike from
// step 100; step 150 is invalid (non-finite statistics) and step 160 is
// missing, inside the skip stretch.
std::vector<v1::StepRecord> SpikeRecords() {
  SyntheticRunOptions o;
  o.run = "exp-spike";
  o.world = 2;
  o.seed = 1;
  o.spike = true;
  o.spike_start = 100;
  o.layers = 4;
  std::vector<v1::StepRecord> records = SyntheticRecords(o, 300);
  std::vector<v1::StepRecord> out;
  for (v1::StepRecord& r : records) {
    if (r.step() == 160) continue;
    if (r.step() == 150) {
      r.set_regime(v1::REGIME_INVALID);
      r.clear_cosine();
      r.clear_cosine_after();
      r.set_alpha(1.0);
      r.clear_layers();
    }
    out.push_back(std::move(r));
  }
  return out;
}

class Gacctl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir;
    const std::string tokens = WriteTestTokens(*dir_);
    gacd_ = new GacdProcess(
        {"--listen=127.0.0.1:0", "--http-listen=", "--store=memory", "--token-file=" + tokens, "--sync=normal"});
    if (!gacd_->Start(dir_->File("ready"))) {
      setup_error_ = gacd_->error();
      return;
    }
    Client writer(gacd_->address(), kWriterToken);
    SyntheticRunOptions sync;
    sync.run = "exp-sync";
    sync.world = 1;
    sync.seed = 2;
    sync.layers = 0;
    SyntheticRunOptions hist;
    hist.run = "exp-hist";
    hist.world = 1;
    hist.layers = 0;
    for (const auto& records : {SyntheticRecords(GoldenRun(), 14), SpikeRecords(), SyntheticRecords(sync, 200),
                                SyntheticRecords(hist, 5)}) {
      const base::Status st = Feed(writer, records);
      if (!st.ok()) {
        setup_error_ = st.ToString();
        return;
      }
    }
    // Two settings changes for the audit log.
    Client admin(gacd_->address(), kAdminToken);
    v1::SetRunConfigRequest set;
    set.set_run("exp-hist");
    set.mutable_thresholds()->set_c_low(0.04);
    set.mutable_thresholds()->set_c_high(0.25);
    set.mutable_thresholds()->set_alpha_mode(v1::ALPHA_MODE_PAPER);
    set.set_mode(v1::CONTROL_MODE_LOCAL);
    set.set_reason("calibrated on exp-sync");
    v1::RunConfig cfg;
    grpc::Status st = admin.SetRunConfig(set, &cfg);
    set.set_mode(v1::CONTROL_MODE_REMOTE);
    set.set_reason("closed loop, decided in gacd");
    if (st.ok()) st = admin.SetRunConfig(set, &cfg);
    if (!st.ok()) setup_error_ = "SetRunConfig: " + st.error_message();
  }

  static void TearDownTestSuite() {
    delete gacd_;
    delete dir_;
    gacd_ = nullptr;
    dir_ = nullptr;
  }

  void SetUp() override { ASSERT_TRUE(setup_error_.empty()) << setup_error_; }

 public:
  static const ScratchDir* dir() { return dir_; }
  static std::map<std::string, std::string> Env(const std::string& token = kAdminToken) {
    return {{"GAC_ADDRESS", gacd_->address()}, {"GAC_TOKEN", token}};
  }

 protected:
  // gacctl against the suite's gacd (address and token from the environment).
  static Result Ctl(const std::vector<std::string>& args, const std::string& token = kAdminToken) {
    return RunCommand(*dir_, Argv(args), Env(token));
  }
  static Client Reader() { return Client(gacd_->address(), kReaderToken); }
  static Client Admin() { return Client(gacd_->address(), kAdminToken); }

  // The records of rank 0 of a run, in step order.
  static std::vector<v1::StepRecord> Rank0(const std::string& run) {
    std::vector<v1::StepRecord> all, out;
    EXPECT_TRUE(Reader().AllSteps(run, &all).ok());
    for (auto& r : all) {
      if (r.rank() == 0) out.push_back(std::move(r));
    }
    return out;
  }

  static ScratchDir* dir_;
  static GacdProcess* gacd_;
  static std::string setup_error_;
};

ScratchDir* Gacctl::dir_ = nullptr;
GacdProcess* Gacctl::gacd_ = nullptr;
std::string Gacctl::setup_error_;

// ---- goldens ----

void ExpectGolden(const std::string& name, const std::string& actual) {
  const std::string path = std::string(GAC_CLI_GOLDEN_DIR) + "/" + name;
  if (std::getenv("GAC_UPDATE_GOLDEN") != nullptr) {
    WriteFile(path, actual);
    return;
  }
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "no golden file " << path << " (GAC_UPDATE_GOLDEN=1 writes it)";
    return;
  }
  EXPECT_EQ(actual, Slurp(path)) << "output differs from " << path
                                 << " (after a deliberate change, GAC_UPDATE_GOLDEN=1 rewrites it)";
}

// Times and ages that depend on when gacd received the records, and the
// widths they give table columns.
std::string Masked(const std::string& text) {
  std::string t = std::regex_replace(text, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"), "<time>");
  t = std::regex_replace(t, std::regex(R"(\b\d+(ms|s|m\d\ds|h\d\dm|d\d\dh) ago)"), "<age> ago");
  return std::regex_replace(t, std::regex(" +"), " ");
}

// ---- CSV and JSON readers of the test's own ----

std::vector<std::vector<std::string>> ParseCsv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, in_field = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"' && field.empty()) {
      quoted = true;
      in_field = true;
    } else if (c == ',') {
      row.push_back(field);
      field.clear();
      in_field = false;
    } else if (c == '\n') {
      row.push_back(field);
      rows.push_back(row);
      row.clear();
      field.clear();
      in_field = false;
    } else {
      field += c;
      in_field = true;
    }
  }
  EXPECT_TRUE(field.empty() && row.empty() && !in_field) << "CSV does not end with a line end";
  return rows;
}

// A value of a row: absent (null / empty), or its text.
using Row = std::map<std::string, std::optional<std::string>>;

std::vector<Row> CsvRows(const std::string& text, std::vector<std::string>* header = nullptr) {
  const auto rows = ParseCsv(text);
  std::vector<Row> out;
  if (rows.empty()) return out;
  if (header != nullptr) *header = rows[0];
  for (std::size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].size(), rows[0].size()) << "row " << i;
    Row r;
    for (std::size_t j = 0; j < rows[0].size() && j < rows[i].size(); ++j) {
      r[rows[0][j]] = rows[i][j].empty() ? std::nullopt : std::optional<std::string>(rows[i][j]);
    }
    out.push_back(std::move(r));
  }
  return out;
}

// One flat JSON object (strings, numbers, true/false, null); numbers keep
// their text. `keys` receives the keys in order.
Row ParseJsonObject(const std::string& s, std::vector<std::string>* keys = nullptr) {
  Row row;
  std::size_t i = 0;
  auto fail = [&](const char* what) {
    ADD_FAILURE() << "bad JSON (" << what << ") at " << i << ": " << s;
    i = s.size();
  };
  auto ws = [&] {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  };
  auto string = [&]() -> std::string {
    std::string out;
    if (s[i] != '"') {
      fail("expected a string");
      return out;
    }
    for (++i; i < s.size() && s[i] != '"'; ++i) {
      if (s[i] != '\\') {
        out += s[i];
        continue;
      }
      const char e = s[++i];
      if (e == 'n') out += '\n';
      else if (e == 't') out += '\t';
      else if (e == 'r') out += '\r';
      else if (e == 'u') {
        out += static_cast<char>(std::stoi(s.substr(i + 1, 4), nullptr, 16));
        i += 4;
      } else out += e;
    }
    ++i;
    return out;
  };
  ws();
  if (i >= s.size() || s[i] != '{') {
    fail("expected {");
    return row;
  }
  ++i;
  ws();
  if (i < s.size() && s[i] == '}') return row;
  while (i < s.size()) {
    ws();
    const std::string key = string();
    ws();
    if (i >= s.size() || s[i] != ':') {
      fail("expected :");
      return row;
    }
    ++i;
    ws();
    std::optional<std::string> value;
    if (s[i] == '"') {
      value = string();
    } else {
      const std::size_t start = i;
      while (i < s.size() && s[i] != ',' && s[i] != '}' && !std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      const std::string token = s.substr(start, i - start);
      if (token != "null") value = token;
    }
    EXPECT_EQ(row.count(key), 0u) << "duplicate key " << key;
    row[key] = value;
    if (keys != nullptr) keys->push_back(key);
    ws();
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    if (i < s.size() && s[i] == '}') {
      ++i;
      break;
    }
    fail("expected , or }");
  }
  ws();
  if (i != s.size()) fail("trailing text");
  return row;
}

std::vector<Row> JsonlRows(const std::string& text) {
  std::vector<Row> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) rows.push_back(ParseJsonObject(line));
  return rows;
}

double Real(const std::optional<std::string>& v) {
  EXPECT_TRUE(v.has_value());
  return v ? std::strtod(v->c_str(), nullptr) : NAN;
}
std::int64_t Int(const std::optional<std::string>& v) {
  EXPECT_TRUE(v.has_value());
  return v ? std::stoll(*v) : -1;
}

// The names gacctl documents for the wire's enums.
const char* RegimeText(v1::Regime r) {
  switch (r) {
    case v1::REGIME_SAFE: return "safe";
    case v1::REGIME_PROJECT: return "project";
    case v1::REGIME_SKIP: return "skip";
    case v1::REGIME_INVALID: return "invalid";
    default: return "?";
  }
}
const char* ModeText(v1::ControlMode m) {
  switch (m) {
    case v1::CONTROL_MODE_LOCAL: return "local";
    case v1::CONTROL_MODE_REMOTE: return "remote";
    default: return "monitor";
  }
}

void ExpectOptionalReal(const std::optional<std::string>& v, bool has, double want, const std::string& what) {
  EXPECT_EQ(v.has_value(), has) << what;
  if (v && has) {
    EXPECT_EQ(std::strtod(v->c_str(), nullptr), want) << what << " = " << *v;
  }
}

// Every stored field of `r` in a step row, exactly. `scalars` are the
// record's scalars as the row gives them.
void ExpectStepRow(const Row& row, const v1::StepRecord& r, const std::map<std::string, double>& scalars) {
  const std::string what = r.run() + " step " + std::to_string(r.step()) + " rank " + std::to_string(r.rank());
  auto at = [&](const std::string& key) -> std::optional<std::string> {
    auto it = row.find(key);
    if (it == row.end()) {
      ADD_FAILURE() << what << ": no " << key;
      return std::nullopt;
    }
    return it->second;
  };
  EXPECT_EQ(at("run").value_or(""), r.run()) << what;
  EXPECT_EQ(Int(at("step")), r.step()) << what;
  EXPECT_EQ(Int(at("rank")), r.rank()) << what;
  EXPECT_EQ(Int(at("world_size")), r.world_size()) << what;
  EXPECT_EQ(Int(at("wall_time_ns")), r.wall_time_ns()) << what;
  EXPECT_EQ(at("mode").value_or(""), ModeText(r.mode())) << what;
  EXPECT_EQ(at("regime").value_or(""), RegimeText(r.regime())) << what;
  ExpectOptionalReal(at("cosine"), r.has_cosine(), r.cosine(), what + " cosine");
  ExpectOptionalReal(at("cosine_after"), r.has_cosine_after(), r.cosine_after(), what + " cosine_after");
  EXPECT_EQ(Real(at("alpha")), r.alpha()) << what;
  EXPECT_EQ(Real(at("grad_norm")), r.grad_norm()) << what;
  EXPECT_EQ(Real(at("ref_norm")), r.ref_norm()) << what;
  const auto staleness = at("staleness");
  EXPECT_EQ(staleness.has_value(), r.has_staleness()) << what;
  if (staleness && r.has_staleness()) {
    EXPECT_EQ(std::stoll(*staleness), r.staleness()) << what;
  }
  EXPECT_EQ(at("fallback").value_or(""), r.fallback() ? "true" : "false") << what;
  EXPECT_EQ(Real(at("agent_overhead_seconds")), r.agent_overhead_seconds()) << what;
  const std::map<std::string, double> want(r.scalars().begin(), r.scalars().end());
  EXPECT_EQ(scalars, want) << what;
}

// The scalars of a CSV step row: its scalar.NAME columns and other_scalars.
std::map<std::string, double> CsvScalars(const Row& row) {
  std::map<std::string, double> out;
  for (const auto& [key, value] : row) {
    if (key.rfind("scalar.", 0) == 0 && value) out[key.substr(7)] = std::strtod(value->c_str(), nullptr);
  }
  auto other = row.find("other_scalars");
  EXPECT_NE(other, row.end());
  if (other != row.end() && other->second) {
    for (const auto& [name, value] : ParseJsonObject(*other->second)) {
      EXPECT_EQ(out.count(name), 0u) << name << " both in a column and in other_scalars";
      out[name] = Real(value);
    }
  }
  return out;
}

std::map<std::string, double> JsonScalars(const Row& row) {
  std::map<std::string, double> out;
  for (const auto& [key, value] : row) {
    if (key.rfind("scalar.", 0) == 0) out[key.substr(7)] = Real(value);
  }
  return out;
}

// ---- goldens of each format ----

using GoldenCases = std::vector<std::pair<std::string, std::vector<std::string>>>;

// Runs each (golden file, arguments) case against the suite's gacd and
// compares what it printed, through `mask`, with the golden file.
void ExpectGoldens(const GoldenCases& cases, std::string (*mask)(const std::string&) = nullptr) {
  for (const auto& [name, args] : cases) {
    const Result r = RunCommand(*Gacctl::dir(), Argv(args), Gacctl::Env());
    ASSERT_EQ(r.rc, 0) << name << ": " << r.err;
    EXPECT_EQ(r.err, "") << name;
    ExpectGolden(name, mask != nullptr ? mask(r.out) : r.out);
  }
}

TEST_F(Gacctl, GoldenSteps) {
  ExpectGoldens({
           {"steps_table.txt", {"steps", "exp-golden"}},
           {"steps_csv.txt", {"steps", "exp-golden", "--format", "csv"}},
           {"steps_jsonl.txt", {"steps", "exp-golden", "--format=jsonl", "--start-step", "3", "--end-step", "6"}},
           {"steps_scalars_csv.txt", {"steps", "exp-golden", "--rank", "1", "--scalars", "reward,loss", "--format", "csv"}},
           {"layers_table.txt", {"steps", "exp-golden", "--layers", "--rank", "0", "--end-step", "5"}},
           {"layers_csv.txt", {"steps", "exp-golden", "--layers", "--format", "csv", "--start-step", "12"}},
           {"layers_jsonl.txt", {"steps", "exp-golden", "--layers", "--format", "jsonl", "--start-step", "12",
                                  "--page-size", "3"}},
           {"tail_table.txt", {"tail", "exp-golden", "-n", "6", "--rank", "1"}},
           {"tail_csv.txt", {"tail", "exp-golden", "--lines=3", "--format", "csv"}},
  });
}

// The former step-range flags: --from is --start-step, --to N (inclusive) is
// --end-step N+1; each prints a note on stderr and gives the same output.
TEST_F(Gacctl, DeprecatedStepRangeFlagsAreAliases) {
  const Result now = Ctl({"steps", "exp-golden", "--format=jsonl", "--start-step", "3", "--end-step", "6"});
  ASSERT_EQ(now.rc, 0) << now.err;
  EXPECT_EQ(now.err, "");
  const Result before = Ctl({"steps", "exp-golden", "--format=jsonl", "--from", "3", "--to", "5"});
  ASSERT_EQ(before.rc, 0) << before.err;
  EXPECT_EQ(before.out, now.out);
  EXPECT_EQ(before.err,
            "gacctl: note: --from is deprecated: use --start-step\n"
            "gacctl: note: --to is deprecated: use --end-step N+1 (--to is inclusive)\n");
  const Result mixed = Ctl({"steps", "exp-golden", "--format=jsonl", "--start-step", "3", "--to", "5"});
  ASSERT_EQ(mixed.rc, 0) << mixed.err;
  EXPECT_EQ(mixed.out, now.out);
  const std::vector<std::string> replay = {"replay", "exp-golden", "--c-low", "0.05", "--c-high", "0.3", "--steps",
                                           "--format", "csv"};
  std::vector<std::string> a = replay, b = replay;
  a.insert(a.end(), {"--start-step", "4", "--end-step", "9"});
  b.insert(b.end(), {"--from", "4", "--to", "8"});
  const Result ra = Ctl(a), rb = Ctl(b);
  ASSERT_EQ(ra.rc, 0) << ra.err;
  ASSERT_EQ(rb.rc, 0) << rb.err;
  EXPECT_EQ(ra.out, rb.out);
  EXPECT_EQ(ra.err, "");
  EXPECT_NE(rb.err.find("gacctl: note: --from is deprecated: use --start-step\n"), std::string::npos) << rb.err;
  // --page-size changes the calls, not the output.
  const Result paged = Ctl({"steps", "exp-golden", "--format=jsonl", "--start-step", "3", "--end-step", "6",
                            "--page-size", "1"});
  ASSERT_EQ(paged.rc, 0) << paged.err;
  EXPECT_EQ(paged.out, now.out);
}

TEST_F(Gacctl, GoldenReplayAndCalibration) {
  ExpectGoldens({
           {"replay_recorded.txt", {"replay", "exp-golden", "--c-low", "0.05", "--c-high", "0.3"}},
           {"replay_other.txt", {"replay", "exp-golden", "--c-low", "0.1", "--c-high", "0.4", "--alpha-mode", "exact",
                                 "--max-diffs", "2"}},
           {"replay_grid.txt",
            {"replay", "exp-golden", "--grid", "--c-low", "0.03,0.05,0.07", "--c-high", "0.2,0.3,0.4"}},
           {"replay_grid_csv.txt",
            {"replay", "exp-golden", "--grid", "--c-low", "0.05,0.1", "--c-high", "0.3,0.4", "--format", "csv"}},
           {"replay_steps_jsonl.txt",
            {"replay", "exp-golden", "--c-low", "0.1", "--c-high", "0.4", "--steps", "--format", "jsonl"}},
           {"calibrate.txt", {"calibrate", "exp-sync", "--window", "150"}},
  });
}

TEST_F(Gacctl, GoldenRunsShowAndSettings) {
  // Times of gacd's own clock (when it received a record or a change) are
  // masked, with the column widths they give.
  ExpectGoldens({{"runs_table.txt", {"runs"}},
                 {"show.txt", {"show", "exp-golden"}},
                 {"show_window.txt", {"show", "exp-spike", "--window", "100"}},
                 {"config_get.txt", {"config", "get", "exp-hist"}},
                 {"config_history_table.txt", {"config", "history", "exp-hist"}}},
                Masked);
  // CSV and JSON Lines: the columns of gacd's times are replaced.
  auto mask_column = [](const std::string& csv, const std::string& column) {
    auto rows = ParseCsv(csv);
    if (rows.empty()) return std::string();
    const auto at = std::find(rows[0].begin(), rows[0].end(), column) - rows[0].begin();
    std::string out;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      for (std::size_t j = 0; j < rows[i].size(); ++j) {
        out += (j ? "," : "") + (i > 0 && static_cast<std::ptrdiff_t>(j) == at ? std::string("<ns>") : rows[i][j]);
      }
      out += "\n";
    }
    return out;
  };
  Result r = Ctl({"runs", "--format", "csv"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ExpectGolden("runs_csv.txt", mask_column(r.out, "last_seen_ns"));
  r = Ctl({"config", "history", "exp-hist", "--format", "csv"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ExpectGolden("config_history_csv.txt", mask_column(r.out, "updated_ns"));
  r = Ctl({"config", "history", "exp-hist", "--format", "jsonl"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ExpectGolden("config_history_jsonl.txt",
               std::regex_replace(r.out, std::regex(R"("updated_ns":\d+)"), "\"updated_ns\":<ns>"));
  r = Ctl({"runs", "--format", "jsonl"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ExpectGolden("runs_jsonl.txt",
               std::regex_replace(r.out, std::regex(R"("last_seen_ns":\d+)"), "\"last_seen_ns\":<ns>"));
  r = Ctl({"health"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "SERVING\n");
}

TEST_F(Gacctl, RunsShowsAgeFromTheServersReceiveTime) {
  // The masked goldens leave the age out: it is the time since gacd
  // received the run's last record, as gacd reports it.
  v1::ListRunsResponse runs;
  ASSERT_TRUE(Reader().ListRuns(v1::ListRunsRequest(), &runs).ok());
  const Result r = Ctl({"runs", "--format", "csv"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = CsvRows(r.out);
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(runs.runs_size()));
  for (int i = 0; i < runs.runs_size(); ++i) {
    EXPECT_EQ(rows[i].at("run").value_or(""), runs.runs(i).run());
    EXPECT_EQ(Int(rows[i].at("last_seen_ns")), runs.runs(i).last_seen_ns());
    EXPECT_EQ(Int(rows[i].at("step_records")), static_cast<std::int64_t>(runs.runs(i).step_records()));
  }
}

// ---- m_t ----

// m_t recomputed here from the definition docs/GACD.md gives: per rank, the
// mean of the last `w` c_t of its valid steps (regime not invalid, c_t
// present) up to and including each record; absent before the rank has `w`.
// `stored` in (step, rank) order. Keyed by (step, rank).
std::map<std::pair<std::int64_t, std::uint32_t>, std::optional<double>> ReferenceWindowMeans(
    const std::vector<v1::StepRecord>& stored, std::size_t w) {
  std::map<std::uint32_t, std::vector<double>> cosines;
  std::map<std::pair<std::int64_t, std::uint32_t>, std::optional<double>> out;
  for (const v1::StepRecord& r : stored) {
    std::vector<double>& c = cosines[r.rank()];
    if (r.has_cosine() && r.regime() != v1::REGIME_INVALID) c.push_back(r.cosine());
    std::optional<double> m;
    if (c.size() >= w) {
      long double sum = 0;
      for (std::size_t i = c.size() - w; i < c.size(); ++i) sum += c[i];
      m = static_cast<double>(sum / static_cast<long double>(w));
    }
    out[{r.step(), r.rank()}] = m;
  }
  return out;
}

// Each row's window_mean against the reference; returns how many were set.
int ExpectWindowMeans(const std::vector<Row>& rows,
                      const std::map<std::pair<std::int64_t, std::uint32_t>, std::optional<double>>& want,
                      const std::string& what) {
  int set = 0;
  for (const Row& row : rows) {
    const std::pair<std::int64_t, std::uint32_t> key{Int(row.at("step")), static_cast<std::uint32_t>(Int(row.at("rank")))};
    const std::string where = what + " step " + std::to_string(key.first) + " rank " + std::to_string(key.second);
    const auto it = want.find(key);
    if (it == want.end()) {
      ADD_FAILURE() << where << ": not a stored record";
      continue;
    }
    const auto cell = row.find("window_mean");
    if (cell == row.end()) {
      ADD_FAILURE() << where << ": no window_mean";
      continue;
    }
    EXPECT_EQ(cell->second.has_value(), it->second.has_value()) << where << ": " << cell->second.value_or("null");
    if (cell->second && it->second) {
      EXPECT_NEAR(std::strtod(cell->second->c_str(), nullptr), *it->second, 1e-15) << where;
      ++set;
    }
  }
  return set;
}

// ---- round trips ----

TEST_F(Gacctl, CsvAndJsonlCarryEveryStoredFieldExactly) {
  std::vector<v1::StepRecord> stored;
  ASSERT_TRUE(Reader().AllSteps("exp-spike", &stored, /*include_layers=*/true).ok());
  ASSERT_EQ(stored.size(), 2u * 299u);

  std::vector<std::string> header;
  Result r = Ctl({"steps", "exp-spike", "--format", "csv"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<Row> rows = CsvRows(r.out, &header);
  ASSERT_EQ(rows.size(), stored.size());
  const std::vector<std::string> fixed = {"run",       "step",         "rank",  "world_size", "wall_time_ns",
                                          "mode",      "regime",       "cosine", "cosine_after", "alpha",
                                          "grad_norm", "ref_norm",     "staleness", "fallback",
                                          "agent_overhead_seconds", "c_low", "c_high", "trigger", "window",
                                          "window_c_low", "window_c_high", "grad_norm_z", "loss_z", "policy_tokens",
                                          "ess_token", "ess_sequence", "clip_fraction_low", "clip_fraction_high",
                                          "truncation_fraction", "log_ratio_max", "log_ratio_p99", "log_ratio_p1",
                                          "kl_k3", "log_ratio_abs_mean", "entropy_mean", "staleness_min",
                                          "staleness_mean", "staleness_max", "policy_invalid", "window_mean"};
  // The documented column order: the fixed columns, the scalars by name, other_scalars.
  EXPECT_EQ(std::vector<std::string>(header.begin(), header.begin() + static_cast<std::ptrdiff_t>(fixed.size())), fixed);
  EXPECT_EQ(std::vector<std::string>(header.begin() + static_cast<std::ptrdiff_t>(fixed.size()), header.end()),
            (std::vector<std::string>{"scalar.entropy", "scalar.kl", "scalar.loss", "scalar.reward", "other_scalars"}));
  for (std::size_t i = 0; i < rows.size(); ++i) ExpectStepRow(rows[i], stored[i], CsvScalars(rows[i]));
  // m_t with the default window of 20: steps 0 and 150 have no cosine, so
  // every row from step 20 on has one (step 160 is missing).
  const auto means = ReferenceWindowMeans(stored, 20);
  EXPECT_EQ(ExpectWindowMeans(rows, means, "csv"), 2 * (280 - 1));

  // Scalars outside the chosen columns arrive in other_scalars.
  r = Ctl({"steps", "exp-spike", "--format", "csv", "--scalars", "reward,eval"});
  ASSERT_EQ(r.rc, 0) << r.err;
  rows = CsvRows(r.out, &header);
  ASSERT_EQ(rows.size(), stored.size());
  EXPECT_EQ(header.back(), "other_scalars");
  EXPECT_EQ(header[header.size() - 3], "scalar.reward");
  EXPECT_EQ(header[header.size() - 2], "scalar.eval");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    ASSERT_TRUE(rows[i].at("other_scalars").has_value());
    EXPECT_FALSE(rows[i].at("scalar.eval").has_value());
    ExpectStepRow(rows[i], stored[i], CsvScalars(rows[i]));
  }

  r = Ctl({"steps", "exp-spike", "--format", "jsonl"});
  ASSERT_EQ(r.rc, 0) << r.err;
  rows = JsonlRows(r.out);
  ASSERT_EQ(rows.size(), stored.size());
  for (std::size_t i = 0; i < rows.size(); ++i) ExpectStepRow(rows[i], stored[i], JsonScalars(rows[i]));
  ExpectWindowMeans(rows, means, "jsonl");

  // Layers, in both formats.
  std::vector<std::tuple<std::int64_t, std::uint32_t, v1::LayerRecord>> layers;
  for (const auto& s : stored) {
    for (const auto& l : s.layers()) layers.emplace_back(s.step(), s.rank(), l);
  }
  ASSERT_GT(layers.size(), 2000u);
  for (const char* format : {"csv", "jsonl"}) {
    r = Ctl({"steps", "exp-spike", "--layers", "--format", format});
    ASSERT_EQ(r.rc, 0) << r.err;
    rows = std::string(format) == "csv" ? CsvRows(r.out) : JsonlRows(r.out);
    ASSERT_EQ(rows.size(), layers.size()) << format;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& [step, rank, l] = layers[i];
      const std::string what = std::string(format) + " layer row " + std::to_string(i);
      EXPECT_EQ(rows[i].at("run").value_or(""), "exp-spike") << what;
      EXPECT_EQ(Int(rows[i].at("step")), step) << what;
      EXPECT_EQ(Int(rows[i].at("rank")), rank) << what;
      EXPECT_EQ(rows[i].at("layer").value_or(""), l.name()) << what;
      ExpectOptionalReal(rows[i].at("cosine"), l.has_cosine(), l.cosine(), what);
      EXPECT_EQ(Real(rows[i].at("grad_norm")), l.grad_norm()) << what;
      EXPECT_EQ(Real(rows[i].at("ref_norm")), l.ref_norm()) << what;
    }
  }

  // A range of one rank.
  r = Ctl({"steps", "exp-spike", "--start-step", "155", "--end-step", "166", "--rank", "1", "--format", "csv"});
  ASSERT_EQ(r.rc, 0) << r.err;
  rows = CsvRows(r.out);
  std::vector<v1::StepRecord> want;
  for (const auto& s : stored) {
    if (s.rank() == 1 && s.step() >= 155 && s.step() <= 165) want.push_back(s);
  }
  ASSERT_EQ(rows.size(), want.size());
  ASSERT_EQ(rows.size(), 10u);  // step 160 is missing
  for (std::size_t i = 0; i < rows.size(); ++i) ExpectStepRow(rows[i], want[i], CsvScalars(rows[i]));
  // Its m_t reads the rank's cosines before step 155.
  EXPECT_EQ(ExpectWindowMeans(rows, means, "range"), 10);
}

TEST_F(Gacctl, CsvLoadsInPandasAsIs) {
  const Result csv = Ctl({"steps", "exp-spike", "--format", "csv"});
  const Result jsonl = Ctl({"steps", "exp-spike", "--format", "jsonl"});
  ASSERT_EQ(csv.rc, 0);
  ASSERT_EQ(jsonl.rc, 0);
  WriteFile(dir_->File("steps.csv"), csv.out);
  WriteFile(dir_->File("steps.jsonl"), jsonl.out);
  std::string out;
  const int rc = RunProcess({GAC_TEST_PYTHON, std::string(GAC_CLI_TEST_DIR) + "/check_pandas.py",
                             dir_->File("steps.csv"), dir_->File("steps.jsonl")},
                            "", &out);
  if (rc == 77) GTEST_SKIP() << out;
  EXPECT_EQ(rc, 0) << out;
  std::cout << out;
}

// m_t of gacctl steps and of gacd's HTTP steps against the reference and
// against gac_window_mean, on a gacd of its own (the suite's has no HTTP
// port): a run of W = 5 whose c_t change sign, with steps without a cosine,
// invalid steps and a missing step; listed whole, from inside the run, and
// in pages smaller than the window.
TEST_F(Gacctl, StepsWindowMeanIsTheMeanOfTheLastWStoredCosines) {
  ScratchDir own_dir;
  GacdProcess gacd({"--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--store=memory",
                    "--token-file=" + WriteTestTokens(own_dir)});
  ASSERT_TRUE(gacd.Start(own_dir.File("ready"))) << gacd.error();
  const std::string run = "exp-window";
  Client admin(gacd.address(), kAdminToken);
  v1::SetRunConfigRequest set;
  set.set_run(run);
  set.set_window(5);
  v1::RunConfig config;
  ASSERT_TRUE(admin.SetRunConfig(set, &config).ok());
  std::vector<v1::StepRecord> stored;
  for (int step = 0; step < 40; ++step) {
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
      if (step == 17 && rank == 1) continue;  // never stored
      // c_t in [-0.6, 0.6], changing sign from step to step.
      const double c = static_cast<double>((step * 7 + static_cast<int>(rank) * 3) % 13 - 6) / 10.0;
      v1::StepRecord r = MakeStep(run, step, step == 0 || (step % 6 == 2 && rank == 0) ? NAN : c, rank, 2);
      if (step % 9 == 4) {
        r.set_regime(v1::REGIME_INVALID);
        r.clear_cosine();
      }
      stored.push_back(r);
    }
  }
  ASSERT_TRUE(Feed(admin, stored).ok());
  const auto w5 = ReferenceWindowMeans(stored, 5);
  const std::map<std::string, std::string> env = {{"GAC_ADDRESS", gacd.address()}, {"GAC_TOKEN", kReaderToken}};
  auto ctl = [&](const std::vector<std::string>& args) {
    const Result r = RunCommand(*dir_, Argv(args), env);
    EXPECT_EQ(r.rc, 0) << r.err;
    return r;
  };

  // The whole run, in pages of 3 records: windows cross every page.
  std::vector<Row> rows = CsvRows(ctl({"steps", run, "--format", "csv", "--page-size", "3"}).out);
  ASSERT_EQ(rows.size(), stored.size());
  const int all_set = ExpectWindowMeans(rows, w5, "csv");
  // Rank 0 holds 5 cosines from step 7 on (none at steps 0, 2 and 4), rank 1
  // from step 6 (none at 0 and 4); invalid steps later keep the window.
  EXPECT_EQ(all_set, static_cast<int>(stored.size()) - 7 - 6);
  // From inside the run: the windows start from the records before step 23.
  rows = JsonlRows(ctl({"steps", run, "--format", "jsonl", "--start-step", "23", "--page-size", "4"}).out);
  ASSERT_EQ(rows.size(), 2u * 17u);
  EXPECT_EQ(ExpectWindowMeans(rows, w5, "jsonl from 23"), 34);
  rows = CsvRows(ctl({"steps", run, "--format", "csv", "--start-step", "5", "--end-step", "12", "--rank", "1"}).out);
  ASSERT_EQ(rows.size(), 7u);
  ExpectWindowMeans(rows, w5, "rank 1 from 5");
  // The table has the column.
  const std::string table = ctl({"steps", run, "--end-step", "2"}).out;
  EXPECT_NE(table.find(" M_T "), std::string::npos) << table;

  // The HTTP API gives the same values, page by page.
  auto http_rows = [&](const std::string& query) {
    std::vector<Row> out;
    std::string token;
    int pages = 0;
    do {
      auto reply = HttpFetch(gacd.metrics_address(), "GET",
                             "/api/v1/runs/" + run + "/steps?" + query + (token.empty() ? "" : "&page_token=" + token),
                             {std::string("Authorization: Bearer ") + kReaderToken});
      EXPECT_TRUE(reply.has_value());
      if (!reply) break;
      EXPECT_EQ(reply->status, 200) << reply->body;
      const google::protobuf::Value v = ParseJson(reply->body);
      for (const google::protobuf::Value& step : JsonMember(v, "steps").list_value().values()) {
        Row row;
        row["step"] = std::to_string(static_cast<std::int64_t>(JsonMember(step, "step").number_value()));
        row["rank"] = std::to_string(static_cast<std::int64_t>(JsonMember(step, "rank").number_value()));
        const google::protobuf::Value& m = JsonMember(step, "window_mean");
        EXPECT_TRUE(m.kind_case() == google::protobuf::Value::kNumberValue ||
                    m.kind_case() == google::protobuf::Value::kNullValue) << query;
        if (m.kind_case() == google::protobuf::Value::kNumberValue) row["window_mean"] = cli::FormatExact(m.number_value());
        if (m.kind_case() == google::protobuf::Value::kNullValue) row["window_mean"] = std::nullopt;
        out.push_back(std::move(row));
      }
      token = JsonMember(v, "next_page_token").string_value();
    } while (!token.empty() && ++pages < 100);
    return out;
  };
  rows = http_rows("page_size=3");
  ASSERT_EQ(rows.size(), stored.size());
  EXPECT_EQ(ExpectWindowMeans(rows, w5, "http"), all_set);
  rows = http_rows("start_step=23&rank=1&page_size=2");
  ASSERT_EQ(rows.size(), 17u);
  EXPECT_EQ(ExpectWindowMeans(rows, w5, "http rank 1 from 23"), 17);

  // gacctl tail gives the same m_t: rank 0's whole run, and rank 1's last 12
  // records (whose windows start from the records before them).
  auto tail_rows = [&](const std::vector<std::string>& args, const char* rank) {
    std::vector<Row> out = CsvRows(ctl(args).out);
    for (Row& row : out) row["rank"] = rank;
    return out;
  };
  rows = tail_rows({"tail", run, "-n", "40", "--format", "csv"}, "0");
  ASSERT_EQ(rows.size(), 40u);
  EXPECT_EQ(ExpectWindowMeans(rows, w5, "tail rank 0"), 40 - 7);
  rows = tail_rows({"tail", run, "--rank", "1", "-n", "12", "--format", "csv"}, "1");
  ASSERT_EQ(rows.size(), 12u);
  EXPECT_EQ(ExpectWindowMeans(rows, w5, "tail rank 1"), 12);
  EXPECT_NE(ctl({"tail", run, "-n", "1"}).out.find(" M_T "), std::string::npos);

  // gac_window_mean is m_t of each rank's last step.
  const std::optional<std::string> metrics = HttpGet(gacd.metrics_address(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  for (const std::uint32_t rank : {0u, 1u}) {
    const std::regex line("\ngac_window_mean\\{rank=\"" + std::to_string(rank) + "\",run=\"" + run + "\"\\} (\\S+)\n");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(*metrics, m, line)) << rank;
    const std::optional<double> want = w5.at({39, rank});
    ASSERT_TRUE(want.has_value());
    EXPECT_NEAR(std::strtod(m[1].str().c_str(), nullptr), *want, 1e-15) << rank;
  }

  // A window changed later applies to every listed step, as now set.
  set.set_window(3);
  ASSERT_TRUE(admin.SetRunConfig(set, &config).ok());
  rows = CsvRows(ctl({"steps", run, "--format", "csv", "--start-step", "10", "--page-size", "5"}).out);
  ASSERT_EQ(rows.size(), 2u * 30u - 1u);
  EXPECT_EQ(ExpectWindowMeans(rows, ReferenceWindowMeans(stored, 3), "csv, W = 3"),
            ExpectWindowMeans(http_rows("start_step=10&page_size=5"), ReferenceWindowMeans(stored, 3), "http, W = 3"));
}

TEST_F(Gacctl, InProcessTheLibraryGivesTheProgramsOutput) {
  // gac::cli runs the same commands without a process.
  cli::Environment env;
  env.getenv = [](const std::string& name) -> std::optional<std::string> {
    if (name == "GAC_ADDRESS") return gacd_->address();
    if (name == "GAC_TOKEN") return std::string(kReaderToken);
    return std::nullopt;
  };
  std::ostringstream out, err;
  const std::vector<std::string> args = {"steps", "exp-golden", "--format", "csv"};
  EXPECT_EQ(cli::RunGacctl(args, env, out, err), 0) << err.str();
  EXPECT_EQ(out.str(), Ctl(args).out);
  // An age measured from the clock the caller gives.
  env.now = [] { return std::chrono::system_clock::time_point(std::chrono::hours(24 * 365 * 100)); };
  std::ostringstream runs;
  EXPECT_EQ(cli::RunGacctl({"show", "exp-golden"}, env, runs, err), 0);
  v1::GetRunSummaryRequest req;
  req.set_run("exp-golden");
  v1::RunSummary summary;
  ASSERT_TRUE(Reader().GetRunSummary(req, &summary).ok());
  const std::int64_t age_ns = std::int64_t{24} * 365 * 100 * 3600 * 1000000000 - summary.info().last_seen_ns();
  EXPECT_NE(runs.str().find("(" + cli::FormatAge(age_ns) + " ago)"), std::string::npos) << runs.str();
}

// Each field of the record schema is a column of gacctl tail (its help
// lists them: "  name [HEADER]: help") or is left out here with the reason;
// a field added to the schema, or a column that names no field, fails here
// until that is decided. Besides the fields: m_t and the scalar "reward".
TEST(GacctlTail, EveryFieldIsAColumnOrSaysWhyNot) {
  const std::map<std::string, std::string> not_in_tail = {
      {"rank", "tail follows one rank (--rank)"},
      {"world_size", "constant over a run: gacctl runs"},
      {"ref_norm", "|p| is the previous step's |g|, one row up"},
      {"cosine_after", "tail is one line per step: gacctl steps has it"},
      {"wall_time_ns", "tail prints as steps arrive"},
      {"agent_overhead_seconds", "gacctl steps"},
      {"mode", "constant over a run: gacctl runs (MODE)"},
      {"fallback", "gacctl steps"},
      {"c_low", "the rule: gacctl steps and gacctl config get"},
      {"c_high", "the rule: gacctl steps"},
      {"trigger", "the rule: gacctl steps"},
      {"window", "the rule: gacctl steps"},
      {"window_c_low", "the rule: gacctl steps"},
      {"window_c_high", "the rule: gacctl steps"},
      {"loss_z", "the spike guard's loss z-score: gacctl steps (tail shows the regime and |g|'s z)"},
      {"policy_tokens", "policy health: tail shows ESS and KL, gacctl steps every signal"},
      {"ess_sequence", "policy health: gacctl steps"},
      {"clip_fraction_low", "policy health: gacctl steps"},
      {"clip_fraction_high", "policy health: gacctl steps"},
      {"truncation_fraction", "policy health: gacctl steps"},
      {"log_ratio_max", "policy health: gacctl steps"},
      {"log_ratio_p99", "policy health: gacctl steps"},
      {"log_ratio_p1", "policy health: gacctl steps"},
      {"log_ratio_abs_mean", "policy health: gacctl steps"},
      {"entropy_mean", "policy health: gacctl steps"},
      {"staleness_min", "policy health: gacctl steps (tail shows the configured staleness)"},
      {"staleness_mean", "policy health: gacctl steps"},
      {"staleness_max", "policy health: gacctl steps"},
      {"policy_invalid", "policy health: gacctl steps; tail's ESS and KL are empty then"},
  };
  std::ostringstream out, err;
  ASSERT_EQ(cli::RunGacctl({"tail", "--help"}, cli::Environment{}, out, err), 0) << err.str();
  std::set<std::string> columns;
  const std::regex column(R"(\n  ([a-z0-9_]+) \[[^\]]+\]: )");
  const std::string help = out.str();
  for (auto it = std::sregex_iterator(help.begin(), help.end(), column); it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(columns.insert((*it)[1].str()).second) << (*it)[1].str();
  }
  EXPECT_EQ(columns.count("window_mean") + columns.count("reward"), 2u) << help;
  for (const proto::StepField& f : proto::kStepFields) {
    EXPECT_NE(columns.count(f.name) == 1, not_in_tail.count(f.name) == 1)
        << f.name << ": give it a tail column (cli/src/step_commands.cc), or say in not_in_tail why not";
  }
  EXPECT_EQ(columns.size(), proto::kStepFieldCount - not_in_tail.size() + 2) << help;
}

// ---- tail -f ----

TEST_F(Gacctl, TailFollowsStepsSentAfterItStarted) {
  Client writer(gacd_->address(), kWriterToken);
  SyntheticRunOptions o;
  o.run = "exp-live";
  o.world = 1;
  o.layers = 0;
  const std::vector<v1::StepRecord> records = SyntheticRecords(o, 10);
  // A window of 3, so that m_t is set on most printed steps.
  Client admin(gacd_->address(), kAdminToken);
  v1::SetRunConfigRequest set;
  set.set_run(o.run);
  set.set_window(3);
  v1::RunConfig config;
  ASSERT_TRUE(admin.SetRunConfig(set, &config).ok());
  ASSERT_TRUE(Feed(writer, {records.begin(), records.begin() + 5}).ok());

  const std::string out = dir_->File("tail.out"), err = dir_->File("tail.err");
  const pid_t pid = Spawn(Argv({"tail", "exp-live", "-f", "-n", "3", "--interval", "50ms", "--format", "csv"}),
                          Env(kReaderToken), out, err);
  ASSERT_GT(pid, 0);
  // Waits (bounded) until the output holds `line`.
  auto await = [&](const std::string& line) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Slurp(out).find(line) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  EXPECT_TRUE(await("\n4,")) << Slurp(out) << Slurp(err);
  // Sent after tail started: one batch, then another.
  ASSERT_TRUE(Feed(writer, {records.begin() + 5, records.begin() + 7}).ok());
  EXPECT_TRUE(await("\n6,")) << Slurp(out) << Slurp(err);
  ASSERT_TRUE(Feed(writer, {records.begin() + 7, records.end()}).ok());
  EXPECT_TRUE(await("\n9,")) << Slurp(out) << Slurp(err);
  kill(pid, SIGINT);
  EXPECT_EQ(WaitExit(pid), 0) << Slurp(err);
  EXPECT_EQ(Slurp(err), "");
  // Each step once, in order: the last 3 before it started, then the new ones.
  auto rows = CsvRows(Slurp(out));
  ASSERT_EQ(rows.size(), 8u) << Slurp(out);
  // m_t of the steps printed before and while following.
  const auto means = ReferenceWindowMeans(records, 3);
  int want_set = 0;
  for (Row& row : rows) {
    row["rank"] = "0";
    want_set += means.at({Int(row.at("step")), 0u}).has_value() ? 1 : 0;
  }
  EXPECT_GE(want_set, 6);
  EXPECT_EQ(ExpectWindowMeans(rows, means, "tail -f"), want_set);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const v1::StepRecord& want = records[i + 2];
    EXPECT_EQ(Int(rows[i].at("step")), want.step());
    ExpectOptionalReal(rows[i].at("cosine"), want.has_cosine(), want.cosine(), "c_t");
    EXPECT_EQ(rows[i].at("regime").value_or(""), RegimeText(want.regime()));
    EXPECT_EQ(Real(rows[i].at("alpha")), want.alpha());
    EXPECT_EQ(Real(rows[i].at("grad_norm")), want.grad_norm());
    EXPECT_EQ(Int(rows[i].at("staleness")), want.staleness());
    EXPECT_EQ(Real(rows[i].at("reward")), want.scalars().at("reward"));
  }
}

TEST_F(Gacctl, TailWaitsForARunThatHasNotReportedYet) {
  const std::string out = dir_->File("wait.out"), err = dir_->File("wait.err");
  const pid_t pid = Spawn(Argv({"tail", "exp-later", "-f", "--interval", "50ms"}), Env(kReaderToken), out, err);
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Slurp(err).find("waiting for run 'exp-later'") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Client writer(gacd_->address(), kWriterToken);
  ASSERT_TRUE(writer.Ingest({MakeBatch(1, {MakeStep("exp-later", 0, 0.02), MakeStep("exp-later", 1, 0.5)})}).ok());
  while (Slurp(out).find("0.5") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid), 0);
  // MakeStep records every step as safe; the line shows what is stored.
  const std::string text = Slurp(out);
  EXPECT_NE(text.find("0.02"), std::string::npos) << text;
  EXPECT_NE(text.find("0.5"), std::string::npos) << text;
}

// ---- settings ----

TEST_F(Gacctl, ConfigSetWithAStaleExpectedVersionIsAbortedAndChangesNothing) {
  Result r = Ctl({"config", "set", "exp-cfg", "--c-low", "0.04", "--reason", "first"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "exp-cfg: settings version 1: c_low 0.04, c_high 0.3, alpha paper, mode local\n");
  r = Ctl({"config", "set", "exp-cfg", "--mode", "remote", "--reason", "second", "--expected-version", "1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "exp-cfg: settings version 2: c_low 0.04, c_high 0.3, alpha paper, mode remote\n");
  r = Ctl({"config", "set", "exp-cfg", "--c-high", "0.5", "--reason", "stale", "--expected-version", "1"});
  ExpectOneLineError(r, 1, "ABORTED: ", "stale version");
  v1::RunConfig cfg;
  ASSERT_TRUE(Admin().GetRunConfig("exp-cfg", &cfg).ok());
  EXPECT_EQ(cfg.version(), 2u);
  EXPECT_EQ(cfg.thresholds().c_high(), 0.3);

  // gacd's validation error, as gacd words it.
  v1::SetRunConfigRequest bad;
  bad.set_run("exp-cfg");
  bad.mutable_thresholds()->set_c_low(0.5);
  bad.mutable_thresholds()->set_c_high(0.2);
  bad.set_mode(v1::CONTROL_MODE_REMOTE);
  v1::RunConfig ignored;
  const grpc::Status direct = Admin().SetRunConfig(bad, &ignored);
  ASSERT_EQ(direct.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Ctl({"config", "set", "exp-cfg", "--c-low", "0.5", "--c-high", "0.2", "--reason", "bad"});
  ExpectOneLineError(r, 1, "INVALID_ARGUMENT", "thresholds");
  EXPECT_EQ(r.err, "gacctl: INVALID_ARGUMENT: " + direct.error_message() + "\n");

  // The audit log: who, before -> after, why.
  r = Ctl({"config", "history", "exp-cfg", "--format", "csv"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = CsvRows(r.out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].at("version").value_or(""), "2");
  EXPECT_EQ(rows[1].at("updated_by").value_or(""), "admin");
  EXPECT_EQ(rows[1].at("before_mode").value_or(""), "local");
  EXPECT_EQ(rows[1].at("mode").value_or(""), "remote");
  EXPECT_EQ(rows[1].at("reason").value_or(""), "second");
  EXPECT_EQ(Int(rows[1].at("updated_ns")), static_cast<std::int64_t>(cfg.updated_ns()));
  r = Ctl({"config", "history", "exp-cfg"});
  EXPECT_NE(r.out.find("mode local -> remote"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("c_low 0.05 -> 0.04"), std::string::npos) << r.out;
}

TEST_F(Gacctl, ConfigSetNeedsAdminRights) {
  ExpectOneLineError(Ctl({"config", "set", "exp-cfg2", "--c-low", "0.04", "--reason", "x"}, kReaderToken), 1,
                     "PERMISSION_DENIED", "reader token");
}

// ---- replay against a recomputation ----

struct Expected {
  std::uint64_t counts[4] = {};
  std::optional<std::int64_t> first_project, first_skip;
  std::uint64_t longest = 0;
  std::optional<std::int64_t> longest_first;
  std::uint64_t differing = 0;
  double alpha_sum = 0;
};

// The rules of docs/ALGORITHM.md on the recorded c_t, written out here.
Expected Recompute(const std::vector<v1::StepRecord>& rank0, double lo, double hi, bool exact,
                   std::vector<std::pair<std::string, double>>* per_step = nullptr) {
  Expected e;
  std::uint64_t run = 0;
  std::int64_t run_first = 0, prev = -2;
  for (const v1::StepRecord& r : rank0) {
    std::string regime = "safe";
    double alpha = 1;
    if (r.regime() == v1::REGIME_INVALID) {
      regime = "invalid";
    } else if (r.has_cosine()) {
      const double a = std::fabs(r.cosine());
      if (a >= hi) {
        regime = "skip";
      } else if (a > lo) {
        regime = "project";
        const double c = r.cosine();
        alpha = exact ? lo * std::sqrt(1 - c * c) / (a * std::sqrt(1 - lo * lo)) : lo / a;
      }
    }
    const int idx = regime == "safe" ? 0 : regime == "project" ? 1 : regime == "skip" ? 2 : 3;
    ++e.counts[idx];
    if (idx == 1) {
      e.alpha_sum += alpha;
      if (!e.first_project) e.first_project = r.step();
    }
    if (idx == 2) {
      if (!e.first_skip) e.first_skip = r.step();
      if (run > 0 && prev + 1 == r.step()) {
        ++run;
      } else {
        run = 1;
        run_first = r.step();
      }
      if (run > e.longest) {
        e.longest = run;
        e.longest_first = run_first;
      }
    } else {
      run = 0;
    }
    prev = r.step();
    if (regime != RegimeText(r.regime())) ++e.differing;
    if (per_step != nullptr) per_step->emplace_back(regime, alpha);
  }
  return e;
}

void ExpectOptionalInt(const std::optional<std::string>& v, const std::optional<std::int64_t>& want,
                       const std::string& what) {
  EXPECT_EQ(v.has_value(), want.has_value()) << what;
  if (v && want) {
    EXPECT_EQ(std::stoll(*v), *want) << what;
  }
}

TEST_F(Gacctl, ReplayMatchesAnIndependentRecomputation) {
  const std::vector<v1::StepRecord> rank0 = Rank0("exp-spike");
  ASSERT_EQ(rank0.size(), 299u);
  for (const bool exact : {false, true}) {
    for (const auto& [from, to] : {std::pair<int, int>{-1, -1}, std::pair<int, int>{120, 200}}) {
      std::vector<std::string> args = {"replay", "exp-spike", "--grid", "--c-low", "0.03,0.05,0.1,0.2",
                                       "--c-high", "0.2,0.3,0.55,1", "--format", "csv"};
      if (exact) args.insert(args.end(), {"--alpha-mode", "exact"});
      std::vector<v1::StepRecord> range;
      for (const auto& r : rank0) {
        if (from < 0 || (r.step() >= from && r.step() <= to)) range.push_back(r);
      }
      if (from >= 0) args.insert(args.end(), {"--start-step", std::to_string(from), "--end-step", std::to_string(to + 1)});
      const Result r = Ctl(args);
      ASSERT_EQ(r.rc, 0) << r.err;
      const auto rows = CsvRows(r.out);
      ASSERT_EQ(rows.size(), 4u * 4u - 1u);  // every pair but (0.2, 0.2)
      for (const Row& row : rows) {
        const double lo = Real(row.at("c_low")), hi = Real(row.at("c_high"));
        const std::string what = "c_low " + std::to_string(lo) + " c_high " + std::to_string(hi) +
                                 (exact ? " exact" : " paper") + " from " + std::to_string(from);
        const Expected e = Recompute(range, lo, hi, exact);
        EXPECT_EQ(Int(row.at("steps")), static_cast<std::int64_t>(range.size())) << what;
        EXPECT_EQ(Int(row.at("safe")), static_cast<std::int64_t>(e.counts[0])) << what;
        EXPECT_EQ(Int(row.at("project")), static_cast<std::int64_t>(e.counts[1])) << what;
        EXPECT_EQ(Int(row.at("skip")), static_cast<std::int64_t>(e.counts[2])) << what;
        EXPECT_EQ(Int(row.at("invalid")), static_cast<std::int64_t>(e.counts[3])) << what;
        ExpectOptionalInt(row.at("first_project"), e.first_project, what + " first_project");
        ExpectOptionalInt(row.at("first_skip"), e.first_skip, what + " first_skip");
        EXPECT_EQ(Int(row.at("longest_skip")), static_cast<std::int64_t>(e.longest)) << what;
        ExpectOptionalInt(row.at("longest_skip_first"), e.longest_first, what + " longest_skip_first");
        EXPECT_EQ(Int(row.at("differing")), static_cast<std::int64_t>(e.differing)) << what;
        if (e.counts[1] > 0) {
          EXPECT_NEAR(Real(row.at("mean_project_alpha")), e.alpha_sum / static_cast<double>(e.counts[1]), 1e-12)
              << what;
        }
        // The thresholds the run was recorded with: nothing differs.
        if (lo == 0.05 && hi == 0.3 && from < 0) {
          EXPECT_EQ(e.differing, 0u) << what;
        }
      }
    }
  }
  // The summary with the recorded thresholds says so, and so does --steps.
  Result r = Ctl({"replay", "exp-spike", "--c-low", "0.05", "--c-high", "0.3"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\nsteps whose regime differs from the recorded one: 0\n"), std::string::npos) << r.out;
  // Step by step with other thresholds: regime and alpha of every step.
  std::vector<std::pair<std::string, double>> per_step;
  Recompute(rank0, 0.1, 0.4, true, &per_step);
  r = Ctl({"replay", "exp-spike", "--c-low", "0.1", "--c-high", "0.4", "--alpha-mode", "exact", "--steps",
           "--format", "jsonl"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = JsonlRows(r.out);
  ASSERT_EQ(rows.size(), rank0.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(Int(rows[i].at("step")), rank0[i].step());
    EXPECT_EQ(rows[i].at("recorded_regime").value_or(""), RegimeText(rank0[i].regime()));
    EXPECT_EQ(rows[i].at("regime").value_or(""), per_step[i].first) << "step " << rank0[i].step();
    EXPECT_NEAR(Real(rows[i].at("alpha")), per_step[i].second, 1e-15) << "step " << rank0[i].step();
    EXPECT_EQ(rows[i].at("differs").value_or(""),
              per_step[i].first == RegimeText(rank0[i].regime()) ? "false" : "true");
  }
}

// ---- calibration ----

struct Suggestion {
  double q90, max, c_low, c_high;
};

// The statistics of `abs` (values of |c| or |m|) and the thresholds gacctl
// calibrate suggests from them, computed here by the documented rule.
Suggestion Suggest(std::vector<double> abs) {
  std::sort(abs.begin(), abs.end());
  const double pos = 0.9 * static_cast<double>(abs.size() - 1);
  const std::size_t k = static_cast<std::size_t>(pos);
  const double q90 = abs[k] + (pos - static_cast<double>(k)) * (abs[k + 1] - abs[k]);
  const double max = abs.back();
  const double scale = std::pow(10.0, 2 - std::floor(std::log10(q90)));
  const double c_low = std::ceil(q90 * scale - 1e-9) / scale;
  return {q90, max, c_low, std::min(1.0, std::max(3 * max, 2 * c_low))};
}

TEST_F(Gacctl, CalibrateSuggestsFromTheStatisticsAndAppliesThem) {
  // The statistics of the last 150 steps of rank 0, computed here.
  std::vector<v1::StepRecord> rank0 = Rank0("exp-sync");
  ASSERT_EQ(rank0.size(), 200u);
  std::vector<double> abs;
  for (std::size_t i = rank0.size() - 150; i < rank0.size(); ++i) {
    if (rank0[i].has_cosine()) abs.push_back(std::fabs(rank0[i].cosine()));
  }
  const auto [q90, max, c_low, c_high] = Suggest(abs);

  Result r = Ctl({"calibrate", "exp-sync", "--window", "150"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(suggested +c_low (\S+), c_high (\S+)\n)"))) << r.out;
  EXPECT_DOUBLE_EQ(std::strtod(m[1].str().c_str(), nullptr), c_low);
  EXPECT_DOUBLE_EQ(std::strtod(m[2].str().c_str(), nullptr), c_high);
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(q0\.9 \|c_t\| +(\S+)\n)"))) << r.out;
  // Shown with 6 significant digits.
  EXPECT_NEAR(std::strtod(m[1].str().c_str(), nullptr), q90, 5e-6 * q90);
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(max \|c_t\| +(\S+)\n)"))) << r.out;
  EXPECT_NEAR(std::strtod(m[1].str().c_str(), nullptr), max, 5e-6 * max);

  r = Ctl({"calibrate", "exp-sync", "--window", "150", "--apply", "--apply-to", "exp-target", "--mode", "remote"});
  ASSERT_EQ(r.rc, 0) << r.err;
  v1::RunConfig cfg;
  ASSERT_TRUE(Admin().GetRunConfig("exp-target", &cfg).ok());
  EXPECT_EQ(cfg.version(), 1u);
  EXPECT_DOUBLE_EQ(cfg.thresholds().c_low(), c_low);
  EXPECT_DOUBLE_EQ(cfg.thresholds().c_high(), c_high);
  EXPECT_EQ(cfg.mode(), v1::CONTROL_MODE_REMOTE);
  EXPECT_NE(r.out.find("applied           exp-target: settings version 1:"), std::string::npos) << r.out;
  // The audit log says where the thresholds came from.
  r = Ctl({"config", "history", "exp-target", "--format", "jsonl"});
  EXPECT_NE(r.out.find("gacctl calibrate exp-sync --window 150: q0.9"), std::string::npos) << r.out;
  // Applying again over a stale version is refused.
  // (--to, the former name of --apply-to, still works, with a note.)
  r = Ctl({"calibrate", "exp-sync", "--apply", "--to", "exp-target", "--reason", "again", "--expected-version", "7"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("ABORTED"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.rfind("gacctl: note: --to is deprecated: use --apply-to\n", 0), 0u) << r.err;

  // Too few values of c_t: the statistics, then the reason there is no suggestion.
  r = Ctl({"calibrate", "exp-sync", "--window", "10"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("values          10\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "gacctl: FAILED_PRECONDITION: calibration needs at least 20 finite values of c_t, have 10\n");
}

// The windowed calibration: |m_t| of rank 0's stored steps, m_t the mean of
// the last W valid c_t, computed here; applied with the trigger.
TEST_F(Gacctl, CalibrateWindowedSuggestsFromTheWindowedMeanAndSetsTheTrigger) {
  std::vector<v1::StepRecord> rank0 = Rank0("exp-sync");
  ASSERT_EQ(rank0.size(), 200u);
  constexpr std::size_t kW = 8;
  std::vector<double> window, abs;
  for (const v1::StepRecord& r : rank0) {
    if (!r.has_cosine() || r.regime() == v1::REGIME_INVALID) continue;
    window.push_back(r.cosine());
    if (window.size() > kW) window.erase(window.begin());
    if (window.size() == kW) {
      long double sum = 0;
      for (double c : window) sum += c;
      abs.push_back(std::fabs(static_cast<double>(sum / kW)));
    }
  }
  ASSERT_GE(abs.size(), 20u);
  const auto [q90, max, c_low, c_high] = Suggest(abs);

  Result r = Ctl({"calibrate", "exp-sync", "--windowed", "--window-steps", "8"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(suggested +window c_low (\S+), window c_high (\S+) )")))
      << r.out;
  EXPECT_DOUBLE_EQ(std::strtod(m[1].str().c_str(), nullptr), c_low);
  EXPECT_DOUBLE_EQ(std::strtod(m[2].str().c_str(), nullptr), c_high);
  EXPECT_NE(r.out.find("values          " + std::to_string(abs.size()) + "\n"), std::string::npos) << r.out;

  r = Ctl({"calibrate", "exp-sync", "--windowed", "--window-steps", "8", "--apply", "--apply-to", "exp-wtarget",
           "--trigger", "window", "--mode", "remote"});
  ASSERT_EQ(r.rc, 0) << r.err;
  v1::RunConfig cfg;
  ASSERT_TRUE(Admin().GetRunConfig("exp-wtarget", &cfg).ok());
  EXPECT_EQ(cfg.trigger(), v1::TRIGGER_WINDOW);
  EXPECT_EQ(cfg.window(), 8u);
  EXPECT_DOUBLE_EQ(cfg.window_thresholds().c_low(), c_low);
  EXPECT_DOUBLE_EQ(cfg.window_thresholds().c_high(), c_high);
  EXPECT_DOUBLE_EQ(cfg.thresholds().c_low(), 0.05);  // the per-step thresholds are kept
  EXPECT_EQ(cfg.mode(), v1::CONTROL_MODE_REMOTE);
  r = Ctl({"config", "history", "exp-wtarget"});
  EXPECT_NE(r.out.find("trigger per_step -> window"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("window 20 -> 8"), std::string::npos) << r.out;

  // config set changes the trigger alone; the rest is kept.
  r = Ctl({"config", "set", "exp-wtarget", "--trigger", "per_step", "--reason", "back"});
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_TRUE(Admin().GetRunConfig("exp-wtarget", &cfg).ok());
  EXPECT_EQ(cfg.trigger(), v1::TRIGGER_PER_STEP);
  EXPECT_EQ(cfg.window(), 8u);
  EXPECT_DOUBLE_EQ(cfg.window_thresholds().c_low(), c_low);
  // Bad values are refused before anything is sent.
  r = Ctl({"config", "set", "exp-wtarget", "--window-steps", "0", "--reason", "x"});
  EXPECT_EQ(r.rc, 2);
  r = Ctl({"config", "set", "exp-wtarget", "--trigger", "mean", "--reason", "x"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--trigger"), std::string::npos) << r.err;
  // gacd validates the window thresholds.
  r = Ctl({"config", "set", "exp-wtarget", "--window-c-low", "0.9", "--window-c-high", "0.5", "--reason", "x"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("window thresholds"), std::string::npos) << r.err;
}

// ---- errors ----

TEST_F(Gacctl, UsageErrorsAreOneLineWithStatus2) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "usage: gacctl"},
      {{"nope"}, "unknown command 'nope'"},
      {{"config"}, "expected get, set or history"},
      {{"config", "drop", "exp-golden"}, "unknown command 'config drop'"},
      {{"steps"}, "expected RUN"},
      {{"steps", "exp-golden", "extra"}, "unexpected argument 'extra'"},
      {{"steps", "exp-golden", "--frm", "1"}, "unknown flag '--frm'"},
      {{"steps", "exp-golden", "--start-step"}, "--start-step needs a value"},
      {{"steps", "exp-golden", "--start-step", "x"}, "--start-step: expected an integer, got 'x'"},
      {{"steps", "exp-golden", "--start-step", "5", "--end-step", "5"}, "--end-step 5 is not above --start-step 5"},
      {{"steps", "exp-golden", "--end-step", "0"}, "--end-step: 0 is outside"},
      {{"steps", "exp-golden", "--page-size", "0"}, "--page-size: 0 is outside"},
      {{"steps", "exp-golden", "--page-size", "10001"}, "--page-size: 10001 is outside"},
      {{"steps", "exp-golden", "--from"}, "--from needs a value"},
      {{"steps", "exp-golden", "--from", "x"}, "--from: expected an integer, got 'x'"},
      {{"steps", "exp-golden", "--from", "5", "--to", "2"}, "--to 2 is below --from 5"},
      {{"steps", "exp-golden", "--from", "5", "--start-step", "5"}, "not both"},
      {{"steps", "exp-golden", "--to", "5", "--end-step", "6"}, "not both"},
      {{"replay", "exp-golden", "--c-low", "0.05", "--c-high", "0.3", "--end-step", "-1"}, "--end-step: -1 is outside"},
      {{"steps", "exp-golden", "--format", "xml"}, "unknown format 'xml'"},
      {{"steps", "exp-golden", "--layers", "--scalars", "a"}, "--scalars does not apply"},
      {{"--format", "csv", "runs"}, "before the command"},
      {{"tail", "exp-golden", "--interval", "0"}, "--interval: expected a duration"},
      {{"tail", "exp-golden", "-n", "-1"}, "--lines: -1 is outside"},
      {{"config", "set", "exp-golden", "--c-low", "0.1"}, "--reason is required"},
      {{"config", "set", "exp-golden", "--reason", "x"}, "nothing to change"},
      {{"config", "set", "exp-golden", "--mode", "auto", "--reason", "x"}, "unknown mode 'auto'"},
      {{"config", "set", "exp-golden", "--c-low", "low", "--reason", "x"}, "--c-low: expected a number"},
      {{"calibrate", "exp-sync", "--apply"}, "--apply needs --apply-to"},
      {{"calibrate", "exp-sync", "--apply-to", "exp-x"}, "--apply-to applies only with --apply"},
      {{"calibrate", "exp-sync", "--to", "exp-x"}, "--to applies only with --apply"},
      {{"calibrate", "exp-sync", "--apply", "--to", "a", "--apply-to", "b"}, "not both"},
      {{"replay", "exp-golden"}, "--c-low and --c-high are required"},
      {{"replay", "exp-golden", "--c-low", "0.5", "--c-high", "0.2"}, "c_low must be < c_high"},
      {{"replay", "exp-golden", "--c-low", "0.05,0.1", "--c-high", "0.3"}, "needs --grid"},
      {{"replay", "exp-golden", "--grid", "--c-low", "0.5", "--c-high", "0.2,0.3"}, "no pair with c_low < c_high"},
      {{"replay", "exp-golden", "--c-low", "0.05", "--c-high", "0.3", "--format", "csv"}, "--format applies to"},
      {{"runs", "--timeout", "soon"}, "--timeout: expected a duration"},
      {{"runs", "--timeout", "100000d"}, "--timeout: expected a duration above zero and at most 1e12 ms"},
      {{"runs", "--token", "a", "--token-file", "f"}, "exclude each other"},
      {{"runs", "--token-file", "/nonexistent/token"}, "--token-file: "},
      {{"runs", "--tls-ca", "/nonexistent/ca.pem"}, "--tls-ca: "},
      {{"runs", "--tls-server-name", "gacd"}, "needs --tls or --tls-ca"},
  };
  for (const auto& [args, has] : cases) {
    const Result r = Ctl(args);
    if (args.empty()) {
      // No command: the overview goes to stderr.
      EXPECT_EQ(r.rc, 2);
      EXPECT_NE(r.err.find(has), std::string::npos);
      continue;
    }
    std::string what = "gacctl";
    for (const auto& a : args) what += " " + a;
    ExpectOneLineError(r, 2, has, what);
  }
}

TEST_F(Gacctl, ServerErrorsAreOneLineWithTheStatusNameAndStatus1) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"show", "exp-nope"}, "gacctl: NOT_FOUND: unknown run 'exp-nope'"},
      {{"steps", "exp-nope"}, "gacctl: NOT_FOUND: unknown run 'exp-nope'"},
      {{"tail", "exp-nope"}, "gacctl: NOT_FOUND: unknown run 'exp-nope'"},
      {{"calibrate", "exp-nope"}, "gacctl: NOT_FOUND: unknown run 'exp-nope'"},
      {{"replay", "exp-nope", "--c-low", "0.05", "--c-high", "0.3"}, "gacctl: NOT_FOUND: unknown run 'exp-nope'"},
      {{"config", "history", "bad run!"}, "gacctl: INVALID_ARGUMENT: "},
      {{"steps", "bad run!"}, "gacctl: INVALID_ARGUMENT: "},
  };
  for (const auto& [args, has] : cases) ExpectOneLineError(Ctl(args), 1, has, args[0] + " " + args[1]);

  // Tokens: wrong, missing, without the right.
  ExpectOneLineError(Ctl({"runs"}, "wrong-token-0123456789"), 1, "gacctl: UNAUTHENTICATED: ", "wrong token");
  ExpectOneLineError(RunCommand(*dir_, Argv({"runs"}), {{"GAC_ADDRESS", gacd_->address()}}), 1,
                     "gacctl: UNAUTHENTICATED: ", "no token");
  ExpectOneLineError(Ctl({"show", "exp-golden"}, kOtherToken), 1, "gacctl: PERMISSION_DENIED: ", "other's run");
  // The other token may read only other-*: the list is empty, not an error.
  const Result r = Ctl({"runs", "--format", "csv"}, kOtherToken);
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, "run,first_step,last_step,step_records,world_size,last_seen_ns,cosine,regime,step_mode,mode,c_low,c_high,"
                   "alpha_mode,version\n");
}

// A loopback port with nothing listening.
std::string ClosedAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

TEST_F(Gacctl, UnreachableAddressIsUnavailableAndNamesIt) {
  const std::string address = ClosedAddress();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"runs"}, {"health"}, {"steps", "exp-golden"}, {"config", "get", "exp-golden"}}) {
    const Result r = RunCommand(*dir_, Argv(args), {{"GAC_ADDRESS", address}, {"GAC_TOKEN", kAdminToken}});
    ExpectOneLineError(r, 1, "gacctl: UNAVAILABLE: " + address + ": ", args[0]);
  }
  // A deadline that passes: DEADLINE_EXCEEDED, also naming the address. The
  // peer is a loopback socket that listens but never accepts: the kernel
  // completes the TCP handshake and nothing ever answers (a routed
  // "blackhole" address is not portable: some networks answer it).
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(silent, 4), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string silent_address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const Result r = Ctl({"runs", "--timeout", "100ms", "--address", silent_address});
  close(silent);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("DEADLINE_EXCEEDED: " + silent_address), std::string::npos) << r.err;
}

TEST_F(Gacctl, FlagsOverrideTheEnvironment) {
  const std::string token_file = dir_->File("token");
  WriteFile(token_file, std::string("  ") + kReaderToken + "\n");
  const std::map<std::string, std::string> wrong = {{"GAC_ADDRESS", ClosedAddress()},
                                                     {"GAC_TOKEN", "wrong-token-0123456789"}};
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--address", gacd_->address(), "health"},
        {"runs", "--address", gacd_->address(), "--token", kReaderToken, "--format", "csv"},
        {"--address=" + gacd_->address(), "--token-file", token_file, "runs", "--format", "csv"}}) {
    const Result r = RunCommand(*dir_, Argv(args), wrong);
    EXPECT_EQ(r.rc, 0) << args[0] << ": " << r.err;
  }
}

// ---- TLS ----

TEST_F(Gacctl, TlsWithTheRightCaAndNameAndEveryMismatchIsAnError) {
  std::string log;
  auto make_cert = [&](const std::string& name) {
    return RunProcess({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                       "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout",
                       dir_->File(name + ".key"), "-out", dir_->File(name + ".pem")},
                      "", &log);
  };
  if (make_cert("tls") != 0 || make_cert("other") != 0) GTEST_SKIP() << "openssl cannot make a certificate: " << log;
  ScratchDir tls_dir;
  GacdProcess tls({"--listen=127.0.0.1:0", "--http-listen=", "--store=memory",
                   "--token-file=" + WriteTestTokens(tls_dir), "--tls-cert=" + dir_->File("tls.pem"),
                   "--tls-key=" + dir_->File("tls.key")});
  ASSERT_TRUE(tls.Start(tls_dir.File("ready"))) << tls.error();
  const std::string port = tls.address().substr(tls.address().rfind(':') + 1);
  const std::map<std::string, std::string> env = {{"GAC_ADDRESS", tls.address()}, {"GAC_TOKEN", kReaderToken}};
  auto ctl = [&](const std::vector<std::string>& args) { return RunCommand(*dir_, Argv(args), env); };

  Result r = ctl({"health", "--tls-ca", dir_->File("tls.pem")});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  r = ctl({"runs", "--tls-ca", dir_->File("tls.pem"), "--address", "localhost:" + port});
  EXPECT_EQ(r.rc, 0) << r.err;
  r = ctl({"health", "--tls-ca", dir_->File("tls.pem"), "--tls-server-name", "localhost"});
  EXPECT_EQ(r.rc, 0) << r.err;

  ExpectOneLineError(ctl({"health"}), 1, "gacctl: UNAVAILABLE: " + tls.address(), "plaintext to TLS");
  ExpectOneLineError(ctl({"health", "--tls-ca", dir_->File("other.pem")}), 1, "gacctl: UNAVAILABLE: ",
                     "another CA");
  ExpectOneLineError(ctl({"health", "--tls-ca", dir_->File("tls.pem"), "--tls-server-name", "gacd.example"}), 1,
                     "gacctl: UNAVAILABLE: ", "wrong server name");
  ExpectOneLineError(
      RunCommand(*dir_, Argv({"health", "--tls-ca", dir_->File("tls.pem")}), Env()), 1,
      "gacctl: UNAVAILABLE: " + gacd_->address(), "TLS to plaintext");
  WriteFile(dir_->File("not-a-cert.pem"), "hello\n");
  ExpectOneLineError(ctl({"health", "--tls-ca", dir_->File("not-a-cert.pem")}), 2, "holds no PEM certificate",
                     "not a certificate");
}

// ---- help and completion ----

// The flags a command's --help lists ("--from", "-f"...).
std::set<std::string> HelpFlags(const std::string& help) {
  std::set<std::string> flags;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, std::regex(R"(^  (-\w), (--[\w-]+))")) &&
        !std::regex_search(line, m, std::regex(R"(^  (--[\w-]+))"))) {
      continue;
    }
    for (std::size_t i = 1; i < m.size(); ++i) flags.insert(m[i].str());
  }
  return flags;
}

std::set<std::string> Complete(const ScratchDir& dir, const std::vector<std::string>& words,
                               const std::map<std::string, std::string>& env = {}) {
  std::string script = "source '" + std::string(GAC_CLI_COMPLETION) + "'; COMP_WORDS=(gacctl";
  for (const auto& w : words) script += " '" + w + "'";
  script += "); COMP_CWORD=" + std::to_string(words.size()) + "; _gacctl; printf '%s\\n' \"${COMPREPLY[@]}\"";
  const Result r = RunCommand(dir, {"bash", "-c", script}, env);
  EXPECT_EQ(r.rc, 0) << r.err;
  std::set<std::string> out;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.insert(line);
  }
  return out;
}

TEST_F(Gacctl, EveryCommandHasHelpAndTheCompletionOffersItsFlags) {
  std::set<std::string> first_words;
  for (const std::string& name : cli::CommandNames()) {
    first_words.insert(name.substr(0, name.find(' ')));
    std::vector<std::string> args;
    std::istringstream words(name);
    for (std::string w; words >> w;) args.push_back(w);
    args.push_back("--help");
    const Result r = Ctl(args);
    ASSERT_EQ(r.rc, 0) << name;
    EXPECT_EQ(r.out.rfind("gacctl " + name + ": ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("usage: gacctl " + name), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("exit status: 0 success"), std::string::npos) << name;
    // The completion of "-" after the command is the help's flags.
    args.back() = "-";
    if (name != "runs" && name != "health") args.insert(args.end() - 1, "exp-golden");
    EXPECT_EQ(Complete(*dir_, args), HelpFlags(r.out)) << name;
  }
  first_words.insert("help");
  EXPECT_EQ(Complete(*dir_, {""}), first_words);
  EXPECT_EQ(Complete(*dir_, {"config", ""}), (std::set<std::string>{"get", "set", "history"}));
  EXPECT_EQ(Complete(*dir_, {"steps", "exp-golden", "--format", ""}),
            (std::set<std::string>{"table", "csv", "jsonl"}));
  EXPECT_EQ(Complete(*dir_, {"config", "set", "exp-golden", "--mode", "r"}), (std::set<std::string>{"remote"}));
  // Run ids from gacd, with the address and token of the environment.
  std::string path = GACCTL_BINARY;
  path = path.substr(0, path.rfind('/'));
  const char* old_path = std::getenv("PATH");
  std::map<std::string, std::string> env = Env(kReaderToken);
  env["PATH"] = path + ":" + (old_path ? old_path : "/usr/bin:/bin");
  EXPECT_EQ(Complete(*dir_, {"show", "exp-s"}, env), (std::set<std::string>{"exp-spike", "exp-sync"}));
  EXPECT_EQ(Complete(*dir_, {"--address", gacd_->address(), "replay", "exp-g"}, env),
            (std::set<std::string>{"exp-golden"}));
  // Top-level help and version.
  Result r = Ctl({"--help"});
  EXPECT_EQ(r.rc, 0);
  for (const std::string& name : cli::CommandNames()) EXPECT_NE(r.out.find("  " + name), std::string::npos) << name;
  r = Ctl({"help", "replay"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("gacctl replay: ", 0), 0u);
  r = Ctl({"--version"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("gacctl ", 0), 0u);
}

}  // namespace
}  // namespace gac::testing
