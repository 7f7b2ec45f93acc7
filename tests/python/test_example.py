"""examples/python/grpo.py in a short form, in local and remote mode, every
step streamed to a real gacd: it runs, gacd stores each step once with the
trainer's scalars, and in remote mode gacd made every decision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict

import pytest

from conftest import SOURCE_DIR, Gacd

EXAMPLE = SOURCE_DIR / "examples" / "python" / "grpo.py"
SHORT = ["--steps", "24", "--sft-steps", "20", "--staleness", "4", "--prompts", "8", "--group", "4",
         "--hidden", "32", "--every", "8", "--json"]


def run_example(*args: str) -> Dict[str, Any]:
    out = subprocess.run([sys.executable, str(EXAMPLE), *SHORT, *args], capture_output=True, text=True,
                         timeout=600, env=os.environ)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("grpo.py: run ")
    assert any(line.startswith("step     8") for line in lines)
    summary: Dict[str, Any] = json.loads(lines[-1])
    return summary


@pytest.mark.parametrize("mode", ["local", "remote"])
def test_example_streams_every_step(gacd: Gacd, mode: str) -> None:
    run = f"py-example-{mode}"
    # A deadline no load on a shared test machine reaches: the test is that
    # gacd made every decision (a miss is test_remote's subject).
    summary = run_example("--mode", mode, "--gacd", gacd.address, "--run", run, "--deadline", "10")
    assert summary["run"] == run and summary["steps"] == 24 and summary["fallbacks"] == 0, summary
    assert sum(summary["regimes"].values()) == 24
    t = summary["telemetry"]
    assert t["records_acknowledged"] == t["enqueued"] == 24 and t["dropped_queue_full"] == 0, t
    stored = gacd.steps(run)
    assert sorted(int(r["step"]) for r in stored) == list(range(1, 25))
    for r in stored:
        assert r["mode"] == f"CONTROL_MODE_{mode.upper()}"
        assert not r.get("fallback", False)
        assert {"reward", "loss", "kl", "entropy"} <= set(r["scalars"])
        assert 0.0 <= r["scalars"]["reward"] <= 1.0
        assert int(r.get("staleness", 0)) == min(int(r["step"]) - 1, 4)
        # The batch's policy-health signals, as the record's own fields.
        assert int(r["policy_tokens"]) == 8 * 4 * 3 and r["policy_invalid"] is False
        assert 0.0 < float(r["ess_token"]) <= 1.0 and 0.0 < float(r["ess_sequence"]) <= 1.0
        assert float(r["kl_k3"]) >= 0.0 and float(r["entropy_mean"]) > 0.0
        assert 0.0 <= float(r["clip_fraction_low"]) + float(r["clip_fraction_high"]) <= 1.0
        assert float(r["staleness_min"]) == float(r["staleness_max"]) == min(int(r["step"]) - 1, 4)
    # Stale steps move the learner away from the sampler: some ratio is off 1.
    assert any(float(r["ess_token"]) < 1.0 for r in stored)


def test_example_without_gacd() -> None:
    summary = run_example("--mode", "monitor")
    assert "telemetry" not in summary and set(summary["regimes"]) <= {"safe", "project", "skip"}
