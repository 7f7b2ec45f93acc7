"""The rules of examples/grpo/exp2_jumps.py (part B of the second registered
design: detectors on runs whose staleness jumps) on hand-made series and
small synthetic runs: the signals (10-step mean, entropy's relative change,
the gradient-norm z-score), the own and shipped alarm conditions, rising
edges counted from step 101, the for: counts from step 21, the detection
window (J, J + 100], false-alarm counting, family B's McNemar and
permutation tests with Holm and "too few collapses", the jump table, and
the CLI end to end. Every expected value is computed here by another route
(by hand, a closed form, or a direct computation). Standard library and
pytest only."""

import csv
import importlib.util
import math
import os
import random
import statistics
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))
_spec = importlib.util.spec_from_file_location("gac_grpo_exp2_jumps",
                                               SOURCE_DIR / "examples" / "grpo" / "exp2_jumps.py")
jumps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jumps)

STEPS = 660
# The design's table, copied from docs/RESULTS.md ("The jump step J").
REGISTERED = {2001: 168, 2002: 113, 2003: 231, 2004: 223, 2005: 194, 2006: 204, 2007: 108, 2008: 135,
              2009: 140, 2010: 205, 2011: 146, 2012: 188, 2013: 212, 2014: 100, 2015: 108, 2016: 239,
              2017: 199, 2018: 212, 2019: 102, 2020: 160, 2021: 117, 2022: 140, 2023: 143, 2024: 223}
CAL = {"c_low": 0.5, "c_max": 0.8, "window_c_low": 0.3}


def flat_columns(n=STEPS, **overrides):
    """Per-step columns (COLUMNS) of a quiet run; overrides: name -> function of the step."""
    base = {"cosine": lambda t: 0.1, "window_mean": lambda t: 0.05, "ess_token": lambda t: 0.99,
            "clip_fraction_low": lambda t: 0.0, "clip_fraction_high": lambda t: 0.01,
            "kl_k3": lambda t: 0.0005, "entropy_mean": lambda t: 0.5, "grad_norm": lambda t: 1.0 + 0.01 * (t % 7),
            "sampler_kl": lambda t: 0.001, "ess_sequence": lambda t: 0.98, "log_ratio_p99": lambda t: 0.2,
            "staleness_max": lambda t: 2.0}
    base.update(overrides)
    return {name: [f(t) for t in range(1, n + 1)] for name, f in base.items()}


def holds_at(cond):
    return [i + 1 for i, c in enumerate(cond) if c]


# --- signals -------------------------------------------------------------------------------

def test_ten_step_mean_uses_the_steps_present_at_the_start_and_skips_empty_cells():
    values = [float(t) for t in range(1, 16)]
    values[11] = None  # step 12 empty
    out = jumps.ten_step_mean(values)
    assert out[0] == 1.0                                # step 1: itself
    assert out[2] == pytest.approx((1 + 2 + 3) / 3)     # step 3: steps 1-3
    assert out[9] == pytest.approx(5.5)                 # step 10: steps 1-10
    assert out[10] == pytest.approx(6.5)                # step 11: steps 2-11 (step 1 has left)
    assert out[11] == pytest.approx(sum(range(3, 12)) / 9)        # step 12: 3-11, its own cell empty
    assert out[12] == pytest.approx((sum(range(4, 12)) + 13) / 9)  # step 13: 4-13 without 12
    assert jumps.ten_step_mean([None, None, 2.0])[:2] == [None, None]


def test_entropy_is_the_relative_change_from_the_columns_mean_over_steps_51_to_100():
    h = [0.4 if t <= 50 else 0.5 if t <= 100 else 0.6 for t in range(1, 201)]
    out = jumps.relative_entropy(h)
    # H = 0.5 (steps 51-100 only; steps 1-50 would give 0.45, the 10-step means over 51-100 about 0.4955)
    assert out[104] == pytest.approx(abs((5 * 0.5 + 5 * 0.6) / 10 - 0.5) / 0.5)  # step 105: 0.1
    assert out[119] == pytest.approx(0.2)                                     # step 120: all 0.6
    assert out[54] == pytest.approx(abs((5 * 0.4 + 5 * 0.5) / 10 - 0.5) / 0.5)  # step 55: 0.1
    assert out[79] == pytest.approx(0.0)


