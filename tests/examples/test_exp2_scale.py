"""Part C of the second registered experiment (examples/grpo/exp2_scale.py) on
synthetic runs whose answers are known by construction: the qualification
rule at its edges, the per-run size numbers (steps > 50 only), the trend's
slope, interval and p against a closed form and a numerical integral of
Student's density, the outcomes by 400 and by 800 on hand-made evaluation
sequences (a collapse that recovers, a late one, the last evaluation, e_0
from the log, failed runs), the recovered and late counts, family C's size
and verdicts, and the command line end to end (rows round trip, tables,
the qualifies exit codes). Standard library and pytest only."""

import csv
import importlib.util
import math
import os
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))
_spec = importlib.util.spec_from_file_location("gac_grpo_exp2_scale",
                                               SOURCE_DIR / "examples" / "grpo" / "exp2_scale.py")
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)

HEADER = scale.analyze.TRAINER_COLUMNS  # the trainer's columns (checked against it in test_spike_injection.py)
# The design's parameter counts on T1 (docs/RESULTS.md, C1).
PARAMS = {128: 45_856, 256: 124_448, 512: 379_936, 1024: 1_284_128, 2048: 4_665_376}


def write_run(path, accs, start=0.3, steps=None, cosine=lambda s: 0.5, noise=lambda s: 0.25 if s % 2 else -0.25,
              pr=lambda s: 8.0, parameters=45_856, cpu=12.5, finished=True):
    """PATH.csv (trainer format, heldout_acc every 20 steps from accs) and PATH.log (warm-up line with e_0,
    the parameter count, and a summary line when finished)."""
    steps = steps if steps is not None else 20 * len(accs)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HEADER, restval="")
        w.writeheader()
        for s in range(1, steps + 1):
            w.writerow({"step": s, "heldout_acc": f"{accs[s // 20 - 1]:.4f}" if s % 20 == 0 else "",
                        "cosine": f"{cosine(s):.6f}", "noise_cos": f"{noise(s):.6f}", "regime": "safe",
                        "stepped": 1, "grad_norm": "1.0", "loss": "0.1",
                        "pr_pop": f"{pr(s):.4f}" if s % 25 == 0 else ""})
    with open(path + ".log", "w") as f:
        f.write(f"supervised warm-up: 2000 steps, cross-entropy 1.0000, held-out accuracy {start:.4f}\n")
        f.write(f"gac_grpo: run x, loss grpo, agent monitor, mlp width 128 layers 2, base 32, 1 tasks, "
                f"{parameters} parameters, lr 0.0003, c_low 0.5863, c_high 0.8729\n")
        if finished:
            f.write(f"summary: run=x final_reward=0.5 heldout_acc={accs[-1]:.4f} cpu_s={cpu:.1f} q90=0.5\n")


def c1_row(task, width, seed, end, ratio=1.8, status="finished"):
    row = {k: None for k in scale.ROW_KEYS}
    row.update(part="c1", cell=task, width=width, seed=seed, status=status, end=end, ratio=ratio,
               parameters=PARAMS[width])
    return row


def c2_row(cell, seed, by_400, by_800, status="finished"):
    row = {k: None for k in scale.ROW_KEYS}
    row.update(part="c2", cell=cell, width=128 if cell == "a" else 512, seed=seed, status=status,
               outcome_400="collapsed" if by_400 else "learned", outcome_800="collapsed" if by_800 else "learned")
    return row


def sweep(task, ends, ratio=lambda w, i: 1.8):
    """Rows of a complete sweep: ends[width] = the three seeds' end accuracies."""
    seeds = scale.SWEEPS[task][1]
    return [c1_row(task, w, seed, ends.get(w, [0.5] * 3)[i], ratio(w, i))
            for w in scale.WIDTHS for i, seed in enumerate(seeds)]


# --- qualification -----------------------------------------------------------------------------

