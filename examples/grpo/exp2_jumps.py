#!/usr/bin/env python3
"""Part B of the second registered experiment (docs/RESULTS.md, "Second
registered experiment: pre-registered design", "Part B: detectors on runs
whose staleness jumps"): which signal notices that the samplers fell behind,
how soon, how often it alarms where nothing happened, and whether any signal
tells, after the jump, which runs will collapse.

    .venv/bin/python examples/grpo/exp2_jumps.py --root R --out DIR

R holds runs/<cell>_s2_seed<seed>.csv with their .log (cells jump16, jump32,
nojump; seeds 2001-2024; 660 RL steps), jumps.txt ("<seed> <J>", one line
per seed: it must equal JUMP_TABLE, the design's table, or nothing is
computed) and calibration.txt (analyze.read_calibration; c_low, c_max,
window_c_low are read; c_max is the runs' c_high). DIR gets exp2-b-runs.csv
(one row per run found: ROW_KEYS) and exp2-b.md (every table under a
heading). The tables are built from the rows as read back from the CSV, so
the committed rows rebuild them. A run is finished when its log has a
"summary:" line; an unfinished one ("failed") keeps a row with its cell,
seed and J only, is left out of every pair and endpoint (n says so) and is
counted as collapsed in the outcome counts (the design's "A failed run").

The jump table. J of seeds 2001-2024: random.Random(52), randint(100, 250)
once per seed in seed order (draw_jump_table); one J per seed for its
jump16 and jump32 runs and, as the matched window, its nojump twin.

Steps t = 1..660 (the CSV's rows, consecutive). "10-step mean" of a column
at t: the mean of its non-empty cells among steps t-9..t (at t < 10 the
steps present, 1..t); empty or non-finite cells are left out; no value when
none is left. No value of a statistic never satisfies a condition.

Signals (statistic, bad direction):
  c10      10-step mean of |cosine| (c_t)                                up
  m        |window_mean| (m_t)                                           up
  ess      10-step mean of ess_token                                     down
  clip     10-step mean of (clip_fraction_low + clip_fraction_high)      up
           (an empty side counts 0, as in GacPolicyClipped)
  kl3      10-step mean of kl_k3                                         up
  entropy  |h10_t - H| / H, h10 the 10-step mean of entropy_mean, H the
           mean of the column entropy_mean over steps 51-100             up
  gradz    (g_t - mean) / sd of grad_norm over the previous min(t-1, 128)
           steps (sample sd), defined from step 65 (64 values held), as
           OLMo-core's skip-step rule; none where sd = 0                 up
  Reported beside them and not tested: kl10 (10-step mean of sampler_kl,
  up), ess_seq (10-step mean of ess_sequence, down), lr_p99 (10-step mean
  of log_ratio_p99, up); and the oracle `stale`: staleness_max > 2.
  `c` (|cosine|) enters only as the shipped GacAlignmentSpike row.

Alarm conditions at step t:
  own      (primary; every signal but gradz) steps 51-100 give the
           statistic's mean mu and sample sd sigma (at least 2 values, else
           never); for t >= 101 the condition is stat > mu + 3 sigma (up) or
           stat < mu - 3 sigma (down). gradz: z > 6, no early window.
  shipped  (secondary; the alerts of dashboards/gac.rules.yml, for: at 5
           steps a minute): c10 > c_low; m: |m_t| > window_c_low for 25
           steps (for: 5m); c: |c_t| >= c_max; ess: ess_token < 0.5 x its
           median over steps 1-20 for 10 steps (2m); clip:
           clip_fraction_low + clip_fraction_high > 0.2 for 10 steps (2m);
           kl3: kl_k3 > 4 x its median over steps 1-20 and > 0.001 for 10
           steps (2m); gradz > 6. No shipped rule for entropy. "For N steps"
           holds at t when the raw condition held at each of t-N+1..t, all
           of them >= 21 (the for: counts run from step 21): it first holds
           at the N-th consecutive step, so never before step 20 + N.
  oracle   staleness_max > 2 (the batch's lag above the configured 2).
An alarm is a step t >= 101 at which the condition holds and did not hold at
t - 1; a condition that holds at step 101 is an alarm there.

Endpoints (per signal, rule and, for jump runs, jump size S):
  - detection: the first step t in (J, J + 100] at which the condition holds
    (an alarm is not needed); delay t - J. Rate over the finished jump runs
    (Clopper-Pearson), median delay of the detected runs with its bootstrap
    interval, the range. The matched window: the same in the nojump twin,
    window (J, J + 100] of its seed's J (a false detection).
  - false alarms: alarms over steps 101-660 of the finished nojump runs per
    1,000 of their steps (bootstrap over runs of sum alarms / sum steps) and
    the share of those runs with >= 1 alarm (Clopper-Pearson); beside it the
    same over steps 101..J of the jump runs of each S (runs with J = 100 have
    no such step and are left out there).
  - lead before a collapse: jump runs that collapsed at C > J (a collapse at
    or before J is counted and left out): C - (the first alarm in (J, C]);
    median over the runs with such an alarm and its bootstrap interval, the
    range; beside it the oracle's lead C - (J + 1) over all of them. A lead
    equal to the oracle's says that the run became stale, not that it will
    collapse; the table counts them.
  - which jump runs collapse: per jump run the mean of the statistic over
    steps J + 41..J + 140 (its non-empty values); AUC (exp2_stats.auc: P that
    a collapsed run's value lies beyond a non-collapsed run's in the bad
    direction, ties 1/2) per S, the label by analyze.outcome over all the
    run's evaluations with e_0 from its log; runs collapsing at or before
    J + 140 are left out and counted. Beside it the AUC of -J.
  Bootstrap: exp2_stats.bootstrap_ci (10,000 resamples of runs,
  random.Random(52)); a statistic undefined on a resample drops it.

Registered family B (Holm over the 28 tests, analyze.holm):
  B1  per tested signal and S, rule own: McNemar's exact test
      (exp2_stats.mcnemar_exact_p) on the seeds whose jump run and twin both
      finished; b = detected in the jump run only, c = in the twin only.
      "detects the jump" when Holm p < 0.05 and b > c, else "does not detect
      it".
  B2  per tested signal and S: the AUC's two-sided permutation p
      (exp2_stats.permutation_auc_p; runs without a value for the signal
      left out). "tells which runs collapse" (Holm p < 0.05, AUC > 0.5),
      "points the wrong way" (Holm p < 0.05, AUC < 0.5), "no information
      shown" otherwise. An S with fewer than 4 collapsed or fewer than 4
      non-collapsed eligible runs gives "too few collapses" for its 7 tests,
      which leave the family: Holm runs over the tests that remain.

Per-run rows (ROW_KEYS; exp2-b-runs.csv): cell, seed (the key), jump_at (J),
status (finished | failed), steps (CSV rows), start (e_0), outcome
(collapsed | never learned | learned; empty for a failed run), collapse
(step), cpu_s; then for each (signal, rule) of RULES, named <signal>_<rule>:
det_<signal>_<rule> (the first step in (J, J + 100] where the condition
holds), alarms_<signal>_<rule> (alarms in steps 101-660), pre_<signal>_<rule>
(alarms in steps 101..J), after_<signal>_<rule> (the first alarm after J);
and mean_<signal> (the statistic's mean over J + 41..J + 140) for each
own-rule signal. Empty: none. Floats to 6 significant digits.

Tables: exp2-b-outcomes, exp2-b-detection, exp2-b-false-alarms,
exp2-b-leads, exp2-b-separation, exp2-b-family, exp2-b-oracle.

Readings where the design leaves a choice (the design's text holds):
  - "for 25 consecutive steps" fires at the 25th such step; Prometheus,
    evaluating once a step, would move from pending to firing one step later.
  - entropy's reference H is the column's mean over steps 51-100, as the
    older detectors of analyze.py take theirs from the column.
  - gradz starts at step 65 as the design writes; OLMo-core's class (and
    olmo_skip.h) judges a step once 64 values are held counting the step
    itself, i.e. from step 64; no endpoint reads a step before 101.
  - "the 10-step mean sampler_kl, ess_sequence, log_ratio_p99": the
    10-step mean of each of the three.
  - detection reads the condition (a level holding from before J counts
    at J + 1); the lead reads alarms (rising edges), as the design words them.
  - the collapse label is "collapsed" against "learned" or "never learned";
    a failed run has no statistic and leaves the AUC (counted in its table).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze  # noqa: E402  (runs, outcome, calibration, Holm, formatting)
import exp2_stats  # noqa: E402  (Clopper-Pearson, McNemar, bootstrap, AUC and its permutation p)

Series = List[Optional[float]]

CELLS = ["jump16", "jump32", "nojump"]
JUMP_SIZES = {"jump16": 16, "jump32": 32}
STALENESS = 2
SEEDS = list(range(2001, 2025))
STEPS = 660
JUMP_SEED, JUMP_LOW, JUMP_HIGH = 52, 100, 250
JUMP_TABLE = {2001: 168, 2002: 113, 2003: 231, 2004: 223, 2005: 194, 2006: 204, 2007: 108, 2008: 135,
              2009: 140, 2010: 205, 2011: 146, 2012: 188, 2013: 212, 2014: 100, 2015: 108, 2016: 239,
              2017: 199, 2018: 212, 2019: 102, 2020: 160, 2021: 117, 2022: 140, 2023: 143, 2024: 223}

MEAN_SPAN = 10                 # "10-step mean": the step and the 9 before it
EARLY = (51, 100)              # own rule's early window, and entropy's reference
FIRST_ALARM = 101              # alarms count from this step
OWN_SD = 3.0
GRADZ_LIMIT = 6.0
GRADZ_WINDOW, GRADZ_HELD = 128, 64
FOR_FROM = 21                  # the shipped rules' for: counts run from this step
BASELINE = (1, 20)             # the shipped rules' early medians
STEPS_PER_MINUTE = 5
DETECT_SPAN = 100              # detection window (J, J + 100]
MEAN_WINDOW = (41, 140)        # the separation statistic: steps J + 41 .. J + 140
MIN_LABELS = 4                 # B2 needs this many collapsed and non-collapsed runs per size
ALPHA = 0.05

SIGNALS = {  # name: (statistic, bad direction)
    "c10": ("10-step mean of \\|c_t\\|", "up"),
    "m": ("\\|m_t\\|", "up"),
    "ess": ("10-step mean of ess_token", "down"),
    "clip": ("10-step mean of clip_fraction_low + clip_fraction_high", "up"),
    "kl3": ("10-step mean of kl_k3", "up"),
    "entropy": ("relative change of the 10-step mean entropy_mean from steps 51-100", "up"),
    "gradz": ("z-score of grad_norm over the previous 128 steps", "up"),
    "kl10": ("10-step mean of sampler_kl", "up"),
    "ess_seq": ("10-step mean of ess_sequence", "down"),
    "lr_p99": ("10-step mean of log_ratio_p99", "up"),
    "c": ("\\|c_t\\|", "up"),
    "stale": ("staleness_max", "up"),
}
TESTED = ["c10", "m", "ess", "clip", "kl3", "entropy", "gradz"]
REPORTED = ["kl10", "ess_seq", "lr_p99"]
OWN = TESTED + REPORTED
SHIPPED = ["c10", "m", "c", "ess", "clip", "kl3", "gradz"]
FOR_MINUTES = {"m": 5, "ess": 2, "clip": 2, "kl3": 2}
SHIPPED_TEXT = {
    "c10": "c10 > c_low", "m": "\\|m_t\\| > window c_low for 25 steps", "c": "\\|c_t\\| >= c_max",
    "ess": "ess_token < 0.5 x early median for 10 steps", "clip": "clip sum > 0.2 for 10 steps",
    "kl3": "kl_k3 > 4 x early median and > 0.001 for 10 steps", "gradz": "gradz > 6"}
RULES = [(s, "own") for s in OWN] + [(s, "shipped") for s in SHIPPED] + [("stale", "oracle")]
FIELDS = ["det", "alarms", "pre", "after"]

COLUMNS = ["cosine", "window_mean", "ess_token", "clip_fraction_low", "clip_fraction_high", "kl_k3",
           "entropy_mean", "grad_norm", "sampler_kl", "ess_sequence", "log_ratio_p99", "staleness_max"]

KEYS = ["cell", "seed"]
BASE_KEYS = ["jump_at", "status", "steps", "start", "outcome", "collapse", "cpu_s"]
ROW_KEYS = (KEYS + BASE_KEYS + [f"{f}_{s}_{r}" for s, r in RULES for f in FIELDS]
            + [f"mean_{s}" for s in OWN])
TEXT_KEYS = {"cell", "status", "outcome"}
FLOAT_KEYS = {"start", "cpu_s"} | {f"mean_{s}" for s in OWN}


# --- the jump table ------------------------------------------------------------------------

def draw_jump_table(seeds: Sequence[int] = SEEDS) -> Dict[int, int]:
    """The design's draw: random.Random(52), randint(100, 250) once per seed in seed order."""
    rng = random.Random(JUMP_SEED)
    return {seed: rng.randint(JUMP_LOW, JUMP_HIGH) for seed in sorted(seeds)}