def test_gradz_is_olmo_cores_z_score_over_the_previous_128_steps_from_step_65():
    rng = random.Random(7)
    g = [1.0 + rng.random() for _ in range(300)]
    z = jumps.gradz(g)
    assert z[:64] == [None] * 64  # steps 1-64: fewer than 64 values held before them

    def reference(t):  # step t, previous min(t - 1, 128) values, sample sd
        prev = g[max(0, t - 1 - 128):t - 1]
        return (g[t - 1] - statistics.mean(prev)) / statistics.stdev(prev)

    for t in (65, 66, 100, 128, 129, 130, 131, 200, 300):
        assert z[t - 1] == pytest.approx(reference(t), rel=1e-9)
    # step 129 sees steps 1-128, step 130 steps 2-129 (the window slides, it does not grow)
    prev = g[1:129]
    assert z[129] == pytest.approx((g[129] - statistics.mean(prev)) / statistics.stdev(prev), rel=1e-9)
    population = statistics.pstdev(g[:64])
    assert z[64] != pytest.approx((g[64] - statistics.mean(g[:64])) / population, rel=1e-6)


def test_gradz_of_a_constant_history_is_undefined():
    assert jumps.gradz([1.0] * 80)[64:] == [None] * 16


# --- the own rule -----------------------------------------------------------------------------

def early_series():
    """Steps 51-100 alternate 1 and 3 (mean 2, sample sd sqrt(50/49)); a huge value at step 45 lies
    outside the early window; elsewhere 2."""
    s = [2.0] * STEPS
    for t in range(51, 101):
        s[t - 1] = 1.0 if t % 2 else 3.0
    s[44] = 1000.0
    return s


def test_own_rule_takes_mean_and_3_sample_sd_from_steps_51_to_100():
    sigma = math.sqrt(50 / 49)
    s = early_series()
    s[149] = 2.0 + 2.5 * sigma    # step 150: above 2 sd, below 3
    s[199] = 2.0 + 3.05 * sigma   # step 200: above 3 sd
    s[249] = 2.0 + 2.1 * sigma    # step 250: a 2 sd rule would fire here
    s[299] = 2.0 - 3.05 * sigma   # step 300: 3 sd below
    assert holds_at(jumps.own_condition(s, "up")) == [200]
    assert holds_at(jumps.own_condition(s, "down")) == [300]


def test_own_rule_holds_nowhere_before_step_101_and_needs_two_early_values():
    s = early_series()
    s[89] = 50.0  # step 90, inside the early window: raises mu and sigma, never a condition itself
    assert not any(jumps.own_condition(s, "up")[:100])
    sparse = [None] * STEPS
    sparse[60] = 1.0
    sparse[300] = 99.0
    assert not any(jumps.own_condition(sparse, "up"))


def test_gradz_own_condition_is_z_above_6_from_step_101():
    g = [1.0 + 0.01 * (t % 5) for t in range(1, STEPS + 1)]
    g[89] = 50.0   # step 90: a spike before alarms count
    g[399] = 50.0  # step 400
    cols = flat_columns(grad_norm=lambda t: g[t - 1])
    cond = jumps.conditions(cols, jumps.signals(cols), CAL)
    assert holds_at(cond[("gradz", "own")]) == [400]
    assert 90 in holds_at(cond[("gradz", "shipped")])  # the shipped z > 6 has no step bar of its own...
    assert jumps.alarm_steps(cond[("gradz", "shipped")]) == [400]  # ...but alarms count from 101