@pytest.mark.parametrize("low, high, expected", [
    ([0.30, 0.35, 0.40], [0.44, 0.45, 0.46], True),     # gain exactly +0.10 (0.45 - 0.35): at least 0.10
    ([0.60, 0.60, 0.60], [0.70, 0.70, 0.70], True),     # the same, where the floats give 0.09999999999999998
    ([0.30, 0.35, 0.40], [0.448, 0.45, 0.45], False),   # gain 0.0993
    ([0.70, 0.80, 0.75], [0.90, 0.90, 0.90], True),     # 2048 at exactly 0.90: at most 0.90
    ([0.70, 0.80, 0.75], [0.90, 0.90, 0.9006], False),  # 0.9002 > 0.90
    ([0.20, 0.20, 0.20], [0.95, 0.95, 0.95], False),    # gain 0.75 but above 0.90
    ([0.20, 0.20, 0.20], [0.10, 0.95, 0.95], True),     # one seed above 0.90, the mean (0.667) is not
])
def test_the_qualification_rule_at_its_edges(low, high, expected):
    rows = sweep("t1", {128: low, 2048: high})
    assert scale.qualifies(rows, "t1") is expected
    q = scale.qualification(rows, "t1")
    assert q["end_low"] == pytest.approx(sum(low) / 3) and q["end_high"] == pytest.approx(sum(high) / 3)


def test_qualification_averages_the_seeds_not_the_best_seed_and_leaves_failed_runs_out():
    rows = sweep("t1", {128: [0.30, 0.30, 0.30], 2048: [0.60, 0.35, 0.35]})  # mean gain 0.1, max gain 0.3
    assert scale.qualifies(rows, "t1") is True
    rows = sweep("t1", {128: [0.30, 0.30, 0.30], 2048: [0.50, 0.35, 0.34]})  # mean 0.3967: gain 0.0967
    assert scale.qualifies(rows, "t1") is False
    # the third seed at 2048 failed: the mean is over the two that finished (0.425)
    rows[-1]["status"], rows[-1]["end"] = "failed", None
    assert scale.qualification(rows, "t1")["n_high"] == 2
    assert scale.qualifies(rows, "t1") is True
    for r in rows:
        if r["width"] == 2048:
            r["status"] = "failed"
    assert scale.qualifies(rows, "t1") is None


def test_the_reported_task():
    bad_t1 = sweep("t1", {128: [0.9] * 3, 2048: [0.95] * 3})   # saturates
    good_t1 = sweep("t1", {128: [0.3] * 3, 2048: [0.6] * 3})
    good_t2 = sweep("t2", {128: [0.2] * 3, 2048: [0.5] * 3})
    bad_t2 = sweep("t2", {128: [0.2] * 3, 2048: [0.25] * 3})
    assert scale.reported_task(good_t1 + bad_t2)[0] == "t1"
    assert scale.reported_task(bad_t1 + good_t2)[0] == "t2"
    assert scale.reported_task(bad_t1 + bad_t2) == (None, scale.NEITHER)
    assert scale.reported_task(bad_t1)[0] is None
    # no task: the last sweep's slope is shown, untested, and leaves family C
    assert scale.trend_task(bad_t1 + bad_t2) == ("t2", False)
    fam = scale.family(bad_t1 + bad_t2)
    assert fam[0]["p"] is None and fam[0]["verdict"].startswith("not tested")


# --- per-run size numbers ---------------------------------------------------------------------

def test_the_size_numbers_read_steps_after_50_only(tmp_path):
    # steps <= 50: |c| = 0.99 and noise 0.9 (must not count); after: |c| 0.61 with sign flips, noise +-0.3
    path = str(tmp_path / "sizes" / "runs" / "mlp-w128_s0_seed3001")
    accs = [0.3 + 0.01 * i for i in range(1, 21)]
    write_run(path, accs, start=0.25, cosine=lambda s: 0.99 if s <= 50 else (0.61 if s % 3 else -0.61),
              noise=lambda s: 0.9 if s <= 50 else (0.3 if s % 2 else -0.3), pr=lambda s: 6.0 + s / 100,
              parameters=45_856, cpu=15.25)
    row = scale.run_row("c1", "t1", 128, 3001, path + ".csv")
    assert row["status"] == "finished"
    assert row["q90"] == pytest.approx(0.61) and row["noise_rms"] == pytest.approx(0.3)
    assert row["ratio"] == pytest.approx(0.61 / 0.3) and row["above_2x"] == 1
    assert row["start"] == pytest.approx(0.25)
    assert row["end"] == pytest.approx(sum(accs[-5:]) / 5)
    assert row["pr_pop"] == pytest.approx(sum(6.0 + s / 100 for s in range(25, 401, 25)) / 16)
    assert row["parameters"] == 45_856 and row["cpu_s"] == pytest.approx(15.2, abs=0.06)
    write_run(path, accs, cosine=lambda s: 0.59, noise=lambda s: 0.3 if s % 2 else -0.3)
    assert scale.run_row("c1", "t1", 128, 3001, path + ".csv")["above_2x"] == 0
    # exactly twice: "exceeds" is strict
    write_run(path, accs, cosine=lambda s: 0.6, noise=lambda s: 0.3 if s % 2 else -0.3)
    row = scale.run_row("c1", "t1", 128, 3001, path + ".csv")
    assert row["q90"] == 2.0 * row["noise_rms"] and row["above_2x"] == 0


