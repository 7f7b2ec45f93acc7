// gac._transport: the agent's link to gacd from Python, over gac::transport.
// Telemetry streams step reports without ever blocking the training loop
// (bounded queue, on-disk spool, replay); RemoteController is gacd as an
// agent's decision source. No torch.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gac/controller/decision_source.h"
#include "gac/proto/wire_rules.h"
#include "gac/transport/channel.h"
#include "gac/transport/health.h"
#include "gac/transport/remote_controller.h"
#include "gac/transport/step_record.h"
#include "gac/transport/telemetry.h"
#include "python/src/support.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace gac::python {
namespace {

using transport::RemoteController;
using transport::RemoteControllerOptions;
using transport::RunIdentity;
using transport::SpoolRecovery;
using transport::Telemetry;
using transport::TelemetryCounters;
using transport::TelemetryOptions;

// The wire's rules for run ids, scalar names and the scalars of a record
// (gac/proto/wire_rules.h, which gacd checks too), checked here so that a
// bad name fails the call that made it instead of costing the batch it
// would be sent in.
void CheckRunId(const std::string& run) {
  if (base::Status st = proto::CheckRunId(run); !st.ok()) RaiseInvalidArgument("run must be a valid run id: " + st.message());
}

void CheckScalarName(const std::string& name) {
  if (base::Status st = proto::CheckName("scalar name", name); !st.ok()) {
    RaiseInvalidArgument("scalar names must be 1-" + std::to_string(proto::kMaxNameLength) +
                         " printable ASCII characters: " + st.message() + ", got '" + name + "'");
  }
}

// gacd's host:port, or a comma-separated list of replicas sharing one store
// (transport::SplitGacdAddresses' rules), checked before anything starts.
void CheckAddress(const std::string& address) {
  base::StatusOr<std::vector<std::string>> list = transport::SplitGacdAddresses(address);
  if (!list.ok()) {
    RaiseInvalidArgument("address must be host:port or a comma-separated list of them, got '" + address + "'");
  }
}

// PEM roots from `tls`: None (plaintext), the PEM text (str or bytes), or
// the path of a PEM file (str or os.PathLike; a missing file raises
// FileNotFoundError).
std::string TlsRoots(const py::object& tls) {
  if (tls.is_none()) return "";
  if (py::isinstance<py::bytes>(tls)) return tls.cast<std::string>();
  const std::string text = py::str(py::module_::import("os").attr("fspath")(tls));
  if (text.find("-----BEGIN") != std::string::npos) return text;
  return py::module_::import("pathlib").attr("Path")(text).attr("read_text")().cast<std::string>();
}

std::chrono::milliseconds Milliseconds(double seconds, const char* what) {
  if (!std::isfinite(seconds) || seconds < 0.001 || seconds > 86400.0) {
    RaiseInvalidArgument(std::string(what) + " must be between 0.001 and 86400 seconds, got " + std::to_string(seconds));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000.0)));
}