def read_jumps(path: str) -> Dict[int, int]:
    """jumps.txt ("<seed> <J>" per line; blank lines and # comments ignored) as {seed: J}."""
    table = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                seed, j = line.split()
                table[int(seed)] = int(j)
    return table


def check_jumps(table: Dict[int, int]) -> None:
    """Raises ValueError, saying where, when table is not the registered JUMP_TABLE."""
    if table == JUMP_TABLE:
        return
    diffs = [f"seed {s}: {table.get(s, 'missing')} (registered {JUMP_TABLE.get(s, 'none')})"
             for s in sorted(set(table) | set(JUMP_TABLE)) if table.get(s) != JUMP_TABLE.get(s)]
    raise ValueError("jumps.txt differs from the registered jump table: " + "; ".join(diffs))


# --- per-step signals ----------------------------------------------------------------------

def finite(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) else None


def ten_step_mean(values: Series, span: int = MEAN_SPAN) -> Series:
    """At each step the mean of the non-empty values among it and the span - 1 before it (fewer at the
    start); None where every one is empty."""
    out = []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - span + 1):i + 1] if v is not None]
        out.append(sum(window) / len(window) if window else None)
    return out


def step_range(values: Series, first: int, last: int) -> List[float]:
    """The non-empty values of steps first..last (step t at index t - 1)."""
    return [v for v in values[max(0, first - 1):max(0, last)] if v is not None]


