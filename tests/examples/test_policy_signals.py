"""The example trainer's policy-health signals (examples/grpo/policy_signals.h)
against the Python package's, python/gac/rl.py's ``signals``, on the same
tensors (gac_grpo_signals reads them from stdin); and gac_grpo --smoke's CSV
columns for each loss.

Environment: GAC_GRPO (the gac_grpo binary), GAC_GRPO_SIGNALS (the
gac_grpo_signals binary); the comparison with gac.rl needs torch and the
package (PYTHONPATH, the staged build/python) and skips without them.
"""

import csv
import math
import os
import random
import subprocess

import pytest

NAMES = ["ess_token", "ess_sequence", "clip_fraction_low", "clip_fraction_high", "truncation_fraction",
         "log_ratio_max", "log_ratio_p99", "log_ratio_p1", "kl_k3", "log_ratio_abs_mean", "entropy_mean",
         "staleness_min", "staleness_mean", "staleness_max"]


def binary(var):
    path = os.environ.get(var)
    if not path or not os.path.exists(path):
        pytest.skip(f"{var} is not set to a built binary")
    return path


def values_text(tensor):
    return " ".join(repr(float(x)) for x in tensor.double().reshape(-1).tolist())


def cpp_signals(tool, case):
    """gac_grpo_signals' numbers for one case: {name: float or None}, tokens, invalid."""
    lp, old = case["logprobs"], case["old_logprobs"]
    dtype = {"torch.float64": "float64", "torch.float32": "float32", "torch.bfloat16": "bfloat16"}[str(lp.dtype)]
    parts = [f"shape {lp.shape[0]} {lp.shape[1]}", f"logprobs {dtype} {values_text(lp)}",
             f"old_logprobs {dtype} {values_text(old)}"]
    for key in ("mask", "entropies"):
        if case.get(key) is not None:
            parts.append(f"{key} {values_text(case[key])}")
    if case.get("advantages") is not None:
        parts.append(f"advantages {case['advantages'].numel()} {values_text(case['advantages'])}")
    if case.get("versions") is not None:
        parts.append(f"versions {' '.join(str(int(v)) for v in case['versions'])}")
        parts.append(f"current_version {case['current_version']}")
    for key in ("clip_low", "clip_high", "truncation"):
        if case.get(key) is not None:
            parts.append(f"{key} {case[key]!r}")
    parts.append("end\n")
    p = subprocess.run([tool], input="\n".join(parts), capture_output=True, text=True, check=True)
    out = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    signals = {k: None if out[k] == "none" else float(out[k]) for k in NAMES}
    return signals, int(out["tokens"]), out["invalid"] == "1"


