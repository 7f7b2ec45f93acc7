#include "server/src/metrics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gac/base/mutex.h"
#include "gac/controller/window.h"
#include "gac/proto/convert.h"
#include "gac/proto/record_schema.h"
#include "gac/proto/step_window.h"
#include "gac/proto/wire_rules.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/labels.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace gac::server {

namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

// Trainer scalar names exported per run; later names are dropped (and
// counted in gac_scalar_series_dropped_total). A record may carry up to 64.
constexpr std::size_t kMaxScalarNamesPerRun = 32;

// Series per regime are indexed by the Regime's value and labelled with its name.
constexpr std::size_t kNumRegimes = std::size(controller::kAllRegimes);
constexpr int kNoRegime = -1;

// The series index of a wire regime, or kNoRegime for REGIME_UNSPECIFIED and
// unknown values (rejected on ingest; never counted).
int RegimeIndex(v1::Regime regime) {
  base::StatusOr<controller::Regime> r = proto::FromProto(regime);
  return r.ok() ? static_cast<int>(*r) : kNoRegime;
}

// gac_steps_total's mode label: the wire mode's name, UNSPECIFIED read as
// monitor (telemetry.proto). Unknown values are refused on ingest.
constexpr v1::ControlMode kModes[] = {v1::CONTROL_MODE_MONITOR, v1::CONTROL_MODE_LOCAL, v1::CONTROL_MODE_REMOTE};
constexpr std::size_t kNumModes = std::size(kModes);

std::size_t ModeIndex(v1::ControlMode mode) {
  for (std::size_t i = 0; i < kNumModes; ++i) {
    if (kModes[i] == mode) return i;
  }
  return 0;
}

double ToSeconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// `count` bounds start, start*factor, start*factor^2, ...
Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  Histogram::BucketBoundaries bounds;
  bounds.reserve(static_cast<std::size_t>(count));
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

template <typename T>
void RemoveIfSet(Family<T>& family, T*& metric) {
  if (metric != nullptr) family.Remove(metric);
  metric = nullptr;
}

// The gauges of the step record's fields (gac/proto/record_schema.h) that
// have one, by field name: a view of the field's latest value per run and
// rank (tests/server/metrics_test.cc says why each other field has none).
struct FieldGauge {
  const char* field;
  const char* gauge;
};
constexpr FieldGauge kFieldGauges[] = {
    {"step", "gac_step"},
    {"cosine", "gac_cosine"},
    {"grad_norm", "gac_grad_norm"},
    {"ref_norm", "gac_ref_norm"},
    {"alpha", "gac_alpha"},
    {"cosine_after", "gac_cosine_after"},
    {"staleness", "gac_staleness_steps"},
    {"agent_overhead_seconds", "gac_agent_overhead_seconds"},
    {"grad_norm_z", "gac_grad_norm_z"},
    {"loss_z", "gac_loss_z"},
    // The policy-health signals, in their units.
    {"policy_tokens", "gac_policy_tokens"},
    {"ess_token", "gac_ess_token_ratio"},
    {"ess_sequence", "gac_ess_sequence_ratio"},
    {"clip_fraction_low", "gac_clip_fraction_low_ratio"},
    {"clip_fraction_high", "gac_clip_fraction_high_ratio"},
    {"truncation_fraction", "gac_truncation_fraction_ratio"},
    {"log_ratio_max", "gac_log_ratio_max_nats"},
    {"log_ratio_p99", "gac_log_ratio_p99_nats"},
    {"log_ratio_p1", "gac_log_ratio_p1_nats"},
    {"kl_k3", "gac_kl_k3_nats"},
    {"log_ratio_abs_mean", "gac_log_ratio_abs_mean_nats"},
    {"entropy_mean", "gac_entropy_mean_nats"},
    {"staleness_min", "gac_batch_staleness_min_versions"},
    {"staleness_mean", "gac_batch_staleness_mean_versions"},
    {"staleness_max", "gac_batch_staleness_max_versions"},
    {"policy_invalid", "gac_policy_invalid"},
};

// The baselines of the policy-health alerts (dashboards/gac.rules.yml,
// GacPolicyEssLow and GacSamplerKlJump; gacctl backtest evaluates the same):
// controller::EarlyMedian of a rank's values of a signal, absent until
// controller::kEarlyValues were reported. gacd keeps them in memory: after a
// restart a baseline is rebuilt from the next values.
static_assert(controller::kEarlyValues == 20, "the help texts below say 20");
struct EarlyMedianGauge {
  const char* field;
  const char* gauge;
  const char* help;
};
constexpr EarlyMedianGauge kEarlyMedianGauges[] = {
    {"ess_token", "gac_ess_token_early_median_ratio",
     "Median of the rank's first 20 reported ess_token values: GacPolicyEssLow's baseline (absent until 20)"},
    {"kl_k3", "gac_kl_k3_early_median_nats",
     "Median of the rank's first 20 reported kl_k3 values: GacSamplerKlJump's baseline (absent until 20)"},
};
constexpr std::size_t kNumEarlyMedians = std::size(kEarlyMedianGauges);

