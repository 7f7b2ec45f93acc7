#!/usr/bin/env python3
"""Part C of the second registered experiment (docs/RESULTS.md, "Second
registered experiment: pre-registered design", "Part C: scale on a task that
does not saturate"): the size sweep on a task that does not saturate (C1)
and 800-step runs of stale GRPO (C2), with registered family C.

  exp2_scale.py --root R --out DIR
      Reads R (layout below), writes DIR/exp2-c-runs.csv (one row per run
      the design names, ROW_KEYS) and DIR/exp2-c.md (every table under a
      heading, built from the rows as read back), and prints what it read.
  exp2_scale.py qualifies --root R --task t1|t2
      The qualification rule on the task's sweep (scripts/experiment.sh uses
      it to decide whether the T2 sweep runs): exit 0 when the task
      qualifies, 1 when it does not, 2 when a run of its sweep is missing
      (no .csv and no .log) or width 128 or 2048 has no finished run.

Layout of R (run names <arm>_s<staleness>_seed<seed>.csv with their .log):
  R/sizes/runs/mlp-w<W>_s0_seed<i>      T1, W in 128..2048, seeds 3001-3003
  R/sizes-t2/runs/mlp-w<W>_s0_seed<i>   T2, seeds 3004-3006 (only if run)
  R/long/runs/setup_s16_seed<i>         C2 (a), seeds 3101-3124
  R/long/runs/t1-w512_s16_seed<i>       C2 (b), seeds 3201-3212
A run is finished when its log has a "summary:" line; a run with a .csv or
a .log but no such line failed (the trainer stops without a summary on a
non-finite loss); a run with neither is missing. Missing runs are listed
and left out of everything; failed runs are handled by the design's rule
("A failed run": left out of the primary endpoints, n says so, counted as
collapsed in the secondary one), as said below.

C1, per run (finished runs), with analyze.py's size-sweep definitions
(analyze.size_record: over steps > 50, q0.9 |c_t| of column cosine and the
rms of noise_cos; PR = the mean of pr_pop; parameters and CPU s from the
log): ratio = q0.9 / rms; above 2x = q0.9 > 2 rms (the first sweep's
criterion); start = e_0 from the log; end = the mean of the last five
evaluations (analyze.last_evals_mean). Per task and width: mean ± sd over
the finished runs and the count of runs above 2x.

Qualification. A task qualifies when its end accuracy averaged over the
finished seeds at width 2048 exceeds that at width 128 by at least 0.10 and
is at most 0.90 (both compared with a tolerance of 1e-9: accuracies are
multiples of 1/1000 and their float differences carry rounding). The task
reported is T1 if it qualifies, else T2 if it qualifies, else none:
"neither: the sweep is reported and no claim about size is made".

The trend (reported task only): the least-squares slope of the per-run
ratio on log2(parameters) over its finished runs (exp2_stats.ols_slope),
the 95 % interval and the two-sided t-test on n - 2 degrees of freedom; on
log2 the slope is the change of the ratio per doubling of parameters. When
no task qualifies the slope of the last sweep run (T2 if present, else T1)
is shown, not tested.

C2, per run, with analyze.outcome (e_0 from the log): "by 400" the outcome
over e_1..e_20, "by 800" over e_1..e_40 (the first 20 and 40 evaluations);
recovered = collapsed by 400 and not by 800; late = collapsed by 800 and
not by 400; acc 16-20 and acc 36-40 = the mean of e_16..e_20 and of
e_36..e_40. A failed run counts as collapsed by 800; by 400 it has the
outcome of its own e_1..e_20 where it reached the 20th evaluation (its
first 400 steps are those of a run that did not fail), else collapsed; it
is left out of the mean accuracies. Per part: n (finished + failed), the
counts of collapsed by 400, by 800, recovered and late with
Clopper-Pearson 95 % intervals, and the mean ± sd of the two accuracies.

Registered family C, Holm's correction over the tests that exist (at most
3): the trend slope of the reported task (grows with size when Holm
p < 0.05 and the slope > 0, falls with size when < 0, no trend shown
otherwise; no test when no task qualifies or fewer than 3 runs); per C2
part, McNemar's exact test of collapsed by 400 against collapsed by 800
paired by run, b = recovered, c = late (collapses recover when Holm p < 0.05
and recovered > late, more collapse later when Holm p < 0.05 and late >
recovered, no change shown otherwise); a part with no collapse by 400 and
none by 800 gives "no collapse" and no test (it leaves the family).

Tables: exp2-c-sizes, exp2-c-qualify, exp2-c-trend, exp2-c-long,
exp2-c-family.

    .venv/bin/python examples/grpo/exp2_scale.py --root results/exp2/c --out results/exp2/c
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze  # noqa: E402  (outcome rule, size-sweep record, Holm, formatting)
import exp2_stats  # noqa: E402  (Clopper-Pearson, McNemar, the slope)

WIDTHS = (128, 256, 512, 1024, 2048)
SWEEPS = {"t1": ("sizes", range(3001, 3004)), "t2": ("sizes-t2", range(3004, 3007))}
TASK_LABELS = {"t1": "T1 (two-digit addition, base 32)", "t2": "T2 (eight tasks, base 16)"}
LONG_PARTS = {"a": ("setup", 128, range(3101, 3125)), "b": ("t1-w512", 512, range(3201, 3213))}
LONG_LABELS = {"a": "(a) Setup configuration", "b": "(b) T1 at width 512"}
LONG_STALENESS = 16
QUALIFY_LOW, QUALIFY_HIGH = 128, 2048
QUALIFY_GAIN = 0.10       # end(2048) - end(128) >= this
QUALIFY_CEILING = 0.90    # end(2048) <= this
TOLERANCE = 1e-9
BY_400, BY_800 = 20, 40   # evaluations e_1..e_20 and e_1..e_40
ACC_WINDOWS = ((16, 20), (36, 40))
ALPHA = 0.05
NEITHER = "neither: the sweep is reported and no claim about size is made"
# e_0 as analyze.load_run reads it (a failed run has no summary, so load_run does not read it).
START = re.compile(r"(?:supervised warm-up: .*|start:) held-out accuracy ([0-9.]+)")

ROW_KEYS = ["part", "cell", "width", "seed", "status", "parameters", "start", "end", "q90", "noise_rms", "ratio",
            "above_2x", "pr_pop", "cpu_s", "evals", "outcome_400", "collapse_400", "outcome_800", "collapse_800",
            "acc_16_20", "acc_36_40"]
KEY_LEN = 4
INT_KEYS = {"width", "seed", "parameters", "above_2x", "evals", "collapse_400", "collapse_800"}
TEXT_KEYS = {"part", "cell", "status", "outcome_400", "outcome_800"}

Row = Dict[str, object]


# --- reading the runs ------------------------------------------------------------------

def sweep_runs(root: str, task: str) -> List[Tuple[str, str, int, int, str]]:
    """(part, cell, width, seed, csv path) of the 15 runs of a task's sweep."""
    folder, seeds = SWEEPS[task]
    return [("c1", task, width, seed, os.path.join(root, folder, "runs", f"mlp-w{width}_s0_seed{seed}.csv"))
            for width in WIDTHS for seed in seeds]


