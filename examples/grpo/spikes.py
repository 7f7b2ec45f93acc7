#!/usr/bin/env python3
"""The spike guard's experiment (scripts/experiment.sh spikes): its recall
and precision on injected gradient spikes, its false skips on runs without
any, the held-out accuracy with and without it against the same runs without
injection, and OLMo-core's SkipStepOptimizer judging the same steps.

Runs: RUNS/<arm>_clip<1|none>_s<s>_seed<n>.csv (gac_grpo --csv; columns step,
heldout_acc, loss, grad_norm, regime, injected) with their .log. Arms: clean
(no injection, no guard), cleanguard (the guard, no injection), inj (spikes
injected, no guard), injguard (both).

- recall = injected steps the guard called spikes / injected steps;
  precision = those / every step it called a spike (injguard runs);
  false skips = spikes in cleanguard runs (no step was injected there).
- The endpoint: the mean held-out accuracy of the last 5 evaluations
  (analyze.py's primary endpoint); differences from the clean run of the
  same seed, clipping and staleness, with a paired 95 % t-interval.
- OLMo-core (`ai2-olmo-core`, olmo_core.optim.SkipStepOptimizer, when
  importable): the class itself, fed each step's loss and grad_norm as its
  train module does (latest_loss, latest_grad_norm; rolling_interval_length
  128, sigma_factor 6) and asked step_skipped, on the injguard and cleanguard
  runs' own steps. Its history keeps every step, skipped ones included, and
  it needs both a loss and a norm; gac's guard holds a spike at the bound it
  broke (mean + 6 sd), not as it was.
  It is replayed on the recorded steps, not run inside the trainer: its
  recall and false skips are measured, its effect on accuracy is not.
  To make it importable without its own torch pin (torch < 2.14):
      python -m pip install --target DIR cached-path dataclass-extensions rich bettermap \\
          safetensors importlib_resources pyyaml
      python -m pip install --target DIR --no-deps ai2-olmo-core==3.0.0
      PYTHONPATH=DIR .venv/bin/python examples/grpo/spikes.py --runs ... --out ...

Writes OUT/spikes.md (the tables) and OUT/spikes.csv (one row per run).

    .venv/bin/python examples/grpo/spikes.py --runs results/grpo/spikes/runs --out results/grpo/spikes
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze  # noqa: E402  (the endpoint and the t-interval)

ARMS = ["clean", "cleanguard", "inj", "injguard"]
NAME = re.compile(r"^(clean|cleanguard|inj|injguard)_clip(1|none)_s(\d+)_seed(\d+)\.csv$")


def load(path):
    """One finished run: its steps' (loss, grad_norm, regime, injected) and the endpoint; None if unfinished."""
    log = path[:-4] + ".log"
    if not os.path.exists(log) or "summary:" not in open(log).read():
        return None
    _, rows = analyze.read_csv(path)
    evals = [(int(r["step"]), float(r["heldout_acc"])) for r in rows if r["heldout_acc"] != ""]
    steps = [(int(r["step"]), float(r["loss"]), float(r["grad_norm"]), r["regime"], r["injected"] == "1")
             for r in rows]
    return {"steps": steps, "endpoint": analyze.last_evals_mean(evals)}


def olmo_verdicts(steps):
    """OLMo-core's SkipStepOptimizer on the steps: the steps it would skip, or None without olmo_core."""
    try:
        import torch
        from olmo_core.optim.skip_step_optimizer import SkipStepOptimizer
    except ImportError:
        return None
    p = torch.nn.Parameter(torch.zeros(1))
    opt = SkipStepOptimizer([p], {}, rolling_interval_length=128, sigma_factor=6)
    skipped = set()
    for step, loss, norm, _, _ in steps:
        opt.latest_loss = torch.tensor(loss, dtype=torch.float64)
        opt.latest_grad_norm = torch.tensor(norm, dtype=torch.float64)
        if float(opt.step_skipped) > 0.5:
            skipped.add(step)
    return skipped


def detection(steps, called):
    injected = {s for s, _, _, _, inj in steps if inj}
    caught = len(injected & called)
    return len(injected), caught, len(called)


def ratio(part, whole):
    """"caught (recall)"."""
    return f"{part} ({part / whole:.2f})" if whole else f"{part} (–)"


def precision(caught, called):
    """"called (precision)"."""
    return f"{called} ({caught / called:.2f})" if called else "0 (–)"


def interval(xs):
    m, lo, hi = analyze.paired_ci(xs)
    if m is None:
        return "–"
    if lo is None:
        return f"{m:+.3f}"
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]"


ROW_KEYS = ["arm", "clip", "staleness", "seed", "injected", "guard_spikes", "guard_caught", "olmo_skips",
            "olmo_caught", "endpoint"]