# --- the trend -----------------------------------------------------------------------------------

def t_two_sided_p(t, df, n=20_000):
    """2 P(T > |t|) by Simpson's rule on Student's density over [0, |t|] (an independent route)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    f = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)
    h = abs(t) / n
    inner = f(0) + f(abs(t)) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
    return 1.0 - 2.0 * inner * h / 3.0


def test_the_trend_slope_interval_and_p_against_a_closed_form():
    # ratio = 1.2 + 0.07 log2(params) + residual; residuals (+d, -d, 0) within each width are orthogonal to 1
    # and to x, so the least-squares slope is exactly 0.07 and the residual sum of squares 5 x 2 d^2.
    b, d = 0.07, 0.05
    rows = sweep("t1", {128: [0.3] * 3, 2048: [0.6] * 3},
                 ratio=lambda w, i: 1.2 + b * math.log2(PARAMS[w]) + (d, -d, 0.0)[i])
    t = scale.trend(rows, "t1")
    xs = [math.log2(PARAMS[w]) for w in scale.WIDTHS for _ in range(3)]
    mx = sum(xs) / 15
    sxx = sum((x - mx) ** 2 for x in xs)
    se = math.sqrt(10 * d * d / 13 / sxx)
    assert t["n"] == 15 and t["slope"] == pytest.approx(b, abs=1e-12)
    t975_13 = 2.160368656  # Student's t(0.975, 13), tables
    assert t["low"] == pytest.approx(b - t975_13 * se, abs=1e-8)
    assert t["high"] == pytest.approx(b + t975_13 * se, abs=1e-8)
    assert t["p"] == pytest.approx(t_two_sided_p(b / se, 13), abs=1e-7)
    fam = scale.family(rows)
    assert fam[0]["test"] == "trend" and fam[0]["verdict"] == "grows with size"
    # the same data falling with size; then a flat one
    down = sweep("t1", {128: [0.3] * 3, 2048: [0.6] * 3},
                 ratio=lambda w, i: 3.0 - b * math.log2(PARAMS[w]) + (d, -d, 0.0)[i])
    assert scale.trend(down, "t1")["slope"] == pytest.approx(-b, abs=1e-12)
    assert scale.family(down)[0]["verdict"] == "falls with size"
    flat = sweep("t1", {128: [0.3] * 3, 2048: [0.6] * 3}, ratio=lambda w, i: 1.8 + (d, -d, 0.0)[i])
    assert scale.family(flat)[0]["verdict"] == "no trend shown"


def test_the_trend_leaves_failed_runs_out_and_says_n():
    rows = sweep("t1", {128: [0.3] * 3, 2048: [0.6] * 3}, ratio=lambda w, i: 1.0 + 0.1 * i + w / 1e4)
    rows[0]["status"], rows[0]["ratio"] = "failed", None
    assert scale.trend(rows, "t1")["n"] == 14
    assert "| T1 | 14 |" in scale.trend_table(rows) and "| 12 |" in scale.trend_table(rows)


# --- the outcomes by 400 and by 800 ------------------------------------------------------------

RISE = [0.3 + 0.03 * i for i in range(1, 11)]  # e_1..e_10 up to 0.6


@pytest.mark.parametrize("name, accs, start, by_400, by_800, w1, w2", [
    # collapses at e_15 (step 300) and is back above 0.7 x 0.6 from e_21: recovered
    ("recovers", RISE + [0.6] * 4 + [0.2] * 6 + [0.6] * 20, 0.3, ("collapsed", 300), ("learned", None),
     0.2, 0.6),
    # learns, holds to e_30, falls at e_31 (step 620) for good: late
    ("late", RISE + [0.6] * 20 + [0.1] * 10, 0.3, ("learned", None), ("collapsed", 620), 0.6, 0.1),
    # only e_20 is low: by 400 the last evaluation is flagged, by 800 it is a dip
    ("last evaluation", RISE + [0.6] * 9 + [0.2] + [0.6] * 20, 0.3, ("collapsed", 400), ("learned", None),
     0.52, 0.6),
    # falls at e_12 and stays: collapsed both times, at the same step
    ("persists", RISE + [0.6] + [0.1] * 29, 0.3, ("collapsed", 240), ("collapsed", 240), 0.1, 0.1),
    # e_0 = 0.8 from the log: every evaluation (0.5) is below 0.56 from e_1 (with e_1 for e_0: never learned)
    ("e0 from the log", [0.5] * 40, 0.8, ("collapsed", 20), ("collapsed", 20), 0.5, 0.5),
    ("flat", [0.31] * 40, 0.3, ("never learned", None), ("never learned", None), 0.31, 0.31),
])
def test_the_outcomes_by_400_and_by_800(tmp_path, name, accs, start, by_400, by_800, w1, w2):
    path = str(tmp_path / "long" / "runs" / "setup_s16_seed3101")
    write_run(path, accs, start=start)
    row = scale.run_row("c2", "a", 128, 3101, path + ".csv")
    assert row["status"] == "finished" and row["evals"] == 40
    assert (row["outcome_400"], row["collapse_400"]) == by_400
    assert (row["outcome_800"], row["collapse_800"]) == by_800
    assert row["acc_16_20"] == pytest.approx(sum(accs[15:20]) / 5) == pytest.approx(w1)
    assert row["acc_36_40"] == pytest.approx(sum(accs[35:40]) / 5) == pytest.approx(w2)


def test_a_failed_run_counts_as_collapsed_by_800_and_by_400_only_before_its_20th_evaluation(tmp_path):
    runs = tmp_path / "long" / "runs"
    # crashed after 25 evaluations, learning: by 400 its own e_1..e_20 (learned), by 800 collapsed -> late
    write_run(str(runs / "setup_s16_seed3101"), RISE + [0.6] * 15, finished=False)
    # crashed after 10 evaluations: collapsed by 400 and by 800
    write_run(str(runs / "setup_s16_seed3102"), RISE, finished=False)
    late = scale.run_row("c2", "a", 128, 3101, str(runs / "setup_s16_seed3101.csv"))
    early = scale.run_row("c2", "a", 128, 3102, str(runs / "setup_s16_seed3102.csv"))
    assert late["status"] == early["status"] == "failed"
    assert (late["outcome_400"], late["outcome_800"]) == ("learned", "collapsed")
    assert (early["outcome_400"], early["outcome_800"]) == ("collapsed", "collapsed")
    assert late["acc_16_20"] is None and late["acc_36_40"] is None  # left out of the means
    missing = scale.run_row("c2", "a", 128, 3103, str(runs / "setup_s16_seed3103.csv"))
    assert missing["status"] == "missing" and missing["outcome_400"] is None
    s = scale.long_summary([late, early, missing], "a")
    assert (s["n"], s["failed"], s["missing"], s["by_400"], s["by_800"], s["recovered"], s["late"]) == \
        (2, 2, 1, 1, 2, 0, 1)


def test_recovered_and_late_counts_by_hand():
    pattern = [(1, 0)] * 5 + [(0, 1)] * 2 + [(1, 1)] * 3 + [(0, 0)] * 14   # 24 runs of (a)
    rows = [c2_row("a", 3101 + i, *p) for i, p in enumerate(pattern)]
    s = scale.long_summary(rows, "a")
    assert (s["n"], s["by_400"], s["by_800"], s["recovered"], s["late"]) == (24, 8, 5, 5, 2)
    # Clopper-Pearson's upper bound at k = 0 in closed form, 1 - 0.025^(1/n), on a part of 12 runs without
    # collapse
    rows_b = [c2_row("b", 3201 + i, 0, 0) for i in range(12)]
    table = scale.long_table(rows + rows_b)
    assert f"0 / 12 [0.000, {1 - 0.025 ** (1 / 12):.3f}]" in table
    assert "5 / 24 [" in table and "2 / 24 [" in table


# --- family C ----------------------------------------------------------------------------------

def mcnemar_by_hand(b, c):
    """Two-sided exact McNemar by enumerating every outcome of b + c fair coin flips."""
    n = b + c
    probs = [math.comb(n, k) / 2 ** n for k in range(n + 1)]
    observed = probs[b]
    return min(1.0, sum(p for p in probs if p <= observed * (1 + 1e-12)))


def long_rows(cell, recovered, late, both, neither):
    pattern = [(1, 0)] * recovered + [(0, 1)] * late + [(1, 1)] * both + [(0, 0)] * neither
    first = 3101 if cell == "a" else 3201
    return [c2_row(cell, first + i, *p) for i, p in enumerate(pattern)]


def holm_by_hand(ps):
    """Holm's adjusted p-values of ps, in their order, from the definition."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [None] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def test_no_collapse_gives_no_test_and_enters_the_family_as_p_one():
    # trend (T1 qualifies) with a known p; (a) without any collapse; (b) recovered 7, late 0
    rows = sweep("t1", {128: [0.3] * 3, 2048: [0.6] * 3},
                 ratio=lambda w, i: 1.8 + 0.02 * math.log2(PARAMS[w]) + (0.05, -0.05, 0.0)[i])
    rows += long_rows("a", 0, 0, 0, 24) + long_rows("b", 7, 0, 1, 4)
    fam = {t["test"]: t for t in scale.family(rows)}
    assert fam["a"]["verdict"] == "no collapse" and fam["a"]["p"] is None and fam["a"]["p_holm"] is None
    p_trend, p_b = fam["trend"]["p"], fam["b"]["p"]
    assert p_b == pytest.approx(mcnemar_by_hand(7, 0)) == pytest.approx(2 / 2 ** 7)
    # Holm over the registered 3, the test not run counted as p = 1
    want = holm_by_hand([p_trend, 1.0, p_b])
    assert fam["trend"]["p_holm"] == pytest.approx(want[0])
    assert fam["b"]["p_holm"] == pytest.approx(want[2]) and want[2] > 2 * p_b * 0.999  # x 3 or x 2, never x 1
    assert fam["b"]["verdict"] == "collapses recover"
    assert "over the registered 3 tests" in scale.family_table(rows)


