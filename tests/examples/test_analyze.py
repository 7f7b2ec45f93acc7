"""The rules of examples/grpo/analyze.py on small synthetic runs: the collapse
rule and the three outcomes, the detectors' alarm rules (level, rise, the
staleness null), Student's t and the paired interval, the control and
calibrate subcommands, and report end to end (tables and CSVs, no plots).
Standard library and pytest only."""

import csv
import importlib.util
import math
import os
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))
_spec = importlib.util.spec_from_file_location("gac_grpo_analyze", SOURCE_DIR / "examples" / "grpo" / "analyze.py")
analyze = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(analyze)

STEPS = 400


def evals_every_20(accs):
    return [(20 * (i + 1), a) for i, a in enumerate(accs)]


def make_run(cosine, steps=STEPS, kl=0.0, evals=(), start=0.4):
    """An in-memory run as load_run returns it (no file)."""
    step = list(range(1, steps + 1))
    r = {"step": step, "start": start, "evals": list(evals), "regime": ["safe"] * steps, "stepped": [True] * steps}
    for name in analyze.SERIES:
        r[name] = [None] * steps
    r["cosine"] = [cosine(s) for s in step]
    r["window_mean"] = [0.0] * steps
    r["sampler_kl"] = [kl(s) if callable(kl) else kl for s in step]
    r["entropy"] = [0.5] * steps
    r["grad_norm"] = [1.0 + 0.01 * (s % 7) for s in step]
    r["m"] = analyze.metrics(r)
    return r