def expected_runs(root: str) -> List[Tuple[str, str, int, int, str]]:
    """(part, cell, width, seed, csv path) of every run the design names; T2's only when R/sizes-t2 exists."""
    out = sweep_runs(root, "t1")
    if os.path.isdir(os.path.join(root, SWEEPS["t2"][0])):
        out += sweep_runs(root, "t2")
    for cell, (arm, width, seeds) in LONG_PARTS.items():
        for seed in seeds:
            out.append(("c2", cell, width, seed,
                        os.path.join(root, "long", "runs", f"{arm}_s{LONG_STALENESS}_seed{seed}.csv")))
    return out


def run_status(path: str) -> str:
    """"finished" (the log has "summary:"), "failed" (a .csv or .log without it) or "missing" (neither)."""
    log = path[:-4] + ".log"
    if os.path.exists(log) and "summary:" in open(log).read():
        return "finished"
    return "failed" if os.path.exists(log) or os.path.exists(path) else "missing"


def read_partial(path: str) -> Tuple[Optional[float], List[Tuple[int, float]], str]:
    """(e_0, [(step, acc)], log text) of a run that did not finish: what its files hold."""
    log_path = path[:-4] + ".log"
    log = open(log_path).read() if os.path.exists(log_path) else ""
    found = START.search(log)
    evals = []
    if os.path.exists(path):
        _, rows = analyze.read_csv(path)
        evals = [(int(x["step"]), float(x["heldout_acc"])) for x in rows if x.get("heldout_acc")]
    return (float(found.group(1)) if found else None), evals, log