// kEarlyMedianGauges' fields, by entry (found once, not per record).
std::array<const proto::StepField*, kNumEarlyMedians> EarlyMedianFields() {
  std::array<const proto::StepField*, kNumEarlyMedians> out{};
  for (std::size_t i = 0; i < kNumEarlyMedians; ++i) out[i] = proto::FindStepField(kEarlyMedianGauges[i].field);
  return out;
}

Family<Gauge>& GaugeFamily(prometheus::Registry& registry, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}
Family<Counter>& CounterFamily(prometheus::Registry& registry, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}
Family<Histogram>& HistogramFamily(prometheus::Registry& registry, const char* name, const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
}

}  // namespace

const char* FieldGaugeName(std::string_view field) {
  for (const FieldGauge& g : kFieldGauges) {
    if (field == g.field) return g.gauge;
  }
  return nullptr;
}

// Per-run series are registered in their families on first sight only
// (Family::Add hashes the whole label map); after that the hot path finds
// cached metric pointers through runs_ under mu_ and sets them (atomic, no
// family lock). Removing a run takes it out of runs_ under mu_, then removes
// its series from the families without mu_ (see pending_).
//
// The run bound in a scrape: a collection never overlaps a removal. Collect
// waits until no run is pending, and a run is detached only while no
// collection runs, so the families hold at most the runs of runs_ while
// they are collected. Collect itself runs without mu_; what waits for it is
// only the ingest or expiry that must detach a run, and a Collect that
// arrives while detached runs are being removed waits for them. Neither
// side starves: a collection that ends with a detach waiting hands the
// next turn to it (detach_turn_).
struct Metrics::Impl {
  // The cached series of one layer of one rank.
  struct LayerSeries {
    Gauge* cosine = nullptr;  // created by the first record with a layer cosine
    Gauge* grad_norm = nullptr;
  };

  // The cached series of one (run, rank). Pointers are owned by their
  // families and stay valid until RemoveSeries removes them.
  struct RankSeries {
    // The latest value of each schema field with a gauge, by the field's
    // index in kStepFields: created by the first record that carries the
    // field (every record, for a field that is not optional), then left at
    // the last value reported (an absent optional field is "not known",
    // never a value).
    std::array<Gauge*, proto::kStepFieldCount> fields{};
    // Created with the rank.
    Gauge* last_report = nullptr;
    // By mode, then regime: a mode's five series are created (at 0) by the
    // rank's first record in that mode.
    std::array<std::array<Counter*, kNumRegimes>, kNumModes> steps{};
    Counter* skipped = nullptr;
    Counter* fallbacks = nullptr;
    Counter* spikes = nullptr;
    Gauge* window_mean = nullptr;  // created when the window first fills
    // Per kEarlyMedianGauges entry: the signal's early median, and its
    // gauge (created when the median is known).
    struct EarlyMedian {
      controller::EarlyMedian median;
      Gauge* gauge = nullptr;
    };
    std::array<EarlyMedian, kNumEarlyMedians> early{};
    // The rank's last valid cosines (sized by the run's window).
    std::optional<controller::AlignmentWindow> window;
    std::unordered_map<std::string, Gauge*> scalars;      // by scalar name
    std::unordered_map<std::string, LayerSeries> layers;  // by layer name
  };

  struct RunState {
    std::chrono::system_clock::time_point last_seen;
    std::list<std::string>::iterator lru_pos;  // this run's entry in lru_
    std::unordered_map<std::uint32_t, RankSeries> ranks;
    std::unordered_set<std::string> scalar_names;  // at most kMaxScalarNamesPerRun
    std::unordered_set<std::string> layer_names;   // at most options_.max_layers_per_run
    Gauge* c_low = nullptr;                        // set by ShowSettings
    Gauge* c_high = nullptr;
    Gauge* window_c_low = nullptr;
    Gauge* window_c_high = nullptr;
    Gauge* window_steps = nullptr;
    int window = controller::TriggerSettings{}.window;  // the run's W
    // gacd's settings for the run (ObserveConfig), and its latest step
    // (without scalars and layers), whose rule, when the trainer decided it,
    // the threshold gauges and W show over the settings (proto::DecidedWith).
    bool config_seen = false;
    v1::RunConfig config;
    v1::StepRecord rule;
    std::array<Counter*, kNumRegimes> decisions{};  // created on first Decide
  };

  // A run taken out of runs_ whose series are still registered.
  using Detached = std::pair<std::string, RunState>;

  explicit Impl(MetricsOptions options);

