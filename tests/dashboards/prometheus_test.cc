// The Grafana dashboard and the Prometheus rules of dashboards/, checked
// structurally and against a real gacd and Debian's Prometheus on loopback.
//
// The live test starts gacd (--insecure, OS-chosen ports, per-layer metrics)
// and `prometheus` scraping it every second with the rules loaded, streams a
// quiet synthetic run and one with an alignment spike (remote mode, with
// Decide calls and fallbacks) in real time, and asserts through Prometheus's
// HTTP API that
//   - the series of docs/GACD.md exist with the expected values,
//   - every recording rule yields data and every rule evaluates without error,
//   - every PromQL expression of the dashboard (targets and annotations, with
//     $run/$rank/$job set to the test's run and $__rate_interval to 5s)
//     parses and returns data, and the variable queries list the runs,
//   - GacAlignmentSpike fires for the spiky run and no alert at all for the
//     quiet one;
//   - both runs send policy-health signals: gacd's early medians are those of
//     the first 20 steps sent, and the spiky run's policy drifts from its
//     sampler as it spikes, so GacPolicyEssLow, GacPolicyClipped and
//     GacSamplerKlJump fire for its two ranks (and, as above, none for the
//     quiet run, whose policy stays where it started).
//
// Time scale: the rules file is loaded with every duration in minutes read
// as seconds (range windows `[Nm]` and `for: Nm`), so a 10-minute window is
// 10 s here. Nothing else of the rules is changed (see ScaleRulesForTest).

#include <arpa/inet.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "synthetic_run.h"
#include "tests/common/test_util.h"

namespace gac::testing {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;
using Clock = std::chrono::steady_clock;

const std::string kSourceDir = GAC_SOURCE_DIR;
const std::string kPrometheus = PROMETHEUS_BINARY;

std::string SourceFile(const std::string& rel) { return ReadFileOrDie(kSourceDir + "/" + rel); }

// ------------------------------------------------------------------ JSON

bool ParseJson(const std::string& text, Value* out, std::string* error) {
  auto st = google::protobuf::util::JsonStringToMessage(text, out);
  if (!st.ok()) {
    *error = std::string(st.message());
    return false;
  }
  return true;
}

const Value* Field(const Value& v, const std::string& name) {
  if (v.kind_case() != Value::kStructValue) return nullptr;
  auto it = v.struct_value().fields().find(name);
  return it == v.struct_value().fields().end() ? nullptr : &it->second;
}

std::string Str(const Value* v) {
  return v != nullptr && v->kind_case() == Value::kStringValue ? v->string_value() : "";
}

const ListValue* List(const Value* v) {
  return v != nullptr && v->kind_case() == Value::kListValue ? &v->list_value() : nullptr;
}

// The value at a path of object fields, or nullptr.
const Value* At(const Value* v, std::initializer_list<const char*> path) {
  for (const char* name : path) {
    if (v == nullptr) return nullptr;
    v = Field(*v, name);
  }
  return v;
}

double Num(const Value* v, double otherwise = -1) {
  return v != nullptr && v->kind_case() == Value::kNumberValue ? v->number_value() : otherwise;
}

// Every string in `v`, recursively, with a path for messages.
void ForEachString(const Value& v, const std::string& path,
                   const std::function<void(const std::string&, const std::string&)>& fn) {
  switch (v.kind_case()) {
    case Value::kStringValue:
      fn(path, v.string_value());
      break;
    case Value::kStructValue:
      for (const auto& [k, f] : v.struct_value().fields()) ForEachString(f, path + "." + k, fn);
      break;
    case Value::kListValue:
      for (int i = 0; i < v.list_value().values_size(); ++i) {
        ForEachString(v.list_value().values(i), path + "[" + std::to_string(i) + "]", fn);
      }
      break;
    default:
      break;
  }
}

// ------------------------------------------------------------- dashboard

struct Query {
  std::string where;  // panel title and refId, or the annotation's name
  std::string expr;
  bool instant = false;
};

// The dashboard's panels (rows flattened) and PromQL queries.
struct Dashboard {
  Value json;
  std::vector<const Value*> panels;
  std::vector<Query> queries;
  std::map<std::string, const Value*> variables;  // by name
};

bool LoadDashboard(Dashboard* d, std::string* error) {
  if (!ParseJson(SourceFile("dashboards/gac.json"), &d->json, error)) return false;
  if (const ListValue* panels = List(Field(d->json, "panels"))) {
    for (const Value& p : panels->values()) {
      d->panels.push_back(&p);
      if (const ListValue* nested = List(Field(p, "panels"))) {  // collapsed rows
        for (const Value& q : nested->values()) d->panels.push_back(&q);
      }
    }
  }
  for (const Value* p : d->panels) {
    if (const ListValue* targets = List(Field(*p, "targets"))) {
      for (const Value& t : targets->values()) {
        const Value* instant = Field(t, "instant");
        d->queries.push_back({Str(Field(*p, "title")) + " [" + Str(Field(t, "refId")) + "]", Str(Field(t, "expr")),
                              instant != nullptr && instant->bool_value()});
      }
    }
  }
  // A Prometheus annotation's query is its target, as in a panel (Grafana's
  // model; the built-in annotation has none).
  if (const ListValue* annotations = List(At(&d->json, {"annotations", "list"}))) {
    for (const Value& a : annotations->values()) {
      const std::string expr = Str(At(&a, {"target", "expr"}));
      if (!expr.empty()) d->queries.push_back({"annotation " + Str(Field(a, "name")), expr, false});
    }
  }
  if (const Value* templating = Field(d->json, "templating")) {
    if (const ListValue* vars = List(Field(*templating, "list"))) {
      for (const Value& v : vars->values()) d->variables[Str(Field(v, "name"))] = &v;
    }
  }
  return true;
}

// The query string of a query variable (a string or {"query": ...}).
std::string VariableQuery(const Value& var) {
  const Value* q = Field(var, "query");
  if (q == nullptr) return "";
  if (q->kind_case() == Value::kStringValue) return q->string_value();
  return Str(Field(*q, "query"));
}

// Grafana's own variables that may appear in expressions.
const std::set<std::string>& BuiltinVariables() {
  static const auto* names = new std::set<std::string>{
      "__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms", "__all",
      "__from", "__to", "__dashboard", "__org", "__user"};
  return *names;
}

// Names referenced as $name, ${name}, ${name:format} or [[name]].
std::vector<std::string> ReferencedVariables(const std::string& text) {
  static const std::regex re(R"(\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\])");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    for (int g = 1; g <= 3; ++g) {
      if ((*it)[g].matched) out.push_back((*it)[g].str());
    }
  }
  return out;
}