def test_a_failed_run_is_counted_collapsed_but_left_out_of_mcnemars_pairs():
    rows = long_rows("a", 7, 0, 0, 14)
    # Three failed runs counted as collapsed by 800 only ("late" in the counts), not in the test.
    rows += [c2_row("a", 3190 + i, False, True, status="failed") for i in range(3)]
    fam = {t["test"]: t for t in scale.family(rows)}
    assert (fam["a"]["recovered"], fam["a"]["late"], fam["a"]["n"]) == (7, 3, 24)
    assert (fam["a"]["pairs_recovered"], fam["a"]["pairs_late"], fam["a"]["pairs"]) == (7, 0, 21)
    assert fam["a"]["p"] == pytest.approx(mcnemar_by_hand(7, 0))


def test_collapses_without_discordant_runs_stay_in_the_family():
    # (a) has collapses, all concordant: McNemar p = 1 and the family has 3 tests (Holm x 3 on the smallest)
    rows = sweep("t1", {128: [0.3] * 3, 2048: [0.6] * 3},
                 ratio=lambda w, i: 1.0 + 0.2 * math.log2(PARAMS[w]) + (0.05, -0.05, 0.0)[i])
    rows += long_rows("a", 0, 0, 3, 21) + long_rows("b", 0, 8, 0, 4)
    fam = {t["test"]: t for t in scale.family(rows)}
    assert fam["a"]["p"] == 1.0 and fam["a"]["verdict"] == "no change shown"
    assert fam["trend"]["p_holm"] == pytest.approx(min(1.0, 3 * fam["trend"]["p"]))
    assert fam["b"]["p"] == pytest.approx(mcnemar_by_hand(0, 8))
    assert fam["b"]["p_holm"] == pytest.approx(2 * fam["b"]["p"])  # second smallest: x 2
    assert fam["b"]["verdict"] == "more collapse later"


