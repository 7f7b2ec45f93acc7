"""gac.Telemetry and gac.RemoteController against real gacd processes: every
step stored once with its values, nothing lost when gacd is killed and
restarted mid-run or when the trainer restarts, remote decisions made by
gacd with the run's thresholds, and a missed Decide deadline falling back
and counted."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

import gac
from conftest import Gacd


class Trainer:
    """Gradients whose consecutive cosine cycles through safe, project and
    skip, on a few parameters with two layers."""

    RHOS = [0.0, 0.15, 0.6, 0.01, -0.2]

    def __init__(self, seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.params = [torch.nn.Parameter(torch.zeros(n)) for n in (3000, 200, 50)]
        self.raw = [torch.randn(p.shape, generator=self.gen) for p in self.params]

    def backward(self, step: int) -> None:
        rho = self.RHOS[step % len(self.RHOS)]
        for i, p in enumerate(self.params):
            self.raw[i] = rho * self.raw[i] + math.sqrt(1 - rho * rho) * torch.randn(p.shape, generator=self.gen)
            p.grad = self.raw[i].clone()


def by_step(records: List[Dict[str, object]]) -> Dict[int, Dict[str, object]]:
    steps: Dict[int, Dict[str, object]] = {}
    for r in records:
        step = int(r.get("step", 0))  # type: ignore[arg-type]
        assert step not in steps, f"step {step} stored twice"
        steps[step] = r
    return steps


def trainer_scalars(record: Dict[str, object]) -> Dict[str, float]:
    """The record's scalars without the sender's own counters (agent_*),
    which ride on the last record of each batch."""
    scalars = record.get("scalars", {})
    assert isinstance(scalars, dict)
    return {k: v for k, v in scalars.items() if not k.startswith("agent_")}


def regime_of(record: Dict[str, object]) -> str:
    return str(record["regime"]).removeprefix("REGIME_").lower()


def test_every_step_is_stored_once_with_its_values(gacd: Gacd, tmp_path: Path) -> None:
    trainer = Trainer()
    agent = gac.Agent(0.05, 0.3, layers={"big": trainer.params[:1], "small": trainer.params[1:]})
    sent: Dict[int, gac.StepReport] = {}
    with gac.Telemetry(gacd.address, "py-stored", rank=1, world_size=2, spool_dir=tmp_path / "spool") as t:
        for step in range(1, 201):
            trainer.backward(step)
            report = agent.step(step, trainer.params)
            sent[step] = report
            assert t.send(report, scalars={"reward": step / 200, "loss": -step}, staleness=step % 5)
        assert t.flush(60), t.last_error
        c = t.counters
        assert (c.enqueued, c.records_acknowledged, c.dropped_queue_full, c.records_rejected) == (200, 200, 0, 0)
    assert t.closed
    stored = by_step(gacd.steps("py-stored"))
    assert sorted(stored) == list(range(1, 201))
    regimes = set()
    for step, r in stored.items():
        rep = sent[step]
        regimes.add(rep.regime)
        assert regime_of(r) == rep.regime
        assert int(r["rank"]) == 1 and int(r["world_size"]) == 2  # type: ignore[arg-type]
        assert r.get("mode") == "CONTROL_MODE_LOCAL"
        if rep.cosine is None:
            assert "cosine" not in r
        else:
            assert float(r["cosine"]) == pytest.approx(rep.cosine, rel=1e-12)  # type: ignore[arg-type]
        assert float(r["grad_norm"]) == pytest.approx(rep.grad_norm, rel=1e-12)  # type: ignore[arg-type]
        assert float(r.get("alpha", 0.0)) == pytest.approx(rep.alpha, rel=1e-12)  # type: ignore[arg-type]
        assert trainer_scalars(r) == pytest.approx({"reward": step / 200, "loss": -step})
        assert int(r.get("staleness", 0)) == step % 5  # type: ignore[arg-type]
        layers = {layer["name"]: layer for layer in r["layers"]}  # type: ignore[union-attr, index]
        assert set(layers) == {"big", "small"}
        for name, g in rep.layers.items():
            assert float(layers[name]["grad_norm"]) == pytest.approx(g.grad_norm, rel=1e-12)
    assert {"safe", "project", "skip"} <= regimes


def test_gacd_killed_and_restarted_mid_run_loses_nothing(gacd: Gacd, tmp_path: Path) -> None:
    trainer = Trainer(1)
    agent = gac.Agent()
    spool = tmp_path / "spool"
    t = gac.Telemetry(gacd.address, "py-kill", spool_dir=spool, flush_interval=0.005)
    for step in range(1, 301):
        trainer.backward(step)
        assert t.send(agent.step(step, trainer.params), scalars={"reward": float(step)})
        if step in (60, 180):
            t.flush(10)
            gacd.kill()
        if step in (120, 240):
            gacd.start()
    assert t.flush(60), t.last_error
    assert t.counters.reconnects >= 2
    assert t.counters.records_acknowledged == 300
    # The trainer dies with gacd down: what it sent waits in the spool for
    # the next process.
    gacd.kill()
    for step in range(301, 351):
        trainer.backward(step)
        t.send(agent.step(step, trainer.params))
    t.close(0.5)
    assert t.counters.unacknowledged > 0
    gacd.start()
    with gac.Telemetry(gacd.address, "py-kill", spool_dir=spool) as t2:
        assert t2.recovery.entries > 0 and t2.recovery.dropped_entries == 0
        assert t2.flush(60), t2.last_error
    stored = by_step(gacd.steps("py-kill"))
    assert sorted(stored) == list(range(1, 351))
    assert all(trainer_scalars(r) == {"reward": float(s)} for s, r in stored.items() if s <= 300)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting the tiny filesystem for the spool needs root")
def test_spool_disk_full_loses_nothing_uncounted(gacd: Gacd, tmp_path: Path) -> None:
    """gacd down, the spool on a 256 KiB filesystem, 30,000 steps, close():
    the spool keeps the oldest records, close() counts what it discards and
    says why, and the next process stores exactly what was spooled."""
    spool = tmp_path / "spool"
    spool.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(spool)], check=True)
    try:
        trainer = Trainer(2)
        agent = gac.Agent()
        reports = []
        for step in range(30000):
            if step < 2:  # two steps of gradients; the records differ by their step
                trainer.backward(step)
            reports.append(agent.step(step, trainer.params))
        gacd.kill()
        t = gac.Telemetry(gacd.address, "py-diskfull", spool_dir=spool)
        for r in reports:
            assert t.send(r)
        time.sleep(1.0)  # the sender fills the spool
        t.close(0.2)
        c = t.counters
        assert c.enqueued == 30000 and c.dropped_queue_full == 0
        assert 0 < c.records_spooled < 30000
        assert c.records_spooled + c.dropped_at_close == 30000, c.to_dict()
        assert c.queue_depth == 0
        assert f"Close discarded {c.dropped_at_close} records" in t.last_error, t.last_error
        assert "No space left on device" in t.last_error, t.last_error
        assert c.to_dict()["dropped_at_close"] == c.dropped_at_close
        gacd.start()
        with gac.Telemetry(gacd.address, "py-diskfull", spool_dir=spool) as t2:
            assert t2.flush(60), t2.last_error
        assert sorted(by_step(gacd.steps("py-diskfull"))) == list(range(c.records_spooled))
    finally:
        subprocess.run(["umount", "-l", str(spool)], check=False)


def remote_agent(gacd: Gacd, run: str, deadline: float = 5.0) -> Tuple[gac.Agent, gac.RemoteController]:
    rc = gac.RemoteController(gacd.address, run, deadline=deadline)
    return gac.Agent(0.05, 0.3, mode="remote", decision_source=rc), rc


def test_remote_mode_applies_gacds_decisions(gacd: Gacd) -> None:
    trainer = Trainer(2)
    agent, rc = remote_agent(gacd, "py-remote")
    assert agent.decision_source is rc
    # gacd decides with the run's thresholds: a band far from the agent's own.
    rc.set_thresholds(0.01, 0.1, "exact", reason="python test", mode="remote")
    local = gac.Controller(0.01, 0.1, "exact")
    with gac.Telemetry(gacd.address, "py-remote") as t:
        for step in range(1, 21):
            trainer.backward(step)
            r = agent.step(step, trainer.params)
            assert not r.fallback, r.remote_error
            assert r.mode == "remote"
            expected = local.decide(r.cosine * r.grad_norm * r.ref_norm if r.cosine is not None else 0.0,
                                    r.grad_norm**2, r.ref_norm**2, has_reference=step > 1)
            assert r.regime == expected.regime
            assert r.alpha == pytest.approx(expected.alpha, rel=1e-6)
            t.send(r)
        assert t.flush(30)
    assert agent.fallbacks == 0
    stored = by_step(gacd.steps("py-remote"))
    assert all(r["mode"] == "CONTROL_MODE_REMOTE" and not r.get("fallback", False) for r in stored.values())
    # The agent's own thresholds would have projected where gacd's skipped.
    assert any(regime_of(r) == "skip" and 0.1 <= abs(float(r["cosine"])) < 0.3  # type: ignore[arg-type]
               for r in stored.values())


def test_set_thresholds_and_its_deprecated_alias(gacd: Gacd) -> None:
    trainer = Trainer(2)
    agent, rc = remote_agent(gacd, "py-thresholds")
    rc.set_thresholds(0.01, 0.1, "exact", reason="python test")  # keeps the run's mode
    local = gac.Controller(0.01, 0.1, "exact")
    for step in range(1, 6):
        trainer.backward(step)
        r = agent.step(step, trainer.params)
        assert not r.fallback, r.remote_error
        expected = local.decide(r.cosine * r.grad_norm * r.ref_norm if r.cosine is not None else 0.0,
                                r.grad_norm**2, r.ref_norm**2, has_reference=step > 1)
        assert r.regime == expected.regime
    with pytest.warns(DeprecationWarning, match=r"set_run_thresholds is deprecated; use set_thresholds .*"
                      r"It will be removed in gac 0\.3\.0\."):
        rc.set_run_thresholds(0.02, 0.2, reason="python test")
    rc.set_thresholds(0.03, 0.3, mode="monitor")


def test_decide_deadline_miss_falls_back_and_is_counted(gacd: Gacd) -> None:
    trainer = Trainer(3)
    agent, rc = remote_agent(gacd, "py-deadline", deadline=0.05)
    trainer.backward(1)
    assert not agent.step(1, trainer.params).fallback
    gacd.pause()  # gacd stops answering: the call runs into its deadline
    try:
        trainer.backward(2)
        r = agent.step(2, trainer.params)
    finally:
        gacd.resume()
    assert r.fallback and r.remote_error is not None and r.remote_error.startswith("DEADLINE_EXCEEDED"), r.remote_error
    assert r.decide_seconds >= 0.05
    assert agent.fallbacks == 1
    local = gac.Controller(0.05, 0.3)
    assert r.regime == local.decide(r.cosine * r.grad_norm * r.ref_norm, r.grad_norm**2, r.ref_norm**2).regime
    with pytest.raises(gac.DeadlineExceededError):
        _decide_while_paused(gacd, rc)
    # Two misses in a row: for max(1 s, 20 deadlines) the controller asks no
    # one and answers UNAVAILABLE at once, a fallback too.
    trainer.backward(3)
    r = agent.step(3, trainer.params)
    assert r.fallback and r.remote_error is not None and "not asked" in r.remote_error, r.remote_error
    assert r.decide_seconds < 0.05
    assert agent.fallbacks == 2
    time.sleep(1.1)
    trainer.backward(4)
    assert not agent.step(4, trainer.params).fallback
    gacd.kill()  # down: fails fast as UNAVAILABLE, also a fallback
    trainer.backward(5)
    r = agent.step(5, trainer.params)
    assert r.fallback and r.remote_error is not None and "UNAVAILABLE" in r.remote_error
    assert agent.fallbacks == 3


def _decide_while_paused(gacd: Gacd, rc: gac.RemoteController) -> gac.Decision:
    gacd.pause()
    try:
        return rc.decide(5, gac.AlignmentStats(0.1, 1.0, 1.0))
    finally:
        gacd.resume()


def test_remote_controller_decides_like_the_controller(gacd: Gacd) -> None:
    rc = gac.RemoteController(gacd.address, "py-decide")
    local = gac.Controller()
    for dot in (0.0, 0.01, 0.1, -0.2, 0.5, float("nan")):
        d = rc.decide(1, gac.AlignmentStats(dot, 1.0, 1.0))
        e = local.decide(dot, 1.0, 1.0)
        assert (d.regime, d.apply_update) == (e.regime, e.apply_update)
        assert d.alpha == pytest.approx(e.alpha, rel=1e-12)


def closed_port() -> int:
    """A loopback port nothing listens on (the OS chose it, then it was closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_address_list_moves_past_a_gacd_that_is_down(gacd: Gacd, tmp_path: Path) -> None:
    addresses = f"127.0.0.1:{closed_port()}, {gacd.address}"
    trainer = Trainer(4)
    rc = gac.RemoteController(addresses, "py-list", deadline=5.0)
    agent = gac.Agent(0.05, 0.3, mode="remote", decision_source=rc)
    with gac.Telemetry(addresses, "py-list", spool_dir=tmp_path / "spool") as t:
        for step in range(1, 51):
            trainer.backward(step)
            r = agent.step(step, trainer.params)
            assert not r.fallback, r.remote_error
            assert t.send(r)
        assert t.flush(60), t.last_error
        assert t.address == gacd.address
        c = t.counters
        assert c.failovers >= 1 and c.records_acknowledged == 50
        assert c.to_dict()["failovers"] == c.failovers
    assert agent.fallbacks == 0
    assert sorted(by_step(gacd.steps("py-list"))) == list(range(1, 51))
