"""The rules of examples/grpo/exp2_losses.py (the second registered
experiment's part A) on synthetic runs whose answers are known by
construction: the per-run lag statistics and endpoints, the pairing of
contrasts (missing and failed runs), every verdict branch of family A, Holm
over exactly 22 (A) and 16 (A-lag), the lag-sentence rule, the mechanism
sentences, the P_s / L_s check, and the CLI end to end with its round trip.
The references are computed here by other routes: Student's t by Simpson's
rule on its density, Holm by its definition, Fisher by a closed form, the
lag statistics by hand. Standard library and pytest only."""

import csv
import importlib.util
import math
import os
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))
_spec = importlib.util.spec_from_file_location("gac_grpo_exp2_losses",
                                               SOURCE_DIR / "examples" / "grpo" / "exp2_losses.py")
exp2 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(exp2)

SEEDS = list(range(1001, 1025))
STEPS = 400


# --- independent references ---------------------------------------------------------------------------

def t_density(x, df):
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    return c * (1 + x * x / df) ** (-(df + 1) / 2)


def t_mass(t, df, intervals=4000):
    """P(0 < T < t) by Simpson's rule."""
    h = t / intervals
    total = t_density(0.0, df) + t_density(t, df)
    total += sum((4 if i % 2 else 2) * t_density(i * h, df) for i in range(1, intervals))
    return total * h / 3


def t_two_sided_p(t, df):
    return 1.0 - 2.0 * t_mass(abs(t), df)


def t_975(df):
    lo, hi = 0.0, 20.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 2 * t_mass(mid, df) < 0.95 else (lo, mid)
    return (lo + hi) / 2


