#!/usr/bin/env python3
"""Summarises the gac_grpo experiment grid (scripts/experiment.sh).

Reads RUNS/<variant>_s<staleness>_seed<seed>.csv (+ .log) and the calibration
file; writes OUT/results.csv (one row per run), OUT/summary.csv and
OUT/summary.md (per setting, over seeds) and, when matplotlib is available,
OUT/results_reward.png, OUT/results_ct.png and OUT/results_heldout.png.

Definitions (docs/RESULTS.md):
  final reward      mean training reward over the last 20 steps
  held-out acc      greedy exact match on the 1,000 held-out problems, last step
  collapse step     first evaluation step (every 25) from which held-out
                    accuracy stays below half of its value right after the
                    supervised warm-up until the end of the run (no recovery)
  reward drop step  first step t >= 20 where the (full) 20-step moving average of the
                    reward is 0.05 or more below its running maximum
  |c_t| statistics  over steps > 50 (as the paper's Table 3): q0.9, max, and
                    the fraction of steps with |c_t| <= c_low (calibrated)
  first alert       first step > 50 where the 10-step moving average of |c_t|
                    exceeds c_low (calibrated)
  lead to drop      reward drop step - first alert, when the alert comes first
  lead to collapse  collapse step - first alert, when the alert comes first
"""
import argparse
import csv
import glob
import math
import os
import re
import statistics


def moving_average(xs, n):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= n:
            acc -= xs[i - n]
        out.append(acc / min(i + 1, n))
    return out


def quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def load_run(path, c_low):
    rows = [r for r in csv.DictReader(open(path)) if r.get("bapo_hi") not in (None, "")]
    log = open(path[:-4] + ".log").read() if os.path.exists(path[:-4] + ".log") else ""
    if "summary:" not in log:
        return None  # unfinished run
    m = re.search(r"supervised warm-up: .* held-out accuracy ([0-9.]+)", log)
    start_acc = float(m.group(1)) if m else float("nan")
    steps = [int(r["step"]) for r in rows]
    reward = [float(r["reward"]) for r in rows]
    cos = [(int(r["step"]), abs(float(r["cosine"]))) for r in rows if r["cosine"]]
    evals = [(int(r["step"]), float(r["heldout_acc"])) for r in rows if r["heldout_acc"]]
    after = [c for s, c in cos if s > 50]
    collapse = next((s for i, (s, _) in enumerate(evals)
                     if all(a < 0.5 * start_acc for _, a in evals[i:])), None)
    ma = moving_average(reward, 20)
    peak, drop = -1.0, None
    for i, v in enumerate(ma):
        if i < 19:
            continue  # full windows only
        peak = max(peak, v)
        if v <= peak - 0.05:
            drop = steps[i]
            break
    cma = moving_average([c for _, c in cos], 10)
    alert = next((s for (s, _), v in zip(cos, cma) if s > 50 and v > c_low), None)
    lead = drop - alert if (drop is not None and alert is not None and alert <= drop) else None
    lead_collapse = (collapse - alert if (collapse is not None and alert is not None and alert <= collapse)
                     else None)
    regimes = {}
    for r in rows:
        regimes[r["regime"]] = regimes.get(r["regime"], 0) + 1
    return {
        "final_reward": statistics.mean(reward[-20:]),
        "start_heldout": start_acc,
        "final_heldout": evals[-1][1] if evals else float("nan"),
        "peak_heldout": max(a for _, a in evals) if evals else float("nan"),
        "collapse_step": collapse,
        "reward_drop_step": drop,
        "q90": quantile(after, 0.9),
        "max": max(after) if after else float("nan"),
        "frac_le_c_low": sum(c <= c_low for c in after) / len(after) if after else float("nan"),
        "first_alert": alert,
        "lead_time": lead,
        "lead_to_collapse": lead_collapse,
        "skipped": sum(1 for r in rows if r["stepped"] == "0"),
        "projected": regimes.get("project", 0),
        "steps": len(rows),
        "series": (steps, reward, cos, evals),
    }