def relative_entropy(entropy: Series) -> Series:
    """|10-step mean - H| / H, H the column's mean over the early window (steps 51-100)."""
    early = step_range(entropy, *EARLY)
    ref = sum(early) / len(early) if early else None
    if not ref:
        return [None] * len(entropy)
    return [abs(h - ref) / ref if h is not None else None for h in ten_step_mean(entropy)]


def gradz(norms: Series) -> Series:
    """OLMo-core's z-score: (g_t - mean) / sample sd of the non-empty norms of the previous min(t - 1, 128)
    steps, once 64 of them are held (from step 65); None where g_t is empty or sd = 0."""
    out: Series = [None] * len(norms)
    for i in range(GRADZ_HELD, len(norms)):
        window = [v for v in norms[max(0, i - GRADZ_WINDOW):i] if v is not None]
        if norms[i] is None or len(window) < GRADZ_HELD:
            continue
        mu = sum(window) / len(window)
        sd = math.sqrt(sum((v - mu) ** 2 for v in window) / (len(window) - 1))
        if sd > 0.0:
            out[i] = (norms[i] - mu) / sd
    return out


def absolute(values: Series) -> Series:
    return [abs(v) if v is not None else None for v in values]


def clip_sum(low: Series, high: Series) -> Series:
    return [None if a is None and b is None else (a or 0.0) + (b or 0.0) for a, b in zip(low, high)]


def signals(cols: Dict[str, Series]) -> Dict[str, Series]:
    """Every signal's per-step statistic (SIGNALS) from a run's columns."""
    return {"c10": ten_step_mean(absolute(cols["cosine"])), "m": absolute(cols["window_mean"]),
            "ess": ten_step_mean(cols["ess_token"]),
            "clip": ten_step_mean(clip_sum(cols["clip_fraction_low"], cols["clip_fraction_high"])),
            "kl3": ten_step_mean(cols["kl_k3"]), "entropy": relative_entropy(cols["entropy_mean"]),
            "gradz": gradz(cols["grad_norm"]), "kl10": ten_step_mean(cols["sampler_kl"]),
            "ess_seq": ten_step_mean(cols["ess_sequence"]), "lr_p99": ten_step_mean(cols["log_ratio_p99"]),
            "c": absolute(cols["cosine"]), "stale": cols["staleness_max"]}