# --- alarms: rising edges from step 101 ---------------------------------------------------------

def test_alarms_are_rising_edges_counted_from_step_101():
    held = set(range(50, 61)) | set(range(90, 121)) | set(range(150, 301)) | {302}
    cond = [t in held for t in range(1, STEPS + 1)]
    assert jumps.alarm_steps(cond) == [101, 150, 302]   # holding at 101 is an alarm there; 50-60 never
    only_100 = [t == 100 for t in range(1, STEPS + 1)]
    assert jumps.alarm_steps(only_100) == []
    always = [True] * STEPS
    assert jumps.alarm_steps(always) == [101]            # a condition that holds throughout: one alarm


# --- the shipped rules' for: counts --------------------------------------------------------------

def test_for_counts_start_at_step_21_and_fire_at_the_nth_consecutive_step():
    raw = [True] * STEPS
    assert holds_at(jumps.held_for(raw, 10))[0] == 30    # steps 21..30
    assert holds_at(jumps.held_for(raw, 25))[0] == 45    # steps 21..45
    ten = [200 <= t <= 209 for t in range(1, STEPS + 1)]
    nine = [200 <= t <= 208 for t in range(1, STEPS + 1)]
    assert holds_at(jumps.held_for(ten, 10)) == [209]
    assert holds_at(jumps.held_for(nine, 10)) == []


def test_shipped_rules_thresholds_medians_and_durations():
    cols = flat_columns(
        # kl_k3: early median 0.0002, so 4x = 0.0008 sits under the 0.001 floor: 0.0009 never counts
        kl_k3=lambda t: 0.0002 if t <= 20 else 0.0009 if 200 <= t < 260 else 0.002 if 300 <= t < 310 else 0.0001,
        ess_token=lambda t: 0.49 if 400 <= t < 410 else 0.5 if 450 <= t < 470 else 1.0,  # median 1: below 0.5
        clip_fraction_low=lambda t: 0.1 if 500 <= t < 510 else 0.0,
        clip_fraction_high=lambda t: 0.11 if 500 <= t < 510 else 0.1 if 520 <= t < 540 else 0.0,
        window_mean=lambda t: -0.31 if 150 <= t < 175 else 0.31 if 180 <= t < 204 else 0.0,
        cosine=lambda t: 0.8 if t == 600 else -0.79 if t == 610 else 0.1)
    cond = jumps.conditions(cols, jumps.signals(cols), CAL)
    assert holds_at(cond[("kl3", "shipped")]) == [309]
    assert holds_at(cond[("ess", "shipped")]) == [409]        # 0.5 is not below 0.5 x 1
    assert holds_at(cond[("clip", "shipped")]) == [509]       # 0.21 > 0.2; 0.1 never
    assert holds_at(cond[("m", "shipped")]) == [174]          # 25 steps of |m| > 0.3; the later 24 never
    assert holds_at(cond[("c", "shipped")]) == [600]          # |c| >= c_max, at c_max exactly
    assert "entropy" not in [s for s, r in jumps.RULES if r == "shipped"]


def test_shipped_early_median_is_over_steps_1_to_20():
    # steps 1-10 at 0.001, 11-20 at 0.003: median 0.002 (steps 2-21 would give 0.003), so 0.01 at 300-309
    # is above 4 x the median (0.008) and would not be above 4 x 0.003
    cols = flat_columns(kl_k3=lambda t: 0.001 if t <= 10 else 0.01 if 300 <= t < 310 else 0.003)
    cond = jumps.conditions(cols, jumps.signals(cols), CAL)
    assert holds_at(cond[("kl3", "shipped")]) == [309]


