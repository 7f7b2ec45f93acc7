#!/usr/bin/env python3
"""The spike guard's experiment (scripts/experiment.sh spikes): its recall
and precision on injected gradient spikes, its false skips on runs without
any, the held-out accuracy with and without it against the same runs without
injection, and OLMo-core's skip-step rule on the same seeds, both inside the
trainer and replayed by the class itself.

Runs: RUNS/<arm>_clip<1|none>_s<s>_seed<n>.csv (gac_grpo --csv; columns step,
heldout_acc, loss, grad_norm, regime, stepped, injected) with their .log.
Arms: clean (no injection, no guard), cleanguard (gac's guard, no
injection), inj (spikes injected, no guard), injguard (both), cleanolmo and
injolmo (OLMo-core's rule in the trainer, gac_grpo --olmo-skip-sigma 6,
instead of gac's guard).

- skips: steps the run's rule skipped (regime "spike" for gac's guard,
  stepped == 0 for OLMo-core's rule; GAC's thresholds are out of reach);
  recall = injected steps skipped / injected steps; precision = those /
  every step skipped (inj* runs); false skips = skips in clean* runs (no
  step was injected there).
- The endpoint: the mean held-out accuracy of the last 5 evaluations
  (analyze.py's primary endpoint); differences from the clean run of the
  same seed, clipping and staleness, with a paired 95 % t-interval.
- OLMo-core's class (`ai2-olmo-core`, olmo_core.optim.SkipStepOptimizer,
  when importable), fed each step's loss and grad_norm as its train module
  does (latest_loss, latest_grad_norm; rolling_interval_length 128,
  sigma_factor 6) and asked step_skipped, on every guarded run's own steps:
  on the *guard runs a replay (its recall and false skips on the same
  steps); on the *olmo runs a check that the trainer's copy of the rule
  (examples/grpo/olmo_skip.h) skipped exactly the steps the class would.
  Its history keeps every step as it was, skipped ones included; gac's
  guard holds a spike at the bound it broke (mean + 6 sd).
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

ARMS = ["clean", "cleanguard", "inj", "injguard", "cleanolmo", "injolmo"]
NAME = re.compile(r"^(clean|cleanguard|inj|injguard|cleanolmo|injolmo)_clip(1|none)_s(\d+)_seed(\d+)\.csv$")


def load(path, finished_only=True):
    """One finished run: its steps' (loss, grad_norm, regime, injected) and the endpoint; None if unfinished
    (with finished_only False, the steps an unfinished run recorded, and its endpoint)."""
    log = path[:-4] + ".log"
    if finished_only and (not os.path.exists(log) or "summary:" not in open(log).read()):
        return None
    _, rows = analyze.read_csv(path)
    evals = [(int(r["step"]), float(r["heldout_acc"])) for r in rows if r["heldout_acc"] != ""]
    steps = [(int(r["step"]), float(r["loss"]), float(r["grad_norm"]),
              "skipped" if r.get("stepped") == "0" and r["regime"] != "spike" else r["regime"], r["injected"] == "1")
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


ROW_KEYS = ["arm", "clip", "staleness", "seed", "injected", "skips", "caught", "olmo_replay_skips",
            "olmo_replay_caught", "olmo_replay_same", "endpoint"]


def collect(runs_dir):
    """The per-run rows (ROW_KEYS) of the finished runs in runs_dir; the OLMo-core class's columns when it is
    importable (olmo_replay_same: on an *olmo run, 1 when the class skips exactly the steps the trainer did)."""
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
        rule = "skipped" if arm.endswith("olmo") else "spike"
        skipped = {step for step, _, _, regime, _ in r["steps"] if regime == rule}
        n_inj, caught, called = detection(r["steps"], skipped)
        row = {"arm": arm, "clip": clip, "staleness": s, "seed": seed, "injected": n_inj, "skips": called,
               "caught": caught, "olmo_replay_skips": None, "olmo_replay_caught": None, "olmo_replay_same": None,
               "endpoint": r["endpoint"]}
        if olmo_available and arm not in ("clean", "inj"):
            replay = olmo_verdicts(r["steps"])
            _, row["olmo_replay_caught"], row["olmo_replay_skips"] = detection(r["steps"], replay)
            if arm.endswith("olmo"):
                row["olmo_replay_same"] = int(replay == skipped)
        rows.append(row)
    return rows


def write_rows(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_KEYS)
        w.writeheader()
        for row in rows:
            w.writerow({k: analyze.csv_cell(row[k]) for k in ROW_KEYS})


def read_rows(path):
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out = {"arm": row["arm"], "clip": row["clip"], "endpoint": analyze.fnum(row["endpoint"])}
            for k in ("staleness", "seed", "injected", "skips", "caught", "olmo_replay_skips", "olmo_replay_caught",
                      "olmo_replay_same"):
                out[k] = int(row[k]) if row[k] != "" else None
            rows.append(out)
    return rows


def render(rows):
    """The tables (markdown) from the per-run rows. The replay's columns are filled where the rows have them."""
    settings = sorted({(r["clip"], r["staleness"]) for r in rows}, key=lambda k: (k[0] != "1", k[1]))
    seeds = sorted({r["seed"] for r in rows})
    replayed = any(r["olmo_replay_skips"] is not None for r in rows)
    by = {(r["arm"], r["clip"], r["staleness"], r["seed"]): r for r in rows}
    out = [f"Seeds {', '.join(map(str, seeds))}; injected: each step after 50 with probability 0.01, gradient x 1e3; "
           "gac's guard: z-score of |g| and of the loss, 128 steps, 6 sigma, from 64 held; OLMo-core's rule: "
           "the same numbers, its history keeping every step as it was.", ""]
    out += ["### Detection", "",
            "| clipping | s | injected | gac's guard: caught (recall) | skips (precision) | false skips, clean runs "
            "| OLMo-core's rule in the trainer: caught (recall) | skips (precision) | false skips, clean runs "
            "| OLMo-core's class replayed on the guard runs: caught (recall) | skips (precision) "
            "| false skips, clean runs |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    pick = lambda arm, clip, s: [by[k] for k in by if k[0] == arm and k[1] == clip and k[2] == s]
    for clip, s in settings:
        n = sum(r["injected"] for r in pick("injguard", clip, s))
        cells = [("1 (default)" if clip == "1" else "none"), str(s), str(n)]
        for inj, cln, caught_key, skips_key in (("injguard", "cleanguard", "caught", "skips"),
                                                ("injolmo", "cleanolmo", "caught", "skips"),
                                                ("injguard", "cleanguard", "olmo_replay_caught", "olmo_replay_skips")):
            ri, rc = pick(inj, clip, s), pick(cln, clip, s)
            if not ri or (skips_key.startswith("olmo") and not replayed):
                cells += ["–", "–", "–"] if ri or not skips_key.startswith("olmo") else \
                         ["not run: olmo_core not importable"] * 3
                continue
            caught = sum(r[caught_key] or 0 for r in ri)
            called = sum(r[skips_key] or 0 for r in ri)
            n_inj = sum(r["injected"] for r in ri)
            cells += [ratio(caught, n_inj), precision(caught, called),
                      f"{sum(r[skips_key] or 0 for r in rc)} in {len(rc)} runs"]
        out.append("| " + " | ".join(cells) + " |")
    checked = [r for r in rows if r["olmo_replay_same"] is not None]
    if checked:
        out += ["", f"OLMo-core's class, replayed on the runs that used the trainer's copy of its rule, skips exactly "
                    f"the steps the trainer skipped in {sum(r['olmo_replay_same'] for r in checked)} of "
                    f"{len(checked)} runs."]
    out += ["", "### Held-out accuracy (mean of the last 5 evaluations)", "",
            "| clipping | s | clean: mean | inj − clean | injguard − clean | injolmo − clean | cleanguard − clean "
            "| cleanolmo − clean |",
            "|---|---|---|---|---|---|---|---|"]
    for clip, s in settings:
        clean = {seed: by[("clean", clip, s, seed)]["endpoint"] for seed in seeds if ("clean", clip, s, seed) in by}
        cells = [("1 (default)" if clip == "1" else "none"), str(s),
                 f"{statistics.mean(clean.values()):.3f}" if clean else "–"]
        for arm in ("inj", "injguard", "injolmo", "cleanguard", "cleanolmo"):
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