  // Returns the state of `run`, created when new, and marks it seen at
  // `now`. A new run beyond max_runs detaches the least recently seen run
  // into `evicted`; the caller must pass it to Finish after releasing mu_.
  // Waits (releasing mu_) while the run's old series are being removed.
  RunState& Touch(const std::string& run, std::chrono::system_clock::time_point now,
                  std::vector<Detached>* evicted) GAC_REQUIRES(mu_);
  // Returns the series of (run, rank), created when new.
  RankSeries& Rank(const std::string& run, RunState& state, std::uint32_t rank) GAC_REQUIRES(mu_);
  // The gac_steps_total series of (run, rank) in `mode`, by regime index,
  // created (at 0) when new.
  std::array<Counter*, kNumRegimes>& StepCounters(const std::string& run, std::uint32_t rank, v1::ControlMode mode,
                                                  RankSeries& s) GAC_REQUIRES(mu_);
  // Sets the threshold and window gauges and W from state's settings.
  void ShowSettings(const std::string& run, RunState& state) GAC_REQUIRES(mu_);
  // The body of ObserveStep: ShowRule, then the rank's series (ShowFields,
  // ShowWindowMean, CountStep, ShowScalars, ObserveLayers).
  void ApplyStep(const v1::StepRecord& record, std::chrono::system_clock::time_point now, RunState& state)
      GAC_REQUIRES(mu_);
  // The rule the step was decided with, when the trainer decided it: the
  // threshold gauges change only when it differs from the last step's.
  void ShowRule(const v1::StepRecord& record, RunState& state) GAC_REQUIRES(mu_);
  // The latest value of each field with a gauge.
  void ShowFields(const v1::StepRecord& record, RankSeries& series) GAC_REQUIRES(mu_);
  // The step's cosine into the rank's window, and m_t once it is full.
  void ShowWindowMean(const v1::StepRecord& record, const RunState& state, RankSeries& series) GAC_REQUIRES(mu_);
  void ShowEarlyMedians(const v1::StepRecord& record, RankSeries& series) GAC_REQUIRES(mu_);
  // gac_steps_total, gac_skipped_updates_total, gac_spikes_total and
  // gac_controller_fallbacks_total.
  void CountStep(const v1::StepRecord& record, RankSeries& series) GAC_REQUIRES(mu_);
  // The trainer's scalars, at most kMaxScalarNamesPerRun names per run.
  void ShowScalars(const v1::StepRecord& record, RunState& state, RankSeries& series) GAC_REQUIRES(mu_);
  // Per-layer part of ApplyStep (options_.per_layer).
  void ObserveLayers(const v1::StepRecord& record, RunState& state, RankSeries& series) GAC_REQUIRES(mu_);
  // Takes `it` out of runs_ and lru_ and marks the run pending until Finish.
  void Detach(std::unordered_map<std::string, RunState>::iterator it, std::vector<Detached>* out)
      GAC_REQUIRES(mu_);
  // Whether a run may be detached now (no collection in progress, and none
  // waiting unless a detach has the turn).
  bool MayDetach() const GAC_REQUIRES(mu_) {
    return collecting_ == 0 && (collect_waiting_ == 0 || detach_turn_);
  }
  // Removes the series of detached runs from their families and ends their
  // pending state.
  void Finish(std::vector<Detached>& detached) GAC_EXCLUDES(mu_);
  // Removes every series of `state` from its family.
  void RemoveSeries(RunState& state);

  // The families of the per-run, per-rank and per-layer series; owned by
  // registry_, each internally synchronised.
  struct RunFamilies {
    Family<Gauge>& last_report;
    Family<Gauge>& trainer_scalar;
    Family<Counter>& steps;
    Family<Counter>& skipped;
    Family<Counter>& fallbacks;
    Family<Counter>& spikes;
    Family<Gauge>& c_low;
    Family<Gauge>& c_high;
    Family<Gauge>& window_c_low;
    Family<Gauge>& window_c_high;
    Family<Gauge>& window_steps;
    Family<Gauge>& window_mean;
    Family<Counter>& decisions;
    Family<Gauge>& layer_cosine;
    Family<Gauge>& layer_grad_norm;
    std::array<Family<Gauge>*, kNumEarlyMedians> early_median;
  };
  // gacd's own series, label-free but for rpc_errors' family; never removed.
  struct SelfSeries {
    Counter& ingest_step_rows;
    Counter& ingest_layer_rows;
    Counter& ingest_batches;
    Counter& ingest_duplicates;
    Family<Counter>& rpc_errors;  // by method and code, added on first sight
    Gauge& store_queue_rows;
    Histogram& store_write_seconds;
    Histogram& decide_seconds;
    Gauge& runs_exported;
    Counter& expired_runs;
    Counter& layer_dropped;
    Counter& scalar_dropped;
  };

  // The families of the runs' series, and gacd's own series, registered in
  // the order /metrics lists them.
  static RunFamilies RegisterRunFamilies(prometheus::Registry& registry);
  static SelfSeries RegisterSelfSeries(prometheus::Registry& registry);

  // Constant after construction.
  const MetricsOptions options_;
  const std::shared_ptr<prometheus::Registry> registry_;
  // The gauges of the record's fields (FieldGaugeName), by field index;
  // nullptr for a field without one.
  const std::array<Family<Gauge>*, proto::kStepFieldCount> field_gauges_;
  const std::array<const proto::StepField*, kNumEarlyMedians> early_fields_ = EarlyMedianFields();
  const RunFamilies run_;
  const SelfSeries self_;