def test_shipped_c10_is_the_level_rule_on_the_10_step_mean():
    cols = flat_columns(cosine=lambda t: -1.0 if 300 <= t < 306 else 0.05)
    cond = jumps.conditions(cols, jumps.signals(cols), CAL)
    # 10-step mean of |c| with k steps of 1 and 10 - k of 0.05: (0.5 + 0.95 k) / 10 > 0.5 from k = 5 (0.525;
    # k = 4 gives 0.43); k >= 5 at steps 304-310
    assert holds_at(cond[("c10", "shipped")]) == list(range(304, 311))


# --- detection window and the per-run counts --------------------------------------------------

def test_detection_window_excludes_j_and_includes_j_plus_100():
    j = 150

    def fields(*steps):
        return jumps.run_fields([t in steps for t in range(1, STEPS + 1)], j)

    assert fields(150)["det"] is None
    assert fields(250)["det"] == 250
    assert fields(251)["det"] is None
    assert fields(151)["det"] == 151
    assert fields(140, 141, 142, 143, 144, 145, 146, 147, 148, 149, 150, 151, 152)["det"] == 151  # a level
    assert fields(150)["pre"] == 1 and fields(150)["after"] is None
    assert fields(251)["after"] == 251


def test_the_separation_statistic_is_the_mean_over_j_plus_41_to_j_plus_140():
    sig = {name: [float(t) for t in range(1, STEPS + 1)] for name in jumps.OWN}
    sig["kl3"][150 + 41 - 1] = None   # an empty step leaves the mean of the others
    means = jumps.window_means(sig, 150)
    assert means["mean_c10"] == pytest.approx((191 + 290) / 2)
    assert means["mean_kl3"] == pytest.approx((sum(range(191, 291)) - 191) / 99)


def test_false_alarm_counts_and_rate():
    held = set(range(101, 106)) | {200, 201, 300}
    f = jumps.run_fields([t in held for t in range(1, STEPS + 1)], 250)
    assert (f["alarms"], f["pre"], f["after"]) == (3, 2, 300)   # alarms 101, 200, 300; before J: 101, 200
    rows = [dict(cell="nojump", status="finished", steps=STEPS, jump_at=168, alarms_kl3_own=a, pre_kl3_own=0)
            for a in (3, 0, 1)]
    rows += [dict(cell="jump16", status="finished", steps=STEPS, jump_at=j, alarms_kl3_own=9, pre_kl3_own=p)
             for j, p in ((100, 0), (150, 2), (200, 1))]
    units = jumps.false_alarm_units(rows, "nojump", "kl3", "own")
    assert units == [(3, 560), (0, 560), (1, 560)]
    assert jumps.alarm_rate(units) == pytest.approx(1000 * 4 / 1680)
    pre = jumps.false_alarm_units(rows, "jump16", "kl3", "own")
    assert pre == [(2, 50), (1, 100)]   # J = 100 has no step 101..J
    assert jumps.alarm_rate(pre) == pytest.approx(1000 * 3 / 150)


# --- family B ---------------------------------------------------------------------------------

def blank_row(cell, seed, **values):
    row = {k: None for k in jumps.ROW_KEYS}
    row.update(cell=cell, seed=seed, jump_at=REGISTERED[seed], status="finished", steps=STEPS,
               outcome="learned")
    for name in jumps.OWN:
        row[f"mean_{name}"] = 0.0
    row.update(values)
    return row


def family_rows(collapsed16=8, collapsed32=8, separate=False):
    """24 seeds x 3 cells. B1: kl3 at S = 16 detected in 12 jump runs and no twin (b 12, c 0); c10 at
    S = 16 in 5 (b 5, c 0); m at S = 32 in 12 twins only (b 0, c 12); twin of seed 2024 failed. B2: the
    first collapsedS jump runs of each size collapse late (step J + 200); with separate, at S = 16 the
    means of kl3 and ess are distinct and every collapsed run's lies above every other (ess's bad direction
    is down: the wrong way)."""
    rows = []
    for i, seed in enumerate(jumps.SEEDS):
        j = REGISTERED[seed]
        for cell, k in (("jump16", collapsed16), ("jump32", collapsed32)):
            row = blank_row(cell, seed)
            if i < k:
                row.update(outcome="collapsed", collapse=j + 200)
            if separate and cell == "jump16":
                row.update(mean_kl3=i + 100.0 * (i < k), mean_ess=i + 100.0 * (i < k))
            if cell == "jump16" and i < 12:
                row["det_kl3_own"] = j + 5
            if cell == "jump16" and i < 5:
                row["det_c10_own"] = j + 5
            rows.append(row)
        twin = blank_row("nojump", seed, status="failed" if seed == 2024 else "finished")
        if i < 12:
            twin["det_m_own"] = j + 30
        rows.append(twin)
    return rows