std::string Substitute(std::string expr, const std::map<std::string, std::string>& values) {
  static const std::regex re(R"(\$\{(\w+)\}|\$(\w+))");
  std::string out;
  auto last = expr.cbegin();
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), re); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
    out.append(last, (*it)[0].first);
    auto v = values.find(name);
    out += v != values.end() ? v->second : (*it)[0].str();
    last = (*it)[0].second;
  }
  out.append(last, expr.cend());
  return out;
}

TEST(Dashboard, IsStructurallyValid) {
  Dashboard d;
  std::string error;
  ASSERT_TRUE(LoadDashboard(&d, &error)) << error;

  EXPECT_FALSE(Str(Field(d.json, "title")).empty());
  EXPECT_FALSE(Str(Field(d.json, "uid")).empty());
  EXPECT_GE(Num(Field(d.json, "schemaVersion")), 36) << "a current Grafana schema";
  ASSERT_FALSE(d.panels.empty());

  // Variables: a Prometheus datasource variable, and query variables for the
  // job, run and rank that use it.
  ASSERT_EQ(d.variables.count("datasource"), 1u);
  EXPECT_EQ(Str(Field(*d.variables["datasource"], "type")), "datasource");
  EXPECT_EQ(Str(Field(*d.variables["datasource"], "query")), "prometheus");
  for (const char* name : {"job", "run", "rank"}) {
    ASSERT_EQ(d.variables.count(name), 1u) << name;
    const Value& v = *d.variables[name];
    EXPECT_EQ(Str(Field(v, "type")), "query") << name;
    EXPECT_EQ(Str(At(&v, {"datasource", "uid"})), "${datasource}") << name;
    EXPECT_EQ(VariableQuery(v).rfind("label_values(", 0), 0u) << name << ": " << VariableQuery(v);
  }

  // Panels: unique ids, on the 24-column grid without overlaps; every
  // non-row panel has the datasource variable and targets with expressions.
  std::set<double> ids;
  struct Rect {
    double x, y, w, h;
    std::string title;
  };
  std::vector<Rect> rects;
  for (const Value* p : d.panels) {
    const std::string title = Str(Field(*p, "title"));
    SCOPED_TRACE("panel '" + title + "'");
    EXPECT_FALSE(title.empty());
    EXPECT_TRUE(ids.insert(Num(Field(*p, "id"))).second) << "duplicate id";
    const Value* grid = Field(*p, "gridPos");
    ASSERT_NE(grid, nullptr);
    Rect r{Num(Field(*grid, "x")), Num(Field(*grid, "y")), Num(Field(*grid, "w")), Num(Field(*grid, "h")), title};
    EXPECT_GE(r.x, 0);
    EXPECT_GE(r.y, 0);
    EXPECT_GE(r.w, 1);
    EXPECT_GE(r.h, 1);
    EXPECT_LE(r.x + r.w, 24);
    for (const Rect& o : rects) {
      const bool overlap = r.x < o.x + o.w && o.x < r.x + r.w && r.y < o.y + o.h && o.y < r.y + r.h;
      EXPECT_FALSE(overlap) << "overlaps '" << o.title << "'";
    }
    rects.push_back(r);
    if (Str(Field(*p, "type")) == "row") continue;
    const Value* ds = Field(*p, "datasource");
    ASSERT_NE(ds, nullptr) << "no datasource";
    EXPECT_EQ(Str(Field(*ds, "type")), "prometheus");
    EXPECT_EQ(Str(Field(*ds, "uid")), "${datasource}");
    const ListValue* targets = List(Field(*p, "targets"));
    ASSERT_NE(targets, nullptr) << "no targets";
    ASSERT_GT(targets->values_size(), 0) << "no targets";
    std::set<std::string> refs;
    for (const Value& t : targets->values()) {
      EXPECT_FALSE(Str(Field(t, "expr")).empty());
      EXPECT_TRUE(refs.insert(Str(Field(t, "refId"))).second) << "duplicate refId " << Str(Field(t, "refId"));
      EXPECT_EQ(Str(At(&t, {"datasource", "uid"})), "${datasource}");
    }
  }

  // Every variable referenced anywhere resolves.
  ForEachString(d.json, "", [&](const std::string& path, const std::string& s) {
    for (const std::string& name : ReferencedVariables(s)) {
      EXPECT_TRUE(d.variables.count(name) == 1 || BuiltinVariables().count(name) == 1)
          << "undefined variable $" << name << " at " << path;
    }
  });

  // The firing gac alerts are an annotation.
  EXPECT_TRUE(std::any_of(d.queries.begin(), d.queries.end(), [](const Query& q) {
    return q.where.rfind("annotation ", 0) == 0 && q.expr.find("ALERTS{") != std::string::npos;
  })) << "no annotation queries ALERTS";

  // The panels the dashboard exists for: each of these series is queried.
  std::string all;
  for (const Query& q : d.queries) all += q.expr + "\n";
  for (const char* series :
       {"gac_cosine", "gac_cosine_after", "gac_threshold_c_low", "gac_threshold_c_high", "gac_steps_total",
        "gac_alpha", "gac_grad_norm", "gac_ref_norm", "gac_staleness_steps", "gac_trainer_scalar",
        "gac_skipped_updates_total", "gac_controller_fallbacks_total", "gac_layer_cosine", "gac_ingest_rows_total",
        "gac_rpc_errors_total", "gac_store_queue_rows", "gac_last_report_timestamp_seconds", "gac_spikes_total",
        "gac_grad_norm_z", "gac_ess_token_ratio", "gac_ess_token_early_median_ratio", "gac_clip_fraction_low_ratio",
        "gac_clip_fraction_high_ratio", "gac_kl_k3_nats", "gac_kl_k3_early_median_nats", "gac_log_ratio_p99_nats",
        "gac_entropy_mean_nats", "gac_batch_staleness_max_versions", "gac_policy_invalid"}) {
    EXPECT_NE(all.find(std::string(series) + "{"), std::string::npos) << series << " is on no panel";
  }
}