  mutable base::Mutex mu_;
  std::unordered_map<std::string, RunState> runs_ GAC_GUARDED_BY(mu_);
  std::list<std::string> lru_ GAC_GUARDED_BY(mu_);  // run ids, least recently seen first
  // Detached runs whose series Finish is removing. Family::Remove is linear
  // in the family's size in prometheus-cpp 1.0.1, so it runs without mu_
  // (ingest of other runs goes on). A pending run is not re-created until
  // then: Family::Add would hand back the series about to be deleted.
  std::unordered_set<std::string> pending_ GAC_GUARDED_BY(mu_);
  // The collection gate (see the comment above Impl).
  int collecting_ GAC_GUARDED_BY(mu_) = 0;       // Collect calls collecting now
  int collect_waiting_ GAC_GUARDED_BY(mu_) = 0;  // Collect calls waiting for pending_ to empty
  int detach_waiting_ GAC_GUARDED_BY(mu_) = 0;   // callers waiting for MayDetach
  bool detach_turn_ GAC_GUARDED_BY(mu_) = false;  // a waiting detach goes before the next Collect
  // Signalled when pending_ shrinks, a collection ends or the turn changes.
  base::CondVar pending_done_;
};

namespace {

// The families of kEarlyMedianGauges, by entry.
std::array<Family<Gauge>*, kNumEarlyMedians> RegisterEarlyMedians(prometheus::Registry& registry) {
  std::array<Family<Gauge>*, kNumEarlyMedians> out{};
  for (std::size_t i = 0; i < kNumEarlyMedians; ++i) {
    out[i] = &GaugeFamily(registry, kEarlyMedianGauges[i].gauge, kEarlyMedianGauges[i].help);
  }
  return out;
}

// The gauges of the record's fields that have one (FieldGaugeName), by field
// index, in the schema's order; their help is the schema's, so the two never
// disagree.
std::array<Family<Gauge>*, proto::kStepFieldCount> RegisterFieldGauges(prometheus::Registry& registry) {
  std::array<Family<Gauge>*, proto::kStepFieldCount> out{};
  for (std::size_t i = 0; i < proto::kStepFieldCount; ++i) {
    const proto::StepField& f = proto::kStepFields[i];
    const char* gauge = FieldGaugeName(f.name);
    if (gauge == nullptr) continue;
    std::string help = std::string("Latest ") + f.help + " (the step record's " + f.name + ")";
    if (f.optional) help += " (absent until reported)";
    out[i] = &GaugeFamily(registry, gauge, help.c_str());
  }
  return out;
}

// A field's value as a gauge shows it.
double GaugeValue(const proto::StepField& f, const proto::FieldValue& v) {
  return f.type == proto::FieldType::kReal ? v.real : static_cast<double>(v.integer);
}

}  // namespace

Metrics::Impl::RunFamilies Metrics::Impl::RegisterRunFamilies(prometheus::Registry& r) {
  return {
      GaugeFamily(r, "gac_last_report_timestamp_seconds",
                  "Unix time of the latest step record (its wall time, else the receive time)"),
      GaugeFamily(r, "gac_trainer_scalar",
                  "Latest trainer scalar reported with a step, by name (at most 32 names per run)"),
      CounterFamily(r, "gac_steps_total", "Step records stored, by the regime of the step"),
      CounterFamily(r, "gac_skipped_updates_total",
                    "Steps whose optimizer update was skipped (regime skip, invalid or spike)"),
      CounterFamily(r, "gac_controller_fallbacks_total", "Remote-mode steps decided by the local fallback controller"),
      CounterFamily(r, "gac_spikes_total",
                    "Steps the spike guard called a spike (regime spike; in monitor mode reported, not skipped)"),
      GaugeFamily(r, "gac_threshold_c_low", "The run's current c_low threshold"),
      GaugeFamily(r, "gac_threshold_c_high", "The run's current c_high threshold"),
      GaugeFamily(r, "gac_threshold_window_c_low", "The run's current c_low threshold of the windowed statistic |m_t|"),
      GaugeFamily(r, "gac_threshold_window_c_high",
                  "The run's current c_high threshold of the windowed statistic |m_t|"),
      GaugeFamily(r, "gac_window_steps", "The run's window W: steps in the signed mean m_t"),
      GaugeFamily(r, "gac_window_mean",
                  "m_t: signed mean of the rank's last W stored cosines (W = gac_window_steps)"),
      CounterFamily(r, "gac_decisions_total", "Decide calls answered, by the regime returned"),
      GaugeFamily(r, "gac_layer_cosine",
                  "Latest per-layer cosine between the layer gradient and reference (absent until reported)"),
      GaugeFamily(r, "gac_layer_grad_norm", "Latest per-layer gradient norm"),
      RegisterEarlyMedians(r),
  };
}