# --- alarm conditions ----------------------------------------------------------------------

def above(values: Series, bar: float, strict: bool = True) -> List[bool]:
    return [v is not None and (v > bar if strict else v >= bar) for v in values]


def own_condition(stat: Series, direction: str) -> List[bool]:
    """The own rule: beyond the early window's mean -/+ 3 sample sd in the bad direction, from step 101;
    never with fewer than 2 early values."""
    early = step_range(stat, *EARLY)
    out = [False] * len(stat)
    if len(early) < 2:
        return out
    mu, sigma = statistics.fmean(early), statistics.stdev(early)
    for i in range(FIRST_ALARM - 1, len(stat)):
        v = stat[i]
        if v is not None:
            out[i] = v > mu + OWN_SD * sigma if direction == "up" else v < mu - OWN_SD * sigma
    return out


def held_for(raw: List[bool], n: int) -> List[bool]:
    """True at t when raw held at each of steps t-n+1..t, all >= FOR_FROM (n = 0: raw itself)."""
    if n <= 0:
        return list(raw)
    out, run = [], 0
    for i, r in enumerate(raw):
        run = run + 1 if r and i + 1 >= FOR_FROM else 0
        out.append(run >= n)
    return out


def early_median(values: Series) -> Optional[float]:
    early = step_range(values, *BASELINE)
    return statistics.median(early) if early else None


def shipped_raw(name: str, cols: Dict[str, Series], sig: Dict[str, Series], cal: Dict) -> List[bool]:
    """A shipped alert's expression at each step, before its for: duration."""
    if name == "c10":
        return above(sig["c10"], cal["c_low"])
    if name == "m":
        return above(sig["m"], cal["window_c_low"])
    if name == "c":
        return above(sig["c"], cal["c_max"], strict=False)
    if name == "gradz":
        return above(sig["gradz"], GRADZ_LIMIT)
    if name == "clip":
        return above(clip_sum(cols["clip_fraction_low"], cols["clip_fraction_high"]), 0.2)
    if name == "ess":
        med = early_median(cols["ess_token"])
        return [med is not None and v is not None and v < 0.5 * med for v in cols["ess_token"]]
    if name == "kl3":
        med = early_median(cols["kl_k3"])
        return [med is not None and v is not None and v > 4.0 * med and v > 0.001 for v in cols["kl_k3"]]
    raise KeyError(name)


def conditions(cols: Dict[str, Series], sig: Dict[str, Series], cal: Dict) -> Dict[Tuple[str, str], List[bool]]:
    """{(signal, rule): the condition at each step} for every rule of RULES; sig = signals(cols)."""
    out = {}
    for name in OWN:
        if name == "gradz":
            out[(name, "own")] = [i + 1 >= FIRST_ALARM and h for i, h in enumerate(above(sig[name], GRADZ_LIMIT))]
        else:
            out[(name, "own")] = own_condition(sig[name], SIGNALS[name][1])
    for name in SHIPPED:
        minutes = FOR_MINUTES.get(name, 0)
        out[(name, "shipped")] = held_for(shipped_raw(name, cols, sig, cal), minutes * STEPS_PER_MINUTE)
    out[("stale", "oracle")] = above(sig["stale"], float(STALENESS))
    return out


def alarm_steps(cond: List[bool]) -> List[int]:
    """The rising edges from step 101 on (a condition holding at 101 is an alarm there)."""
    return [i + 1 for i in range(FIRST_ALARM - 1, len(cond))
            if cond[i] and (i + 1 == FIRST_ALARM or not cond[i - 1])]


def first_holding(cond: List[bool], after: int, last: int) -> Optional[int]:
    """The first step t in (after, last] at which cond holds, or None."""
    for i in range(max(0, after), min(last, len(cond))):
        if cond[i]:
            return i + 1
    return None


# --- one run --------------------------------------------------------------------------------

def run_fields(cond: List[bool], j: int) -> Dict[str, Optional[int]]:
    """det, alarms (101..660), pre (101..J) and after (first alarm > J) of one condition."""
    alarms = alarm_steps(cond)
    return {"det": first_holding(cond, j, j + DETECT_SPAN),
            "alarms": sum(1 for a in alarms if a <= STEPS), "pre": sum(1 for a in alarms if a <= j),
            "after": next((a for a in alarms if a > j), None)}


def window_means(sig: Dict[str, Series], j: int) -> Dict[str, Optional[float]]:
    """Each own-rule signal's mean over steps J + 41..J + 140 (its non-empty values)."""
    lo, hi = MEAN_WINDOW
    return {f"mean_{name}": analyze.mean(step_range(sig[name], j + lo, j + hi)) for name in OWN}


def run_statistics(cols: Dict[str, Series], j: int, cal: Dict) -> Dict:
    """The per-(signal, rule) and per-signal columns of one finished run with jump (or matched) step j."""
    row, sig = {}, signals(cols)
    for (name, rule), cond in conditions(cols, sig, cal).items():
        for field, value in run_fields(cond, j).items():
            row[f"{field}_{name}_{rule}"] = value
    row.update(window_means(sig, j))
    return row


