"""Bad arguments of every public call of the package raise a clear exception
of the right class, with a message that names what is wrong, and change
nothing. (The controller's and the calibration helpers' are in
test_controller.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, List, Tuple, Type

import pytest
import torch

import gac


def param(n: int = 8, dtype: torch.dtype = torch.float32) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.zeros(n, dtype=dtype))
    p.grad = torch.ones(n, dtype=dtype)
    return p


P = param()
Q = param()

# (call, exception class, a part of the message)
AGENT_CASES: List[Tuple[Callable[[], Any], Type[BaseException], str]] = [
    (lambda: gac.Agent(0.5, 0.3), gac.InvalidArgumentError, "c_low must be < c_high"),
    (lambda: gac.Agent(0.0, 0.3), ValueError, "c_low"),
    (lambda: gac.Agent(0.05, 1.2), ValueError, "c_high"),
    (lambda: gac.Agent(mode="fast"), ValueError, "mode must be 'local', 'monitor' or 'remote', got 'fast'"),
    (lambda: gac.Agent(alpha_mode="slow"), ValueError, "alpha_mode must be 'paper' or 'exact'"),
    (lambda: gac.Agent(snapshot_dtype=torch.float16), ValueError, "snapshot_dtype must be torch.float32 or torch.bfloat16"),
    (lambda: gac.Agent(reference="previous"), ValueError, "reference must be 'raw_gradient' or 'applied_update'"),
    (lambda: gac.Agent(layers=[P]), TypeError, "layers must be a dict"),
    (lambda: gac.Agent(layers={"a": P}), TypeError, "layer 'a' is a single tensor"),
    (lambda: gac.Agent(layers={"a": [1]}), TypeError, "layer 'a' holds a int, expected tensors"),
    (lambda: gac.Agent(layers={"": [P]}), ValueError, "layer names must not be empty"),
    (lambda: gac.Agent(layers={"a": [P], "b": [Q, P]}), ValueError, "a parameter is in layers 'a' and 'b'"),
    (lambda: gac.Agent(process_group="world"), TypeError, "process_group must be a torch.distributed ProcessGroup"),
    (lambda: gac.Agent(decision_source=object()), TypeError,
     "decision_source must be a gac.RemoteController or a gac.DecisionSource subclass"),
    (lambda: gac.Agent(mode="remote"), ValueError, "remote mode needs"),
    (lambda: gac.Agent(num_threads=-1), ValueError, "num_threads must be >= 0"),
    (lambda: gac.Agent(chunk_elements=10), ValueError, "chunk_elements must be >= 1024"),
    (lambda: gac.Agent("low"), TypeError, "incompatible"),
    (lambda: gac.Agent().step(1, P), TypeError, "params is a single tensor"),
    (lambda: gac.Agent().step(1, 5), TypeError, "params must be an iterable of tensors"),
    (lambda: gac.Agent().step(1, [P, 3]), TypeError, "params[1] is a int, expected a torch.Tensor"),
    (lambda: gac.Agent().step(1, [param(4, torch.float64)]), ValueError,
     "gradient of parameter 0 has dtype float64; supported: float32, bfloat16, float16"),
    (lambda: gac.Agent().step("one", [P]), TypeError, "incompatible"),
    (lambda: gac.Agent()._time_cpp_step(1), gac.FailedPreconditionError, "call step() once"),
]


@pytest.mark.parametrize("call, error, message", AGENT_CASES)
def test_agent_errors(call: Callable[[], Any], error: Type[BaseException], message: str) -> None:
    with pytest.raises(error) as e:
        call()
    assert message in str(e.value)
    if isinstance(e.value, gac.GacError):
        assert "\n" not in str(e.value)


def test_agent_state_errors_change_nothing() -> None:
    agent = gac.Agent()
    p = param()
    agent.step(5, [p])
    with pytest.raises(ValueError, match="step 5 is not after the previous step 5"):
        agent.step(5, [p])
    with pytest.raises(ValueError, match="mode must be"):
        agent.mode = "auto"
    assert agent.mode == "local"
    p.grad = torch.full((8,), float("inf"))
    r = agent.step(6, [p])
    assert r.regime == "invalid" and not r.step_optimizer
    p.grad = torch.ones(8)
    assert agent.step(7, [p]).cosine == pytest.approx(1.0)  # the snapshot of step 5 was kept


def telemetry(**kw: Any) -> gac.Telemetry:
    args = dict(address="127.0.0.1:1", run="errors")
    args.update(kw)
    return gac.Telemetry(args.pop("address"), args.pop("run"), **args)


TELEMETRY_CASES: List[Tuple[Callable[[], Any], Type[BaseException], str]] = [
    (lambda: telemetry(address=""), ValueError, "address must be host:port or a comma-separated list"),
    (lambda: telemetry(address="127.0.0.1:1,"), ValueError, "a comma-separated list of them, got '127.0.0.1:1,'"),
    (lambda: telemetry(run="bad run!"), ValueError, "run must be a valid run id"),
    (lambda: telemetry(run="x" * 129), ValueError, "run must be"),
    (lambda: telemetry(rank=2, world_size=2), ValueError, "rank must be in [0, world_size)"),
    (lambda: telemetry(world_size=0), ValueError, "world_size must be >= 1"),
    (lambda: telemetry(queue_capacity=0), ValueError, "queue_capacity must be >= 1"),
    (lambda: telemetry(flush_interval=0.0), ValueError, "flush_interval must be between 0.001 and 86400 seconds"),
    (lambda: telemetry(spool_max_bytes=0), ValueError, "spool_max_bytes must be >= 1"),
    (lambda: telemetry(tls="/nonexistent/ca.pem"), FileNotFoundError, "/nonexistent/ca.pem"),
    (lambda: gac.RemoteController("", "r"), ValueError, "address must be host:port or a comma-separated list"),
    (lambda: gac.RemoteController("127.0.0.1:1, ,127.0.0.1:2", "r"), ValueError, "comma-separated list"),
    (lambda: gac.RemoteController("127.0.0.1:1", "a b"), ValueError, "run must be"),
    (lambda: gac.RemoteController("127.0.0.1:1", "r", deadline=0), ValueError, "deadline must be between"),
    (lambda: gac.RemoteController("127.0.0.1:1", "r", deadline=float("nan")), ValueError, "deadline must be between"),
    (lambda: gac.RemoteController("127.0.0.1:1", "r", rank=-1), ValueError, "rank must be in"),
    (lambda: gac.RemoteController("127.0.0.1:1", "r").set_thresholds(0.3, 0.1), ValueError, "c_low must be < c_high"),
    (lambda: gac.RemoteController("127.0.0.1:1", "r").set_thresholds(0.05, 0.3, "fast"), ValueError,
     "alpha_mode must be"),
    (lambda: gac.RemoteController("127.0.0.1:1", "r").set_thresholds(0.05, 0.3), gac.UnavailableError,
     "gacd SetRunConfig"),
    (lambda: gac.RemoteController("127.0.0.1:1", "r").set_thresholds(0.05, 0.3, mode="fast"), ValueError,
     "mode must be"),
    (lambda: gac.RemoteController("127.0.0.1:1", "r").decide(1, gac.AlignmentStats(0.1, 1, 1)), gac.UnavailableError,
     "gacd Decide"),
    (lambda: gac.DecisionSource().decide(1, gac.AlignmentStats(0.1, 1, 1)), gac.UnimplementedError,
     "does not define decide()"),
]


@pytest.mark.parametrize("call, error, message", TELEMETRY_CASES)
def test_transport_errors(call: Callable[[], Any], error: Type[BaseException], message: str) -> None:
    with pytest.raises(error) as e:
        call()
    assert message in str(e.value)


def test_spool_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(gac.GacError) as e:
        telemetry(spool_dir=f / "spool")
    assert str(f) in str(e.value)


def test_send_errors() -> None:
    agent = gac.Agent()
    report = agent.step(1, [param()])
    t = telemetry()
    cases: List[Tuple[Callable[[], Any], Type[BaseException], str]] = [
        (lambda: t.send("report"), TypeError, "incompatible"),
        (lambda: t.send(report, scalars={"reward": "high"}), TypeError, "incompatible"),
        (lambda: t.send(report, scalars={"bad\nname": 1.0}), ValueError, "scalar names must be 1-256 printable ASCII"),
        (lambda: t.send(report, scalars={"": 1.0}), ValueError, "scalar names must be"),
        (lambda: t.send(report, scalars={f"s{i}": 1.0 for i in range(65)}), ValueError, "at most 64 scalars"),
        (lambda: t.send(report, staleness=-1), ValueError, "staleness must be >= 0"),
        (lambda: t.flush(-1), ValueError, "timeout must be between 0 and 86400 seconds"),
        (lambda: t.send(gac.Agent().step(-3, [param()])), ValueError, "gacd stores steps >= 0"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as e:
            call()
        assert message in str(e.value), message
    assert t.counters.enqueued == 0
    assert t.send(report, scalars={"reward": 1.0})
    t.close(0)
    with pytest.raises(gac.FailedPreconditionError, match="the telemetry is closed"):
        t.send(report)
    t.close(0)  # idempotent