def holm_by_definition(ps):
    """adjusted p_i = min(1, max over p_j <= p_i (ties by order) of (m - rank_j) p_j)."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: (ps[i], i))
    rank = {i: r for r, i in enumerate(order)}
    return [min(1.0, max((m - rank[j]) * ps[j] for j in range(m) if rank[j] <= rank[i])) for i in range(m)]


def alternating(c, n=24):
    return [c if i % 2 == 0 else -c for i in range(n)]


def diffs_with_p(target, n=24):
    """Differences mu + (+-1 alternating) whose two-sided paired t p is `target` (Simpson reference)."""
    e = alternating(1.0, n)
    sdv = math.sqrt(n / (n - 1))
    lo, hi = 0.0, 5.0
    for _ in range(80):
        mu = (lo + hi) / 2
        p = t_two_sided_p(mu / (sdv / math.sqrt(n)), n - 1)
        lo, hi = (mu, hi) if p > target else (lo, mu)
    mu = (lo + hi) / 2
    return [mu + x for x in e]


# --- synthetic rows and runs --------------------------------------------------------------------------

def make_row(arm, s, seed, endpoint, **kw):
    r = {k: None for k in exp2.ROW_KEYS}
    r.update(arm=arm, staleness=s, seed=seed, status="finished", endpoint=endpoint, outcome="learned",
             skip_rate=0.1, project_rate=0.2, lag_mean=10.0, near_fresh=0.3)
    r.update(kw)
    return r


def rows_from(endpoints, **extra):
    """endpoints: {(arm, s): [24 values]}; extra: {key: {(arm, s): [24 values]}}."""
    rows = []
    for (arm, s), values in endpoints.items():
        for i, seed in enumerate(SEEDS):
            kw = {k: table[(arm, s)][i] for k, table in extra.items() if (arm, s) in table}
            rows.append(make_row(arm, s, seed, values[i], **kw))
    return rows


def add(xs, *others):
    return [sum(v) for v in zip(xs, *others)]


def const(c):
    return [c] * 24


def write_run(runs_dir, arm, s, seed, accs=None, start=0.4, lag=lambda t: 8, stepped=lambda t: 1,
              regime=None, drift=lambda t: 0.1, kl=lambda t: 0.01, finished=True, steps=STEPS):
    """RUNS/<arm>_s<s>_seed<seed>.csv (the trainer's columns that part A reads) and its .log."""
    accs = accs if accs is not None else [0.45 + 0.01 * i for i in range(steps // 20)]
    regime = regime or (lambda t: "safe" if stepped(t) else "skip")
    name = f"{arm}_s{s}_seed{seed}"
    lines = ["step,heldout_acc,sampler_kl,regime,stepped,lag_updates,drift"]
    for t in range(1, steps + 1):
        acc = f"{accs[t // 20 - 1]:.4f}" if t % 20 == 0 else ""
        lines.append(f"{t},{acc},{kl(t):.6f},{regime(t)},{stepped(t)},{lag(t)},{drift(t):.6f}")
    Path(runs_dir, name + ".csv").write_text("\n".join(lines) + "\n")
    log = (f"supervised warm-up: 600 steps, cross-entropy 1.2345, held-out accuracy {start:.4f}\n"
           f"gac_grpo: run {name}, 45856 parameters\n")
    if finished:
        log += f"summary: run={name} heldout_acc={accs[-1]:.4f} cpu_s=9.5\n"
    Path(runs_dir, name + ".log").write_text(log)


# --- per run -------------------------------------------------------------------------------------------

# 50 lags after step 50: 5 x 4, 5 x 5, 10 x 8, 5 x 9, 5 x 12, 5 x 15, 15 x 16 (sorted); steps 1..50 hold 0.
HAND_LAGS = [4] * 5 + [5] * 5 + [8] * 10 + [9] * 5 + [12] * 5 + [15] * 5 + [16] * 15


def test_lag_statistics_on_a_hand_made_series():
    steps = list(range(1, 101))
    lags = [0] * 50 + HAND_LAGS
    got = exp2.lag_statistics(steps, lags, 16)
    assert got["lag_n"] == 50
    assert got["lag_mean"] == pytest.approx(545 / 50)
    assert got["lag_min"] == 4                       # the zeros of steps <= 50 are not counted
    assert got["lag_q10"] == pytest.approx(4.9)      # position 0.1 * 49 = 4.9: 4 + 0.9 (5 - 4)
    assert got["near_fresh"] == pytest.approx(20 / 50)
    assert [got[k] for k in exp2.BIN_KEYS] == [5, 15, 10, 5, 15]   # 8 in (4, 8], 12 in (8, 12], 16 is "= s"
    assert got["lag_above"] == 0
    at32 = exp2.lag_statistics(steps, lags, 32)      # s/4 = 8, s/2 = 16: 4, 5, 8 | 9, 12, 15, 16
    assert [at32[k] for k in exp2.BIN_KEYS] == [20, 30, 0, 0, 0]
    assert at32["near_fresh"] == pytest.approx(1.0)


@pytest.mark.parametrize("s,edges", [(16, [(0, 0), (4, 0), (5, 1), (8, 1), (9, 2), (12, 2), (13, 3), (15, 3),
                                           (16, 4), (17, 5)]),
                                     (32, [(8, 0), (9, 1), (16, 1), (17, 2), (24, 2), (25, 3), (31, 3), (32, 4)])])
def test_lag_bin_edges(s, edges):
    for lag, expected in edges:
        assert exp2.lag_bin(lag, s) == expected, lag


def test_lag_above_s_is_counted_apart():
    got = exp2.lag_statistics([51, 52, 53, 54], [16, 17, 8, 2], 16)
    assert got["lag_above"] == 1
    assert sum(got[k] for k in exp2.BIN_KEYS) == 3
    assert got["near_fresh"] == pytest.approx(2 / 4)   # the denominator keeps every step
    assert got["lag_mean"] == pytest.approx(43 / 4)


COLLAPSING = [0.5, 0.6, 0.7, 0.75, 0.8, 0.8, 0.7, 0.65, 0.6] + [0.3] * 6 + [0.30, 0.31, 0.32, 0.33, 0.34]


def test_run_row_from_files(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    stepped = lambda t: 0 if t % 4 == 0 else 1
    regime = lambda t: "skip" if t % 4 == 0 else "project" if t % 5 == 0 else "safe"
    write_run(runs, "grpo-gacmax", 16, 1001, accs=COLLAPSING, start=0.4, stepped=stepped, regime=regime,
              lag=lambda t: 0 if t <= 50 else 16, drift=lambda t: float(t),
              kl=lambda t: 1.0 if t <= 50 else 0.25 + 0.5 * (t % 2))
    (row,) = exp2.collect(str(tmp_path))
    assert row["status"] == "finished" and row["steps"] == 400 and row["evals"] == 20
    assert row["start"] == pytest.approx(0.4)
    assert row["endpoint"] == pytest.approx(0.32)          # the last five evaluations
    assert row["mean_acc"] == pytest.approx(9.5 / 20)
    assert row["outcome"] == "collapsed" and row["collapse"] == 200   # 0.3 < 0.7 x 0.8 from evaluation 10 on
    assert row["skip_rate"] == pytest.approx(100 / 400)
    assert row["project_rate"] == pytest.approx(60 / 400)  # every 5th step that is not a skip
    assert row["drift"] == pytest.approx(200.5)            # median over every step (not only > 50)
    assert row["sampler_kl"] == pytest.approx(0.5)         # steps > 50 only
    assert (row["lag_mean"], row["lag_min"], row["lag_q10"], row["near_fresh"]) == (16.0, 16, 16.0, 0.0)
    assert [row[k] for k in exp2.BIN_KEYS] == [0, 0, 0, 0, 350]


def test_unfinished_and_missing_runs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    write_run(runs, "grpo", 16, 1001)
    write_run(runs, "grpo", 16, 1002, finished=False)
    Path(runs, "grpo_s16_seed1003.log").write_text("crashed before the CSV\n")
    write_run(runs, "grpo", 0, 101)                       # a calibration run: not part A's
    write_run(runs, "gacwin", 16, 1001)                   # not an arm of the design
    rows = exp2.collect(str(tmp_path))
    assert [(r["seed"], r["status"]) for r in rows] == [(1001, "finished"), (1002, "failed"), (1003, "failed")]
    failed = rows[1]
    assert all(failed[k] is None for k in exp2.ROW_KEYS if k not in ("arm", "staleness", "seed", "status"))
    line = exp2.read_summary(rows)
    assert "3 of 624 runs found, 1 finished" in line and "grpo_s16_seed1002, grpo_s16_seed1003" in line
    assert "missing 621" in line


# --- pairing, Fisher, the paired test -----------------------------------------------------------------

def test_pairing_missing_and_failed_runs():
    rows = [make_row("grpo-gacmax", 16, 1001, 0.60, outcome="collapsed"),
            make_row("grpo-gacmax", 16, 1002, 0.70, outcome="collapsed"),
            make_row("grpo-gacmax", 16, 1003, None, status="failed", outcome=None),
            make_row("grpo-gacmax", 16, 1004, 0.90),
            make_row("grpo", 16, 1001, 0.50), make_row("grpo", 16, 1002, 0.40), make_row("grpo", 16, 1003, 0.45)]
    l1 = next(t for t in exp2.family_a(rows) if t["contrast"] == "L1" and t["s"] == 16)
    assert l1["n"] == 2                                    # 1003: failed; 1004: the reference is missing
    assert l1["mean"] == pytest.approx((0.10 + 0.30) / 2)
    # Collapses over 1001-1003 (both arms have a run): 3 of 3 (the failed one counts) against 0 of 3.
    assert (l1["collapsed_row"], l1["collapsed_reference"], l1["collapse_seeds"]) == (3, 0, 3)
    assert l1["fisher_p"] == pytest.approx(2 / math.comb(6, 3))   # the two extreme tables, each 1/20


def test_paired_statistics_against_independent_references():
    diffs = [0.03 + 0.05 * math.sin(i) for i in range(24)]
    base = [0.5] * 24
    rows = rows_from({("grpo", 16): base, ("grpo-gacmax", 16): add(base, diffs)})
    l1 = next(t for t in exp2.family_a(rows) if t["contrast"] == "L1" and t["s"] == 16)
    m = sum(diffs) / 24
    sdv = math.sqrt(sum((d - m) ** 2 for d in diffs) / 23)
    half = t_975(23) * sdv / math.sqrt(24)
    assert l1["n"] == 24 and l1["mean"] == pytest.approx(m)
    assert l1["low"] == pytest.approx(m - half, abs=1e-9) and l1["high"] == pytest.approx(m + half, abs=1e-9)
    assert l1["p"] == pytest.approx(t_two_sided_p(m / (sdv / math.sqrt(24)), 23), rel=1e-7)


def only_l1_differs(diffs, s=16):
    """Every arm at both s equal to grpo's, except grpo-gacmax at s: only L1 at s has non-zero differences."""
    base = [0.5 + 0.01 * (i % 3) for i in range(24)]
    endpoints = {(arm, ss): list(base) for arm in exp2.ARMS for ss in (16, 32)}
    endpoints[("grpo-gacmax", s)] = add(base, diffs)
    for arm in ("m2po", "bapo", "tis", "m2po-gacmax", "bapo-gacmax", "tis-gacmax"):
        endpoints[(arm, s)] = list(endpoints[("grpo-gacmax", s)])   # L2-L7 differences 0
    return rows_from(endpoints)


@pytest.mark.parametrize("target,expected", [(0.00232, "no effect shown"), (0.00220, "adds")])
def test_holm_over_exactly_22(target, expected):
    # 0.05 / 22 = 0.002273 < 0.00232 < 0.05 / 21 = 0.002381: significant in a family of 21, not of 22.
    fam = exp2.family_a(only_l1_differs(diffs_with_p(target)))
    assert len(fam) == 22
    l1 = next(t for t in fam if t["contrast"] == "L1" and t["s"] == 16)
    assert l1["p"] == pytest.approx(target, rel=1e-6)
    assert l1["p_holm"] == pytest.approx(22 * target, rel=1e-6)
    assert l1["verdict"] == expected
    others = [t for t in fam if t is not l1]
    assert all(t["p"] == 1.0 and t["p_holm"] == 1.0 for t in others)


def test_holm_matches_its_definition_on_a_family():
    ps = [0.001, 0.02, 0.0004, 0.5, 0.02, 0.03]
    tests = [{"p": p} for p in ps] + [{"p": None}]          # an untestable test enters as p = 1
    exp2.adjust(tests)
    expected = holm_by_definition(ps + [1.0])
    assert [t["p_holm"] for t in tests[:-1]] == pytest.approx(expected[:-1])
    assert tests[-1]["p_holm"] is None


# --- every verdict branch -----------------------------------------------------------------------------

def branch_rows():
    """Endpoints built so that every contrast's differences are an offset plus a known pattern."""
    small, big = alternating(0.001), alternating(0.2)
    b = [0.5 + 0.01 * (i % 3) for i in range(24)]
    e = {}
    # s = 16
    e[("grpo", 16)] = b
    e[("grpo-gacmax", 16)] = add(b, const(0.1), small)                      # L1 adds
    e[("m2po", 16)] = add(e[("grpo-gacmax", 16)], const(0.1), small)        # L5 above
    e[("m2po-gacmax", 16)] = add(e[("m2po", 16)], const(-0.1), small)       # L2 harms
    e[("bapo", 16)] = add(e[("grpo-gacmax", 16)], const(-0.1), small)       # L6 below
    e[("bapo-gacmax", 16)] = add(e[("bapo", 16)], small)                    # L3 equivalent
    e[("tis", 16)] = add(e[("grpo-gacmax", 16)], small)                     # L7 matches
    e[("tis-gacmax", 16)] = add(e[("tis", 16)], big)                        # L4 no effect shown
    e[("burst-gacmax", 16)] = add(b, const(0.1), small)                     # M4 holds
    e[("mskip-gacmax", 16)] = add(e[("burst-gacmax", 16)], small)           # M1 does not hold, equivalent
    e[("rskip-gacmax", 16)] = add(e[("burst-gacmax", 16)], const(-0.1), small)  # M2 holds
    e[("bskip-gacmax", 16)] = b
    e[("cskip-gacmax", 16)] = add(b, const(0.1), small)                     # M3 opposite
    # s = 32
    e[("grpo", 32)] = b
    e[("grpo-gacmax", 32)] = add(b, big)                                    # L1 no effect shown
    e[("m2po", 32)] = add(e[("grpo-gacmax", 32)], big)                      # L5 not resolved
    e[("m2po-gacmax", 32)] = add(e[("m2po", 32)], small)                    # L2 equivalent
    e[("bapo", 32)] = add(e[("grpo-gacmax", 32)], small)                    # L6 matches
    e[("bapo-gacmax", 32)] = add(e[("bapo", 32)], const(0.1), small)        # L3 adds
    e[("tis", 32)] = add(e[("grpo-gacmax", 32)], const(-0.1), small)        # L7 below
    e[("tis-gacmax", 32)] = add(e[("tis", 32)], const(-0.1), small)         # L4 harms
    e[("burst-gacmax", 32)] = add(b, big)                                   # M4 does not hold
    e[("mskip-gacmax", 32)] = add(e[("burst-gacmax", 32)], const(0.1), small)  # M1 holds
    e[("rskip-gacmax", 32)] = add(e[("burst-gacmax", 32)], big)             # M2 does not hold
    e[("bskip-gacmax", 32)] = add(b, const(0.1), small)                     # M3 holds
    e[("cskip-gacmax", 32)] = b
    # Lags: M2 at 16, the better arm (burst) has less lag; M3 at 32, the better arm (bskip) more near-fresh
    # steps; M1 at 32, the better arm (mskip) has MORE lag (significant, the wrong direction).
    lag = {k: const(10.0) for k in e}
    fresh = {k: const(0.3) for k in e}
    lag[("burst-gacmax", 16)] = add(const(9.0), small)
    fresh[("bskip-gacmax", 32)] = add(const(0.4), small)
    lag[("mskip-gacmax", 32)] = add(const(11.0), small)
    lag[("burst-gacmax", 32)] = add(const(10.0), big)     # M2/M4 at 32: lag not separated
    skip = {("tis-gacmax", 16): const(0.0)}
    project = {("tis-gacmax", 16): const(0.0)}
    return rows_from(e, lag_mean=lag, near_fresh=fresh, skip_rate=skip, project_rate=project)


EXPECTED_VERDICTS = {
    ("L1", 16): "adds", ("L2", 16): "harms", ("L3", 16): "equivalent within ±0.05", ("L4", 16): "no effect shown",
    ("L5", 16): "the loss is above GAC", ("L6", 16): "the loss is below GAC", ("L7", 16): "matches GAC within ±0.05",
    ("M1", 16): "does not hold, equivalent within ±0.05", ("M2", 16): "holds", ("M3", 16): "opposite",
    ("M4", 16): "holds",
    ("L1", 32): "no effect shown", ("L2", 32): "equivalent within ±0.05", ("L3", 32): "adds", ("L4", 32): "harms",
    ("L5", 32): "not resolved", ("L6", 32): "matches GAC within ±0.05", ("L7", 32): "the loss is below GAC",
    ("M1", 32): "holds", ("M2", 32): "does not hold", ("M3", 32): "holds", ("M4", 32): "does not hold",
}


def test_every_verdict_branch():
    fam = exp2.family_a(branch_rows())
    assert [(t["contrast"], t["s"]) for t in fam] == [(c[0], s) for s in (16, 32) for c in exp2.CONTRASTS]
    assert {(t["contrast"], t["s"]): t["verdict"] for t in fam} == EXPECTED_VERDICTS
    by = {(t["contrast"], t["s"]): t for t in fam}
    assert by[("L4", 16)]["gac_never_acted"] and (by[("L4", 16)]["gac_skip"], by[("L4", 16)]["gac_project"]) == (0, 0)
    assert not by[("L1", 16)]["gac_never_acted"]
    assert by[("L1", 16)]["gac_skip"] == pytest.approx(0.1) and by[("L1", 16)]["gac_project"] == pytest.approx(0.2)
    assert by[("L5", 16)]["gac_skip"] is None             # L5-L7 have no GAC arm of their own


@pytest.mark.parametrize("kind,p,mean,lo,hi,expected", [
    ("gac", 0.049, 0.01, 0.001, 0.02, "adds"),            # significant wins over "inside the margin"
    ("gac", 0.05, 0.01, -0.05, 0.05, "equivalent within ±0.05"),   # Holm p = 0.05 is not < 0.05; ends included
    ("gac", 0.2, 0.01, -0.0501, 0.04, "no effect shown"),
    ("gac", 0.01, -0.2, -0.3, -0.1, "harms"),
    ("loss", 0.049, -0.01, -0.02, -0.001, "the loss is below GAC"),
    ("loss", 0.3, 0.0, -0.04, 0.0501, "not resolved"),
    ("mech", 0.049, -0.1, -0.2, -0.01, "opposite"),
    ("mech", 0.9, 0.0, -0.01, 0.01, "does not hold, equivalent within ±0.05"),
    ("mech", None, None, None, None, "no test (n < 2)"),
])
def test_verdict_edges(kind, p, mean, lo, hi, expected):
    assert exp2.verdict(kind, p, mean, lo, hi) == expected


# --- family A-lag and the lag sentence ----------------------------------------------------------------

def test_family_lag_verdicts_and_the_lag_rule():
    rows = branch_rows()
    fam, lagfam = exp2.family_a(rows), exp2.family_lag(rows)
    assert len(lagfam) == 16
    got = {(t["contrast"], t["s"], t["stat"]): t["verdict"] for t in lagfam}
    assert got[("M2", 16, "lag_mean")] == "row less lag"
    assert got[("M2", 16, "near_fresh")] == "no difference shown"
    assert got[("M3", 32, "near_fresh")] == "row more near-fresh steps"
    assert got[("M1", 32, "lag_mean")] == "row more lag"
    assert got[("M2", 32, "lag_mean")] == "no difference shown"
    assert got[("M4", 16, "lag_mean")] == "row less lag"      # burst (9) against grpo (10), and M4 holds there
    allowed = {(e["contrast"], e["s"]): e["allowed"] for e in exp2.lag_explanations(fam, lagfam)}
    assert allowed == {("M1", 16): [], ("M2", 16): ["lag_mean"], ("M3", 16): [], ("M4", 16): ["lag_mean"],
                       ("M1", 32): [], ("M2", 32): [], ("M3", 32): ["near_fresh"], ("M4", 32): []}


@pytest.mark.parametrize("target,significant", [(0.00320, False), (0.00300, True)])
def test_holm_over_exactly_16(target, significant):
    # 0.05 / 16 = 0.003125 < 0.00320 < 0.05 / 15 = 0.00333.
    d = diffs_with_p(target)
    rows = rows_from({(arm, s): const(0.5) for arm in exp2.ARMS for s in (16, 32)},
                     lag_mean={("burst-gacmax", 16): add(const(10.0), [-x for x in d])})
    lagfam = exp2.family_lag(rows)
    t = next(t for t in lagfam if (t["contrast"], t["s"], t["stat"]) == ("M2", 16, "lag_mean"))
    assert t["p"] == pytest.approx(target, rel=1e-6) and t["p_holm"] == pytest.approx(16 * target, rel=1e-6)
    assert t["verdict"] == ("row less lag" if significant else "no difference shown")


def a_row(contrast, s, verdict, mean=0.1, low=0.05, high=0.15, p_holm=0.01):
    row, ref = next((c[1], c[2]) for c in exp2.CONTRASTS if c[0] == contrast)
    return {"contrast": contrast, "s": s, "row": row, "reference": ref, "kind": "mech", "verdict": verdict,
            "mean": mean, "low": low, "high": high, "p_holm": p_holm}


def lag_row(contrast, s, stat, mean, p_holm):
    return {"contrast": contrast, "s": s, "stat": stat, "label": dict(exp2.LAG_STATS)[stat], "mean": mean,
            "low": mean - 0.1, "high": mean + 0.1, "p_holm": p_holm}


@pytest.mark.parametrize("verdict,lag_mean,near_fresh,allowed,phrase", [
    ("holds", (-1.0, 0.01), (0.0, 0.9), ["lag_mean"], "the lag can explain the difference"),
    ("holds", (0.0, 0.9), (0.05, 0.01), ["near_fresh"], "more near-fresh steps"),
    ("holds", (-1.0, 0.01), (0.05, 0.01), ["lag_mean", "near_fresh"], "less lag and more near-fresh steps"),
    ("holds", (1.0, 0.01), (-0.05, 0.01), [], "in the direction that would explain it"),
    ("holds", (-1.0, 0.06), (0.05, 0.2), [], "the lag does not separate the arms"),
    ("does not hold", (-1.0, 0.01), (0.05, 0.01), [], "the arms' accuracy does not differ"),
    ("opposite", (1.0, 0.01), (-0.05, 0.01), [], "no lag sentence is written"),
])
def test_lag_sentence_rule(verdict, lag_mean, near_fresh, allowed, phrase):
    fam = [a_row("M2", 16, verdict, mean=-0.1 if verdict == "opposite" else 0.1)]
    lagfam = [lag_row("M2", 16, "lag_mean", *lag_mean), lag_row("M2", 16, "near_fresh", *near_fresh)]
    (e,) = exp2.lag_explanations(fam, lagfam)
    assert e["allowed"] == allowed
    assert phrase in e["sentence"]
    assert ("the lag can explain" in e["sentence"]) == bool(allowed)


# --- the mechanism sentences --------------------------------------------------------------------------

def mech_family(verdicts):
    """verdicts: {(contrast, s): verdict}; the rest "does not hold" with a wide interval."""
    out = []
    for s in (16, 32):
        for c in ("M1", "M2", "M3", "M4"):
            v = verdicts.get((c, s), "does not hold")
            lo, hi = (-0.01, 0.02) if "equivalent" in v else (-0.08, 0.12) if v == "does not hold" else (0.05, 0.15)
            out.append(a_row(c, s, v, mean=(lo + hi) / 2, low=lo, high=hi))
    return out


EQ = "does not hold, equivalent within ±0.05"


def test_mechanism_nothing_resolved_gives_the_intervals():
    text = exp2.mechanism_sentences(mech_family({}))
    assert len(text) == 3 and all("not resolved" in t for t in text)
    assert "M1 at s = 16: +0.020 [-0.080, +0.120]" in text[0] and "M1 at s = 32" in text[0]
    assert "M4 at s = 16" in text[1] and "M3 at s = 32" in text[2]


def test_mechanism_timing_names_the_s():
    text = exp2.mechanism_sentences(mech_family({("M1", 32): "holds"}))
    assert text[0].startswith("c_t's timing does work beyond bursts (M1 holds at s = 32;")
    assert "s = 16" not in text[0]


def test_mechanism_bursts_alone_needs_m4_and_m1_equivalent_at_the_same_s():
    text = exp2.mechanism_sentences(mech_family({("M4", 16): "holds", ("M1", 16): EQ}))
    assert text[1].startswith("Bursts alone do the work (M4 holds and M1 is equivalent within ±0.05 at s = 16;")
    assert "not resolved" in text[0]
    # M1 equivalent at the other s only, or merely "does not hold": not written.
    for verdicts in ({("M4", 16): "holds", ("M1", 32): EQ}, {("M4", 16): "holds"},
                     {("M4", 16): "holds", ("M1", 16): "holds"}):
        assert "Whether bursts alone do the work is not resolved" in exp2.mechanism_sentences(mech_family(verdicts))[1]


def test_mechanism_runs_of_skips_names_which_and_where():
    text = exp2.mechanism_sentences(mech_family({("M2", 16): "holds", ("M3", 32): "holds", ("M3", 16): "opposite"}))
    assert text[2].startswith("Runs of skips beat scattered skips (M2 holds at s = 16; M3 holds at s = 32;")
    only = exp2.mechanism_sentences(mech_family({("M3", 16): "holds"}))[2]
    assert only.startswith("Runs of skips beat scattered skips (M3 holds at s = 16;") and "M2" not in only


def test_mechanism_from_the_branch_rows():
    text = exp2.mechanism_sentences(exp2.family_a(branch_rows()))
    assert text[0].startswith("c_t's timing does work beyond bursts (M1 holds at s = 32;")
    assert text[1].startswith("Bursts alone do the work (M4 holds and M1 is equivalent within ±0.05 at s = 16;")
    assert text[2].startswith("Runs of skips beat scattered skips (M2 holds at s = 16; M3 holds at s = 32;")


# --- facts: calibration, P_s and L_s ------------------------------------------------------------------

def test_burst_facts_and_tables(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    write_run(runs, "grpo-gacmax", 16, 1001, stepped=lambda t: 0 if t in (10, 11, 12, 50) else 1)
    write_run(runs, "grpo-gacmax", 16, 1002, stepped=lambda t: 0 if t in (100, 101) else 1)
    write_run(runs, "grpo-gacmax", 16, 1003, stepped=lambda t: 0 if t < 30 else 1, finished=False)
    (tmp_path / "burst_s16.txt").write_text("P=0.007500 runs_of_skips=3 L=1,2,3\n")
    (tmp_path / "burst_s32.txt").write_text("P=0.100000 runs_of_skips=2 L=4,4\n")
    (tmp_path / "calibration.txt").write_text("c_low=0.5865\nc_high=0.95\nc_max=0.87295\nwindow_c_low=0.2929\n"
                                              "seeds=101,102,103\n")
    facts = exp2.collect_facts(str(tmp_path))
    value = lambda name, s="": next(f["value"] for f in facts if f["name"] == name and f["staleness"] == str(s))
    # 6 skipped of 800 steps, runs of 3, 1 and 2 (the unfinished run left out).
    assert (value("runs_n", 16), value("runs_P", 16), value("runs_L", 16)) == ("2", "0.007500", "1,2,3")
    path = tmp_path / "facts.csv"
    exp2.write_facts(facts, str(path))
    assert exp2.read_facts(str(path)) == facts
    tables = exp2.render([], exp2.read_facts(str(path)))
    burst = tables["exp2-a-burst"]
    assert "| 16 | 0.007500 | 3 | 2.000 | 1×1, 2×1, 3×1 | the same (runs: 2) |" in burst
    assert "| 32 | 0.100000 | 2 | 4.000 | 4×2 | no finished grpo-gacmax run |" in burst
    cal = tables["exp2-a-calibration"]
    assert "| c_low | 0.586500 | 0.5863 | yes |" in cal          # 2e-4 > 1e-4
    assert "| c_max | 0.872950 | 0.8729 | no |" in cal           # 5e-5
    (tmp_path / "burst_s16.txt").write_text("P=0.007500 runs_of_skips=3 L=1,1,4\n")
    assert "differs (runs: 2)" in exp2.render([], exp2.collect_facts(str(tmp_path)))["exp2-a-burst"]


# --- the CLI end to end -------------------------------------------------------------------------------

def test_cli_end_to_end_round_trip(tmp_path, capsys):
    root, out = tmp_path / "R", tmp_path / "out"
    runs = root / "runs"
    runs.mkdir(parents=True)
    for s in (16, 32):
        for arm in exp2.ARMS:
            for seed in (1001, 1002, 1003):
                if (arm, s, seed) == ("grpo", 32, 1003):
                    continue                               # missing
                lift = 0.05 * (arm.endswith("gacmax")) + 0.01 * (seed - 1001)
                accs = [min(0.45 + 0.01 * i + lift, 0.95) for i in range(20)]
                write_run(runs, arm, s, seed, accs=accs, finished=(arm, s, seed) != ("grpo-gacmax", 16, 1002),
                          lag=lambda t, s=s: s if t % 3 else s // 4, stepped=lambda t: 0 if t % 7 == 0 else 1)
    (root / "burst_s16.txt").write_text("P=0.142500 runs_of_skips=114 L=1\n")
    (root / "calibration.txt").write_text("c_low=0.5863\nc_max=0.8729\nwindow_c_low=0.2929\n")
    assert exp2.main(["--root", str(root), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "77 of 624 runs found, 76 finished" in printed
    assert "unfinished/failed 1: grpo-gacmax_s16_seed1002;" in printed and "missing 547:" in printed

    rows_path, facts_path = out / "exp2-a-runs.csv", out / "exp2-a-facts.csv"
    rows = exp2.read_rows(str(rows_path))
    assert len(rows) == 77
    again = tmp_path / "again.csv"
    exp2.write_rows(rows, str(again))
    assert again.read_text() == rows_path.read_text()       # the round trip is exact
    assert exp2.read_rows(str(again)) == rows
    with open(rows_path, newline="") as f:
        assert next(csv.reader(f)) == exp2.ROW_KEYS

    md = (out / "exp2-a.md").read_text()
    tables = exp2.render(rows, exp2.read_facts(str(facts_path)))
    assert md == exp2.markdown(tables)
    for name in ("exp2-a-calibration", "exp2-a-burst", "exp2-a-arms", "exp2-a-family", "exp2-a-lag",
                 "exp2-a-lag-family", "exp2-a-mechanism"):
        assert f"## {name}\n" in md and tables[name].endswith("\n")

    by = {(r["arm"], r["staleness"], r["seed"]): r for r in rows}
    r = by[("tis", 32, 1002)]
    assert r["endpoint"] == pytest.approx(sum(0.45 + 0.01 * i + 0.01 for i in range(15, 20)) / 5, abs=1e-6)
    # Steps 51..400: lag s/4 on every third step (117 of 350), s elsewhere.
    assert r["lag_mean"] == pytest.approx((117 * 8 + 233 * 32) / 350, rel=1e-5)
    assert (r["lag_min"], r["lag_bin1"], r["lag_bin5"]) == (8, 117, 233)
    assert r["near_fresh"] == pytest.approx(117 / 350, rel=1e-5)
    assert r["skip_rate"] == pytest.approx(57 / 400, rel=1e-5)
    assert by[("grpo-gacmax", 16, 1002)]["status"] == "failed"
    fam = {(t["contrast"], t["s"]): t for t in exp2.family_a(rows)}
    assert fam[("L1", 16)]["n"] == 2 and fam[("L1", 32)]["n"] == 2 and fam[("L2", 16)]["n"] == 3
    assert fam[("L1", 16)]["collapse_seeds"] == 3 and fam[("L1", 16)]["collapsed_row"] == 1
    assert "| 16 | grpo-gacmax | 2 / 1 |" in tables["exp2-a-arms"]
    assert "grpo-gacmax_s16_seed1002" in tables["exp2-a-arms"]