def read_columns(path: str) -> Dict[str, Series]:
    """The CSV's COLUMNS as per-step lists (empty or non-finite cells None); its steps must be 1..n."""
    header, rows = analyze.read_csv(path)
    steps = [int(r["step"]) for r in rows]
    if steps != list(range(1, len(steps) + 1)):
        raise ValueError(f"{path}: the steps are not 1..{len(steps)} in order")
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(missing)}")
    return {c: [finite(analyze.fnum(r[c])) for r in rows] for c in COLUMNS}


def run_row(path: str, cell: str, seed: int, j: int, cal: Dict) -> Dict:
    """One run's row (ROW_KEYS): a failed (unfinished) run's carries only its key, J and status."""
    row = {k: None for k in ROW_KEYS}
    row.update(cell=cell, seed=seed, jump_at=j, status="failed")
    r = analyze.load_run(path) if os.path.exists(path) else None
    if r is None:
        return row
    cols = read_columns(path)
    out, col = analyze.outcome(r["start"], r["evals"])
    row.update(status="finished", steps=len(r["step"]), start=r["start"], outcome=out, collapse=col,
               cpu_s=analyze.log_cpu_seconds(r["log"]))
    row.update(run_statistics(cols, j, cal))
    return row


def run_path(root: str, cell: str, seed: int) -> str:
    return os.path.join(root, "runs", f"{cell}_s{STALENESS}_seed{seed}.csv")


def collect(root: str) -> List[Dict]:
    """The rows of every run of R/runs found (a .csv or a .log), cell then seed; ValueError when
    R/jumps.txt is not the registered table."""
    table = read_jumps(os.path.join(root, "jumps.txt"))
    check_jumps(table)
    cal = analyze.read_calibration(os.path.join(root, "calibration.txt"))
    for k in ("c_low", "c_max", "window_c_low"):
        if not isinstance(cal.get(k), float):
            raise ValueError(f"calibration.txt has no {k}")
    rows = []
    for cell in CELLS:
        for seed in SEEDS:
            path = run_path(root, cell, seed)
            if os.path.exists(path) or os.path.exists(path[:-4] + ".log"):
                rows.append(run_row(path, cell, seed, table[seed], cal))
    return rows


def missing_runs(root: str) -> List[str]:
    return [os.path.basename(run_path(root, c, s)) for c in CELLS for s in SEEDS
            if not os.path.exists(run_path(root, c, s)) and not os.path.exists(run_path(root, c, s)[:-4] + ".log")]


# --- rows CSV ---------------------------------------------------------------------------------

def write_rows(rows: List[Dict], path: str) -> None:
    analyze.write_row_dicts(path, ROW_KEYS, rows)


def read_rows(path: str) -> List[Dict]:
    return analyze.read_row_dicts(path, ROW_KEYS, ints=set(ROW_KEYS) - TEXT_KEYS - FLOAT_KEYS, texts=TEXT_KEYS)


# --- endpoints ----------------------------------------------------------------------------------

def finished(rows: List[Dict], cell: str) -> List[Dict]:
    return [r for r in rows if r["cell"] == cell and r["status"] == "finished"]


def rate_text(k: int, n: int) -> str:
    """"k/n = rate [lo, hi]" with the Clopper-Pearson interval."""
    if n == 0:
        return "0/0"
    lo, hi = exp2_stats.clopper_pearson(k, n)
    return f"{k}/{n} = {k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def estimate_text(value: Optional[float], ci: Tuple[Optional[float], Optional[float]], digits: int = 3) -> str:
    if value is None:
        return "-"
    lo, hi = ci
    if lo is None:
        return analyze.fmt(float(value), digits)
    return f"{analyze.fmt(float(value), digits)} [{analyze.fmt(float(lo), digits)}, {analyze.fmt(float(hi), digits)}]"


def median_of(values: Sequence[float]) -> float:
    return float(statistics.median(values))


# Each interval is a pure function of its input (every call draws from a fresh random.Random(52)), so equal
# inputs (the oracle's leads in every row, runs without any alarm) are resampled once.
@functools.lru_cache(maxsize=None)
def median_ci(values: Tuple[int, ...]) -> Tuple[Optional[float], Optional[float]]:
    return exp2_stats.bootstrap_ci(list(values), median_of)


@functools.lru_cache(maxsize=None)
def rate_ci(units: Tuple[Tuple[int, int], ...]) -> Tuple[Optional[float], Optional[float]]:
    return exp2_stats.bootstrap_ci(list(units), alarm_rate)


def median_text(values: List[int], digits: int = 1) -> str:
    """The median of values with its bootstrap interval over them."""
    if not values:
        return "-"
    return estimate_text(median_of(values), median_ci(tuple(values)), digits)


def range_text(values: List[int]) -> str:
    return f"{min(values)}–{max(values)}" if values else "-"


def detection(rows: List[Dict], cell: str, name: str, rule: str) -> Tuple[int, int, List[int]]:
    """(detected, runs, delays) of the finished runs of cell in their window (J, J + 100]."""
    runs = finished(rows, cell)
    delays = [r[f"det_{name}_{rule}"] - r["jump_at"] for r in runs if r[f"det_{name}_{rule}"] is not None]
    return len(delays), len(runs), delays


def alarm_rate(units: List[Tuple[int, int]]) -> Optional[float]:
    """Alarms per 1,000 steps of (alarms, steps) units, pooled."""
    alarms, steps = map(sum, zip(*units)) if units else (0, 0)
    return 1000.0 * alarms / steps if steps else None


