// gacd's page in a real browser: Debian's chromium, headless, driven by
// playwright-core (browser_driver.mjs), loads the page from a real gacd
// process while synthetic runs stream into it over gRPC. The test reads
// the values the page shows from its DOM and checks them against the store
// through gRPC (latest step, regime counts, thresholds, the runs list and
// its highlighting), sees a step ingested after the load appear without a
// reload, edits the thresholds with a read-only and an admin token (the
// refusals show the server's own message), and asserts that no console
// error occurred and that the page asked no other origin for anything
// (every other origin is blocked). It saves screenshots (docs/img comes
// from them) and logs the time from navigation to the first chart of a
// 100,000-step run with 50 layers (not asserted).

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gac/proto/record_schema.h"
#include "server/src/http/json.h"
#include "web/latest_step.h"
#include "tests/common/test_util.h"
#include "tests/dashboards/synthetic_run.h"

extern char** environ;

namespace gac::testing {
namespace {

using google::protobuf::Value;
using server::JsonQuote;
using Clock = std::chrono::steady_clock;

const std::string kSourceDir = GAC_SOURCE_DIR;
const std::string kNode = NODE_BINARY;
const std::string kChromium = CHROMIUM_BINARY;
const std::string kSyntheticRun = SYNTHETIC_RUN_BINARY;
const std::string kScreenshots = SCREENSHOT_DIR;

// The number a page shows ("12,345", "0.0513", "–" for none).
double Shown(const std::string& text) {
  std::string digits;
  for (char c : text) {
    if (c != ',') digits.push_back(c);
  }
  char* end = nullptr;
  const double x = std::strtod(digits.c_str(), &end);
  return end == digits.c_str() ? std::nan("") : x;
}

// The browser driver: one JSON command per line in, one answer per line out.
class Browser {
 public:
  // Starts node with the driver; only `allow` (an origin) may be contacted.
  bool Start(const std::string& allow, const std::string& log_path, std::string* error) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) {
      *error = "pipe failed";
      return false;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_addclose(&actions, in[1]);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::vector<std::string> args = {kNode, kSourceDir + "/tests/web/browser_driver.mjs",
                                     "--web-dir=" + kSourceDir + "/web", "--chromium=" + kChromium,
                                     "--allow=" + allow};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, kNode.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
    fcntl(to_, F_SETFD, FD_CLOEXEC);
    fcntl(from_, F_SETFD, FD_CLOEXEC);
    if (rc != 0) {
      *error = "cannot start " + kNode;
      pid_ = -1;
      return false;
    }
    log_path_ = log_path;
    return true;
  }

  ~Browser() {
    if (pid_ <= 0) return;
    const std::string quit = "{\"cmd\":\"quit\"}\n";
    (void)!write(to_, quit.data(), quit.size());
    close(to_);
    // Give chromium a moment to close, then stop it.
    for (int i = 0; i < 100; ++i) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        close(from_);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    close(from_);
  }

  // Sends a command (a JSON object's members, without braces) and returns
  // the answer; a failed command fails the test with the driver's message.
  Value Call(const std::string& members, int timeout_s = 60) {
    const std::string line = "{" + members + "}\n";
    if (write(to_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      ADD_FAILURE() << "the browser driver is gone; its log:\n" << ReadFileOrDie(log_path_);
      return Value();
    }
    const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
      const auto nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        const std::string answer = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        Value v = ParseJson(answer);
        if (!JsonMember(v, "ok").bool_value()) {
          ADD_FAILURE() << "browser: " << members << ": " << JsonMember(v, "error").string_value();
        }
        return v;
      }
      const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      pollfd p{from_, POLLIN, 0};
      char buf[65536];
      ssize_t n = 0;
      if (left <= 0 || poll(&p, 1, left) <= 0 || (n = read(from_, buf, sizeof buf)) <= 0) {
        ADD_FAILURE() << "no answer from the browser driver to " << members << "; its log:\n"
                      << ReadFileOrDie(log_path_);
        return Value();
      }
      buffer_.append(buf, static_cast<std::size_t>(n));
    }
  }