def by_test(tests):
    return {(t["test"], t["signal"], t["cell"]): t for t in tests}


def test_b1_mcnemar_verdicts_with_holm_over_28():
    tests = jumps.family(family_rows())
    assert len(tests) == 28
    t = by_test(tests)
    kl3 = t[("B1", "kl3", "jump16")]
    assert (kl3["n"], kl3["b"], kl3["c"]) == (23, 12, 0)   # seed 2024's twin failed: 23 pairs
    assert kl3["p"] == pytest.approx(2 / 2 ** 12)
    assert kl3["holm"] == pytest.approx(28 * 2 / 2 ** 12)   # every other test has p = 1
    assert kl3["verdict"] == "detects the jump"
    c10 = t[("B1", "c10", "jump16")]
    assert (c10["b"], c10["c"]) == (5, 0) and c10["p"] == pytest.approx(2 / 32)
    assert c10["verdict"] == "does not detect it"
    m = t[("B1", "m", "jump32")]
    assert (m["b"], m["c"]) == (0, 12)
    assert m["holm"] < 0.05 and m["verdict"] == "does not detect it"   # significant, the wrong way round
    assert all(x["verdict"] == "no information shown" for x in tests if x["test"] == "B2")


def test_too_few_collapses_removes_a_sizes_tests_from_the_holm_family():
    tests = jumps.family(family_rows(collapsed32=3))
    t = by_test(tests)
    gone = [x for x in tests if x["test"] == "B2" and x["cell"] == "jump32"]
    assert len(gone) == 7 and all(x["verdict"] == "too few collapses" and x["p"] is None for x in gone)
    assert t[("B1", "kl3", "jump16")]["holm"] == pytest.approx(21 * 2 / 2 ** 12)  # 28 - 7 tests left
    tests = jumps.family(family_rows(collapsed16=20))   # 20 collapsed, 4 not: enough
    assert all(x["verdict"] != "too few collapses" for x in tests)
    tests = jumps.family(family_rows(collapsed16=21))   # 3 not collapsed: too few
    assert sum(x["verdict"] == "too few collapses" for x in tests) == 7


def test_b2_verdicts_by_the_permutation_p_and_the_aucs_side():
    t = by_test(jumps.family(family_rows(separate=True)))
    kl3, ess = t[("B2", "kl3", "jump16")], t[("B2", "ess", "jump16")]
    exact = 2 / math.comb(24, 8)   # the only two labellings as extreme: all 8 on top, all 8 at the bottom
    assert kl3["auc"] == 1.0 and kl3["p"] == pytest.approx(exact)
    assert ess["auc"] == 0.0 and ess["p"] == pytest.approx(exact)
    assert kl3["holm"] == pytest.approx(28 * exact)
    assert kl3["verdict"] == "tells which runs collapse"
    assert ess["verdict"] == "points the wrong way"
    assert t[("B2", "m", "jump16")]["verdict"] == "no information shown"


