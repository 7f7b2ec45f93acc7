// Tests of the Prometheus exporter through its text exposition: every
// assertion reads Render() back with a small parser of the text format.

#include "server/src/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <vector>

#include "gac/proto/record_schema.h"

namespace gac::server {
namespace {

using Clock = std::chrono::system_clock;
using Labels = std::map<std::string, std::string>;

// One sample line of the exposition: name{labels} value.
struct Sample {
  std::string name;
  Labels labels;
  double value = 0.0;
};

double ParseValue(const std::string& text) {
  if (text == "+Inf") return INFINITY;
  if (text == "-Inf") return -INFINITY;
  if (text == "NaN" || text == "Nan") return NAN;
  return std::stod(text);
}

// Parses the sample lines of the text format (comments skipped; label values
// unescaped). Fails the test on a line it cannot read.
std::vector<Sample> Parse(const std::string& text) {
  std::vector<Sample> samples;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    std::size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') s.name += line[i++];
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        std::string key;
        while (i < line.size() && line[i] != '=') key += line[i++];
        EXPECT_TRUE(i + 1 < line.size() && line[i + 1] == '"') << line;
        i += 2;
        std::string value;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            ++i;
            value += line[i] == 'n' ? '\n' : line[i];
          } else {
            value += line[i];
          }
          ++i;
        }
        ++i;  // closing quote
        if (i < line.size() && line[i] == ',') ++i;
        s.labels[key] = value;
      }
      ++i;  // closing brace
    }
    EXPECT_TRUE(i < line.size() && line[i] == ' ') << line;
    std::string value = line.substr(i + 1);
    const std::size_t space = value.find(' ');  // an optional timestamp follows
    if (space != std::string::npos) value = value.substr(0, space);
    s.value = ParseValue(value);
    samples.push_back(std::move(s));
  }
  return samples;
}

// The value of the series with exactly these labels, if exported.
std::optional<double> Value(const std::vector<Sample>& samples, const std::string& name,
                            const Labels& labels = {}) {
  for (const Sample& s : samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

// The number of series of `name` whose labels include `subset`.
std::size_t Count(const std::vector<Sample>& samples, const std::string& name, const Labels& subset = {}) {
  std::size_t n = 0;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : subset) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) match = false;
    }
    if (match) ++n;
  }
  return n;
}

// The number of series (of any name) carrying run=`run`.
std::size_t CountRun(const std::vector<Sample>& samples, const std::string& run) {
  std::size_t n = 0;
  for (const Sample& s : samples) {
    auto it = s.labels.find("run");
    if (it != s.labels.end() && it->second == run) ++n;
  }
  return n;
}

// A local-mode step (its regime applied).
v1::StepRecord Step(const std::string& run, std::uint32_t rank, std::int64_t step,
                    v1::Regime regime = v1::REGIME_SAFE) {
  v1::StepRecord r;
  r.set_mode(v1::CONTROL_MODE_LOCAL);
  r.set_run(run);
  r.set_rank(rank);
  r.set_world_size(rank + 1);
  r.set_step(step);
  r.set_regime(regime);
  r.set_grad_norm(2.0);
  r.set_ref_norm(3.0);
  r.set_alpha(1.0);
  return r;
}

void AddLayer(v1::StepRecord& r, const std::string& name, std::optional<double> cosine, double grad_norm) {
  v1::LayerRecord* l = r.add_layers();
  l->set_name(name);
  if (cosine) l->set_cosine(*cosine);
  l->set_grad_norm(grad_norm);
  l->set_ref_norm(1.0);
}

const Clock::time_point kT0 = Clock::time_point(std::chrono::seconds(1700000000));

Labels RR(const std::string& run, const std::string& rank) { return {{"run", run}, {"rank", rank}}; }

// Each field of the record schema has a gauge of its latest value
// (FieldGaugeName, metrics.cc's table) or is left out here with the reason;
// a field added to the schema, or a name of the table that is no field's,
// fails here until that is decided. Every gauge is a gac_ name of its own.
TEST(MetricsTest, EveryFieldHasAGaugeOrSaysWhyNot) {
  const std::map<std::string, std::string> no_gauge = {
      {"rank", "a label of every per-rank series"},
      {"world_size", "constant over a run: gacctl runs"},
      {"regime", "gac_steps_total{regime}, gac_skipped_updates_total, gac_spikes_total"},
      {"wall_time_ns", "gac_last_report_timestamp_seconds"},
      {"mode", "gac_steps_total{mode}"},
      {"fallback", "gac_controller_fallbacks_total"},
      {"c_low", "the rule: gac_threshold_c_low (DecidedWith)"},
      {"c_high", "the rule: gac_threshold_c_high"},
      {"trigger", "the rule: the threshold gauges it selects"},
      {"window", "the rule: gac_window_steps"},
      {"window_c_low", "the rule: gac_threshold_window_c_low"},
      {"window_c_high", "the rule: gac_threshold_window_c_high"},
  };
  std::set<std::string> gauges;
  for (const proto::StepField& f : proto::kStepFields) {
    const char* gauge = FieldGaugeName(f.name);
    EXPECT_NE(gauge != nullptr, no_gauge.count(f.name) == 1) << f.name << ": give it a gauge, or say in no_gauge why not";
    if (gauge == nullptr) continue;
    EXPECT_TRUE(gauges.insert(gauge).second) << "gauge named twice: " << gauge;
    EXPECT_EQ(std::string(gauge).rfind("gac_", 0), 0u) << gauge;
  }
  for (const auto& [name, reason] : no_gauge) EXPECT_NE(proto::FindStepField(name), nullptr) << name;
  EXPECT_EQ(FieldGaugeName("window_mean"), nullptr) << "m_t is not a field: gac_window_mean";
}

