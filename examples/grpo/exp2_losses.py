#!/usr/bin/env python3
"""Part A of the second registered experiment (docs/RESULTS.md, "Second
registered experiment: pre-registered design", "Part A: losses x GAC, and
what does the work"): four losses with and without GAC, the five skip
controls, the lag, registered families A and A-lag, and the sentences the
design allows.

    .venv/bin/python examples/grpo/exp2_losses.py --root R --out DIR

R is the part's folder as scripts/experiment.sh writes it and the archive
holds it: R/runs/<arm>_s<s>_seed<i>.csv with its .log (s in 16, 32, seeds
1001-1024, the 13 arms of ARMS), R/calibration.txt (analyze.py calibrate's
key=value lines), R/burst_s16.txt and R/burst_s32.txt (the line analyze.py
burst printed: "P=... runs_of_skips=N L=1,1,2,..."). Writes
DIR/exp2-a-runs.csv (one row per run, ROW_KEYS), DIR/exp2-a-facts.csv (the
calibration, the burst lines and P_s, L_s recomputed from the runs, as text:
FACT_KEYS) and DIR/exp2-a.md (every table under a heading), built from the
two CSVs as read back; prints what it read.

Per run (a run is finished when its .log has a "summary:" line):
- endpoint: the mean held-out accuracy of the last five evaluations
  (analyze.last_evals_mean); mean_acc: the mean of all evaluations;
  outcome and collapse step by analyze.outcome, e_0 from the log;
- skip_rate: share of steps with stepped == 0; project_rate: share with
  regime "project"; drift: the median of the `drift` column over every step
  that has it (analyze.replication_record's definition, also analyze.py
  control's "drift="); sampler_kl: its mean over steps > 50;
- the lag, over steps > 50, from `lag_updates` (applied updates): mean,
  minimum, q0.1 (analyze.quantile: linear interpolation between order
  statistics, position 0.1 (n - 1)), the near-fresh fraction (share with
  lag <= s/2), and the counts in [0, s/4], (s/4, s/2], (s/2, 3s/4], (3s/4, s)
  and exactly s. The trainer's default lag rule (steps) keeps at most s + 1
  snapshots, so lag <= s; a lag above s (only possible with other flags) is
  counted in lag_above, in no bin, and in the denominators, and the lag
  table says how many there were.
- A run whose .log lacks "summary:" (or whose CSV is missing) is failed
  (the design retries it once before this point): a row with status
  "failed" and no values; it is left out of every paired test (n says so)
  and counted as collapsed in the collapse counts and Fisher's tests.

Family A (22 tests): contrasts L1-L7 and M1-M4 (CONTRASTS, row - reference)
at s = 16 and 32, the primary endpoint paired by seed over the seeds at
which both runs finished (n), mean, the unadjusted 95 % t-interval
(analyze.paired_ci), the two-sided paired t-test (analyze.paired_t_p),
Holm over the 22 (analyze.holm; a test that cannot be run, n < 2, enters
Holm as p = 1, so the family is always 22). Verdicts (Holm p; "inside": the
interval lies in [-0.05, +0.05], ends included):
  L1-L4: "adds" (Holm p < 0.05, mean > 0), "harms" (Holm p < 0.05,
         mean < 0), else "equivalent within ±0.05" when inside, else
         "no effect shown"; the row gives the GAC arm's mean skip and
         project rates over the paired runs, and "GAC never acted" is added
         when both are 0.
  L5-L7: "the loss is above GAC" / "the loss is below GAC" (Holm p < 0.05,
         by the sign), "matches GAC within ±0.05" (Holm p >= 0.05 and
         inside), else "not resolved".
  M1-M4: "holds" (Holm p < 0.05, mean > 0: every claim is row > reference),
         "opposite" (Holm p < 0.05, mean < 0), else "does not hold", with
         ", equivalent within ±0.05" added when inside.
Beside each test (secondary, not adjusted): the collapses of both arms over
the seeds at which both have a run (finished or failed; failed counts as
collapsed) and Fisher's exact p (analyze.fisher_exact_p).

Family A-lag (16 tests): M1-M4 at each s, the paired difference (row -
reference) of the per-run mean lag and of the near-fresh fraction, over the
seeds both finished, two-sided paired t-tests, Holm over the 16 (p = 1 for
an untestable one, as above). Verdicts: "row less lag" / "row more lag",
"row more near-fresh steps" / "row fewer near-fresh steps" when Holm p <
0.05 by the sign, else "no difference shown".

The lag sentence (lag_explanations): for an M contrast at s, a sentence that
explains the accuracy difference by the lag is written only where the
contrast holds in family A and the lag statistic it names differs in family
A-lag (Holm p < 0.05) in the direction that goes with it: less mean lag, or
a larger near-fresh fraction, in the better arm (the row, since it holds).
Otherwise the text says the lag does not separate the arms (the contrast
holds; "in the direction that would explain it" where a lag statistic
differs the other way), or that the arms' accuracy does not differ (it does
not hold), or that it goes the opposite way or was not tested (n < 2) and no
lag sentence is written.

The mechanism sentences (mechanism_sentences): "c_t's timing does work
beyond bursts" only if M1 holds at some s (the s named); "bursts alone do
the work" only if M4 holds and M1 is "does not hold, equivalent within
±0.05" at the same s; "runs of skips beat scattered skips" only if M2 or M3
holds (which, at which s); each claim whose condition fails is reported as
not resolved, with the intervals of the contrasts it rests on.

Other tables: the calibration against the replication's (c_low 0.5863, c_max
0.8729, window c_low 0.2929; both reported where one differs by more than
1e-4), P_s and L_s (as the burst files give them, and recomputed from the
finished grpo-gacmax runs as a check), per arm and s the outcomes and
secondary endpoints (mean ± sd over runs), and the lag per arm (mean ± sd
over runs of the four per-run statistics; bin shares pooled over the arm's
steps > 50).
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import sys
from typing import Dict, Iterable, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze  # noqa: E402  (runs, outcome, endpoint, paired t, Holm, Fisher)

LOSS_ARMS = ["grpo", "m2po", "bapo", "tis"]
GAC_ARMS = [f"{loss}-gacmax" for loss in LOSS_ARMS]
CONTROL_ARMS = ["mskip-gacmax", "burst-gacmax", "rskip-gacmax", "bskip-gacmax", "cskip-gacmax"]
ARMS = LOSS_ARMS + GAC_ARMS + CONTROL_ARMS
STALENESS = (16, 32)
SEEDS = tuple(range(1001, 1025))
LAG_AFTER = analyze.WARMUP   # the lag statistics and sampler KL: steps > 50
MARGIN = 0.05                # the equivalence margin of the verdicts
ALPHA = 0.05                 # family-wise, Holm
EQUIVALENT = "equivalent within ±0.05"
REPLICATION_CALIBRATION = [("c_low", 0.5863), ("c_max", 0.8729), ("window_c_low", 0.2929)]
CALIBRATION_TOLERANCE = 1e-4

# (name, row, reference, kind, the claim it tests); every difference is row - reference.
CONTRASTS = [
    ("L1", "grpo-gacmax", "grpo", "gac", "GAC adds to GRPO (the replication's C2, again)"),
    ("L2", "m2po-gacmax", "m2po", "gac", "GAC adds to M2PO"),
    ("L3", "bapo-gacmax", "bapo", "gac", "GAC adds to BAPO"),
    ("L4", "tis-gacmax", "tis", "gac", "GAC adds to truncated IS"),
    ("L5", "m2po", "grpo-gacmax", "loss", "M2PO alone against GAC on GRPO"),
    ("L6", "bapo", "grpo-gacmax", "loss", "BAPO alone against GAC on GRPO"),
    ("L7", "tis", "grpo-gacmax", "loss", "truncated IS alone against GAC on GRPO"),
    ("M1", "mskip-gacmax", "burst-gacmax", "mech",
     "where c_t puts the skips beats a burst schedule with the same rate and run lengths"),
    ("M2", "burst-gacmax", "rskip-gacmax", "mech", "runs of skips beat scattered skips at the same rate, with no c_t in either"),
    ("M3", "bskip-gacmax", "cskip-gacmax", "mech", "runs beat scattered skips, directly (same count per seed)"),
    ("M4", "burst-gacmax", "grpo", "mech", "an open-loop burst schedule helps stale GRPO"),
]
MECHANISM = [c for c in CONTRASTS if c[3] == "mech"]
LAG_STATS = [("lag_mean", "mean lag"), ("near_fresh", "near-fresh fraction")]
BIN_LABELS = ["[0, s/4]", "(s/4, s/2]", "(s/2, 3s/4]", "(3s/4, s)", "= s"]
BIN_KEYS = [f"lag_bin{i}" for i in range(1, 6)]

ROW_KEYS = ["arm", "staleness", "seed", "status", "steps", "evals", "start", "endpoint", "mean_acc", "outcome",
            "collapse", "skip_rate", "project_rate", "drift", "sampler_kl", "lag_n", "lag_mean", "lag_min", "lag_q10",
            "near_fresh"] + BIN_KEYS + ["lag_above"]
INT_KEYS = {"steps", "evals", "collapse", "lag_n", "lag_min", "lag_above"} | set(BIN_KEYS)
TEXT_KEYS = {"status", "outcome"}
FACT_KEYS = ["name", "staleness", "value"]


# --- per run -----------------------------------------------------------------------------------------------

def lag_bin(lag: float, s: int) -> int:
    """0..4 for [0, s/4], (s/4, s/2], (s/2, 3s/4], (3s/4, s), exactly s; 5 for a lag above s."""
    if lag > s:
        return 5
    if lag == s:
        return 4
    for i, edge in enumerate((s / 4, s / 2, 3 * s / 4)):
        if lag <= edge:
            return i
    return 3


def lag_statistics(steps: Sequence[int], lags: Sequence[Optional[float]], s: int) -> dict:
    """The per-run lag statistics over steps > 50 (module docstring); None values where no step has a lag."""
    xs = [float(lag) for step, lag in zip(steps, lags) if step > LAG_AFTER and lag is not None]
    counts = [0] * 6
    for x in xs:
        counts[lag_bin(x, s)] += 1
    out = {"lag_n": len(xs), "lag_mean": analyze.mean(xs), "lag_min": int(min(xs)) if xs else None,
           "lag_q10": analyze.quantile(xs, 0.1),
           "near_fresh": sum(1 for x in xs if x <= s / 2) / len(xs) if xs else None, "lag_above": counts[5]}
    out.update(zip(BIN_KEYS, counts[:5]))
    return out


def empty_row(arm: str, s: int, seed: int, status: str) -> dict:
    row = {k: None for k in ROW_KEYS}
    row.update(arm=arm, staleness=s, seed=seed, status=status)
    return row


def run_row(r: dict, arm: str, s: int, seed: int) -> dict:
    """One finished run's row (analyze.load_run's dict r)."""
    row = empty_row(arm, s, seed, "finished")
    row.update(analyze.replication_record(r))
    row.update(steps=len(r["step"]), evals=len(r["evals"]), start=r["start"],
               project_rate=analyze.metrics(r)["project_rate"])
    row.update(lag_statistics(r["step"], r["lag_updates"], s))
    return row


def run_keys(runs_dir: str) -> List[tuple]:
    """The (arm, s, seed) of every CSV or log in runs_dir that belongs to the design (ARMS, STALENESS, SEEDS)."""
    keys = set()
    paths = glob.glob(os.path.join(runs_dir, "*_s*_seed*.csv")) + glob.glob(os.path.join(runs_dir, "*_s*_seed*.log"))
    for path in paths:
        key = analyze.run_key(path[:-4] + ".csv")
        if key and key[0] in ARMS and key[1] in STALENESS and key[2] in SEEDS:
            keys.add(key)
    return sorted(keys)


def row_order(row: dict) -> tuple:
    return row["staleness"], ARMS.index(row["arm"]), row["seed"]


def collect(root: str) -> List[dict]:
    """One row per run of the design found in root/runs (finished or failed), in (s, arm, seed) order."""
    runs_dir = os.path.join(root, "runs")
    rows = []
    for arm, s, seed in run_keys(runs_dir):
        path = os.path.join(runs_dir, f"{arm}_s{s}_seed{seed}.csv")
        r = analyze.load_run(path) if os.path.exists(path) else None
        rows.append(run_row(r, arm, s, seed) if r is not None else empty_row(arm, s, seed, "failed"))
    return sorted(rows, key=row_order)


def write_rows(rows: Iterable[dict], path: str) -> None:
    analyze.write_row_dicts(path, ROW_KEYS, rows)


def read_rows(path: str) -> List[dict]:
    rows = analyze.read_row_dicts(path, ROW_KEYS, ints=INT_KEYS | {"staleness", "seed"}, texts=TEXT_KEYS | {"arm"})
    return sorted(rows, key=row_order)


# --- facts: the calibration and the burst schedule's P_s, L_s ------------------------------------------------

def skipped_steps(path: str) -> tuple:
    """(skipped steps, steps) of one run's CSV, as analyze.py burst reads them (stepped == 0)."""
    _, rows = analyze.read_csv(path)
    return [int(x["step"]) for x in rows if x.get("stepped", "1") == "0"], len(rows)


