// Prometheus metrics of gacd, built on prometheus-cpp (kept out of this
// header). Every name starts with gac_ and uses base units; counters end in
// _total. Per-run series carry the labels run and rank; the run label is
// bounded: a run with no report for `run_ttl` is removed from the exposition
// by ExpireIdle (never from the store), and at most `max_runs` runs are
// exported at once (the least recently seen is evicted first).
//
// Series (see docs/OPERATIONS.md for the full list):
//   per run/rank  gac_last_report_timestamp_seconds, gac_trainer_scalar{name},
//                 gac_controller_fallbacks_total, gac_spikes_total,
//                 gac_steps_total{regime,mode}, gac_skipped_updates_total
//                 (mode is the step's: monitor, local or remote, UNSPECIFIED
//                 read as monitor; a mode's five regime series appear with
//                 the rank's first step in it, so at most 15 a rank. Monitor
//                 regimes are what GAC would have done: gac_skipped_updates_total
//                 counts skip, invalid and spike in local and remote mode only.)
//                 the latest value of each step record field that has a
//                 gauge (FieldGaugeName; an optional field's is absent
//                 until reported; docs/OPERATIONS.md lists them),
//                 gac_window_mean (m_t: the signed mean of the rank's last W
//                 c_t that this gacd stored, W the run's window; computed
//                 here from every stored step, in the order they are stored,
//                 never from scrapes; absent until W are held),
//                 gac_ess_token_early_median_ratio and
//                 gac_kl_k3_early_median_nats (the median of the rank's first
//                 20 reported ess_token / kl_k3: the policy-health alerts'
//                 baselines; absent until 20; rebuilt after a restart)
//   per run       gac_threshold_c_low, gac_threshold_c_high,
//                 gac_threshold_window_c_low, gac_threshold_window_c_high,
//                 gac_window_steps (W), gac_decisions_total{regime}
//   per layer     gac_layer_cosine, gac_layer_grad_norm (opt-in; at most
//                 max_layers_per_run layer names per run)
//   self          gac_ingest_rows_total{kind="step"|"layer"},
//                 gac_ingest_batches_total, gac_ingest_duplicates_total,
//                 gac_rpc_errors_total{method,code}, gac_store_queue_rows,
//                 gac_store_write_seconds (histogram), gac_decide_seconds
//                 (histogram), gac_runs_exported, gac_expired_runs_total,
//                 gac_layer_series_dropped_total, gac_scalar_series_dropped_total
//
// Thread safety: all methods are safe to call concurrently.

#ifndef GAC_SERVER_SRC_METRICS_H_
#define GAC_SERVER_SRC_METRICS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gac/v1/control.pb.h"
#include "gac/v1/telemetry.pb.h"

namespace prometheus {
class Registry;
struct MetricFamily;
}

namespace gac::server {

// The gauge of the latest value of the step record field named `field`
// (gac/proto/record_schema.h), or nullptr for a field without one. Its help
// is the field's.
const char* FieldGaugeName(std::string_view field);

struct MetricsOptions {
  bool per_layer = false;                 // export gac_layer_* series
  std::size_t max_layers_per_run = 64;    // layer names beyond this are not exported
  std::size_t max_runs = 1000;            // runs exported at once
  std::chrono::seconds run_ttl{15 * 60};  // idle time before a run's series expire
};

class Metrics {
 public:
  explicit Metrics(MetricsOptions options = {});
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The registry itself. Collecting it directly can catch a run eviction
  // half done (max_runs + 1 runs); scrapes use Collect or Render.
  std::shared_ptr<prometheus::Registry> registry() const;

  // Updates the latest-value gauges and the counters of the record's run and
  // rank. `now` is the server's receive time (for expiry and
  // gac_last_report_timestamp_seconds uses the record's wall_time_ns when
  // set, else now). Call once per newly stored record (not for duplicates).
  void ObserveStep(const v1::StepRecord& record, std::chrono::system_clock::time_point now);

  // Exports a run's thresholds (after start-up, SetRunConfig, or the first
  // report of a run with default settings).
  void ObserveConfig(const std::string& run, const v1::RunConfig& config,
                     std::chrono::system_clock::time_point now);

  // A committed ingest batch: step records and layer rows newly stored,
  // duplicates ignored.
  void ObserveIngest(std::uint64_t step_rows, std::uint64_t layer_rows, std::uint64_t duplicates);
  // An RPC that ended with a non-OK status (code as its canonical name,
  // e.g. "INVALID_ARGUMENT").
  void ObserveRpcError(const std::string& method, const std::string& code);
  void SetQueueRows(std::uint64_t rows);
  void ObserveWriteSeconds(double seconds);
  // One Decide call: its run, the regime it returned and its latency.
  void ObserveDecide(const std::string& run, v1::Regime regime, double seconds,
                     std::chrono::system_clock::time_point now);

  // Removes the series of every run not seen since now - run_ttl. Returns the
  // number of runs removed.
  std::size_t ExpireIdle(std::chrono::system_clock::time_point now);

  // Everything registered, never more than max_runs runs: waits while
  // evicted or expired runs' series are being removed, and a run eviction
  // or expiry waits while a collection is in progress (ingest of runs
  // already exported goes on meanwhile). Include prometheus/metric_family.h
  // to use the result.
  std::vector<prometheus::MetricFamily> Collect() const;
  // The text exposition format of Collect() (what /metrics serves).
  std::string Render() const;

  // Runs currently exported.
  std::size_t runs_exported() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gac::server

#endif  // GAC_SERVER_SRC_METRICS_H_