// The policy-health alerts' baselines: the median of a rank's first 20
// reported values of ess_token and of kl_k3, absent until then, then fixed;
// records without the signal do not count, and each rank has its own.
TEST(MetricsTest, EarlyMediansOfEssAndKlAfterTwentyValues) {
  Metrics m;
  // ess_token at steps 0..29 of rank 0: a permutation of 0.30..0.49 first
  // (median of those 20: (0.39 + 0.40) / 2), then far lower values that the
  // baseline must not see; every third step carries no signal.
  std::vector<double> ess;
  for (int i = 0; i < 20; ++i) ess.push_back(0.30 + 0.01 * ((i * 7) % 20));
  for (int i = 0; i < 10; ++i) ess.push_back(0.01);
  std::int64_t step = 0;
  for (std::size_t seen = 1; seen <= ess.size(); ++seen) {
    const double value = ess[seen - 1];
    v1::StepRecord bare = Step("r1", 0, step++);
    m.ObserveStep(bare, kT0);
    v1::StepRecord r = Step("r1", 0, step++);
    r.set_ess_token(value);
    r.set_kl_k3(value / 100);
    m.ObserveStep(r, kT0);
    const auto s = Parse(m.Render());
    ASSERT_EQ(Count(s, "gac_ess_token_early_median_ratio"), seen >= 20 ? 1u : 0u) << seen;
    ASSERT_EQ(Count(s, "gac_kl_k3_early_median_nats"), seen >= 20 ? 1u : 0u) << seen;
    EXPECT_NEAR(Value(s, "gac_ess_token_ratio", RR("r1", "0")).value_or(-1), value, 1e-12);
  }
  const auto s = Parse(m.Render());
  EXPECT_NEAR(Value(s, "gac_ess_token_early_median_ratio", RR("r1", "0")).value_or(-1), 0.395, 1e-12);
  EXPECT_NEAR(Value(s, "gac_kl_k3_early_median_nats", RR("r1", "0")).value_or(-1), 0.00395, 1e-12);
  // Rank 1 has no baseline of its own yet.
  v1::StepRecord other = Step("r1", 1, 0);
  other.set_ess_token(0.9);
  m.ObserveStep(other, kT0);
  EXPECT_EQ(Count(Parse(m.Render()), "gac_ess_token_early_median_ratio", RR("r1", "1")), 0u);
}

