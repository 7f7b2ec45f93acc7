"""gac.v1, the generated modules of gac's own .proto that ship in the
package: one module per proto file, importing one another inside the
package; `import gac` needs neither protobuf nor grpcio; a client built from
gac.v1 alone ingests step records into a real gacd and reads them back (and
the C++ reader sees the same); records sent by gac.Telemetry (the C++
transport) read back through gac.v1's QueryService stub; gacd's decisions
and run settings through gac.v1's ControlService and AdminService stubs
match gac's own controller."""

from __future__ import annotations

import importlib
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import grpc
import pytest
from google.protobuf import json_format

import gac
from conftest import GACD, GACD_STEPS, SOURCE_DIR, Gacd
from gac.v1 import control_pb2, control_pb2_grpc, query_pb2, query_pb2_grpc, telemetry_pb2, telemetry_pb2_grpc

V1 = Path(gac.__file__).resolve().parent / "v1"
TIMEOUT = 30.0  # seconds, every call's deadline


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gacd]:
    """One gacd for the module: each test writes its own runs."""
    if not (GACD and GACD_STEPS):
        pytest.skip("built without gacd (GAC_WITH_SERVER=OFF)")
    gacd = Gacd(tmp_path_factory.mktemp("gacd"))
    gacd.start()
    try:
        yield gacd
    finally:
        gacd.stop()


@pytest.fixture(scope="module")
def channel(server: Gacd) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as ch:
        yield ch


def test_every_proto_file_has_its_modules_inside_the_package() -> None:
    protos = sorted(p.stem for p in (SOURCE_DIR / "proto" / "gac" / "v1").glob("*.proto"))
    assert protos == ["control", "query", "telemetry"]
    for name in protos:
        module = importlib.import_module(f"gac.v1.{name}_pb2")
        assert module.__file__ is not None and Path(module.__file__).resolve().parent == V1
        assert module.DESCRIPTOR.name == f"gac/v1/{name}.proto" and module.DESCRIPTOR.package == "gac.v1"
        assert (V1 / f"{name}_pb2.pyi").is_file()
        services = re.findall(r"^service (\w+)", (SOURCE_DIR / "proto" / "gac" / "v1" / f"{name}.proto").read_text(),
                              re.M)
        grpc_module = importlib.import_module(f"gac.v1.{name}_pb2_grpc")
        assert services and all(hasattr(grpc_module, f"{s}Stub") for s in services), (name, services)
    # The generated imports resolve to these same modules: a StepRecord inside
    # a query message is the StepRecord of gac.v1.telemetry_pb2.
    latest = query_pb2.RunInfo.DESCRIPTOR.fields_by_name["latest"].message_type
    assert latest is telemetry_pb2.StepRecord.DESCRIPTOR
    assert query_pb2.GetStepsResponse(steps=[telemetry_pb2.StepRecord(run="r")]).steps[0].run == "r"
    assert control_pb2.DecideResponse.DESCRIPTOR.fields_by_name["regime"].enum_type is telemetry_pb2.Regime.DESCRIPTOR