Metrics::Impl::SelfSeries Metrics::Impl::RegisterSelfSeries(prometheus::Registry& r) {
  Family<Counter>& ingest_rows =
      CounterFamily(r, "gac_ingest_rows_total", "Rows newly stored by ingest, by kind (step or layer)");
  Family<Counter>& ingest_batches = CounterFamily(r, "gac_ingest_batches_total", "Ingest batches committed");
  Family<Counter>& ingest_duplicates =
      CounterFamily(r, "gac_ingest_duplicates_total", "Step records received that were already stored (not rewritten)");
  Family<Counter>& rpc_errors =
      CounterFamily(r, "gac_rpc_errors_total", "RPCs that ended with a non-OK status, by method and status code");
  Family<Gauge>& store_queue_rows = GaugeFamily(r, "gac_store_queue_rows", "Rows waiting in the store writer queue");
  Family<Histogram>& store_write_seconds =
      HistogramFamily(r, "gac_store_write_seconds", "Duration of one store write transaction");
  Family<Histogram>& decide_seconds =
      HistogramFamily(r, "gac_decide_seconds", "Server-side latency of one Decide call");
  Family<Gauge>& runs_exported = GaugeFamily(r, "gac_runs_exported", "Runs whose series are currently exported");
  Family<Counter>& expired_runs =
      CounterFamily(r, "gac_expired_runs_total",
                    "Runs removed from the exposition, idle past the TTL or evicted by the run limit");
  Family<Counter>& layer_dropped =
      CounterFamily(r, "gac_layer_series_dropped_total",
                    "Layer rows not exported because their run reached the per-run layer name limit");
  Family<Counter>& scalar_dropped =
      CounterFamily(r, "gac_scalar_series_dropped_total",
                    "Trainer scalar values not exported because their run reached the per-run name limit");
  return {
      ingest_rows.Add({{"kind", "step"}}),
      ingest_rows.Add({{"kind", "layer"}}),
      ingest_batches.Add({}),
      ingest_duplicates.Add({}),
      rpc_errors,
      store_queue_rows.Add({}),
      // 1 ms .. 16.384 s: powers of two, so 10 s falls in a finite bucket.
      store_write_seconds.Add({}, ExponentialBuckets(1e-3, 2.0, 15)),
      // 50 us .. 102.4 ms: powers of two.
      decide_seconds.Add({}, ExponentialBuckets(50e-6, 2.0, 12)),
      runs_exported.Add({}),
      expired_runs.Add({}),
      layer_dropped.Add({}),
      scalar_dropped.Add({}),
  };
}

// Registers every family in the order /metrics lists them: the fields'
// gauges, the runs' series, gacd's own.
Metrics::Impl::Impl(MetricsOptions options)
    : options_(std::move(options)),
      registry_(std::make_shared<prometheus::Registry>()),
      field_gauges_(RegisterFieldGauges(*registry_)),
      run_(RegisterRunFamilies(*registry_)),
      self_(RegisterSelfSeries(*registry_)) {}

Metrics::Impl::RunState& Metrics::Impl::Touch(const std::string& run, std::chrono::system_clock::time_point now,
                                              std::vector<Detached>* evicted) {
  // A limit of 0 is read as 1: the newest run is always exported.
  const std::size_t max_runs = std::max<std::size_t>(options_.max_runs, 1);
  bool counted = false;  // this call is in detach_waiting_
  // Every wait releases mu_, so each pass checks everything again; the
  // detach below happens in the same pass as its MayDetach check.
  for (;;) {
    if (pending_.count(run) != 0) {
      pending_done_.Wait(&mu_);
      continue;
    }
    auto it = runs_.find(run);
    if (it != runs_.end()) {
      if (counted) {
        --detach_waiting_;
        pending_done_.SignalAll();  // a Collect may wait on this caller's turn
      }
      RunState& state = it->second;
      // Concurrent callers may pass slightly older times; never move back.
      state.last_seen = std::max(state.last_seen, now);
      lru_.splice(lru_.end(), lru_, state.lru_pos);
      return state;
    }
    if (runs_.size() >= max_runs && !MayDetach()) {
      if (!counted) ++detach_waiting_;
      counted = true;
      pending_done_.Wait(&mu_);
      continue;
    }
    if (counted) --detach_waiting_;
    if (runs_.size() >= max_runs) {
      detach_turn_ = false;
      pending_done_.SignalAll();  // a Collect may wait on the turn
    }
    while (runs_.size() >= max_runs) {
      Detach(runs_.find(lru_.front()), evicted);
    }
    it = runs_.emplace(run, RunState{}).first;
    it->second.last_seen = now;
    it->second.lru_pos = lru_.insert(lru_.end(), run);
    self_.runs_exported.Set(static_cast<double>(runs_.size()));
    return it->second;
  }
}

Metrics::Impl::RankSeries& Metrics::Impl::Rank(const std::string& run, RunState& state,
                                               std::uint32_t rank) {
  auto it = state.ranks.find(rank);
  if (it != state.ranks.end()) return it->second;
  RankSeries& s = state.ranks[rank];
  const Labels labels = {{"run", run}, {"rank", std::to_string(rank)}};
  s.last_report = &run_.last_report.Add(labels);
  s.skipped = &run_.skipped.Add(labels);
  s.fallbacks = &run_.fallbacks.Add(labels);
  s.spikes = &run_.spikes.Add(labels);
  return s;
}

std::array<Counter*, kNumRegimes>& Metrics::Impl::StepCounters(const std::string& run, std::uint32_t rank,
                                                                v1::ControlMode mode, RankSeries& s) {
  const std::size_t m = ModeIndex(mode);
  auto& by_regime = s.steps[m];
  if (by_regime[0] != nullptr) return by_regime;
  for (std::size_t i = 0; i < kNumRegimes; ++i) {
    by_regime[i] = &run_.steps.Add({{"run", run},
                                {"rank", std::to_string(rank)},
                                {"regime", controller::RegimeName(controller::kAllRegimes[i])},
                                {"mode", proto::EnumName(kModes[m])}});
  }
  return by_regime;
}

