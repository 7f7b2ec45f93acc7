#!/usr/bin/env python3
"""Render the key panels of dashboards/gac.json from real Prometheus data.

Starts gacd (--insecure, loopback, in-memory store) and Prometheus scraping it
every second, streams a synthetic run with an alignment spike through gacd
(gac_synthetic_run, built from tests/dashboards/), reads the panels' own
PromQL expressions from dashboards/gac.json, evaluates them with query_range
over the run, and draws them with matplotlib into one PNG:

  - c_t with the c_low / c_high bands,
  - steps by regime (rate, stacked),
  - reward.

usage (from the repository root, after building gacd and gac_synthetic_run):
  cmake --build build --target gacd gac_synthetic_run
  .venv/bin/python dashboards/render_panels.py --build-dir build --out docs/img/gac-key-panels.png

Needs Debian's prometheus and matplotlib (in .venv, scripts/setup.sh). Takes about 80 seconds
(the run is streamed in real time so that rates and scrapes are real).
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PANELS = [
    "c_t with the c_low / c_high bands",
    "Steps by regime",
    "Reward",
]
REGIME_COLORS = {"safe": "#73bf69", "project": "#fade2a", "skip": "#f2495c", "invalid": "#b877d9"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, what, proc=None, log=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            sys.exit(f"render_panels: {what} exited:\n{open(log).read() if log else ''}")
        time.sleep(0.1)
    sys.exit(f"render_panels: {what} not ready after {timeout} s")


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def query_range(port, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        sys.exit(f"render_panels: query failed: {expr}: {body}")
    return body["data"]["result"]


def panel_targets(dashboard, title):
    for p in dashboard["panels"]:
        if p.get("title") == title:
            return p["targets"]
    sys.exit(f"render_panels: no panel '{title}' in dashboards/gac.json")


def substitute(expr, values):
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def legend(fmt, metric):
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build", help="CMake build directory (default: build)")
    ap.add_argument("--out", default="docs/img/gac-key-panels.png", help="PNG to write")
    ap.add_argument("--steps", type=int, default=600, help="steps of the synthetic run (default 600)")
    ap.add_argument("--rate", type=float, default=10, help="steps per second (default 10)")
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    args = ap.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("render_panels: matplotlib is missing: bash scripts/setup.sh "
                 "(and run this script with the checkout's .venv/bin/python)")

    build = os.path.abspath(args.build_dir)
    gacd_bin = f"{build}/server/gacd"
    synth_bin = f"{build}/tests/dashboards/gac_synthetic_run"
    for path in (gacd_bin, synth_bin, args.prometheus):
        if not os.access(path, os.X_OK):
            sys.exit(f"render_panels: {path} not found; build it "
                     f"(cmake --build {args.build_dir} --target gacd gac_synthetic_run) or install prometheus")
    with open(f"{REPO}/dashboards/gac.json") as f:
        dashboard = json.load(f)

    tmp = tempfile.mkdtemp(prefix="gac-render-")
    procs = []
    try:
        # gacd on OS-chosen loopback ports.
        ready = f"{tmp}/ready"
        gacd_log = f"{tmp}/gacd.log"
        gacd = subprocess.Popen([gacd_bin, "--insecure", "--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
                                 "--store=memory", "--per-layer-metrics", f"--ready-file={ready}"],
                                stdout=open(gacd_log, "w"), stderr=subprocess.STDOUT)
        procs.append(gacd)
        wait_for(lambda: os.path.exists(ready) and "http=" in open(ready).read(), 30, "gacd", gacd, gacd_log)
        addrs = dict(line.split("=", 1) for line in open(ready).read().split())

        # Prometheus scraping it every second.
        with open(f"{tmp}/prometheus.yml", "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: gacd\n    static_configs:\n"
                    f"      - targets: ['{addrs['http']}']\n")
        port = free_port()
        prom_log = f"{tmp}/prometheus.log"
        prom = subprocess.Popen([args.prometheus, f"--config.file={tmp}/prometheus.yml",
                                 f"--storage.tsdb.path={tmp}/tsdb", f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=open(prom_log, "w"), stderr=subprocess.STDOUT)
        procs.append(prom)
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/-/ready"), 30, "prometheus", prom, prom_log)

        # The synthetic run: quiet, then alignment ramps up through the
        # projection band into skips, holds, and GAC brings it back.
        run = "grpo-demo"
        spike_start = args.steps // 3
        start = time.time()
        subprocess.run([synth_bin, f"--target={addrs['grpc']}", f"--run={run}", f"--steps={args.steps}",
                        f"--rate={args.rate}", "--world=2", "--seed=3", f"--spike-start={spike_start}",
                        f"--spike-ramp={args.steps // 12}", f"--spike-hold={args.steps // 6}"], check=True)
        time.sleep(3)
        end = time.time()

        values = {"job": "gacd", "run": run, "rank": "0", "__rate_interval": "5s"}
        data = {}
        for title in PANELS:
            data[title] = []
            for t in panel_targets(dashboard, title):
                expr = substitute(t["expr"], values)
                for series in query_range(port, expr, start, end, 1):
                    xs = [float(v[0]) - start for v in series["values"]]
                    ys = [float(v[1]) for v in series["values"]]
                    data[title].append((t["refId"], legend(t.get("legendFormat", ""), series["metric"]),
                                        series["metric"], xs, ys))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------- drawing
    bg, panel_bg, fg, grid = "#111217", "#181b1f", "#ccccdc", "#2c3235"
    plt.rcParams.update({"figure.facecolor": bg, "axes.facecolor": panel_bg, "axes.edgecolor": grid,
                         "axes.labelcolor": fg, "text.color": fg, "xtick.color": fg, "ytick.color": fg,
                         "grid.color": grid, "font.size": 9, "legend.facecolor": panel_bg,
                         "legend.edgecolor": grid})
    fig, axes = plt.subplots(3, 1, figsize=(12, 9.5), sharex=True,
                             gridspec_kw={"height_ratios": [1.5, 1, 1]})

    # c_t with the bands.
    ax = axes[0]
    c_low = c_high = None
    for ref, name, metric, xs, ys in data[PANELS[0]]:
        if ref == "A":
            ax.plot(xs, ys, color="#5794f2", lw=1.4, label=name)
        elif ref == "B":
            ax.plot(xs, ys, color="#8ab8ff", lw=1.0, ls=":", label=name)
        elif ref == "C":
            c_high = ys[-1]
            ax.plot(xs, ys, color="#f2495c", lw=1, ls="--", label=name)
        elif ref == "D":
            ax.plot(xs, ys, color="#f2495c", lw=1, ls="--", label=name)
        elif ref == "E":
            c_low = ys[-1]
            ax.plot(xs, ys, color="#ff9830", lw=1, ls="--", label=name)
        elif ref == "F":
            ax.plot(xs, ys, color="#ff9830", lw=1, ls="--", label=name)
    if c_low is not None and c_high is not None:
        ax.axhspan(-c_low, c_low, color="#73bf69", alpha=0.10, lw=0)
        for sign in (1, -1):
            ax.axhspan(sign * c_low, sign * c_high, color="#fade2a", alpha=0.07, lw=0)
            ax.axhspan(sign * c_high, sign * 1.0, color="#f2495c", alpha=0.07, lw=0)
        ax.text(1.0, c_low / 2, " safe", transform=ax.get_yaxis_transform(), va="center", fontsize=8,
                color="#73bf69")
        ax.text(1.0, (c_low + c_high) / 2, " project", transform=ax.get_yaxis_transform(), va="center",
                fontsize=8, color="#fade2a")
        ax.text(1.0, (c_high + 0.7) / 2, " skip", transform=ax.get_yaxis_transform(), va="center", fontsize=8,
                color="#f2495c")
    ax.set_ylim(-0.45, 0.7)
    ax.set_title(PANELS[0], loc="left", color=fg, fontsize=10)
    ax.legend(loc="lower left", ncol=3, fontsize=8)
    ax.grid(True, lw=0.5)

    # Steps by regime, stacked.
    ax = axes[1]
    series = sorted(data[PANELS[1]], key=lambda s: list(REGIME_COLORS).index(s[2].get("regime", "invalid")))
    if series:
        xs = series[0][3]
        stacks = []
        for _, name, metric, sx, sy in series:
            by_x = dict(zip(sx, sy))
            stacks.append([by_x.get(x, 0.0) for x in xs])
        ax.stackplot(xs, stacks, labels=[s[1] for s in series],
                     colors=[REGIME_COLORS.get(s[2].get("regime"), "#888") for s in series], alpha=0.8)
    ax.set_ylabel("steps/s")
    ax.set_title(PANELS[1], loc="left", color=fg, fontsize=10)
    ax.legend(loc="upper left", ncol=4, fontsize=8)
    ax.grid(True, lw=0.5)

    # Reward.
    ax = axes[2]
    for _, name, metric, xs, ys in data[PANELS[2]]:
        ax.plot(xs, ys, color="#73bf69", lw=1.2, label=name)
    ax.set_title(PANELS[2], loc="left", color=fg, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, lw=0.5)
    ax.set_xlabel("seconds since the start of the run")

    fig.suptitle(f"gac — run {values['run']}, rank {values['rank']}: {args.steps} steps at {args.rate:g} steps/s, "
                 "alignment spike from step " + str(spike_start), color=fg, fontsize=11, x=0.01, ha="left")
    fig.text(0.01, 0.005, "Rendered by dashboards/render_panels.py: the panels' PromQL of dashboards/gac.json, "
             "query_range on Prometheus 1 s scrapes of gacd, fed by gac_synthetic_run.", fontsize=7.5, color="#8e8e8e")
    fig.tight_layout(rect=(0, 0.015, 0.97, 0.97))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"render_panels: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
