#!/usr/bin/env python3
"""Analysis of the gac_grpo experiment (scripts/experiment.sh, docs/RESULTS.md).

  analyze.py calibrate --runs CALDIR --out FILE
      Thresholds from the synchronous calibration runs (CALDIR's
      grpo_s0_seed*.csv), written once as key=value lines.
  analyze.py control --csv RUN.csv --mask-out FILE [--block-mask-out FILE]
                     [--count-mask-out FILE] [--block 50] [--seed N]
      The matched controls' parameters of one GAC run: prints
      "skip_rate=<p> lr_scale=<f>" (and a line "drift=<median>" when the run
      logged it) and writes the run's skipped steps to FILE; optionally the same
      mask with its runs in a random order (bskip) and the same count per
      block at random positions (cskip), drawn with --seed.
  analyze.py burst --csv RUN.csv... --staleness S --seeds 1001-1024 [--steps 400] --out DIR
      The second registered design's burst schedule (docs/RESULTS.md, part
      A): P (pooled skip rate) and L (the lengths of every run of skips) of
      the GAC runs given, and one mask per seed, DIR/burst_sS_seedI.txt, by
      the design's walk with random.Random(100 seed + S + 50).
  analyze.py replicate --runs DIR --out DIR
      The pre-registered held-out replication (docs/RESULTS.md): its 16
      contrasts of the mean held-out accuracy over the last five
      evaluations, paired by seed, with Holm's correction, and each arm's
      drift over the lag window; replication.md, replication.csv (the
      contrasts) and replication-runs.csv (one row per run: the rows the
      tables are built from).
  analyze.py sizes --runs DIR --out DIR
      The size sweep (scripts/experiment.sh sizes): per policy, the
      participation ratio, the noise-floor rms, on-policy q0.9 |c_t| and
      their ratio; sizes.md and sizes-runs.csv (one row per run).
  analyze.py tables [--data DIR] [--check FILE.md | --write FILE.md]
      Every table of docs/RESULTS.md that has its data in the repository
      (DIR, default examples/grpo/data: replication.tar.xz, grid.tar.xz,
      sizes.tar.xz, spikes.tar.xz and pilot.tar.xz, the per-step CSVs and
      logs; replication-runs.csv, grid-runs.csv, sizes-runs.csv,
      spikes-runs.csv and pilot-runs.csv, the per-run rows), rebuilt:
      printed, checked against the blocks
      "<!-- table NAME: rebuilt by analyze.py tables -->" of FILE.md, or
      written into them. Checking also rebuilds the per-run rows
      and calibration.txt from the archives and fails where they differ. The
      exploratory grid's tables (grid-*) are report's sections, from
      grid-runs.csv and, for the detectors, grid.tar.xz; its thresholds are
      the calibration stored in replication.tar.xz (the same runs).
  analyze.py pilot --runs DIR [--jobs FILE] [--out DIR]
      The table of the configuration pilot (scripts/experiment.sh pilot):
      pilot.md and pilot-runs.csv (one row per run) in --out (default DIR).
      Its rows follow the candidates' order in the job list FILE (default
      DIR/../pilot-jobs.txt); candidates it does not list follow, by name.
  analyze.py report --runs DIR --calibration FILE --out DIR [--no-plots]
      summary.md (the tables), results.csv (one row per run), grid-runs.csv
      (one row per run: what the tables read), detectors.csv,
      comparisons.csv, and the plots results_heldout.png, results_ct.png,
      results_lambda.png, results_controls.png (with matplotlib; everything
      else needs only the standard library).

Runs are RUNS/<variant>_s<staleness>_seed<seed>.csv with the trainer's log
beside them (.log, finished when it has a "summary:" line). Columns read:
step, heldout_acc, cosine, window_mean, sampler_kl, entropy, grad_norm, drift,
stepped, regime, noise_cos, the probe columns (lambda, bias_rel, on_align,
aligned_before, aligned_after, bias_after_rel), pr_pop, pr_sample, reward,
and, when present, lag_updates and grad_scale (older CSVs lack them).

The rules below were fixed before the runs they are applied to.

Calibration (calibrate). Pooled over the calibration runs, steps > 50:
  c_low = q0.9 |c_t| (column cosine), c_high = min(3 x max |c_t|, 0.95); the
  same of |m_t| (column window_mean, the signed mean of c_t over the
  trainer's --window steps) gives window_c_low and window_c_high. The ratio
  follows the paper (c_high about 3 x the on-policy maximum, capped below 1)
  so that GAC has a band in which it projects rather than skips. The file
  also records the raw c_q90, c_max, window_q90, window_max, the maximum of
  the detectors' kl10 and entropy statistics in these runs (kl10_max,
  entropy_max: the level thresholds of those two), runs, steps and seeds.
  The calibration runs have their own seeds (e.g. 101-103); report leaves
  out any run whose seed is a calibration seed, so no run both sets a
  threshold and is tested against it.

Controls (control). Of one GAC run: p = fraction of its steps with
  stepped == 0; lr_scale = mean over all steps of grad_scale (|gradient
  after GAC| / |raw gradient|; 0 on a skipped step, 1 when untouched), or
  1 - p for a CSV without that column. The controls built from them:
  rskip-<v> (GRPO skipping each update with probability p: same rate,
  random timing), mskip-<v> (GRPO skipping exactly the GAC run's skipped
  steps: same rate and timing, no projection), lrs-<v> (GRPO with
  lr x lr_scale: with staleness counted in optimizer steps it keeps GRPO's
  expected drift over the lag window equal to GAC's).

Outcome of a run. Held-out evaluations e_0 (accuracy after the warm-up, from
  the log; a log without it takes e_0 = e_1) and e_1..e_n (column
  heldout_acc, every 20 steps). Running peak P_i = max(e_0..e_i). The run
  collapsed at the first i >= 1 with e_i < 0.7 P_i and e_j < 0.7 P_i for
  every later j (the last evaluation can be flagged; a dip that recovers
  is not a collapse). Otherwise it "never learned" when
  max(e_1..e_n) < e_0 + 0.05, else it "learned". Tables give the three
  counts; a comparison of collapses counts collapsed against not collapsed.
  final acc = e_n; mean acc = mean of e_1..e_n.

Detectors. Pool: the monitor-mode runs of the base losses (grpo, m2po,
  bapo, is at s > 0; grpo alone at s = 0, where the losses coincide),
  never the controls (rskip-, mskip-, lrs-) nor gacb*, which nearly
  duplicate runs of the pool; a second table holds the GRPO runs alone.
  A run is positive when it collapsed, negative otherwise (learned or never
  learned). Statistics, per step: c10 (10-step mean |c_t|), m (|m_t|),
  c (|c_t|), elevated (minimum of c10 over the last 5 steps), kl10
  (10-step mean sampler-learner KL), entropy (relative change of the
  10-step mean entropy from its mean over steps 1-50), gradz (gradient-norm
  z-score over the previous 128 steps). Thresholds: c10, elevated: c_low;
  m: window_c_low; c: c_high; gradz: 6 (documented, OLMo-core); kl10,
  entropy: the calibration runs' maxima (no level rule without them).
  Alarm rules, reported side by side:
    level  the first step > 50 at which the statistic exceeds its
           threshold (the old rule; it fires as soon as alarms are allowed
           in any run that is stale throughout, shown to expose that);
    rise   each run's early window is steps 51-100, with mean mu and sample
           sd sigma of the statistic there; alarm at the first step > 100
           at which the statistic exceeds mu + 3 sigma and (c10, m, c,
           elevated, gradz) its threshold. gradz is a z-score against its
           own previous 128 steps and has no early window (it starts at
           step 129): under rise it alarms at the first step > 100 with
           z > 6. A statistic with fewer than 2 early-window values raises
           no rise alarm. A collapse at or before step 100 cannot be warned
           by rise: it counts as missed, and the table says how many;
    null   the staleness nulls: kl10 > 0 at the first eligible step (51),
           i.e. "this run is stale", alarming at step 51; and the
           configured staleness alone, s >= 16, alarming at step 51 in
           every such run (what an operator knows without measuring).
  An alarm at or before the collapse step is a true positive (lead =
  collapse step - alarm step); a collapsed run with no alarm, or a later
  one, is missed; any alarm in a run that did not collapse is false.
  Per rule: alarmed runs, how many alarms fall on the rule's first eligible
  step (51 for level and null, 101 for rise), TP / FP / FN / TN, precision,
  recall, and the leads' median, IQR (linear-interpolated quartiles) and
  range. No threshold is chosen on these runs' outcomes.

Paired comparisons. Per staleness s, the pairs: every off-policy loss
  (m2po, bapo, is; s > 0) and every GAC variant against grpo; every GAC
  variant against each of its controls rskip-, mskip-, lrs-; gacb<beta>
  against gac. Over the seeds both runs have (at s = 0 grpo stands for
  every loss): the per-seed differences row - reference of final acc (one
  table) and of mean acc (another); their mean and the paired 95 %
  interval mean +- t(0.975, n - 1) sd / sqrt(n) (Student's t; n >= 2).
  Verdict: "row better" when the interval lies above 0, "row worse" below,
  "no evidence of a difference" when it covers 0. The same at the
  Bonferroni level 1 - 0.05 / m, m = the number of comparisons with n >= 2
  in that table (printed under it). Beside them, how many of the paired
  seeds collapsed in the row and in the reference.

Other definitions. Statistics of c over steps > 50, as the paper's Table 3.
  lambda = cos(b_t, g_{t-1}) of the bias probe, steps > 50. skip rate =
  fraction of steps with stepped == 0; project rate = fraction with regime
  "project"; grad scale = mean grad_scale; lag = mean lag_updates over steps
  > 50.
"""
import argparse
import csv
import glob
import math
import os
import random
import re
import statistics
import sys

WARMUP = 50              # alarms and the statistics of c start after this step
EARLY_END = 100          # the rise rule's early window is steps WARMUP+1 .. EARLY_END
RISE_SD = 3.0            # rise: above early mean + RISE_SD x early sd
COLLAPSE_FRACTION = 0.7  # collapse: below this fraction of the running peak, for good
LEARN_MARGIN = 0.05      # never learned: no evaluation reaches e_0 + this
C_HIGH_RATIO = 3.0       # c_high = min(C_HIGH_RATIO x on-policy max, C_HIGH_CAP)
C_HIGH_CAP = 0.95
GRADZ_THRESHOLD = 6.0
STALENESS_NULL = 16      # the configured-staleness null alarms in every run with s >= this
BASE_VARIANTS = ["grpo", "m2po", "bapo", "is"]
# gacexact and gac005 are variants of an earlier grid, still read when present.
GAC_VARIANTS = ["gac", "gacwin", "gacproj", "gacwinproj", "gacmax", "gacv", "gacexact", "gac005"]
CONTROL_PREFIXES = ("rskip-", "mskip-", "bskip-", "cskip-", "lrs-")
CONTROL_LABELS = {"rskip": "random skip, same rate", "mskip": "same skipped steps", "lrs": "lr x lr_scale"}
OUTCOMES = ["collapsed", "never learned", "learned"]


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def clean(xs):
    return [x for x in xs if x is not None and not math.isnan(x)]


def mean(xs):
    xs = clean(xs)
    return statistics.mean(xs) if xs else None


def sd(xs):
    xs = clean(xs)
    return statistics.stdev(xs) if len(xs) > 1 else None


def quantile(xs, q):
    xs = sorted(clean(xs))
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def moving(xs, n):
    """Mean of the last n values (None until n values were seen; None entries skipped)."""
    out, window = [], []
    for x in xs:
        if x is not None:
            window.append(x)
            if len(window) > n:
                window.pop(0)
        out.append(sum(window) / n if len(window) == n else None)
    return out