// ------------------------------------------------------------------ rules

// Reads every duration in minutes of the rules as seconds: `[Nm]` range
// windows (also inside annotation templates) and `for: Nm`.
std::string ScaleRulesForTest(const std::string& rules, int* replaced) {
  static const std::regex window(R"(\[(\d+)m\])");
  static const std::regex for_clause(R"((\bfor:\s*)(\d+)m\b)");
  *replaced = static_cast<int>(std::distance(std::sregex_iterator(rules.begin(), rules.end(), window),
                                             std::sregex_iterator()) +
                               std::distance(std::sregex_iterator(rules.begin(), rules.end(), for_clause),
                                             std::sregex_iterator()));
  std::string out = std::regex_replace(rules, window, "[$1s]");
  return std::regex_replace(out, for_clause, "$1$2s");
}

std::vector<std::string> RecordingRuleNames(const std::string& rules) {
  static const std::regex re(R"(^\s*-\s*record:\s*(\S+))");
  std::vector<std::string> out;
  std::istringstream in(rules);
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, re)) out.push_back(m[1].str());
  }
  return out;
}

TEST(Rules, TestScalingTouchesOnlyDurations) {
  int replaced = 0;
  const std::string rules = SourceFile("dashboards/gac.rules.yml");
  const std::string scaled = ScaleRulesForTest(rules, &replaced);
  EXPECT_GT(replaced, 5);
  EXPECT_EQ(std::count(scaled.begin(), scaled.end(), '\n'), std::count(rules.begin(), rules.end(), '\n'));
  EXPECT_FALSE(std::regex_search(scaled, std::regex(R"(\[\d+m\]|for:\s*\d+m)")));
  EXPECT_NE(scaled.find("avg_over_time(run_rank:gac_cosine:abs[10s])"), std::string::npos);
  EXPECT_GE(RecordingRuleNames(rules).size(), 5u);
}

