#!/usr/bin/env python3
"""Analysis of the gac_grpo experiment (scripts/experiment.sh, docs/RESULTS.md).

  analyze.py calibrate --runs DIR --out FILE
      Thresholds from the synchronous runs (grpo_s0_seed*.csv), pooled over
      seeds, steps > 50: c_low = q0.9 |c_t|, c_high = max |c_t|, and the same
      of |m_t| (the signed mean of c_t over the trainer's --window steps) for
      the windowed trigger.
  analyze.py pilot --runs DIR
      The table of the configuration pilot (scripts/experiment.sh pilot): per
      candidate, synchronous and s = 16 held-out accuracy, collapses, the
      effective dimension, the noise floor, c_t and lambda, and CPU time.
  analyze.py report --runs DIR --calibration FILE --out DIR
      results.csv (one row per run), summary.md (the tables of RESULTS.md),
      detectors.csv, and the plots results_heldout.png, results_ct.png,
      results_lambda.png, results_controls.png (with matplotlib).

Runs are RUNS/<variant>_s<staleness>_seed<seed>.csv with the trainer's log
beside them (.log). Definitions:
  final acc        held-out greedy exact match at the last step
  mean acc         mean held-out accuracy over the evaluations (every 20 steps)
  collapse         the first evaluation at which held-out accuracy is below
                   0.7 x its running peak (the accuracy after the warm-up
                   included) and still is at the next evaluation
  statistics of c  over steps > 50, as the paper's Table 3
  lambda           cos(b_t, g_{t-1}) of the bias probe, steps > 50
  alarm            first step > 50 at which a detector's statistic exceeds
                   its threshold; a true alarm comes at or before the
                   collapse, lead = collapse step - alarm step
"""
import argparse
import csv
import glob
import math
import os
import re
import statistics
import sys

