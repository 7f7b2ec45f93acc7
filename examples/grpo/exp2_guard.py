#!/usr/bin/env python3
"""Part D of the second registered experiment (docs/RESULTS.md, "Second
registered experiment: pre-registered design", "Part D: the spike guard at
2-30x the recent norm"): gac's spike guard and OLMo-core's skip-step rule on
injected gradient spikes k times the recent norm, and on natural ones.

Runs: ROOT/runs/<arm>_s<s>_seed<i>.csv with its .log, s in {0, 16}, seeds
4001-4024, arms `cleanguard` (nothing injected) and `injguard-<k>`, k in
{2, 3, 5, 10, 30} (gac_grpo --clip-grad 1e9 --agent local --c-low 0.999
--c-high 1 --spike-sigma 6, and for injguard-k --inject-spikes 0.01
--inject-scale k --inject-after 50 --inject-relative 128). Columns read:
step, heldout_acc, loss, grad_norm, regime, stepped, injected, inject_factor.
A run whose .log has no "summary:" line failed (a non-finite loss or a crash
ends the trainer without one): it is a row of status "failed", listed; the
steps it recorded count in every step-based endpoint (recall, precision,
false skips, natural spikes, family D, the backtest: each step was judged
by both rules before the failure, and a spike that got through and broke
the run must not leave the counts), and it is left out of the accuracy
pairs.

The CSV's grad_norm is the norm of the gradient the agent was handed
(controller.cc: sqrt of its squared sum), before clipping and before any GAC
change; on an injected step it is the rescaled norm, on every other step the
raw norm that the trainer's n-bar averages (main.cc, SpikeFactor::Observe).

Rules, per run (steps in the CSV's order):

- gac's guard skipped a step when its regime is "spike".
- OLMo-core's rule (sigma 6, 128 steps) is replayed on the run's own loss and
  grad_norm: by the class olmo_core.optim.SkipStepOptimizer (ai2-olmo-core
  3.0.0, spikes.olmo_verdicts) where importable, else by OlmoSkipRule below,
  examples/grpo/olmo_skip.h operation for operation (a listed departure).
  Every step enters its history, skipped ones too; from max(2, 128 // 2) held
  values a step is skipped when its loss or its norm exceeds the mean of the
  up to 128 steps before it by more than 6 sample sds (a comparison with NaN
  skips). The row says which judged (olmo_judge); with the class, the
  stand-in is run too and olmo_standin_same says whether it skipped exactly
  the class's steps.
- n-bar_t: the mean grad_norm of the last 128 earlier steps not injected
  (all of them while fewer exist; non-finite norms left out, as the trainer
  does); none before the first such step.
- A natural spike of magnitude >= k: a step not injected, t >= 65, with a
  finite grad_norm >= k n-bar_t. Counted for every k in every run.
- The fault's check (consistent): injected steps whose grad_norm / n-bar_t
  lies within 1e-3 (relative) of the run's k; factor_bad: injected steps
  whose inject_factor is not a positive finite number plus other steps whose
  inject_factor is not empty (None without the column).

Endpoints, per rule, k and s (pooled counts of steps; CP = Clopper-Pearson
95 %, exp2_stats.clopper_pearson):
- recall = injected steps skipped / injected steps, over the injguard-k runs
  (CP); caught when the CP lower bound >= 0.90, missed when the upper bound
  < 0.50, partly caught otherwise (no test);
- precision = injected steps skipped / steps skipped, in the injguard-k runs
  (CP); and (injected skipped + natural spikes >= k skipped) / skipped (CP);
- false skips = skips of steps not injected per 1,000 steps of the runs (all
  CSV steps), over all runs at s and over the cleanguard runs alone;
- natural spikes >= k per 1,000 steps over all runs at s, and the share of
  them each rule skipped (CP). Rates carry the percentile bootstrap interval
  over runs (exp2_stats.bootstrap_ci: 10,000 resamples, Random(52)) of the
  pooled rate.
- Family D (Holm over the 12 tests, analyze.holm): per k and s, McNemar's
  exact test (exp2_stats.mcnemar_exact_p) on the injected steps of the
  injguard-k runs, b = skipped by the guard only, c = by OLMo-core's rule
  only (10 tests); per s, the same on the steps not injected of every run at
  s (2 tests). Verdict: "the guard catches more/fewer k× spikes than
  OLMo-core's rule" (false skips: "makes more/fewer false skips") when Holm
  p < 0.05, by the sign of b - c; "no difference shown" otherwise. A cell
  without runs leaves the family (said in the table).
- Accuracy (not tested): the primary endpoint (analyze.last_evals_mean, the
  last 5 evaluations) of each injguard-k arm beside cleanguard's, paired by
  seed, mean and 95 % t-interval (analyze.paired_ci); n = the seeds at which
  both finished.
- Descriptive: gac's guard replayed by `gacctl backtest --spike-sigma S
  --spike-window 128 --spike-warmup 64` at S in {3, 4, 5, 6} on the finished
  runs' CSVs (with --gacctl): per run its spikes and injected steps caught
  (columns bt_*), hence recall per k and false skips per 1,000 steps per S,
  and at S = 6 the runs where the replay's counts equal the trainer's (the
  guard's replay reads grad_norm, loss and injected: the archive's CSVs as
  they are).

Per-run rows (ROW_KEYS; exp2-d-runs.csv): arm, staleness, seed (the key); k
(none for cleanguard); status (finished | failed); steps (CSV rows);
injected; guard_skips, guard_caught (injected among them); olmo_skips,
olmo_caught; inj_guard_only, inj_olmo_only (McNemar's discordant injected
steps); clean_guard_only, clean_olmo_only (the same on steps not injected);
natural_<k>, natural_<k>_guard, natural_<k>_olmo for every k (natural spikes
>= k and how many each rule skipped); endpoint; olmo_judge ("class 3.0.0":
the class and ai2-olmo-core's version, or "stand-in"); olmo_standin_same
(1/0, none without the class); consistent; factor_bad; bt_spikes_<S>,
bt_caught_<S> per sigma S (none unless computed). The tables are built from
the rows as read back, so committed rows rebuild them, the backtest's
included: exp2-d-status (finished, failed and missing runs, the judge),
exp2-d-detection (recall, precision, the verdict), exp2-d-false-skips,
exp2-d-natural, exp2-d-family, exp2-d-accuracy, exp2-d-fault (the
consistency check) and, when computed, exp2-d-backtest.

    .venv/bin/python examples/grpo/exp2_guard.py --root R --out DIR [--gacctl build/cli/gacctl]

writes DIR/exp2-d-runs.csv and DIR/exp2-d.md (every table under a heading).
OLMo-core's class is importable without its torch pin from a --target
install (see spikes.py's docstring): PYTHONPATH=DIR .venv/bin/python ...
"""