def empty_row(part: str, cell: str, width: int, seed: int, status: str) -> Row:
    row: Row = {k: None for k in ROW_KEYS}
    row.update(part=part, cell=cell, width=width, seed=seed, status=status)
    return row


def size_fields(r: dict) -> Row:
    """C1's per-run numbers of a finished run (analyze.size_record's definitions)."""
    rec = analyze.size_record(r)
    q90, rms = rec["q90"], rec["noise_rms"]
    return {"parameters": rec["parameters"], "start": rec["start"], "end": analyze.last_evals_mean(r["evals"]),
            "q90": q90, "noise_rms": rms, "ratio": q90 / rms if q90 is not None and rms else None,
            "above_2x": None if q90 is None or rms is None else int(q90 > 2.0 * rms),
            "pr_pop": rec["pr_pop"], "cpu_s": rec["cpu_s"], "evals": len(r["evals"])}


def window_mean(evals: Sequence[Tuple[int, float]], first: int, last: int) -> Optional[float]:
    """The mean of e_first..e_last (1-based, inclusive), or None when the run has fewer evaluations."""
    if len(evals) < last:
        return None
    return statistics.mean(a for _, a in evals[first - 1:last])


def long_fields(start: Optional[float], evals: Sequence[Tuple[int, float]], failed: bool) -> Row:
    """C2's per-run outcomes by 400 and by 800 and the two mean accuracies (the failed-run rule in the
    module docstring)."""
    evals = list(evals)
    if failed and len(evals) < BY_400:
        out_400, col_400 = "collapsed", None
    else:
        out_400, col_400 = analyze.outcome(start, evals[:BY_400])
    out_800, col_800 = ("collapsed", None) if failed else analyze.outcome(start, evals[:BY_800])
    row: Row = {"start": start, "evals": len(evals), "outcome_400": out_400, "collapse_400": col_400,
                "outcome_800": out_800, "collapse_800": col_800}
    for first, last in ACC_WINDOWS:
        row[f"acc_{first}_{last}"] = None if failed else window_mean(evals, first, last)
    return row


def run_row(part: str, cell: str, width: int, seed: int, path: str) -> Row:
    """One run's row (ROW_KEYS); a missing run keeps only its key and status."""
    status = run_status(path)
    row = empty_row(part, cell, width, seed, status)
    if status == "missing":
        return row
    if status == "finished":
        r = analyze.load_run(path)
        start, evals, log = r["start"], r["evals"], r["log"]
        if part == "c1":
            row.update(size_fields(r))
    else:
        start, evals, log = read_partial(path)
        row.update(start=start, evals=len(evals))
    row["parameters"] = analyze.log_parameters(log)
    if part == "c2":
        row.update(long_fields(start, evals, status == "failed"))
        row["cpu_s"] = analyze.log_cpu_seconds(log)
    return row


def collect(root: str) -> List[Row]:
    """The rows (ROW_KEYS) of every run the design names under root, in the order expected_runs gives."""
    return [run_row(*spec) for spec in expected_runs(root)]


def write_rows(rows: Sequence[Row], path: str) -> None:
    analyze.write_row_dicts(path, ROW_KEYS, rows)


def read_rows(path: str) -> List[Row]:
    return analyze.read_row_dicts(path, ROW_KEYS, ints=INT_KEYS, texts=TEXT_KEYS)


# --- C1: qualification, per size, the trend ----------------------------------------------

def task_rows(rows: Sequence[Row], task: str, finished: bool = True) -> List[Row]:
    return [r for r in rows if r["part"] == "c1" and r["cell"] == task
            and (not finished or r["status"] == "finished")]


def mean_end(rows: Sequence[Row], task: str, width: int) -> Tuple[Optional[float], int]:
    """(mean end accuracy over the task's finished runs at width, how many)."""
    ends = [r["end"] for r in task_rows(rows, task) if r["width"] == width and r["end"] is not None]
    return (statistics.mean(ends) if ends else None), len(ends)