void Metrics::Impl::Detach(std::unordered_map<std::string, RunState>::iterator it,
                           std::vector<Detached>* out) {
  lru_.erase(it->second.lru_pos);
  pending_.insert(it->first);
  out->emplace_back(it->first, std::move(it->second));
  runs_.erase(it);
  self_.runs_exported.Set(static_cast<double>(runs_.size()));
  self_.expired_runs.Increment();
}

void Metrics::Impl::Finish(std::vector<Detached>& detached) {
  if (detached.empty()) return;
  for (Detached& d : detached) RemoveSeries(d.second);
  {
    base::MutexLock lock(&mu_);
    for (const Detached& d : detached) pending_.erase(d.first);
  }
  pending_done_.SignalAll();
}

void Metrics::Impl::RemoveSeries(RunState& state) {
  for (auto& [rank, s] : state.ranks) {
    for (std::size_t i = 0; i < proto::kStepFieldCount; ++i) {
      if (field_gauges_[i] != nullptr) RemoveIfSet(*field_gauges_[i], s.fields[i]);
    }
    RemoveIfSet(run_.last_report, s.last_report);
    for (auto& by_regime : s.steps) {
      for (Counter*& c : by_regime) RemoveIfSet(run_.steps, c);
    }
    RemoveIfSet(run_.skipped, s.skipped);
    RemoveIfSet(run_.fallbacks, s.fallbacks);
    RemoveIfSet(run_.spikes, s.spikes);
    RemoveIfSet(run_.window_mean, s.window_mean);
    for (std::size_t i = 0; i < kNumEarlyMedians; ++i) RemoveIfSet(*run_.early_median[i], s.early[i].gauge);
    for (auto& [name, g] : s.scalars) RemoveIfSet(run_.trainer_scalar, g);
    for (auto& [name, l] : s.layers) {
      RemoveIfSet(run_.layer_cosine, l.cosine);
      RemoveIfSet(run_.layer_grad_norm, l.grad_norm);
    }
  }
  RemoveIfSet(run_.c_low, state.c_low);
  RemoveIfSet(run_.c_high, state.c_high);
  RemoveIfSet(run_.window_c_low, state.window_c_low);
  RemoveIfSet(run_.window_c_high, state.window_c_high);
  RemoveIfSet(run_.window_steps, state.window_steps);
  for (Counter*& c : state.decisions) RemoveIfSet(run_.decisions, c);
}

void Metrics::Impl::ObserveLayers(const v1::StepRecord& record, RunState& state, RankSeries& series) {
  for (const v1::LayerRecord& layer : record.layers()) {
    auto it = series.layers.find(layer.name());
    if (it == series.layers.end()) {
      // Admit the name if the run already exports it (another rank) or has room.
      if (state.layer_names.count(layer.name()) == 0) {
        if (state.layer_names.size() >= options_.max_layers_per_run) {
          self_.layer_dropped.Increment();
          continue;
        }
        state.layer_names.insert(layer.name());
      }
      it = series.layers.emplace(layer.name(), LayerSeries{}).first;
      it->second.grad_norm = &run_.layer_grad_norm.Add(
          {{"run", record.run()}, {"rank", std::to_string(record.rank())}, {"layer", layer.name()}});
    }
    LayerSeries& l = it->second;
    l.grad_norm->Set(layer.grad_norm());
    if (layer.has_cosine()) {
      if (l.cosine == nullptr) {
        l.cosine = &run_.layer_cosine.Add(
            {{"run", record.run()}, {"rank", std::to_string(record.rank())}, {"layer", layer.name()}});
      }
      l.cosine->Set(layer.cosine());
    }
  }
}

void Metrics::Impl::ShowSettings(const std::string& run, RunState& state) {
  if (!state.config_seen) return;
  const v1::RunConfig config = proto::DecidedWith(state.config, state.rule);
  if (state.c_low == nullptr) {
    state.c_low = &run_.c_low.Add({{"run", run}});
    state.c_high = &run_.c_high.Add({{"run", run}});
    state.window_c_low = &run_.window_c_low.Add({{"run", run}});
    state.window_c_high = &run_.window_c_high.Add({{"run", run}});
    state.window_steps = &run_.window_steps.Add({{"run", run}});
  }
  state.c_low->Set(config.thresholds().c_low());
  state.c_high->Set(config.thresholds().c_high());
  const v1::Thresholds& w = config.has_window_thresholds() ? config.window_thresholds() : config.thresholds();
  state.window_c_low->Set(w.c_low());
  state.window_c_high->Set(w.c_high());
  state.window = proto::ListingWindow(config);
  state.window_steps->Set(static_cast<double>(state.window));
}

void Metrics::Impl::ApplyStep(const v1::StepRecord& record, std::chrono::system_clock::time_point now,
                               RunState& state) {
  ShowRule(record, state);
  RankSeries& s = Rank(record.run(), state, record.rank());
  s.last_report->Set(record.wall_time_ns() != 0 ? static_cast<double>(record.wall_time_ns()) / 1e9
                                                 : ToSeconds(now));
  ShowFields(record, s);
  ShowWindowMean(record, state, s);
  ShowEarlyMedians(record, s);
  CountStep(record, s);
  ShowScalars(record, state, s);
  if (options_.per_layer) ObserveLayers(record, state, s);
}