std::uint32_t CheckRank(std::int64_t rank, std::int64_t world_size) {
  if (world_size < 1 || world_size > (std::int64_t{1} << 31)) {
    RaiseInvalidArgument("world_size must be >= 1, got " + std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    RaiseInvalidArgument("rank must be in [0, world_size), got rank " + std::to_string(rank) + " of " +
                         std::to_string(world_size));
  }
  return static_cast<std::uint32_t>(rank);
}

// gac.Telemetry: one rank's stream of step records to gacd.
class PyTelemetry {
 public:
  PyTelemetry(const std::string& address, const std::string& run, std::int64_t rank, std::int64_t world_size,
              const py::object& spool_dir, const std::optional<std::string>& token, const py::object& tls,
              std::int64_t queue_capacity, double flush_interval, std::int64_t spool_max_bytes, bool fsync) {
    CheckAddress(address);
    CheckRunId(run);
    who_ = RunIdentity{run, CheckRank(rank, world_size), static_cast<std::uint32_t>(world_size)};
    if (queue_capacity < 1) RaiseInvalidArgument("queue_capacity must be >= 1, got " + std::to_string(queue_capacity));
    if (spool_max_bytes < 1) RaiseInvalidArgument("spool_max_bytes must be >= 1, got " + std::to_string(spool_max_bytes));
    TelemetryOptions o;
    o.address = address;
    o.token = token.value_or("");
    o.tls_root_certs = TlsRoots(tls);
    if (!spool_dir.is_none()) o.spool_dir = py::str(py::module_::import("os").attr("fspath")(spool_dir));
    o.spool_max_bytes = static_cast<std::uint64_t>(spool_max_bytes);
    o.spool_fsync = fsync ? transport::SpoolFsync::kEveryAppend : transport::SpoolFsync::kNone;
    o.queue_capacity = static_cast<std::size_t>(queue_capacity);
    o.flush_interval = Milliseconds(flush_interval, "flush_interval");
    base::StatusOr<std::unique_ptr<Telemetry>> t = [&] {
      py::gil_scoped_release release;  // opening the spool reads it
      return Telemetry::Start(o);
    }();
    telemetry_ = ValueOrRaise(std::move(t));
  }

  bool Send(const controller::StepReport& r, const std::optional<std::map<std::string, double>>& scalars,
            std::optional<std::int64_t> staleness) {
    CheckOpen();
    if (r.step < 0) RaiseInvalidArgument("gacd stores steps >= 0, the report is of step " + std::to_string(r.step));
    if (staleness && *staleness < 0) RaiseInvalidArgument("staleness must be >= 0, got " + std::to_string(*staleness));
    static const std::map<std::string, double> kNone;
    const std::map<std::string, double>& s = scalars ? *scalars : kNone;
    if (s.size() > proto::kMaxScalarsPerRecord) {
      RaiseInvalidArgument("at most " + std::to_string(proto::kMaxScalarsPerRecord) + " scalars per step, got " +
                           std::to_string(s.size()));
    }
    for (const auto& kv : s) CheckScalarName(kv.first);
    return telemetry_->Enqueue(transport::MakeStepRecord(r, who_, s, staleness));
  }

  bool Flush(double timeout) {
    CheckOpen();
    const std::chrono::milliseconds ms = Timeout(timeout);
    py::gil_scoped_release release;
    return telemetry_->Flush(ms);
  }

  void Close(double timeout) {
    if (closed_) return;
    const std::chrono::milliseconds ms = Timeout(timeout);
    {
      py::gil_scoped_release release;
      telemetry_->Close(ms);
    }
    closed_ = true;
  }

  TelemetryCounters counters() const { return telemetry_->counters(); }
  const SpoolRecovery& recovery() const { return telemetry_->recovery(); }
  std::string last_error() const { return telemetry_->last_error(); }
  std::string address() const { return telemetry_->address(); }
  bool closed() const { return closed_; }
  const RunIdentity& who() const { return who_; }

 private:
  void CheckOpen() const {
    if (closed_) RaiseStatus(base::Status::FailedPrecondition("the telemetry is closed"));
  }
  static std::chrono::milliseconds Timeout(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0 || seconds > 86400.0) {
      RaiseInvalidArgument("timeout must be between 0 and 86400 seconds, got " + std::to_string(seconds));
    }
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(seconds * 1000.0)));
  }

  RunIdentity who_;
  std::unique_ptr<Telemetry> telemetry_;
  bool closed_ = false;
};

py::dict CountersDict(const TelemetryCounters& c) {
  return py::dict("enqueued"_a = c.enqueued, "dropped_queue_full"_a = c.dropped_queue_full,
                  "records_sent"_a = c.records_sent, "records_acknowledged"_a = c.records_acknowledged,
                  "records_spooled"_a = c.records_spooled, "batches_replayed"_a = c.batches_replayed,
                  "records_replayed"_a = c.records_replayed, "records_rejected"_a = c.records_rejected,
                  "spool_errors"_a = c.spool_errors, "dropped_at_close"_a = c.dropped_at_close,
                  "reconnects"_a = c.reconnects, "failovers"_a = c.failovers,
                  "queue_depth"_a = c.queue_depth,
                  "unacknowledged"_a = c.unacknowledged);
}