def false_alarm_units(rows: List[Dict], cell: str, name: str, rule: str) -> List[Tuple[int, int]]:
    """(alarms, steps) per finished run: over 101-660 in nojump runs, over 101..J in jump runs (runs
    without a step there left out)."""
    units = []
    for r in finished(rows, cell):
        if cell == "nojump":
            units.append((r[f"alarms_{name}_{rule}"], max(0, min(r["steps"], STEPS) - FIRST_ALARM + 1)))
        elif min(r["steps"], r["jump_at"]) >= FIRST_ALARM:
            units.append((r[f"pre_{name}_{rule}"], min(r["steps"], r["jump_at"]) - FIRST_ALARM + 1))
    return units


def false_alarm_text(units: List[Tuple[int, int]]) -> List[str]:
    if not units:
        return ["-", "-"]
    rate = estimate_text(alarm_rate(units), rate_ci(tuple(units)), 2)
    return [rate, rate_text(sum(1 for a, _ in units if a > 0), len(units))]


def collapsed_after_jump(rows: List[Dict], cell: str) -> Tuple[List[Dict], int]:
    """The finished runs of cell that collapsed after their jump, and how many collapsed at or before it."""
    col = [r for r in finished(rows, cell) if r["outcome"] == "collapsed"]
    return [r for r in col if r["collapse"] > r["jump_at"]], sum(1 for r in col if r["collapse"] <= r["jump_at"])


def leads(runs: List[Dict], name: str, rule: str) -> List[Tuple[int, int]]:
    """(lead, oracle lead) of the runs with an alarm in (J, C]."""
    out = []
    for r in runs:
        a = r[f"after_{name}_{rule}"]
        if a is not None and a <= r["collapse"]:
            out.append((r["collapse"] - a, r["collapse"] - r["jump_at"] - 1))
    return out


def separation_runs(rows: List[Dict], cell: str) -> Tuple[List[Dict], List[Dict], int]:
    """(collapsed, not collapsed) eligible runs of cell and how many collapsed at or before J + 140."""
    runs = finished(rows, cell)
    late = lambda r: r["collapse"] is not None and r["collapse"] <= r["jump_at"] + MEAN_WINDOW[1]
    bad = [r for r in runs if r["outcome"] == "collapsed" and not late(r)]
    good = [r for r in runs if r["outcome"] != "collapsed"]
    return bad, good, sum(1 for r in runs if late(r))


def separation(rows: List[Dict], cell: str, name: str) -> Tuple[List[float], List[float]]:
    """The eligible runs' window means of a signal: (collapsed, not collapsed); runs without one left out."""
    bad, good, _ = separation_runs(rows, cell)
    pick = lambda rs: [r[f"mean_{name}"] for r in rs if r[f"mean_{name}"] is not None]
    return pick(bad), pick(good)


def jump_auc(rows: List[Dict], cell: str) -> Optional[float]:
    """The AUC of -J (an earlier jump in the bad direction) over the same eligible runs."""
    bad, good, _ = separation_runs(rows, cell)
    return exp2_stats.auc([-r["jump_at"] for r in bad], [-r["jump_at"] for r in good], "up")


# --- registered family B --------------------------------------------------------------------------

def mcnemar_pairs(rows: List[Dict], cell: str, name: str) -> Tuple[int, int, int]:
    """(n, b, c) over the seeds whose jump run (cell) and nojump twin both finished: b detected in the jump
    run only, c in the twin only (rule own)."""
    twins = {r["seed"]: r for r in finished(rows, "nojump")}
    n = b = c = 0
    for r in finished(rows, cell):
        t = twins.get(r["seed"])
        if t is None:
            continue
        jump, twin = r[f"det_{name}_own"] is not None, t[f"det_{name}_own"] is not None
        n += 1
        b += jump and not twin
        c += twin and not jump
    return n, b, c


def enough_labels(rows: List[Dict], cell: str) -> bool:
    bad, good, _ = separation_runs(rows, cell)
    return len(bad) >= MIN_LABELS and len(good) >= MIN_LABELS


def b2_verdict(holm_p: Optional[float], auc: Optional[float]) -> str:
    if holm_p is not None and holm_p < ALPHA and auc is not None and auc > 0.5:
        return "tells which runs collapse"
    if holm_p is not None and holm_p < ALPHA and auc is not None and auc < 0.5:
        return "points the wrong way"
    return "no information shown"


def family(rows: List[Dict]) -> List[Dict]:
    """The 28 tests of family B in order (B1 then B2; signal; size): their statistics, p, Holm p and
    verdict. B2 tests of a size with too few collapses carry p None and leave the Holm family."""
    tests = []
    for cell in JUMP_SIZES:
        for name in TESTED:
            n, b, c = mcnemar_pairs(rows, cell, name)
            tests.append({"test": "B1", "signal": name, "cell": cell, "n": n, "b": b, "c": c,
                          "p": exp2_stats.mcnemar_exact_p(b, c)})
    for cell in JUMP_SIZES:
        enough = enough_labels(rows, cell)
        for name in TESTED:
            bad, good = separation(rows, cell, name)
            auc, p = (exp2_stats.permutation_auc_p(bad, good, SIGNALS[name][1]) if enough else
                      (exp2_stats.auc(bad, good, SIGNALS[name][1]), None))
            tests.append({"test": "B2", "signal": name, "cell": cell, "bad": len(bad), "good": len(good),
                          "auc": auc, "p": p, "enough": enough})
    for t, h in zip(tests, analyze.holm([t["p"] for t in tests])):
        t["holm"] = h
        if t["test"] == "B1":
            t["verdict"] = "detects the jump" if h < ALPHA and t["b"] > t["c"] else "does not detect it"
        else:
            t["verdict"] = b2_verdict(h, t["auc"]) if t["enough"] else "too few collapses"
    return tests