def csv_cell(x, exact=False):
    """A per-run CSV's cell: empty for None, floats to 6 significant digits (with exact, in full: repr), the rest
    as str() gives."""
    if x is None:
        return ""
    if isinstance(x, float):
        return repr(x) if exact else f"{x:.6g}"
    return x


def write_run_rows(path, header, rows, exact=False):
    """A per-run CSV: `header`, then one line per (key, record) of `rows`, in their order: the key tuple's cells,
    then the record's values of the header's remaining columns (csv_cell)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for key, rec in rows:
            w.writerow(list(key) + [csv_cell(rec[k], exact) for k in header[len(key):]])


def read_run_rows(path, header, key_len, ints=(), texts=()):
    """A per-run CSV that write_run_rows wrote, read back: {key: record}. The key is the first key_len cells (the
    first text, the rest integers); the record's cells are integers (ints), text (texts) or numbers (fnum), an
    empty integer or number None."""
    with open(path, newline="") as f:
        return {tuple([row[header[0]]] + [int(row[k]) for k in header[1:key_len]]):
                {k: row[k] if k in texts else (int(row[k]) if row[k] else None) if k in ints else fnum(row[k])
                 for k in header[key_len:]}
                for row in csv.DictReader(f)}


def write_row_dicts(path, header, rows):
    """A per-run CSV of dict rows (the exp2_* modules'): the columns `header`, each cell by csv_cell."""
    write_run_rows(path, header, [((), row) for row in rows])


def read_row_dicts(path, header, ints=(), texts=()):
    """write_row_dicts' file read back as a list in its order: integers (ints), text (texts) or numbers (fnum);
    an empty cell None."""
    def cell(k, text):
        return None if text == "" else text if k in texts else int(text) if k in ints else fnum(text)
    with open(path, newline="") as f:
        return [{k: cell(k, row[k]) for k in header} for row in csv.DictReader(f)]


def log_parameters(log):
    """The policy's parameter count a run's log gives ("N parameters"), or None."""
    found = re.search(r"([0-9]+) parameters", log)
    return int(found.group(1)) if found else None


def log_cpu_seconds(log):
    """The run's CPU seconds its log gives (cpu_s=...), or None."""
    found = re.search(r"cpu_s=([0-9.]+)", log)
    return float(found.group(1)) if found else None


def fmt(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def mean_sd(xs, digits=3):
    m, s = mean(xs), sd(xs)
    if m is None:
        return "-"
    return f"{m:.{digits}f}" if s is None else f"{m:.{digits}f} ± {s:.{digits}f}"


# --- Student's t ---------------------------------------------------------------------

def t_cdf(t, df):
    """P(T <= t) for Student's t with an integer number of degrees of freedom df >= 1, in closed form:
    with theta = atan(t / sqrt(df)), P(|T| < t) is a finite series in cos(theta) (odd df: plus theta)."""
    if df != int(df) or df < 1:
        raise ValueError(f"t_cdf: df must be a positive integer, not {df}")
    df = int(df)
    if t < 0:
        return 1.0 - t_cdf(-t, df)
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2 == 1:
        # (2/pi) (theta + sin cos (1 + 2/3 cos^2 + (2 4)/(3 5) cos^4 + ...)), df - 1 / 2 terms
        total, term = 0.0, c
        for k in range((df - 1) // 2):
            if k > 0:
                term *= c * c * (2 * k) / (2 * k + 1)
            total += term
        inside = 2.0 / math.pi * (theta + s * total)
    else:
        # sin (1 + 1/2 cos^2 + (1 3)/(2 4) cos^4 + ...), df / 2 terms
        total, term = 0.0, 1.0
        for k in range(df // 2):
            if k > 0:
                term *= c * c * (2 * k - 1) / (2 * k)
            total += term
        inside = s * total
    return 0.5 + 0.5 * min(max(inside, 0.0), 1.0)


def t_quantile(p, df):
    """The t with P(T <= t) = p, by bisection on t_cdf (0.5 <= p < 1)."""
    if not 0.5 <= p < 1.0:
        raise ValueError(f"t_quantile: p must be in [0.5, 1), not {p}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def paired_ci(diffs, level=0.95):
    """(mean, low, high) of the two-sided Student-t interval at `level` for the mean of diffs
    (None bounds with fewer than 2 values)."""
    diffs = clean(diffs)
    if not diffs:
        return None, None, None
    m = statistics.mean(diffs)
    if len(diffs) < 2:
        return m, None, None
    half = t_quantile(1.0 - (1.0 - level) / 2.0, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return m, m - half, m + half


def verdict(lo, hi):
    if lo is None or hi is None:
        return "n < 2"
    if lo > 0:
        return "row better"
    if hi < 0:
        return "row worse"
    return "no evidence of a difference"


# --- runs ------------------------------------------------------------------------------

def run_key(path):
    m = re.match(r"(.+?)_s(\d+)_seed(\d+)\.csv$", os.path.basename(path))
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def read_csv(path):
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        return header, [dict(zip(header, r)) for r in reader if len(r) == len(header)]


# The columns gac_grpo --csv writes, in order (tests/examples/test_spike_injection.py checks them against the
# trainer; the tests of the exp2_* modules write synthetic runs with them).
TRAINER_COLUMNS = (
    "step,version,staleness,reward,exact,heldout_acc,loss,pg_loss,kl,entropy,sampler_kl,cosine,window_mean,noise_cos,"
    "regime,alpha,grad_norm,stepped,clip_frac,dual_clip_frac,m2,abs_log_ratio,bapo_lo,bapo_hi,pr_sample,pr_pop,"
    "pair_cos2,bias_rel,lambda,on_align,aligned_before,aligned_after,bias_after_rel,lag_updates,grad_scale,drift,"
    "injected,grad_norm_z,inject_factor,ess_token,ess_sequence,clip_fraction_low,clip_fraction_high,"
    "truncation_fraction,log_ratio_max,log_ratio_p99,log_ratio_p1,kl_k3,log_ratio_abs_mean,entropy_mean,"
    "staleness_min,staleness_mean,staleness_max").split(",")

SERIES = ["reward", "entropy", "sampler_kl", "cosine", "window_mean", "noise_cos", "grad_norm", "alpha", "pr_pop",
          "pr_sample", "lambda", "bias_rel", "on_align", "aligned_before", "aligned_after", "bias_after_rel",
          "staleness", "lag_updates", "grad_scale", "drift"]


def load_run(path):
    """The per-step series and the log's facts of one finished run; None if unfinished."""
    log_path = path[:-4] + ".log"
    log = open(log_path).read() if os.path.exists(log_path) else ""
    if "summary:" not in log:
        return None
    header, rows = read_csv(path)
    m = re.search(r"(?:supervised warm-up: .*|start:) held-out accuracy ([0-9.]+)", log)
    r = {"start": float(m.group(1)) if m else None, "log": log, "columns": set(header)}
    r["step"] = [int(x["step"]) for x in rows]
    for name in SERIES:
        r[name] = [fnum(x.get(name)) for x in rows]
    r["regime"] = [x.get("regime", "") for x in rows]
    r["stepped"] = [x.get("stepped", "1") != "0" for x in rows]
    r["evals"] = [(int(x["step"]), float(x["heldout_acc"])) for x in rows if x.get("heldout_acc")]
    return r


def collapse_step(start, evals):
    """The step of the collapse (rule in the module docstring), or None. evals: [(step, acc)], e_1..e_n;
    start: e_0 (None: e_1 stands for it)."""
    if not evals:
        return None
    accs = [a for _, a in evals]
    peak = start if start is not None else accs[0]
    for i, (step, acc) in enumerate(evals):
        peak = max(peak, acc)
        bar = COLLAPSE_FRACTION * peak
        if acc < bar and all(later < bar for later in accs[i + 1:]):
            return step
    return None


def outcome(start, evals):
    """("collapsed" | "never learned" | "learned", collapse step or None)."""
    col = collapse_step(start, evals)
    if col is not None:
        return "collapsed", col
    accs = [a for _, a in evals]
    e0 = start if start is not None else (accs[0] if accs else None)
    if not accs or max(accs) < e0 + LEARN_MARGIN:
        return "never learned", None
    return "learned", None


def after_warmup(r, name):
    return [v for s, v in zip(r["step"], r[name]) if s > WARMUP and v is not None]


def metrics(r):
    evals = r["evals"]
    c = after_warmup(r, "cosine")
    m = after_warmup(r, "window_mean")
    noise = after_warmup(r, "noise_cos")
    steps = len(r["step"])
    probe = [i for i, s in enumerate(r["step"]) if s > WARMUP and r["lambda"][i] is not None]
    project = [i for i in probe if r["regime"][i] == "project" and r["aligned_before"][i] is not None]
    result, col = outcome(r["start"], evals)
    skip_rate = sum(1 for s in r["stepped"] if not s) / steps if steps else None
    scales = clean(r["grad_scale"])
    return {
        "start": r["start"],
        "final": evals[-1][1] if evals else None,
        "mean_acc": mean([a for _, a in evals]),
        "peak": max([r["start"] or 0.0] + [a for _, a in evals]),
        "outcome": result,
        "collapse": col,
        "reward": mean(r["reward"][-20:]),
        "entropy_end": mean(r["entropy"][-20:]),
        "q90": quantile([abs(x) for x in c], 0.9),
        "cmax": max((abs(x) for x in c), default=None),
        "cmean": mean(c),
        "m_q90": quantile([abs(x) for x in m], 0.9),
        "mmean": mean(m),
        "noise_mean": mean(noise),
        "noise_rms": math.sqrt(mean([x * x for x in noise])) if noise else None,
        "pr_pop": mean(r["pr_pop"]),
        "pr_sample": mean(r["pr_sample"]),
        "lambda": mean([r["lambda"][i] for i in probe]),
        "bias_rel": mean([r["bias_rel"][i] for i in probe]),
        "on_align": mean([r["on_align"][i] for i in probe]),
        "lambda2": mean([r["lambda"][i] ** 2 for i in probe]),
        "aligned_before": mean([r["aligned_before"][i] for i in project]),
        "aligned_after": mean([r["aligned_after"][i] for i in project]),
        "bias_cut": mean([r["bias_after_rel"][i] / r["bias_rel"][i] for i in project
                          if r["bias_rel"][i] and r["bias_after_rel"][i] is not None]),
        "probes_project": len(project),
        "sampler_kl": mean(after_warmup(r, "sampler_kl")),
        "skip_rate": skip_rate,
        "project_rate": sum(1 for g in r["regime"] if g == "project") / steps if steps else None,
        "grad_scale": statistics.mean(scales) if len(scales) == steps and steps else None,
        "lag": mean(after_warmup(r, "lag_updates")),
        "steps": steps,
    }


def load_finished(runs_dir):
    """{(variant, s, seed): run} of the finished runs in runs_dir."""
    raw = {}
    for path in sorted(glob.glob(os.path.join(runs_dir, "*_s*_seed*.csv"))):
        key = run_key(path)
        r = load_run(path) if key else None
        if r is not None:
            raw[key] = r
    return raw


def load_all(runs_dir, exclude_seeds=()):
    """load_finished without exclude_seeds' runs, each with its metrics as r["m"]."""
    runs = {k: r for k, r in load_finished(runs_dir).items() if k[2] not in exclude_seeds}
    for r in runs.values():
        r["m"] = metrics(r)
    return runs


# --- detectors' statistics -------------------------------------------------------------

def series_stats(r):
    """Per-step statistics a detector compares with its threshold."""
    n = len(r["step"])
    absc = [abs(x) if x is not None else None for x in r["cosine"]]
    c10 = moving(absc, 10)
    elevated = [min(c10[i - 4:i + 1]) if i >= 4 and None not in c10[i - 4:i + 1] else None for i in range(n)]
    m = [abs(x) if x is not None else None for x in r["window_mean"]]
    kl10 = moving(r["sampler_kl"], 10)
    h = r["entropy"]
    h_ref = mean([x for s, x in zip(r["step"], h) if s <= WARMUP])
    h10 = moving(h, 10)
    hdrop = [abs(x - h_ref) / h_ref if x is not None and h_ref else None for x in h10]
    g = r["grad_norm"]
    z = [None] * n
    for i in range(128, n):  # OLMo-core's StabilityMonitor: the previous 128 values, 6 sd
        w = [x for x in g[i - 128:i] if x is not None]
        if len(w) == 128 and g[i] is not None:
            mu = sum(w) / 128
            s = math.sqrt(sum((x - mu) ** 2 for x in w) / 128)
            z[i] = (g[i] - mu) / s if s > 1e-12 else None
    return {"c10": c10, "m": m, "c": absc, "elevated": elevated, "kl10": kl10, "entropy": hdrop, "gradz": z}


SIGNALS = [  # name, description
    ("c10", "10-step mean of |c_t|"),
    ("m", "|m_t|, signed mean of c_t over 20 steps"),
    ("c", "|c_t| per step (GacAlignmentSpike)"),
    ("elevated", "10-step mean |c_t| above the threshold for 5 steps (GacAlignmentElevated)"),
    ("kl10", "10-step mean sampler-learner KL, mean log(pi_b / pi_theta)"),
    ("entropy", "relative change of the 10-step mean entropy from steps 1-50"),
    ("gradz", "gradient-norm z-score over the previous 128 steps (OLMo-core)"),
]
# Statistics whose threshold also gates the rise rule (the calibrated ones, and gradz's documented 6).
GATED = {"c10", "m", "c", "elevated", "gradz"}
NO_EARLY_WINDOW = {"gradz"}
FIRST_ELIGIBLE = {"level": WARMUP + 1, "null": WARMUP + 1, "rise": EARLY_END + 1}


def thresholds(cal):
    """The threshold of each statistic (None: no level rule for it)."""
    return {"c10": cal.get("c_low"), "m": cal.get("window_c_low"), "c": cal.get("c_high"),
            "elevated": cal.get("c_low"), "kl10": cal.get("kl10_max"), "entropy": cal.get("entropy_max"),
            "gradz": GRADZ_THRESHOLD}


def level_alarm(steps, stat, threshold):
    """First step > WARMUP at which stat exceeds threshold."""
    if threshold is None:
        return None
    for s, v in zip(steps, stat):
        if s > WARMUP and v is not None and v > threshold:
            return s
    return None


def rise_alarm(steps, stat, threshold, early_window=True):
    """First step > EARLY_END at which stat exceeds its early-window (steps WARMUP+1..EARLY_END) mean
    + RISE_SD sd, and threshold when one is given. early_window=False: threshold alone."""
    bar = -math.inf
    if early_window:
        early = [v for s, v in zip(steps, stat) if WARMUP < s <= EARLY_END and v is not None]
        if len(early) < 2:
            return None
        bar = statistics.mean(early) + RISE_SD * statistics.stdev(early)
    for s, v in zip(steps, stat):
        if s > EARLY_END and v is not None and v > bar and (threshold is None or v > threshold):
            return s
    return None


def null_alarm(steps, kl10):
    """The staleness null: alarm at the first eligible step when kl10 > 0 there."""
    for s, v in zip(steps, kl10):
        if s > WARMUP:
            return s if v is not None and v > 0 else None
    return None


def alarms(r, stats, thr):
    """{(signal, rule): alarm step or None} of one run; rule in level, rise; and ("kl10", "null")."""
    out = {}
    for name, _ in SIGNALS:
        t = thr.get(name)
        out[(name, "level")] = level_alarm(r["step"], stats[name], t)
        out[(name, "rise")] = rise_alarm(r["step"], stats[name], t if name in GATED else None,
                                         name not in NO_EARLY_WINDOW)
    out[("kl10", "null")] = null_alarm(r["step"], stats["kl10"])
    return out


def score(runs, alarm_of, rule):
    """Confusion counts and leads of one detector over runs; alarm_of: key -> alarm step or None."""
    tp = fp = fn = tn = at_first = unwarnable = 0
    leads = []
    first = FIRST_ELIGIBLE[rule]
    for key, r in runs.items():
        alarm = alarm_of[key]
        col = r["m"]["collapse"]
        if alarm is not None and alarm == first:
            at_first += 1
        if col is not None:
            if col < first:
                unwarnable += 1
            if alarm is not None and alarm <= col:
                tp += 1
                leads.append(col - alarm)
            else:
                fn += 1
        elif alarm is not None:
            fp += 1
        else:
            tn += 1
    return {"alarmed": sum(1 for k in runs if alarm_of[k] is not None),
            "at_first": at_first, "tp": tp, "fp": fp, "fn": fn, "tn": tn, "unwarnable": unwarnable,
            "precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None,
            "leads": sorted(leads)}


def lead_text(leads):
    if not leads:
        return "-"
    return (f"{statistics.median(leads):.0f} (IQR {quantile(leads, 0.25):.0f}–{quantile(leads, 0.75):.0f}; "
            f"range {min(leads)}–{max(leads)})")


def detector_pool(runs):
    """The monitor-mode runs of the base losses, grpo alone at s = 0; no control, no gacb*."""
    return {k: r for k, r in runs.items() if k[0] in BASE_VARIANTS and (k[1] > 0 or k[0] == "grpo")}


# --- calibration -----------------------------------------------------------------------

def calibration_values(runs, seeds):
    c = [abs(x) for r in runs for x in after_warmup(r, "cosine")]
    m = [abs(x) for r in runs for x in after_warmup(r, "window_mean")]
    stats = [series_stats(r) for r in runs]
    late = lambda name: [v for r, st in zip(runs, stats) for s, v in zip(r["step"], st[name])
                         if s > WARMUP and v is not None]
    c_max, m_max = max(c, default=None), max(m, default=None)
    out = {"c_low": quantile(c, 0.9), "c_high": min(C_HIGH_RATIO * c_max, C_HIGH_CAP) if c else None,
           "window_c_low": quantile(m, 0.9),
           "window_c_high": min(C_HIGH_RATIO * m_max, C_HIGH_CAP) if m else None,
           "c_q90": quantile(c, 0.9), "c_max": c_max, "window_q90": quantile(m, 0.9), "window_max": m_max,
           "kl10_max": max(late("kl10"), default=None), "entropy_max": max(late("entropy"), default=None),
           "runs": len(runs), "steps": len(c), "seeds": ",".join(str(s) for s in seeds)}
    return {k: v for k, v in out.items() if v is not None}


def calibration_file(runs_dir):
    """The thresholds of the calibration runs in runs_dir (their grpo_s0_seed*.csv), as calibrate writes them
    (text, values); None without a finished run."""
    paths = sorted(glob.glob(os.path.join(runs_dir, "grpo_s0_seed*.csv")))
    loaded = [(run_key(p)[2], load_run(p)) for p in paths if run_key(p)]
    loaded = [(seed, r) for seed, r in loaded if r is not None]
    if not loaded:
        return None
    out = calibration_values([r for _, r in loaded], sorted(seed for seed, _ in loaded))
    return "".join(f"{k}={v:.6g}\n" if isinstance(v, float) else f"{k}={v}\n" for k, v in out.items()), out


def calibrate(args):
    found = calibration_file(args.runs)
    if found is None:
        sys.exit("calibrate: no finished synchronous runs (grpo_s0_seed*.csv)")
    text, out = found
    if "c_low" not in out or "window_c_low" not in out:
        sys.exit("calibrate: no cosine / window_mean values after step 50")
    with open(args.out, "w") as f:
        f.write(text)
    print(f"calibration from {out['runs']} synchronous runs (seeds {out['seeds']}, {out['steps']} steps): "
          + ", ".join(f"{k} {v:.4f}" for k, v in out.items() if isinstance(v, float)))


def read_calibration(path):
    cal = {}
    for line in open(path):
        if "=" in line:
            k, v = line.strip().split("=", 1)
            x = fnum(v) if k != "seeds" else None
            cal[k] = x if x is not None else v
    return cal


def calibration_seeds(cal):
    seeds = cal.get("seeds")
    if seeds is None:
        return None
    if isinstance(seeds, float):
        return {int(seeds)}
    return {int(x) for x in str(seeds).split(",") if x.strip()}


# --- controls --------------------------------------------------------------------------

def control_values(path):
    """(skip rate p, lr_scale, skipped steps) of one run's CSV."""
    header, rows = read_csv(path)
    if not rows:
        raise ValueError(f"{path}: no steps")
    skipped = [int(x["step"]) for x in rows if x.get("stepped", "1") == "0"]
    p = len(skipped) / len(rows)
    if "grad_scale" in header:
        scales = [fnum(x["grad_scale"]) for x in rows]
        if any(v is None for v in scales):
            raise ValueError(f"{path}: grad_scale missing at some step")
        lr_scale = sum(scales) / len(scales)
    else:
        lr_scale = 1.0 - p
    return p, lr_scale, skipped


def mask_runs(skipped, steps):
    """The mask of steps 1..steps (True: skipped) as its maximal runs: [(skipped, length), ...] in order."""
    skip = set(skipped)
    runs = []
    for step in range(1, steps + 1):
        v = step in skip
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return [(v, n) for v, n in runs]


def block_permuted_mask(skipped, steps, rng):
    """The same skip mask with its maximal runs (of skips and of updates) in a random order: the count and
    the run lengths kept, where they fall not. The runs of each kind are shuffled and the two kinds
    interleaved again (a mask's runs alternate, so their numbers differ by at most one and no two runs of
    a kind touch: the lengths are exactly the mask's)."""
    runs = mask_runs(skipped, steps)
    skips = [n for v, n in runs if v]
    keeps = [n for v, n in runs if not v]
    if not skips:
        return []
    # Alternate the two kinds so that no two runs of a kind touch: shuffle each kind's lengths, then
    # interleave them, starting with the kind that has more runs (a tie: either, at random).
    rng.shuffle(skips)
    rng.shuffle(keeps)
    first_skip = len(skips) > len(keeps) or (len(skips) == len(keeps) and rng.random() < 0.5)
    order = []
    a, b = (skips, keeps) if first_skip else (keeps, skips)
    for i in range(max(len(a), len(b))):
        if i < len(a):
            order.append((a is skips, a[i]))
        if i < len(b):
            order.append((b is skips, b[i]))
    out, step = [], 1
    for v, n in order:
        if v:
            out.extend(range(step, step + n))
        step += n
    return out


def count_per_block_mask(skipped, steps, block, rng):
    """As many skips in each `block`-step block (steps 1..block, block+1..2 block, ...) as the mask has
    there, at random positions within the block."""
    out = []
    for first in range(1, steps + 1, block):
        last = min(first + block - 1, steps)
        k = sum(1 for s in skipped if first <= s <= last)
        out.extend(sorted(rng.sample(range(first, last + 1), k)))
    return out


def burst_statistics(masks):
    """(P, L) of the second registered design's burst schedule (docs/RESULTS.md, part A), pooled over runs:
    masks is [(skipped steps, steps of the run), ...]; P = skipped steps / steps, L = the sorted lengths of
    every maximal run of skipped steps."""
    skipped = sum(len(m) for m, _ in masks)
    steps = sum(n for _, n in masks)
    if steps == 0:
        raise ValueError("no steps")
    lengths = sorted(n for m, total in masks for v, n in mask_runs(m, total) if v)
    return skipped / steps, lengths


def burst_mask(p, lengths, steps, rng):
    """The burst schedule of the second registered design (part A), which reads no c_t: with E = mean(L)
    and q = P / (E (1 - P)), walk t = 1..steps; at t, with probability q a burst starts: its length n is
    rng.choice(sorted L), steps t..min(t + n - 1, steps) are skipped, step t + n is an update and the walk
    resumes at t + n + 1; otherwise step t is an update. The skip rate is P in expectation and the bursts'
    lengths follow L."""
    if p <= 0 or not lengths:
        return []
    if p >= 1:
        raise ValueError("a skip rate of 1 leaves no update between bursts")
    lengths = sorted(lengths)
    q = p / (statistics.mean(lengths) * (1 - p))
    out, t = [], 1
    while t <= steps:
        if rng.random() < q:
            n = rng.choice(lengths)
            out.extend(range(t, min(t + n - 1, steps) + 1))
            t += n + 1
        else:
            t += 1
    return out


def seed_list(text):
    """Seeds written as "1001-1024", "1001,1005" or a mix."""
    out = []
    for part in str(text).split(","):
        first, _, last = part.strip().partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def burst(args):
    """Part A's burst masks: P_s and L_s from the GAC runs' CSVs at one staleness, then one mask per seed,
    drawn with random.Random(100 seed + s + 50)."""
    try:
        masks = []
        for path in args.csv:
            _, _, skipped = control_values(path)
            masks.append((skipped, len(read_csv(path)[1])))
        p, lengths = burst_statistics(masks)
    except (OSError, ValueError, StopIteration) as e:
        sys.exit(f"burst: {e}")
    os.makedirs(args.out, exist_ok=True)
    for seed in seed_list(args.seeds):
        mask = burst_mask(p, lengths, args.steps, random.Random(100 * seed + args.staleness + 50))
        with open(os.path.join(args.out, f"burst_s{args.staleness}_seed{seed}.txt"), "w") as f:
            f.writelines(f"{t}\n" for t in mask)
    print(f"P={p:.6f} runs_of_skips={len(lengths)} L={','.join(map(str, lengths))}")


def control(args):
    try:
        p, lr_scale, skipped = control_values(args.csv)
        header, rows = read_csv(args.csv)
    except (OSError, ValueError, StopIteration) as e:
        sys.exit(f"control: {e}")
    steps = len(rows)
    with open(args.mask_out, "w") as f:
        f.writelines(f"{s}\n" for s in skipped)
    rng = random.Random(args.seed)
    if args.block_mask_out:
        with open(args.block_mask_out, "w") as f:
            f.writelines(f"{s}\n" for s in block_permuted_mask(skipped, steps, rng))
    if args.count_mask_out:
        with open(args.count_mask_out, "w") as f:
            f.writelines(f"{s}\n" for s in count_per_block_mask(skipped, steps, args.block, rng))
    print(f"skip_rate={p:.6f} lr_scale={lr_scale:.6f}")
    drifts = [v for v in (fnum(x.get("drift")) for x in rows) if v is not None]
    if drifts:
        print(f"drift={statistics.median(drifts):.6g}")


# --- report ----------------------------------------------------------------------------

def is_control(variant):
    return variant.startswith(CONTROL_PREFIXES)


def comparison_pairs(s, present):
    """The (row, reference) pairs of the paired tables at staleness s."""
    pairs = [(v, "grpo") for v in ["m2po", "bapo", "is"] if s > 0]
    pairs += [(g, "grpo") for g in GAC_VARIANTS]
    pairs += [(g, f"{c}-{g}") for g in GAC_VARIANTS for c in ("rskip", "mskip", "lrs")]
    pairs += [(v, "gac") for v in sorted(present) if v.startswith("gacb")]
    return pairs


def paired_rows(ms, seeds, stale, metric):
    """One dict per comparison (with at least one paired seed) of metric, with its 95 % and Bonferroni
    intervals; m = the comparisons with n >= 2. ms: {(variant, s, seed): a run's metrics}."""
    present = {k[0] for k in ms}

    def get(v, s, seed):
        r = ms.get((v, s, seed))
        if r is None and s == 0 and v in BASE_VARIANTS:
            r = ms.get(("grpo", 0, seed))
        return r

    rows = []
    for s in stale:
        for a, b in comparison_pairs(s, present):
            d, col_a, col_b = [], 0, 0
            for seed in seeds:
                ra, rb = get(a, s, seed), get(b, s, seed)
                if ra is None or rb is None or ra[metric] is None or rb[metric] is None:
                    continue
                d.append(ra[metric] - rb[metric])
                col_a += ra["outcome"] == "collapsed"
                col_b += rb["outcome"] == "collapsed"
            if d:
                rows.append({"s": s, "row": a, "ref": b, "metric": metric, "diffs": d, "n": len(d),
                             "row_collapsed": col_a, "ref_collapsed": col_b})
    m = sum(1 for row in rows if row["n"] >= 2)
    for row in rows:
        row["mean"], row["lo"], row["hi"] = paired_ci(row["diffs"], 0.95)
        row["sd"] = sd(row["diffs"])
        row["verdict"] = verdict(row["lo"], row["hi"])
        _, row["blo"], row["bhi"] = paired_ci(row["diffs"], 1.0 - 0.05 / m) if m else (None, None, None)
        row["bverdict"] = verdict(row["blo"], row["bhi"])
        row["m"] = m
    return rows, m


def interval(lo, hi):
    return "-" if lo is None else f"[{lo:+.3f}, {hi:+.3f}]"


def detector_table(out, pool, stats, thr, title):
    """Appends the table of one pool to out; returns its rows for detectors.csv."""
    n_out = {o: sum(1 for r in pool.values() if r["m"]["outcome"] == o) for o in OUTCOMES}
    run_alarms = {k: alarms(r, stats[k], thr) for k, r in pool.items()}
    out.append(f"### Detectors: {title}, {len(pool)} runs ({n_out['collapsed']} collapsed, "
               f"{n_out['learned']} learned, {n_out['never learned']} never learned)")
    out.append("")
    out.append("| signal | rule | threshold | alarmed runs | at first eligible step | TP / FP / FN / TN | precision "
               "| recall | lead: median (IQR; range) |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    rows = []
    entries = [(name, desc, rule) for name, desc in SIGNALS for rule in ("level", "rise")]
    entries.append(("kl10", "staleness null: 10-step mean KL > 0 at step 51 (the run is stale)", "null"))
    entries.append(("s", "staleness null: the configured s ≥ 16, alarm at step 51 (no measurement)", "null"))
    for name, desc, rule in entries:
        t = thr.get(name)
        if rule == "level" and t is None:
            continue
        if rule == "null":
            t = 16.0 if name == "s" else 0.0
        alarm_of = ({k: FIRST_ELIGIBLE["null"] if k[1] >= STALENESS_NULL else None for k in pool} if name == "s"
                    else {k: a[(name, rule)] for k, a in run_alarms.items()})
        e = score(pool, alarm_of, rule)
        leads = e["leads"]
        t_text = "-" if (rule == "rise" and name not in GATED) else f"{t:.4g}"
        if rule == "rise":
            t_text = ("early mean + 3 sd" if name not in NO_EARLY_WINDOW else "") + \
                     ("" if t_text == "-" else (" and > " if name not in NO_EARLY_WINDOW else "> ") + t_text)
        out.append(f"| {desc.replace('|', chr(92) + '|')} | {rule} | {t_text} | {e['alarmed']} "
                   f"| {e['at_first']} | {e['tp']} / {e['fp']} / {e['fn']} / {e['tn']} | {fmt(e['precision'], 2)} "
                   f"| {fmt(e['recall'], 2)} | {lead_text(leads)} |")
        rows.append([title, name, rule, "" if t is None or rule == "rise" and name not in GATED else f"{t:.6g}",
                     e["alarmed"], e["at_first"], e["tp"], e["fp"], e["fn"], e["tn"], e["unwarnable"],
                     fmt(e["precision"], 4), fmt(e["recall"], 4),
                     fmt(statistics.median(leads) if leads else None, 1), fmt(quantile(leads, 0.25), 1),
                     fmt(quantile(leads, 0.75), 1), min(leads) if leads else "", max(leads) if leads else "",
                     " ".join(map(str, leads))])
    early = sum(1 for r in pool.values() if r["m"]["collapse"] is not None and r["m"]["collapse"] <= EARLY_END)
    warm = sum(1 for r in pool.values() if r["m"]["collapse"] is not None and r["m"]["collapse"] <= WARMUP)
    out.append("")
    out.append(f"Collapses at or before step {EARLY_END}, which the rise rule cannot warn of (counted missed): "
               f"{early}; at or before step {WARMUP} (no rule can): {warm}. First eligible step: "
               f"{WARMUP + 1} (level, null), {EARLY_END + 1} (rise).")
    out.append("")
    return rows


# The sections of the grid's summary (report), each a function of the runs' metrics
# ({(variant, s, seed): metrics}) so that report and tables print the same text.

def text_of(lines):
    return "\n".join(lines) + "\n"


def grid_axes(ms):
    """(staleness values, seeds, variants in the tables' order) of the runs."""
    order = BASE_VARIANTS + GAC_VARIANTS
    variants = [v for v in order if any(k[0] == v for k in ms)]
    controls = sorted({k[0] for k in ms if k[0] not in order})
    return sorted({k[1] for k in ms}), sorted({k[2] for k in ms}), variants + controls


def grid_ref(ms, seeds, v, s):
    """The metrics of v at s over seeds; grpo at s = 0 stands for every loss (the ratio is 1: identical runs)."""
    get = lambda v, s: [ms[(v, s, seed)] for seed in seeds if (v, s, seed) in ms]
    return get(v, s) or (get("grpo", 0) if s == 0 and v in BASE_VARIANTS else [])


def thresholds_text(cal, seeds):
    num = lambda k, d=4: f"{cal[k]:.{d}f}" if isinstance(cal.get(k), float) else "-"
    out = [f"Thresholds (calibrated once from {int(cal.get('runs', 0))} synchronous runs, "
           f"{int(cal.get('steps', 0))} steps, seeds {cal.get('seeds', 'not recorded')}): c_low = {num('c_low')}, "
           f"c_high = {num('c_high')} (raw q0.9 {num('c_q90')}, max {num('c_max')}); windowed trigger: "
           f"c_low = {num('window_c_low')}, c_high = {num('window_c_high')} (raw q0.9 {num('window_q90')}, "
           f"max {num('window_max')}). Test seeds: {seeds}."]
    if calibration_seeds(cal) is None:
        out += ["", "The calibration file does not record its seeds: its runs may share seeds with the runs "
                    "tested here."]
    return text_of(out)


def outcome_text(ms):
    stale, seeds, variants = grid_axes(ms)
    lag_seen = any(m["lag"] is not None for m in ms.values())
    scale_seen = any(m["grad_scale"] is not None for m in ms.values())
    out = ["### Outcome and alignment, mean ± sd over seeds", "",
           "| s | variant | n | held-out start → final | mean over evals | collapsed / never learned / learned "
           "| skip / project rate | grad scale | lag (updates) | q0.9 \\|c\\| | mean c | noise floor mean / rms "
           "| q0.9 \\|m\\| | PR (pop) | λ |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in stale:
        for v in variants:
            M = grid_ref(ms, seeds, v, s)
            if not M or (s == 0 and v in BASE_VARIANTS and v != "grpo"):
                continue
            counts = " / ".join(str(sum(1 for m in M if m["outcome"] == o)) for o in OUTCOMES)
            out.append(
                f"| {s} | {v} | {len(M)} | {mean_sd([m['start'] for m in M])} → {mean_sd([m['final'] for m in M])} "
                f"| {mean_sd([m['mean_acc'] for m in M])} | {counts} "
                f"| {fmt(mean([m['skip_rate'] for m in M]), 2)} / {fmt(mean([m['project_rate'] for m in M]), 2)} "
                f"| {fmt(mean([m['grad_scale'] for m in M]), 2) if scale_seen else '-'} "
                f"| {fmt(mean([m['lag'] for m in M]), 1) if lag_seen else '-'} "
                f"| {mean_sd([m['q90'] for m in M], 2)} | {mean_sd([m['cmean'] for m in M], 2)} "
                f"| {fmt(mean([m['noise_mean'] for m in M]), 2)} / {fmt(mean([m['noise_rms'] for m in M]), 2)} "
                f"| {mean_sd([m['m_q90'] for m in M], 2)} | {fmt(mean([m['pr_pop'] for m in M]), 1)} "
                f"| {mean_sd([m['lambda'] for m in M], 2)} |")
    missing = [name for name, seen in (("lag_updates", lag_seen), ("grad_scale", scale_seen)) if not seen]
    if missing:
        out += ["", f"(no CSV here has the column {' or '.join(missing)}: '-' in its column of the table)"]
    return text_of(out)


def final_text(ms):
    stale, seeds, variants = grid_axes(ms)
    out = ["### Final held-out accuracy per seed", "",
           "| s | variant | " + " | ".join(f"seed {x}" for x in seeds) + " |",
           "|---|---|" + "---|" * len(seeds)]
    mark = {"collapsed": "*", "never learned": "°", "learned": ""}
    for s in stale:
        for v in variants:
            if s == 0 and v in BASE_VARIANTS and v != "grpo":
                continue
            cells = []
            for seed in seeds:
                m = ms.get((v, s, seed))
                if m is None and s == 0 and v in BASE_VARIANTS:
                    m = ms.get(("grpo", 0, seed))
                cells.append("-" if m is None else fmt(m["final"]) + mark[m["outcome"]])
            if any(c != "-" for c in cells):
                out.append(f"| {s} | {v} | " + " | ".join(cells) + " |")
    out += ["", "(* = collapsed, ° = never learned)"]
    return text_of(out)


PAIRED_METRICS = [("final", "final held-out accuracy"), ("mean_acc", "mean held-out accuracy over evaluations")]


def paired_text(ms, metric, label):
    """The paired table of metric and its rows (for comparisons.csv)."""
    stale, seeds, _ = grid_axes(ms)
    rows, m = paired_rows(ms, seeds, stale, metric)
    out = [f"### Paired by seed: difference in {label} (row − reference)", "",
           "| s | comparison | n | mean ± sd | 95 % CI | verdict | Bonferroni CI | Bonferroni verdict "
           "| collapsed (row / ref) | seeds better | per seed |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        d = row["diffs"]
        out.append(f"| {row['s']} | {row['row']} − {row['ref']} | {row['n']} | {mean_sd(d)} "
                   f"| {interval(row['lo'], row['hi'])} | {row['verdict']} | {interval(row['blo'], row['bhi'])} "
                   f"| {row['bverdict']} | {row['row_collapsed']} / {row['ref_collapsed']} of {row['n']} "
                   f"| {sum(x > 0 for x in d)}/{len(d)} | {' '.join(f'{x:+.3f}' for x in d)} |")
    out += ["", f"Bonferroni: m = {m} comparisons with n ≥ 2 in this table, each interval at the "
                f"{100 * (1 - 0.05 / m) if m else 100:.3f} % level (1 − 0.05/m)."]
    return text_of(out), rows


def bias_text(ms):
    stale, seeds, _ = grid_axes(ms)
    out = ["### Staleness bias (probe every 5 steps, steps > 50; GRPO in monitor mode, and the GAC runs)", "",
           "| s | variant | λ = cos(b, g_prev) | λ² | \\|b\\| / \\|g_on\\| | cos(g_on, g_prev) | c_t mean "
           "| project-step probes | <b, u> before → after GAC, in \\|g_on\\| | \\|b'\\| / \\|b\\| |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for s in stale:
        for v in ["grpo", "is", "gac", "gacwin"]:
            M = grid_ref(ms, seeds, v, s)
            if not M:
                continue
            out.append(f"| {s} | {v} | {mean_sd([m['lambda'] for m in M], 3)} | {fmt(mean([m['lambda2'] for m in M]), 3)} "
                       f"| {mean_sd([m['bias_rel'] for m in M], 2)} "
                       f"| {mean_sd([m['on_align'] for m in M], 3)} | {mean_sd([m['cmean'] for m in M], 2)} "
                       f"| {sum(m['probes_project'] for m in M)} | {fmt(mean([m['aligned_before'] for m in M]), 2)} → "
                       f"{fmt(mean([m['aligned_after'] for m in M]), 2)} | {fmt(mean([m['bias_cut'] for m in M]), 2)} |")
    return text_of(out)


DETECTOR_POOLS = [("base losses in monitor mode (no controls)", lambda k: True), ("GRPO runs alone", lambda k: k[0] == "grpo")]


def detector_texts(runs, cal):
    """The two detector sections of the grid (runs: per-step runs with r["m"]) and their rows for detectors.csv."""
    thr = thresholds(cal)
    pool = detector_pool(runs)
    stats = {k: series_stats(r) for k, r in pool.items()}
    texts, rows = [], []
    for title, keep in DETECTOR_POOLS:
        out = []
        rows += detector_table(out, {k: r for k, r in pool.items() if keep(k)}, stats, thr, title)
        texts.append(text_of(out[:-1]))
    return texts, rows


# The per-run rows behind the grid's tables (grid-runs.csv): a run's metrics that the tables read, and its
# CPU seconds (the log's cpu_s). Floats are written as repr gives them (they read back as the same number), so
# that the tables built from these rows are exactly report's: a per-seed difference of two means of 20
# evaluations often lies on a rounding boundary of the tables' three decimals.
GRID_RUN_KEYS = ["variant", "staleness", "seed", "start", "final", "mean_acc", "outcome", "collapse", "skip_rate",
                 "project_rate", "grad_scale", "lag", "q90", "cmean", "noise_mean", "noise_rms", "m_q90", "pr_pop",
                 "lambda", "lambda2", "bias_rel", "on_align", "aligned_before", "aligned_after", "bias_cut",
                 "probes_project", "cpu_s"]


def grid_record(r):
    m = r["m"] if "m" in r else metrics(r)
    return {**{k: m[k] for k in GRID_RUN_KEYS[3:-1]}, "cpu_s": log_cpu_seconds(r["log"])}


def write_grid_runs(records, path):
    write_run_rows(path, GRID_RUN_KEYS, sorted(records.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])),
                   exact=True)


def read_grid_runs(path):
    return read_run_rows(path, GRID_RUN_KEYS, 3, ints={"collapse", "probes_project"}, texts={"outcome"})


def report(args):
    cal = read_calibration(args.calibration)
    cal_seeds = calibration_seeds(cal)
    runs = load_all(args.runs, exclude_seeds=cal_seeds or ())
    if not runs:
        sys.exit("report: no finished runs")
    os.makedirs(args.out, exist_ok=True)
    keys = ["start", "final", "mean_acc", "peak", "outcome", "collapse", "reward", "entropy_end", "q90", "cmax",
            "cmean", "m_q90", "mmean", "noise_mean", "noise_rms", "pr_pop", "pr_sample", "lambda", "lambda2",
            "bias_rel", "on_align", "aligned_before", "aligned_after", "bias_cut", "probes_project", "sampler_kl",
            "skip_rate", "project_rate", "grad_scale", "lag", "steps"]
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "staleness", "seed"] + keys)
        for (v, s, seed), r in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            w.writerow([v, s, seed] + ["" if r["m"][k] is None else (f"{r['m'][k]:.5g}" if isinstance(r["m"][k], float)
                                                                     else r["m"][k]) for k in keys])
    write_grid_runs({k: grid_record(r) for k, r in runs.items()}, os.path.join(args.out, "grid-runs.csv"))

    ms = {k: r["m"] for k, r in runs.items()}
    stale, seeds, _ = grid_axes(ms)
    sections = [thresholds_text(cal, seeds), outcome_text(ms), final_text(ms)]
    comp_rows = []
    for metric, label in PAIRED_METRICS:
        text, rows = paired_text(ms, metric, label)
        sections.append(text)
        comp_rows += rows
    with open(os.path.join(args.out, "comparisons.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["staleness", "row", "reference", "metric", "n", "mean", "sd", "ci_low", "ci_high", "verdict",
                    "m", "bonferroni_low", "bonferroni_high", "bonferroni_verdict", "row_collapsed",
                    "reference_collapsed", "diffs"])
        for row in comp_rows:
            g = lambda x: "" if x is None else f"{x:.6g}"
            w.writerow([row["s"], row["row"], row["ref"], row["metric"], row["n"], g(row["mean"]), g(row["sd"]),
                        g(row["lo"]), g(row["hi"]), row["verdict"], row["m"], g(row["blo"]), g(row["bhi"]),
                        row["bverdict"], row["row_collapsed"], row["ref_collapsed"],
                        " ".join(f"{x:.6g}" for x in row["diffs"])])
    sections.append(bias_text(ms))
    texts, det_rows = detector_texts(runs, cal)
    sections += texts
    with open(os.path.join(args.out, "detectors.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pool", "signal", "rule", "threshold", "alarmed", "at_first_eligible", "tp", "fp", "fn", "tn",
                    "unwarnable", "precision", "recall", "lead_median", "lead_q25", "lead_q75", "lead_min",
                    "lead_max", "leads"])
        w.writerows(det_rows)
    summary = "".join(text + "\n" for text in sections)
    open(os.path.join(args.out, "summary.md"), "w").write(summary)
    print(summary, end="")
    if not args.no_plots:
        plots(args, runs, stale, seeds, cal)


# --- pilot -----------------------------------------------------------------------

PILOT_RUN_KEYS = ["candidate", "staleness", "seed", "parameters", "start", "final", "outcome", "pr_pop", "pr_sample",
                  "noise_mean", "noise_rms", "q90", "m_q90", "cmean", "lambda", "cpu_s"]


def pilot_record(r):
    """One pilot run's row: parameters, held-out start and end, outcome, and (over steps > 50) the participation
    ratios, the noise floor, q0.9 of |c_t| and |m_t|, mean c_t, mean lambda; the run's CPU seconds."""
    m = metrics(r)
    return {"parameters": log_parameters(r["log"]), **{k: m[k] for k in PILOT_RUN_KEYS[4:-1]},
            "cpu_s": log_cpu_seconds(r["log"])}


def pilot_candidates(jobs_path):
    """The candidates in the order of their first run in the pilot's job list ("name flags" per line)."""
    order = []
    if jobs_path and os.path.exists(jobs_path):
        for line in open(jobs_path):
            key = run_key(line.split()[0] + ".csv") if line.split() else None
            if key and key[0] not in order:
                order.append(key[0])
    return order


def load_pilot(runs_dir, jobs_path=None):
    """{(candidate, s, seed): row} of the finished runs in runs_dir, in the table's order: the candidates in the
    order of the job list jobs_path, then any other (runs of an earlier job list) by name; within a candidate by
    staleness, then seed. Never file times, which an archive does not keep."""
    raw = load_finished(runs_dir)
    listed = pilot_candidates(jobs_path)
    rank = lambda k: (listed.index(k[0]) if k[0] in listed else len(listed), k[0], k[1], k[2])
    return {k: pilot_record(raw[k]) for k in sorted(raw, key=rank)}


def write_pilot_runs(records, path):
    """One row per run in the records' order (the table's); floats in full (repr), so that the table built from
    these rows is the one built from the runs."""
    write_run_rows(path, PILOT_RUN_KEYS, records.items(), exact=True)


def read_pilot_runs(path):
    return read_run_rows(path, PILOT_RUN_KEYS, 3, ints={"parameters"}, texts={"outcome"})


def pilot_text(records):
    """The pilot's table from its per-run rows: a row per candidate with runs at s = 0 and s = 16, in the order of
    the rows' first appearance; mean ± sd (or mean) over seeds."""
    lines = ["| candidate | parameters | s = 0: held-out start → end | s = 16: start → end | collapsed (s = 0 / 16) "
             "| PR pop / sample | noise floor mean / rms | q0.9 \\|c\\| (s = 0) | q0.9 \\|m\\| (s = 0) "
             "| mean c (0 / 16) | λ (0 / 16) | CPU s per run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in dict.fromkeys(k[0] for k in records):
        s0 = [rec for k, rec in records.items() if k[0] == n and k[1] == 0]
        s16 = [rec for k, rec in records.items() if k[0] == n and k[1] == 16]
        if not s0 or not s16:
            continue
        g = lambda rs, key: [r[key] for r in rs]
        ncol = lambda rs: sum(1 for r in rs if r["outcome"] == "collapsed")
        params = s0[0]["parameters"]
        lines.append(
            f"| {n} | {'?' if params is None else f'{params:,}'} | {mean_sd(g(s0, 'start'))} → {mean_sd(g(s0, 'final'))} "
            f"| {mean_sd(g(s16, 'start'))} → {mean_sd(g(s16, 'final'))} | {ncol(s0)}/{len(s0)} / {ncol(s16)}/{len(s16)} "
            f"| {fmt(mean(g(s0, 'pr_pop')), 1)} / {fmt(mean(g(s0, 'pr_sample')), 1)} "
            f"| {fmt(mean(g(s0, 'noise_mean')), 2)} / {fmt(mean(g(s0, 'noise_rms')), 2)} "
            f"| {fmt(mean(g(s0, 'q90')), 2)} | {fmt(mean(g(s0, 'm_q90')), 2)} "
            f"| {fmt(mean(g(s0, 'cmean')), 2)} / {fmt(mean(g(s16, 'cmean')), 2)} "
            f"| {fmt(mean(g(s0, 'lambda')), 3)} / {fmt(mean(g(s16, 'lambda')), 3)} "
            f"| {fmt(mean(g(s0 + s16, 'cpu_s')), 0)} |")
    return "\n".join(lines) + "\n"


def pilot(args):
    jobs = args.jobs if args.jobs is not None else os.path.join(os.path.dirname(os.path.normpath(args.runs)),
                                                                "pilot-jobs.txt")
    records = load_pilot(args.runs, jobs)
    if not records:
        sys.exit(f"pilot: no finished runs in {args.runs}")
    out = args.out or args.runs
    os.makedirs(out, exist_ok=True)
    write_pilot_runs(records, os.path.join(out, "pilot-runs.csv"))
    text = pilot_text(records)
    open(os.path.join(out, "pilot.md"), "w").write(text)
    print(text, end="")


# --- plots -----------------------------------------------------------------------

def plots(args, runs, stale, seeds, cal):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plots (run it with .venv/bin/python: scripts/setup.sh installs matplotlib there)")
        return
    palette = {"grpo": "tab:red", "m2po": "tab:orange", "bapo": "tab:purple", "is": "tab:brown",
               "gac": "tab:green", "gacexact": "tab:olive", "gacwin": "tab:blue", "gac005": "tab:cyan",
               "gacproj": "yellowgreen", "gacwinproj": "teal", "gacmax": "tab:pink", "gacv": "darkgoldenrod",
               "gacproj": "tab:pink", "gacwinproj": "tab:purple"}
    control_color = {"rskip": "tab:gray", "mskip": "tab:orange", "lrs": "k"}

    def band(ax, v, s, series, label=None, color=None):
        rs = [runs[(v, s, seed)] for seed in seeds if (v, s, seed) in runs]
        if not rs and s == 0 and v in BASE_VARIANTS:
            rs = [runs[("grpo", 0, seed)] for seed in seeds if ("grpo", 0, seed) in runs]
        if not rs:
            return
        xs, ys = series(rs[0])[0], [series(r)[1] for r in rs]
        n = min(len(y) for y in ys)
        xs = xs[:n]
        m = [statistics.mean(y[i] for y in ys) for i in range(n)]
        e = [statistics.stdev(y[i] for y in ys) if len(ys) > 1 else 0.0 for i in range(n)]
        color = color or palette.get(v, "tab:gray")
        ax.plot(xs, m, color=color, lw=1.3, label=label or v)
        ax.fill_between(xs, [a - b for a, b in zip(m, e)], [a + b for a, b in zip(m, e)], color=color, alpha=0.15)

    def heldout(r):
        return [0] + [s for s, _ in r["evals"]], [r["start"]] + [a for _, a in r["evals"]]

    def smooth(name, n=20):
        def f(r):
            vals = moving(r[name], n)
            pts = [(s, v) for s, v in zip(r["step"], vals) if v is not None]
            return [s for s, _ in pts], [v for _, v in pts]
        return f

    fig, axes = plt.subplots(1, len(stale), figsize=(3.6 * len(stale), 3.2), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], stale):
        for v in ["grpo", "m2po", "bapo", "is", "gac", "gacwin"]:
            band(ax, v, s, heldout)
        ax.set_title(f"s = {s}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out exact match (mean ± sd)")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "results_heldout.png"), dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(stale), figsize=(3.6 * len(stale), 3.2), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], stale):
        band(ax, "grpo", s, smooth("cosine"), "c_t (20-step mean)", "tab:red")
        band(ax, "grpo", s, smooth("noise_cos"), "noise floor (20-step mean)", "tab:gray")
        band(ax, "grpo", s, smooth("lambda", 4), "λ_t (4-probe mean)", "tab:purple")
        ax.axhline(cal["window_c_low"], color="tab:blue", ls="--", lw=0.8, label="window c_low")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_title(f"GRPO, s = {s}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("cosine")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "results_ct.png"), dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for v, color in [("grpo", "tab:red"), ("is", "tab:brown"), ("bapo", "tab:purple"), ("m2po", "tab:orange")]:
        xs, ys, es = [], [], []
        for s in stale:
            rs = [runs[(v, s, seed)]["m"]["lambda"] for seed in seeds if (v, s, seed) in runs]
            if s == 0:
                rs = [runs[("grpo", 0, seed)]["m"]["lambda"] for seed in seeds if ("grpo", 0, seed) in runs]
            rs = [x for x in rs if x is not None]
            if rs:
                xs.append(s)
                ys.append(statistics.mean(rs))
                es.append(statistics.stdev(rs) if len(rs) > 1 else 0.0)
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=color, label=v)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("staleness s")
    ax.set_ylabel("mean λ = cos(b_t, g_{t-1})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "results_lambda.png"), dpi=90)
    plt.close(fig)

    # Top row: the dose-response, final held-out accuracy against s (mean ± sd over seeds). A control
    # is drawn only at the s where it exists for every seed its GAC run has (it runs only where GAC
    # skipped a step), so that each point averages the same seeds. Bottom row: s = 16 over steps.
    def final_vs_s(ax, v, label=None, color=None, marker="o", ls="-"):
        xs, ys, es = [], [], []
        for s in stale:
            vv = "grpo" if s == 0 and v in BASE_VARIANTS else v
            fs = [runs[(vv, s, seed)]["m"]["final"] for seed in seeds if (vv, s, seed) in runs]
            base = v[v.index("-") + 1:] if is_control(v) else None
            if base and len(fs) < len([seed for seed in seeds if (base, s, seed) in runs]):
                continue
            if fs:
                xs.append(s)
                ys.append(statistics.mean(fs))
                es.append(statistics.stdev(fs) if len(fs) > 1 else 0.0)
        if xs:
            ax.errorbar(xs, ys, yerr=es, marker=marker, ls=ls, capsize=3, lw=1.2, ms=4,
                        color=color or palette.get(v, "tab:gray"), label=label or v)

    s_ctrl = 16 if 16 in stale else stale[-1]
    fig, axes = plt.subplots(2, 4, figsize=(14, 6.6), sharey=True)
    top = [("GRPO and the off-policy losses", [("grpo", None, None), ("m2po", None, None), ("bapo", None, None),
                                               ("is", None, None)]),
           ("the GAC variants", [("grpo", None, None), ("gac", None, None), ("gacwin", None, None),
                                 ("gacproj", None, None), ("gacwinproj", None, None), ("gacmax", None, None)]),
           ("gac and its controls", [("grpo", None, None), ("gac", None, "tab:green")]
            + [(f"{c}-gac", label, control_color[c]) for c, label in CONTROL_LABELS.items()]),
           ("gacwin and its controls", [("grpo", None, None), ("gacwin", None, "tab:green")]
            + [(f"{c}-gacwin", label, control_color[c]) for c, label in CONTROL_LABELS.items()])]
    for ax, (title, lines) in zip(axes[0], top):
        for v, label, color in lines:
            final_vs_s(ax, v, label, color)
        if title == "the GAC variants":
            for b, mk in [("0.5", "v"), ("2", "^")]:
                fs = [runs[(f"gacb{b}", s_ctrl, seed)]["m"]["final"] for seed in seeds if (f"gacb{b}", s_ctrl, seed) in runs]
                if fs:
                    ax.errorbar([s_ctrl + (-1 if b == "0.5" else 1)], [statistics.mean(fs)],
                                yerr=[statistics.stdev(fs) if len(fs) > 1 else 0.0], marker=mk, ls="none",
                                capsize=3, ms=5, color="tab:pink", label=f"gac, β = {b}")
        ax.set_title(f"{title}: final, by staleness", fontsize=9)
        ax.set_xlabel("staleness s")
        ax.set_xticks(stale)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    axes[0][0].set_ylabel("final held-out exact match")
    for ax, g in zip(axes[1], ["gac", "gacwin", "gacmax", "gacproj"]):
        band(ax, "grpo", s_ctrl, heldout, "grpo")
        band(ax, g, s_ctrl, heldout, g, "tab:green")
        for c, label in CONTROL_LABELS.items():
            band(ax, f"{c}-{g}", s_ctrl, heldout, label, control_color[c])
        ax.set_title(f"{g} and its controls, s = {s_ctrl}", fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    axes[1][0].set_ylabel("held-out exact match")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "results_controls.png"), dpi=90)
    plt.close(fig)


# --- the held-out replication (docs/RESULTS.md, "Held-out replication: pre-registered design") ----

# The pre-registered contrasts, (name, row, reference, the claim it tests), at each staleness.
REPLICATION_CONTRASTS = [
    ("C1", "gac", "grpo", "GAC helps under staleness"),
    ("C2", "gacmax", "grpo", "the skipping variant helps"),
    ("C3", "gacwin", "grpo", "the windowed trigger helps without skipping"),
    ("C4", "gacmax", "rskip-gacmax", "GAC's skips beat random skips at the same rate"),
    ("C5", "gacmax", "mskip-gacmax", "projection adds to GAC's skips"),
    ("C6", "mskip-gacmax", "bskip-gacmax", "where the skips fall matters (run lengths kept)"),
    ("C7", "mskip-gacmax", "cskip-gacmax", "clustering within a 50-step block matters"),
    ("C8", "gacwin", "lrs-gacwin", "gacwin's effect is more than a drift-matched lr cut"),
]
REPLICATION_STALENESS = (16, 32)


def last_evals_mean(evals, n=5):
    """The primary endpoint: the mean held-out accuracy over the last n evaluations (None with fewer)."""
    if len(evals) < n:
        return None
    return statistics.mean(a for _, a in evals[-n:])


def paired_t_p(diffs):
    """The two-sided p-value of the paired t-test that the mean of diffs is 0 (None with fewer than 2
    values; 0 or 1 when every difference is the same)."""
    diffs = clean(diffs)
    if len(diffs) < 2:
        return None
    sdv = statistics.stdev(diffs)
    m = statistics.mean(diffs)
    if sdv == 0.0:
        return 1.0 if m == 0.0 else 0.0
    t = m / (sdv / math.sqrt(len(diffs)))
    return min(1.0, 2.0 * (1.0 - t_cdf(abs(t), len(diffs) - 1)))


def holm(pvalues):
    """Holm's step-down adjusted p-values, in the order given (None stays None and is not counted)."""
    indexed = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(indexed)
    out = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def fisher_exact_p(a, b, c, d):
    """Two-sided p of Fisher's exact test on the 2 x 2 table [[a, b], [c, d]]: the summed probability, with
    the margins fixed, of every table no more probable than the observed one."""
    r1, c1, n = a + b, a + c, a + b + c + d
    if n == 0:
        return None
    prob = lambda x: math.comb(r1, x) * math.comb(n - r1, c1 - x) / math.comb(n, c1)
    p0 = prob(a)
    return min(1.0, sum(prob(x) for x in range(max(0, c1 - (n - r1)), min(r1, c1) + 1)
                        if prob(x) <= p0 * (1.0 + 1e-9)))


# The per-run rows behind the replication's tables (replication-runs.csv), in this order.
REPLICATION_RUN_KEYS = ["arm", "staleness", "seed", "endpoint", "mean_acc", "outcome", "collapse", "skip_rate",
                        "drift", "sampler_kl"]


def replication_record(r):
    """One run's row: the primary endpoint, the mean over all evaluations, the outcome, the skip rate, the
    median drift over the lag window and the mean sampler KL (steps > 50)."""
    m = metrics(r)
    drift = clean(r.get("drift", []))
    return {"endpoint": last_evals_mean(r["evals"]), "mean_acc": m["mean_acc"], "outcome": m["outcome"],
            "collapse": m["collapse"], "skip_rate": m["skip_rate"],
            "drift": statistics.median(drift) if drift else None, "sampler_kl": m["sampler_kl"]}


def write_replication_runs(records, path):
    write_run_rows(path, REPLICATION_RUN_KEYS, sorted(records.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])))


def read_replication_runs(path):
    return read_run_rows(path, REPLICATION_RUN_KEYS, 3, ints={"collapse"}, texts={"outcome"})


def drift_ratio(records, s, row, ref):
    """The median over seeds of row's median drift / ref's (same seed), or None."""
    ratios = [records[(row, s, seed)]["drift"] / records[(ref, s, seed)]["drift"]
              for (v, ss, seed) in records if v == row and ss == s and (ref, s, seed) in records
              and records[(row, s, seed)]["drift"] and records[(ref, s, seed)]["drift"]]
    return statistics.median(ratios) if ratios else None


def replication_rows(records):
    """One row per (contrast, s): the paired differences of the primary endpoint over the seeds both arms
    ran, the mean and its 95 % interval, the t-test's p and Holm's adjusted p over all rows; beside them the
    secondary endpoint, collapses, with Fisher's exact p. C8 (the lr control) is withdrawn where the control's
    drift ends more than 10 % from gacwin's (median over seeds of the per-seed ratio)."""
    rows = []
    for s in REPLICATION_STALENESS:
        for name, row, ref, claim in REPLICATION_CONTRASTS:
            seeds = sorted(seed for (v, ss, seed) in records if v == row and ss == s and (ref, s, seed) in records)
            diffs, col_row, col_ref = [], 0, 0
            for seed in seeds:
                a, b = records[(row, s, seed)], records[(ref, s, seed)]
                if a["endpoint"] is not None and b["endpoint"] is not None:
                    diffs.append(a["endpoint"] - b["endpoint"])
                col_row += a["outcome"] == "collapsed"
                col_ref += b["outcome"] == "collapsed"
            m, lo, hi = paired_ci(diffs)
            ratio = drift_ratio(records, s, ref, row) if name == "C8" else None
            rows.append({"contrast": name, "s": s, "row": row, "reference": ref, "claim": claim, "n": len(diffs),
                         "mean": m, "low": lo, "high": hi, "p": paired_t_p(diffs),
                         "collapsed_row": col_row, "collapsed_reference": col_ref,
                         "fisher_p": fisher_exact_p(col_row, len(seeds) - col_row, col_ref, len(seeds) - col_ref),
                         "drift_ratio": ratio})
    for r, adjusted in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = adjusted
        r["verdict"] = ("replicates" if adjusted is not None and adjusted < 0.05 and r["mean"] > 0 else
                        "opposite" if adjusted is not None and adjusted < 0.05 else
                        "n < 2" if adjusted is None else "does not replicate")
        if r["drift_ratio"] is not None and abs(r["drift_ratio"] - 1.0) > 0.1:
            r["verdict"] = f"withdrawn (drift ratio {r['drift_ratio']:.2f})"
    return rows


def replication_text(records):
    """The replication's tables (markdown) and its contrast rows, from the per-run rows."""
    rows = replication_rows(records)
    arms = [a for a in ["grpo", "gac", "gacmax", "gacwin", "rskip-gacmax", "mskip-gacmax", "bskip-gacmax",
                        "cskip-gacmax", "lrs-gacwin"] if any(k[0] == a for k in records)]
    arms += sorted({k[0] for k in records} - set(arms))
    lines = ["| s | arm | runs | last 5 evaluations (primary) | all 20 evaluations | collapsed / never learned "
             "/ learned | skip rate | median drift over the lag window | sampler KL |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in sorted({k[1] for k in records}):
        for a in arms:
            rs = [rec for (v, ss, _), rec in sorted(records.items()) if v == a and ss == s]
            if not rs:
                continue
            counts = " / ".join(str(sum(1 for r in rs if r["outcome"] == o)) for o in OUTCOMES)
            lines.append(f"| {s} | {a} | {len(rs)} | {mean_sd([r['endpoint'] for r in rs])} "
                         f"| {mean_sd([r['mean_acc'] for r in rs])} | {counts} "
                         f"| {fmt(mean([r['skip_rate'] for r in rs]), 3)} | {mean_sd([r['drift'] for r in rs], 4)} "
                         f"| {mean_sd([r['sampler_kl'] for r in rs], 4)} |")
    lines += ["", "| contrast | s | row − reference | n | mean [95 % CI] | p | Holm p | verdict | collapsed "
              "(row / reference) | Fisher p | claim |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    pfmt = lambda p: "-" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"
    for r in rows:
        ci = f"{r['mean']:+.3f} {interval(r['low'], r['high'])}" if r["mean"] is not None else "-"
        lines.append(f"| {r['contrast']} | {r['s']} | {r['row']} − {r['reference']} | {r['n']} | {ci} | "
                     f"{pfmt(r['p'])} | {pfmt(r['p_holm'])} | {r['verdict']} | {r['collapsed_row']} / "
                     f"{r['collapsed_reference']} | {pfmt(r['fisher_p'])} | {r['claim']} |")
    return "\n".join(lines) + "\n", rows


def replicate(args):
    raw = load_finished(args.runs)
    if not raw:
        sys.exit(f"replicate: no finished runs in {args.runs}")
    records = {k: replication_record(r) for k, r in raw.items()}
    text, rows = replication_text(records)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "replication.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "replication.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    write_replication_runs(records, os.path.join(args.out, "replication-runs.csv"))
    print(text, end="")


# --- the size sweep (docs/RESULTS.md, "Where c_t leaves its noise floor") ----------------

SIZE_POLICIES = [("mlp-w64", "MLP w64"), ("mlp-w128", "MLP w128 (the example)"), ("mlp-w256", "MLP w256"),
                 ("mlp-w512", "MLP w512"), ("mlp-w1024", "MLP w1024"), ("tf-d64", "transformer d64"),
                 ("tf-d128", "transformer d128")]
SIZE_RUN_KEYS = ["policy", "seed", "parameters", "pr_pop", "noise_rms", "q90", "start", "final", "cpu_s"]


def size_record(r):
    m = metrics(r)
    return {"parameters": log_parameters(r["log"]), **{k: m[k] for k in SIZE_RUN_KEYS[3:-1]},
            "cpu_s": log_cpu_seconds(r["log"])}


def write_size_runs(records, path):
    write_run_rows(path, SIZE_RUN_KEYS, sorted(records.items()))


def read_size_runs(path):
    return read_run_rows(path, SIZE_RUN_KEYS, 2, ints={"parameters"})


def sizes_text(records):
    """The size sweep's table from its per-run rows: per policy, mean ± sd over seeds."""
    lines = ["| policy | parameters | runs | PR (population) | noise floor rms | on-policy q0.9 \\|c_t\\| | q0.9 / rms "
             "| held-out start → end | CPU s per run |", "|---|---|---|---|---|---|---|---|---|"]
    for name, label in SIZE_POLICIES:
        rs = [rec for (p, _), rec in sorted(records.items()) if p == name]
        if not rs:
            continue
        ratio = [r["q90"] / r["noise_rms"] for r in rs if r["q90"] is not None and r["noise_rms"]]
        lines.append(f"| {label} | {rs[0]['parameters']:,} | {len(rs)} | {mean_sd([r['pr_pop'] for r in rs], 1)} "
                     f"| {mean_sd([r['noise_rms'] for r in rs])} | {mean_sd([r['q90'] for r in rs])} "
                     f"| {mean_sd(ratio, 2)} | {mean_sd([r['start'] for r in rs])} → {mean_sd([r['final'] for r in rs])} "
                     f"| {fmt(mean([r['cpu_s'] for r in rs]), 0)} |")
    return "\n".join(lines) + "\n"


def load_sizes(runs_dir):
    out = {}
    for (policy, _, seed), r in load_finished(runs_dir).items():
        out[(policy, seed)] = size_record(r)
    return out


def sizes(args):
    records = load_sizes(args.runs)
    if not records:
        sys.exit(f"sizes: no finished runs in {args.runs}")
    os.makedirs(args.out, exist_ok=True)
    write_size_runs(records, os.path.join(args.out, "sizes-runs.csv"))
    text = sizes_text(records)
    open(os.path.join(args.out, "sizes.md"), "w").write(text)
    print(text, end="")


# --- the committed data and the tables rebuilt from it ---------------------------------------

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BLOCK = re.compile(r"<!-- table (?P<name>[a-z0-9-]+): rebuilt by analyze.py tables -->\n(?P<body>.*?)"
                   r"<!-- end table (?P=name) -->", re.S)


def extract(archive, into):
    import tarfile
    with tarfile.open(archive, "r:xz") as tar:
        try:
            tar.extractall(into, filter="data")
        except TypeError:  # a Python without extraction filters
            tar.extractall(into)


def sibling_module(name):
    """examples/grpo/<name>.py, loaded by path (spikes.py and the exp2_* modules import this one)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"gac_grpo_{name}", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_TABLES_CACHE = {}


def committed_tables(data, problems):
    """{block name: markdown} of every table built from the committed data in `data`; `problems` collects
    every per-run row that the per-step archives do not reproduce. Built once per process for the same
    files (names, sizes and modification times)."""
    key = tuple((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in sorted(os.scandir(data), key=lambda e: e.name))
    if (data, key) not in _TABLES_CACHE:
        found = []
        _TABLES_CACHE[(data, key)] = (build_tables(data, found), found)
    tables, found = _TABLES_CACHE[(data, key)]
    problems.extend(found)
    return dict(tables)


def check_rebuilt_rows(data, tmp, name, archive, write, problems, ignore=()):
    """Writes the per-run rows rebuilt from `archive` with write(path) and notes a problem where the committed
    rows (`name` in data) differ, outside the columns `ignore` (what this machine cannot rebuild)."""
    rebuilt = os.path.join(tmp, name)
    write(rebuilt)

    def cut(path):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        return [[c for c, h in zip(row, rows[0]) if h not in ignore] for row in rows]

    if cut(rebuilt) != cut(os.path.join(data, name)):
        problems.append(f"{name} differs from the rows rebuilt from {archive}"
                        + (f" (not compared: {', '.join(ignore)})" if ignore else ""))


def build_tables(data, problems):
    import tempfile
    spikes = sibling_module("spikes")
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        rep = os.path.join(tmp, "replication")
        extract(os.path.join(data, "replication.tar.xz"), rep)
        raw = load_finished(os.path.join(rep, "runs"))
        check_rebuilt_rows(data, tmp, "replication-runs.csv", "replication.tar.xz",
                           lambda path: write_replication_runs({k: replication_record(r) for k, r in raw.items()}, path),
                           problems)
        tables["replication"] = replication_text(read_replication_runs(os.path.join(data, "replication-runs.csv")))[0]
        cal = read_calibration(os.path.join(rep, "calibration.txt"))
        pool = {k: r for k, r in raw.items() if k[0] == "grpo"}
        for r in pool.values():
            r["m"] = metrics(r)
        out = []
        detector_table(out, pool, {k: series_stats(r) for k, r in pool.items()}, thresholds(cal), "GRPO runs")
        tables["replication-detectors"] = "\n".join(out[2:]).rstrip("\n") + "\n"
        tables["replication-separation"] = separation_text(pool)
        found = calibration_file(os.path.join(rep, "calibration-runs"))
        if found is None or found[0] != open(os.path.join(rep, "calibration.txt")).read():
            problems.append("calibration.txt in replication.tar.xz differs from the thresholds its calibration-runs give")

        # The exploratory grid: its calibration is the replication's (the same runs and file; not stored twice).
        gr = os.path.join(tmp, "grid")
        extract(os.path.join(data, "grid.tar.xz"), gr)
        runs = load_all(os.path.join(gr, "runs"), exclude_seeds=calibration_seeds(cal) or ())
        check_rebuilt_rows(data, tmp, "grid-runs.csv", "grid.tar.xz",
                           lambda path: write_grid_runs({k: grid_record(r) for k, r in runs.items()}, path), problems)
        ms = read_grid_runs(os.path.join(data, "grid-runs.csv"))
        tables["grid-thresholds"] = thresholds_text(cal, grid_axes(ms)[1])
        tables["grid-outcomes"] = outcome_text(ms)
        tables["grid-final"] = final_text(ms)
        tables["grid-paired-final"], tables["grid-paired-mean"] = (paired_text(ms, metric, label)[0]
                                                                   for metric, label in PAIRED_METRICS)
        tables["grid-bias"] = bias_text(ms)
        tables["grid-detectors"], tables["grid-detectors-grpo"] = detector_texts(runs, cal)[0]

        sz = os.path.join(tmp, "sizes")
        extract(os.path.join(data, "sizes.tar.xz"), sz)
        check_rebuilt_rows(data, tmp, "sizes-runs.csv", "sizes.tar.xz",
                           lambda path: write_size_runs(load_sizes(os.path.join(sz, "runs")), path), problems)
        tables["sizes"] = sizes_text(read_size_runs(os.path.join(data, "sizes-runs.csv")))

        sp = os.path.join(tmp, "spikes")
        extract(os.path.join(data, "spikes.tar.xz"), sp)
        committed = spikes.read_rows(os.path.join(data, "spikes-runs.csv"))
        fresh = spikes.collect(os.path.join(sp, "runs"))
        olmo = fresh and any(r["olmo_replay_skips"] is not None for r in fresh)
        keys = [k for k in spikes.ROW_KEYS if olmo or not k.startswith("olmo_")]
        strip = lambda rows: [{k: (round(r[k], 6) if isinstance(r[k], float) else r[k]) for k in keys} for r in rows]
        if strip(committed) != strip(fresh):
            problems.append("spikes-runs.csv differs from the rows rebuilt from spikes.tar.xz"
                            + ("" if olmo else " (OLMo-core's columns not checked: olmo_core not importable)"))
        tables["spikes"] = spikes.render(committed)

        tables.update(exp2_tables(data, tmp, problems))

        pi = os.path.join(tmp, "pilot")
        extract(os.path.join(data, "pilot.tar.xz"), pi)
        check_rebuilt_rows(data, tmp, "pilot-runs.csv", "pilot.tar.xz",
                           lambda path: write_pilot_runs(load_pilot(os.path.join(pi, "runs"),
                                                                    os.path.join(pi, "jobs.txt")), path), problems)
        tables["pilot"] = pilot_text(read_pilot_runs(os.path.join(data, "pilot-runs.csv")))
    return tables


# The second registered experiment's parts: the archive exp2-<part>.tar.xz, its rows exp2-<part>-runs.csv and the
# module that reads the one and renders the other (examples/grpo/<module>.py).
EXP2_PARTS = (("a", "exp2_losses"), ("b", "exp2_jumps"), ("c", "exp2_scale"), ("d", "exp2_guard"))


def exp2_tables(data, tmp, problems):
    """The tables of every part of the second registered experiment that has its archive in `data` (a part not
    yet run has none), rendered from the committed per-run rows; the rows (and part A's facts: P_s, L_s and
    the thresholds) rebuilt from the archive must equal the committed ones, and part A's calibration.txt the
    thresholds its calibration runs give."""
    tables = {}
    for part, name in EXP2_PARTS:
        archive = f"exp2-{part}.tar.xz"
        if not os.path.exists(os.path.join(data, archive)):
            continue
        module = sibling_module(name)
        root = os.path.join(tmp, f"exp2-{part}")
        extract(os.path.join(data, archive), root)
        rows = f"exp2-{part}-runs.csv"
        # A module whose rows need more than this machine may have says which columns it cannot rebuild here.
        rebuilt, ignore = (module.rebuilt_rows(root) if hasattr(module, "rebuilt_rows") else (module.collect(root), ()))
        check_rebuilt_rows(data, tmp, rows, archive, lambda path: module.write_rows(rebuilt, path), problems, ignore)
        extra = ()
        if part == "a":
            check_rebuilt_rows(data, tmp, "exp2-a-facts.csv", archive,
                               lambda path: module.write_facts(module.collect_facts(root), path), problems)
            extra = (module.read_facts(os.path.join(data, "exp2-a-facts.csv")),)
            found = calibration_file(os.path.join(root, "calibration-runs"))
            if found is None or found[0] != open(os.path.join(root, "calibration.txt")).read():
                problems.append(f"calibration.txt in {archive} differs from the thresholds its calibration-runs give")
        tables.update(module.render(module.read_rows(os.path.join(data, rows)), *extra))
    return tables


def auc(positives, negatives):
    """The probability that a positive's value exceeds a negative's (ties count half); None if either is empty."""
    if not positives or not negatives:
        return None
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in positives for q in negatives)
    return wins / (len(positives) * len(negatives))


SEPARATION_SPAN = (WARMUP, 200)  # steps (first, last]: before every collapse of these runs


def separation_text(pool):
    """Among runs that are all stale: does a run's early alignment (mean over steps 51-200) tell the runs that
    collapse from those that do not? AUC per staleness and pooled, of |c_t|, |m_t| and the sampler KL."""
    first, last = SEPARATION_SPAN
    lines = [f"| s | runs (collapsed / not) | AUC, mean \\|c_t\\| | AUC, mean \\|m_t\\| | AUC, mean sampler KL "
             f"| first collapse step |", "|---|---|---|---|---|---|"]
    feats = {}
    for k, r in pool.items():
        span = [i for i, st in enumerate(r["step"]) if first < st <= last]
        val = lambda name, f=abs: mean([f(r[name][i]) for i in span if r[name][i] is not None])
        feats[k] = (metrics(r), val("cosine"), val("window_mean"), val("sampler_kl", lambda x: x))
    for s in sorted({k[1] for k in pool}) + [None]:
        keys = [k for k in pool if s is None or k[1] == s]
        pos = [feats[k] for k in keys if feats[k][0]["outcome"] == "collapsed"]
        neg = [feats[k] for k in keys if feats[k][0]["outcome"] != "collapsed"]
        cells = [fmt(auc([f[j] for f in pos], [f[j] for f in neg]), 2) for j in (1, 2, 3)]
        firsts = [f[0]["collapse"] for f in pos]
        lines.append(f"| {'all' if s is None else s} | {len(keys)} ({len(pos)} / {len(neg)}) | " + " | ".join(cells)
                     + f" | {min(firsts) if firsts else '-'} |")
    return "\n".join(lines) + "\n"


def tables(args):
    problems = []
    built = committed_tables(args.data, problems)
    if not (args.check or args.write):
        for name, text in built.items():
            print(f"<!-- table {name} -->\n{text}")
        return 1 if problems else 0
    path = args.check or args.write
    doc = open(path).read()
    found = {m.group("name"): m.group("body") for m in BLOCK.finditer(doc)}
    for name in built:
        if name not in found:
            problems.append(f"{path} has no block for the table {name}")
        elif args.check and found[name] != built[name]:
            problems.append(f"{path}: the table {name} differs from the one rebuilt from {args.data}")
    if args.write:
        doc = BLOCK.sub(lambda m: (f"<!-- table {m.group('name')}: rebuilt by analyze.py tables -->\n"
                                   f"{built.get(m.group('name'), m.group('body'))}<!-- end table {m.group('name')} -->"),
                        doc)
        open(path, "w").write(doc)
    for p in problems:
        print(f"tables: {p}", file=sys.stderr)
    if not problems:
        print(f"tables: {len(built)} tables {'match' if args.check else 'written to'} {path}")
    return 1 if problems else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate")
    c.add_argument("--runs", required=True)
    c.add_argument("--out", required=True)
    k = sub.add_parser("control")
    k.add_argument("--csv", required=True)
    k.add_argument("--mask-out", required=True)
    k.add_argument("--block-mask-out", help="also the mask with its runs in a random order (bskip)")
    k.add_argument("--count-mask-out", help="also the same count per --block steps at random positions (cskip)")
    k.add_argument("--block", type=int, default=50)
    k.add_argument("--seed", type=int, default=0, help="the random masks' seed")
    b = sub.add_parser("burst", help="the second design's burst masks (docs/RESULTS.md, part A)")
    b.add_argument("--csv", nargs="+", required=True, help="the grpo-gacmax runs' CSVs at this staleness")
    b.add_argument("--staleness", type=int, required=True)
    b.add_argument("--seeds", required=True, help="e.g. 1001-1024 or 1001,1002")
    b.add_argument("--steps", type=int, default=400)
    b.add_argument("--out", required=True, help="the folder of the masks, burst_sS_seedI.txt")
    p = sub.add_parser("pilot", help="the configuration pilot's table (scripts/experiment.sh pilot)")
    p.add_argument("--runs", required=True)
    p.add_argument("--jobs", help="the pilot's job list, whose order the rows follow (default: RUNS/../pilot-jobs.txt)")
    p.add_argument("--out", help="where pilot-runs.csv and pilot.md go (default: RUNS)")
    r = sub.add_parser("report")
    r.add_argument("--runs", required=True)
    r.add_argument("--calibration", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--no-plots", action="store_true", help="tables and CSVs only")
    q = sub.add_parser("replicate", help="the pre-registered replication's contrasts (docs/RESULTS.md)")
    q.add_argument("--runs", required=True)
    q.add_argument("--out", required=True)
    z = sub.add_parser("sizes", help="the size sweep's table (scripts/experiment.sh sizes)")
    z.add_argument("--runs", required=True)
    z.add_argument("--out", required=True)
    t = sub.add_parser("tables", help="every table built from the committed data (examples/grpo/data)")
    t.add_argument("--data", default=DATA_DIR)
    mode = t.add_mutually_exclusive_group()
    mode.add_argument("--check", metavar="MARKDOWN", help="fail when a table there differs from the rebuilt one")
    mode.add_argument("--write", metavar="MARKDOWN", help="replace the tables there by the rebuilt ones")
    args = ap.parse_args(argv)
    return {"burst": burst, "calibrate": calibrate, "control": control, "pilot": pilot, "report": report,
            "replicate": replicate, "sizes": sizes, "tables": tables}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