WARMUP = 50
COLLAPSE_FRACTION = 0.7
BASE_VARIANTS = ["grpo", "m2po", "bapo", "is"]
GAC_VARIANTS = ["gac", "gacexact", "gacwin", "gac005", "gacproj", "gacwinproj"]


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def mean(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.mean(xs) if xs else None


def sd(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.stdev(xs) if len(xs) > 1 else None


def quantile(xs, q):
    xs = sorted(x for x in xs if x is not None and not math.isnan(x))
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


def fmt(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def mean_sd(xs, digits=3):
    m, s = mean(xs), sd(xs)
    if m is None:
        return "-"
    return f"{m:.{digits}f}" if s is None else f"{m:.{digits}f} ± {s:.{digits}f}"


def run_key(path):
    m = re.match(r"(.+?)_s(\d+)_seed(\d+)\.csv$", os.path.basename(path))
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def load_run(path):
    """The per-step series and the log's facts of one finished run; None if unfinished."""
    log_path = path[:-4] + ".log"
    log = open(log_path).read() if os.path.exists(log_path) else ""
    if "summary:" not in log:
        return None
    with open(path) as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = [dict(zip(header, r)) for r in reader if len(r) == len(header)]
    m = re.search(r"(?:supervised warm-up: .*|start:) held-out accuracy ([0-9.]+)", log)
    r = {"start": float(m.group(1)) if m else None, "log": log}
    col = lambda name: [fnum(x.get(name)) for x in rows]
    r["step"] = [int(x["step"]) for x in rows]
    for name in ["reward", "entropy", "sampler_kl", "cosine", "window_mean", "noise_cos", "grad_norm", "alpha",
                 "pr_pop", "pr_sample", "lambda", "bias_rel", "on_align", "aligned_before", "aligned_after",
                 "bias_after_rel", "staleness"]:
        r[name] = col(name)
    r["regime"] = [x["regime"] for x in rows]
    r["stepped"] = [x["stepped"] == "1" for x in rows]
    r["evals"] = [(int(x["step"]), float(x["heldout_acc"])) for x in rows if x["heldout_acc"]]
    return r


def collapse_step(start, evals):
    peak = start if start is not None else 0.0
    for i, (step, acc) in enumerate(evals[:-1]):
        peak = max(peak, acc)
        if acc < COLLAPSE_FRACTION * peak and evals[i + 1][1] < COLLAPSE_FRACTION * peak:
            return step
    return None


def after_warmup(r, name):
    return [v for s, v in zip(r["step"], r[name]) if s > WARMUP and v is not None]


def metrics(r):
    evals = r["evals"]
    c = after_warmup(r, "cosine")
    m = after_warmup(r, "window_mean")
    noise = after_warmup(r, "noise_cos")
    steps = len(r["step"])
    probe = [i for i, s in enumerate(r["step"]) if s > WARMUP and r["lambda"][i] is not None]
    project = [i for i in probe if r["regime"][i] == "project" and r["aligned_before"][i]]
    out = {
        "start": r["start"],
        "final": evals[-1][1] if evals else None,
        "mean_acc": mean([a for _, a in evals]),
        "peak": max([r["start"] or 0.0] + [a for _, a in evals]),
        "collapse": collapse_step(r["start"], evals),
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
        "bias_cut": mean([r["bias_after_rel"][i] / r["bias_rel"][i] for i in project if r["bias_rel"][i]]),
        "probes_project": len(project),
        "sampler_kl": mean(after_warmup(r, "sampler_kl")),
        "skip_rate": sum(1 for s in r["stepped"] if not s) / steps if steps else None,
        "project_rate": sum(1 for g in r["regime"] if g == "project") / steps if steps else None,
        "steps": steps,
    }
    return out


def load_all(runs_dir):
    runs = {}
    for path in sorted(glob.glob(os.path.join(runs_dir, "*_s*_seed*.csv"))):
        key = run_key(path)
        if key is None:
            continue
        r = load_run(path)
        if r is not None:
            r["m"] = metrics(r)
            runs[key] = r
    return runs


# --- calibration -----------------------------------------------------------------

def calibrate(args):
    runs = [load_run(p) for p in sorted(glob.glob(os.path.join(args.runs, "grpo_s0_seed*.csv")))]
    runs = [r for r in runs if r is not None]
    if not runs:
        sys.exit("calibrate: no finished synchronous runs (grpo_s0_seed*.csv)")
    c = [abs(x) for r in runs for x in after_warmup(r, "cosine")]
    m = [abs(x) for r in runs for x in after_warmup(r, "window_mean")]
    out = {"c_low": quantile(c, 0.9), "c_high": max(c), "window_c_low": quantile(m, 0.9),
           "window_c_high": max(m), "runs": len(runs), "steps": len(c)}
    with open(args.out, "w") as f:
        for k, v in out.items():
            f.write(f"{k}={v:.6g}\n" if isinstance(v, float) else f"{k}={v}\n")
    print(f"calibration from {len(runs)} synchronous runs ({len(c)} steps): "
          + ", ".join(f"{k} {v:.4f}" for k, v in out.items() if isinstance(v, float)))


# --- detectors -------------------------------------------------------------------

def series_stats(r):
    """Per-step statistics a detector compares with its threshold."""
    n = len(r["step"])
    absc = [abs(x) if x is not None else None for x in r["cosine"]]
    c10 = moving(absc, 10)
    elevated = [min(c10[i - 4:i + 1]) if i >= 4 and None not in c10[i - 4:i + 1] else None for i in range(n)]
    m = [abs(x) if x is not None else None for x in r["window_mean"]]
    kl10 = moving(r["sampler_kl"], 10)
    h = r["entropy"]
    h_ref = mean(h[:WARMUP])
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


SIGNALS = [  # name, statistic, description
    ("c10", "10-step mean of |c_t| (the earlier alert)"),
    ("m", "|m_t|, signed mean of c_t over 20 steps"),
    ("c", "|c_t| per step (GacAlignmentSpike)"),
    ("elevated", "10-step mean |c_t| above the threshold for 5 steps (GacAlignmentElevated)"),
    ("kl10", "10-step mean sampler-learner KL, mean log(pi_b / pi_theta)"),
    ("entropy", "relative change of the 10-step mean entropy from steps 1-50"),
    ("gradz", "gradient-norm z-score over the previous 128 steps (OLMo-core)"),
]


def first_alarm(r, stat, threshold):
    for s, v in zip(r["step"], stat):
        if s > WARMUP and v is not None and v > threshold:
            return s
    return None


def evaluate_detector(runs, stats, signal, threshold):
    tp = fp = fn = tn = 0
    leads = []
    for key, r in runs.items():
        alarm = first_alarm(r, stats[key][signal], threshold)
        col = r["m"]["collapse"]
        if col is not None:
            if alarm is not None and alarm <= col:
                tp += 1
                leads.append(col - alarm)
            else:
                fn += 1
        elif alarm is not None:
            fp += 1
        else:
            tn += 1
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else 0.0
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "precision": precision, "recall": recall, "f1": f1,
            "leads": sorted(leads)}


def lead_text(leads):
    if not leads:
        return "-"
    return f"{statistics.median(leads):.0f} ({min(leads)}–{max(leads)})"


# --- report ----------------------------------------------------------------------

def is_monitor(variant):
    return variant in BASE_VARIANTS or variant.startswith("rskip-") or variant.startswith("lrs-")


def report(args):
    cal = dict(line.strip().split("=", 1) for line in open(args.calibration) if "=" in line)
    cal = {k: float(v) for k, v in cal.items()}
    runs = load_all(args.runs)
    if not runs:
        sys.exit("report: no finished runs")
    os.makedirs(args.out, exist_ok=True)
    keys = ["start", "final", "mean_acc", "peak", "collapse", "reward", "entropy_end", "q90", "cmax", "cmean",
            "m_q90", "mmean", "noise_mean", "noise_rms", "pr_pop", "pr_sample", "lambda", "lambda2", "bias_rel", "on_align",
            "aligned_before", "aligned_after", "bias_cut", "probes_project", "sampler_kl", "skip_rate", "project_rate", "steps"]
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "staleness", "seed"] + keys)
        for (v, s, seed), r in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            w.writerow([v, s, seed] + ["" if r["m"][k] is None else (f"{r['m'][k]:.5g}" if isinstance(r["m"][k], float)
                                                                     else r["m"][k]) for k in keys])

    stale = sorted({k[1] for k in runs})
    seeds = sorted({k[2] for k in runs})
    order = BASE_VARIANTS + GAC_VARIANTS
    variants = [v for v in order if any(k[0] == v for k in runs)]
    controls = sorted({k[0] for k in runs if k[0] not in order})
    get = lambda v, s: [runs[(v, s, seed)] for seed in seeds if (v, s, seed) in runs]

    def ref_runs(v, s):
        # grpo at s = 0 stands for every loss (the ratio is 1: identical runs)
        return get(v, s) or (get("grpo", 0) if s == 0 and v in BASE_VARIANTS else [])

    out = []
    out.append(f"Thresholds (calibrated once from {int(cal['runs'])} synchronous runs, {int(cal['steps'])} steps): "
               f"c_low = {cal['c_low']:.4f}, c_high = {cal['c_high']:.4f}; windowed trigger: "
               f"c_low = {cal['window_c_low']:.4f}, c_high = {cal['window_c_high']:.4f}. Seeds: {seeds}.")
    out.append("")

    # Main table.
    out.append("### Outcome and alignment, mean ± sd over seeds")
    out.append("")
    out.append("| s | variant | n | held-out start → final | mean over evals | collapsed | skip / project rate "
               "| q0.9 \\|c\\| | mean c | noise floor mean / rms | q0.9 \\|m\\| | PR (pop) | λ |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in stale:
        for v in variants + controls:
            rs = ref_runs(v, s)
            if not rs or (s == 0 and v in BASE_VARIANTS and v != "grpo"):
                continue
            M = [r["m"] for r in rs]
            col = [m["collapse"] for m in M if m["collapse"] is not None]
            out.append(
                f"| {s} | {v} | {len(M)} | {mean_sd([m['start'] for m in M])} → {mean_sd([m['final'] for m in M])} "
                f"| {mean_sd([m['mean_acc'] for m in M])} | {len(col)}/{len(M)} "
                f"| {mean([m['skip_rate'] for m in M]):.2f} / {mean([m['project_rate'] for m in M]):.2f} "
                f"| {mean_sd([m['q90'] for m in M], 2)} | {mean_sd([m['cmean'] for m in M], 2)} "
                f"| {fmt(mean([m['noise_mean'] for m in M]), 2)} / {fmt(mean([m['noise_rms'] for m in M]), 2)} "
                f"| {mean_sd([m['m_q90'] for m in M], 2)} | {fmt(mean([m['pr_pop'] for m in M]), 1)} "
                f"| {mean_sd([m['lambda'] for m in M], 2)} |")
    out.append("")

    # Per-seed final accuracy.
    out.append("### Final held-out accuracy per seed")
    out.append("")
    out.append("| s | variant | " + " | ".join(f"seed {x}" for x in seeds) + " |")
    out.append("|---|---|" + "---|" * len(seeds))
    for s in stale:
        for v in variants + controls:
            if s == 0 and v in BASE_VARIANTS and v != "grpo":
                continue
            cells = []
            for seed in seeds:
                r = runs.get((v, s, seed))
                if r is None and s == 0 and v in BASE_VARIANTS:
                    r = runs.get(("grpo", 0, seed))
                cells.append("-" if r is None else fmt(r["m"]["final"]) + ("*" if r["m"]["collapse"] else ""))
            if any(c != "-" for c in cells):
                out.append(f"| {s} | {v} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("(* = collapsed)")
    out.append("")

    # Paired comparisons.
    def paired(a, b, s, metric="final"):
        d = []
        for seed in seeds:
            ra, rb = runs.get((a, s, seed)), runs.get((b, s, seed))
            if rb is None and s == 0 and b in BASE_VARIANTS:
                rb = runs.get(("grpo", 0, seed))
            if ra is not None and rb is not None and ra["m"][metric] is not None and rb["m"][metric] is not None:
                d.append(ra["m"][metric] - rb["m"][metric])
        return d

    out.append("### Paired by seed: difference in final held-out accuracy (row − reference)")
    out.append("")
    out.append("| s | comparison | n | mean ± sd | seeds better | per seed |")
    out.append("|---|---|---|---|---|---|")
    for s in stale:
        pairs = [(v, "grpo") for v in ["m2po", "bapo", "is"] + GAC_VARIANTS if s > 0 or v in GAC_VARIANTS]
        pairs += [(g, f"{c}-{g}") for g in GAC_VARIANTS for c in ("rskip", "lrs")]
        pairs += [(v, "grpo") for v in controls if v.startswith("gacb")]
        for a, b in pairs:
            d = paired(a, b, s)
            if not d:
                continue
            out.append(f"| {s} | {a} − {b} | {len(d)} | {mean_sd(d)} | {sum(x > 0 for x in d)}/{len(d)} "
                       f"| {' '.join(f'{x:+.3f}' for x in d)} |")
    out.append("")

    # Mechanism.
    out.append("### Staleness bias (probe every 5 steps, steps > 50; GRPO in monitor mode, and the GAC runs)")
    out.append("")
    out.append("| s | variant | λ = cos(b, g_prev) | λ² | \\|b\\| / \\|g_on\\| | cos(g_on, g_prev) | c_t mean "
               "| project-step probes | <b, u> before → after GAC, in \\|g_on\\| | \\|b'\\| / \\|b\\| |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for s in stale:
        for v in ["grpo", "is", "gac", "gacwin"]:
            rs = ref_runs(v, s)
            if not rs:
                continue
            M = [r["m"] for r in rs]
            out.append(f"| {s} | {v} | {mean_sd([m['lambda'] for m in M], 3)} | {fmt(mean([m['lambda2'] for m in M]), 3)} "
                       f"| {mean_sd([m['bias_rel'] for m in M], 2)} "
                       f"| {mean_sd([m['on_align'] for m in M], 3)} | {mean_sd([m['cmean'] for m in M], 2)} "
                       f"| {sum(m['probes_project'] for m in M)} | {fmt(mean([m['aligned_before'] for m in M]), 2)} → "
                       f"{fmt(mean([m['aligned_after'] for m in M]), 2)} | {fmt(mean([m['bias_cut'] for m in M]), 2)} |")
    out.append("")

    # Detectors, on the runs GAC did not act on.
    mon = {k: r for k, r in runs.items() if is_monitor(k[0])}
    stats = {k: series_stats(r) for k, r in mon.items()}
    sync = [k for k in mon if k[1] == 0]
    n_col = sum(1 for r in mon.values() if r["m"]["collapse"] is not None)
    out.append(f"### Detectors over the {len(mon)} runs GAC did not act on ({n_col} collapsed)")
    out.append("")
    calibrated = {"c10": cal["c_low"], "m": cal["window_c_low"], "c": cal["c_high"], "elevated": cal["c_low"],
                  "kl10": None, "entropy": None, "gradz": 6.0}
    det_rows = []
    out.append("| signal | rule | threshold | alarmed runs | true / false alarms | missed | precision | recall "
               "| lead, median (range) |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for name, desc in SIGNALS:
        sync_max = max((v for k in sync for s, v in zip(mon[k]["step"], stats[k][name]) if s > WARMUP and v is not None),
                       default=None)
        rules = []
        if calibrated[name] is not None:
            rules.append(("documented", calibrated[name]))
        if sync_max is not None:
            rules.append(("synchronous max", sync_max))
        values = sorted({round(v, 4) for k in mon for s, v in zip(mon[k]["step"], stats[k][name])
                         if s > WARMUP and v is not None})
        best = None
        for t in values[:: max(1, len(values) // 400)]:
            e = evaluate_detector(mon, stats, name, t)
            if best is None or e["f1"] > best[1]["f1"]:
                best = (t, e)
        if best is not None:
            rules.append(("best F1 (in-sample)", best[0]))
        for rule, t in rules:
            e = evaluate_detector(mon, stats, name, t)
            det_rows.append([name, rule, t, e["tp"], e["fp"], e["fn"], e["tn"], e["precision"], e["recall"],
                             " ".join(map(str, e["leads"]))])
            out.append(f"| {desc.replace('|', chr(92) + '|')} | {rule} | {t:.4g} | {e['tp'] + e['fp']} | {e['tp']} / {e['fp']} | {e['fn']} "
                       f"| {fmt(e['precision'], 2)} | {fmt(e['recall'], 2)} | {lead_text(e['leads'])} |")
    with open(os.path.join(args.out, "detectors.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["signal", "rule", "threshold", "tp", "fp", "fn", "tn", "precision", "recall", "leads"])
        w.writerows(det_rows)
    out.append("")
    open(os.path.join(args.out, "summary.md"), "w").write("\n".join(out) + "\n")
    print("\n".join(out))
    plots(args, runs, stale, seeds, cal)


# --- pilot -----------------------------------------------------------------------

def pilot(args):
    runs = load_all(args.runs)
    names = sorted({k[0] for k in runs}, key=lambda n: min(os.path.getmtime(os.path.join(args.runs, f"{k[0]}_s{k[1]}_seed{k[2]}.csv"))
                                                          for k in runs if k[0] == n))
    lines = ["| candidate | parameters | s = 0: held-out start → end | s = 16: start → end | collapsed (s = 0 / 16) "
             "| PR pop / sample | noise floor mean / rms | q0.9 \\|c\\| (s = 0) | q0.9 \\|m\\| (s = 0) "
             "| mean c (0 / 16) | λ (0 / 16) | CPU s per run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        s0 = [r for k, r in runs.items() if k[0] == n and k[1] == 0]
        s16 = [r for k, r in runs.items() if k[0] == n and k[1] == 16]
        if not s0 or not s16:
            continue
        g = lambda rs, key: [r["m"][key] for r in rs]
        params = re.search(r"([0-9]+) parameters", s0[0]["log"])
        cpu = [float(m.group(1)) for r in s0 + s16 for m in [re.search(r"cpu_s=([0-9.]+)", r["log"])] if m]
        ncol = lambda rs: sum(1 for r in rs if r["m"]["collapse"] is not None)
        lines.append(
            f"| {n} | {params.group(1) if params else '?'} | {mean_sd(g(s0, 'start'))} → {mean_sd(g(s0, 'final'))} "
            f"| {mean_sd(g(s16, 'start'))} → {mean_sd(g(s16, 'final'))} | {ncol(s0)}/{len(s0)} / {ncol(s16)}/{len(s16)} "
            f"| {fmt(mean(g(s0, 'pr_pop')), 1)} / {fmt(mean(g(s0, 'pr_sample')), 1)} "
            f"| {fmt(mean(g(s0, 'noise_mean')), 2)} / {fmt(mean(g(s0, 'noise_rms')), 2)} "
            f"| {fmt(mean(g(s0, 'q90')), 2)} | {fmt(mean(g(s0, 'm_q90')), 2)} "
            f"| {fmt(mean(g(s0, 'cmean')), 2)} / {fmt(mean(g(s16, 'cmean')), 2)} "
            f"| {fmt(mean(g(s0, 'lambda')), 3)} / {fmt(mean(g(s16, 'lambda')), 3)} | {fmt(mean(cpu), 0)} |")
    open(os.path.join(args.runs, "pilot.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


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
               "rskip-gacwin": "tab:gray", "lrs-gacwin": "k"}

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
            base = v[v.index("-") + 1:] if v.startswith(("rskip-", "lrs-")) else None
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
           ("the GAC variants", [("grpo", None, None), ("gac", None, None), ("gacexact", None, None),
                                 ("gacwin", None, None), ("gac005", None, None)]),
           ("gac and its controls", [("grpo", None, None), ("gac", None, "tab:green"),
                                     ("rskip-gac", "random skip, same rate", "tab:gray"),
                                     ("lrs-gac", "lr x (1 - skip rate)", "k")]),
           ("gacwin and its controls", [("grpo", None, None), ("gacwin", None, "tab:green"),
                                        ("rskip-gacwin", "random skip, same rate", "tab:gray"),
                                        ("lrs-gacwin", "lr x (1 - skip rate)", "k")])]
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
    for ax, g in zip(axes[1], GAC_VARIANTS):
        band(ax, "grpo", s_ctrl, heldout, "grpo")
        band(ax, g, s_ctrl, heldout, g, "tab:green")
        band(ax, f"rskip-{g}", s_ctrl, heldout, "random skip, same rate", "tab:gray")
        band(ax, f"lrs-{g}", s_ctrl, heldout, "lr x (1 - skip rate)", "k")
        ax.set_title(f"{g} and its controls, s = {s_ctrl}", fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    axes[1][0].set_ylabel("held-out exact match")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "results_controls.png"), dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate")
    c.add_argument("--runs", required=True)
    c.add_argument("--out", required=True)
    p = sub.add_parser("pilot")
    p.add_argument("--runs", required=True)
    r = sub.add_parser("report")
    r.add_argument("--runs", required=True)
    r.add_argument("--calibration", required=True)
    r.add_argument("--out", required=True)
    args = ap.parse_args()
    {"calibrate": calibrate, "pilot": pilot, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