// gac.TelemetryCounters: one read-only property per counter.
void BindTelemetryCounters(py::module_& m) {
  py::class_<TelemetryCounters>(m, "TelemetryCounters", "The sender's counters, as of the call that returned them.")
      .def_readonly("enqueued", &TelemetryCounters::enqueued, "Records accepted by send().")
      .def_readonly("dropped_queue_full", &TelemetryCounters::dropped_queue_full,
                    "Records send() refused because the queue was full (it returned False).")
      .def_readonly("records_sent", &TelemetryCounters::records_sent, "Records written to gacd (first time).")
      .def_readonly("records_acknowledged", &TelemetryCounters::records_acknowledged, "Records gacd stored.")
      .def_readonly("records_spooled", &TelemetryCounters::records_spooled, "Records appended to the spool.")
      .def_readonly("batches_replayed", &TelemetryCounters::batches_replayed,
                    "Batches resent after a reconnect or a restart.")
      .def_readonly("records_replayed", &TelemetryCounters::records_replayed)
      .def_readonly("records_rejected", &TelemetryCounters::records_rejected,
                    "Records gacd refused as invalid (dropped; see last_error).")
      .def_readonly("spool_errors", &TelemetryCounters::spool_errors)
      .def_readonly("dropped_at_close", &TelemetryCounters::dropped_at_close,
                    "Records close() discarded: neither acknowledged nor spooled (the spool was full, or\n"
                    "there was none). With dropped_queue_full, every record not kept; see last_error.")
      .def_readonly("reconnects", &TelemetryCounters::reconnects)
      .def_readonly("failovers", &TelemetryCounters::failovers,
                    "Moves to the next gacd of an address list after a failure.")
      .def_readonly("queue_depth", &TelemetryCounters::queue_depth, "Records waiting in the queue.")
      .def_readonly("unacknowledged", &TelemetryCounters::unacknowledged,
                    "Records sent or spooled, not yet acknowledged.")
      .def("to_dict", &CountersDict)
      .def("__repr__", [](const TelemetryCounters& c) {
        return "TelemetryCounters(enqueued=" + std::to_string(c.enqueued) +
               ", acknowledged=" + std::to_string(c.records_acknowledged) +
               ", dropped=" + std::to_string(c.dropped_queue_full) + ", rejected=" + std::to_string(c.records_rejected) +
               ", dropped_at_close=" + std::to_string(c.dropped_at_close) +
               ", reconnects=" + std::to_string(c.reconnects) + ")";
      });
}

void BindSpoolRecovery(py::module_& m) {
  py::class_<SpoolRecovery>(m, "SpoolRecovery", "What the spool held when the telemetry started.")
      .def_readonly("entries", &SpoolRecovery::entries, "Unacknowledged batches found (sent first).")
      .def_readonly("bytes", &SpoolRecovery::bytes)
      .def_readonly("dropped_entries", &SpoolRecovery::dropped_entries, "Damaged entries dropped.")
      .def_readonly("dropped_bytes", &SpoolRecovery::dropped_bytes)
      .def_readonly("detail", &SpoolRecovery::detail, "One line per damage found; '' when clean.");
}