// --------------------------------------------------------------- processes

struct HttpResponse {
  int status = 0;  // 0: no connection
  std::string body;
};

std::string UrlEncode(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

HttpResponse Get(int port, const std::string& path) {
  HttpResponse r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return r;
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return r;
  }
  std::string resp;
  char buf[16384];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) resp.append(buf, static_cast<std::size_t>(n));
  close(fd);
  const auto body = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) return r;
  r.status = std::atoi(resp.c_str() + resp.find(' ') + 1);
  r.body = resp.substr(body + 4);
  return r;
}

// A free loopback TCP port (bound, read and closed; the caller retries on a collision).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Debian's prometheus on 127.0.0.1, its log in the scratch dir.
class PrometheusProcess {
 public:
  ~PrometheusProcess() { Stop(); }

  // Starts prometheus with `config` and waits for /-/ready; retries on
  // another port when the chosen one was taken meanwhile.
  bool Start(const ScratchDir& dir, const std::string& config, std::string* error) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = FreePort();
      log_ = dir.File("prometheus-" + std::to_string(attempt) + ".log");
      std::vector<std::string> argv = {kPrometheus,
                                       "--config.file=" + config,
                                       "--storage.tsdb.path=" + dir.File("tsdb"),
                                       "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                       "--log.level=warn"};
      pid_ = SpawnLogged(argv, log_, error);
      if (pid_ < 0) return false;
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      bool exited = false;
      while (Clock::now() < deadline) {
        if (Get(port_, "/-/ready").status == 200) return true;
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          exited = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      *error = "prometheus not ready: " + ReadFileOrDie(log_);
      if (!exited) {
        Stop();
        return false;
      }
      if (error->find("address already in use") == std::string::npos) return false;
    }
    return false;
  }

  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100 && waitpid(pid_, &status, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (waitpid(pid_, &status, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }

  int port() const { return port_; }
  std::string Log() const { return ReadFileOrDie(log_); }

  // GET an API path; parses the JSON answer. Fails the test on errors
  // unless `allow_error`.
  Value Api(const std::string& path, std::string* error = nullptr) const {
    const HttpResponse r = Get(port_, path);
    Value v;
    std::string parse_error;
    if (r.status != 200 || !ParseJson(r.body, &v, &parse_error) || Str(Field(v, "status")) != "success") {
      const std::string msg = "GET " + path + ": HTTP " + std::to_string(r.status) + ": " + r.body + parse_error;
      if (error != nullptr) {
        *error = msg;
      } else {
        ADD_FAILURE() << msg;
      }
      return Value();
    }
    return v;
  }

  // The result vector/matrix of an instant query (at `time`, or now).
  std::vector<Value> Query(const std::string& expr, std::string* error = nullptr, double time = 0) const {
    std::string path = "/api/v1/query?query=" + UrlEncode(expr);
    if (time > 0) path += "&time=" + std::to_string(time);
    return Result(Api(path, error));
  }

  std::vector<Value> QueryRange(const std::string& expr, double start, double end, std::string* error) const {
    char range[128];
    std::snprintf(range, sizeof range, "&start=%.3f&end=%.3f&step=1", start, end);
    return Result(Api("/api/v1/query_range?query=" + UrlEncode(expr) + range, error));
  }

 private:
  static std::vector<Value> Result(const Value& v) {
    std::vector<Value> out;
    const Value* data = Field(v, "data");
    if (data == nullptr) return out;
    if (const ListValue* result = List(Field(*data, "result"))) {
      for (const Value& r : result->values()) out.push_back(r);
    }
    return out;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_;
};

// The value of an instant-vector sample ({"metric":..,"value":[t,"v"]}).
double SampleValue(const Value& sample) {
  const ListValue* v = List(Field(sample, "value"));
  if (v == nullptr || v->values_size() != 2) return std::nan("");
  return std::stod(v->values(1).string_value());
}

std::string Label(const Value& sample, const std::string& name) {
  const Value* metric = Field(sample, "metric");
  return metric == nullptr ? "" : Str(Field(*metric, name));
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ------------------------------------------------------------------- live

constexpr const char* kQuietRun = "dash-quiet";
constexpr const char* kSpikyRun = "dash-spiky";
constexpr int kSteps = 150;            // per run
constexpr int kStepsPerSecond = 10;    // per run: 15 s of streaming

TEST(Prometheus, DashboardQueriesAndAlertsOnLiveData) {
  if (kPrometheus.empty() || access(kPrometheus.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "prometheus is not installed (apt-get install prometheus)";
  }
  ScratchDir dir;
  GacdProcess gacd(
      {"--insecure", "--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--store=memory", "--per-layer-metrics"});
  ASSERT_TRUE(gacd.Start(dir.File("ready"))) << gacd.error();
  ASSERT_FALSE(gacd.metrics_address().empty());

  // The repository's rules on the test's time scale, and a 1 s scrape.
  int replaced = 0;
  const std::string rules_text = SourceFile("dashboards/gac.rules.yml");
  WriteFile(dir.File("gac.rules.yml"), ScaleRulesForTest(rules_text, &replaced));
  ASSERT_GT(replaced, 0);
  WriteFile(dir.File("prometheus.yml"),
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            "rule_files:\n"
            "  - " + dir.File("gac.rules.yml") + "\n"
            "scrape_configs:\n"
            "  - job_name: gacd\n"
            "    static_configs:\n"
            "      - targets: ['" + gacd.metrics_address() + "']\n");
  PrometheusProcess prom;
  std::string error;
  ASSERT_TRUE(prom.Start(dir, dir.File("prometheus.yml"), &error)) << error;

  // One rejected stream, so that the RPC error panel has a series.
  Client client(gacd.address(), "");
  {
    v1::StepRecord bad = MakeStep(kQuietRun, 0, 0.01);
    bad.set_cosine(1.5);
    EXPECT_EQ(client.Ingest({MakeBatch(1, {bad})}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }

  // Stream both runs in real time on one ingest stream.
  SyntheticRunOptions quiet_options;
  quiet_options.run = kQuietRun;
  quiet_options.seed = 7;
  SyntheticRunOptions spiky_options;
  spiky_options.run = kSpikyRun;
  spiky_options.seed = 8;
  spiky_options.spike = true;
  spiky_options.spike_start = 60;
  spiky_options.spike_ramp = 30;
  spiky_options.recover = false;  // still spiking when the test looks
  spiky_options.remote = true;
  spiky_options.fallback_every = 10;
  spiky_options.guard_spike_step = 100;  // one step the agent's spike guard skipped
  quiet_options.policy = true;
  spiky_options.policy = true;  // its policy drifts from the sampler as it spikes (synthetic_run.h)
  SyntheticRun quiet(quiet_options), spiky(spiky_options);

  const double stream_start = WallSeconds();
  {
    auto ctx = client.Context(120000);
    auto stream = client.ingest().Ingest(ctx.get());
    const auto t0 = Clock::now();
    for (int i = 0; i < kSteps; ++i) {
      v1::DecideResponse decision;
      const grpc::Status decided = client.Decide(spiky.NextDecideRequest(), &decision);
      ASSERT_TRUE(decided.ok()) << decided.error_message();
      std::vector<v1::StepRecord> records = quiet.NextStep();
      for (auto& r : spiky.NextStep(&decision)) records.push_back(std::move(r));
      const std::size_t n = records.size();
      ASSERT_TRUE(stream->Write(MakeBatch(static_cast<std::uint64_t>(i) + 1, std::move(records))));
      v1::IngestAck ack;
      ASSERT_TRUE(stream->Read(&ack));
      ASSERT_EQ(ack.stored(), n);
      std::this_thread::sleep_until(t0 + std::chrono::milliseconds(1000 * (i + 1) / kStepsPerSecond));
    }
    stream->WritesDone();
    const grpc::Status st = stream->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  // Wait until Prometheus has scraped the last step, then give the rules
  // two more evaluations on the final values.
  for (auto deadline = Clock::now() + std::chrono::seconds(20); Clock::now() < deadline;) {
    std::vector<Value> r = prom.Query("sum(gac_steps_total{run=~\"dash-.*\"})");
    if (!r.empty() && SampleValue(r[0]) == 4.0 * kSteps) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double stream_end = WallSeconds();

  auto value_of = [&](const std::string& expr) {
    std::vector<Value> r = prom.Query(expr);
    EXPECT_EQ(r.size(), 1u) << expr;
    return r.empty() ? std::nan("") : SampleValue(r[0]);
  };

  // --- the series of docs/GACD.md, with the run's values.
  for (const char* name :
       {"gac_cosine", "gac_cosine_after", "gac_grad_norm", "gac_ref_norm", "gac_alpha", "gac_staleness_steps",
        "gac_step", "gac_last_report_timestamp_seconds", "gac_agent_overhead_seconds", "gac_trainer_scalar",
        "gac_steps_total", "gac_skipped_updates_total", "gac_controller_fallbacks_total", "gac_layer_cosine",
        "gac_layer_grad_norm"}) {
    for (const char* run : {kQuietRun, kSpikyRun}) {
      EXPECT_FALSE(prom.Query(std::string(name) + "{job=\"gacd\",run=\"" + run + "\",rank=\"1\"}").empty())
          << name << " of " << run;
    }
  }
  for (const char* name : {"gac_threshold_c_low", "gac_threshold_c_high"}) {
    EXPECT_EQ(prom.Query(std::string(name) + "{run=~\"dash-.*\"}").size(), 2u) << name;
  }
  EXPECT_FALSE(prom.Query("gac_decisions_total{run=\"" + std::string(kSpikyRun) + "\"}").empty());
  for (const char* name :
       {"gac_ingest_rows_total", "gac_ingest_batches_total", "gac_ingest_duplicates_total", "gac_rpc_errors_total",
        "gac_store_queue_rows", "gac_store_write_seconds_bucket", "gac_decide_seconds_bucket", "gac_runs_exported",
        "gac_expired_runs_total", "gac_layer_series_dropped_total", "gac_scalar_series_dropped_total"}) {
    EXPECT_FALSE(prom.Query(std::string(name) + "{job=\"gacd\"}").empty()) << name;
  }
  EXPECT_EQ(value_of("sum(gac_steps_total{run=\"dash-quiet\"})"), 2.0 * kSteps);
  EXPECT_EQ(value_of("sum(gac_steps_total{run=\"dash-spiky\"})"), 2.0 * kSteps);
  EXPECT_EQ(value_of("sum(gac_skipped_updates_total{run=\"dash-quiet\"})"), 0.0);
  EXPECT_GT(value_of("sum(gac_steps_total{run=\"dash-spiky\",regime=\"skip\"})"), 0.0);
  EXPECT_GT(value_of("sum(gac_steps_total{run=\"dash-spiky\",regime=\"project\"})"), 0.0);
  EXPECT_GT(value_of("sum(gac_controller_fallbacks_total{run=\"dash-spiky\"})"), 0.0);
  EXPECT_EQ(value_of("sum(gac_controller_fallbacks_total{run=\"dash-quiet\"})"), 0.0);
  EXPECT_EQ(value_of("gac_step{run=\"dash-quiet\",rank=\"0\"}"), kSteps - 1.0);
  EXPECT_DOUBLE_EQ(value_of("gac_threshold_c_high{run=\"dash-spiky\"}"), 0.3);
  EXPECT_EQ(value_of("gac_rpc_errors_total{method=\"Ingest\",code=\"INVALID_ARGUMENT\"}"), 1.0);

  // --- policy health: every signal's gauge, and the early medians: the
  // median of the first 20 values each rank sent (those of a fresh run with
  // the same options), the mean of the middle two.
  for (const char* name :
       {"gac_policy_tokens", "gac_ess_token_ratio", "gac_ess_sequence_ratio", "gac_clip_fraction_low_ratio",
        "gac_clip_fraction_high_ratio", "gac_truncation_fraction_ratio", "gac_log_ratio_max_nats",
        "gac_log_ratio_p99_nats", "gac_log_ratio_p1_nats", "gac_kl_k3_nats", "gac_log_ratio_abs_mean_nats",
        "gac_entropy_mean_nats", "gac_batch_staleness_min_versions", "gac_batch_staleness_mean_versions",
        "gac_batch_staleness_max_versions", "gac_policy_invalid", "gac_ess_token_early_median_ratio",
        "gac_kl_k3_early_median_nats"}) {
    for (const char* run : {kQuietRun, kSpikyRun}) {
      EXPECT_FALSE(prom.Query(std::string(name) + "{job=\"gacd\",run=\"" + run + "\",rank=\"1\"}").empty())
          << name << " of " << run;
    }
  }
  for (const SyntheticRunOptions& options : {quiet_options, spiky_options}) {
    SyntheticRun replay(options);
    std::vector<double> ess, kl;
    for (int i = 0; i < 20; ++i) {
      const v1::StepRecord r = replay.NextStep().front();
      ess.push_back(r.ess_token());
      kl.push_back(r.kl_k3());
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return (v[9] + v[10]) / 2;
    };
    for (const char* rank : {"0", "1"}) {
      const std::string labels = "{run=\"" + options.run + "\",rank=\"" + rank + "\"}";
      EXPECT_NEAR(value_of("gac_ess_token_early_median_ratio" + labels), median(ess), 1e-12) << labels;
      EXPECT_NEAR(value_of("gac_kl_k3_early_median_nats" + labels), median(kl), 1e-12) << labels;
      EXPECT_EQ(value_of("gac_policy_invalid" + labels), 0.0) << labels;
    }
  }

  // --- rules: every one evaluated without error; every recording yields data.
  {
    const Value rules = prom.Api("/api/v1/rules");
    int count = 0;
    const Value* data = Field(rules, "data");
    ASSERT_NE(data, nullptr);
    const ListValue* groups = List(Field(*data, "groups"));
    ASSERT_NE(groups, nullptr);
    for (const Value& group : groups->values()) {
      const ListValue* group_rules = List(Field(group, "rules"));
      ASSERT_NE(group_rules, nullptr);
      for (const Value& rule : group_rules->values()) {
        ++count;
        EXPECT_EQ(Str(Field(rule, "health")), "ok") << Str(Field(rule, "name")) << ": " << Str(Field(rule, "lastError"));
      }
    }
    EXPECT_EQ(count, 23);
  }
  for (const std::string& record : RecordingRuleNames(rules_text)) {
    EXPECT_FALSE(prom.Query(record).empty()) << "recording rule " << record << " has no data";
  }

  // --- the dashboard: variables list the runs; every expression parses and
  // returns data for the spiky run.
  Dashboard d;
  ASSERT_TRUE(LoadDashboard(&d, &error)) << error;
  const std::map<std::string, std::string> values = {
      {"job", "gacd"}, {"run", kSpikyRun}, {"rank", "0"}, {"__rate_interval", "5s"}};
  {
    // label_values(SELECTOR, LABEL): the label's values among SELECTOR's series.
    static const std::regex label_values(R"(^label_values\((.*),\s*(\w+)\)$)");
    const std::map<std::string, std::set<std::string>> expected = {
        {"job", {"gacd"}}, {"run", {kQuietRun, kSpikyRun}}, {"rank", {"0", "1"}}};
    for (const auto& [name, want] : expected) {
      std::smatch m;
      const std::string q = VariableQuery(*d.variables[name]);
      ASSERT_TRUE(std::regex_match(q, m, label_values)) << q;
      std::set<std::string> got;
      for (const Value& s : prom.Query(Substitute(m[1].str(), values))) got.insert(Label(s, m[2].str()));
      EXPECT_EQ(got, want) << "variable " << name << ": " << q;
    }
  }
  ASSERT_GT(d.queries.size(), 30u);
  for (const Query& q : d.queries) {
    const std::string expr = Substitute(q.expr, values);
    std::string query_error;
    const std::vector<Value> result =
        q.instant ? prom.Query(expr, &query_error) : prom.QueryRange(expr, stream_start, stream_end, &query_error);
    EXPECT_TRUE(query_error.empty()) << q.where << ": " << expr << "\n" << query_error;
    EXPECT_FALSE(result.empty() && query_error.empty()) << q.where << " returns no data: " << expr;
  }

  // --- alerts: the spike fires for the spiky run only; nothing for the quiet run.
  const std::string spike_firing = "ALERTS{alertname=\"GacAlignmentSpike\",alertstate=\"firing\"}";
  std::vector<Value> firing;
  for (auto deadline = Clock::now() + std::chrono::seconds(20); Clock::now() < deadline;) {
    firing = prom.Query(spike_firing);
    if (!firing.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_FALSE(firing.empty()) << "GacAlignmentSpike never fired\n" << prom.Log();
  for (const Value& a : firing) EXPECT_EQ(Label(a, "run"), kSpikyRun);
  std::set<std::string> ranks;
  for (const Value& a : firing) ranks.insert(Label(a, "rank"));
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(prom.Query("last_over_time(ALERTS{alertname=\"GacAlignmentSpike\"}[5m])").size(), 2u)
      << "the spike alert was never pending or firing for another series";
  // The spike guard's step: GacGradientSpike fires for the spiky run alone.
  std::vector<Value> guarded;
  for (auto deadline = Clock::now() + std::chrono::seconds(20); Clock::now() < deadline;) {
    guarded = prom.Query("ALERTS{alertname=\"GacGradientSpike\",alertstate=\"firing\"}");
    if (!guarded.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_EQ(guarded.size(), 1u) << "GacGradientSpike did not fire once\n" << prom.Log();
  EXPECT_EQ(Label(guarded[0], "run"), kSpikyRun);
  EXPECT_EQ(SampleValue(prom.Query("sum(gac_spikes_total{run=\"" + std::string(kSpikyRun) + "\"})")[0]), 2.0)
      << "one spike step, reported by both ranks";
  // The spiky run's policy drifted from its sampler: its ESS fell below half
  // of its early median, its KL rose above 4 times its own, and its loss
  // clips 35 % of the tokens; each alert fires for both ranks.
  for (const char* alert : {"GacPolicyEssLow", "GacSamplerKlJump", "GacPolicyClipped"}) {
    std::vector<Value> policy;
    std::set<std::string> alerted;
    for (auto deadline = Clock::now() + std::chrono::seconds(20); Clock::now() < deadline;) {
      policy = prom.Query("ALERTS{alertname=\"" + std::string(alert) + "\",alertstate=\"firing\"}");
      alerted.clear();
      for (const Value& a : policy) alerted.insert(Label(a, "run") + "/" + Label(a, "rank"));
      if (alerted.size() >= 2) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    EXPECT_EQ(alerted, (std::set<std::string>{std::string(kSpikyRun) + "/0", std::string(kSpikyRun) + "/1"}))
        << alert << "\n" << prom.Log();
  }
  EXPECT_TRUE(prom.Query("last_over_time(ALERTS{run=\"" + std::string(kQuietRun) + "\"}[5m])").empty())
      << "an alert was pending or firing for the quiet run";

  prom.Stop();
  EXPECT_EQ(gacd.Terminate(), 0);
}

}  // namespace
}  // namespace gac::testing