void Metrics::Impl::ShowRule(const v1::StepRecord& record, RunState& state) {
  const auto same = [](const v1::StepRecord& a, const v1::StepRecord& b) {
    return a.has_c_low() == b.has_c_low() && a.c_low() == b.c_low() && a.has_c_high() == b.has_c_high() &&
           a.c_high() == b.c_high() && a.has_trigger() == b.has_trigger() && a.trigger() == b.trigger() &&
           a.has_window() == b.has_window() && a.window() == b.window() &&
           a.has_window_c_low() == b.has_window_c_low() && a.window_c_low() == b.window_c_low() &&
           a.has_window_c_high() == b.has_window_c_high() && a.window_c_high() == b.window_c_high();
  };
  if (same(record, state.rule)) return;
  state.rule = record;  // DecidedWith reads only the rule's fields
  state.rule.clear_scalars();
  state.rule.clear_layers();
  ShowSettings(record.run(), state);
}

// A record without a field's value (a cosine on the first step, without a
// reference, on invalid statistics) leaves its gauge at the last value:
// writing NaN would break alert rules on the series, and deleting it would
// make the series flap. A series that never had a value is not created;
// gac_steps_total{regime} shows why a value is absent.
void Metrics::Impl::ShowFields(const v1::StepRecord& record, RankSeries& s) {
  for (std::size_t i = 0; i < proto::kStepFieldCount; ++i) {
    if (field_gauges_[i] == nullptr) continue;
    const proto::StepField& f = proto::kStepFields[i];
    const proto::FieldValue v = f.get(record);
    if (!v.present) continue;
    if (s.fields[i] == nullptr) {
      s.fields[i] = &field_gauges_[i]->Add({{"run", record.run()}, {"rank", std::to_string(record.rank())}});
    }
    s.fields[i]->Set(GaugeValue(f, v));
  }
}

// The policy-health alerts' baselines (controller::EarlyMedian): a gauge
// once a signal's early median is known, then left as it is.
void Metrics::Impl::ShowEarlyMedians(const v1::StepRecord& record, RankSeries& s) {
  for (std::size_t i = 0; i < kNumEarlyMedians; ++i) {
    RankSeries::EarlyMedian& early = s.early[i];
    if (early.gauge != nullptr) continue;
    const proto::FieldValue v = early_fields_[i]->get(record);
    if (!v.present) continue;
    early.median.Add(v.real);
    if (!early.median.median()) continue;
    early.gauge = &run_.early_median[i]->Add({{"run", record.run()}, {"rank", std::to_string(record.rank())}});
    early.gauge->Set(*early.median.median());
  }
}

// m_t from every stored step: a step without a window cosine (no reference,
// invalid statistics) does not enter the window, as in the controller and in
// the steps gacd lists (gac/proto/step_window.h).
void Metrics::Impl::ShowWindowMean(const v1::StepRecord& record, const RunState& state, RankSeries& s) {
  const std::optional<double> c = proto::RecordWindowCosine(record);
  if (!c) return;
  if (!s.window) {
    s.window.emplace(state.window);
  } else if (s.window->size() != state.window) {
    s.window->Resize(state.window);
  }
  s.window->Add(*c);
  if (const std::optional<double> m = s.window->mean()) {
    if (s.window_mean == nullptr) {
      s.window_mean = &run_.window_mean.Add({{"run", record.run()}, {"rank", std::to_string(record.rank())}});
    }
    s.window_mean->Set(*m);
  }
}

void Metrics::Impl::CountStep(const v1::StepRecord& record, RankSeries& s) {
  const int regime = RegimeIndex(record.regime());
  if (regime != kNoRegime) {
    StepCounters(record.run(), record.rank(), record.mode(), s)[static_cast<std::size_t>(regime)]->Increment();
    // A monitor-mode step's skip is what GAC would have done: no update was skipped.
    if ((record.regime() == v1::REGIME_SKIP || record.regime() == v1::REGIME_INVALID ||
         record.regime() == v1::REGIME_SPIKE) &&
        proto::ModeApplies(record.mode())) {
      s.skipped->Increment();
    }
    if (record.regime() == v1::REGIME_SPIKE) s.spikes->Increment();
  }
  if (record.fallback()) s.fallbacks->Increment();
}

void Metrics::Impl::ShowScalars(const v1::StepRecord& record, RunState& state, RankSeries& s) {
  for (const auto& [name, value] : record.scalars()) {
    auto it = s.scalars.find(name);
    if (it == s.scalars.end()) {
      if (state.scalar_names.count(name) == 0) {
        if (state.scalar_names.size() >= kMaxScalarNamesPerRun) {
          self_.scalar_dropped.Increment();
          continue;
        }
        state.scalar_names.insert(name);
      }
      Gauge* g = &run_.trainer_scalar.Add(
          {{"run", record.run()}, {"rank", std::to_string(record.rank())}, {"name", name}});
      it = s.scalars.emplace(name, g).first;
    }
    it->second->Set(value);
  }
}

