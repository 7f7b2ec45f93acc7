#!/usr/bin/env python3
"""The main job's report (scripts/demo_run.sh): one table and one figure for
the three gac_grpo runs it makes (synchronous, stale, stale + GAC decided in
gacd), and a check that gacd holds what the trainers sent.

Reads RUNS/<name>.csv and .log for the names given with --run (label=name),
the calibration file, and, with --metrics URL, gacd's /metrics text. The
metrics columns of the table (from the definitions in analyze.py) are:
final reward, held-out accuracy start -> end, collapse step, q0.9 and max of
|c_t| after step 50, the share of those steps with |c_t| <= c_low, the first
alignment alert, and GAC's project / skip counts. Writes OUT/summary.md and,
when matplotlib is present, OUT/demo.png (reward, held-out accuracy and |c_t|
against step, like the paper's Figure 1).

Exit status 1 when a run is missing or unfinished, or when --metrics is given
and gacd's step counter for a run differs from the run's step count.
"""
import argparse
import os
import re
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze  # noqa: E402  (same directory)


def steps_in_gacd(metrics_text, run):
    """Sum of gac_steps_total over the series of one run (all ranks)."""
    total, found = 0.0, False
    pattern = re.compile(r'^gac_steps_total\{([^}]*)\}\s+(\S+)', re.M)
    for labels, value in pattern.findall(metrics_text):
        if f'run="{run}"' in labels:
            total += float(value)
            found = True
    return total if found else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True, help="directory of the runs' CSV and log files")
    ap.add_argument("--run", action="append", required=True, metavar="LABEL=NAME",
                    help="a run to report (file stem NAME), shown as LABEL; in order")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--metrics", help="gacd's /metrics URL: check every run's step count there")
    ap.add_argument("--gacd-prefix", default="", help="gacd run id = prefix + NAME")
    ap.add_argument("--c-high", type=float, help="c_high the runs used (default: the calibration file's)")
    args = ap.parse_args()

    cal = dict(line.strip().split("=", 1) for line in open(args.calibration) if "=" in line)
    c_low = float(cal["c_low"])
    c_high = args.c_high if args.c_high is not None else float(cal["c_high"])
    runs, ok = [], True
    for spec in args.run:
        label, _, name = spec.rpartition("=")
        path = os.path.join(args.runs, name + ".csv")
        run = analyze.load_run(path, c_low) if os.path.exists(path) else None
        if run is None:
            print(f"demo_report: run {name} is missing or did not finish ({path})", file=sys.stderr)
            ok = False
            continue
        log = open(path[:-4] + ".log").read()
        m = re.search(r"fallbacks=(\d+)", log)
        run["fallbacks"] = int(m.group(1)) if m else None
        m = re.search(r", agent (\w+),", log)
        run["agent"] = m.group(1) if m else "?"
        runs.append((label, name, run))
    if not ok:
        return 1

    lines = [f"c_low = {c_low:g}, c_high = {c_high:g} (calibrated from the synchronous run)", "",
             "| run | steps | final reward | held-out acc (start → end) | collapse step | q0.9 \\|c_t\\| "
             "| max \\|c_t\\| | frac \\|c_t\\| ≤ c_low | first alert | agent | GAC project / skip | fallbacks |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, _, r in runs:
        # A monitor-mode agent only reports what it would do: no acted count.
        acted = "-" if r["agent"] == "monitor" else f"{r['projected']} / {r['skipped']}"
        lines.append(
            f"| {label} | {r['steps']} | {analyze.fmt(r['final_reward'])} "
            f"| {analyze.fmt(r['start_heldout'])} → {analyze.fmt(r['final_heldout'])} "
            f"| {analyze.fmt(r['collapse_step'])} | {analyze.fmt(r['q90'])} | {analyze.fmt(r['max'])} "
            f"| {analyze.fmt(r['frac_le_c_low'])} | {analyze.fmt(r['first_alert'])} "
            f"| {r['agent']} | {acted} | {analyze.fmt(r['fallbacks']) if r['agent'] == 'remote' else '-'} |")
    os.makedirs(args.out, exist_ok=True)
    open(os.path.join(args.out, "summary.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))

    if args.metrics:
        text = urllib.request.urlopen(args.metrics, timeout=10).read().decode()
        for label, name, r in runs:
            stored = steps_in_gacd(text, args.gacd_prefix + name)
            if stored != r["steps"]:
                print(f"demo_report: gacd counted {stored} steps for run {args.gacd_prefix + name}, "
                      f"the trainer made {r['steps']}", file=sys.stderr)
                ok = False
        if ok:
            print(f"gacd's /metrics counts every step of the {len(runs)} runs")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no figure (apt-get install -y python3-matplotlib)")
        return 0 if ok else 1
    colors = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for i, (label, _, r) in enumerate(runs):
        steps, reward, cos, evals = r["series"]
        color = colors[i % len(colors)]
        axes[0].plot(steps, analyze.moving_average(reward, 20), color=color, label=label)
        evals = [(0, r["start_heldout"])] + evals  # step 0: right after the supervised warm-up
        axes[1].plot([s for s, _ in evals], [a for _, a in evals], color=color, marker=".", label=label)
        axes[2].plot([s for s, _ in cos], analyze.moving_average([c for _, c in cos], 10), color=color, label=label)
    lines = [axes[2].axhline(c_low, color="k", ls="--", lw=0.8, label="c_low")]
    if c_high < 1.0:
        lines.append(axes[2].axhline(c_high, color="k", ls=":", lw=0.8, label="c_high"))
    axes[2].legend(handles=lines, fontsize=8, loc="lower right")
    for ax, title in zip(axes, ["training reward (20-step mean)", "held-out exact match",
                                "|c_t| (10-step mean)"]):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    figure = os.path.join(args.out, "demo.png")
    fig.savefig(figure, dpi=90)
    print(f"figure: {figure}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