def qualification(rows: Sequence[Row], task: str) -> Row:
    """The qualification numbers of a task: end at 128 and 2048 (means, n), the gain, the two conditions and
    the verdict (None when the task has no rows or a width has no finished run)."""
    low, n_low = mean_end(rows, task, QUALIFY_LOW)
    high, n_high = mean_end(rows, task, QUALIFY_HIGH)
    out: Row = {"task": task, "end_low": low, "n_low": n_low, "end_high": high, "n_high": n_high,
                "gain": None, "gain_ok": None, "ceiling_ok": None, "qualifies": None}
    if low is None or high is None:
        return out
    out["gain"] = high - low
    out["gain_ok"] = high - low >= QUALIFY_GAIN - TOLERANCE
    out["ceiling_ok"] = high <= QUALIFY_CEILING + TOLERANCE
    out["qualifies"] = out["gain_ok"] and out["ceiling_ok"]
    return out


def qualifies(rows: Sequence[Row], task: str) -> Optional[bool]:
    """True when the task qualifies, False when not, None when it cannot be decided (no finished run at
    width 128 or 2048)."""
    return qualification(rows, task)["qualifies"]


def has_sweep(rows: Sequence[Row], task: str) -> bool:
    return bool(task_rows(rows, task, finished=False))


def reported_task(rows: Sequence[Row]) -> Tuple[Optional[str], str]:
    """(the task reported, or None; the sentence that says which and why)."""
    t1 = qualifies(rows, "t1")
    if t1:
        return "t1", "T1 qualifies: T1 is reported"
    if t1 is None:
        return None, "T1's qualification cannot be decided (no finished run at width 128 or 2048)"
    if not has_sweep(rows, "t2"):
        return None, "T1 does not qualify and T2's sweep is not in the data: no task is reported yet"
    t2 = qualifies(rows, "t2")
    if t2:
        return "t2", "T1 does not qualify, T2 qualifies: T2 is reported"
    if t2 is None:
        return None, "T1 does not qualify; T2's qualification cannot be decided"
    return None, NEITHER


def trend(rows: Sequence[Row], task: str) -> Row:
    """The least-squares slope of the per-run ratio on log2(parameters) over the task's finished runs:
    slope (per doubling), interval, p (None with fewer than 3 runs), n."""
    pts = [(math.log2(r["parameters"]), r["ratio"]) for r in task_rows(rows, task)
           if r["ratio"] is not None and r["parameters"]]
    out: Row = {"task": task, "n": len(pts), "slope": None, "low": None, "high": None, "p": None}
    if len(pts) >= 2 and len({x for x, _ in pts}) > 1:
        slope, lo, hi, p = exp2_stats.ols_slope([x for x, _ in pts], [y for _, y in pts])
        out.update(slope=slope, low=lo, high=hi, p=p)
    return out


def trend_task(rows: Sequence[Row]) -> Tuple[Optional[str], bool]:
    """(the task whose slope is shown, whether it is tested): the reported task, tested; else the last sweep
    run (T2 if present, else T1), not tested."""
    task, _ = reported_task(rows)
    if task is not None:
        return task, True
    for fallback in ("t2", "t1"):
        if has_sweep(rows, fallback):
            return fallback, False
    return None, False


# --- C2: the 800-step runs ----------------------------------------------------------------

def long_summary(rows: Sequence[Row], cell: str) -> Row:
    """A C2 part's counts (finished + failed runs) and mean accuracies (finished runs)."""
    rs = [r for r in rows if r["part"] == "c2" and r["cell"] == cell and r["status"] != "missing"]
    c400 = [r["outcome_400"] == "collapsed" for r in rs]
    c800 = [r["outcome_800"] == "collapsed" for r in rs]
    # McNemar's pairs: the finished runs (a failed run is counted as collapsed, not tested).
    done = [(a, b) for r, a, b in zip(rs, c400, c800) if r["status"] == "finished"]
    out: Row = {"cell": cell, "n": len(rs), "failed": sum(r["status"] == "failed" for r in rs),
                "missing": sum(1 for r in rows if r["part"] == "c2" and r["cell"] == cell
                               and r["status"] == "missing"),
                "by_400": sum(c400), "by_800": sum(c800),
                "recovered": sum(a and not b for a, b in zip(c400, c800)),
                "late": sum(b and not a for a, b in zip(c400, c800)),
                "pairs": len(done), "pairs_recovered": sum(a and not b for a, b in done),
                "pairs_late": sum(b and not a for a, b in done)}
    for when in ("400", "800"):
        for outcome in ("never learned", "learned"):
            out[f"{outcome}_{when}"] = sum(r[f"outcome_{when}"] == outcome for r in rs)
    for first, last in ACC_WINDOWS:
        key = f"acc_{first}_{last}"
        out[key] = [r[key] for r in rs if r[key] is not None]
    return out