# --- tables -------------------------------------------------------------------------------------

def rule_label(name: str, rule: str) -> str:
    if rule == "shipped":
        return SHIPPED_TEXT[name]
    if rule == "oracle":
        return "staleness_max > 2"
    if name == "gradz":
        return "z > 6"
    return f"early mean {'+' if SIGNALS[name][1] == 'up' else '-'} 3 sd"


def signal_label(name: str) -> str:
    return name + (" (not tested)" if name in REPORTED else "")


def table(header: List[str], lines: List[List[str]]) -> List[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(cells) + " |" for cells in lines])


def outcomes_text(rows: List[Dict]) -> str:
    """Per cell the runs found and their outcomes, a failed run counted as collapsed (and said so)."""
    lines = []
    for cell in CELLS:
        runs = [r for r in rows if r["cell"] == cell]
        done = [r for r in runs if r["status"] == "finished"]
        failed = len(runs) - len(done)
        count = lambda o: sum(1 for r in done if r["outcome"] == o)
        collapsed = f"{count('collapsed') + failed}" + (f" ({failed} failed)" if failed else "")
        steps = sorted(r["collapse"] for r in done if r["collapse"] is not None)
        lines.append([cell, str(len(runs)), str(len(done)), str(failed), str(count("learned")),
                      str(count("never learned")), collapsed, range_text(steps)])
    out = table(["cell", "runs found", "finished", "failed", "learned", "never learned",
                 "collapsed (failed runs counted)", "collapse steps"], lines)
    return "\n".join(out) + "\n"


def detection_text(rows: List[Dict]) -> str:
    lines = []
    for name, rule in RULES:
        k0, n0, _ = detection(rows, "nojump", name, rule)
        for cell, size in JUMP_SIZES.items():
            k, n, delays = detection(rows, cell, name, rule)
            lines.append([signal_label(name), rule, rule_label(name, rule), str(size), rate_text(k, n),
                          median_text(delays), range_text(delays), rate_text(k0, n0)])
    out = table(["signal", "rule", "condition", "S", "detected in (J, J+100]", "median delay [bootstrap]",
                 "delay range", "no-jump twin, matched window (false)"], lines)
    out += ["", "Delay = first step in (J, J + 100] at which the condition holds - J; rates with Clopper-Pearson "
                "95 % intervals; the median over the detected runs with its percentile bootstrap interval "
                "(10,000 resamples of runs, random.Random(52))."]
    return "\n".join(out) + "\n"


def false_alarms_text(rows: List[Dict]) -> str:
    lines = []
    for name, rule in RULES:
        cells = [signal_label(name), rule, rule_label(name, rule)]
        for cell in ["nojump"] + list(JUMP_SIZES):
            cells += false_alarm_text(false_alarm_units(rows, cell, name, rule))
        lines.append(cells)
    out = table(["signal", "rule", "condition", "no-jump: alarms / 1,000 steps [bootstrap]",
                 "no-jump: runs with an alarm", "jump16 before J: alarms / 1,000 steps",
                 "jump16 before J: runs with an alarm", "jump32 before J: alarms / 1,000 steps",
                 "jump32 before J: runs with an alarm"], lines)
    out += ["", "Alarms (rising edges of the condition, counted from step 101) over steps 101-660 of the no-jump "
                "runs and over steps 101..J of the jump runs (a run with J = 100 has no such step and is left "
                "out there), per 1,000 steps pooled; bootstrap over runs."]
    return "\n".join(out) + "\n"


def leads_text(rows: List[Dict]) -> str:
    lines, notes = [], []
    for cell, size in JUMP_SIZES.items():
        runs, before = collapsed_after_jump(rows, cell)
        notes.append(f"S = {size}: {len(runs)} runs collapsed after their jump, {before} at or before it "
                     "(left out).")
        for name, rule in RULES:
            pairs = leads(runs, name, rule)
            lead = [a for a, _ in pairs]
            oracle = [r["collapse"] - r["jump_at"] - 1 for r in runs]
            lines.append([signal_label(name), rule, str(size), f"{len(pairs)}/{len(runs)}", median_text(lead),
                          range_text(lead), str(sum(1 for a, o in pairs if a == o)), median_text(oracle)])
    out = table(["signal", "rule", "S", "alarmed in (J, C]", "median lead C - alarm [bootstrap]", "lead range",
                 "lead = the oracle's", "oracle lead C - (J + 1), all collapsed runs [bootstrap]"], lines)
    out += [""] + notes + ["", "A lead equal to the oracle's says that the run became stale, not that it will "
                               "collapse."]
    return "\n".join(out) + "\n"


def separation_text(rows: List[Dict]) -> str:
    lines = []
    for cell, size in JUMP_SIZES.items():
        _, _, late = separation_runs(rows, cell)
        failed = sum(1 for r in rows if r["cell"] == cell and r["status"] != "finished")
        null = analyze.fmt(jump_auc(rows, cell))
        for name in OWN:
            b, g = separation(rows, cell, name)
            lines.append([signal_label(name), SIGNALS[name][1], str(size), f"{len(b)} / {len(g)}", str(late),
                          str(failed), analyze.fmt(exp2_stats.auc(b, g, SIGNALS[name][1])), null])
    out = table(["signal", "bad direction", "S", "runs (collapsed / not)", "left out: collapsed by J + 140",
                 "left out: failed", "AUC", "AUC of -J"], lines)
    out += ["", "Per jump run the signal's mean over steps J + 41..J + 140; AUC = P(a collapsed run's mean lies "
                "beyond a non-collapsed run's in the bad direction), ties 1/2."]
    return "\n".join(out) + "\n"