  Value Eval(const std::string& expr) { return JsonMember(Call("\"cmd\":\"eval\",\"expr\":" + JsonQuote(expr)), "value"); }
  // Waits until `expr` is truthy in the page; returns its value.
  Value Wait(const std::string& expr, int timeout_ms = 20000) {
    return JsonMember(Call("\"cmd\":\"wait\",\"expr\":" + JsonQuote(expr) + ",\"timeout_ms\":" + std::to_string(timeout_ms),
                   timeout_ms / 1000 + 30),
              "value");
  }
  std::string Text(const std::string& selector) {
    return JsonMember(Call("\"cmd\":\"text\",\"selector\":" + JsonQuote(selector)), "value").string_value();
  }
  void Open(const std::string& url) { Call("\"cmd\":\"open\",\"url\":" + JsonQuote(url)); }
  void Fill(const std::string& selector, const std::string& value) {
    Call("\"cmd\":\"fill\",\"selector\":" + JsonQuote(selector) + ",\"value\":" + JsonQuote(value));
  }
  void Click(const std::string& selector) { Call("\"cmd\":\"click\",\"selector\":" + JsonQuote(selector)); }
  void Screenshot(const std::string& path, bool full_page) {
    Call("\"cmd\":\"screenshot\",\"path\":" + JsonQuote(path) + ",\"full_page\":" + (full_page ? "true" : "false"));
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buffer_, log_path_;
};

// A field of the run view.
std::string Field(const std::string& name) { return "#run-view [data-field=\"" + name + "\"]"; }

// A page expression: the number `selector` shows is `value`.
std::string ShowsNumber(const std::string& selector, double value) {
  char number[64];
  std::snprintf(number, sizeof number, "%.17g", value);
  return "Number(document.querySelector('" + selector + "').textContent.replace(/,/g, '')) === " + number;
}

// Streams `steps` more steps of `run` over one Ingest stream, one step per
// batch, `pause` apart.
grpc::Status Stream(Client& client, SyntheticRun& run, int steps, std::uint64_t* sequence,
                    std::chrono::milliseconds pause = std::chrono::milliseconds(0)) {
  auto ctx = client.Context(120000);
  auto stream = client.ingest().Ingest(ctx.get());
  for (int i = 0; i < steps; ++i) {
    v1::IngestRequest batch;
    batch.set_sequence(++*sequence);
    for (auto& r : run.NextStep()) *batch.add_records() = std::move(r);
    v1::IngestAck ack;
    if (!stream->Write(batch) || !stream->Read(&ack)) break;
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
  stream->WritesDone();
  return stream->Finish();
}

v1::RunSummary Summary(Client& c, const std::string& run) {
  v1::GetRunSummaryRequest req;
  req.set_run(run);
  v1::RunSummary s;
  EXPECT_TRUE(c.GetRunSummary(req, &s).ok());
  return s;
}

// Every console error must be one of `expected` (a status the test
// provoked on purpose, and the URL it asked), in any number; no page error,
// no blocked request, no failed request but those a navigation cancelled.
void ExpectCleanEvents(Browser& browser, const std::vector<std::pair<int, std::string>>& expected) {
  const Value events = JsonMember(browser.Call("\"cmd\":\"events\""), "events");
  for (const Value& e : JsonMember(events, "console_errors").list_value().values()) {
    const std::string text = JsonMember(e, "text").string_value();
    const std::string url = JsonMember(e, "url").string_value();
    bool known = false;
    for (const auto& [status, path] : expected) {
      known = known || (text.find("status of " + std::to_string(status)) != std::string::npos &&
                        url.find(path) != std::string::npos);
    }
    EXPECT_TRUE(known) << "console error: " << text << " at " << url;
  }
  EXPECT_EQ(JsonMember(events, "page_errors").list_value().values_size(), 0) << events.DebugString();
  EXPECT_EQ(JsonMember(events, "blocked").list_value().values_size(), 0) << events.DebugString();
  for (const Value& f : JsonMember(events, "failed").list_value().values()) {
    EXPECT_EQ(JsonMember(f, "error").string_value(), "net::ERR_ABORTED") << JsonMember(f, "url").string_value();
  }
}

class WebPageTest : public ::testing::Test {
 protected:
  void StartGacd(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
                                     "--token-file=" + WriteTestTokens(dir_), "--drain-timeout=2s"};
    if (extra.empty()) extra.push_back("--store=sqlite:" + dir_.File("data"));
    args.insert(args.end(), extra.begin(), extra.end());
    gacd_ = std::make_unique<GacdProcess>(args);
    ASSERT_TRUE(gacd_->Start(dir_.File("ready"))) << gacd_->error();
    origin_ = "http://" + gacd_->metrics_address();
    std::string error;
    ASSERT_TRUE(browser_.Start(origin_, dir_.File("browser.log"), &error)) << error;
    std::filesystem::create_directories(kScreenshots);
  }

  ScratchDir dir_;
  std::unique_ptr<GacdProcess> gacd_;
  std::string origin_;
  Browser browser_;
};

TEST_F(WebPageTest, ShowsTheStoreLiveAndEditsThresholds) {
  StartGacd();
  Client writer(gacd_->address(), kWriterToken);
  Client admin(gacd_->address(), kAdminToken);
  Client reader(gacd_->address(), kReaderToken);
  SyntheticRunOptions quiet_options;
  quiet_options.run = "exp-quiet";
  quiet_options.layers = 0;
  quiet_options.seed = 2;
  // Decided in the trainer with thresholds of its own: the page shows those,
  // not gacd's 0.05 / 0.3.
  quiet_options.thresholds = {0.02, 0.5};
  quiet_options.report_rule = true;
  SyntheticRun quiet(quiet_options);
  SyntheticRunOptions spike_options;
  spike_options.run = "exp-spike";
  spike_options.spike = true;
  spike_options.spike_start = 100;
  spike_options.guard_spike_step = 120;  // one step the agent's spike guard skipped
  spike_options.policy = true;            // with the trainer's policy-health signals
  SyntheticRun spike(spike_options);
  std::uint64_t quiet_seq = 0, spike_seq = 0;
  ASSERT_TRUE(Stream(writer, quiet, 150, &quiet_seq).ok());
  ASSERT_TRUE(Stream(writer, spike, 170, &spike_seq).ok());  // ends at the peak: |c_t| above c_high

  // The blocking of other origins works (checked once, then forgotten).
  browser_.Open(origin_ + "/vendor/uPlot.LICENSE.txt");
  EXPECT_EQ(browser_.Eval("fetch('http://127.0.0.2:9/x.js').then(() => 'loaded', () => 'refused')").string_value(),
            "refused");
  const Value blocked = JsonMember(browser_.Call("\"cmd\":\"events\""), "events");
  ASSERT_EQ(JsonMember(blocked, "blocked").list_value().values_size(), 1);
  browser_.Call("\"cmd\":\"reset_events\"");

  // Without a token the page says so; then a read-only token through its form.
  browser_.Open(origin_ + "/#/");
  browser_.Wait("!document.querySelector('#banner').hidden && !document.querySelector('#token-panel').hidden");
  EXPECT_NE(browser_.Text("#banner").find("asks for a token"), std::string::npos) << browser_.Text("#banner");
  browser_.Fill("#token-input", kReaderToken);
  browser_.Click("#token-panel button[type=submit]");

  // The runs list against the store.
  browser_.Wait("document.querySelectorAll('#runs-table tbody tr').length === 2 && "
                "[...document.querySelectorAll('#runs-table [data-field=\"count-safe\"]')].every(e => e.textContent !== '–')");
  const Value rows = browser_.Eval(
      "[...document.querySelectorAll('#runs-table tbody tr')].map(tr => ({run: tr.dataset.run, cls: tr.className, "
      "f: Object.fromEntries([...tr.querySelectorAll('[data-field]')].map(td => [td.dataset.field, td.textContent]))}))");
  ASSERT_EQ(rows.list_value().values_size(), 2);
  for (const Value& row : rows.list_value().values()) {
    const std::string run = JsonMember(row, "run").string_value();
    const Value& f = JsonMember(row, "f");
    const v1::RunSummary s = Summary(reader, run);
    SCOPED_TRACE(run);
    EXPECT_EQ(Shown(JsonMember(f, "last-step").string_value()), s.info().last_step());
    EXPECT_NEAR(Shown(JsonMember(f, "cosine").string_value()), s.latest().cosine(), 5.001e-5);
    for (const char* regime : {"safe", "project", "skip", "invalid", "spike"}) {
      EXPECT_EQ(Shown(JsonMember(f, std::string("count-") + regime).string_value()), s.steps_by_regime().at(regime)) << regime;
    }
    const bool own = run == "exp-quiet";
    EXPECT_EQ(JsonMember(f, "thresholds").string_value(), own ? "0.02 / 0.5" : "0.05 / 0.3");
    EXPECT_EQ(Shown(JsonMember(f, "staleness").string_value()), s.latest().staleness());
    EXPECT_EQ(JsonMember(f, "mode").string_value(), "local");
    // Highlighted by the thresholds the step was decided with: above c_low
    // (amber), at c_high and above (red).
    const double c = std::abs(s.latest().cosine());
    const double low = own ? 0.02 : 0.05, high = own ? 0.5 : 0.3;
    EXPECT_EQ(JsonMember(row, "cls").string_value(), c >= high ? "skipping" : c > low ? "aligned" : "");
  }
  // In run id order: the quiet run below its c_high of 0.5, the spiking one red.
  EXPECT_EQ(JsonMember(rows.list_value().values(0), "run").string_value(), "exp-quiet");
  EXPECT_NE(JsonMember(rows.list_value().values(0), "cls").string_value(), "skipping");
  EXPECT_EQ(JsonMember(rows.list_value().values(1), "run").string_value(), "exp-spike");
  EXPECT_EQ(JsonMember(rows.list_value().values(1), "cls").string_value(), "skipping");
  browser_.Screenshot(kScreenshots + "/runs.png", false);

  // The run view, opened from the list, against the store.
  browser_.Click("#runs-table a[href=\"#/run/exp-spike\"]");
  browser_.Wait("document.body.dataset.firstChartMs");
  std::printf("run view of exp-spike (170 steps): first chart after %s ms\n",
              browser_.Eval("document.body.dataset.firstChartMs").string_value().c_str());
  const auto expect_run_view = [&](std::int64_t last_step) {
    const v1::RunSummary s = Summary(reader, "exp-spike");
    ASSERT_EQ(s.info().last_step(), last_step);
    // The summary's numbers are on the page once it has been refreshed.
    browser_.Wait(ShowsNumber(Field("count-skip"), s.steps_by_regime().at("skip")) + " && " +
                  ShowsNumber(Field("cal-count"), s.calibration().count()));
    EXPECT_EQ(Shown(browser_.Text(Field("latest-step"))), last_step);
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-cosine"))), s.latest().cosine(), 5.001e-5);
    // m_t: the mean of rank 0's last W stored c_t of valid steps.
    std::vector<v1::StepRecord> steps;
    ASSERT_TRUE(reader.AllSteps("exp-spike", &steps).ok());
    std::vector<double> cosines;
    for (const v1::StepRecord& r : steps) {
      if (r.rank() == 0 && r.has_cosine() && r.regime() != v1::REGIME_INVALID && r.regime() != v1::REGIME_SPIKE) {
        cosines.push_back(r.cosine());
      }
    }
    const std::size_t w = s.info().config().window() == 0 ? 20 : s.info().config().window();
    ASSERT_GE(cosines.size(), w);
    double sum = 0;
    for (std::size_t i = cosines.size() - w; i < cosines.size(); ++i) sum += cosines[i];
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-window-mean"))), sum / static_cast<double>(w), 5.001e-5);
    EXPECT_EQ(browser_.Text(Field("latest-regime")), controller::RegimeName(*proto::FromProto(s.latest().regime())));
    EXPECT_EQ(Shown(browser_.Text(Field("latest-staleness"))), s.latest().staleness());
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-grad-norm-z"))), s.latest().grad_norm_z(), 5.001e-3);
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-grad-norm"))), s.latest().grad_norm(), 5e-4 * s.latest().grad_norm());
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-ref-norm"))), s.latest().ref_norm(), 5e-4 * s.latest().ref_norm());
    // The policy-health rows, and their chart (shown: the run has signals).
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-ess-token"))), s.latest().ess_token(), 5.001e-5);
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-clip-fraction-low"))), s.latest().clip_fraction_low(), 5.001e-5);
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-clip-fraction-high"))), s.latest().clip_fraction_high(), 5.001e-5);
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-kl-k3"))), s.latest().kl_k3(), 5e-4 * s.latest().kl_k3());
    EXPECT_NEAR(Shown(browser_.Text(Field("latest-entropy-mean"))), s.latest().entropy_mean(),
                5e-4 * s.latest().entropy_mean());
    browser_.Wait("!document.querySelector('#chart-policy').hidden && document.querySelector('#chart-policy canvas')");
    // The card's rows: the record fields of web/latest_step.h and the
    // page's own (m_t, "decided with", "last report"; data-place in
    // web/index.html), by place.
    std::vector<std::pair<int, std::string>> rows = {
        {web::kPlaceWindowMean, "mt"}, {web::kPlaceDecidedWith, "decided with"}, {web::kPlaceLastReport, "last report"}};
    for (const web::LatestStepRow& row : web::kLatestStepRows) rows.emplace_back(row.place, row.label);
    std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string labels;
    for (const auto& [place, label] : rows) labels += (labels.empty() ? "" : "|") + label;
    EXPECT_EQ(browser_.Eval("[...document.querySelectorAll('#latest-fields dt')].map((x) => x.textContent).join('|')")
                  .string_value(),
              labels);
    EXPECT_EQ(s.steps_by_regime().at("spike"), 1u);  // the guard's step, marked on the page
    for (const char* regime : {"safe", "project", "skip", "invalid", "spike"}) {
      EXPECT_EQ(Shown(browser_.Text(Field(std::string("count-") + regime))), s.steps_by_regime().at(regime))
          << regime;
    }
    EXPECT_NEAR(Shown(browser_.Text(Field("cal-q90"))), s.calibration().q90(), 5.001e-5);
    EXPECT_NEAR(Shown(browser_.Text(Field("cal-max"))), s.calibration().max(), 5.001e-5);
  };
  expect_run_view(169);
  v1::RunConfig config;
  ASSERT_TRUE(reader.GetRunConfig("exp-spike", &config).ok());
  EXPECT_EQ(Shown(browser_.Eval("document.querySelector('#cfg-c-low').value").string_value()),
            config.thresholds().c_low());
  EXPECT_EQ(Shown(browser_.Eval("document.querySelector('#cfg-c-high').value").string_value()),
            config.thresholds().c_high());
  // The per-layer heat map is there: the run has layer records.
  browser_.Wait("!document.querySelector('#heatmap-section').hidden && document.querySelector('#heatmap canvas')");

  // Steps ingested after the load appear without a reload.
  browser_.Eval("window.gacNoReload = 'still the same document'");
  std::thread live([&] { EXPECT_TRUE(Stream(writer, spike, 60, &spike_seq, std::chrono::milliseconds(40)).ok()); });
  browser_.Wait("Number(document.querySelector('" + Field("latest-step") + "').textContent) > 169");
  live.join();
  browser_.Wait(ShowsNumber(Field("latest-step"), 229));
  EXPECT_EQ(browser_.Eval("window.gacNoReload").string_value(), "still the same document");
  expect_run_view(229);

  // Thresholds through the page's form: the message it shows once gacd
  // answered, and its class ("message ok" or "message error").
  const auto save = [&](const std::string& c_low, const std::string& c_high, const std::string& reason) {
    browser_.Fill("#cfg-c-low", c_low);
    browser_.Fill("#cfg-c-high", c_high);
    browser_.Fill("#cfg-reason", reason);
    browser_.Click("#cfg-save");
    const std::string cls = browser_.Wait(
        "document.querySelector('#cfg-message').className !== 'message' && "
        "document.querySelector('#cfg-message').className").string_value();
    return std::make_pair(cls, browser_.Text("#cfg-message"));
  };
  // What gRPC's SetRunConfig says to `client` for the same change.
  const auto refusal = [&](Client& client, double c_low, double c_high) {
    v1::SetRunConfigRequest change;
    change.set_run("exp-spike");
    change.mutable_thresholds()->set_c_low(c_low);
    change.mutable_thresholds()->set_c_high(c_high);
    change.set_mode(v1::CONTROL_MODE_LOCAL);
    v1::RunConfig unused;
    return client.SetRunConfig(change, &unused);
  };

  // A read-only token is refused with the server's message.
  const grpc::Status denied = refusal(reader, 0.08, 0.35);
  ASSERT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(save("0.08", "0.35", ""), std::make_pair(std::string("message error"), denied.error_message()));

  // An admin token (through the form): a bad pair is refused with the
  // server's validation message, a good one is stored.
  browser_.Click("#token-button");
  browser_.Fill("#token-input", kAdminToken);
  browser_.Click("#token-panel button[type=submit]");
  browser_.Wait("document.body.dataset.firstChartMs");
  const grpc::Status invalid = refusal(admin, 0.5, 0.4);
  ASSERT_EQ(invalid.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(save("0.5", "0.4", ""), std::make_pair(std::string("message error"), invalid.error_message()));
  EXPECT_EQ(save("0.08", "0.35", "tightened from the page"),
            std::make_pair(std::string("message ok"), std::string("saved: version 1")));
  ASSERT_TRUE(reader.GetRunConfig("exp-spike", &config).ok());
  EXPECT_EQ(config.version(), 1u);
  EXPECT_EQ(config.thresholds().c_low(), 0.08);
  EXPECT_EQ(config.thresholds().c_high(), 0.35);
  EXPECT_EQ(config.updated_by(), "admin");
  EXPECT_NE(browser_.Text(Field("config-version")).find("version 1, by admin"), std::string::npos);
  // The values at the cursor fill every chart's legend (the cursors move together).
  browser_.Call("\"cmd\":\"hover\",\"selector\":\"#chart-cosine .u-over\",\"x\":0.62,\"y\":0.3");
  browser_.Wait("document.querySelector('#chart-norms .u-legend .u-value') && "
                "/[0-9]/.test(document.querySelectorAll('#chart-norms .u-legend .u-value')[1].textContent)");
  // The policy chart's legend: the ESS of the step under the cursor.
  browser_.Wait("/[0-9]/.test(document.querySelectorAll('#chart-policy .u-legend .u-value')[1].textContent)");
  browser_.Screenshot(kScreenshots + "/run.png", true);

  // Back on the list the new thresholds show.
  browser_.Open(origin_ + "/#/");
  browser_.Wait("[...document.querySelectorAll('#runs-table [data-field=\"thresholds\"]')].some(e => e.textContent === '0.08 / 0.35')");

  ExpectCleanEvents(browser_, {{401, "/api/v1/runs?page_size=1000"},
                               {403, "/api/v1/runs/exp-spike/config"},
                               {400, "/api/v1/runs/exp-spike/config"}});
}

TEST_F(WebPageTest, LoadsA100kStepRunWith50Layers) {
  // The run straight into a store file, then gacd on it.
  const std::string db = dir_.File("big.db");
  const auto made = Clock::now();
  std::string out;
  ASSERT_EQ(RunProcess({kSyntheticRun, "--db=" + db, "--run=exp-big", "--steps=100000", "--world=1", "--layers=50",
                        "--spike-start=60000", "--spike-hold=20000"},
                       "", &out),
            0)
      << out;
  std::printf("100,000 steps x 50 layers stored in %.1f s\n",
              std::chrono::duration<double>(Clock::now() - made).count());
  StartGacd({"--db=" + db});
  browser_.Call("\"cmd\":\"session\",\"key\":\"gacd-token\",\"value\":" + JsonQuote(kReaderToken));
  Client reader(gacd_->address(), kReaderToken);
  for (const char* load : {"first", "second"}) {
    const auto started = Clock::now();
    if (load == std::string("first")) {
      browser_.Open(origin_ + "/#/run/exp-big");
    } else {
      browser_.Call("\"cmd\":\"reload\"");
    }
    const double open_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
    const double first_chart = Shown(browser_.Wait("document.body.dataset.firstChartMs").string_value());
    const double first_steps = Shown(browser_.Eval("document.body.dataset.firstChartSteps").string_value());
    const double history = Shown(browser_.Wait("document.body.dataset.historyMs", 120000).string_value());
    // Where the time to the first chart went: the page's own files, then its
    // first request for steps (navigation-relative, from Resource Timing).
    const Value timing = browser_.Eval(
        "(() => { const n = performance.getEntriesByType('navigation')[0]; "
        "const s = performance.getEntriesByType('resource').find(e => e.name.includes('/steps?start_step=')); "
        "return {load: n.loadEventEnd, steps_start: s ? s.startTime : -1, steps_end: s ? s.responseEnd : -1, "
        "steps_bytes: s ? s.decodedBodySize : -1}; })()");
    std::printf("exp-big, %s load: load event after %.0f ms (%.0f ms in the page's timing); first steps request "
                "%.0f-%.0f ms (%.1f MB); first chart (latest %.0f steps) %.0f ms after navigation; whole history "
                "(100,000 steps) after %.0f ms\n",
                load, open_ms, JsonMember(timing, "load").number_value(),
                JsonMember(timing, "steps_start").number_value(), JsonMember(timing, "steps_end").number_value(),
                JsonMember(timing, "steps_bytes").number_value() / 1e6, first_steps, first_chart, history);
    EXPECT_EQ(first_steps, 5000);
    EXPECT_EQ(Shown(browser_.Text(Field("latest-step"))), 99999);
    EXPECT_EQ(browser_.Text(Field("history")), "");
  }
  const v1::RunSummary s = Summary(reader, "exp-big");
  browser_.Wait(ShowsNumber(Field("count-skip"), s.steps_by_regime().at("skip")), 60000);
  EXPECT_EQ(Shown(browser_.Text(Field("count-safe"))), s.steps_by_regime().at("safe"));
  EXPECT_EQ(Shown(browser_.Text(Field("cal-count"))), s.calibration().count());
  browser_.Wait("document.querySelector('#heatmap canvas')", 60000);
  browser_.Screenshot(kScreenshots + "/run-100k.png", true);
  ExpectCleanEvents(browser_, {});
}

}  // namespace
}  // namespace gac::testing