TEST(MetricsTest, LatestGaugesAndCosineOnlyOnceReported) {
  Metrics m;
  v1::StepRecord r = Step("r1", 0, 7);
  m.ObserveStep(r, kT0);
  auto s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_step", RR("r1", "0")), 7.0);
  EXPECT_EQ(Value(s, "gac_grad_norm", RR("r1", "0")), 2.0);
  EXPECT_EQ(Value(s, "gac_ref_norm", RR("r1", "0")), 3.0);
  EXPECT_EQ(Value(s, "gac_alpha", RR("r1", "0")), 1.0);
  EXPECT_EQ(Value(s, "gac_agent_overhead_seconds", RR("r1", "0")), 0.0);
  // No cosine, cosine_after or staleness reported yet: no series at all.
  EXPECT_EQ(Count(s, "gac_cosine"), 0u);
  EXPECT_EQ(Count(s, "gac_cosine_after"), 0u);
  EXPECT_EQ(Count(s, "gac_staleness_steps"), 0u);

  r = Step("r1", 0, 8, v1::REGIME_PROJECT);
  r.set_cosine(0.25);
  r.set_cosine_after(0.1);
  r.set_alpha(0.4);
  r.set_staleness(3);
  r.set_agent_overhead_seconds(0.002);
  m.ObserveStep(r, kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_cosine", RR("r1", "0")), 0.25);
  EXPECT_EQ(Value(s, "gac_cosine_after", RR("r1", "0")), 0.1);
  EXPECT_EQ(Value(s, "gac_alpha", RR("r1", "0")), 0.4);
  EXPECT_EQ(Value(s, "gac_staleness_steps", RR("r1", "0")), 3.0);
  EXPECT_EQ(Value(s, "gac_agent_overhead_seconds", RR("r1", "0")), 0.002);

  // A later record without them leaves the last values (never NaN).
  m.ObserveStep(Step("r1", 0, 9, v1::REGIME_INVALID), kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_cosine", RR("r1", "0")), 0.25);
  EXPECT_EQ(Value(s, "gac_cosine_after", RR("r1", "0")), 0.1);
  EXPECT_EQ(Value(s, "gac_staleness_steps", RR("r1", "0")), 3.0);
  EXPECT_EQ(Value(s, "gac_step", RR("r1", "0")), 9.0);
  EXPECT_EQ(Value(s, "gac_alpha", RR("r1", "0")), 1.0);
}

// gac_window_mean is the mean of the rank's last W stored cosines, from every
// stored step whatever is scraped in between; steps without a cosine do not
// enter; W follows the run's settings.
TEST(MetricsTest, WindowMeanIsTheMeanOfTheLastWStoredCosines) {
  Metrics m;
  v1::RunConfig config;
  config.mutable_thresholds()->set_c_low(0.05);
  config.mutable_thresholds()->set_c_high(0.3);
  config.set_window(5);
  config.mutable_window_thresholds()->set_c_low(0.2);
  config.mutable_window_thresholds()->set_c_high(0.6);
  m.ObserveConfig("r1", config, kT0);
  auto s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_threshold_window_c_low", {{"run", "r1"}}), 0.2);
  EXPECT_EQ(Value(s, "gac_threshold_window_c_high", {{"run", "r1"}}), 0.6);
  EXPECT_EQ(Value(s, "gac_window_steps", {{"run", "r1"}}), 5.0);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> valid;  // the reference: every cosine that enters
  for (int step = 0; step < 200; ++step) {
    v1::StepRecord r = Step("r1", 0, step);
    if (step % 17 == 5) {
      r.set_regime(v1::REGIME_INVALID);  // no cosine
    } else if (step % 13 != 0) {
      r.set_cosine(u(rng));
      valid.push_back(r.cosine());
    }
    m.ObserveStep(r, kT0);
    if (step % 37 != 0 && step != 199) continue;  // a scrape now and then
    s = Parse(m.Render());
    if (valid.size() < 5) {
      EXPECT_FALSE(Value(s, "gac_window_mean", RR("r1", "0")).has_value()) << step;
      continue;
    }
    long double sum = 0;
    for (std::size_t i = valid.size() - 5; i < valid.size(); ++i) sum += valid[i];
    EXPECT_NEAR(*Value(s, "gac_window_mean", RR("r1", "0")), static_cast<double>(sum / 5), 1e-15) << step;
  }
  // A smaller window keeps the newest values.
  config.set_window(3);
  m.ObserveConfig("r1", config, kT0);
  v1::StepRecord r = Step("r1", 0, 200);
  r.set_cosine(0.5);
  valid.push_back(0.5);
  m.ObserveStep(r, kT0);
  s = Parse(m.Render());
  const double want = (valid[valid.size() - 3] + valid[valid.size() - 2] + valid[valid.size() - 1]) / 3;
  EXPECT_NEAR(*Value(s, "gac_window_mean", RR("r1", "0")), want, 1e-15);
  EXPECT_EQ(Value(s, "gac_window_steps", {{"run", "r1"}}), 3.0);
}

TEST(MetricsTest, LastReportTimestampPrefersWallTime) {
  Metrics m;
  m.ObserveStep(Step("r1", 0, 1), kT0);
  v1::StepRecord r = Step("r1", 1, 1);
  r.set_wall_time_ns(1690000000500000000);
  m.ObserveStep(r, kT0);
  auto s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_last_report_timestamp_seconds", RR("r1", "0")), 1700000000.0);
  EXPECT_DOUBLE_EQ(*Value(s, "gac_last_report_timestamp_seconds", RR("r1", "1")), 1690000000.5);
}

TEST(MetricsTest, RegimesSkippedAndFallbacksAreCounted) {
  Metrics m;
  const std::vector<std::pair<v1::Regime, int>> plan = {
      {v1::REGIME_SAFE, 3}, {v1::REGIME_PROJECT, 2}, {v1::REGIME_SKIP, 4}, {v1::REGIME_INVALID, 1}};
  std::int64_t step = 0;
  for (const auto& [regime, n] : plan) {
    for (int i = 0; i < n; ++i) {
      v1::StepRecord r = Step("r1", 0, step++, regime);
      r.set_fallback(step % 5 == 0);  // steps 5 and 10
      m.ObserveStep(r, kT0);
    }
  }
  // Another rank: its own series, every regime present from the start.
  m.ObserveStep(Step("r1", 1, 0), kT0);
  auto s = Parse(m.Render());
  auto steps = [&](const std::string& rank, const std::string& regime) {
    return Value(s, "gac_steps_total", {{"run", "r1"}, {"rank", rank}, {"regime", regime}, {"mode", "local"}});
  };
  EXPECT_EQ(steps("0", "safe"), 3.0);
  EXPECT_EQ(steps("0", "project"), 2.0);
  EXPECT_EQ(steps("0", "skip"), 4.0);
  EXPECT_EQ(steps("0", "invalid"), 1.0);
  EXPECT_EQ(Value(s, "gac_skipped_updates_total", RR("r1", "0")), 5.0);
  EXPECT_EQ(Value(s, "gac_controller_fallbacks_total", RR("r1", "0")), 2.0);
  EXPECT_EQ(steps("1", "safe"), 1.0);
  EXPECT_EQ(steps("1", "project"), 0.0);
  EXPECT_EQ(steps("1", "skip"), 0.0);
  EXPECT_EQ(steps("1", "invalid"), 0.0);
  EXPECT_EQ(Value(s, "gac_skipped_updates_total", RR("r1", "1")), 0.0);
  EXPECT_EQ(Value(s, "gac_controller_fallbacks_total", RR("r1", "1")), 0.0);
  EXPECT_EQ(Count(s, "gac_steps_total"), 10u);  // 5 regimes x 2 ranks
}

// Spike steps: counted by gac_spikes_total in every mode, as skipped updates
// where the mode applies decisions; the guard's z-scores are gauges from
// the first record that carries them.
TEST(MetricsTest, SpikesAreCountedAndTheirZScoresExported) {
  Metrics m;
  m.ObserveStep(Step("r1", 0, 0), kT0);
  auto s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_spikes_total", RR("r1", "0")), 0.0);
  EXPECT_FALSE(Value(s, "gac_grad_norm_z", RR("r1", "0")).has_value());
  v1::StepRecord spike = Step("r1", 0, 1, v1::REGIME_SPIKE);
  spike.set_grad_norm_z(41.5);
  spike.set_loss_z(-0.25);
  m.ObserveStep(spike, kT0);
  v1::StepRecord would = Step("r1", 0, 2, v1::REGIME_SPIKE);
  would.set_mode(v1::CONTROL_MODE_MONITOR);
  would.set_grad_norm_z(7.0);
  m.ObserveStep(would, kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_spikes_total", RR("r1", "0")), 2.0);
  EXPECT_EQ(Value(s, "gac_skipped_updates_total", RR("r1", "0")), 1.0);  // the monitor-mode one skipped nothing
  EXPECT_EQ(Value(s, "gac_grad_norm_z", RR("r1", "0")), 7.0);
  EXPECT_EQ(Value(s, "gac_loss_z", RR("r1", "0")), -0.25);  // left at its last value
  EXPECT_EQ(Value(s, "gac_steps_total", {{"run", "r1"}, {"rank", "0"}, {"regime", "spike"}, {"mode", "local"}}), 1.0);
  EXPECT_EQ(Value(s, "gac_steps_total", {{"run", "r1"}, {"rank", "0"}, {"regime", "spike"}, {"mode", "monitor"}}),
            1.0);
}

// Monitor mode: the regimes are what GAC would have done. They are counted
// under mode="monitor" (UNSPECIFIED reads as monitor), apart from applied
// ones, and no update counts as skipped.
TEST(MetricsTest, MonitorModeRegimesAreCountedApartAndSkipNothing) {
  Metrics m;
  v1::StepRecord monitor = Step("r1", 0, 0, v1::REGIME_SKIP);
  monitor.set_mode(v1::CONTROL_MODE_MONITOR);
  m.ObserveStep(monitor, kT0);
  v1::StepRecord unspecified = Step("r1", 0, 1, v1::REGIME_PROJECT);
  unspecified.set_mode(v1::CONTROL_MODE_UNSPECIFIED);
  m.ObserveStep(unspecified, kT0);
  auto s = Parse(m.Render());
  const auto steps = [&](const std::string& regime, const std::string& mode) {
    return Value(s, "gac_steps_total", {{"run", "r1"}, {"rank", "0"}, {"regime", regime}, {"mode", mode}});
  };
  EXPECT_EQ(steps("skip", "monitor"), 1.0);
  EXPECT_EQ(steps("project", "monitor"), 1.0);
  EXPECT_EQ(steps("safe", "monitor"), 0.0);
  EXPECT_FALSE(steps("skip", "local").has_value());  // no local step yet: no local series
  EXPECT_EQ(Value(s, "gac_skipped_updates_total", RR("r1", "0")), 0.0);
  // The same rank switching to local mode: its own series, and a real skip.
  m.ObserveStep(Step("r1", 0, 2, v1::REGIME_SKIP), kT0);
  s = Parse(m.Render());
  EXPECT_EQ(steps("skip", "local"), 1.0);
  EXPECT_EQ(steps("skip", "monitor"), 1.0);
  EXPECT_EQ(Value(s, "gac_skipped_updates_total", RR("r1", "0")), 1.0);
  EXPECT_EQ(Count(s, "gac_steps_total"), 10u);  // 5 regimes x 2 modes, bounded by 15 a rank
}

TEST(MetricsTest, TrainerScalarsOneSeriesPerNameCappedPerRun) {
  Metrics m;
  v1::StepRecord r = Step("r1", 0, 1);
  (*r.mutable_scalars())["loss"] = 1.5;
  (*r.mutable_scalars())["reward"] = -0.5;
  m.ObserveStep(r, kT0);
  (*r.mutable_scalars())["loss"] = 1.25;
  m.ObserveStep(r, kT0);
  auto s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_trainer_scalar", {{"run", "r1"}, {"rank", "0"}, {"name", "loss"}}), 1.25);
  EXPECT_EQ(Value(s, "gac_trainer_scalar", {{"run", "r1"}, {"rank", "0"}, {"name", "reward"}}), -0.5);
  EXPECT_EQ(Count(s, "gac_trainer_scalar"), 2u);

  // 40 names in all: 32 exported per run, shared by its ranks; 8 dropped per record.
  v1::StepRecord many = Step("r1", 1, 1);
  for (int i = 0; i < 40; ++i) (*many.mutable_scalars())["s" + std::to_string(i)] = i;
  m.ObserveStep(many, kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Count(s, "gac_trainer_scalar", {{"run", "r1"}}), 32u);
  EXPECT_EQ(Count(s, "gac_trainer_scalar", {{"run", "r1"}, {"rank", "1"}}), 30u);
  EXPECT_EQ(Value(s, "gac_scalar_series_dropped_total"), 10.0);
  // Rank 0 may still use its names; a new name stays out.
  (*r.mutable_scalars())["kl"] = 0.01;
  m.ObserveStep(r, kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_trainer_scalar", {{"run", "r1"}, {"rank", "0"}, {"name", "loss"}}), 1.25);
  EXPECT_FALSE(Value(s, "gac_trainer_scalar", {{"run", "r1"}, {"rank", "0"}, {"name", "kl"}}));
  EXPECT_EQ(Value(s, "gac_scalar_series_dropped_total"), 11.0);
  // Another run has its own budget.
  v1::StepRecord other = Step("r2", 0, 1);
  (*other.mutable_scalars())["kl"] = 0.02;
  m.ObserveStep(other, kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_trainer_scalar", {{"run", "r2"}, {"rank", "0"}, {"name", "kl"}}), 0.02);
}

// A run decided in the trainer: the threshold gauges and W are the rule its
// latest step reports, over gacd's settings; back to gacd's when a step
// comes without one (gacd decided it), and m_t is over the agent's W.
TEST(MetricsTest, ThresholdsOfARunDecidedInTheTrainerAreItsOwn) {
  Metrics m;
  v1::RunConfig config;
  config.mutable_thresholds()->set_c_low(0.05);
  config.mutable_thresholds()->set_c_high(0.3);
  m.ObserveConfig("t", config, kT0);
  v1::StepRecord own = Step("t", 0, 1);
  own.set_c_low(0.02);
  own.set_c_high(0.6);
  own.set_trigger(v1::TRIGGER_WINDOW);
  own.set_window(2);
  own.set_window_c_low(0.1);
  own.set_window_c_high(0.4);
  m.ObserveStep(own, kT0);
  auto s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_threshold_c_low", {{"run", "t"}}), 0.02);
  EXPECT_EQ(Value(s, "gac_threshold_c_high", {{"run", "t"}}), 0.6);
  EXPECT_EQ(Value(s, "gac_threshold_window_c_low", {{"run", "t"}}), 0.1);
  EXPECT_EQ(Value(s, "gac_threshold_window_c_high", {{"run", "t"}}), 0.4);
  EXPECT_EQ(Value(s, "gac_window_steps", {{"run", "t"}}), 2.0);
  // gacd's settings change: the trainer's rule still shows.
  config.mutable_thresholds()->set_c_low(0.07);
  m.ObserveConfig("t", config, kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_threshold_c_low", {{"run", "t"}}), 0.02);
  // A step gacd decided (no rule): its settings.
  m.ObserveStep(Step("t", 0, 2), kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_threshold_c_low", {{"run", "t"}}), 0.07);
  EXPECT_EQ(Value(s, "gac_threshold_c_high", {{"run", "t"}}), 0.3);
  EXPECT_EQ(Value(s, "gac_window_steps", {{"run", "t"}}), 20.0);
}

TEST(MetricsTest, ThresholdsDecisionsAndDecideLatency) {
  Metrics m;
  v1::RunConfig config;
  config.mutable_thresholds()->set_c_low(0.05);
  config.mutable_thresholds()->set_c_high(0.5);
  m.ObserveConfig("r1", config, kT0);
  auto s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_threshold_c_low", {{"run", "r1"}}), 0.05);
  EXPECT_EQ(Value(s, "gac_threshold_c_high", {{"run", "r1"}}), 0.5);
  EXPECT_EQ(Count(s, "gac_decisions_total"), 0u);

  config.mutable_thresholds()->set_c_low(0.1);
  m.ObserveConfig("r1", config, kT0);
  m.ObserveDecide("r1", v1::REGIME_SAFE, 0.0001, kT0);
  m.ObserveDecide("r1", v1::REGIME_SKIP, 0.0003, kT0);
  m.ObserveDecide("r1", v1::REGIME_SKIP, 0.2, kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_threshold_c_low", {{"run", "r1"}}), 0.1);
  EXPECT_EQ(Value(s, "gac_decisions_total", {{"run", "r1"}, {"regime", "safe"}}), 1.0);
  EXPECT_EQ(Value(s, "gac_decisions_total", {{"run", "r1"}, {"regime", "project"}}), 0.0);
  EXPECT_EQ(Value(s, "gac_decisions_total", {{"run", "r1"}, {"regime", "skip"}}), 2.0);
  EXPECT_EQ(Value(s, "gac_decisions_total", {{"run", "r1"}, {"regime", "invalid"}}), 0.0);
  EXPECT_EQ(Value(s, "gac_decide_seconds_count"), 3.0);
  EXPECT_DOUBLE_EQ(*Value(s, "gac_decide_seconds_sum"), 0.2004);
  EXPECT_EQ(Value(s, "gac_decide_seconds_bucket", {{"le", "5e-05"}}), 0.0);
  EXPECT_EQ(Value(s, "gac_decide_seconds_bucket", {{"le", "0.0001"}}), 1.0);
  EXPECT_EQ(Value(s, "gac_decide_seconds_bucket", {{"le", "0.1024"}}), 2.0);
  EXPECT_EQ(Value(s, "gac_decide_seconds_bucket", {{"le", "+Inf"}}), 3.0);
  EXPECT_EQ(Count(s, "gac_decide_seconds_bucket"), 13u);
}

TEST(MetricsTest, SelfMetrics) {
  Metrics m;
  auto s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_ingest_rows_total", {{"kind", "step"}}), 0.0);
  EXPECT_EQ(Value(s, "gac_ingest_rows_total", {{"kind", "layer"}}), 0.0);
  EXPECT_EQ(Value(s, "gac_runs_exported"), 0.0);
  EXPECT_EQ(Value(s, "gac_expired_runs_total"), 0.0);
  EXPECT_EQ(Value(s, "gac_layer_series_dropped_total"), 0.0);

  m.ObserveIngest(10, 200, 2);
  m.ObserveIngest(5, 0, 0);
  m.ObserveRpcError("Ingest", "INVALID_ARGUMENT");
  m.ObserveRpcError("Ingest", "INVALID_ARGUMENT");
  m.ObserveRpcError("Decide", "UNAUTHENTICATED");
  m.SetQueueRows(42);
  m.ObserveWriteSeconds(0.003);
  m.ObserveWriteSeconds(20.0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_ingest_rows_total", {{"kind", "step"}}), 15.0);
  EXPECT_EQ(Value(s, "gac_ingest_rows_total", {{"kind", "layer"}}), 200.0);
  EXPECT_EQ(Value(s, "gac_ingest_batches_total"), 2.0);
  EXPECT_EQ(Value(s, "gac_ingest_duplicates_total"), 2.0);
  EXPECT_EQ(Value(s, "gac_rpc_errors_total", {{"method", "Ingest"}, {"code", "INVALID_ARGUMENT"}}), 2.0);
  EXPECT_EQ(Value(s, "gac_rpc_errors_total", {{"method", "Decide"}, {"code", "UNAUTHENTICATED"}}), 1.0);
  EXPECT_EQ(Value(s, "gac_store_queue_rows"), 42.0);
  EXPECT_EQ(Value(s, "gac_store_write_seconds_count"), 2.0);
  EXPECT_EQ(Value(s, "gac_store_write_seconds_bucket", {{"le", "0.001"}}), 0.0);
  EXPECT_EQ(Value(s, "gac_store_write_seconds_bucket", {{"le", "0.004"}}), 1.0);
  EXPECT_EQ(Value(s, "gac_store_write_seconds_bucket", {{"le", "16.384"}}), 1.0);
  EXPECT_EQ(Value(s, "gac_store_write_seconds_bucket", {{"le", "+Inf"}}), 2.0);
}

TEST(MetricsTest, PerLayerSeriesOffByDefault) {
  Metrics m;
  v1::StepRecord r = Step("r1", 0, 1);
  AddLayer(r, "fc1.weight", 0.5, 1.0);
  m.ObserveStep(r, kT0);
  auto s = Parse(m.Render());
  EXPECT_EQ(Count(s, "gac_layer_cosine"), 0u);
  EXPECT_EQ(Count(s, "gac_layer_grad_norm"), 0u);
  EXPECT_EQ(Value(s, "gac_layer_series_dropped_total"), 0.0);
}

TEST(MetricsTest, PerLayerSeriesOptInAndCapped) {
  MetricsOptions options;
  options.per_layer = true;
  options.max_layers_per_run = 3;
  Metrics m(options);
  v1::StepRecord r = Step("r1", 0, 1);
  AddLayer(r, "a", 0.5, 1.0);
  AddLayer(r, "b", std::nullopt, 2.0);
  AddLayer(r, "odd \"name\"\\x", -0.25, 3.0);
  AddLayer(r, "d", 0.1, 4.0);
  AddLayer(r, "e", 0.1, 5.0);
  m.ObserveStep(r, kT0);
  auto s = Parse(m.Render());
  auto layer = [](const std::string& rank, const std::string& name) {
    return Labels{{"run", "r1"}, {"rank", rank}, {"layer", name}};
  };
  EXPECT_EQ(Value(s, "gac_layer_cosine", layer("0", "a")), 0.5);
  EXPECT_EQ(Value(s, "gac_layer_grad_norm", layer("0", "a")), 1.0);
  EXPECT_FALSE(Value(s, "gac_layer_cosine", layer("0", "b")));  // no cosine yet
  EXPECT_EQ(Value(s, "gac_layer_grad_norm", layer("0", "b")), 2.0);
  EXPECT_EQ(Value(s, "gac_layer_cosine", layer("0", "odd \"name\"\\x")), -0.25);
  EXPECT_EQ(Count(s, "gac_layer_grad_norm"), 3u);
  EXPECT_EQ(Count(s, "gac_layer_cosine"), 2u);
  EXPECT_EQ(Value(s, "gac_layer_series_dropped_total"), 2.0);

  // Rank 1 shares the run's names; "e" stays out.
  v1::StepRecord r1 = Step("r1", 1, 1);
  AddLayer(r1, "a", 0.75, 1.5);
  AddLayer(r1, "e", 0.1, 5.0);
  m.ObserveStep(r1, kT0);
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_layer_cosine", layer("1", "a")), 0.75);
  EXPECT_EQ(Value(s, "gac_layer_cosine", layer("0", "a")), 0.5);
  EXPECT_FALSE(Value(s, "gac_layer_grad_norm", layer("1", "e")));
  EXPECT_EQ(Count(s, "gac_layer_grad_norm"), 4u);
  EXPECT_EQ(Value(s, "gac_layer_series_dropped_total"), 3.0);
}

TEST(MetricsTest, ExpireIdleRemovesEveryRunSeriesAndRunComesBack) {
  MetricsOptions options;
  options.per_layer = true;
  options.run_ttl = std::chrono::minutes(15);
  Metrics m(options);
  v1::RunConfig config;
  config.mutable_thresholds()->set_c_low(0.05);
  config.mutable_thresholds()->set_c_high(0.5);

  v1::StepRecord r = Step("old", 0, 1, v1::REGIME_SKIP);
  r.set_cosine(0.9);
  r.set_cosine_after(0.05);
  r.set_staleness(1);
  (*r.mutable_scalars())["loss"] = 1.0;
  AddLayer(r, "fc", 0.5, 1.0);
  m.ObserveStep(r, kT0);
  m.ObserveStep(Step("old", 1, 1), kT0);
  m.ObserveConfig("old", config, kT0);
  m.ObserveDecide("old", v1::REGIME_SAFE, 0.001, kT0);
  m.ObserveStep(Step("new", 0, 1), kT0 + std::chrono::minutes(10));
  auto s = Parse(m.Render());
  EXPECT_GT(CountRun(s, "old"), 20u);
  EXPECT_EQ(m.runs_exported(), 2u);
  EXPECT_EQ(Value(s, "gac_runs_exported"), 2.0);

  EXPECT_EQ(m.ExpireIdle(kT0 + std::chrono::minutes(14)), 0u);
  EXPECT_EQ(m.ExpireIdle(kT0 + std::chrono::minutes(16)), 1u);
  s = Parse(m.Render());
  EXPECT_EQ(CountRun(s, "old"), 0u);
  EXPECT_GT(CountRun(s, "new"), 0u);
  EXPECT_EQ(m.runs_exported(), 1u);
  EXPECT_EQ(Value(s, "gac_runs_exported"), 1.0);
  EXPECT_EQ(Value(s, "gac_expired_runs_total"), 1.0);

  // Seen again: its series come back, counters restarting.
  m.ObserveStep(Step("old", 0, 2), kT0 + std::chrono::minutes(17));
  s = Parse(m.Render());
  EXPECT_EQ(Value(s, "gac_steps_total", {{"run", "old"}, {"rank", "0"}, {"regime", "safe"}, {"mode", "local"}}), 1.0);
  EXPECT_EQ(Value(s, "gac_steps_total", {{"run", "old"}, {"rank", "0"}, {"regime", "skip"}, {"mode", "local"}}), 0.0);
  EXPECT_EQ(Value(s, "gac_step", RR("old", "0")), 2.0);
  EXPECT_FALSE(Value(s, "gac_cosine", RR("old", "0")));
  EXPECT_EQ(Count(s, "gac_threshold_c_low"), 0u);
  EXPECT_EQ(m.runs_exported(), 2u);

  EXPECT_EQ(m.ExpireIdle(kT0 + std::chrono::hours(1)), 2u);
  s = Parse(m.Render());
  EXPECT_EQ(CountRun(s, "old") + CountRun(s, "new"), 0u);
  EXPECT_EQ(Value(s, "gac_expired_runs_total"), 3.0);
  EXPECT_EQ(Value(s, "gac_runs_exported"), 0.0);
}

TEST(MetricsTest, MaxRunsEvictsLeastRecentlySeen) {
  MetricsOptions options;
  options.max_runs = 2;
  Metrics m(options);
  m.ObserveStep(Step("a", 0, 1), kT0);
  m.ObserveStep(Step("b", 0, 1), kT0);
  m.ObserveStep(Step("a", 0, 2), kT0);  // a is now more recent than b
  m.ObserveStep(Step("c", 0, 1), kT0);  // evicts b
  auto s = Parse(m.Render());
  EXPECT_GT(CountRun(s, "a"), 0u);
  EXPECT_EQ(CountRun(s, "b"), 0u);
  EXPECT_GT(CountRun(s, "c"), 0u);
  EXPECT_EQ(Value(s, "gac_expired_runs_total"), 1.0);
  EXPECT_EQ(Value(s, "gac_runs_exported"), 2.0);

  // Decide and config also count as seeing a run.
  m.ObserveDecide("a", v1::REGIME_SAFE, 0.001, kT0);
  m.ObserveConfig("d", v1::RunConfig(), kT0);  // evicts c
  s = Parse(m.Render());
  EXPECT_GT(CountRun(s, "a"), 0u);
  EXPECT_EQ(CountRun(s, "c"), 0u);
  EXPECT_EQ(Value(s, "gac_threshold_c_low", {{"run", "d"}}), 0.0);
  EXPECT_EQ(Value(s, "gac_expired_runs_total"), 2.0);
  EXPECT_EQ(m.runs_exported(), 2u);
}

TEST(MetricsTest, ConcurrentObserveStepCountsExactly) {
  MetricsOptions options;
  options.per_layer = true;
  Metrics m(options);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      (void)m.Render();
      m.ExpireIdle(kT0);  // nothing is idle: must not disturb the counts
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Every thread writes every (run, rank), so series are shared.
        v1::StepRecord r = Step(i % 2 == 0 ? "even" : "odd", static_cast<std::uint32_t>(i % 3), i,
                                i % 4 == 0 ? v1::REGIME_SKIP : v1::REGIME_SAFE);
        r.set_cosine(0.1 * t);
        r.set_fallback(i % 10 == 0);
        (*r.mutable_scalars())["loss"] = i;
        AddLayer(r, "l" + std::to_string(i % 5), 0.5, 1.0);
        m.ObserveStep(r, kT0);
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  scraper.join();

  auto s = Parse(m.Render());
  double steps = 0, skip = 0, skipped = 0, fallbacks = 0;
  for (const Sample& x : s) {
    if (x.name == "gac_steps_total") {
      steps += x.value;
      if (x.labels.at("regime") == "skip") skip += x.value;
    }
    if (x.name == "gac_skipped_updates_total") skipped += x.value;
    if (x.name == "gac_controller_fallbacks_total") fallbacks += x.value;
  }
  EXPECT_EQ(steps, kThreads * kPerThread);
  EXPECT_EQ(skip, kThreads * kPerThread / 4);
  EXPECT_EQ(skipped, kThreads * kPerThread / 4);
  EXPECT_EQ(fallbacks, kThreads * kPerThread / 10);
  EXPECT_EQ(Count(s, "gac_cosine"), 6u);
  EXPECT_EQ(Count(s, "gac_layer_grad_norm"), 30u);
  // i % 2 and i % 4 agree: the "even" run has every skip.
  double even_skip = 0;
  for (int rank = 0; rank < 3; ++rank) {
    even_skip += *Value(s, "gac_steps_total", {{"run", "even"}, {"rank", std::to_string(rank)}, {"regime", "skip"}, {"mode", "local"}});
  }
  EXPECT_EQ(even_skip, kThreads * kPerThread / 4);
  EXPECT_EQ(m.runs_exported(), 2u);
}

// Runs expire and are evicted while other threads report to them. A run
// that comes back while its old series are being removed must get fresh
// series, not ones about to be deleted: afterwards every cached series must
// still be in the exposition.
TEST(MetricsTest, ConcurrentExpiryAndEvictionLeaveWholeRuns) {
  MetricsOptions options;
  options.per_layer = true;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 1000;
  constexpr int kLayers = 50;  // many series make removal slow: a wider window
  options.max_layers_per_run = kLayers;
  options.max_runs = 3;
  options.run_ttl = std::chrono::seconds(1);
  Metrics m(options);
  auto observe = [&m](const std::string& run, std::uint32_t rank, int step) {
    v1::StepRecord r = Step(run, rank, step);
    r.set_cosine(0.5);
    (*r.mutable_scalars())["loss"] = step;
    for (int l = 0; l < kLayers; ++l) AddLayer(r, "fc" + std::to_string(l), 0.5, 1.0);
    m.ObserveStep(r, kT0);
  };

  // Churn: four runs over three slots, and everything idle for the expirer.
  std::atomic<bool> done{false};
  std::thread expirer([&] {
    while (!done.load()) {
      m.ExpireIdle(kT0 + std::chrono::seconds(2));
      (void)m.Render();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string run = "run" + std::to_string((i + t) % 4);
        observe(run, static_cast<std::uint32_t>(i % 2), i);
        if (i % 7 == 0) m.ObserveDecide(run, v1::REGIME_SAFE, 1e-4, kT0);
        if (i % 11 == 0) m.ObserveConfig(run, v1::RunConfig(), kT0);
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  expirer.join();
  EXPECT_GT(*Value(Parse(m.Render()), "gac_expired_runs_total"), 0.0);

  // Settle: report to every (run, rank) of three runs, so cached series in use.
  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int run = 0; run < 3; ++run) {
        for (std::uint32_t rank = 0; rank < 2; ++rank) observe("run" + std::to_string(run), rank, 1);
      }
    });
  }
  for (auto& th : threads) th.join();

  auto s = Parse(m.Render());
  EXPECT_EQ(m.runs_exported(), 3u);
  EXPECT_EQ(Value(s, "gac_runs_exported"), 3.0);
  for (int run = 0; run < 3; ++run) {
    for (const std::string rank : {"0", "1"}) {
      const Labels rr = RR("run" + std::to_string(run), rank);
      EXPECT_EQ(Count(s, "gac_steps_total", rr), 5u) << rr.at("run") << " " << rank;  // one mode's regimes
      EXPECT_EQ(Value(s, "gac_step", rr), 1.0) << rr.at("run") << " " << rank;
      EXPECT_EQ(Value(s, "gac_cosine", rr), 0.5) << rr.at("run") << " " << rank;
      EXPECT_EQ(Count(s, "gac_trainer_scalar", rr), 1u) << rr.at("run") << " " << rank;
      EXPECT_EQ(Count(s, "gac_layer_grad_norm", rr), static_cast<std::size_t>(kLayers)) << rr.at("run");
      EXPECT_EQ(Count(s, "gac_layer_cosine", rr), static_cast<std::size_t>(kLayers)) << rr.at("run");
    }
  }
  // Everything goes once idle; nothing is left behind in any family.
  EXPECT_EQ(m.ExpireIdle(kT0 + std::chrono::seconds(2)), 3u);
  s = Parse(m.Render());
  for (const Sample& x : s) EXPECT_EQ(x.labels.count("run"), 0u) << x.name;
}

// Runs `command` with `input` on stdin; returns its exit status and output.
std::pair<int, std::string> RunWithInput(const std::string& command, const std::string& input) {
  char path[] = "/tmp/gac_metrics_test_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return {-1, "mkstemp failed"};
  const ssize_t written = write(fd, input.data(), input.size());
  close(fd);
  if (written != static_cast<ssize_t>(input.size())) return {-1, "write failed"};
  const std::string full = command + " < " + path + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  std::string output;
  if (pipe == nullptr) return {-1, "popen failed"};
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  unlink(path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(MetricsTest, PromtoolLintIsClean) {
  const char* promtool = "/usr/bin/promtool";
  if (access(promtool, X_OK) != 0) GTEST_SKIP() << promtool << " not installed";
  MetricsOptions options;
  options.per_layer = true;
  options.max_layers_per_run = 2;
  Metrics m(options);
  v1::RunConfig config;
  config.mutable_thresholds()->set_c_low(0.05);
  config.mutable_thresholds()->set_c_high(0.5);
  for (const std::string run : {"run-a", "team/b:1", "c.d_e"}) {
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
      v1::StepRecord r = Step(run, rank, 5, v1::REGIME_PROJECT);
      r.set_cosine(0.3);
      r.set_cosine_after(0.05);
      r.set_staleness(2);
      r.set_wall_time_ns(1700000000000000000);
      r.set_fallback(true);
      (*r.mutable_scalars())["loss"] = 0.7;
      (*r.mutable_scalars())["reward"] = 1.0;
      AddLayer(r, "fc1.weight", 0.2, 1.0);
      AddLayer(r, "fc\"2\"", std::nullopt, 1.0);
      AddLayer(r, "dropped", 0.2, 1.0);
      m.ObserveStep(r, kT0);
    }
    m.ObserveConfig(run, config, kT0);
    m.ObserveDecide(run, v1::REGIME_SKIP, 0.0002, kT0);
  }
  v1::StepRecord many = Step("run-a", 0, 6);
  for (int i = 0; i < 40; ++i) (*many.mutable_scalars())["s" + std::to_string(i)] = i;
  m.ObserveStep(many, kT0);
  m.ObserveStep(Step("idle", 0, 1), kT0 - std::chrono::hours(1));
  EXPECT_EQ(m.ExpireIdle(kT0), 1u);
  m.ObserveIngest(6, 18, 1);
  m.ObserveRpcError("Ingest", "INVALID_ARGUMENT");
  m.SetQueueRows(3);
  m.ObserveWriteSeconds(0.01);

  const std::string text = m.Render();
  auto s = Parse(text);
  EXPECT_GT(Value(s, "gac_layer_series_dropped_total").value_or(0), 0.0);
  EXPECT_GT(Value(s, "gac_scalar_series_dropped_total").value_or(0), 0.0);
  const auto [status, output] = RunWithInput(std::string(promtool) + " check metrics", text);
  EXPECT_EQ(status, 0) << output;
  EXPECT_EQ(output, "") << output;
}

// The run bound holds in every scrape while new runs evict old ones: a
// scrape never catches an evicted run's series beside the series of the run
// that replaced it (they are removed after the lock is released).
TEST(MetricsTest, ScrapesDuringEvictionNeverShowMoreThanMaxRuns) {
  MetricsOptions options;
  options.per_layer = true;
  constexpr std::size_t kMaxRuns = 6;
  constexpr int kThreads = 4;
  constexpr int kRunsPerThread = 400;
  constexpr int kLayers = 32;  // many series make removal slow: a wider window
  options.max_runs = kMaxRuns;
  options.max_layers_per_run = kLayers;
  Metrics m(options);

  std::atomic<bool> done{false};
  std::size_t most_runs = 0;
  int scrapes = 0;
  std::thread scraper([&] {
    while (!done.load()) {
      std::set<std::string> runs;
      for (const Sample& x : Parse(m.Render())) {
        auto it = x.labels.find("run");
        if (it != x.labels.end()) runs.insert(it->second);
      }
      most_runs = std::max(most_runs, runs.size());
      ++scrapes;
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < kRunsPerThread; ++i) {
        const std::string run = "t" + std::to_string(t) + "-" + std::to_string(i);
        v1::StepRecord r = Step(run, 0, i);
        r.set_cosine(0.5);
        for (int l = 0; l < kLayers; ++l) AddLayer(r, "fc" + std::to_string(l), 0.5, 1.0);
        m.ObserveStep(r, kT0);
        if (i % 3 == 0) m.ObserveDecide(run, v1::REGIME_SAFE, 1e-4, kT0);
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  scraper.join();

  RecordProperty("scrapes", scrapes);
  EXPECT_GT(scrapes, 0);
  EXPECT_LE(most_runs, kMaxRuns) << "in " << scrapes << " scrapes";
  auto s = Parse(m.Render());
  // At least every run but the last kMaxRuns was evicted (a run evicted
  // between its step and its decision comes back and is evicted again).
  EXPECT_GE(Value(s, "gac_expired_runs_total").value_or(0), static_cast<double>(kThreads * kRunsPerThread - kMaxRuns));
  EXPECT_EQ(m.runs_exported(), kMaxRuns);
}

}  // namespace
}  // namespace gac::server
