"""examples/grpo/exp2_guard.py (part D of the second registered experiment)
on synthetic runs whose answers are known by construction: n-bar and the
natural spikes (a hand-made norm series, against a brute-force reference
and hand values), the stand-in of OLMo-core's rule against a hand
computation (and against the class itself where olmo_core is importable),
the per-run counts and McNemar's pairing on steps, Holm over the 12 tests of
family D, the caught / missed / partly caught bounds, the rates, the
accuracy pairs, the CLI end to end (with gacctl backtest where built), and
one tiny real trainer run for the fault's consistency. Standard library and
pytest only."""

import csv
import importlib.util
import math
import os
import random
import statistics
import subprocess
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))
_spec = importlib.util.spec_from_file_location("gac_exp2_guard", SOURCE_DIR / "examples" / "grpo" / "exp2_guard.py")
guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guard)

KS = (2, 3, 5, 10, 30)


# --- references written here, by another route than the module's -------------------------------

def brute_means(norms, injected, window=128):
    """n-bar per step by slicing the whole past each time."""
    out = []
    for i in range(len(norms)):
        past = [norms[j] for j in range(i) if not injected[j] and math.isfinite(norms[j])][-window:]
        out.append(math.fsum(past) / len(past) if past else None)
    return out


def brute_natural(norms, injected, k, first=65):
    means = brute_means(norms, injected)
    return {i + 1 for i in range(len(norms))
            if i + 1 >= first and not injected[i] and means[i] is not None and norms[i] >= k * means[i]}