def test_runs_collapsing_by_j_plus_140_leave_the_separation_and_are_counted():
    rows = [blank_row("jump16", 2001, outcome="collapsed", collapse=168 + 140),
            blank_row("jump16", 2002, outcome="collapsed", collapse=113 + 147),
            blank_row("jump16", 2003), blank_row("jump16", 2004, status="failed")]
    bad, good, late = jumps.separation_runs(rows, "jump16")
    assert [r["seed"] for r in bad] == [2002] and [r["seed"] for r in good] == [2003] and late == 1
    assert jumps.jump_auc(rows, "jump16") == 1.0   # seed 2002's -113 lies above seed 2003's -231


def test_leads_count_the_first_alarm_in_j_to_c():
    runs = [blank_row("jump16", 2001, outcome="collapsed", collapse=400, after_kl3_own=169),
            blank_row("jump16", 2002, outcome="collapsed", collapse=300, after_kl3_own=301),
            blank_row("jump16", 2003, outcome="collapsed", collapse=300, after_kl3_own=300)]
    assert jumps.leads(runs, "kl3", "own") == [(231, 231), (0, 68)]  # 2001's lead equals the oracle's


# --- the jump table -----------------------------------------------------------------------------

def test_the_draw_reproduces_the_registered_table():
    assert jumps.draw_jump_table() == REGISTERED
    assert jumps.JUMP_TABLE == REGISTERED


def test_a_jumps_file_that_differs_is_refused(tmp_path):
    path = tmp_path / "jumps.txt"
    path.write_text("".join(f"{s} {j}\n" for s, j in REGISTERED.items()))
    assert jumps.read_jumps(str(path)) == REGISTERED
    jumps.check_jumps(jumps.read_jumps(str(path)))
    changed = {**REGISTERED, 2005: 195}
    with pytest.raises(ValueError, match="seed 2005: 195 \\(registered 194\\)"):
        jumps.check_jumps(changed)


# --- end to end -----------------------------------------------------------------------------------

HEADER = jumps.analyze.TRAINER_COLUMNS  # the trainer's columns (checked against it in test_spike_injection.py)