from __future__ import annotations

import argparse
import collections
import csv
import glob
import itertools
import math
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze  # noqa: E402  (CSV reading, endpoint, paired interval, Holm, formatting)
import exp2_stats  # noqa: E402  (Clopper-Pearson, McNemar, bootstrap)
import spikes  # noqa: E402  (the run loader, OLMo-core's class, detection counts)

KS = (2, 3, 5, 10, 30)
STALENESS = (0, 16)
SEEDS = tuple(range(4001, 4025))
ARMS = ("cleanguard",) + tuple(f"injguard-{k}" for k in KS)
WINDOW = 128               # n-bar's history and both rules' window
NATURAL_FROM = 65          # a natural spike is a step t >= this
OLMO_SIGMA = 6.0
CONSISTENCY_TOL = 1e-3     # |grad_norm / n-bar - k| <= this x k
CAUGHT_LOWER = 0.90        # caught: recall's CP lower bound >= this
MISSED_UPPER = 0.50        # missed: recall's CP upper bound < this
FAMILY_ALPHA = 0.05
BACKTEST_SIGMAS = (3, 4, 5, 6)
BACKTEST_FLAGS = ["--spike-window", str(WINDOW), "--spike-warmup", str(WINDOW // 2)]
RULES = (("guard", "gac's guard"), ("olmo", "OLMo-core's rule"))

KEYS = ["arm", "staleness", "seed"]
ROW_KEYS = (KEYS + ["k", "status", "steps", "injected", "guard_skips", "guard_caught", "olmo_skips", "olmo_caught",
                    "inj_guard_only", "inj_olmo_only", "clean_guard_only", "clean_olmo_only"]
            + [f"natural_{k}{suffix}" for k in KS for suffix in ("", "_guard", "_olmo")]
            + ["endpoint", "olmo_judge", "olmo_standin_same", "consistent", "factor_bad"]
            + [f"bt_{what}_{sigma}" for sigma in BACKTEST_SIGMAS for what in ("spikes", "caught")])
TEXT_KEYS = {"arm", "status", "olmo_judge"}
FLOAT_KEYS = {"endpoint"}

Step = Tuple[int, float, float, str, bool]  # spikes.load's (step, loss, grad_norm, regime, injected)


# --- the rules on one run -------------------------------------------------------------------

class OlmoSkipRule:
    """examples/grpo/olmo_skip.h in Python, operation for operation (the same sums in the same order, so the
    same doubles): every step's loss and norm enter histories of the last window + 1 values; once
    max(2, window // 2) are held, the step is skipped when the newest value minus the mean of the ones before
    it is not <= sigma x their sample sd (NaN skips)."""

    def __init__(self, sigma: float = OLMO_SIGMA, window: int = WINDOW):
        self.sigma, self.window = sigma, window
        self.losses: collections.deque = collections.deque()
        self.norms: collections.deque = collections.deque()

    def skip(self, loss: float, grad_norm: float) -> bool:
        """Records the step's loss and norm, then says whether to skip it."""
        self._push(self.losses, loss)
        self._push(self.norms, grad_norm)
        if len(self.losses) < max(2, self.window // 2):
            return False
        return self._above(self.losses) or self._above(self.norms)

    def _push(self, d: collections.deque, x: float) -> None:
        d.append(x)
        while len(d) > self.window + 1:
            d.popleft()

    def _above(self, d: collections.deque) -> bool:
        n = float(len(d) - 1)
        mean = 0.0
        for x in itertools.islice(d, len(d) - 1):
            mean += x
        mean /= n
        ss = 0.0
        for x in itertools.islice(d, len(d) - 1):
            ss += (x - mean) * (x - mean)
        sd = math.sqrt(ss / (n - 1.0)) if n > 1.0 else math.nan  # C++: 0 / 0 is NaN
        return not (d[-1] - mean <= self.sigma * sd)


def olmo_standin(steps: Sequence[Step]) -> Set[int]:
    """The steps OlmoSkipRule (sigma 6, 128 steps) skips, fed each step's loss and grad_norm in order."""
    rule = OlmoSkipRule()
    return {step for step, loss, norm, _, _ in steps if rule.skip(loss, norm)}


def olmo_skips(steps: Sequence[Step]) -> Tuple[Set[int], str, Optional[int]]:
    """(skipped steps, judge, stand-in same): by OLMo-core's class where importable ("class <version>"; the
    stand-in's agreement 1/0 beside it), else by the stand-in ("stand-in", None)."""
    standin = olmo_standin(steps)
    judged = spikes.olmo_verdicts(steps)
    if judged is None:
        return standin, "stand-in", None
    return judged, class_judge(), int(judged == standin)


def class_judge() -> str:
    """"class <version of ai2-olmo-core>" ("class ?" where its metadata cannot be read)."""
    try:
        from importlib.metadata import version
        return f"class {version('ai2-olmo-core')}"
    except Exception:  # noqa: BLE001  (an install without metadata still judges)
        return "class ?"


def recent_means(norms: Sequence[float], injected: Sequence[bool], window: int = WINDOW) -> List[Optional[float]]:
    """n-bar per step: the mean of the finite norms of the last `window` earlier steps not injected (None
    before the first)."""
    out: List[Optional[float]] = []
    history: collections.deque = collections.deque(maxlen=window)
    for norm, inj in zip(norms, injected):
        out.append(sum(history) / len(history) if history else None)
        if not inj and math.isfinite(norm):
            history.append(norm)
    return out


def natural_spikes(numbers: Sequence[int], norms: Sequence[float], injected: Sequence[bool],
                   means: Sequence[Optional[float]], k: float) -> Set[int]:
    """Steps t >= 65 not injected with a finite norm >= k x n-bar_t."""
    return {t for t, norm, inj, m in zip(numbers, norms, injected, means)
            if t >= NATURAL_FROM and not inj and m is not None and math.isfinite(norm) and norm >= k * m}


def consistent_count(norms: Sequence[float], injected: Sequence[bool], means: Sequence[Optional[float]],
                     k: float) -> int:
    """Injected steps whose norm / n-bar is within CONSISTENCY_TOL (relative) of k."""
    return sum(1 for norm, inj, m in zip(norms, injected, means)
               if inj and m and abs(norm / m - k) <= CONSISTENCY_TOL * k)


def factor_bad_count(injected: Sequence[bool], factors: Optional[Sequence[str]]) -> Optional[int]:
    """Injected steps without a positive finite inject_factor plus other steps with one (None: no column)."""
    if factors is None:
        return None
    bad = 0
    for inj, cell in zip(injected, factors):
        if inj:
            value = analyze.fnum(cell)
            bad += not (value is not None and math.isfinite(value) and value > 0)
        else:
            bad += cell != ""
    return bad


# --- per-run rows ------------------------------------------------------------------------------

def arm_k(arm: str) -> Optional[int]:
    """The injected magnitude of an arm of part D (None for cleanguard)."""
    return int(arm.split("-", 1)[1]) if arm.startswith("injguard-") else None


def inject_factors(path: str) -> Optional[List[str]]:
    """The inject_factor cells of a run's CSV, in its order (None without the column)."""
    header, rows = analyze.read_csv(path)
    return [r["inject_factor"] for r in rows] if "inject_factor" in header else None


def empty_row(arm: str, s: int, seed: int, status: str) -> Dict[str, object]:
    row: Dict[str, object] = {key: None for key in ROW_KEYS}
    row.update(arm=arm, staleness=s, seed=seed, k=arm_k(arm), status=status)
    return row


def run_row(arm: str, s: int, seed: int, run: dict, factors: Optional[List[str]]) -> Dict[str, object]:
    """One finished run's row (ROW_KEYS; the backtest's columns empty). run: spikes.load's."""
    steps = run["steps"]
    numbers = [t for t, _, _, _, _ in steps]
    norms = [norm for _, _, norm, _, _ in steps]
    injected = [inj for _, _, _, _, inj in steps]
    inj = {t for t, i in zip(numbers, injected) if i}
    guard = {t for t, _, _, regime, _ in steps if regime == "spike"}
    olmo, judge, same = olmo_skips(steps)
    row = empty_row(arm, s, seed, "finished")
    n_inj, row["guard_caught"], row["guard_skips"] = spikes.detection(steps, guard)
    _, row["olmo_caught"], row["olmo_skips"] = spikes.detection(steps, olmo)
    row.update(steps=len(steps), injected=n_inj, endpoint=run["endpoint"], olmo_judge=judge, olmo_standin_same=same,
               inj_guard_only=len((inj & guard) - olmo), inj_olmo_only=len((inj & olmo) - guard),
               clean_guard_only=len(guard - olmo - inj), clean_olmo_only=len(olmo - guard - inj),
               factor_bad=factor_bad_count(injected, factors))
    means = recent_means(norms, injected)
    for k in KS:
        natural = natural_spikes(numbers, norms, injected, means, k)
        row[f"natural_{k}"], row[f"natural_{k}_guard"] = len(natural), len(natural & guard)
        row[f"natural_{k}_olmo"] = len(natural & olmo)
    row["consistent"] = consistent_count(norms, injected, means, row["k"]) if row["k"] is not None else None
    return row


def run_files(root: str) -> Tuple[Dict[Tuple[str, int, int], str], List[str]]:
    """{(arm, s, seed): CSV path} of part D's runs in ROOT/runs, and the CSV names of other arms."""
    found, other = {}, []
    for path in sorted(glob.glob(os.path.join(root, "runs", "*.csv"))):
        key = analyze.run_key(path)
        if key is None or key[0] not in ARMS:
            other.append(os.path.basename(path))
        else:
            found[key] = path
    return found, other


def collect(root: str, gacctl: Optional[str] = None) -> List[Dict[str, object]]:
    """One row per run of part D in ROOT/runs (ROW_KEYS; a run without "summary:" in its log a "failed" row),
    in the order of ARMS, staleness, seed; with gacctl (its path) the backtest's columns filled too."""
    rows = []
    found, _ = run_files(root)
    for (arm, s, seed), path in sorted(found.items(), key=lambda kv: (ARMS.index(kv[0][0]), kv[0][1], kv[0][2])):
        failed = spikes.load(path) is None
        run = spikes.load(path, finished_only=False)
        row = run_row(arm, s, seed, run, inject_factors(path)) if run["steps"] else empty_row(arm, s, seed, "failed")
        if failed:
            row.update(status="failed", endpoint=None)
        rows.append(row)
    if gacctl:
        add_backtest(rows, backtest(gacctl, root, rows))
    return rows


def rebuilt_rows(root: str) -> Tuple[List[Dict[str, object]], Tuple[str, ...]]:
    """The rows as `analyze.py tables` rebuilds them on this machine, and the columns it cannot rebuild here:
    the backtest's need gacctl (GAC_GACCTL names it); OLMo-core's judge columns need olmo_core (without it
    the stand-in judges, which skips the same steps)."""
    gacctl = os.environ.get("GAC_GACCTL")
    cannot: Tuple[str, ...] = () if spikes.olmo_verdicts([]) is not None else ("olmo_judge", "olmo_standin_same")
    if not gacctl:
        cannot += tuple(k for k in ROW_KEYS if k.startswith("bt_"))
    return collect(root, gacctl=gacctl), cannot


# --- the backtest --------------------------------------------------------------------------------

def stage_for_backtest(path: str, into: str) -> None:
    """The run's CSV and log, linked into `into`."""
    for src in (path, path[:-4] + ".log"):
        os.symlink(os.path.abspath(src), os.path.join(into, os.path.basename(src)))


def backtest(gacctl: str, root: str, rows: List[Dict[str, object]],
             sigmas: Sequence[int] = BACKTEST_SIGMAS) -> Dict[Tuple[str, int, int], Dict[int, Tuple[int, int]]]:
    """{(arm, s, seed): {sigma: (spikes, injected caught)}}: `gacctl backtest` of the spike guard at each sigma
    on the finished runs' CSVs (window 128, warm-up 64)."""
    found, _ = run_files(root)
    out: Dict[Tuple[str, int, int], Dict[int, Tuple[int, int]]] = collections.defaultdict(dict)
    done_rows = judged(rows)
    with tempfile.TemporaryDirectory() as tmp:
        for row in done_rows:
            stage_for_backtest(found[(row["arm"], row["staleness"], row["seed"])], tmp)
        for sigma in sigmas if done_rows else ():
            done = subprocess.run([gacctl, "backtest", tmp, "--spike-sigma", str(sigma), *BACKTEST_FLAGS,
                                   "--format", "csv"], capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"exp2_guard.py: gacctl backtest failed (exit {done.returncode}): {done.stderr}")
            for r in csv.DictReader(done.stdout.splitlines()):
                if r["run"] != "all":
                    out[analyze.run_key(r["run"] + ".csv")][sigma] = (int(r["spikes"]), int(r["caught"]))
    return out


def add_backtest(rows: List[Dict[str, object]], found: Dict[Tuple[str, int, int], Dict[int, Tuple[int, int]]]) -> None:
    """Fills the rows' bt_* columns from backtest()'s result."""
    for row in rows:
        for sigma, (n_spikes, caught) in found.get((row["arm"], row["staleness"], row["seed"]), {}).items():
            row[f"bt_spikes_{sigma}"], row[f"bt_caught_{sigma}"] = n_spikes, caught


# --- rows on disk --------------------------------------------------------------------------------

def write_rows(rows: List[Dict[str, object]], path: str) -> None:
    """The per-run CSV (ROW_KEYS; analyze.csv_cell: floats to 6 significant digits, None empty)."""
    analyze.write_row_dicts(path, ROW_KEYS, rows)


def read_rows(path: str) -> List[Dict[str, object]]:
    """write_rows' file read back: text, float (endpoint) or int cells; empty cells None."""
    return analyze.read_row_dicts(path, ROW_KEYS, ints=set(ROW_KEYS) - TEXT_KEYS - FLOAT_KEYS, texts=TEXT_KEYS)


# --- tables --------------------------------------------------------------------------------------

def finished(rows: List[Dict[str, object]], arm: Optional[str] = None, s: Optional[int] = None) -> List[dict]:
    return [r for r in rows if r["status"] == "finished" and (arm is None or r["arm"] == arm)
            and (s is None or r["staleness"] == s)]


def judged(rows: List[Dict[str, object]], arm: Optional[str] = None, s: Optional[int] = None) -> List[dict]:
    """The runs whose steps count: the finished ones and the failed ones up to their failure."""
    return [r for r in rows if r["steps"] and (arm is None or r["arm"] == arm) and (s is None or r["staleness"] == s)]


def total(rows: List[dict], key: str) -> int:
    return sum(r[key] or 0 for r in rows)


def line(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(names: Sequence[str]) -> List[str]:
    return [line(names), line(["---"] * len(names))]


def interval(lo: Optional[float], hi: Optional[float]) -> str:
    return "" if lo is None else f" [{analyze.fmt(lo)}, {analyze.fmt(hi)}]"


def pvalue(p: Optional[float]) -> str:
    """3 decimals, or 2 significant digits below 0.001 ("-" for None)."""
    return analyze.fmt(p) if p is None or p >= 0.001 else f"{p:.1e}"


def proportion(k: int, n: int) -> str:
    """"k/n: p [CP interval]"; "0/0" without a denominator."""
    if n == 0:
        return "0/0"
    return f"{k}/{n}: {analyze.fmt(k / n)}" + interval(*exp2_stats.clopper_pearson(k, n))


def per_thousand(pairs: List[Tuple[int, int]]) -> Optional[float]:
    """1,000 x the pooled count / the pooled steps of (count, steps) pairs; None without a step."""
    steps = sum(n for _, n in pairs)
    return 1000.0 * sum(c for c, _ in pairs) / steps if steps else None


def rate(runs: List[dict], count) -> str:
    """The pooled count(run) per 1,000 steps over the runs, with its bootstrap interval over runs."""
    pairs = [(count(r), r["steps"]) for r in runs]
    point = per_thousand(pairs)
    if point is None:
        return "-"
    return analyze.fmt(point) + interval(*exp2_stats.bootstrap_ci(pairs, per_thousand))


def recall_verdict(caught: int, n: int) -> str:
    """caught / missed / partly caught by the recall's CP bounds (no test)."""
    if n == 0:
        return "-"
    lo, hi = exp2_stats.clopper_pearson(caught, n)
    if lo >= CAUGHT_LOWER:
        return "caught"
    return "missed" if hi < MISSED_UPPER else "partly caught"


def judge_label(rows: List[dict]) -> str:
    """Which judged OLMo-core's rule in the finished rows: class, stand-in, or both with their counts."""
    judges = collections.Counter(r["olmo_judge"] for r in judged(rows))
    if len(judges) == 1:
        return next(iter(judges))
    return ", ".join(f"{j} in {n} runs" for j, n in sorted(judges.items()))


def judge_note(rows: List[dict]) -> str:
    """The sentence saying who judged OLMo-core's rule (the stand-in is a listed departure)."""
    done = judged(rows)
    parts = []
    for judge, n in sorted(collections.Counter(r["olmo_judge"] for r in done).items()):
        who = ("the stand-in (examples/grpo/olmo_skip.h in Python: a listed departure)" if judge == "stand-in" else
               f"the class olmo_core.optim.SkipStepOptimizer (ai2-olmo-core {judge.split(' ', 1)[-1]})")
        parts.append(f"by {who} in {n} of {len(done)} runs")
    text = (f"OLMo-core's rule (sigma {OLMO_SIGMA:g}, {WINDOW} steps) replayed on each run's loss and grad_norm: "
            + ("; ".join(parts) or "no finished run"))
    by_class = [r for r in done if r["olmo_standin_same"] is not None]
    if by_class:
        same = sum(r["olmo_standin_same"] for r in by_class)
        text += f"; the stand-in skipped exactly the class's steps in {same} of those {len(by_class)}"
    return text + "."


def seed_ranges(seeds: Sequence[int]) -> str:
    """Sorted seeds as ranges ("4001-4003, 4007"); "none" when empty."""
    parts: List[str] = []
    for _, group in itertools.groupby(enumerate(sorted(seeds)), key=lambda iv: iv[1] - iv[0]):
        run = [v for _, v in group]
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(parts) or "none"


def runs_table(rows: List[dict]) -> str:
    out = [f"The registered runs (seeds {SEEDS[0]}-{SEEDS[-1]}): finished, failed (no \"summary:\" in the log: the "
           "steps it recorded count, its accuracy does not) and missing (no CSV).", ""]
    out += header(["arm", "s", "finished", "failed (seeds)", "missing (seeds)", "OLMo-core's rule judged by"])
    for arm in ARMS:
        for s in STALENESS:
            rs = [r for r in rows if r["arm"] == arm and r["staleness"] == s]
            failed = [r["seed"] for r in rs if r["status"] != "finished"]
            missing = sorted(set(SEEDS) - {r["seed"] for r in rs})
            out.append(line([arm, s, len(rs) - len(failed), seed_ranges(failed), seed_ranges(missing),
                             judge_label(rs) if finished(rs) else "-"]))
    return "\n".join(out) + "\n"


def detection_table(rows: List[dict]) -> str:
    out = [judge_note(rows) + " Recall and precision pool the steps of the injguard-k runs; the last column "
           "counts a natural spike >= k (not injected, t >= 65, |g| >= k n-bar) skipped as a true skip. "
           f"Verdict (no test): caught when recall's lower bound >= {CAUGHT_LOWER:.2f}, missed when its upper "
           f"bound < {MISSED_UPPER:.2f}, else partly caught.", ""]
    out += header(["s", "k", "rule", "runs", "recall: caught/injected [CP]", "verdict",
                   "precision: caught/skips [CP]", "precision, natural spikes >= k true [CP]"])
    for s in STALENESS:
        for k in KS:
            rs = judged(rows, f"injguard-{k}", s)
            if not rs:
                continue
            n_inj = total(rs, "injected")
            for rule, label in RULES:
                caught, skips = total(rs, f"{rule}_caught"), total(rs, f"{rule}_skips")
                natural = total(rs, f"natural_{k}_{rule}")
                label = label if rule == "guard" else f"{label} ({judge_label(rs)})"
                out.append(line([s, k, label, len(rs), proportion(caught, n_inj), recall_verdict(caught, n_inj),
                                 proportion(caught, skips), proportion(caught + natural, skips)]))
    return "\n".join(out) + "\n"


def false_skips_table(rows: List[dict]) -> str:
    out = ["False skips: skips of steps not injected, per 1,000 steps of the runs (bootstrap interval over "
           "runs). " + judge_note(rows), ""]
    out += header(["s", "rule", "all runs", "false skips", "per 1,000 steps [bootstrap]", "cleanguard runs",
                   "false skips", "per 1,000 steps [bootstrap]"])
    for s in STALENESS:
        every, clean = judged(rows, s=s), judged(rows, "cleanguard", s)
        if not every:
            continue
        for rule, label in RULES:
            count = lambda r, rule=rule: r[f"{rule}_skips"] - r[f"{rule}_caught"]
            out.append(line([s, label, len(every), sum(map(count, every)), rate(every, count), len(clean),
                             sum(map(count, clean)), rate(clean, count)]))
    return "\n".join(out) + "\n"


def natural_table(rows: List[dict]) -> str:
    out = [f"Natural spikes >= k: steps not injected, t >= {NATURAL_FROM}, |g_t| >= k n-bar_t (n-bar_t: the mean "
           f"|g| of the last {WINDOW} earlier steps not injected), over every run at s; per 1,000 steps with the "
           "bootstrap interval over runs; the share each rule skipped (CP). " + judge_note(rows), ""]
    out += header(["s", "k", "runs", "natural spikes", "per 1,000 steps [bootstrap]", "skipped by gac's guard [CP]",
                   "skipped by OLMo-core's rule [CP]"])
    for s in STALENESS:
        rs = judged(rows, s=s)
        for k in KS if rs else ():
            n = total(rs, f"natural_{k}")
            out.append(line([s, k, len(rs), n, rate(rs, lambda r, k=k: r[f"natural_{k}"]),
                             proportion(total(rs, f"natural_{k}_guard"), n),
                             proportion(total(rs, f"natural_{k}_olmo"), n)]))
    return "\n".join(out) + "\n"


def family(rows: List[dict]) -> List[Dict[str, object]]:
    """Family D: per k and s McNemar on the injected steps of the injguard-k runs, per s on the steps not
    injected of every run at s (b: the guard only, c: OLMo-core's rule only); Holm over the tests with runs."""
    tests: List[Dict[str, object]] = []
    for s in STALENESS:
        for k in KS:
            rs = judged(rows, f"injguard-{k}", s)
            tests.append({"kind": "injected", "s": s, "k": k, "runs": len(rs), "b": total(rs, "inj_guard_only"),
                          "c": total(rs, "inj_olmo_only")})
    for s in STALENESS:
        rs = judged(rows, s=s)
        tests.append({"kind": "not injected", "s": s, "k": None, "runs": len(rs), "b": total(rs, "clean_guard_only"),
                      "c": total(rs, "clean_olmo_only")})
    for t in tests:
        t["p"] = exp2_stats.mcnemar_exact_p(t["b"], t["c"]) if t["runs"] else None
    for t, adjusted in zip(tests, analyze.holm([t["p"] for t in tests])):
        t["holm"] = adjusted
        t["verdict"] = family_verdict(t)
    return tests


def family_verdict(t: Dict[str, object]) -> str:
    if t["holm"] is None:
        return "no runs: left out of the family"
    if t["holm"] >= FAMILY_ALPHA or t["b"] == t["c"]:
        return "no difference shown"
    more = "more" if t["b"] > t["c"] else "fewer"
    if t["kind"] == "injected":
        return f"the guard catches {more} {t['k']}× spikes than OLMo-core's rule"
    return f"the guard makes {more} false skips than OLMo-core's rule"


def family_table(rows: List[dict]) -> str:
    tests = family(rows)
    tested = sum(t["p"] is not None for t in tests)
    out = [f"McNemar's exact test on steps (b: skipped by gac's guard only, c: by OLMo-core's rule only); Holm over "
           f"the {tested} tests with runs (registered: 12). " + judge_note(rows), ""]
    out += header(["steps", "s", "k", "runs", "b", "c", "p", "Holm p", "verdict"])
    for t in tests:
        out.append(line([t["kind"], t["s"], t["k"] if t["k"] is not None else "all", t["runs"], t["b"], t["c"],
                         pvalue(t["p"]), pvalue(t["holm"]), t["verdict"]]))
    return "\n".join(out) + "\n"


def accuracy_table(rows: List[dict]) -> str:
    out = ["Primary endpoint (mean held-out accuracy of the last 5 evaluations), not tested: each injguard-k arm "
           "beside cleanguard, paired by seed (n: seeds at which both finished), mean and 95 % t-interval.", ""]
    out += header(["s", "arm", "n", "arm's mean", "cleanguard's mean", "arm − cleanguard [95 % CI]"])
    for s in STALENESS:
        clean = {r["seed"]: r["endpoint"] for r in finished(rows, "cleanguard", s) if r["endpoint"] is not None}
        for k in KS:
            arm = {r["seed"]: r["endpoint"] for r in finished(rows, f"injguard-{k}", s) if r["endpoint"] is not None}
            seeds = sorted(set(arm) & set(clean))
            if not arm:
                continue
            m, lo, hi = analyze.paired_ci([arm[i] - clean[i] for i in seeds])
            diff = "-" if m is None else f"{m:+.3f}" + ("" if lo is None else f" [{lo:+.3f}, {hi:+.3f}]")
            out.append(line([s, f"injguard-{k}", len(seeds), analyze.fmt(analyze.mean([arm[i] for i in seeds])),
                             analyze.fmt(analyze.mean([clean[i] for i in seeds])), diff]))
    return "\n".join(out) + "\n"


def fault_table(rows: List[dict]) -> str:
    out = [f"The fault, checked on the CSVs: injected steps whose grad_norm / n-bar lies within "
           f"{CONSISTENCY_TOL:g} (relative) of k (n-bar recomputed from the CSV's norms of the steps not "
           "injected), and inject_factor cells that are wrong (an injected step without a positive finite "
           "factor, another step with one).", ""]
    out += header(["s", "arm", "runs", "injected steps", f"grad_norm / n-bar within {CONSISTENCY_TOL:g} of k",
                   "inject_factor wrong"])
    for s in STALENESS:
        for arm in ARMS:
            rs = judged(rows, arm, s)
            if rs:
                n = total(rs, "injected")
                checked = [r for r in rs if r["factor_bad"] is not None]
                out.append(line([s, arm, len(rs), n, f"{total(rs, 'consistent')}/{n}" if arm_k(arm) else "-",
                                 total(checked, "factor_bad") if checked else "no column"]))
    return "\n".join(out) + "\n"


def backtest_table(rows: List[dict]) -> Optional[str]:
    """The guard replayed by gacctl backtest per sigma (None when no row has the backtest's columns)."""
    if not any(r[f"bt_spikes_{sigma}"] is not None for r in rows for sigma in BACKTEST_SIGMAS):
        return None
    out = [f"Descriptive, not tested: gac's guard replayed by `gacctl backtest --spike-sigma S "
           f"{' '.join(BACKTEST_FLAGS)}` on the finished runs' CSVs (a replay: the trajectory is the sigma 6 "
           "run's). Recall: injected steps caught / injected, pooled over the injguard-k runs; false skips: spikes "
           "at steps not injected per 1,000 steps over every run (bootstrap interval over runs). At S = 6: the "
           "runs whose replayed spikes and catches equal the trainer's guard's.", ""]
    out += header(["s", "S"] + [f"recall, k = {k}" for k in KS] + ["false skips per 1,000 steps [bootstrap]",
                                                                   "runs equal to the trainer (S = 6)"])
    for s in STALENESS:
        for sigma in BACKTEST_SIGMAS:
            rs = [r for r in judged(rows, s=s) if r[f"bt_spikes_{sigma}"] is not None]
            if not rs:
                continue
            cells: List[object] = [s, sigma]
            for k in KS:
                inj = [r for r in rs if r["arm"] == f"injguard-{k}"]
                caught, n = total(inj, f"bt_caught_{sigma}"), total(inj, "injected")
                cells.append(f"{caught}/{n}: {analyze.fmt(caught / n)}" if n else "-")
            cells.append(rate(rs, lambda r, sg=sigma: r[f"bt_spikes_{sg}"] - r[f"bt_caught_{sg}"]))
            if sigma == 6:
                same = sum(r["bt_spikes_6"] == r["guard_skips"] and r["bt_caught_6"] == r["guard_caught"] for r in rs)
                cells.append(f"{same}/{len(rs)}")
            else:
                cells.append("-")
            out.append(line(cells))
    return "\n".join(out) + "\n"


def render(rows: List[dict]) -> Dict[str, str]:
    """{table name: markdown} from the per-run rows (as read back); exp2-d-backtest only when computed."""
    tables = {"exp2-d-status": runs_table(rows), "exp2-d-detection": detection_table(rows),
              "exp2-d-false-skips": false_skips_table(rows), "exp2-d-natural": natural_table(rows),
              "exp2-d-family": family_table(rows), "exp2-d-accuracy": accuracy_table(rows),
              "exp2-d-fault": fault_table(rows)}
    bt = backtest_table(rows)
    if bt is not None:
        tables["exp2-d-backtest"] = bt
    return tables


# --- command line ---------------------------------------------------------------------------------

def reading_line(root: str, rows: List[dict]) -> str:
    """What was read: runs found, failed ones, the registered runs missing, other files."""
    _, other = run_files(root)
    failed = [f"{r['arm']}_s{r['staleness']}_seed{r['seed']}" for r in rows if r["status"] != "finished"]
    have = {(r["arm"], r["staleness"], r["seed"]) for r in rows}
    missing = [f"{a}_s{s}_seed{i}" for a in ARMS for s in STALENESS for i in SEEDS if (a, s, i) not in have]
    text = f"exp2_guard.py: {len(rows)} runs in {root}/runs, {len(rows) - len(failed)} finished"
    text += f"; failed or unfinished ({len(failed)}): {', '.join(failed)}" if failed else "; none failed"
    registered = len(ARMS) * len(STALENESS) * len(SEEDS)
    if missing:
        text += f"; {len(missing)} of the {registered} registered runs missing"
        text += f": {', '.join(missing[:12])}" + (", ..." if len(missing) > 12 else "")
    if other:
        text += f"; {len(other)} CSVs of other arms ignored"
    return text


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="part D's folder (its runs in ROOT/runs)")
    ap.add_argument("--out", required=True, help="where exp2-d-runs.csv and exp2-d.md go")
    ap.add_argument("--gacctl", help="gacctl's path: adds the guard replayed by gacctl backtest at sigma 3-6")
    args = ap.parse_args(argv)
    rows = collect(args.root, args.gacctl)
    print(reading_line(args.root, rows))
    if not rows:
        print(f"exp2_guard.py: no run of part D in {args.root}/runs", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "exp2-d-runs.csv")
    write_rows(rows, path)
    tables = render(read_rows(path))
    with open(os.path.join(args.out, "exp2-d.md"), "w") as f:
        f.write("\n".join(f"### {name}\n\n{text}" for name, text in tables.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