def brute_olmo(losses, norms, sigma=6.0, window=128):
    """OLMo-core's rule from its definition, with statistics.mean / stdev over list slices."""
    skipped = set()
    for i in range(len(norms)):
        if i + 1 < max(2, window // 2):
            continue
        lo = max(0, i - window)
        hit = False
        for series in (losses, norms):
            before = series[lo:i]
            sd = statistics.stdev(before) if len(before) > 1 else math.nan
            hit = hit or not (series[i] - statistics.mean(before) <= sigma * sd)
        if hit:
            skipped.add(i + 1)
    return skipped


def mcnemar_reference(b, c):
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


# --- synthetic runs ------------------------------------------------------------------------------

def write_run(runs, name, norms, losses=None, injected=None, spikes=(), accs=None, finished=True, factors=None,
              gac_skips=()):
    """RUNS/<name>.csv with the archive's columns (step, heldout_acc, loss, grad_norm, regime, stepped,
    injected, inject_factor) and its .log; `spikes`: the steps the guard called spikes; `gac_skips`: steps
    GAC itself skipped (regime "skip", not the guard's)."""
    n = len(norms)
    losses = losses or [0.5] * n
    injected = injected or [False] * n
    accs = accs or [0.5] * (n // 20)
    with open(os.path.join(runs, name + ".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "heldout_acc", "loss", "grad_norm", "regime", "stepped", "injected", "inject_factor"])
        for i in range(n):
            t = i + 1
            factor = (factors[i] if factors else ("2.5" if injected[i] else ""))
            regime = "spike" if t in spikes else "skip" if t in gac_skips else "safe"
            w.writerow([t, f"{accs[t // 20 - 1]:.4f}" if t % 20 == 0 else "", repr(losses[i]), repr(norms[i]),
                        regime, int(regime == "safe"), int(injected[i]), factor])
    with open(os.path.join(runs, name + ".log"), "w") as f:
        f.write("supervised warm-up: 600 steps, cross-entropy 0.4600, held-out accuracy 0.3000\n")
        if finished:
            f.write(f"summary: run={name} heldout_acc={accs[-1]:.4f} cpu_s=1.0\n")


def base_norms(n=400):
    """1.0 and 1.25 alternating: a series with a positive sd, exact in binary."""
    return [1.0 if t % 2 else 1.25 for t in range(1, n + 1)]


def make_row(arm, s, seed, **fields):
    row = {k: None for k in guard.ROW_KEYS}
    row.update(arm=arm, staleness=s, seed=seed, k=guard.arm_k(arm), status="finished", steps=400, injected=0,
               guard_skips=0, guard_caught=0, olmo_skips=0, olmo_caught=0, inj_guard_only=0, inj_olmo_only=0,
               clean_guard_only=0, clean_olmo_only=0, olmo_judge="stand-in", consistent=0, factor_bad=0)
    for k in KS:
        row.update({f"natural_{k}": 0, f"natural_{k}_guard": 0, f"natural_{k}_olmo": 0})
    row.update(fields)
    return row


# --- n-bar and natural spikes --------------------------------------------------------------------

def hand_series():
    """400 steps of norm 1.0; injected 70, 150, 151, 300 (norm 500); step 60: 40 (before 65), 68: 20,
    100: 3.0, 200: 10.2, 390: 2.0."""
    norms = [1.0] * 400
    injected = [False] * 400
    for t in (70, 150, 151, 300):
        norms[t - 1], injected[t - 1] = 500.0, True
    for t, v in ((60, 40.0), (68, 20.0), (100, 3.0), (200, 10.2), (390, 2.0)):
        norms[t - 1] = v
    return norms, injected


def test_n_bar_is_the_mean_of_the_last_128_steps_not_injected():
    norms, injected = hand_series()
    means = guard.recent_means(norms, injected)
    ref = brute_means(norms, injected)
    assert means[0] is None and ref[0] is None
    for m, r in zip(means[1:], ref[1:]):
        assert m == pytest.approx(r, rel=1e-12)
    assert means[1] == 1.0                                         # one step of history
    assert means[67] == pytest.approx((66 + 40.0) / 67)            # step 68: all 67 earlier steps (< 128)
    assert means[99] == pytest.approx((96 + 40.0 + 20.0) / 98)     # step 100: 99 earlier, step 70 injected
    # Step 200: the 128 latest steps not injected are 69, 71..149, 152..199 (60 and 68 have left; 150, 151 are
    # injected): 127 ones and step 100's 3.0.
    assert means[199] == pytest.approx(130.0 / 128.0)
    assert means[389] == 1.0                                       # step 390: 261..299, 301..389


def test_natural_spikes_by_hand():
    norms, injected = hand_series()
    means = guard.recent_means(norms, injected)
    got = {k: guard.natural_spikes(list(range(1, 401)), norms, injected, means, k) for k in KS}
    # 60: before 65. 68: 20 / (106 / 67) = 12.6. 100: 3 / (156 / 98) = 1.88. 200: 10.2 / (130 / 128) = 10.04.
    # 390: 2.0 / 1.0 exactly (>=). Injected steps never.
    assert got == {2: {68, 200, 390}, 3: {68, 200}, 5: {68, 200}, 10: {68, 200}, 30: set()}
    for k in KS:
        assert got[k] == brute_natural(norms, injected, k)


def test_natural_spikes_start_at_step_65():
    norms = [1.0] * 100
    norms[63], norms[64] = 3.0, 5.0          # step 64: 3 x n-bar, too early; step 65: 5 / (66 / 64) = 4.85
    injected = [False] * 100
    means = guard.recent_means(norms, injected)
    steps = list(range(1, 101))
    assert guard.natural_spikes(steps, norms, injected, means, 2) == {65}
    assert guard.natural_spikes(steps, norms, injected, means, 3) == {65}
    assert guard.natural_spikes(steps, norms, injected, means, 5) == set()


def test_natural_spikes_of_a_run_read_from_its_csv(tmp_path):
    norms, injected = hand_series()
    runs = tmp_path / "runs"
    runs.mkdir()
    factors = ["2.5" if inj else "" for inj in injected]
    factors[149] = ""                                     # step 150 injected without its factor
    write_run(runs, "injguard-2_s0_seed4001", norms, injected=injected, spikes={68, 70, 200}, factors=factors,
              gac_skips={300, 390})                       # GAC's own skips are not the guard's
    (row,) = guard.collect(str(tmp_path))
    assert row["factor_bad"] == 1
    assert [row[f"natural_{k}"] for k in KS] == [3, 2, 2, 2, 0]
    assert [row[f"natural_{k}_guard"] for k in KS] == [2, 2, 2, 2, 0]   # 68 and 200
    assert row["injected"] == 4 and row["guard_caught"] == 1 and row["guard_skips"] == 3


def test_consistency_counts_injected_norms_k_times_n_bar():
    norms = [1.0 + 0.01 * (t % 5) for t in range(1, 301)]
    injected = [False] * 300
    k = 5.0
    for t, off in ((120, 0.0), (180, 5e-4), (240, 2e-3)):     # relative offsets from k x n-bar
        injected[t - 1] = True
        norms[t - 1] = k * brute_means(norms, injected)[t - 1] * (1.0 + off)
    means = guard.recent_means(norms, injected)
    assert guard.consistent_count(norms, injected, means, k) == 2


def test_factor_cells_wrong():
    injected = [False, True, True, False, True]
    assert guard.factor_bad_count(injected, ["", "2.5", "", "3", "nan"]) == 3
    assert guard.factor_bad_count(injected, ["", "2.5", "1", "", "0.5"]) == 0
    assert guard.factor_bad_count(injected, None) is None


# --- OLMo-core's rule ----------------------------------------------------------------------------

def test_the_stand_in_by_hand():
    rule = guard.OlmoSkipRule(sigma=6.0, window=6)   # held >= 3; the 6 steps before the newest
    losses = [0.5] * 12
    norms = [1.0, 2.0, 3.0, 100.0, 9.0, 2.0, 1.0, 2.0, 3.0, 2.0, 9.0, 1.0]
    got = [rule.skip(lo, n) for lo, n in zip(losses, norms)]
    # step 3: 3 - 1.5 = 1.5 <= 6 x 0.707. step 4: 100 - 2 = 98 > 6 x 1. step 5: 9 against [1, 2, 3, 100]
    # (the skipped step stays: mean 26.5, sd 49) - a rule that dropped it would skip (9 - 2 > 6).
    # step 11: 9 against steps 5..10 [9, 2, 1, 2, 3, 2] (100 has left the 6): mean 3.17, sd 2.93, 9 - 3.17 = 5.8
    # <= 17.6. Constant losses: sd 0 and 0 <= 0, no skip.
    assert got == [False, False, False, True, False, False, False, False, False, False, False, False]
    tight = guard.OlmoSkipRule(sigma=6.0, window=6)
    norms2 = [50.0, 1.0, 1.5, 1.0, 1.5, 1.0, 1.5, 4.0]
    # step 8: before it steps 2..7 [1, 1.5, 1, 1.5, 1, 1.5] (step 1's 50 has left): mean 1.25, sd 0.2739,
    # 2.75 > 1.64; with step 1 still held the mean would be 8.2 and nothing skipped.
    assert [tight.skip(0.5, n) for n in norms2] == [False] * 7 + [True]
    # A window of 4 holds 2 values: one before the newest, whose sample sd is NaN, which skips (as C++ and
    # torch.std do).
    assert guard.OlmoSkipRule(sigma=6.0, window=4).skip(0.5, 1.0) is False
    nan_rule = guard.OlmoSkipRule(sigma=6.0, window=4)
    assert [nan_rule.skip(0.5, 1.0) for _ in range(3)] == [False, True, False]
    # The sample sd (n - 1): before [1, 2, 3] it is 1, so 7.5 (5.5 above the mean) stays and 8.5 is skipped;
    # with the population sd (0.816) 7.5 would be skipped too.
    for newest, skipped in ((7.5, False), (8.5, True)):
        rule = guard.OlmoSkipRule(sigma=6.0, window=6)
        assert [rule.skip(0.5, n) for n in (1.0, 2.0, 3.0, newest)] == [False, False, False, skipped]


def test_the_stand_in_on_a_long_run_against_a_brute_force_reference():
    rng = random.Random(7)
    norms = [abs(rng.gauss(1.0, 0.1)) for _ in range(400)]
    losses = [rng.gauss(0.0, 0.01) for _ in range(400)]
    for t, v in ((80, 2.5), (81, 2.5), (200, 30.0), (201, 1.9), (330, 1.6)):
        norms[t - 1] = v
    losses[250] = 0.5
    steps = [(t, losses[t - 1], norms[t - 1], "safe", False) for t in range(1, 401)]
    want = brute_olmo(losses, norms)
    assert guard.olmo_standin(steps) == want
    assert {80, 200, 251} <= want and 201 not in want


def olmo_core_importable():
    try:
        return importlib.util.find_spec("olmo_core") is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(not olmo_core_importable(), reason="olmo_core not importable")
def test_the_stand_in_skips_exactly_the_class_steps():
    import spikes  # on sys.path: exp2_guard put examples/grpo there
    rng = random.Random(11)
    cases = []
    for case in range(4):
        norms = [abs(rng.gauss(1.0, 0.05 + 0.1 * case)) for _ in range(400)]
        losses = [rng.gauss(0.0, 0.02) for _ in range(400)]
        for t in rng.sample(range(51, 401), 8):
            norms[t - 1] *= rng.choice([2, 3, 5, 10, 30])
        if case == 3:  # a level shift the rules must follow
            norms[200:] = [3 * x for x in norms[200:]]
        cases.append([(t, losses[t - 1], norms[t - 1], "safe", False) for t in range(1, 401)])
    for steps in cases:
        judged = spikes.olmo_verdicts(steps)
        assert judged == guard.olmo_standin(steps)
        assert judged  # something to compare
    skipped, judge, same = guard.olmo_skips(cases[0])
    assert judge.startswith("class") and same == 1


# --- per-run counts and McNemar's pairing -----------------------------------------------------------

def paired_run():
    """Injected: 100 (norm 1.25: only the guard's regime says spike), 200 (norm 100) and 300 (norm 100);
    the guard called 100, 200, 250 and 350 spikes; 350 has norm 3 (a natural spike >= 2)."""
    norms = base_norms()
    injected = [False] * 400
    for t in (100, 200, 300):
        injected[t - 1] = True
    norms[199] = norms[299] = 100.0
    norms[349] = 3.0
    return norms, injected, {100, 200, 250, 350}


def test_counts_and_discordant_steps_of_one_run(tmp_path):
    norms, injected, spikes = paired_run()
    runs = tmp_path / "runs"
    runs.mkdir()
    write_run(runs, "injguard-2_s16_seed4001", norms, injected=injected, spikes=spikes)
    (row,) = guard.collect(str(tmp_path))
    olmo = brute_olmo([0.5] * 400, norms)
    assert olmo == {200, 300}                     # 350 has step 300's 100 in OLMo's history (sd ~8.7)
    assert (row["injected"], row["guard_skips"], row["guard_caught"]) == (3, 4, 2)
    assert (row["olmo_skips"], row["olmo_caught"]) == (2, 2)
    # Per step: 100 guard only, 200 both, 300 OLMo only; 250, 350 guard only among the steps not injected.
    assert (row["inj_guard_only"], row["inj_olmo_only"]) == (1, 1)
    assert (row["clean_guard_only"], row["clean_olmo_only"]) == (2, 0)
    assert row["natural_2"] == 1 and row["natural_2_guard"] == 1 and row["natural_2_olmo"] == 0
    assert row["olmo_judge"] in ("stand-in",) or row["olmo_judge"].startswith("class")
    assert row["steps"] == 400 and row["endpoint"] == pytest.approx(0.5)


def test_mcnemar_pairs_steps_not_run_totals():
    # Both rules catch 2 of the 4 injected steps, but different ones: b = c = 2 (p = 1), not 0 and 0.
    rows = [make_row("injguard-3", 0, 4001, injected=4, guard_caught=2, olmo_caught=2, guard_skips=2, olmo_skips=2,
                     inj_guard_only=2, inj_olmo_only=2)]
    t = next(t for t in guard.family(rows) if t["kind"] == "injected" and t["k"] == 3 and t["s"] == 0)
    assert (t["b"], t["c"], t["p"]) == (2, 2, 1.0)


def twelve_tests_rows(discordant):
    """One run per injguard-k and s, plus a cleanguard run per s; discordant[(k or None, s)] = (b, c)."""
    rows = []
    for s in (0, 16):
        for k in KS:
            b, c = discordant.get((k, s), (0, 0))
            rows.append(make_row(f"injguard-{k}", s, 4001, injected=20, inj_guard_only=b, inj_olmo_only=c))
        b, c = discordant.get((None, s), (0, 0))
        rows.append(make_row("cleanguard", s, 4001, clean_guard_only=b, clean_olmo_only=c))
    return rows


def test_holm_over_the_twelve_tests_of_family_d():
    rows = twelve_tests_rows({(2, 0): (0, 10), (5, 16): (9, 0), (30, 16): (8, 0), (None, 0): (0, 11),
                              (None, 16): (3, 1)})
    tests = guard.family(rows)
    assert len(tests) == 12 and all(t["p"] is not None for t in tests)
    by = {(t["k"], t["s"]): t for t in tests}
    # p: 2 / 2^10, 2 / 2^9, 2 / 2^8, 2 / 2^11; Holm: x12, x11, x10, x9 by rank (running maximum).
    p11, p10, p9, p8 = 2 / 2 ** 11, 2 / 2 ** 10, 2 / 2 ** 9, 2 / 2 ** 8
    assert by[(None, 0)]["holm"] == pytest.approx(12 * p11)
    assert by[(2, 0)]["holm"] == pytest.approx(11 * p10)
    assert by[(5, 16)]["holm"] == pytest.approx(10 * p9)
    assert by[(30, 16)]["holm"] == pytest.approx(9 * p8)       # 0.070 (Bonferroni over 6 would give 0.047)
    assert by[(None, 16)]["p"] == pytest.approx(mcnemar_reference(3, 1))
    assert by[(2, 0)]["verdict"] == "the guard catches fewer 2× spikes than OLMo-core's rule"
    assert by[(5, 16)]["verdict"] == "the guard catches more 5× spikes than OLMo-core's rule"
    assert by[(30, 16)]["verdict"] == "no difference shown"
    assert by[(None, 0)]["verdict"] == "the guard makes fewer false skips than OLMo-core's rule"
    assert by[(None, 16)]["verdict"] == "no difference shown"
    assert "Holm over the 12 tests" in guard.render(rows)["exp2-d-family"]


def test_a_cell_without_runs_leaves_the_family():
    rows = [r for r in twelve_tests_rows({(2, 0): (0, 10)}) if r["staleness"] == 0]
    tests = guard.family(rows)
    assert sum(t["p"] is not None for t in tests) == 6
    t = next(t for t in tests if t["k"] == 2 and t["s"] == 0)
    assert t["holm"] == pytest.approx(6 * 2 / 2 ** 10)
    assert all(t["verdict"] == "no runs: left out of the family" for t in tests if t["s"] == 16)


# --- recall, precision, false skips, natural spikes ----------------------------------------------------

def test_caught_missed_and_partly_caught_by_the_exact_bounds():
    # All caught: CP lower bound 0.025^(1/n), >= 0.90 from n = 36 (n = 35: 0.8999). None caught: upper bound
    # 1 - 0.025^(1/n), < 0.50 from n = 6 (n = 5: 0.522).
    assert 0.025 ** (1 / 36) >= 0.90 > 0.025 ** (1 / 35)
    assert guard.recall_verdict(36, 36) == "caught"
    assert guard.recall_verdict(35, 35) == "partly caught"
    assert guard.recall_verdict(0, 6) == "missed"
    assert guard.recall_verdict(0, 5) == "partly caught"
    assert guard.recall_verdict(0, 0) == "-"


def table_cells(text, first_cells):
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:len(first_cells)] == [str(c) for c in first_cells]:
            return cells
    raise AssertionError(f"no row {first_cells} in\n{text}")


def test_recall_and_precision_pool_the_injguard_runs():
    rows = [make_row("injguard-5", 0, 4001, injected=4, guard_skips=5, guard_caught=3, olmo_skips=2, olmo_caught=2,
                     natural_5_guard=1),
            make_row("injguard-5", 0, 4002, injected=6, guard_skips=3, guard_caught=3, olmo_skips=6, olmo_caught=5),
            make_row("injguard-5", 16, 4001, injected=3, guard_skips=0, guard_caught=0),
            make_row("cleanguard", 0, 4001, guard_skips=7)]
    text = guard.render(rows)["exp2-d-detection"]
    g = table_cells(text, [0, 5, "gac's guard"])
    assert g[3] == "2" and g[4].startswith("6/10: 0.600 [") and g[5] == "partly caught"
    assert g[6].startswith("6/8: 0.750 [") and g[7].startswith("7/8: 0.875 [")
    o = table_cells(text, [0, 5, "OLMo-core's rule (stand-in)"])
    assert o[4].startswith("7/10: 0.700 [") and o[6].startswith("7/8: 0.875 [")
    assert table_cells(text, [16, 5, "gac's guard"])[5] == "partly caught"  # 0 of 3: upper bound 0.708


def test_false_skips_over_all_runs_and_cleanguard_alone():
    rows = [make_row("cleanguard", 0, 4001, steps=400, guard_skips=1, olmo_skips=4),
            make_row("injguard-2", 0, 4001, steps=400, injected=5, guard_skips=8, guard_caught=3, olmo_skips=2,
                     olmo_caught=2)]
    text = guard.render(rows)["exp2-d-false-skips"]
    g = table_cells(text, [0, "gac's guard"])
    # all runs: (1 + 5) / 800 steps = 7.5 per 1,000; two runs: the bootstrap's 2.5 % and 97.5 % points are the
    # two runs' own rates (each drawn twice with probability 1/4): 2.5 and 12.5. cleanguard: 1 / 400.
    assert g[2:5] == ["2", "6", "7.500 [2.500, 12.500]"]
    assert g[5:7] == ["1", "1"] and g[7].startswith("2.500 [2.500, 2.500]")
    o = table_cells(text, [0, "OLMo-core's rule"])
    assert o[3] == "4" and o[4] == "5.000 [0.000, 10.000]"


def test_natural_spikes_per_thousand_steps_and_shares():
    rows = [make_row("cleanguard", 16, 4001, steps=500, natural_3=4, natural_3_guard=1, natural_3_olmo=3),
            make_row("injguard-30", 16, 4001, steps=500, natural_3=2, natural_3_guard=1, natural_3_olmo=0)]
    cells = table_cells(guard.render(rows)["exp2-d-natural"], [16, 3])
    assert cells[2:5] == ["2", "6", "6.000 [4.000, 8.000]"]
    assert cells[5].startswith("2/6: 0.333 [") and cells[6].startswith("3/6: 0.500 [")


# --- accuracy --------------------------------------------------------------------------------------------

def test_accuracy_pairs_by_seed_without_failed_runs():
    rows = [make_row("cleanguard", 0, 4001, endpoint=0.70), make_row("cleanguard", 0, 4002, endpoint=0.60),
            make_row("cleanguard", 0, 4003, endpoint=0.50),
            make_row("injguard-10", 0, 4001, endpoint=0.60), make_row("injguard-10", 0, 4002, endpoint=0.40),
            make_row("injguard-10", 0, 4003, status="failed", endpoint=None)]
    cells = table_cells(guard.render(rows)["exp2-d-accuracy"], [0, "injguard-10"])
    # differences -0.1 and -0.2: mean -0.15, sd 0.0707, t(0.975, 1) = 12.7062: half-width 0.635
    half = 12.7062047 * statistics.stdev([-0.1, -0.2]) / math.sqrt(2)
    assert cells[2:5] == ["2", "0.500", "0.650"]
    assert cells[5] == f"{-0.15:+.3f} [{-0.15 - half:+.3f}, {-0.15 + half:+.3f}]"


# --- the command, end to end -------------------------------------------------------------------------------

def gacctl_path():
    path = os.environ.get("GAC_GACCTL") or str(SOURCE_DIR / "build" / "cli" / "gacctl")
    return path if os.access(path, os.X_OK) else None


def small_root(tmp_path):
    runs = tmp_path / "R" / "runs"
    runs.mkdir(parents=True)
    norms, injected, spikes = paired_run()
    write_run(runs, "injguard-2_s0_seed4001", norms, injected=injected, spikes=spikes)
    write_run(runs, "injguard-2_s0_seed4002", base_norms(), injected=[t in (120, 240) for t in range(1, 401)],
              spikes={120})
    write_run(runs, "cleanguard_s0_seed4001", base_norms(), accs=[0.6] * 20)
    write_run(runs, "cleanguard_s0_seed4002", base_norms(), accs=[0.55] * 20)
    write_run(runs, "cleanguard_s0_seed4003", base_norms(), finished=False)
    write_run(runs, "grpo_s0_seed4001", base_norms())  # another part's arm: ignored
    return tmp_path / "R"


def test_the_command_end_to_end(tmp_path, capsys):
    root = small_root(tmp_path)
    out = tmp_path / "out"
    assert guard.main(["--root", str(root), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "5 runs" in said and "cleanguard_s0_seed4003" in said and "1 CSVs of other arms ignored" in said
    rows = guard.read_rows(out / "exp2-d-runs.csv")
    assert [(r["arm"], r["seed"], r["status"]) for r in rows] == [
        ("cleanguard", 4001, "finished"), ("cleanguard", 4002, "finished"), ("cleanguard", 4003, "failed"),
        ("injguard-2", 4001, "finished"), ("injguard-2", 4002, "finished")]
    for read, fresh in zip(rows, guard.collect(str(root))):  # the rows read back are the rows computed
        assert {k: v for k, v in read.items() if k != "endpoint"} == {k: v for k, v in fresh.items() if k != "endpoint"}
        assert read["endpoint"] == (None if fresh["endpoint"] is None else pytest.approx(fresh["endpoint"], rel=1e-6))
    again = tmp_path / "again.csv"
    guard.write_rows(rows, again)
    assert again.read_text() == (out / "exp2-d-runs.csv").read_text()
    assert guard.read_rows(again) == rows
    text = (out / "exp2-d.md").read_text()
    tables = guard.render(rows)
    assert "exp2-d-backtest" not in tables
    for name, body in tables.items():
        assert f"### {name}\n\n{body}" in text and body.endswith("\n")
        widths = {line.count("|") for line in body.splitlines() if line.startswith("|")}
        assert len(widths) == 1, name  # no cell breaks its table
    assert table_cells(tables["exp2-d-status"], ["cleanguard", 0])[2:5] == ["2", "4003", "4004-4024"]
    assert table_cells(tables["exp2-d-status"], ["injguard-2", 0])[2:5] == ["2", "none", "4003-4024"]
    assert table_cells(tables["exp2-d-status"], ["injguard-30", 16])[2:6] == ["0", "none", "4001-4024", "-"]
    assert guard.seed_ranges([4007, 4001, 4002, 4003, 4009, 4010]) == "4001-4003, 4007, 4009-4010"
    assert table_cells(tables["exp2-d-accuracy"], [0, "injguard-2"])[2] == "2"
    assert table_cells(tables["exp2-d-detection"], [0, 2, "gac's guard"])[4].startswith("3/5: 0.600 [")


def test_a_failed_run_counts_the_steps_it_recorded_and_has_no_endpoint(tmp_path):
    runs = tmp_path / "R" / "runs"
    runs.mkdir(parents=True)
    # 240 steps, then the run failed: injections at 120 (caught) and 200 (missed: the spike that broke it).
    norms = base_norms(240)
    write_run(runs, "injguard-30_s16_seed4005", norms, injected=[t in (120, 200) for t in range(1, 241)],
              spikes={120}, finished=False)
    write_run(runs, "injguard-30_s16_seed4006", base_norms(), injected=[t == 150 for t in range(1, 401)],
              spikes={150})
    rows = {r["seed"]: r for r in guard.collect(str(tmp_path / "R"))}
    failed = rows[4005]
    assert (failed["status"], failed["steps"], failed["endpoint"]) == ("failed", 240, None)
    assert (failed["injected"], failed["guard_caught"], failed["guard_skips"]) == (2, 1, 1)
    tables = guard.render(list(rows.values()))
    # recall over both runs' injected steps: 2 of 3, the failed run's miss included
    assert table_cells(tables["exp2-d-detection"], [16, 30, "gac's guard"])[4].startswith("2/3: 0.667 [")


@pytest.mark.skipif(gacctl_path() is None, reason="gacctl not built (set GAC_GACCTL)")
def test_the_backtest_columns_from_gacctl(tmp_path):
    root = small_root(tmp_path)
    out = tmp_path / "out"
    assert guard.main(["--root", str(root), "--out", str(out), "--gacctl", gacctl_path()]) == 0
    rows = {(r["arm"], r["seed"]): r for r in guard.read_rows(out / "exp2-d-runs.csv")}
    run = rows[("injguard-2", 4001)]
    # Steps 200 and 300 (norm 100 on a 1.0 / 1.25 series) are far beyond 3 to 6 sigma; step 100 (1.25) is not.
    assert all(run[f"bt_caught_{sigma}"] == 2 for sigma in (3, 4, 5, 6))
    assert rows[("cleanguard", 4003)]["bt_spikes_6"] == 0             # failed: replayed on the steps it recorded
    assert all(rows[("cleanguard", 4001)][f"bt_spikes_{sigma}"] == 0 for sigma in (3, 4, 5, 6))
    assert guard.collect(str(root), gacctl_path()) == guard.read_rows(out / "exp2-d-runs.csv")  # endpoints exact here
    text = (out / "exp2-d.md").read_text()
    assert "### exp2-d-backtest" in text
    assert guard.render(guard.read_rows(out / "exp2-d-runs.csv"))["exp2-d-backtest"] in text


# --- one tiny real run ---------------------------------------------------------------------------------------

def trainer_path():
    path = os.environ.get("GAC_GRPO") or str(SOURCE_DIR / "build" / "examples" / "grpo" / "gac_grpo")
    return path if os.access(path, os.X_OK) else None


@pytest.mark.skipif(trainer_path() is None, reason="gac_grpo not built (set GAC_GRPO)")
def test_a_real_run_is_consistent_with_the_fault(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    name = "injguard-3_s0_seed4001"
    with open(runs / f"{name}.log", "w") as log:
        subprocess.run([trainer_path(), "--steps", "120", "--sft-steps", "20", "--width", "32", "--prompts", "16",
                        "--group", "4", "--pr-every", "0", "--mech-every", "0", "--clip-grad", "1e9", "--agent",
                        "local", "--c-low", "0.999", "--c-high", "1", "--spike-sigma", "6", "--inject-spikes", "0.1",
                        "--inject-scale", "3", "--inject-after", "50", "--inject-relative", "128", "--seed", "4001",
                        "--csv", str(runs / f"{name}.csv")], check=True, stdout=log, stderr=subprocess.STDOUT,
                       env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    (row,) = guard.collect(str(tmp_path))
    assert row["status"] == "finished" and row["injected"] >= 2
    assert row["consistent"] == row["injected"] and row["factor_bad"] == 0