Metrics::Metrics(MetricsOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Metrics::~Metrics() = default;

std::shared_ptr<prometheus::Registry> Metrics::registry() const { return impl_->registry_; }

void Metrics::ObserveStep(const v1::StepRecord& record, std::chrono::system_clock::time_point now) {
  Impl& m = *impl_;
  std::vector<Impl::Detached> evicted;
  {
    base::MutexLock lock(&m.mu_);
    Impl::RunState& state = m.Touch(record.run(), now, &evicted);
    m.ApplyStep(record, now, state);
  }
  m.Finish(evicted);
}

void Metrics::ObserveConfig(const std::string& run, const v1::RunConfig& config,
                            std::chrono::system_clock::time_point now) {
  Impl& m = *impl_;
  std::vector<Impl::Detached> evicted;
  {
    base::MutexLock lock(&m.mu_);
    Impl::RunState& state = m.Touch(run, now, &evicted);
    state.config = config;
    state.config_seen = true;
    m.ShowSettings(run, state);
  }
  m.Finish(evicted);
}

void Metrics::ObserveIngest(std::uint64_t step_rows, std::uint64_t layer_rows, std::uint64_t duplicates) {
  Impl& m = *impl_;
  m.self_.ingest_step_rows.Increment(static_cast<double>(step_rows));
  m.self_.ingest_layer_rows.Increment(static_cast<double>(layer_rows));
  m.self_.ingest_duplicates.Increment(static_cast<double>(duplicates));
  m.self_.ingest_batches.Increment();
}

void Metrics::ObserveRpcError(const std::string& method, const std::string& code) {
  // Rare and bounded (methods x status codes): the family's own lookup is enough.
  impl_->self_.rpc_errors.Add({{"method", method}, {"code", code}}).Increment();
}

void Metrics::SetQueueRows(std::uint64_t rows) {
  impl_->self_.store_queue_rows.Set(static_cast<double>(rows));
}

void Metrics::ObserveWriteSeconds(double seconds) { impl_->self_.store_write_seconds.Observe(seconds); }

void Metrics::ObserveDecide(const std::string& run, v1::Regime regime, double seconds,
                            std::chrono::system_clock::time_point now) {
  Impl& m = *impl_;
  m.self_.decide_seconds.Observe(seconds);
  const int index = RegimeIndex(regime);
  std::vector<Impl::Detached> evicted;
  {
    base::MutexLock lock(&m.mu_);
    Impl::RunState& state = m.Touch(run, now, &evicted);
    if (index != kNoRegime) {
      if (state.decisions[0] == nullptr) {
        for (std::size_t i = 0; i < kNumRegimes; ++i) {
          state.decisions[i] = &m.run_.decisions.Add({{"run", run}, {"regime", controller::RegimeName(controller::kAllRegimes[i])}});
        }
      }
      state.decisions[static_cast<std::size_t>(index)]->Increment();
    }
  }
  m.Finish(evicted);
}

std::size_t Metrics::ExpireIdle(std::chrono::system_clock::time_point now) {
  Impl& m = *impl_;
  std::vector<Impl::Detached> idle;
  {
    base::MutexLock lock(&m.mu_);
    if (!m.MayDetach()) {
      ++m.detach_waiting_;
      while (!m.MayDetach()) m.pending_done_.Wait(&m.mu_);
      --m.detach_waiting_;
    }
    m.detach_turn_ = false;
    m.pending_done_.SignalAll();
    const auto cutoff = now - m.options_.run_ttl;
    // Scans every run rather than stopping at the first recent one in lru_:
    // lru_ is in call order, and callers' clocks may differ slightly.
    for (auto it = m.runs_.begin(); it != m.runs_.end();) {
      auto next = std::next(it);
      if (it->second.last_seen < cutoff) m.Detach(it, &idle);
      it = next;
    }
  }
  m.Finish(idle);
  return idle.size();
}

std::vector<prometheus::MetricFamily> Metrics::Collect() const {
  Impl& m = *impl_;
  {
    base::MutexLock lock(&m.mu_);
    ++m.collect_waiting_;
    // A detach that waits goes first when it has the turn, and a Collect
    // does not join a running one past it (scrapes back to back would
    // starve it).
    while (!m.pending_.empty() || (m.detach_waiting_ > 0 && (m.detach_turn_ || m.collecting_ > 0))) {
      m.pending_done_.Wait(&m.mu_);
    }
    --m.collect_waiting_;
    ++m.collecting_;
  }
  // Families lock themselves; mu_ is not held, so ingest of exported runs
  // goes on during the collection.
  std::vector<prometheus::MetricFamily> families = m.registry_->Collect();
  {
    base::MutexLock lock(&m.mu_);
    if (--m.collecting_ == 0 && m.detach_waiting_ > 0) m.detach_turn_ = true;
  }
  m.pending_done_.SignalAll();
  return families;
}

std::string Metrics::Render() const { return prometheus::TextSerializer().Serialize(Collect()); }

std::size_t Metrics::runs_exported() const {
  base::MutexLock lock(&impl_->mu_);
  return impl_->runs_.size();
}

}  // namespace gac::server