def write_run(directory, name, steps=STEPS, start=0.4, accs=None, cosine=lambda s: 0.1, window=None,
              kl=lambda s: 0.0, stepped=lambda s: 1, grad_scale=None, lag=None):
    """RUNS/<name>.csv and its finished .log, with the columns the trainer writes that analyze.py reads."""
    accs = accs if accs is not None else [min(0.4 + 0.02 * i, 0.7) for i in range(1, steps // 20 + 1)]
    header = ["step", "heldout_acc", "cosine", "window_mean", "sampler_kl", "entropy", "grad_norm", "stepped",
              "regime"]
    if grad_scale is not None:
        header.append("grad_scale")
    if lag is not None:
        header.append("lag_updates")
    with open(os.path.join(directory, name + ".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for s in range(1, steps + 1):
            row = [s, f"{accs[s // 20 - 1]:.4f}" if s % 20 == 0 else "", f"{cosine(s):.6f}",
                   f"{(window or cosine)(s):.6f}", f"{kl(s):.6f}", "0.5", f"{1.0 + 0.01 * (s % 7):.4f}",
                   stepped(s), "safe"]
            if grad_scale is not None:
                row.append(f"{grad_scale(s):.6f}")
            if lag is not None:
                row.append(lag(s))
            w.writerow(row)
    with open(os.path.join(directory, name + ".log"), "w") as f:
        f.write(f"supervised warm-up: 600 steps, cross-entropy 0.4600, held-out accuracy {start:.4f}\n")
        f.write(f"summary: run={name} heldout_acc={accs[-1]:.4f} skipped=0\n")


# --- the collapse rule and the outcomes ---------------------------------------------------

def test_a_fall_at_the_last_evaluation_is_a_collapse():
    evals = evals_every_20([0.5, 0.6, 0.7, 0.7, 0.45])  # 0.45 < 0.7 x 0.7
    assert analyze.collapse_step(0.4, evals) == 100
    assert analyze.outcome(0.4, evals) == ("collapsed", 100)


def test_a_dip_that_recovers_is_not_a_collapse():
    evals = evals_every_20([0.6, 0.7, 0.4, 0.45, 0.7, 0.68])
    assert analyze.collapse_step(0.4, evals) is None
    assert analyze.outcome(0.4, evals) == ("learned", None)


def test_a_dip_that_recovers_then_falls_for_good_collapses_at_the_fall():
    evals = evals_every_20([0.7, 0.4, 0.65, 0.3, 0.2])
    assert analyze.outcome(0.4, evals) == ("collapsed", 80)


def test_a_run_that_never_learned_is_neither_collapsed_nor_learned():
    evals = evals_every_20([0.41, 0.43, 0.42, 0.44])
    assert analyze.outcome(0.4, evals) == ("never learned", None)
    # 0.05 above the start is learning
    assert analyze.outcome(0.4, evals_every_20([0.41, 0.46, 0.45]))[0] == "learned"


def test_a_run_collapsed_from_the_start():
    evals = evals_every_20([0.1, 0.12, 0.1, 0.11])
    assert analyze.outcome(0.5, evals) == ("collapsed", 20)


def test_without_the_warm_up_accuracy_the_first_evaluation_stands_for_it():
    assert analyze.outcome(None, evals_every_20([0.5, 0.52, 0.51]))[0] == "never learned"
    assert analyze.outcome(None, evals_every_20([0.5, 0.7, 0.3]))[1] == 60


# --- alarm onset -------------------------------------------------------------------------

THR = {"c_low": 0.5, "c_high": 0.8, "window_c_low": 0.5}


def test_a_statistic_stale_from_the_start_alarms_at_51_under_level_and_never_under_rise():
    r = make_run(lambda s: 0.9, kl=0.02)
    a = analyze.alarms(r, analyze.series_stats(r), analyze.thresholds(THR))
    for name in ("c10", "c", "elevated"):
        assert a[(name, "level")] == 51, name
        assert a[(name, "rise")] is None, name
    assert a[("kl10", "null")] == 51


def test_a_statistic_that_rises_at_step_200_alarms_there_under_rise():
    r = make_run(lambda s: 0.9 if s >= 200 else (0.1 if s % 2 else 0.2))
    a = analyze.alarms(r, analyze.series_stats(r), analyze.thresholds(THR))
    assert a[("c", "rise")] == 200
    assert a[("c", "level")] == 200
    # the 10-step mean passes c_low = 0.5 with the fifth step at 0.9 (steps 195-204): 0.7 + 4.5 > 5 > 0.9 + 3.6
    assert a[("c10", "rise")] == 204
    assert a[("c10", "level")] == 204
    # synchronous: no null alarm
    assert a[("kl10", "null")] is None


def test_a_noisy_statistic_above_its_threshold_that_does_not_rise_raises_no_rise_alarm():
    # |c| alternates 0.7 / 0.9 throughout: above c_high = 0.8 every other step, within 3 sd of its early mean
    r = make_run(lambda s: 0.9 if s % 2 else 0.7)
    a = analyze.alarms(r, analyze.series_stats(r), analyze.thresholds(THR))
    assert a[("c", "level")] == 51
    assert a[("c", "rise")] is None


def test_rise_never_alarms_inside_its_early_window():
    # one spike at step 70 (inside steps 51-100: part of the early window), the rise at 250
    r = make_run(lambda s: 0.9 if s == 70 or s >= 250 else 0.1)
    a = analyze.alarms(r, analyze.series_stats(r), analyze.thresholds(THR))
    assert a[("c", "level")] == 70
    assert a[("c", "rise")] == 250


def test_a_collapse_at_or_before_step_100_is_missed_under_rise():
    early = make_run(lambda s: 0.9 if s >= 60 else 0.1, evals=evals_every_20([0.6, 0.7, 0.7, 0.2] + [0.1] * 16))
    late = make_run(lambda s: 0.9 if s >= 200 else 0.1, evals=evals_every_20([0.6] * 12 + [0.1] * 8))
    calm = make_run(lambda s: 0.1, evals=evals_every_20([0.6] * 20))
    assert (early["m"]["collapse"], late["m"]["collapse"], calm["m"]["collapse"]) == (80, 260, None)
    pool = {("grpo", 16, 1): early, ("grpo", 16, 2): late, ("grpo", 8, 1): calm}
    thr = analyze.thresholds(THR)
    found = {k: analyze.alarms(r, analyze.series_stats(r), thr) for k, r in pool.items()}
    rise = analyze.score(pool, {k: a[("c", "rise")] for k, a in found.items()}, "rise")
    assert (rise["tp"], rise["fp"], rise["fn"], rise["tn"], rise["unwarnable"]) == (1, 0, 1, 1, 1)
    assert rise["leads"] == [60]
    level = analyze.score(pool, {k: a[("c", "level")] for k, a in found.items()}, "level")
    assert (level["tp"], level["fn"], level["unwarnable"]) == (2, 0, 0)
    assert level["leads"] == [20, 60]


def test_alarms_on_the_first_eligible_step_are_counted():
    stale = make_run(lambda s: 0.9, evals=evals_every_20([0.6] * 20))
    calm = make_run(lambda s: 0.1, evals=evals_every_20([0.6] * 20))
    pool = {("grpo", 16, 1): stale, ("grpo", 0, 1): calm}
    thr = analyze.thresholds(THR)
    found = {k: analyze.alarms(r, analyze.series_stats(r), thr) for k, r in pool.items()}
    e = analyze.score(pool, {k: a[("c10", "level")] for k, a in found.items()}, "level")
    assert (e["alarmed"], e["at_first"], e["fp"], e["tn"], e["precision"]) == (1, 1, 1, 1, 0.0)


def test_the_detector_pool_holds_no_control():
    runs = {(v, s, 1): None for v in ["grpo", "m2po", "gac", "rskip-gac", "mskip-gac", "lrs-gac", "gacb2"]
            for s in (0, 16)}
    assert sorted(analyze.detector_pool(runs)) == [("grpo", 0, 1), ("grpo", 16, 1), ("m2po", 16, 1)]


# --- Student's t and the paired interval ------------------------------------------------------

@pytest.mark.parametrize("df, t", [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)])
def test_t_quantile_matches_the_tables(df, t):
    assert analyze.t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)


def test_t_cdf():
    assert analyze.t_cdf(0.0, 5) == 0.5
    assert analyze.t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy
    assert analyze.t_cdf(-2.0, 3) == pytest.approx(1.0 - analyze.t_cdf(2.0, 3))
    assert analyze.t_quantile(0.995, 4) == pytest.approx(4.604, abs=1e-3)
    assert analyze.t_quantile(0.95, 9) == pytest.approx(1.833, abs=1e-3)


def test_paired_interval_on_known_numbers():
    m, lo, hi = analyze.paired_ci([1, 2, 3, 4, 5])
    half = 2.7764451 * math.sqrt(2.5) / math.sqrt(5)
    assert m == 3
    assert (lo, hi) == (pytest.approx(3 - half, abs=1e-6), pytest.approx(3 + half, abs=1e-6))
    assert analyze.verdict(lo, hi) == "row better"
    _, lo, hi = analyze.paired_ci([-1.0, 1.0, 0.5])
    assert analyze.verdict(lo, hi) == "no evidence of a difference"
    _, lo, hi = analyze.paired_ci([-0.3, -0.2, -0.25, -0.22])
    assert analyze.verdict(lo, hi) == "row worse"
    # Bonferroni over m = 10: wider, at t(1 - 0.0025, 4) = 5.598
    _, blo, bhi = analyze.paired_ci([1, 2, 3, 4, 5], 1 - 0.05 / 10)
    assert bhi - 3 == pytest.approx(5.598 * math.sqrt(0.5), abs=2e-3)
    assert analyze.paired_ci([0.2]) == (0.2, None, None)


# --- control and calibrate ---------------------------------------------------------------------

def test_control_writes_the_mask_and_the_lr_scale(tmp_path, capsys):
    write_run(tmp_path, "gac_s16_seed1", steps=40, stepped=lambda s: 0 if s in (3, 7, 20, 40) else 1,
              grad_scale=lambda s: 0.0 if s in (3, 7, 20, 40) else (0.5 if s <= 10 else 1.0))
    mask = tmp_path / "mask.txt"
    analyze.main(["control", "--csv", str(tmp_path / "gac_s16_seed1.csv"), "--mask-out", str(mask)])
    # 4 of 40 skipped; grad_scale: 4 x 0, 8 x 0.5 (steps 1-10 but 3 and 7), 28 x 1 -> 32 / 40, not 1 - p
    assert capsys.readouterr().out.strip() == "skip_rate=0.100000 lr_scale=0.800000"
    assert mask.read_text() == "3\n7\n20\n40\n"


def test_control_without_grad_scale_uses_one_minus_the_skip_rate(tmp_path, capsys):
    write_run(tmp_path, "gac_s16_seed2", steps=20, stepped=lambda s: 0 if s % 4 == 0 else 1)
    mask = tmp_path / "mask.txt"
    analyze.main(["control", "--csv", str(tmp_path / "gac_s16_seed2.csv"), "--mask-out", str(mask)])
    assert capsys.readouterr().out.strip() == "skip_rate=0.250000 lr_scale=0.750000"
    assert mask.read_text().split() == ["4", "8", "12", "16", "20"]


def test_calibrate_caps_c_high_and_records_its_seeds(tmp_path):
    # steps 51-150: |c| = k / 250, k = 1..100 in each run (one positive, one negative); steps <= 50: 0.99,
    # which must not count. The window column is a tenth of it.
    for seed, sign in ((101, 1), (102, -1)):
        c = lambda s, sign=sign: 0.99 if s <= 50 else sign * (s - 50) / 250
        write_run(tmp_path, f"grpo_s0_seed{seed}", steps=150, accs=[0.5] * 7, cosine=c,
                  window=lambda s, c=c: 0.1 * c(s))
    write_run(tmp_path, "grpo_s16_seed1", steps=150, accs=[0.5] * 7, cosine=lambda s: 0.97)  # not calibration
    out = tmp_path / "calibration.txt"
    analyze.main(["calibrate", "--runs", str(tmp_path), "--out", str(out)])
    cal = analyze.read_calibration(out)
    # pooled 200 values, each k / 250 twice: q0.9 at position 179.1 -> 0.36 + 0.1 x 0.004
    assert cal["c_q90"] == pytest.approx(0.3604, abs=1e-5)
    assert cal["c_low"] == pytest.approx(0.3604, abs=1e-5)
    assert cal["c_max"] == pytest.approx(0.4, abs=1e-6)
    assert cal["c_high"] == 0.95  # min(3 x 0.4, 0.95)
    assert cal["window_max"] == pytest.approx(0.04, abs=1e-6)
    assert cal["window_c_high"] == pytest.approx(0.12, abs=1e-5)  # 3 x 0.04, under the cap
    assert cal["window_c_low"] == pytest.approx(0.03604, abs=1e-5)
    assert (cal["runs"], cal["steps"], cal["seeds"]) == (2, 200, "101,102")
    assert analyze.calibration_seeds(cal) == {101, 102}
    for key in ("c_low", "c_high", "window_c_low", "window_c_high"):  # what experiment.sh reads
        assert any(line.startswith(key + "=") for line in out.read_text().splitlines())


# --- report end to end -----------------------------------------------------------------------

def test_report_tables_and_csvs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    rising = [min(0.4 + 0.03 * i, 0.7) for i in range(1, 21)]
    fallen = rising[:10] + [0.2] * 10
    write_run(runs, "grpo_s0_seed101", cosine=lambda s: 0.2)  # a calibration seed: left out
    for seed in (1, 2, 3):
        write_run(runs, f"grpo_s0_seed{seed}", accs=rising, cosine=lambda s: 0.2)
        write_run(runs, f"grpo_s16_seed{seed}", accs=fallen if seed != 3 else rising,
                  cosine=lambda s: 0.9 if s >= 150 else 0.3, kl=lambda s: 0.05 if s > 1 else 0.0)
        gain = 0.01 * seed
        write_run(runs, f"gac_s16_seed{seed}", accs=[a + gain for a in rising], cosine=lambda s: 0.5,
                  stepped=lambda s: 0 if s % 10 == 0 else 1, grad_scale=lambda s: 0.0 if s % 10 == 0 else 0.9,
                  lag=lambda s: 3)
        for c in ("rskip", "mskip", "lrs"):
            write_run(runs, f"{c}-gac_s16_seed{seed}", accs=fallen, cosine=lambda s: 0.9)
    cal = tmp_path / "calibration.txt"
    cal.write_text("c_low=0.5\nc_high=0.8\nwindow_c_low=0.5\nwindow_c_high=0.8\nruns=1\nsteps=350\nseeds=101\n")
    out = tmp_path / "out"
    analyze.main(["report", "--runs", str(runs), "--calibration", str(cal), "--out", str(out), "--no-plots"])
    summary = (out / "summary.md").read_text()
    with open(out / "results.csv") as f:
        results = list(csv.DictReader(f))
    assert len(results) == 3 * 6 and not any(r["seed"] == "101" for r in results)
    by = {(r["variant"], r["staleness"], r["seed"]): r for r in results}
    assert by[("grpo", "16", "1")]["outcome"] == "collapsed" and by[("grpo", "16", "1")]["collapse"] == "220"
    assert by[("grpo", "16", "3")]["outcome"] == "learned"
    assert float(by[("gac", "16", "1")]["skip_rate"]) == pytest.approx(0.1)
    assert float(by[("gac", "16", "1")]["grad_scale"]) == pytest.approx(0.81)
    assert float(by[("gac", "16", "1")]["lag"]) == pytest.approx(3.0)
    assert "| 16 | grpo | 3 |" in summary and "| 2 / 0 / 1 |" in summary

    with open(out / "comparisons.csv") as f:
        comps = list(csv.DictReader(f))
    final = {(r["row"], r["reference"]): r for r in comps if r["metric"] == "final" and r["staleness"] == "16"}
    assert set(final) == {("gac", "grpo"), ("gac", "rskip-gac"), ("gac", "mskip-gac"), ("gac", "lrs-gac")}
    m = final[("gac", "mskip-gac")]
    assert m["n"] == "3" and (m["row_collapsed"], m["reference_collapsed"]) == ("0", "3")
    assert float(m["mean"]) == pytest.approx(0.72 - 0.2, abs=1e-4)
    assert m["verdict"] == "row better"
    # m = 4 in the final table: the four comparisons at s = 16 (no gac run at s = 0)
    assert {r["m"] for r in comps if r["metric"] == "final"} == {"4"}
    assert "Bonferroni: m = 4 comparisons" in summary

    with open(out / "detectors.csv") as f:
        det = list(csv.DictReader(f))
    pools = {r["pool"] for r in det}
    assert len(pools) == 2
    base = {(r["signal"], r["rule"]): r for r in det if r["pool"].startswith("base")}
    # 6 runs (grpo at s = 0 and 16, seeds 1-3), 2 collapsed: every count sums to 6, never the 9 controls
    for r in base.values():
        assert int(r["tp"]) + int(r["fp"]) + int(r["fn"]) + int(r["tn"]) == 6
    assert (base[("kl10", "null")]["tp"], base[("kl10", "null")]["fp"], base[("kl10", "null")]["at_first_eligible"]) \
        == ("2", "1", "3")
    # stale from step 51 (|c| = 0.3 < c_low until step 150): level and rise agree on the rise at 150 for |c|
    assert base[("c", "level")]["leads"] == "70 70" and base[("c", "rise")]["leads"] == "70 70"
    assert ("kl10", "level") not in base  # no kl10_max in this calibration: no level rule


# --- the held-out replication's controls and contrasts -------------------------------------

def test_the_block_permuted_mask_keeps_the_count_and_the_run_lengths():
    import random
    skipped = [3, 4, 5, 20, 21, 90, 150, 151, 152, 153, 399, 400]
    before = analyze.mask_runs(skipped, 400)
    seen = set()
    for seed in range(20):
        out = analyze.block_permuted_mask(skipped, 400, random.Random(seed))
        after = analyze.mask_runs(out, 400)
        assert sorted(n for v, n in after if v) == sorted(n for v, n in before if v)
        assert sorted(n for v, n in after if not v) == sorted(n for v, n in before if not v)
        assert len(out) == len(skipped) and len(set(out)) == len(out) and all(1 <= s <= 400 for s in out)
        seen.add(tuple(out))
    assert len(seen) > 10  # the timing is not kept
    assert analyze.block_permuted_mask([], 400, random.Random(0)) == []


def test_the_count_per_block_mask_keeps_each_blocks_count():
    import random
    skipped = [1, 2, 3, 49, 50, 51, 120, 399]
    for seed in range(10):
        out = analyze.count_per_block_mask(skipped, 400, 50, random.Random(seed))
        for first in range(1, 401, 50):
            assert sum(first <= s < first + 50 for s in out) == sum(first <= s < first + 50 for s in skipped)
        assert len(set(out)) == len(out)


def test_holm_against_hand_computed_values():
    # p sorted 0.01, 0.02, 0.04 (m = 3): 0.03, max(0.03, 0.04) = 0.04, max(0.04, 0.04) = 0.04.
    assert analyze.holm([0.04, 0.01, None, 0.02]) == [pytest.approx(0.04), pytest.approx(0.03), None,
                                                      pytest.approx(0.04)]
    assert analyze.holm([0.5, 0.6]) == [pytest.approx(1.0), pytest.approx(1.0)]


def test_the_paired_t_p_value_against_the_t_distribution():
    # diffs 1, 2, 3: mean 2, sd 1, t = 2 sqrt(3) = 3.4641 with 2 df: two-sided p = 0.07418.
    assert analyze.paired_t_p([1.0, 2.0, 3.0]) == pytest.approx(0.07418, abs=5e-5)
    assert analyze.paired_t_p([1.0]) is None


def test_replicate_end_to_end(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    # gac better than grpo by 0.1 on every seed (a little noise): C1 replicates at s = 16; nothing else runs.
    for seed in range(201, 209):
        noise = 0.01 * ((seed * 7) % 5)
        write_run(str(runs), f"grpo_s16_seed{seed}", accs=[0.5 + noise] * 20)
        write_run(str(runs), f"gac_s16_seed{seed}", accs=[0.6 + noise + 0.002 * (seed % 3)] * 20)
    analyze.main(["replicate", "--runs", str(runs), "--out", str(tmp_path / "out")])
    rows = {(r["contrast"], int(r["s"])): r for r in csv.DictReader(open(tmp_path / "out" / "replication.csv"))}
    assert len(rows) == 16
    assert rows[("C1", 16)]["verdict"] == "replicates" and int(rows[("C1", 16)]["n"]) == 8
    assert float(rows[("C1", 16)]["mean"]) == pytest.approx(0.1 + 0.002 * sum(s % 3 for s in range(201, 209)) / 8)
    assert rows[("C2", 16)]["verdict"] == "n < 2" and rows[("C1", 32)]["n"] == "0"
    assert "| C1 | 16 | gac − grpo | 8 |" in (tmp_path / "out" / "replication.md").read_text()


def test_control_prints_its_first_line_alone_and_the_drift_on_a_line_of_its_own(tmp_path, capsys):
    # scripts/demo_run.sh and experiment.sh read "skip_rate=... lr_scale=..." as a whole line.
    path = tmp_path / "gac_s4_seed1.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "stepped", "grad_scale", "drift"])
        for s in range(1, 11):
            w.writerow([s, 0 if s in (3, 4) else 1, "0" if s in (3, 4) else "1", f"{0.1 * s:.3f}"])
    analyze.main(["control", "--csv", str(path), "--mask-out", str(tmp_path / "m.txt")])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["skip_rate=0.200000 lr_scale=0.800000", "drift=0.55"]
    assert (tmp_path / "m.txt").read_text() == "3\n4\n"


def _spike_run(path, injected, spikes, endpoint_acc, steps=60, skipped=()):
    """A gac_grpo CSV with the columns examples/grpo/spikes.py reads, and its finished log. spikes: steps gac's
    guard called spikes (regime spike); skipped: steps skipped otherwise (stepped 0: OLMo-core's rule)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "heldout_acc", "loss", "grad_norm", "regime", "stepped", "injected"])
        for s in range(1, steps + 1):
            acc = endpoint_acc if s % 10 == 0 else ""
            w.writerow([s, acc, 0.5, 1000.0 if s in injected else 1.0, "spike" if s in spikes else "safe",
                        0 if s in spikes or s in skipped else 1, 1 if s in injected else 0])
    Path(str(path)[:-4] + ".log").write_text("summary: run=x\n")


def test_spikes_counts_recall_precision_false_skips_and_paired_differences(tmp_path):
    _spec2 = importlib.util.spec_from_file_location("gac_grpo_spikes", SOURCE_DIR / "examples" / "grpo" / "spikes.py")
    spikes = importlib.util.module_from_spec(_spec2)
    _spec2.loader.exec_module(spikes)
    runs = tmp_path / "runs"
    runs.mkdir()
    for seed, clean_acc in ((1, 0.6), (2, 0.7)):
        _spike_run(runs / f"clean_clip1_s0_seed{seed}.csv", set(), set(), clean_acc)
        _spike_run(runs / f"cleanguard_clip1_s0_seed{seed}.csv", set(), {40} if seed == 2 else set(), clean_acc)
        _spike_run(runs / f"inj_clip1_s0_seed{seed}.csv", {20, 30}, set(), clean_acc - 0.3)
        # seed 1 catches both and one more; seed 2 misses step 30.
        _spike_run(runs / f"injguard_clip1_s0_seed{seed}.csv", {20, 30}, {20, 30, 50} if seed == 1 else {20},
                   clean_acc - 0.01)
        # OLMo-core's rule in the trainer: catches both in each seed, one false skip in seed 1's clean run.
        _spike_run(runs / f"injolmo_clip1_s0_seed{seed}.csv", {20, 30}, set(), clean_acc - 0.02, skipped={20, 30})
        _spike_run(runs / f"cleanolmo_clip1_s0_seed{seed}.csv", set(), set(), clean_acc,
                   skipped={45} if seed == 1 else set())
    assert spikes.main(["--runs", str(runs), "--out", str(tmp_path)]) == 0
    table = (tmp_path / "spikes.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| 1 (default) | 0 | 4 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "3 (0.75)"          # caught 3 of 4 injected
    assert cells[4] == "4 (0.75)"          # 4 spikes called, 3 of them injected
    assert cells[5] == "1 in 2 runs"       # the false skip of cleanguard seed 2
    assert cells[6:9] == ["4 (1.00)", "4 (1.00)", "1 in 2 runs"]  # OLMo-core's rule in the trainer
    acc = next(line for line in table.splitlines() if line.startswith("| 1 (default) | 0 | 0.650 |"))
    cells = [c.strip() for c in acc.strip("|").split("|")]
    assert cells[3].startswith("-0.300 [")  # inj - clean, the same -0.3 for both seeds
    assert cells[4].startswith("-0.010 [")
    assert cells[5].startswith("-0.020 [")  # injolmo - clean
    assert cells[6] == "+0.000 [+0.000, +0.000]"
    with open(tmp_path / "spikes.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and {r["arm"] for r in rows} == {"clean", "cleanguard", "inj", "injguard", "cleanolmo",
                                                            "injolmo"}


def test_fisher_exact_against_hand_computed_values():
    # 0/5 against 3/5 collapses: margins 5, 5 and 3 of 10; P(0) = P(3) = C(5,3)/C(10,3) = 1/12, the tables
    # no more probable than the observed one are x = 0 and x = 3: p = 1/6.
    assert analyze.fisher_exact_p(0, 5, 3, 2) == pytest.approx(1 / 6)
    # 4/4 against 0/4: P = 1/C(8,4) = 1/70 for each extreme table.
    assert analyze.fisher_exact_p(4, 0, 0, 4) == pytest.approx(2 / 70)
    assert analyze.fisher_exact_p(2, 3, 2, 3) == pytest.approx(1.0)


def _records(arms, seeds, s=16, endpoint=lambda arm, seed: 0.5, drift=lambda arm, seed: 1.0,
             outcome=lambda arm, seed: "learned"):
    return {(a, s, seed): {"endpoint": endpoint(a, seed), "mean_acc": endpoint(a, seed), "outcome": outcome(a, seed),
                           "collapse": 300 if outcome(a, seed) == "collapsed" else None, "skip_rate": 0.0,
                           "drift": drift(a, seed), "sampler_kl": 0.01}
            for a in arms for seed in seeds}


def test_the_lr_control_is_withdrawn_when_its_drift_is_not_matched():
    seeds = range(201, 207)
    better = lambda a, seed: 0.6 + 0.001 * seed % 7 if a == "gacwin" else 0.5
    matched = analyze.replication_rows(_records(["gacwin", "lrs-gacwin"], seeds, endpoint=better))
    c8 = next(r for r in matched if r["contrast"] == "C8" and r["s"] == 16)
    assert c8["drift_ratio"] == pytest.approx(1.0) and c8["verdict"] == "replicates"
    off = analyze.replication_rows(_records(["gacwin", "lrs-gacwin"], seeds, endpoint=better,
                                            drift=lambda a, seed: 1.15 if a == "lrs-gacwin" else 1.0))
    c8 = next(r for r in off if r["contrast"] == "C8" and r["s"] == 16)
    assert c8["verdict"] == "withdrawn (drift ratio 1.15)"


def test_the_contrasts_count_collapses_and_give_fishers_p():
    seeds = range(201, 211)
    rows = analyze.replication_rows(_records(
        ["gac", "grpo"], seeds, outcome=lambda a, seed: "collapsed" if a == "grpo" and seed < 206 else "learned"))
    c1 = next(r for r in rows if r["contrast"] == "C1" and r["s"] == 16)
    assert (c1["collapsed_row"], c1["collapsed_reference"]) == (0, 5)
    assert c1["fisher_p"] == pytest.approx(analyze.fisher_exact_p(0, 10, 5, 5))
    text, _ = analyze.replication_text(_records(["gac", "grpo"], seeds))
    assert "| 16 | gac | 10 | 0.500 ± 0.000 |" in text


def test_the_configured_staleness_null_alarms_in_every_run_at_or_above_16():
    pool = {("grpo", s, seed): make_run(lambda t: 0.1, evals=evals_every_20([0.6] * 20))
            for s in (8, 16, 32) for seed in (1, 2)}
    pool[("grpo", 32, 1)] = make_run(lambda t: 0.1, evals=evals_every_20([0.6] * 15 + [0.1] * 5))
    stats = {k: analyze.series_stats(r) for k, r in pool.items()}
    out = []
    rows = analyze.detector_table(out, pool, stats, {name: 0.5 for name, _ in analyze.SIGNALS}, "test")
    s_row = next(r for r in rows if r[1] == "s")
    # alarmed: the 4 runs at s >= 16; TP / FP / FN / TN = 1 / 3 / 0 / 2.
    assert s_row[4:10] == [4, 4, 1, 3, 0, 2]


DATA = SOURCE_DIR / "examples" / "grpo" / "data"
RESULTS = SOURCE_DIR / "docs" / "RESULTS.md"


def test_the_committed_tables_rebuild_from_the_committed_data(capsys):
    assert analyze.main(["tables", "--check", str(RESULTS)]) == 0, capsys.readouterr().err


def test_a_table_edited_by_hand_fails_the_check(tmp_path, capsys):
    doc = RESULTS.read_text()
    block = next(analyze.BLOCK.finditer(doc))
    body = block.group("body")
    digit = next(i for i, ch in enumerate(body) if ch.isdigit() and i > body.index("\n|"))
    edited = body[:digit] + str((int(body[digit]) + 1) % 10) + body[digit + 1:]
    (tmp_path / "RESULTS.md").write_text(doc.replace(body, edited, 1))
    assert analyze.main(["tables", "--check", str(tmp_path / "RESULTS.md")]) == 1
    assert f"the table {block.group('name')} differs" in capsys.readouterr().err


def data_with_an_edited_row(tmp_path, name, pick, column, delta):
    """A copy of the committed data whose per-run rows `name` have `column` of the first row that pick(row)
    accepts moved by `delta`."""
    import shutil
    data = tmp_path / "data"
    shutil.copytree(DATA, data)
    with open(data / name, newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    i = next(j for j, r in enumerate(rows[1:], 1) if pick(r))
    rows[i][header.index(column)] = repr(float(rows[i][header.index(column)]) + delta)
    with open(data / name, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return data


def emptied(doc, names=None):
    """`doc` with its rebuilt blocks named in `names` (all when None) emptied."""
    return analyze.BLOCK.sub(lambda m: m.group(0) if names is not None and m.group("name") not in names else
                             f"<!-- table {m.group('name')}: rebuilt by analyze.py tables -->\n"
                             f"<!-- end table {m.group('name')} -->", doc)


def test_a_per_run_row_that_the_archive_does_not_give_fails_the_check(tmp_path, capsys):
    data = data_with_an_edited_row(tmp_path, "replication-runs.csv", lambda r: True, "endpoint",
                                   0.01)  # one run's endpoint
    assert analyze.main(["tables", "--data", str(data), "--check", str(RESULTS)]) == 1
    assert "replication-runs.csv differs" in capsys.readouterr().err


def test_write_fills_empty_blocks_with_exactly_the_checked_tables(tmp_path):
    doc = RESULTS.read_text()
    empty = emptied(doc)
    assert empty != doc
    (tmp_path / "RESULTS.md").write_text(empty)
    assert analyze.main(["tables", "--write", str(tmp_path / "RESULTS.md")]) == 0
    assert (tmp_path / "RESULTS.md").read_text() == doc


# --- the exploratory grid's tables (report's sections, rebuilt from grid-runs.csv) -----------

GRID_BLOCKS = ["grid-thresholds", "grid-outcomes", "grid-final", "grid-paired-final", "grid-paired-mean", "grid-bias",
               "grid-detectors", "grid-detectors-grpo"]


def test_the_grid_tables_from_its_per_run_rows_are_reports_sections(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    rising = [min(0.4 + 0.03 * i, 0.7) for i in range(1, 21)]
    fallen = rising[:10] + [0.2] * 10
    for seed in (1, 2, 3):
        write_run(runs, f"grpo_s0_seed{seed}", accs=rising, cosine=lambda s: 0.2)
        write_run(runs, f"grpo_s16_seed{seed}", accs=fallen if seed != 3 else rising,
                  cosine=lambda s: 0.9 if s >= 150 else 0.3, kl=lambda s: 0.05 if s > 1 else 0.0)
        write_run(runs, f"gac_s16_seed{seed}", accs=[a + 0.0005 * seed for a in rising], cosine=lambda s: 0.5,
                  stepped=lambda s: 0 if s % 10 == 0 else 1, grad_scale=lambda s: 0.0 if s % 10 == 0 else 0.9,
                  lag=lambda s: 3)
        write_run(runs, f"mskip-gac_s16_seed{seed}", accs=fallen, cosine=lambda s: 0.9)
    cal = tmp_path / "calibration.txt"
    cal.write_text("c_low=0.5\nc_high=0.8\nwindow_c_low=0.5\nwindow_c_high=0.8\nruns=1\nsteps=350\nseeds=101\n")
    out = tmp_path / "out"
    analyze.main(["report", "--runs", str(runs), "--calibration", str(cal), "--out", str(out), "--no-plots"])
    ms = analyze.read_grid_runs(out / "grid-runs.csv")
    assert len(ms) == 12 and ms[("gac", 16, 2)]["skip_rate"] == pytest.approx(0.1)
    assert ms[("grpo", 16, 1)]["outcome"] == "collapsed" and ms[("grpo", 16, 1)]["collapse"] == 220
    # every section of summary.md, in its order, from the per-run rows (the detectors from the runs themselves)
    cal_values = analyze.read_calibration(cal)
    texts = [analyze.thresholds_text(cal_values, analyze.grid_axes(ms)[1]), analyze.outcome_text(ms),
             analyze.final_text(ms)]
    texts += [analyze.paired_text(ms, metric, label)[0] for metric, label in analyze.PAIRED_METRICS]
    texts += [analyze.bias_text(ms)]
    texts += analyze.detector_texts(analyze.load_all(str(runs)), cal_values)[0]
    assert "".join(t + "\n" for t in texts) == (out / "summary.md").read_text()


@pytest.mark.parametrize("name", ["grid-outcomes", "grid-final", "grid-paired-final", "grid-paired-mean", "grid-bias",
                                  "grid-detectors", "grid-detectors-grpo"])
def test_a_grid_table_edited_by_hand_fails_the_check(name, tmp_path, capsys):
    doc = RESULTS.read_text()
    body = {m.group("name"): m.group("body") for m in analyze.BLOCK.finditer(doc)}[name]
    digit = next(i for i, ch in enumerate(body) if ch in "0123456789" and i > body.index("\n|"))
    edited = body[:digit] + str((int(body[digit]) + 1) % 10) + body[digit + 1:]
    (tmp_path / "RESULTS.md").write_text(doc.replace(body, edited, 1))
    assert analyze.main(["tables", "--check", str(tmp_path / "RESULTS.md")]) == 1
    err = capsys.readouterr().err
    assert f"the table {name} differs" in err and err.count(" differs ") == 1


# One run's final accuracy in the grid's and the pilot's committed rows: the
# rows no longer match their archive, and the table built from them differs.
@pytest.mark.parametrize("name, pick, delta, archive, table", [
    ("grid-runs.csv", lambda r: r[:3] == ["grpo", "16", "1"], 0.01, "grid.tar.xz", "grid-final"),
    ("pilot-runs.csv", lambda r: r[1] == "0" and r[2] == "1", 0.1, "pilot.tar.xz", "pilot"),
], ids=["grid", "pilot"])
def test_an_edited_run_row_fails_the_check(tmp_path, capsys, name, pick, delta, archive, table):
    data = data_with_an_edited_row(tmp_path, name, pick, "final", delta)
    assert analyze.main(["tables", "--data", str(data), "--check", str(RESULTS)]) == 1
    err = capsys.readouterr().err
    assert f"{name} differs from the rows rebuilt from {archive}" in err
    assert f"the table {table} differs" in err  # the tables are built from the committed rows


def test_write_fills_the_empty_grid_blocks_with_exactly_the_checked_tables(tmp_path, capsys):
    doc = RESULTS.read_text()
    found = [m.group("name") for m in analyze.BLOCK.finditer(doc)]
    assert all(name in found for name in GRID_BLOCKS)
    empty = emptied(doc, GRID_BLOCKS)
    assert empty != doc
    (tmp_path / "RESULTS.md").write_text(empty)
    assert analyze.main(["tables", "--check", str(tmp_path / "RESULTS.md")]) == 1
    assert analyze.main(["tables", "--write", str(tmp_path / "RESULTS.md")]) == 0
    assert (tmp_path / "RESULTS.md").read_text() == doc
    assert analyze.main(["tables", "--check", str(tmp_path / "RESULTS.md")]) == 0


# --- the configuration pilot's table (rebuilt from pilot-runs.csv and pilot.tar.xz) -----------

def write_pilot_runs_dir(runs, names):
    """Runs of each candidate at s = 0 (learns) and s = 16 (seed 1 collapses), seeds 1 and 2, with the log lines
    the pilot reads (parameters, cpu_s); written in the order of `names`, each a second later than the last."""
    rising = [min(0.4 + 0.03 * i, 0.7) for i in range(1, 21)]
    fallen = rising[:10] + [0.2] * 10
    t = 1_000_000
    for n in names:
        for s in (0, 16):
            for seed in (1, 2):
                name = f"{n}_s{s}_seed{seed}"
                write_run(str(runs), name, accs=fallen if (s, seed) == (16, 1) else rising,
                          cosine=lambda step, s=s: 0.6 if s else 0.2)
                with open(runs / f"{name}.log") as f:
                    log = f.read()
                log = log.replace("summary: ", "gac_grpo: run x, 26122 parameters, lr 0.001\nsummary: ")
                (runs / f"{name}.log").write_text(log.rstrip("\n") + f" cpu_s={10 + seed}.0\n")
                for ext in ("csv", "log"):
                    os.utime(runs / f"{name}.{ext}", (t, t))
                t += 1


def test_the_pilot_rows_follow_the_job_list_not_the_file_times(tmp_path, capsys):
    runs = tmp_path / "pilot"
    runs.mkdir()
    # written (and timed) b, c, a; the job list says c, a; b is a run of an earlier job list
    write_pilot_runs_dir(runs, ["b-cand", "c-cand", "a-cand"])
    jobs = tmp_path / "pilot-jobs.txt"
    jobs.write_text("".join(f"{n}_s{s}_seed{seed} --prompts 32 --staleness {s} --seed {seed}\n"
                            for n in ("c-cand", "a-cand") for s in (0, 16) for seed in (1, 2)))
    assert analyze.main(["pilot", "--runs", str(runs), "--out", str(tmp_path / "out")]) is None  # RUNS/../pilot-jobs.txt
    text = (tmp_path / "out" / "pilot.md").read_text()
    assert capsys.readouterr().out == text
    rows = [line.split(" | ")[0].lstrip("| ") for line in text.splitlines()[2:]]
    assert rows == ["c-cand", "a-cand", "b-cand"]
    assert "| c-cand | 26,122 | 0.400 ± 0.000 → 0.700 ± 0.000 | 0.400 ± 0.000 → 0.450 ± 0.354 | 0/2 / 1/2 |" in text
    assert text.splitlines()[2].endswith("| 0.20 / 0.60 | - / - | 12 |")
    # the table the tables subcommand builds from the per-run rows is the one pilot printed
    assert analyze.pilot_text(analyze.read_pilot_runs(tmp_path / "out" / "pilot-runs.csv")) == text
    # the file times do not matter; without a job list the candidates go by name
    for i, p in enumerate(sorted(runs.iterdir(), reverse=True)):
        os.utime(p, (i, i))
    assert list(analyze.load_pilot(str(runs), str(jobs))) == list(analyze.load_pilot(str(runs), str(jobs)))
    assert [k[0] for k in analyze.load_pilot(str(runs), str(jobs))][::4] == ["c-cand", "a-cand", "b-cand"]
    assert [k[0] for k in analyze.load_pilot(str(runs), None)][::4] == ["a-cand", "b-cand", "c-cand"]


def test_the_committed_pilot_table_follows_its_job_list(tmp_path):
    analyze.extract(str(DATA / "pilot.tar.xz"), str(tmp_path))
    order = analyze.pilot_candidates(str(tmp_path / "jobs.txt"))
    assert len(order) >= 2
    records = analyze.read_pilot_runs(DATA / "pilot-runs.csv")
    assert list(dict.fromkeys(k[0] for k in records)) == order
    doc = RESULTS.read_text()
    body = {m.group("name"): m.group("body") for m in analyze.BLOCK.finditer(doc)}["pilot"]
    assert [line.split(" | ")[0].lstrip("| ") for line in body.splitlines()[2:]] == order


def test_a_pilot_table_edited_by_hand_fails_the_check(tmp_path, capsys):
    doc = RESULTS.read_text()
    body = {m.group("name"): m.group("body") for m in analyze.BLOCK.finditer(doc)}["pilot"]
    digit = next(i for i, ch in enumerate(body) if ch in "0123456789" and i > body.index("\n|"))
    edited = body[:digit] + str((int(body[digit]) + 1) % 10) + body[digit + 1:]
    (tmp_path / "RESULTS.md").write_text(doc.replace(body, edited, 1))
    assert analyze.main(["tables", "--check", str(tmp_path / "RESULTS.md")]) == 1
    err = capsys.readouterr().err
    assert "the table pilot differs" in err and err.count(" differs ") == 1
    # rows swapped: the same numbers in another order fail too
    lines = body.splitlines(keepends=True)
    (tmp_path / "RESULTS.md").write_text(doc.replace(body, "".join(lines[:2] + lines[2:][::-1]), 1))
    assert analyze.main(["tables", "--check", str(tmp_path / "RESULTS.md")]) == 1
    assert "the table pilot differs" in capsys.readouterr().err


def test_write_fills_the_empty_pilot_block_with_exactly_the_checked_table(tmp_path, capsys):
    doc = RESULTS.read_text()
    empty = emptied(doc, ["pilot"])
    assert empty != doc
    (tmp_path / "RESULTS.md").write_text(empty)
    assert analyze.main(["tables", "--check", str(tmp_path / "RESULTS.md")]) == 1
    assert analyze.main(["tables", "--write", str(tmp_path / "RESULTS.md")]) == 0
    assert (tmp_path / "RESULTS.md").read_text() == doc


# The second registered design, as committed before any of its runs
# (docs/RESULTS.md, "Second registered experiment: pre-registered design"):
# never edited after; a change to it fails here, and a departure goes in
# its results' section instead.
SECOND_DESIGN_SHA256 = "1858f144c73f61884da2c5b7aec5acfa9b11ae26907ec13f17492e21cbdb16ea"


def test_the_second_registered_design_is_unchanged():
    import hashlib

    text = RESULTS.read_text(encoding="utf-8")
    start = text.index("## Second registered experiment: pre-registered design")
    section = text[start:text.index("\n## ", start) + 1]
    assert hashlib.sha256(section.encode("utf-8")).hexdigest() == SECOND_DESIGN_SHA256


# The second design's burst schedule (part A): rate, run lengths, the walk, the seed rule.

def test_burst_statistics_pool_the_runs_of_skips():
    # Two runs: skips {2,3,7} of 10 steps (runs 2, 1), {1,2,3} of 5 (a run of 3).
    p, lengths = analyze.burst_statistics([([2, 3, 7], 10), ([1, 2, 3], 5)])
    assert p == 6 / 15 and lengths == [1, 2, 3]


def test_a_burst_mask_has_the_lengths_and_the_rate():
    import random

    lengths = [1, 1, 2, 5, 9]
    mask = analyze.burst_mask(0.13, lengths, 200_000, random.Random(7))
    runs = [n for v, n in analyze.mask_runs(mask, 200_000) if v]
    # Bursts are separated by at least one update, so the mask's runs are the bursts, each of a length in L
    # (the last one may be cut by the end).
    assert set(runs[:-1]) <= set(lengths)
    assert abs(len(mask) / 200_000 - 0.13) < 0.005
    # Their lengths follow L: each length drawn about as often as it appears in L.
    for n in set(lengths):
        share = runs.count(n) / len(runs)
        assert abs(share - lengths.count(n) / len(lengths)) < 0.01, n


def test_a_burst_mask_is_its_seeds_and_reads_nothing_else():
    import random

    a = analyze.burst_mask(0.2, [3, 1, 2], 400, random.Random(100 * 1001 + 16 + 50))
    b = analyze.burst_mask(0.2, [1, 2, 3], 400, random.Random(100 * 1001 + 16 + 50))
    assert a == b and a != analyze.burst_mask(0.2, [1, 2, 3], 400, random.Random(100 * 1002 + 16 + 50))
    assert analyze.burst_mask(0.0, [1, 2], 400, random.Random(1)) == []
    assert analyze.burst_mask(0.2, [], 400, random.Random(1)) == []
    assert max(a) <= 400
    with pytest.raises(ValueError):
        analyze.burst_mask(1.0, [1], 10, random.Random(1))


def test_the_burst_command_writes_a_mask_per_seed(tmp_path):
    runs = []
    for k, skipped in enumerate([{5, 6, 7, 20}, {3, 4, 30, 31, 32}]):
        path = tmp_path / f"gac{k}.csv"
        path.write_text("step,stepped\n" + "".join(f"{t},{0 if t in skipped else 1}\n" for t in range(1, 41)))
        runs.append(str(path))
    import random

    out = tmp_path / "masks"
    analyze.main(["burst", "--csv", *runs, "--staleness", "16", "--seeds", "1001-1003", "--steps", "40",
                  "--out", str(out)])
    for seed in (1001, 1002, 1003):
        got = [int(x) for x in (out / f"burst_s16_seed{seed}.txt").read_text().split()]
        assert got == analyze.burst_mask(9 / 80, [1, 2, 3, 3], 40, random.Random(100 * seed + 16 + 50))