def write_run(runs, cell, seed, accs, finished=True):
    """A trainer-format CSV and log. Jump runs: the lag grows from J + 1 to S (staleness columns) and kl_k3
    jumps to about 0.05 from step J + 5 on; before (and in nojump runs) kl_k3 is 5e-4 plus noise four
    times wider over steps 1-100 than after, so that its 10-step mean never leaves the own rule's early
    band; the rest is noise of the seed."""
    j, size = REGISTERED[seed], jumps.JUMP_SIZES.get(cell)
    rng = random.Random(seed * 10 + len(cell))
    name = f"{cell}_s2_seed{seed}"
    with open(runs / f"{name}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for t in range(1, STEPS + 1):
            lag = min(t - 1, 2) if not size or t <= j else min(2 + t - j, size)
            kl = (0.05 + 0.001 * rng.random() if size and t >= j + 5 else
                  0.0005 + (0.0004 if t <= 100 else 0.0001) * rng.random())
            v = {k: "0" for k in HEADER}
            v.update(step=t, version=t, staleness=lag, staleness_min=lag, staleness_mean=lag, staleness_max=lag,
                     heldout_acc=f"{accs[t // 20 - 1]:.4f}" if t % 20 == 0 else "",
                     cosine="" if t == 1 else f"{rng.uniform(-0.3, 0.3):.6f}",
                     window_mean="" if t < 21 else f"{rng.uniform(-0.1, 0.1):.6f}",
                     grad_norm=f"{1 + 0.1 * rng.random():.6f}", ess_token=f"{0.99 - 0.01 * rng.random():.6f}",
                     ess_sequence=f"{0.98 - 0.01 * rng.random():.6f}", kl_k3=f"{kl:.6g}",
                     clip_fraction_low=f"{0.001 * rng.random():.6f}", clip_fraction_high=f"{0.002 * rng.random():.6f}",
                     entropy_mean=f"{0.6 + 0.01 * rng.random():.6f}", sampler_kl=f"{0.001 * rng.random():.6f}",
                     log_ratio_p99=f"{0.2 + 0.01 * rng.random():.6f}", regime="safe", stepped=1)
            w.writerow([v[k] for k in HEADER])
    with open(runs / f"{name}.log", "w") as f:
        f.write("supervised warm-up: 600 steps, cross-entropy 0.4800, held-out accuracy 0.4500\n26122 parameters\n")
        if finished:
            f.write(f"summary: run={name} heldout_acc={accs[-1]:.4f} cpu_s=12.5 skipped=0\n")


def make_root(tmp_path):
    root = tmp_path / "B"
    runs = root / "runs"
    runs.mkdir(parents=True)
    learned = [0.5 + 0.005 * i for i in range(33)]
    collapsed = [0.6] * 15 + [0.3] * 18        # peak 0.6 (e_0 0.45); below 0.42 from step 320 on
    for cell in jumps.CELLS:
        for seed in (2001, 2002):
            write_run(runs, cell, seed, collapsed if (cell, seed) == ("jump32", 2001) else learned)
    write_run(runs, "nojump", 2003, learned, finished=False)
    (root / "jumps.txt").write_text("".join(f"{s} {j}\n" for s, j in REGISTERED.items()))
    (root / "calibration.txt").write_text("c_low=0.5\nc_high=0.8\nwindow_c_low=0.3\nc_max=0.8\nseeds=101,102,103\n")
    return root


def test_cli_end_to_end(tmp_path, capsys):
    root, out = make_root(tmp_path), tmp_path / "out"
    assert jumps.main(["--root", str(root), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "7 runs found, 6 finished" in printed.out and "nojump_s2_seed2003" in printed.out
    assert "missing: 65" in printed.out and "warning" not in printed.err
    rows = jumps.read_rows(str(out / "exp2-b-runs.csv"))
    again = tmp_path / "again.csv"
    jumps.write_rows(rows, str(again))
    assert again.read_text() == (out / "exp2-b-runs.csv").read_text()   # the round trip is exact
    got = {(r["cell"], r["seed"]): r for r in rows}
    assert got[("nojump", 2003)]["status"] == "failed" and got[("nojump", 2003)]["det_kl3_own"] is None
    assert (got[("jump32", 2001)]["outcome"], got[("jump32", 2001)]["collapse"]) == ("collapsed", 320)
    for seed, j in ((2001, 168), (2002, 113)):
        for cell in ("jump16", "jump32"):
            r = got[(cell, seed)]
            assert r["det_stale_oracle"] == j + 1 and r["det_kl3_own"] == j + 5 and r["det_kl3_shipped"] == j + 14
        assert got[("nojump", seed)]["det_stale_oracle"] is None and got[("nojump", seed)]["det_kl3_own"] is None
    assert got[("jump32", 2001)]["after_kl3_own"] == 173
    text = (out / "exp2-b.md").read_text()
    for name, _, _ in jumps.TABLES:
        assert f"({name})" in text
    tables = jumps.render(rows)
    assert set(tables) == {name for name, _, _ in jumps.TABLES} and all(t.endswith("\n") for t in tables.values())
    family = [line for line in tables["exp2-b-family"].splitlines() if line.startswith("| B")]
    assert len(family) == 28 and sum("too few collapses" in line for line in family) == 14
    assert "| kl3 | own | early mean + 3 sd | 16 | 2/2 = 1.000 [0.158, 1.000] | 5.0 [5.0, 5.0] | 5–5 | 0/2" \
        in tables["exp2-b-detection"]


def test_cli_refuses_a_jumps_file_that_differs(tmp_path):
    root = make_root(tmp_path)
    (root / "jumps.txt").write_text("".join(f"{s} {j + (s == 2010)}\n" for s, j in REGISTERED.items()))
    with pytest.raises(SystemExit, match="differs from the registered jump table: seed 2010: 206"):
        jumps.main(["--root", str(root), "--out", str(tmp_path / "out")])