def collect_facts(root: str) -> List[dict]:
    """The calibration file's lines, the burst files' lines and P_s, L_s recomputed from the finished
    grpo-gacmax runs of root/runs, as text (FACT_KEYS)."""
    facts = []
    cal = os.path.join(root, "calibration.txt")
    if os.path.exists(cal):
        for line in open(cal):
            if "=" in line:
                k, v = line.strip().split("=", 1)
                facts.append({"name": f"calibration.{k}", "staleness": "", "value": v})
    for s in STALENESS:
        path = os.path.join(root, f"burst_s{s}.txt")
        lines = [x.strip() for x in open(path) if x.startswith("P=")] if os.path.exists(path) else []
        if lines:
            facts.append({"name": "burst_line", "staleness": str(s), "value": lines[-1]})
        masks = []
        for seed in SEEDS:
            csv_path = os.path.join(root, "runs", f"grpo-gacmax_s{s}_seed{seed}.csv")
            log = csv_path[:-4] + ".log"
            if os.path.exists(csv_path) and os.path.exists(log) and "summary:" in open(log).read():
                masks.append(skipped_steps(csv_path))
        if masks:
            p, lengths = analyze.burst_statistics(masks)
            facts += [{"name": "runs_n", "staleness": str(s), "value": str(len(masks))},
                      {"name": "runs_P", "staleness": str(s), "value": f"{p:.6f}"},
                      {"name": "runs_L", "staleness": str(s), "value": ",".join(map(str, lengths))}]
    return facts