// gac.Telemetry (its counters and spool recovery are bound before it).
void BindTelemetry(py::module_& m) {
  py::class_<PyTelemetry>(
      m, "Telemetry",
      "Streams step reports to gacd from a background thread: send() queues a record and returns (never\n"
      "blocks on the network or the disk); batches are spooled to spool_dir before they are sent and kept until\n"
      "gacd acknowledges them, so a restart of gacd or of the trainer loses nothing. Use as a context manager,\n"
      "or call close(). Safe to call from several threads.")
      .def(py::init<const std::string&, const std::string&, std::int64_t, std::int64_t, const py::object&,
                    const std::optional<std::string>&, const py::object&, std::int64_t, double, std::int64_t, bool>(),
           "address"_a, "run"_a, py::kw_only(), "rank"_a = 0, "world_size"_a = 1, "spool_dir"_a = py::none(),
           "token"_a = py::none(), "tls"_a = py::none(), "queue_capacity"_a = 1 << 16, "flush_interval"_a = 0.05,
           "spool_max_bytes"_a = std::int64_t{256} << 20, "fsync"_a = false,
           "address: gacd's host:port, or a comma-separated list of gacd replicas sharing one store (the sender\n"
           "moves to the next when one fails and resends what it had not acknowledged; each step is stored once).\n"
           "run: the run id ([A-Za-z0-9._:/-]). spool_dir: where unacknowledged\n"
           "batches wait (None: in memory only, lost with the process). token: a bearer token with write rights\n"
           "on the run. tls: PEM roots (text, bytes or a file path) to verify gacd; None = plaintext.\n"
           "flush_interval: seconds a partial batch waits. fsync: fsync every spooled batch (survives power loss).")
      .def("send", &PyTelemetry::Send, "report"_a, "scalars"_a = py::none(), "staleness"_a = py::none(),
           "Queues the record of `report` with the trainer's scalars ({'reward': r, ...}; non-finite values are\n"
           "left out) and the policy staleness (versions behind). Returns False, and counts it, when the queue is\n"
           "full. Never blocks.")
      .def("flush", &PyTelemetry::Flush, "timeout"_a = 10.0,
           "Waits up to `timeout` seconds until everything sent so far is acknowledged; False on timeout.")
      .def("close", &PyTelemetry::Close, "timeout"_a = 10.0,
           "Flushes for up to `timeout` seconds and stops the sender; what is not acknowledged stays in the\n"
           "spool for the next process, as far as the spool has room; the rest is discarded and counted in\n"
           "counters.dropped_at_close (and said in last_error). Idempotent.")
      .def_property_readonly("counters", &PyTelemetry::counters)
      .def_property_readonly("recovery", &PyTelemetry::recovery, py::return_value_policy::copy)
      .def_property_readonly("last_error", &PyTelemetry::last_error,
                             "The last stream error ('' if none), e.g. 'UNAVAILABLE: connection refused', after\n"
                             "what was lost so far if anything ('Enqueue refused N records (queue full ...; spool\n"
                             "full: ...)', 'Close discarded M records ...').")
      .def_property_readonly("address", &PyTelemetry::address,
                             "The gacd address the open stream goes to ('' when none).")
      .def_property_readonly("closed", &PyTelemetry::closed)
      .def_property_readonly("run", [](const PyTelemetry& t) { return t.who().run; })
      .def_property_readonly("rank", [](const PyTelemetry& t) { return t.who().rank; })
      .def_property_readonly("world_size", [](const PyTelemetry& t) { return t.who().world_size; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyTelemetry& t, py::args) { t.Close(10.0); });
}

// RemoteController.set_thresholds and its deprecated alias.
void SetThresholds(RemoteController& rc, double c_low, double c_high, const std::string& alpha_mode,
                   const std::string& reason, std::optional<controller::Mode> mode) {
  const controller::AlphaMode alpha = AlphaModeFromName(alpha_mode);
  ThrowIfError(controller::ValidateThresholds(controller::Thresholds{c_low, c_high}));
  base::Status st = [&] {
    py::gil_scoped_release release;
    return rc.SetThresholds(controller::Thresholds{c_low, c_high}, alpha, reason, mode);
  }();
  ThrowIfError(st);
}