@pytest.mark.parametrize("recovered, late, verdict", [
    (8, 0, "collapses recover"), (0, 8, "more collapse later"), (6, 1, "no change shown"),
    (3, 3, "no change shown")])
def test_the_mcnemar_direction(recovered, late, verdict):
    rows = long_rows("a", recovered, late, 2, 24 - recovered - late - 2)   # no C1: the trend is not tested
    fam = {t["test"]: t for t in scale.family(rows)}
    assert fam["a"]["p"] == pytest.approx(mcnemar_by_hand(recovered, late))
    assert fam["a"]["p_holm"] == pytest.approx(min(1.0, 3 * fam["a"]["p"]))  # the only test run, of 3
    assert fam["a"]["verdict"] == verdict


# --- the command line --------------------------------------------------------------------------

def write_sweep(root, task, end_by_width, ratio_by_width):
    """A complete synthetic sweep: |c_t| = ratio x 0.25 over steps > 50 and noise +-0.25, so q0.9 / rms =
    ratio; evaluations flat at the width's end accuracy."""
    folder, seeds = scale.SWEEPS[task]
    for w in scale.WIDTHS:
        for seed in seeds:
            c = ratio_by_width[w] * 0.25
            write_run(os.path.join(root, folder, "runs", f"mlp-w{w}_s0_seed{seed}"), [end_by_width[w]] * 20,
                      start=0.2, cosine=lambda s, c=c: c, parameters=PARAMS[w])