# --- family C -----------------------------------------------------------------------------

def trend_verdict(p_holm: Optional[float], slope: Optional[float]) -> str:
    if p_holm is not None and p_holm < ALPHA and slope > 0:
        return "grows with size"
    if p_holm is not None and p_holm < ALPHA and slope < 0:
        return "falls with size"
    return "no trend shown"


def mcnemar_verdict(p_holm: Optional[float], recovered: int, late: int) -> str:
    if p_holm is not None and p_holm < ALPHA and recovered > late:
        return "collapses recover"
    if p_holm is not None and p_holm < ALPHA and late > recovered:
        return "more collapse later"
    return "no change shown"


def family_tests(rows: Sequence[Row]) -> List[Row]:
    """Family C's rows: each with its p (None: no test, with the reason) before Holm."""
    tests = []
    task, tested = trend_task(rows)
    t = trend(rows, task) if task else {"n": 0, "slope": None, "low": None, "high": None, "p": None}
    why = "no task reported" if not tested else "fewer than 3 runs" if t["p"] is None else None
    tests.append({"test": "trend", "task": task, **t, "p": t["p"] if why is None else None, "why": why})
    for cell in LONG_PARTS:
        s = long_summary(rows, cell)
        if s["n"] == 0:
            tests.append({"test": cell, **s, "p": None, "why": "no run"})
        elif s["by_400"] == 0 and s["by_800"] == 0:
            tests.append({"test": cell, **s, "p": None, "why": "no collapse"})
        else:
            tests.append({"test": cell, **s, "p": exp2_stats.mcnemar_exact_p(s["pairs_recovered"], s["pairs_late"]),
                          "why": None})
    return tests


def family(rows: Sequence[Row]) -> List[Row]:
    """Family C with Holm's adjusted p over the registered 3 (a test not run enters as p = 1, so the others
    are never corrected over fewer) and each verdict."""
    tests = family_tests(rows)
    for t, adjusted in zip(tests, analyze.holm([1.0 if t["p"] is None else t["p"] for t in tests])):
        t["p_holm"] = None if t["p"] is None else adjusted
        if t["why"] is not None:
            t["verdict"] = "no collapse" if t["why"] == "no collapse" else f"not tested ({t['why']})"
        elif t["test"] == "trend":
            t["verdict"] = trend_verdict(adjusted, t["slope"])
        else:
            t["verdict"] = mcnemar_verdict(adjusted, t["pairs_recovered"], t["pairs_late"])
    return tests


# --- tables --------------------------------------------------------------------------------

def pfmt(p: Optional[float]) -> str:
    return "-" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"


def count_ci(k: int, n: int) -> str:
    lo, hi = exp2_stats.clopper_pearson(k, n)
    return f"{k} / {n}" if lo is None else f"{k} / {n} [{lo:.3f}, {hi:.3f}]"