def random_case(torch, seed, rows, cols, dtype):
    """A masked batch: padding (mask 0) holding NaN, sequence 1 all padding,
    log-ratios mostly small with some at +-30, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    lp = -8.0 * torch.rand(rows, cols, generator=g, dtype=torch.float64)
    u = torch.rand(rows, cols, generator=g, dtype=torch.float64)
    ratio = torch.where(u < 0.03, 30.0, torch.where(u < 0.06, -30.0,
                                                    0.3 * torch.randn(rows, cols, generator=g, dtype=torch.float64)))
    old = lp - ratio
    mask = (torch.rand(rows, cols, generator=g) > 0.25).double()
    mask[1] = 0.0
    mask[0, 0] = 1.0
    adv = 3.0 * torch.randn(rows, cols, generator=g, dtype=torch.float64)
    ent = 2.0 * torch.rand(rows, cols, generator=g, dtype=torch.float64)
    lp, old = lp.to(dtype), old.to(dtype)
    for t in (lp, old, adv, ent):
        t[mask == 0] = math.nan
    return {"logprobs": lp, "old_logprobs": old, "mask": mask, "advantages": adv, "entropies": ent,
            "versions": [10 - (i % 4) for i in range(rows)], "current_version": 10,
            "clip_low": 0.2, "clip_high": 0.28, "truncation": 2.0}


def cases(torch):
    out = {}
    for seed, (rows, cols) in enumerate([(5, 7), (3, 1), (40, 40), (16, 64)]):
        out[f"fp64 {rows}x{cols}"] = random_case(torch, seed, rows, cols, torch.float64)
    out["bf16 16x12"] = random_case(torch, 7, 16, 12, torch.bfloat16)
    c = random_case(torch, 8, 12, 10, torch.float64)
    c["advantages"] = torch.linspace(-1.0, 1.0, 12, dtype=torch.float64)
    c["clip_low"] = None
    out["advantages per sequence, no low side"] = c
    c = random_case(torch, 9, 12, 10, torch.float64)
    for key in ("advantages", "entropies", "versions", "truncation"):
        c[key] = None
    out["bare"] = c
    c = random_case(torch, 10, 6, 5, torch.float64)
    c["logprobs"][0, 0] = math.nan
    out["NaN at a masked token"] = c
    c = random_case(torch, 11, 6, 5, torch.float64)
    c["mask"] = torch.zeros(6, 5, dtype=torch.float64)
    out["empty mask"] = c
    c = random_case(torch, 12, 2, 4, torch.float64)
    c["logprobs"][0, 0] = c["old_logprobs"][0, 0] + 800.0
    out["log-ratio 800"] = c
    return out


def test_the_trainers_signals_equal_gac_rl_on_the_same_tensors():
    torch = pytest.importorskip("torch")
    rl = pytest.importorskip("gac.rl")
    tool = binary("GAC_GRPO_SIGNALS")
    for name, case in cases(torch).items():
        versions = case.get("versions")
        want = rl.signals(case["logprobs"], case["old_logprobs"], case.get("mask"),
                          advantages=case.get("advantages"), clip_low=case.get("clip_low"),
                          clip_high=case.get("clip_high"), truncation=case.get("truncation"),
                          entropies=case.get("entropies"), versions=versions,
                          current_version=case["current_version"] if versions is not None else None)
        got, tokens, invalid = cpp_signals(tool, case)
        assert tokens == want.tokens, name
        assert invalid == (want.invalid is not None), (name, want.invalid)
        for key in NAMES:
            w, g = getattr(want, key), got[key]
            assert (w is None) == (g is None), (name, key, g, w)
            if w is not None:
                assert math.isfinite(g), (name, key, g)
                assert abs(g - w) <= 1e-12 * max(abs(g), abs(w)), (name, key, g, w)


@pytest.mark.parametrize("loss", ["grpo", "bapo", "m2po", "is", "tis"])
def test_smoke_run_writes_the_policy_columns(tmp_path, loss):
    path = tmp_path / "run.csv"
    subprocess.run([binary("GAC_GRPO"), "--smoke", "--loss", loss, "--csv", str(path)], check=True,
                   capture_output=True)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames[-len(NAMES):] == NAMES  # appended after the older columns
        rows = list(reader)
    assert len(rows) == 8
    clipped = loss in ("grpo", "bapo")
    for row in rows:
        v = {k: float(row[k]) if row[k] else None for k in NAMES}
        assert all(x is None or math.isfinite(x) for x in v.values()), row
        # 4 prompts x 4 samples x 3 tokens: the ESS is in [1/n, 1].
        assert 1 / 48 - 1e-6 <= v["ess_token"] <= 1 + 1e-6 and 1 / 16 - 1e-6 <= v["ess_sequence"] <= 1 + 1e-6
        assert (v["clip_fraction_low"] is not None) == clipped and (v["clip_fraction_high"] is not None) == clipped
        assert (v["truncation_fraction"] is not None) == (loss == "tis")
        for key in ("clip_fraction_low", "clip_fraction_high", "truncation_fraction"):
            assert v[key] is None or 0 <= v[key] <= 1
        assert v["log_ratio_p1"] <= v["log_ratio_p99"] <= v["log_ratio_max"]
        assert v["kl_k3"] >= 0 and v["log_ratio_abs_mean"] >= 0
        assert 0 <= v["entropy_mean"] <= math.log(10) + 1e-5  # 10 digits
        # One behaviour version per batch: the lag in applied updates (--staleness 2 in --smoke).
        assert v["staleness_min"] == v["staleness_mean"] == v["staleness_max"] == float(row["lag_updates"])
    assert float(rows[0]["staleness_max"]) == 0 and max(float(r["staleness_max"]) for r in rows) == 2