void BindRemoteController(py::module_& m) {
  py::class_<RemoteController, controller::DecisionSource, std::shared_ptr<RemoteController>>(
      m, "RemoteController",
      "gacd as the decision source of an agent in remote mode: decide() asks gacd's ControlService within\n"
      "`deadline` seconds. Pass it as Agent(mode='remote', decision_source=...); a miss, an outage or an\n"
      "answer no controller would give makes the agent use its local decision and count a fallback.\n"
      "Safe to use from several threads.")
      .def(py::init([](const std::string& address, const std::string& run, std::int64_t rank,
                       const std::optional<std::string>& token, const py::object& tls, double deadline) {
             CheckAddress(address);
             CheckRunId(run);
             RemoteControllerOptions o;
             o.address = address;
             o.run = run;
             o.rank = CheckRank(rank, std::int64_t{1} << 31);
             o.token = token.value_or("");
             o.tls_root_certs = TlsRoots(tls);
             o.deadline = Milliseconds(deadline, "deadline");
             return std::shared_ptr<RemoteController>(ValueOrRaise(RemoteController::Create(o)));
           }),
           "address"_a, "run"_a, py::kw_only(), "rank"_a = 0, "token"_a = py::none(), "tls"_a = py::none(),
           "deadline"_a = 0.05,
           "address: gacd's host:port, or a comma-separated list of replicas sharing one store (a replica that\n"
           "answers UNAVAILABLE is passed over within the same deadline); run: the run id; token: a bearer token\n"
           "with write rights on the run;\n"
           "tls: PEM roots (text, bytes or a file path), None = plaintext; deadline: seconds per decision.")
      .def(
          "set_thresholds",
          [](RemoteController& rc, double c_low, double c_high, const std::string& alpha_mode, const std::string& reason,
             const std::optional<std::string>& mode) {
            SetThresholds(rc, c_low, c_high, alpha_mode, reason, mode ? std::optional<controller::Mode>(ModeFromName(*mode)) : std::nullopt);
          },
          "c_low"_a, "c_high"_a, "alpha_mode"_a = "paper", "reason"_a = "", "mode"_a = py::none(),
          "Sets the run's thresholds on gacd (the token needs admin rights); the run keeps its mode unless `mode`\n"
          "('monitor', 'local' or 'remote') is given. `reason` goes to gacd's audit log. Waits up to 10 s.")
      .def(
          "set_spike_guard",
          [](RemoteController& rc, const py::object& max_grad_norm, const py::object& spike_sigma,
             const py::object& spike_window, const py::object& spike_warmup, const std::string& reason) {
            const controller::SpikeSettings s = SpikeFromKeywords(max_grad_norm, spike_sigma, spike_window,
                                                                  spike_warmup);
            base::Status st = [&] {
              py::gil_scoped_release release;
              return rc.SetSpikeGuard(s, reason);
            }();
            ThrowIfError(st);
          },
          py::kw_only(), "max_grad_norm"_a = py::none(), "spike_sigma"_a = py::none(), "spike_window"_a = py::none(),
          "spike_warmup"_a = py::none(), "reason"_a = "",
          "Replaces the run's spike guard on gacd (the token needs admin rights; the run's other settings are\n"
          "kept), with the keywords of gac.Agent: max_grad_norm (> 0: the bound on |g|), and any of spike_sigma,\n"
          "spike_window, spike_warmup for the z-score. With none of them the guard is turned off. ValueError,\n"
          "before asking gacd, for settings the controller refuses. Waits up to 10 s.")
      .def(
          "set_run_thresholds",
          [](RemoteController& rc, double c_low, double c_high, const std::string& alpha_mode,
             const std::string& reason) {
            WarnDeprecated("RemoteController.set_run_thresholds");
            SetThresholds(rc, c_low, c_high, alpha_mode, reason, controller::Mode::kRemote);
          },
          "c_low"_a, "c_high"_a, "alpha_mode"_a = "paper", "reason"_a = "",
          "Deprecated: set_thresholds(c_low, c_high, alpha_mode, reason, mode='remote').");
}

std::string CheckGacd(const std::string& address, const std::optional<std::string>& token, const py::object& tls,
                      double timeout) {
  if (!transport::SplitGacdAddresses(address).ok() || address.find(',') != std::string::npos) {
    RaiseInvalidArgument("address must be one host:port, got '" + address + "'");
  }
  const transport::ChannelTls roots{TlsRoots(tls), "", ""};
  const std::chrono::milliseconds deadline = Milliseconds(timeout, "timeout");
  base::StatusOr<std::string> status = [&] {
    py::gil_scoped_release release;
    return transport::CheckGacdHealth(address, roots, token.value_or(""), deadline);
  }();
  return ValueOrRaise(std::move(status));
}

}  // namespace
}  // namespace gac::python

PYBIND11_MODULE(_transport, m) {
  m.doc() = "Telemetry to gacd and gacd as a decision source (no torch).";
  py::module_::import("gac._controller");
  gac::python::BindTelemetryCounters(m);
  gac::python::BindSpoolRecovery(m);
  gac::python::BindTelemetry(m);
  gac::python::BindRemoteController(m);
  m.def("check_gacd", &gac::python::CheckGacd, "address"_a, py::kw_only(), "token"_a = py::none(),
        "tls"_a = py::none(), "timeout"_a = 2.0,
        "Asks gacd at `address` (host:port) whether it serves, through the standard gRPC health service, within\n"
        "`timeout` seconds, and returns its answer: 'SERVING', or 'NOT_SERVING' while it drains. token: sent as\n"
        "the bearer token (gacd's health service needs none); tls: PEM roots (text, bytes or a file path), None =\n"
        "plaintext. Raises UnavailableError when nothing answers there (at once for a refused connection),\n"
        "DeadlineExceededError when no answer came in time.");
}