def test_the_command_line_end_to_end(tmp_path, capsys):
    root, out = str(tmp_path / "c"), str(tmp_path / "out")
    ratios = {w: 1.6 + 0.05 * math.log2(PARAMS[w] / PARAMS[128]) for w in scale.WIDTHS}
    write_sweep(root, "t1", {128: 0.85, 256: 0.9, 512: 0.94, 1024: 0.95, 2048: 0.96}, ratios)  # saturates
    write_sweep(root, "t2", {128: 0.30, 256: 0.35, 512: 0.40, 1024: 0.45, 2048: 0.50}, ratios)  # qualifies
    runs = os.path.join(root, "long", "runs")
    write_run(os.path.join(runs, "setup_s16_seed3101"), RISE + [0.6] * 4 + [0.2] * 6 + [0.6] * 20)  # recovered
    write_run(os.path.join(runs, "setup_s16_seed3102"), RISE + [0.6] * 30)
    write_run(os.path.join(runs, "t1-w512_s16_seed3201"), RISE + [0.6] * 20 + [0.1] * 10, parameters=379_936)
    write_run(os.path.join(runs, "t1-w512_s16_seed3202"), RISE, finished=False)

    assert scale.main(["qualifies", "--root", root, "--task", "t1"]) == 1
    assert scale.main(["qualifies", "--root", root, "--task", "t2"]) == 0
    assert scale.main(["--root", root, "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "C1 T1 15/15 finished" in printed and "C2 (a) 2/24 finished" in printed
    assert "1 failed: long/t1-w512_s16_seed3202" in printed and "32 missing" in printed

    rows_path = os.path.join(out, "exp2-c-runs.csv")
    rows = scale.read_rows(rows_path)
    assert len(rows) == 30 + 24 + 12
    again = str(tmp_path / "again.csv")
    scale.write_rows(rows, again)
    assert open(again).read() == open(rows_path).read()
    assert scale.read_rows(again) == rows

    text = open(os.path.join(out, "exp2-c.md")).read()
    for name in ("exp2-c-sizes", "exp2-c-qualify", "exp2-c-trend", "exp2-c-long", "exp2-c-family"):
        assert f"## {name}" in text
    assert scale.render(rows)["exp2-c-sizes"] in text
    assert "T1 does not qualify, T2 qualifies: T2 is reported" in text
    t = scale.trend(rows, "t2")
    assert t["n"] == 15 and t["slope"] == pytest.approx(0.05, abs=1e-5)  # rows hold 6 significant digits
    fam = {f["test"]: f for f in scale.family(rows)}
    assert (fam["a"]["recovered"], fam["a"]["late"]) == (1, 0)
    assert (fam["b"]["n"], fam["b"]["by_400"], fam["b"]["by_800"], fam["b"]["late"]) == (2, 1, 2, 1)
    assert "| (b) T1 at width 512 | 2 (1; 10) |" in text

    # a run of T2's sweep removed: qualification cannot be decided
    os.remove(os.path.join(root, "sizes-t2", "runs", "mlp-w512_s0_seed3005.csv"))
    os.remove(os.path.join(root, "sizes-t2", "runs", "mlp-w512_s0_seed3005.log"))
    assert scale.main(["qualifies", "--root", root, "--task", "t2"]) == 2
    assert "mlp-w512_s0_seed3005" in capsys.readouterr().err
    # no T2 folder at all
    assert scale.main(["qualifies", "--root", str(tmp_path / "nothing"), "--task", "t2"]) == 2


def test_the_qualifies_command_leaves_a_failed_run_out(tmp_path, capsys):
    root = str(tmp_path / "c")
    ratios = {w: 1.8 for w in scale.WIDTHS}
    write_sweep(root, "t1", {128: 0.30, 256: 0.35, 512: 0.40, 1024: 0.45, 2048: 0.45}, ratios)
    # seed 3003 at 2048 failed; the two that finished give 0.45 - 0.30 = 0.15: qualifies
    write_run(os.path.join(root, "sizes", "runs", "mlp-w2048_s0_seed3003"), [0.1] * 5, finished=False)
    assert scale.main(["qualifies", "--root", root, "--task", "t1"]) == 0
    assert "failed runs left out: sizes/mlp-w2048_s0_seed3003" in capsys.readouterr().err
