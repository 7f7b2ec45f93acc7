#!/usr/bin/env python3
"""The main job's report (scripts/demo_run.sh): one table and one figure for
the gac_grpo runs it makes, and a check that gacd holds what the trainers sent.

Reads RUNS/<name>.csv and .log for the names given with --run (label=name),
the calibration file (the synchronous run's: c_low, window_c_low...), and,
with --metrics URL, gacd's /metrics text. The table's columns (definitions in
analyze.py): final training reward (last 20 steps), held-out accuracy start
-> peak -> end, collapse step, the mean of c_t and q0.9 |c_t| after step 50,
q0.9 |m_t| (the signed 20-step mean), the noise floor's rms, the first step
> 50 where |m_t| exceeds the window c_low (the alarm), the agent's mode and
what GAC did (steps projected / skipped), gacd fallbacks. Writes
OUT/summary.md and, when matplotlib is present, OUT/demo.png (held-out
accuracy, c_t with its noise floor, and training reward against step).

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
    ap.add_argument("--remote", action="append", default=[], metavar="NAME",
                    help="a run that streamed to gacd (checked against /metrics)")
    args = ap.parse_args()

    cal = dict(line.strip().split("=", 1) for line in open(args.calibration) if "=" in line)
    window_c_low = float(cal["window_c_low"])
    runs, ok = [], True
    for spec in args.run:
        label, _, name = spec.rpartition("=")
        path = os.path.join(args.runs, name + ".csv")
        run = analyze.load_run(path) if os.path.exists(path) else None
        if run is None:
            print(f"demo_report: run {name} is missing or did not finish ({path})", file=sys.stderr)
            ok = False
            continue
        log = run["log"]
        m = re.search(r"fallbacks=(\d+)", log)
        run["fallbacks"] = int(m.group(1)) if m else None
        m = re.search(r", agent (\w+), trigger (\w+)", log)
        run["agent"] = m.group(1) if m else "?"
        run["trigger"] = m.group(2) if m else "?"
        run["alarm"] = analyze.level_alarm(run["step"], analyze.series_stats(run)["m"], window_c_low)
        run["m"] = analyze.metrics(run)
        runs.append((label, name, run))
    if not ok:
        return 1

    source = f"the calibration run (seed {cal['seeds']})" if "seeds" in cal else "the synchronous run"
    lines = [f"thresholds from {source}: c_low = {float(cal['c_low']):.4g}, c_high = "
             f"{float(cal['c_high']):.4g}; windowed (20-step mean): c_low = {window_c_low:.4g}, "
             f"c_high = {float(cal['window_c_high']):.4g}", "",
             "| run | steps | final reward | held-out start → peak → end | collapse step | mean c_t "
             "| q0.9 \\|c_t\\| | q0.9 \\|m_t\\| | noise floor rms | alarm (\\|m_t\\| > c_low) | agent "
             "| GAC project / skip | fallbacks |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, name, r in runs:
        m = r["m"]
        skipped = sum(1 for s in r["stepped"] if not s)
        projected = sum(1 for g in r["regime"] if g == "project")
        # A monitor-mode agent only reports what it would do: no acted count.
        acted = "-" if r["agent"] == "monitor" else f"{projected} / {skipped}"
        if r["agent"] == "monitor" and skipped:
            acted = f"control skips: {skipped}"
        agent = r["agent"] + (" (window)" if r["trigger"] == "window" else "")
        lines.append(
            f"| {label} | {m['steps']} | {analyze.fmt(m['reward'])} "
            f"| {analyze.fmt(m['start'])} → {analyze.fmt(m['peak'])} → {analyze.fmt(m['final'])} "
            f"| {analyze.fmt(m['collapse'])} | {analyze.fmt(m['cmean'], 2)} | {analyze.fmt(m['q90'], 2)} "
            f"| {analyze.fmt(m['m_q90'], 2)} | {analyze.fmt(m['noise_rms'], 2)} | {analyze.fmt(r['alarm'])} "
            f"| {agent} | {acted} | {analyze.fmt(r['fallbacks']) if r['agent'] == 'remote' else '-'} |")
    os.makedirs(args.out, exist_ok=True)
    open(os.path.join(args.out, "summary.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))

    if args.metrics:
        text = urllib.request.urlopen(args.metrics, timeout=10).read().decode()
        for label, name, r in runs:
            stored = steps_in_gacd(text, args.gacd_prefix + name)
            if stored != r["m"]["steps"]:
                print(f"demo_report: gacd counted {stored} steps for run {args.gacd_prefix + name}, "
                      f"the trainer made {r['m']['steps']}", file=sys.stderr)
                ok = False
        if ok:
            print(f"gacd's /metrics counts every step of the {len(runs)} runs")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no figure (run it with .venv/bin/python: scripts/setup.sh installs matplotlib there)")
        return 0 if ok else 1
    colors = ["tab:blue", "tab:red", "tab:green", "tab:gray", "k", "tab:purple", "tab:orange"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for i, (label, _, r) in enumerate(runs):
        color = colors[i % len(colors)]
        evals = [(0, r["start"])] + r["evals"]  # step 0: right after the supervised warm-up
        axes[0].plot([s for s, _ in evals], [a for _, a in evals], color=color, marker=".", label=label)
        for name, style in [("cosine", "-"), ("noise_cos", ":")]:
            pts = [(s, v) for s, v in zip(r["step"], analyze.moving(r[name], 20)) if v is not None]
            axes[1].plot([s for s, _ in pts], [v for _, v in pts], color=color, ls=style, lw=1.2)
        pts = [(s, v) for s, v in zip(r["step"], analyze.moving(r["reward"], 20)) if v is not None]
        axes[2].plot([s for s, _ in pts], [v for _, v in pts], color=color)
    axes[1].axhline(window_c_low, color="k", ls="--", lw=0.8)
    axes[1].axhline(0, color="k", lw=0.4)
    for ax, title in zip(axes, ["held-out exact match",
                                "c_t (solid) and noise floor (dotted), 20-step means; dashed: window c_low",
                                "training reward (20-step mean)"]):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    figure = os.path.join(args.out, "demo.png")
    fig.savefig(figure, dpi=90)
    print(f"figure: {figure}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