def fmt(x, digits=3):
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def mean_sd(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cal = dict(line.strip().split("=", 1) for line in open(args.calibration) if "=" in line)
    c_low, c_high = float(cal["c_low"]), float(cal["c_high"])

    runs = {}
    for path in sorted(glob.glob(os.path.join(args.runs, "*_s*_seed*.csv"))):
        m = re.match(r"(\w+?)_s(\d+)_seed(\d+)\.csv", os.path.basename(path))
        run = load_run(path, c_low) if m else None
        if run is not None:
            runs[(m.group(1), int(m.group(2)), int(m.group(3)))] = run
    keys = ["final_reward", "start_heldout", "final_heldout", "peak_heldout", "collapse_step", "reward_drop_step",
            "q90", "max", "frac_le_c_low", "first_alert", "lead_time", "lead_to_collapse", "skipped", "projected", "steps"]
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "staleness", "seed"] + keys)
        for (v, s, seed), r in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            w.writerow([v, s, seed] + [fmt(r[k], 4) if isinstance(r[k], float) else ("" if r[k] is None else r[k])
                                       for k in keys])

    known = ["grpo", "m2po", "bapo", "gac", "gacmax"]
    variants = [v for v in known if any(k[0] == v for k in runs)]
    variants += sorted({k[0] for k in runs} - set(known))
    stale = sorted({k[1] for k in runs})
    lines = [f"c_low = {c_low:g}, c_high = {c_high:g} (calibrated once, synchronous GRPO seed 1)", "",
             "| s | variant | seeds | final reward | held-out acc (start → end) | collapsed | collapse step "
             "| q0.9 \\|c\\| | max \\|c\\| | frac \\|c\\| ≤ c_low | first alert | reward drop | lead to drop | lead to collapse | GAC project / skip |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary_rows = []
    for s in stale:
        for v in variants:
            rs = [r for (vv, ss, _), r in runs.items() if vv == v and ss == s]
            if not rs:
                continue
            coll = [r["collapse_step"] for r in rs if r["collapse_step"] is not None]
            drops = [r["reward_drop_step"] for r in rs if r["reward_drop_step"] is not None]
            leads = [r["lead_time"] for r in rs if r["lead_time"] is not None]
            leads_c = [r["lead_to_collapse"] for r in rs if r["lead_to_collapse"] is not None]
            alerts = [r["first_alert"] for r in rs if r["first_alert"] is not None]
            row = {
                "staleness": s, "variant": v, "seeds": len(rs),
                "final_reward": mean_sd([r["final_reward"] for r in rs]),
                "start_heldout": mean_sd([r["start_heldout"] for r in rs]),
                "final_heldout": mean_sd([r["final_heldout"] for r in rs]),
                "collapsed": f"{len(coll)}/{len(rs)}",
                "collapse_step": "-" if not coll else "/".join(str(c) for c in sorted(coll)),
                "q90": mean_sd([r["q90"] for r in rs]), "max": mean_sd([r["max"] for r in rs]),
                "frac_le_c_low": mean_sd([r["frac_le_c_low"] for r in rs]),
                "first_alert": "-" if not alerts else "/".join(str(a) for a in sorted(alerts)),
                "reward_drop": f"{len(drops)}/{len(rs)}" + ("" if not drops else " (" + "/".join(str(d) for d in sorted(drops)) + ")"),
                "lead_time": "-" if not leads else "/".join(str(x) for x in sorted(leads)),
                "lead_to_collapse": "-" if not leads_c else "/".join(str(x) for x in sorted(leads_c)),
                "gac": "-" if not v.startswith("gac") else f"{statistics.mean(r['projected'] for r in rs):.0f} / {statistics.mean(r['skipped'] for r in rs):.0f}",
            }
            summary_rows.append(row)
            lines.append(f"| {s} | {v} | {row['seeds']} | {row['final_reward']} | {row['start_heldout']} → {row['final_heldout']} "
                         f"| {row['collapsed']} | {row['collapse_step']} | {row['q90']} | {row['max']} | {row['frac_le_c_low']} "
                         f"| {row['first_alert']} | {row['reward_drop']} | {row['lead_time']} | {row['lead_to_collapse']} | {row['gac']} |")
    with open(os.path.join(args.out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary_rows[0].keys()))
        w.writeheader()
        w.writerows(summary_rows)
    open(os.path.join(args.out, "summary.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        print("matplotlib not available: no plots (apt-get install -y python3-matplotlib)")
        return
    palette = {"grpo": "tab:red", "m2po": "tab:orange", "bapo": "tab:purple", "gac": "tab:green", "gacmax": "tab:blue"}
    colors = {v: palette.get(v, "tab:gray") for v in variants}

    def panel_plot(name, ylabel, series_of, hline=None):
        fig, axes = plt.subplots(1, len(stale), figsize=(4 * len(stale), 3.2), sharey=True, squeeze=False)
        for ax, s in zip(axes[0], stale):
            for v in variants:
                for i, ((vv, ss, seed), r) in enumerate(sorted(runs.items())):
                    if vv != v or ss != s:
                        continue
                    x, y = series_of(r)
                    first = not any(l.get_label() == v for l in ax.get_lines())
                    ax.plot(x, y, color=colors[v], alpha=0.75, lw=1, label=v if first else "_")
            if hline is not None:
                ax.axhline(hline, color="k", ls="--", lw=0.8, label="c_low")
            ax.set_title(f"s = {s}")
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel(ylabel)
        # Every variant, also those absent from the first panel (gacmax at s = 0).
        handles = [Line2D([], [], color=colors[v], label=v) for v in variants]
        if hline is not None:
            handles.append(Line2D([], [], color="k", ls="--", lw=0.8, label="c_low"))
        axes[0][0].legend(handles=handles, fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, name), dpi=90)
        plt.close(fig)

    panel_plot("results_reward.png", "training reward (20-step mean)",
               lambda r: (r["series"][0], moving_average(r["series"][1], 20)))
    panel_plot("results_ct.png", "|c_t| (10-step mean)",
               lambda r: ([s for s, _ in r["series"][2]], moving_average([c for _, c in r["series"][2]], 10)),
               hline=c_low)
    panel_plot("results_heldout.png", "held-out exact match",
               lambda r: ([s for s, _ in r["series"][3]], [a for _, a in r["series"][3]]))


if __name__ == "__main__":
    main()