def sizes_table(rows: Sequence[Row]) -> str:
    lines = ["| task | width | parameters | n (finished / run or failed) | start (e_0) | end (last 5) | noise floor rms "
             "| q0.9 \\|c_t\\| | q0.9 / rms | runs with q0.9 > 2 rms | mean q0.9 > 2 × mean rms | PR (population) "
             "| CPU s per run |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for task in SWEEPS:
        for width in WIDTHS:
            every = [r for r in task_rows(rows, task, finished=False) if r["width"] == width]
            if not every:
                continue
            rs = [r for r in every if r["status"] == "finished"]
            params = next((r["parameters"] for r in every if r["parameters"]), None)
            above = [r["above_2x"] for r in rs if r["above_2x"] is not None]
            col = lambda k, d=3: analyze.mean_sd([r[k] for r in rs], d)
            q90, rms = (analyze.mean([r[k] for r in rs if r[k] is not None]) for k in ("q90", "noise_rms"))
            clear = "-" if q90 is None or rms is None else "yes" if q90 > 2 * rms else "no"
            lines.append(f"| {task.upper()} | {width} | {'-' if params is None else f'{params:,}'} "
                         f"| {len(rs)} / {len(every)} | {col('start')} | {col('end')} | {col('noise_rms')} "
                         f"| {col('q90')} | {col('ratio', 2)} | {sum(above)} / {len(above)} | {clear} | {col('pr_pop', 1)} "
                         f"| {analyze.fmt(analyze.mean([r['cpu_s'] for r in rs]), 0)} |")
    return "\n".join(lines) + "\n"


def qualify_table(rows: Sequence[Row]) -> str:
    lines = ["| task | end at width 128 (n) | end at width 2048 (n) | 2048 − 128 (≥ 0.10) | end at 2048 ≤ 0.90 "
             "| qualifies |", "|---|---|---|---|---|---|"]
    yes_no = lambda b: "-" if b is None else "yes" if b else "no"
    for task in SWEEPS:
        if not has_sweep(rows, task):
            lines.append(f"| {task.upper()} | not run | | | | |")
            continue
        q = qualification(rows, task)
        gain = "-" if q["gain"] is None else f"{q['gain']:+.3f}"
        lines.append(f"| {task.upper()} | {analyze.fmt(q['end_low'])} ({q['n_low']}) "
                     f"| {analyze.fmt(q['end_high'])} ({q['n_high']}) | {gain} ({yes_no(q['gain_ok'])}) "
                     f"| {yes_no(q['ceiling_ok'])} | {yes_no(q['qualifies'])} |")
    _, sentence = reported_task(rows)
    return "\n".join(lines) + f"\n\nTask reported: {sentence}.\n"


def trend_table(rows: Sequence[Row]) -> str:
    task, tested = trend_task(rows)
    lines = ["| task | runs | slope of q0.9 / rms per doubling of parameters [95 % CI] | df | p (two-sided t) "
             "| tested |", "|---|---|---|---|---|---|"]
    if task is None:
        return "\n".join(lines + ["| - | 0 | - | - | - | no sweep |"]) + "\n"
    t = trend(rows, task)
    slope = "-" if t["slope"] is None else f"{t['slope']:+.3f} {analyze.interval(t['low'], t['high'])}"
    df = t["n"] - 2 if t["n"] >= 3 else "-"
    note = "yes (family C)" if tested else "no: no claim about size"
    lines.append(f"| {task.upper()} | {t['n']} | {slope} | {df} | {pfmt(t['p']) if tested else '-'} | {note} |")
    return "\n".join(lines) + "\n"


def long_table(rows: Sequence[Row]) -> str:
    lines = ["| part | n (failed; missing) | collapsed by 400 | collapsed by 800 | recovered | late "
             "| never learned by 400 / 800 | learned by 400 / 800 | mean acc, evaluations 16–20 | 36–40 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in LONG_PARTS:
        s = long_summary(rows, cell)
        n = s["n"]
        lines.append(f"| {LONG_LABELS[cell]} | {n} ({s['failed']}; {s['missing']}) | {count_ci(s['by_400'], n)} "
                     f"| {count_ci(s['by_800'], n)} | {count_ci(s['recovered'], n)} | {count_ci(s['late'], n)} "
                     f"| {s['never learned_400']} / {s['never learned_800']} | {s['learned_400']} / {s['learned_800']} "
                     f"| {analyze.mean_sd(s['acc_16_20'])} | {analyze.mean_sd(s['acc_36_40'])} |")
    return ("\n".join(lines) + "\n\nCounts of the n runs with Clopper-Pearson 95 % intervals. A failed run "
            "counts as collapsed by 800 (by 400 too where it did not reach the 20th evaluation), is left out of "
            "McNemar's pairs (family C) and of the mean accuracies; missing runs are left out.\n")


def family_table(rows: Sequence[Row]) -> str:
    lines = ["| test | what | statistic | p | Holm p | verdict |", "|---|---|---|---|---|---|"]
    tests = family(rows)
    for t in tests:
        if t["test"] == "trend":
            what = f"trend of q0.9 / rms on log2(parameters), {(t['task'] or '-').upper()}"
            stat = "-" if t["slope"] is None else \
                f"slope {t['slope']:+.3f} per doubling {analyze.interval(t['low'], t['high'])}, n {t['n']}"
        else:
            what = f"{LONG_LABELS[t['test']]}: McNemar, collapsed by 400 against by 800"
            stat = f"recovered {t['pairs_recovered']}, late {t['pairs_late']}, n {t['pairs']} finished runs"
        lines.append(f"| C-{t['test']} | {what} | {stat} | {pfmt(t['p'])} | {pfmt(t['p_holm'])} | {t['verdict']} |")
    return "\n".join(lines) + (f"\n\nHolm's correction over the registered {len(tests)} tests, family-wise {ALPHA}; "
                               "a test not run enters it as p = 1. McNemar pairs a finished run's outcome by 400 "
                               "with its outcome by 800.\n")


TABLES = [("exp2-c-sizes", "C1, the size sweep", sizes_table),
          ("exp2-c-qualify", "C1, the task's qualification", qualify_table),
          ("exp2-c-trend", "C1, the trend", trend_table),
          ("exp2-c-long", "C2, 800-step runs at s = 16", long_table),
          ("exp2-c-family", "Registered family C", family_table)]


def render(rows: Sequence[Row]) -> Dict[str, str]:
    """{table name: markdown ending in a newline}, from the per-run rows."""
    return {name: build(rows) for name, _, build in TABLES}


# --- the command line ----------------------------------------------------------------------

def run_name(r: Row) -> str:
    if r["part"] == "c1":
        return f"{SWEEPS[r['cell']][0]}/mlp-w{r['width']}_s0_seed{r['seed']}"
    return f"long/{LONG_PARTS[r['cell']][0]}_s{LONG_STALENESS}_seed{r['seed']}"


LISTED = 12  # failed or missing runs named in the line main prints


def describe(rows: Sequence[Row]) -> str:
    """A short line of what was read: finished runs per group, failed and missing runs named."""
    groups = []
    for part, cell, label in [("c1", "t1", "C1 T1"), ("c1", "t2", "C1 T2"), ("c2", "a", "C2 (a)"),
                              ("c2", "b", "C2 (b)")]:
        rs = [r for r in rows if r["part"] == part and r["cell"] == cell]
        if rs:
            groups.append(f"{label} {sum(r['status'] == 'finished' for r in rs)}/{len(rs)} finished")
    text = "exp2_scale.py: " + ", ".join(groups)
    for status in ("failed", "missing"):
        names = [run_name(r) for r in rows if r["status"] == status]
        if names:
            more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
            text += f"; {len(names)} {status}: " + ", ".join(names[:LISTED]) + more
    return text


def qualifies_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="exp2_scale.py qualifies",
                                 description="Exit 0 when the task qualifies, 1 when not, 2 when runs are missing.")
    ap.add_argument("--root", required=True)
    ap.add_argument("--task", required=True, choices=sorted(SWEEPS))
    args = ap.parse_args(argv)
    rows = [run_row(*spec) for spec in sweep_runs(args.root, args.task)]
    missing = [run_name(r) for r in rows if r["status"] == "missing"]
    failed = [run_name(r) for r in rows if r["status"] == "failed"]
    q = qualification(rows, args.task)
    if failed:
        print(f"qualifies: failed runs left out: {', '.join(failed)}", file=sys.stderr)
    if missing or q["qualifies"] is None:
        print(f"qualifies: {args.task.upper()} cannot be decided: missing {', '.join(missing) or 'none'}; "
              f"finished at width 128: {q['n_low']}, at 2048: {q['n_high']}", file=sys.stderr)
        return 2
    print(f"{args.task.upper()}: end at 128 {q['end_low']:.4f}, at 2048 {q['end_high']:.4f}, "
          f"gain {q['gain']:+.4f}: {'qualifies' if q['qualifies'] else 'does not qualify'}")
    return 0 if q["qualifies"] else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "qualifies":
        return qualifies_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = collect(args.root)
    print(describe(rows))
    if not any(r["status"] != "missing" for r in rows):
        print(f"exp2_scale.py: no run in {args.root}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "exp2-c-runs.csv")
    write_rows(rows, path)
    tables = render(read_rows(path))
    with open(os.path.join(args.out, "exp2-c.md"), "w") as f:
        f.write("\n".join(f"## {name}: {title}\n\n{tables[name]}" for name, title, _ in TABLES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