def write_facts(facts: Iterable[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FACT_KEYS)
        w.writeheader()
        w.writerows({k: fact[k] for k in FACT_KEYS} for fact in facts)


def read_facts(path: str) -> List[dict]:
    with open(path, newline="") as f:
        return [dict(row) for row in csv.DictReader(f)]


def parse_burst_line(line: str) -> dict:
    """{"P": float, "runs_of_skips": int, "L": [int, ...]} of analyze.py burst's line."""
    parts = dict(item.split("=", 1) for item in line.split())
    lengths = [int(x) for x in parts.get("L", "").split(",") if x.strip()]
    return {"P": float(parts["P"]), "runs_of_skips": int(parts["runs_of_skips"]), "L": lengths}


# --- the tests ------------------------------------------------------------------------------------------------

def index(rows: Iterable[dict]) -> Dict[tuple, dict]:
    return {(r["arm"], r["staleness"], r["seed"]): r for r in rows}


def finished(row: Optional[dict]) -> bool:
    return row is not None and row["status"] == "finished"


def collapsed(row: dict) -> bool:
    """The secondary endpoint: a failed run counts as collapsed."""
    return row["status"] != "finished" or row["outcome"] == "collapsed"


def paired_diffs(by: Dict[tuple, dict], row: str, ref: str, s: int, key: str) -> List[float]:
    """row - reference of `key`, in seed order, over the seeds at which both runs finished and have the value."""
    out = []
    for seed in SEEDS:
        a, b = by.get((row, s, seed)), by.get((ref, s, seed))
        if finished(a) and finished(b) and a[key] is not None and b[key] is not None:
            out.append(a[key] - b[key])
    return out


def paired_test(diffs: List[float]) -> dict:
    m, lo, hi = analyze.paired_ci(diffs)
    return {"n": len(diffs), "mean": m, "low": lo, "high": hi, "p": analyze.paired_t_p(diffs)}


def collapse_test(by: Dict[tuple, dict], row: str, ref: str, s: int) -> dict:
    """Collapses of both arms over the seeds at which both have a run (failed = collapsed), Fisher's exact p."""
    seeds = [seed for seed in SEEDS if (row, s, seed) in by and (ref, s, seed) in by]
    a = sum(collapsed(by[(row, s, seed)]) for seed in seeds)
    c = sum(collapsed(by[(ref, s, seed)]) for seed in seeds)
    n = len(seeds)
    return {"collapse_seeds": n, "collapsed_row": a, "collapsed_reference": c,
            "fisher_p": analyze.fisher_exact_p(a, n - a, c, n - c)}


def inside_margin(lo: Optional[float], hi: Optional[float]) -> bool:
    return lo is not None and hi is not None and -MARGIN <= lo and hi <= MARGIN


def adjust(tests: List[dict]) -> None:
    """Holm over the whole list (an untestable test enters as p = 1, so the family size is the list's)."""
    adjusted = analyze.holm([1.0 if t["p"] is None else t["p"] for t in tests])
    for t, p in zip(tests, adjusted):
        t["p_holm"] = None if t["p"] is None else p


def verdict(kind: str, p_holm: Optional[float], mean: Optional[float], lo: Optional[float],
            hi: Optional[float]) -> str:
    """The design's verdict of one family-A row (kind "gac": L1-L4, "loss": L5-L7, "mech": M1-M4)."""
    if p_holm is None:
        return "no test (n < 2)"
    significant, inside = p_holm < ALPHA, inside_margin(lo, hi)
    if kind == "gac":
        if significant:
            return "adds" if mean > 0 else "harms"
        return EQUIVALENT if inside else "no effect shown"
    if kind == "loss":
        if significant:
            return "the loss is above GAC" if mean > 0 else "the loss is below GAC"
        return "matches GAC within ±0.05" if inside else "not resolved"
    if kind == "mech":
        if significant:
            return "holds" if mean > 0 else "opposite"
        return f"does not hold, {EQUIVALENT}" if inside else "does not hold"
    raise ValueError(f"unknown contrast kind {kind}")


def gac_rates(by: Dict[tuple, dict], row: str, ref: str, s: int) -> tuple:
    """(mean skip rate, mean project rate) of the GAC arm's runs in the pairs."""
    runs = [by[(row, s, seed)] for seed in SEEDS
            if finished(by.get((row, s, seed))) and finished(by.get((ref, s, seed)))
            and by[(row, s, seed)]["endpoint"] is not None and by[(ref, s, seed)]["endpoint"] is not None]
    return analyze.mean([r["skip_rate"] for r in runs]), analyze.mean([r["project_rate"] for r in runs])


def family_a(rows: Iterable[dict]) -> List[dict]:
    """The 22 rows of registered family A (s = 16 first), with Holm's p over the 22 and the verdicts."""
    by = index(rows)
    tests = []
    for s in STALENESS:
        for name, row, ref, kind, claim in CONTRASTS:
            t = {"contrast": name, "s": s, "row": row, "reference": ref, "kind": kind, "claim": claim}
            t.update(paired_test(paired_diffs(by, row, ref, s, "endpoint")))
            t.update(collapse_test(by, row, ref, s))
            t["gac_skip"], t["gac_project"] = gac_rates(by, row, ref, s) if kind == "gac" else (None, None)
            tests.append(t)
    adjust(tests)
    for t in tests:
        t["verdict"] = verdict(t["kind"], t["p_holm"], t["mean"], t["low"], t["high"])
        t["gac_never_acted"] = t["kind"] == "gac" and t["gac_skip"] == 0 and t["gac_project"] == 0
    return tests


def lag_verdict(stat: str, p_holm: Optional[float], mean: Optional[float]) -> str:
    if p_holm is None:
        return "no test (n < 2)"
    if p_holm >= ALPHA:
        return "no difference shown"
    if stat == "lag_mean":
        return "row less lag" if mean < 0 else "row more lag"
    return "row more near-fresh steps" if mean > 0 else "row fewer near-fresh steps"


def family_lag(rows: Iterable[dict]) -> List[dict]:
    """The 16 rows of registered family A-lag (M1-M4 x s x {mean lag, near-fresh fraction}), Holm over 16."""
    by = index(rows)
    tests = []
    for s in STALENESS:
        for name, row, ref, _, _ in MECHANISM:
            for stat, label in LAG_STATS:
                t = {"contrast": name, "s": s, "row": row, "reference": ref, "stat": stat, "label": label}
                t.update(paired_test(paired_diffs(by, row, ref, s, stat)))
                tests.append(t)
    adjust(tests)
    for t in tests:
        t["verdict"] = lag_verdict(t["stat"], t["p_holm"], t["mean"])
    return tests


# --- the sentences ------------------------------------------------------------------------------------------

def pfmt(p: Optional[float]) -> str:
    return "-" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"


def ci_text(t: dict) -> str:
    """"+0.012 [-0.010, +0.034]" of a test row."""
    if t["mean"] is None:
        return "-"
    return f"{t['mean']:+.3f}" + ("" if t["low"] is None else f" {analyze.interval(t['low'], t['high'])}")


def lag_goes_with(t: dict) -> bool:
    """The A-lag row differs (Holm p < 0.05) in the direction that explains a better row arm."""
    if t["p_holm"] is None or t["p_holm"] >= ALPHA:
        return False
    return t["mean"] < 0 if t["stat"] == "lag_mean" else t["mean"] > 0


def lag_explanations(fam: List[dict], lagfam: List[dict]) -> List[dict]:
    """Per M contrast and s: {contrast, s, allowed: the lag statistics a sentence may name, sentence}."""
    out = []
    for a in (t for t in fam if t["kind"] == "mech"):
        lags = [t for t in lagfam if t["contrast"] == a["contrast"] and t["s"] == a["s"]]
        holds = a["verdict"] == "holds"
        allowed = [t["stat"] for t in lags if holds and lag_goes_with(t)]
        detail = "; ".join(f"{t['label']} {ci_text(t)}, Holm p {pfmt(t['p_holm'])}" for t in lags)
        head = f"At s = {a['s']}, {a['contrast']} ({a['row']} − {a['reference']}, {ci_text(a)})"
        if holds and allowed:
            names = " and ".join("less lag" if stat == "lag_mean" else "more near-fresh steps" for stat in allowed)
            text = (f"{head} holds, and the better arm, {a['row']}, had {names} (family A-lag: {detail}): "
                    "the lag can explain the difference.")
        elif holds:
            wrong = any(t["p_holm"] is not None and t["p_holm"] < ALPHA for t in lags)
            text = (f"{head} holds, but the lag does not separate the arms"
                    f"{' in the direction that would explain it' if wrong else ''} ({detail}).")
        elif a["p_holm"] is None:
            text = f"{head}: not tested (n < 2); no lag sentence is written."
        elif a["verdict"] == "opposite":
            text = f"{head} goes the opposite way; no lag sentence is written (the contrast does not hold)."
        else:
            text = f"{head}: the arms' accuracy does not differ ({a['verdict']}); no lag sentence is written."
        out.append({"contrast": a["contrast"], "s": a["s"], "allowed": allowed, "sentence": text})
    return out


def mechanism_sentences(fam: List[dict]) -> List[str]:
    """The design's three mechanism claims, each written where its condition holds, else "not resolved" with
    the intervals of the contrasts it rests on."""
    by = {(t["contrast"], t["s"]): t for t in fam}
    held = lambda c, s: by[(c, s)]["verdict"] == "holds"
    where = lambda pairs: "; ".join(f"{c} at s = {s}: {ci_text(by[(c, s)])}" for c, s in pairs)
    out = []
    timing = [("M1", s) for s in STALENESS if held("M1", s)]
    if timing:
        out.append(f"c_t's timing does work beyond bursts (M1 holds at s = "
                   f"{' and '.join(str(s) for _, s in timing)}; {where(timing)}).")
    else:
        out.append(f"Whether c_t's timing does work beyond bursts is not resolved "
                   f"({where([('M1', s) for s in STALENESS])}).")
    bursts = [s for s in STALENESS if held("M4", s) and by[("M1", s)]["verdict"] == f"does not hold, {EQUIVALENT}"]
    if bursts:
        out.append(f"Bursts alone do the work (M4 holds and M1 is equivalent within ±0.05 at s = "
                   f"{' and '.join(map(str, bursts))}; {where([(c, s) for s in bursts for c in ('M4', 'M1')])}).")
    else:
        out.append(f"Whether bursts alone do the work is not resolved "
                   f"({where([(c, s) for s in STALENESS for c in ('M4', 'M1')])}).")
    runs = [(c, s) for c in ("M2", "M3") for s in STALENESS if held(c, s)]
    if runs:
        which = "; ".join(f"{c} holds at s = {s}" for c, s in runs)
        out.append(f"Runs of skips beat scattered skips ({which}; {where(runs)}).")
    else:
        out.append(f"Whether runs of skips beat scattered skips is not resolved "
                   f"({where([(c, s) for c in ('M2', 'M3') for s in STALENESS])}).")
    return out


# --- tables --------------------------------------------------------------------------------------------------

def fact(facts: Iterable[dict], name: str, s="") -> Optional[str]:
    found = [f["value"] for f in facts if f["name"] == name and f["staleness"] == str(s)]
    return found[-1] if found else None


def calibration_table(facts: List[dict]) -> str:
    if not any(f["name"].startswith("calibration.") for f in facts):
        return "No calibration file.\n"
    lines = ["| threshold | this design's calibration | the replication's | differs by more than 1e-4 |",
             "|---|---|---|---|"]
    for key, old in REPLICATION_CALIBRATION:
        new = analyze.fnum(fact(facts, f"calibration.{key}"))
        differs = "-" if new is None else "yes" if abs(new - old) > CALIBRATION_TOLERANCE else "no"
        lines.append(f"| {key} | {analyze.fmt(new, 6)} | {old:.4f} | {differs} |")
    seeds = fact(facts, "calibration.seeds")
    lines += ["", f"Calibration seeds: {seeds or '-'}. GAC (gacmax) runs with --c-low c_low --c-high c_max; "
                  "where a value differs by more than 1e-4, the new one is used (the design's rule)."]
    return "\n".join(lines) + "\n"


def length_distribution(lengths: List[int]) -> str:
    return ", ".join(f"{n}×{lengths.count(n)}" for n in sorted(set(lengths))) or "-"


def burst_table(facts: List[dict]) -> str:
    lines = ["| s | P_s | runs of skips | mean length | lengths (length×count) | recomputed from the finished "
             "grpo-gacmax runs |", "|---|---|---|---|---|---|"]
    for s in STALENESS:
        line = fact(facts, "burst_line", s)
        if line is None:
            lines.append(f"| {s} | - | - | - | - | no burst file |")
            continue
        b = parse_burst_line(line)
        runs_p, runs_l, runs_n = (fact(facts, k, s) for k in ("runs_P", "runs_L", "runs_n"))
        if runs_p is None:
            check = "no finished grpo-gacmax run"
        else:
            lengths = sorted(int(x) for x in runs_l.split(",") if x)
            same = abs(float(runs_p) - b["P"]) < 5e-7 and lengths == sorted(b["L"])
            check = (f"the same (runs: {runs_n})" if same else
                     f"differs (runs: {runs_n}): P {runs_p}, {len(lengths)} runs of skips, "
                     f"lengths {length_distribution(lengths)}")
        mean_length = sum(b["L"]) / len(b["L"]) if b["L"] else None
        lines.append(f"| {s} | {b['P']:.6f} | {b['runs_of_skips']} | {analyze.fmt(mean_length)} "
                     f"| {length_distribution(b['L'])} | {check} |")
    return "\n".join(lines) + "\n"


def arm_runs(rows: Iterable[dict], arm: str, s: int) -> List[dict]:
    return [r for r in rows if r["arm"] == arm and r["staleness"] == s]


def arms_table(rows: List[dict]) -> str:
    lines = ["| s | arm | finished / failed | last 5 evaluations (primary) | all 20 evaluations | collapsed (failed "
             "included) / never learned / learned / failed | skip rate | project rate | median drift | sampler KL (steps > 50) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in STALENESS:
        for arm in ARMS:
            runs = arm_runs(rows, arm, s)
            if not runs:
                continue
            done = [r for r in runs if finished(r)]
            # A failed run counts as collapsed in the secondary endpoint (the design's failed-run rule).
            counts = [sum(r["outcome"] == o for r in done) for o in analyze.OUTCOMES] + [len(runs) - len(done)]
            counts[0] += counts[-1]
            col = lambda k, d=3: analyze.mean_sd([r[k] for r in done], d)
            lines.append(f"| {s} | {arm} | {len(done)} / {len(runs) - len(done)} | {col('endpoint')} "
                         f"| {col('mean_acc')} | {' / '.join(map(str, counts))} "
                         f"| {analyze.fmt(analyze.mean([r['skip_rate'] for r in done]))} "
                         f"| {analyze.fmt(analyze.mean([r['project_rate'] for r in done]))} "
                         f"| {col('drift', 4)} | {col('sampler_kl', 4)} |")
    failed = [r for r in rows if not finished(r)]
    names = ", ".join(f"{r['arm']}_s{r['staleness']}_seed{r['seed']}" for r in failed)
    lines += ["", "Mean ± sd over the arm's finished runs; median drift: each run's median of `drift`; the rates: "
                  "means over runs. " + (f"Failed runs (left out of the primary pairs, counted as collapsed in the "
                                         f"secondary): {names}." if failed else "No run failed.")]
    return "\n".join(lines) + "\n"


def family_table(fam: List[dict]) -> str:
    lines = ["| # | s | row − reference | n | mean [95 % CI] | p | Holm p (22) | verdict | GAC skip / project rate "
             "| collapsed row / reference (seeds) | Fisher p | claim |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in fam:
        rates = (f"{analyze.fmt(t['gac_skip'])} / {analyze.fmt(t['gac_project'])}" if t["kind"] == "gac" else "")
        note = " (GAC never acted: not a finding about the loss)" if t["gac_never_acted"] else ""
        lines.append(f"| {t['contrast']} | {t['s']} | {t['row']} − {t['reference']} | {t['n']} | {ci_text(t)} "
                     f"| {pfmt(t['p'])} | {pfmt(t['p_holm'])} | {t['verdict']}{note} | {rates} "
                     f"| {t['collapsed_row']} / {t['collapsed_reference']} ({t['collapse_seeds']}) "
                     f"| {pfmt(t['fisher_p'])} | {t['claim']} |")
    lines += ["", "Primary endpoint: mean held-out accuracy over the last five evaluations, paired by seed over the "
                  "seeds at which both arms finished (n); 95 % t-interval unadjusted; Holm over the 22 tests. "
                  "Collapses: over the seeds at which both arms have a run, a failed run counted as collapsed; "
                  "Fisher's exact p, two-sided, not adjusted."]
    return "\n".join(lines) + "\n"


def lag_table(rows: List[dict]) -> str:
    lines = ["| s | arm | runs | mean lag | minimum lag | q0.1 | near-fresh (≤ s/2) | "
             + " | ".join(f"pooled {b}" for b in BIN_LABELS) + " |", "|---" * 12 + "|"]
    above = 0
    for s in STALENESS:
        for arm in ARMS:
            done = [r for r in arm_runs(rows, arm, s) if finished(r) and r["lag_n"]]
            if not done:
                continue
            total = sum(r["lag_n"] for r in done)
            above += sum(r["lag_above"] or 0 for r in done)
            shares = [analyze.fmt(sum(r[k] for r in done) / total) for k in BIN_KEYS]
            col = lambda k: analyze.mean_sd([r[k] for r in done])
            lines.append(f"| {s} | {arm} | {len(done)} | {col('lag_mean')} | {col('lag_min')} | {col('lag_q10')} "
                         f"| {col('near_fresh')} | " + " | ".join(shares) + " |")
    lines += ["", "Per run over steps > 50 (`lag_updates`, applied updates); mean ± sd over runs. q0.1: linear "
                  "interpolation between order statistics (position 0.1 (n − 1)). Pooled: shares of all the arm's "
                  "steps > 50. The minimum and the distribution are reported, not tested. "
                  + (f"{above} steps had a lag above s (in no bin)." if above else "No step had a lag above s.")]
    return "\n".join(lines) + "\n"


def lag_family_table(lagfam: List[dict]) -> str:
    lines = ["| # | s | statistic | row − reference | n | mean [95 % CI] | p | Holm p (16) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in lagfam:
        lines.append(f"| {t['contrast']} | {t['s']} | {t['label']} | {t['row']} − {t['reference']} | {t['n']} "
                     f"| {ci_text(t)} | {pfmt(t['p'])} | {pfmt(t['p_holm'])} | {t['verdict']} |")
    lines += ["", "Per-run statistics over steps > 50, paired by seed over the seeds at which both arms finished; "
                  "Holm over the 16 tests."]
    return "\n".join(lines) + "\n"


def mechanism_text(fam: List[dict], lagfam: List[dict]) -> str:
    lines = [f"{sentence}\n" for sentence in mechanism_sentences(fam)]
    lines += ["The lag, per M contrast and s:", ""] + [f"- {e['sentence']}" for e in lag_explanations(fam, lagfam)]
    return "\n".join(lines) + "\n"


def render(rows: List[dict], facts: Iterable[dict] = ()) -> Dict[str, str]:
    """{table name: markdown} from the per-run rows and the facts, both as read back from their CSVs."""
    facts = list(facts)
    fam, lagfam = family_a(rows), family_lag(rows)
    return {"exp2-a-calibration": calibration_table(facts), "exp2-a-burst": burst_table(facts),
            "exp2-a-arms": arms_table(rows), "exp2-a-family": family_table(fam), "exp2-a-lag": lag_table(rows),
            "exp2-a-lag-family": lag_family_table(lagfam), "exp2-a-mechanism": mechanism_text(fam, lagfam)}


def markdown(tables: Dict[str, str]) -> str:
    return "# Second registered experiment, part A\n\n" + "\n".join(f"## {name}\n\n{text}"
                                                                    for name, text in tables.items())


def read_summary(rows: List[dict]) -> str:
    """The line main prints: runs found, failed ones, missing ones."""
    found = {(r["arm"], r["staleness"], r["seed"]) for r in rows}
    name = lambda k: f"{k[0]}_s{k[1]}_seed{k[2]}"
    failed = [name((r["arm"], r["staleness"], r["seed"])) for r in rows if not finished(r)]
    missing = [name((a, s, seed)) for s in STALENESS for a in ARMS for seed in SEEDS if (a, s, seed) not in found]
    expected = len(ARMS) * len(STALENESS) * len(SEEDS)
    text = (f"exp2_losses.py: {len(rows)} of {expected} runs found, {len(rows) - len(failed)} finished; "
            f"unfinished/failed {len(failed)}: {', '.join(failed) or '-'}; missing {len(missing)}: "
            + (", ".join(missing[:20]) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "") or "-"))
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="the part's folder (runs/, calibration.txt, burst_s*.txt)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = collect(args.root)
    if not rows:
        sys.exit(f"exp2_losses.py: no run of the design in {os.path.join(args.root, 'runs')}")
    os.makedirs(args.out, exist_ok=True)
    rows_path, facts_path = (os.path.join(args.out, f) for f in ("exp2-a-runs.csv", "exp2-a-facts.csv"))
    write_rows(rows, rows_path)
    write_facts(collect_facts(args.root), facts_path)
    rows = read_rows(rows_path)
    with open(os.path.join(args.out, "exp2-a.md"), "w") as f:
        f.write(markdown(render(rows, read_facts(facts_path))))
    print(read_summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