def test_import_gac_needs_neither_protobuf_nor_grpcio() -> None:
    # None in sys.modules makes every import of these names fail, as in an
    # environment without them.
    code = (
        "import sys\n"
        "for name in ('google.protobuf', 'grpc'):\n"
        "    sys.modules[name] = None\n"
        "import gac\n"
        "assert gac.Controller(0.1, 0.4).decide(0.5, 1.0, 1.0).regime == 'skip'\n"
        "assert gac.Telemetry.__name__ == 'Telemetry'\n"
        "assert not [m for m in sys.modules if m.startswith('gac.v1')]\n"
        "try:\n"
        "    from gac.v1 import query_pb2\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "gac.v1 needs the protobuf runtime" in out.stdout and "gac[client]" in out.stdout, out.stdout


def step_records(run: str) -> List[telemetry_pb2.StepRecord]:
    """Three steps of one rank: the first (no reference), a projection with
    layers, scalars and staleness, and a skip."""
    first = telemetry_pb2.StepRecord(run=run, rank=0, world_size=2, step=1, grad_norm=2.5,
                                     regime=telemetry_pb2.REGIME_SAFE, alpha=1.0,
                                     wall_time_ns=1_700_000_000_000_000_000, mode=telemetry_pb2.CONTROL_MODE_LOCAL,
                                     agent_overhead_seconds=1.5e-5)
    project = telemetry_pb2.StepRecord(
        run=run, rank=0, world_size=2, step=2, cosine=0.2, grad_norm=2.0, ref_norm=2.5,
        regime=telemetry_pb2.REGIME_PROJECT, alpha=0.25, cosine_after=0.05, staleness=3,
        scalars={"reward": 0.75, "loss": -1.25}, wall_time_ns=1_700_000_000_100_000_000,
        agent_overhead_seconds=2e-5, mode=telemetry_pb2.CONTROL_MODE_REMOTE, fallback=True,
        layers=[telemetry_pb2.LayerRecord(name="embed", cosine=-0.125, grad_norm=1.5, ref_norm=0.5),
                telemetry_pb2.LayerRecord(name="head", grad_norm=0.25, ref_norm=0.0)])
    skip = telemetry_pb2.StepRecord(run=run, rank=0, world_size=2, step=3, cosine=-0.5, grad_norm=1.0, ref_norm=2.0,
                                    regime=telemetry_pb2.REGIME_SKIP, alpha=1.0, staleness=0,
                                    mode=telemetry_pb2.CONTROL_MODE_LOCAL)
    return [first, project, skip]


def ingest(channel: grpc.Channel, requests: List[telemetry_pb2.IngestRequest]) -> List[telemetry_pb2.IngestAck]:
    stub = telemetry_pb2_grpc.IngestServiceStub(channel)
    return list(stub.Ingest(iter(requests), timeout=TIMEOUT))


def all_steps(channel: grpc.Channel, run: str, page_size: int = 0) -> List[telemetry_pb2.StepRecord]:
    stub = query_pb2_grpc.QueryServiceStub(channel)
    steps: List[telemetry_pb2.StepRecord] = []
    token = ""
    while True:
        page = stub.GetSteps(query_pb2.GetStepsRequest(run=run, include_layers=True, page_size=page_size,
                                                       page_token=token), timeout=TIMEOUT)
        steps.extend(page.steps)
        token = page.next_page_token
        if not token:
            return steps


def test_a_client_of_gac_v1_alone_ingests_and_reads_back(server: Gacd, channel: grpc.Channel) -> None:
    run = "v1-client"
    records = step_records(run)
    acks = ingest(channel, [telemetry_pb2.IngestRequest(sequence=1, records=records[:2]),
                            telemetry_pb2.IngestRequest(sequence=2, records=records[2:])])
    assert [(a.sequence, a.stored, a.duplicates) for a in acks] == [(1, 2, 0), (2, 1, 0)]
    # A replay on a new stream is acknowledged and stored no second time.
    replay = ingest(channel, [telemetry_pb2.IngestRequest(sequence=7, records=records)])
    assert [(a.sequence, a.stored, a.duplicates) for a in replay] == [(7, 0, 3)]

    # Read back through gac.v1's QueryService stub: the messages as sent, field for field.
    stored = all_steps(channel, run, page_size=2)
    assert stored == records
    assert not stored[0].HasField("cosine") and stored[2].HasField("staleness")

    # The C++ reader (gacd_steps: gac::v1 C++ messages, protobuf's JSON) sees the same.
    from_cpp = [json_format.ParseDict(d, telemetry_pb2.StepRecord()) for d in server.steps(run)]
    assert from_cpp == records

    query = query_pb2_grpc.QueryServiceStub(channel)
    runs = {r.run: r for r in query.ListRuns(query_pb2.ListRunsRequest(), timeout=TIMEOUT).runs}
    info = runs[run]
    assert (info.first_step, info.last_step, info.step_records, info.world_size) == (1, 3, 3, 2)
    assert info.steps_mode == telemetry_pb2.CONTROL_MODE_LOCAL  # the mode of step 3
    summary = query.GetRunSummary(query_pb2.GetRunSummaryRequest(run=run), timeout=TIMEOUT)
    assert dict(summary.steps_by_regime) == {"safe": 1, "project": 1, "skip": 1, "invalid": 0, "spike": 0}
    assert summary.latest.step == 3 and summary.calibration.count == 2
    assert summary.calibration.max == pytest.approx(0.5)

    # gacd's status codes reach the client unchanged.
    with pytest.raises(grpc.RpcError) as err:
        query.GetSteps(query_pb2.GetStepsRequest(run="v1-no-such-run"), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    bad = telemetry_pb2.StepRecord(run=run, step=4, grad_norm=-1.0, regime=telemetry_pb2.REGIME_SAFE)
    with pytest.raises(grpc.RpcError) as err:
        ingest(channel, [telemetry_pb2.IngestRequest(sequence=1, records=[bad])])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [s.step for s in all_steps(channel, run)] == [1, 2, 3]


class Trainer:
    """Gradients of two layers whose consecutive cosine goes through safe, project and skip."""

    RHOS = [0.0, 0.0, 0.2, 0.9, 0.02, -0.6]

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.gen = torch.Generator().manual_seed(5)
        self.params = [torch.nn.Parameter(torch.zeros(n)) for n in (500, 40)]
        self.raw = [torch.randn(p.shape, generator=self.gen, dtype=torch.float64) for p in self.params]

    def backward(self, step: int) -> None:
        rho = self.RHOS[step % len(self.RHOS)]
        for i, p in enumerate(self.params):
            noise = self.torch.randn(p.shape, generator=self.gen, dtype=self.torch.float64)
            self.raw[i] = rho * self.raw[i] + math.sqrt(1 - rho * rho) * noise
            p.grad = self.raw[i].float()


def test_records_sent_by_gac_telemetry_read_back_through_gac_v1(server: Gacd, channel: grpc.Channel,
                                                                 tmp_path: Path) -> None:
    trainer = Trainer()
    agent = gac.Agent(0.1, 0.4, layers={"w": trainer.params[:1], "b": trainer.params[1:]})
    sent = {}
    with gac.Telemetry(server.address, "v1-telemetry", rank=1, world_size=2, spool_dir=tmp_path / "spool") as t:
        for step in range(1, 13):
            trainer.backward(step)
            report = agent.step(step, trainer.params)
            sent[step] = report
            assert t.send(report, scalars={"reward": step / 16}, staleness=step % 3)
        assert t.flush(TIMEOUT), t.last_error
    stored = all_steps(channel, "v1-telemetry", page_size=5)
    assert [s.step for s in stored] == list(range(1, 13))
    regimes = set()
    for record in stored:
        report = sent[record.step]
        regimes.add(report.regime)
        assert (record.run, record.rank, record.world_size) == ("v1-telemetry", 1, 2)
        assert telemetry_pb2.Regime.Name(record.regime) == "REGIME_" + report.regime.upper()
        assert record.mode == telemetry_pb2.CONTROL_MODE_LOCAL and not record.fallback
        if report.cosine is None:
            assert not record.HasField("cosine")
        else:
            assert record.cosine == pytest.approx(report.cosine, rel=1e-12)
        assert record.grad_norm == pytest.approx(report.grad_norm, rel=1e-12)
        assert record.ref_norm == pytest.approx(report.ref_norm, rel=1e-12)
        assert record.alpha == pytest.approx(report.alpha, rel=1e-12)
        assert record.staleness == record.step % 3
        assert record.scalars["reward"] == record.step / 16
        assert record.wall_time_ns > 0 and record.agent_overhead_seconds > 0
        layers = {layer.name: layer for layer in record.layers}
        assert set(layers) == {"w", "b"}
        for name, stats in report.layers.items():
            assert layers[name].grad_norm == pytest.approx(stats.grad_norm, rel=1e-12)
            assert layers[name].HasField("cosine") == (stats.cosine is not None)
    assert {"safe", "project", "skip"} <= regimes, regimes


DECIDE_CASES: List[Tuple[float, float, float]] = [
    (0.05, 1.0, 1.0),    # |c| 0.05 <= c_low: safe
    (-0.9, 2.0, 1.5),    # |c| ~0.52 between the thresholds: project
    (3.0, 4.0, 4.0),     # |c| 0.75 >= c_high: skip
]


def test_decisions_and_settings_through_gac_v1_match_gac(channel: grpc.Channel) -> None:
    run = "v1-control"
    admin = control_pb2_grpc.AdminServiceStub(channel)
    thresholds = control_pb2.Thresholds(c_low=0.1, c_high=0.6, alpha_mode=control_pb2.ALPHA_MODE_EXACT)
    config = admin.SetRunConfig(control_pb2.SetRunConfigRequest(run=run, thresholds=thresholds,
                                                                mode=telemetry_pb2.CONTROL_MODE_REMOTE,
                                                                reason="test_v1"), timeout=TIMEOUT)
    assert config.version == 1 and config.thresholds == thresholds and config.mode == telemetry_pb2.CONTROL_MODE_REMOTE
    assert admin.GetRunConfig(control_pb2.GetRunConfigRequest(run=run), timeout=TIMEOUT) == config
    changes = admin.ListConfigChanges(control_pb2.ListConfigChangesRequest(run=run), timeout=TIMEOUT).changes
    assert [(c.before.version, c.after, c.reason) for c in changes] == [(0, config, "test_v1")]

    control = control_pb2_grpc.ControlServiceStub(channel)
    local = gac.Controller(0.1, 0.6, "exact")
    for step, (dot, grad_sq, ref_sq) in enumerate(DECIDE_CASES, start=1):
        answer = control.Decide(control_pb2.DecideRequest(run=run, step=step, dot=dot, grad_sq=grad_sq, ref_sq=ref_sq,
                                                          has_reference=True), timeout=TIMEOUT)
        expected = local.decide(dot, grad_sq, ref_sq)
        assert (answer.run, answer.step, answer.config) == (run, step, config)
        assert telemetry_pb2.Regime.Name(answer.regime) == "REGIME_" + expected.regime.upper()
        assert answer.apply_update == expected.apply_update
        assert expected.cosine is not None and answer.cosine == pytest.approx(expected.cosine, rel=1e-12)
        assert answer.alpha == pytest.approx(expected.alpha, rel=1e-12)
        assert answer.projection_coeff == pytest.approx(expected.projection_coeff, rel=1e-12, abs=1e-300)
        assert answer.HasField("cosine_after") == (expected.cosine_after is not None)
    assert [local.decide(*c).regime for c in DECIDE_CASES] == ["safe", "project", "skip"]

    first = control.Decide(control_pb2.DecideRequest(run=run, step=9, grad_sq=1.0), timeout=TIMEOUT)
    assert first.regime == telemetry_pb2.REGIME_SAFE and not first.HasField("cosine") and first.apply_update
    with pytest.raises(grpc.RpcError) as err:
        control.Decide(control_pb2.DecideRequest(run=run, step=10, dot=0.1, grad_sq=-1.0, ref_sq=1.0,
                                                 has_reference=True), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
