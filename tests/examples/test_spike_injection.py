"""gac_grpo's injected gradient spikes relative to the recent norm
(--inject-relative W): an injected step's gradient norm is --inject-scale
times the mean raw norm of the last W steps that were not injected, and the
CSV says the factor used.

Environment: GAC_GRPO (the gac_grpo binary); skipped without it.
"""

import csv
import functools
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))


def run(tmp_path, *flags):
    binary = os.environ.get("GAC_GRPO")
    if not binary:
        pytest.skip("GAC_GRPO is not set")
    path = tmp_path / "run.csv"
    subprocess.run([binary, "--smoke", "--agent", "monitor", "--clip-grad", "1e9", "--inject-after", "3",
                    "--csv", str(path), *flags], check=True, capture_output=True)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == trainer_columns()
    return rows


@functools.lru_cache(maxsize=None)
def trainer_columns():
    """analyze.TRAINER_COLUMNS, which the analysis tests write synthetic runs with."""
    spec = importlib.util.spec_from_file_location("gac_grpo_analyze", SOURCE_DIR / "examples" / "grpo" / "analyze.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TRAINER_COLUMNS


@pytest.mark.parametrize("scale, window", [(5.0, 2), (2.0, 4), (30.0, 100)])
def test_an_injected_norm_is_the_scale_times_the_recent_mean(tmp_path, scale, window):
    rows = run(tmp_path, "--inject-spikes", "0.9", "--inject-scale", str(scale), "--inject-relative", str(window))
    clean = []  # raw norms of the steps not injected, in order
    injected = 0
    for row in rows:
        norm = float(row["grad_norm"])
        if row["injected"] == "1":
            injected += 1
            recent = clean[-window:]
            want = scale * sum(recent) / len(recent)
            assert abs(norm - want) <= 1e-5 * want, (row["step"], norm, want)
            # The factor applied to the step's own raw norm (not in the CSV; a batch
            # whose rewards are all equal has almost none, so the factor may be large).
            assert 0 < float(row["inject_factor"]) < float("inf")
        else:
            assert row["inject_factor"] == ""
            clean.append(norm)
    assert injected >= 2 and len(clean) >= 3


def test_without_a_window_the_factor_is_the_scale(tmp_path):
    rows = run(tmp_path, "--inject-spikes", "0.9", "--inject-scale", "7")
    factors = {row["inject_factor"] for row in rows if row["injected"] == "1"}
    assert factors == {"7"}