def family_text(rows: List[Dict]) -> str:
    lines, tests = [], family(rows)
    for t in tests:
        size = str(JUMP_SIZES[t["cell"]])
        if t["test"] == "B1":
            stats = [f"{t['n']} seeds", str(t["b"]), str(t["c"]), "-"]
        else:
            stats = [f"{t['bad']} / {t['good']}", "-", "-", analyze.fmt(t["auc"])]
        p = analyze.fmt(t["p"], 4) if t["p"] is not None else "left out"
        holm_p = analyze.fmt(t["holm"], 4) if t["holm"] is not None else "-"
        lines.append([t["test"], t["signal"], size] + stats + [p, holm_p, t["verdict"]])
    out = table(["test", "signal", "S", "n (B2: collapsed / not)", "b (jump only)", "c (twin only)", "AUC",
                 "p", "Holm p", "verdict"], lines)
    m = sum(1 for t in tests if t["p"] is not None)
    out += ["", f"Holm over the {m} tests in the family (28 registered; a size with fewer than {MIN_LABELS} "
                f"collapsed or non-collapsed eligible runs leaves it). B1: McNemar's exact test, rule own; "
                "B2: the AUC's two-sided permutation p."]
    return "\n".join(out) + "\n"


def oracle_text(rows: List[Dict]) -> str:
    lines = []
    units = false_alarm_units(rows, "nojump", "stale", "oracle")
    k0, n0, _ = detection(rows, "nojump", "stale", "oracle")
    for cell, size in JUMP_SIZES.items():
        runs = finished(rows, cell)
        at_once = sum(1 for r in runs if r["det_stale_oracle"] == r["jump_at"] + 1)
        k, n, delays = detection(rows, cell, "stale", "oracle")
        col, _ = collapsed_after_jump(rows, cell)
        lines.append([str(size), f"{at_once}/{len(runs)}", rate_text(k, n), median_text(delays), rate_text(k0, n0),
                      false_alarm_text(units)[0], median_text([r["collapse"] - r["jump_at"] - 1 for r in col])])
    out = table(["S", "first stale step = J + 1", "detected", "median delay", "no-jump twin, matched window",
                 "no-jump: alarms / 1,000 steps", "lead C - (J + 1) of the collapsed runs"], lines)
    out += ["", "The oracle: staleness_max > 2, what a trainer that stamps each batch with its policy version "
                "knows at once (delay 1 step, no false alarm by construction)."]
    return "\n".join(out) + "\n"


TABLES: List[Tuple[str, str, Callable[[List[Dict]], str]]] = [
    ("exp2-b-outcomes", "Outcomes", outcomes_text),
    ("exp2-b-detection", "Detection and delay", detection_text),
    ("exp2-b-false-alarms", "False alarms", false_alarms_text),
    ("exp2-b-leads", "Lead before a collapse", leads_text),
    ("exp2-b-separation", "Which jumped runs collapse", separation_text),
    ("exp2-b-family", "Registered family B", family_text),
    ("exp2-b-oracle", "The oracle", oracle_text),
]


def render(rows: List[Dict]) -> Dict[str, str]:
    """{table name: markdown} from the per-run rows."""
    return {name: build(rows) for name, _, build in TABLES}


def markdown(tables: Dict[str, str]) -> str:
    titles = {name: title for name, title, _ in TABLES}
    return "".join(f"### {titles[name]} ({name})\n\n{text}\n" for name, text in tables.items())


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="the part's folder: runs/, jumps.txt, calibration.txt")
    ap.add_argument("--out", required=True, help="where exp2-b-runs.csv and exp2-b.md go")
    args = ap.parse_args(argv)
    try:
        rows = collect(args.root)
    except (OSError, ValueError) as e:
        sys.exit(f"exp2_jumps.py: {e}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "exp2-b-runs.csv")
    write_rows(rows, path)
    rows = read_rows(path)
    with open(os.path.join(args.out, "exp2-b.md"), "w") as f:
        f.write(markdown(render(rows)))
    failed = [f"{r['cell']}_s{STALENESS}_seed{r['seed']}" for r in rows if r["status"] != "finished"]
    missing = missing_runs(args.root)
    print(f"exp2_jumps.py: {len(rows)} runs found, {len(rows) - len(failed)} finished; "
          f"unfinished: {', '.join(failed) or 'none'}; missing: {len(missing)}"
          + (f" ({', '.join(missing)})" if missing else ""))
    check_oracle(rows)
    return 0


def check_oracle(rows: List[Dict]) -> None:
    """Warns where a jump run's first stale step is not J + 1 or a nojump run has a stale step."""
    for r in rows:
        if r["status"] != "finished":
            continue
        if r["cell"] in JUMP_SIZES and r["det_stale_oracle"] != r["jump_at"] + 1:
            print(f"exp2_jumps.py: warning: {r['cell']} seed {r['seed']}: staleness_max does not first exceed "
                  f"{STALENESS} at J + 1 = {r['jump_at'] + 1}", file=sys.stderr)
        elif r["cell"] not in JUMP_SIZES and r["alarms_stale_oracle"]:
            print(f"exp2_jumps.py: warning: nojump seed {r['seed']}: staleness_max exceeds {STALENESS}",
                  file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