def collect(runs_dir):
    """The per-run rows (ROW_KEYS) of the finished runs in runs_dir; the OLMo-core columns when importable."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(runs_dir, "*.csv"))):
        m = NAME.match(os.path.basename(path))
        if not m:
            continue
        r = load(path)
        if r is None:
            print(f"spikes.py: {path} unfinished, left out", file=sys.stderr)
            continue
        runs[(m.group(1), m.group(2), int(m.group(3)), int(m.group(4)))] = r
    olmo_available = olmo_verdicts([]) is not None
    rows = []
    for (arm, clip, s, seed), r in sorted(runs.items()):
        guard = {step for step, _, _, regime, _ in r["steps"] if regime == "spike"}
        n_inj, caught, called = detection(r["steps"], guard)
        row = {"arm": arm, "clip": clip, "staleness": s, "seed": seed, "injected": n_inj, "guard_spikes": called,
               "guard_caught": caught, "olmo_skips": None, "olmo_caught": None, "endpoint": r["endpoint"]}
        if olmo_available and arm in ("injguard", "cleanguard"):
            _, row["olmo_caught"], row["olmo_skips"] = detection(r["steps"], olmo_verdicts(r["steps"]))
        rows.append(row)
    return rows


def write_rows(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_KEYS)
        w.writeheader()
        for row in rows:
            w.writerow({k: "" if row[k] is None else f"{row[k]:.6g}" if isinstance(row[k], float) else row[k]
                        for k in ROW_KEYS})


def read_rows(path):
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out = {"arm": row["arm"], "clip": row["clip"], "endpoint": analyze.fnum(row["endpoint"])}
            for k in ("staleness", "seed", "injected", "guard_spikes", "guard_caught", "olmo_skips", "olmo_caught"):
                out[k] = int(row[k]) if row[k] != "" else None
            rows.append(out)
    return rows


def render(rows):
    """The tables (markdown) from the per-run rows. OLMo-core's columns are filled where the rows have them."""
    settings = sorted({(r["clip"], r["staleness"]) for r in rows}, key=lambda k: (k[0] != "1", k[1]))
    seeds = sorted({r["seed"] for r in rows})
    olmo_available = any(r["olmo_skips"] is not None for r in rows)
    by = {(r["arm"], r["clip"], r["staleness"], r["seed"]): r for r in rows}
    out = [f"Seeds {', '.join(map(str, seeds))}; injected: each step after 50 with probability 0.01, gradient x 1e3; "
           "the guard: z-score of |g| and of the loss, 128 steps, 6 sigma, from 64 held.", ""]
    out += ["### Detection", "",
            "| clipping | s | injected | guard: caught (recall) | guard: spikes (precision) | guard: false skips, "
            "clean runs | OLMo-core: caught (recall) | OLMo-core: skips (precision) | OLMo-core: false skips, clean runs |",
            "|---|---|---|---|---|---|---|---|---|"]
    for clip, s in settings:
        inj = [by[k] for k in by if k[0] == "injguard" and k[1] == clip and k[2] == s]
        cln = [by[k] for k in by if k[0] == "cleanguard" and k[1] == clip and k[2] == s]
        n = sum(r["injected"] for r in inj)
        caught = sum(r["guard_caught"] for r in inj)
        called = sum(r["guard_spikes"] for r in inj)
        false_clean = sum(r["guard_spikes"] for r in cln)

        cells = [("1 (default)" if clip == "1" else "none"), str(s), str(n), ratio(caught, n),
                 precision(caught, called), f"{false_clean} in {len(cln)} runs"]
        if olmo_available:
            ocaught = sum(r["olmo_caught"] or 0 for r in inj)
            ocalled = sum(r["olmo_skips"] or 0 for r in inj)
            ofalse = sum(r["olmo_skips"] or 0 for r in cln)
            cells += [ratio(ocaught, n), precision(ocaught, ocalled), f"{ofalse} in {len(cln)} runs"]
        else:
            cells += ["not run: olmo_core not importable"] * 3
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "### Held-out accuracy (mean of the last 5 evaluations)", "",
            "| clipping | s | clean: mean | inj − clean | injguard − clean | cleanguard − clean |",
            "|---|---|---|---|---|---|"]
    for clip, s in settings:
        clean = {seed: by[("clean", clip, s, seed)]["endpoint"] for seed in seeds if ("clean", clip, s, seed) in by}
        cells = [("1 (default)" if clip == "1" else "none"), str(s),
                 f"{statistics.mean(clean.values()):.3f}" if clean else "–"]
        for arm in ("inj", "injguard", "cleanguard"):
            diffs = [by[(arm, clip, s, seed)]["endpoint"] - clean[seed] for seed in clean
                     if (arm, clip, s, seed) in by and by[(arm, clip, s, seed)]["endpoint"] is not None]
            cells.append(interval(diffs))
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Differences are paired by seed (95 % t-interval over the seeds)."]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = collect(args.runs)
    if not rows:
        sys.exit(f"spikes.py: no finished run in {args.runs}")
    write_rows(rows, os.path.join(args.out, "spikes.csv"))
    text = render(rows)
    with open(os.path.join(args.out, "spikes.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
