"""gacctl backtest on the compact recording in backtest_data/ against an
independent computation: m_t from a window written here (and checked against
the trainer's own window_mean column), the alerts' firing steps and hold
written here, the thresholds, outcomes, collapse steps and scores from the
experiment's analysis (examples/grpo/analyze.py: calibration_values,
outcome, level_alarm, score), where its definitions coincide with the
alerts'. The policy-health alerts (GacPolicyEssLow, GacPolicyClipped,
GacSamplerKlJump) on runs made here, against their rules written here, and
"not evaluated" on the recording, which has no policy column. Then the
program's errors on bad input. Standard library only.

usage: check_backtest.py GACCTL DATA_DIR ANALYZE_PY

backtest_data/ holds, of the experiment's results/grpo (scripts/experiment.sh),
the columns step, cosine, window_mean, heldout_acc of seven runs and the two
lines of their logs that are read (the warm-up's accuracy, "summary:"):
calibration/: the synchronous calibration runs (seeds 101-103); runs/:
grpo_s16_seed1 and grpo_s32_seed5 (stale, collapsed; seed 5 at the last
evaluation), grpo_s8_seed1 (stale, learned), grpo_s0_seed4 (synchronous).
"""
import csv
import glob
import importlib.util
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

WINDOW = 20
WARMUP = 50
ALIGNMENT = ("GacAlignmentSpike", "GacAlignmentElevated")
POLICY = ("GacPolicyEssLow", "GacPolicyClipped", "GacSamplerKlJump")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def close(a, b, tol=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def gacctl(binary, args):
    p = subprocess.run([binary, "backtest"] + args, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def load_analyze(path):
    spec = importlib.util.spec_from_file_location("analyze", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def window_means(cosines):
    """m_t per step: the mean of the last WINDOW cosines seen, None until WINDOW are; a step
    without a cosine keeps the previous m_t."""
    held, out = [], []
    for c in cosines:
        if c is not None:
            held.append(c)
            held = held[-WINDOW:]
        out.append(sum(held) / WINDOW if len(held) == WINDOW else None)
    return out


def first_alarm(steps, firing):
    """(first step > WARMUP firing, whether it is the first step > WARMUP, firing steps > WARMUP)."""
    eligible = [(s, f) for s, f in zip(steps, firing) if s > WARMUP]
    fired = [s for s, f in eligible if f]
    if not fired:
        return None, None, 0
    return fired[0], fired[0] == eligible[0][0], len(fired)


def held(condition, n):
    """The condition held for n further steps (Prometheus `for`, one evaluation per step)."""
    out, run = [], 0
    for c in condition:
        run = run + 1 if c else 0
        out.append(run > n)
    return out


def num(x):
    return None if x in ("", None) else float(x)


def main(binary, data, analyze_path):
    a = load_analyze(analyze_path)
    cal_dir, runs_dir = os.path.join(data, "calibration"), os.path.join(data, "runs")
    cal_runs = [a.load_run(p) for p in sorted(glob.glob(os.path.join(cal_dir, "*.csv")))]
    runs = {os.path.basename(p)[:-4]: a.load_run(p) for p in sorted(glob.glob(os.path.join(runs_dir, "*.csv")))}
    check(all(r is not None for r in cal_runs + list(runs.values())), "every recorded run is finished")

    # m_t written here against the trainer's window_mean column (6 significant digits in the CSV).
    for r in cal_runs + list(runs.values()):
        r["m_here"] = window_means(r["cosine"])
        for s, mine, theirs in zip(r["step"], r["m_here"], r["window_mean"]):
            if (mine is None) != (theirs is None) or (mine is not None and abs(mine - theirs) > 2e-6):
                failures.append(f"step {s}: m_t {mine} here, window_mean {theirs} in the CSV")
                break

    # Thresholds: the experiment's calibration (window_mean column) and the same on m_t from here.
    cal = a.calibration_values(cal_runs, [101, 102, 103])
    c_high = cal["c_high"]
    m_here = sorted(abs(m) for r in cal_runs for s, m in zip(r["step"], r["m_here"]) if s > WARMUP and m is not None)
    window_c_low = a.quantile(m_here, 0.9)
    check(abs(window_c_low - cal["window_c_low"]) < 2e-6, f"window c_low {window_c_low} vs {cal['window_c_low']}")

    for for_steps in (0, 5, 30):
        args = sorted(glob.glob(os.path.join(runs_dir, "*.csv"))) + [
            "--calibrate-on", cal_dir, "--for-steps", str(for_steps)]
        rc, out, err = gacctl(binary, args + ["--per-run", "--format", "csv"])
        check(rc == 0 and err == "", f"--per-run --for-steps {for_steps}: rc {rc}, stderr {err!r}")
        rows = list(csv.DictReader(io.StringIO(out)))
        check(len(rows) == 5 * len(runs), f"{len(rows)} per-run rows for {len(runs)} runs")
        # The recording has no policy column: those alerts are not evaluated, never quiet.
        for row in rows:
            if row["alert"] in POLICY:
                check((row["verdict"], row["first_alarm"], row["firing_steps"]) == ("not evaluated", "", ""),
                      f"{row['run']} {row['alert']}: {row}")
        rc, jout, _ = gacctl(binary, args + ["--per-run", "--format", "jsonl"])
        jrows = [json.loads(line) for line in jout.splitlines()]
        check(rc == 0 and len(jrows) == len(rows), "JSON Lines has the CSV's rows")
        by_key = {(row["run"], row["alert"]): row for row in rows}
        expected = {}
        for name, r in runs.items():
            result, col = a.outcome(r["start"], r["evals"])
            spike = [c is not None and abs(c) >= c_high for c in r["cosine"]]
            cond = [m is not None and abs(m) > window_c_low for m in r["m_here"]]
            for alert, firing in (("GacAlignmentSpike", spike), ("GacAlignmentElevated", held(cond, for_steps))):
                step, at_first, count = first_alarm(r["step"], firing)
                expected[(name, alert)] = step
                if col is not None:
                    verdict = "missed" if step is None else ("warned" if step <= col else "late")
                else:
                    verdict = "quiet" if step is None else "false alarm"
                row = by_key.get((name, alert), {})
                got = (row.get("outcome"), num(row.get("collapse_step")), num(row.get("first_alarm")),
                       row.get("at_first_eligible") or None, int(row.get("firing_steps", -1)), num(row.get("lead")),
                       row.get("verdict"), int(row.get("steps", -1)))
                want = (result, col, step, None if at_first is None else str(at_first).lower(), count,
                        col - step if verdict == "warned" else None, verdict, len(r["step"]))
                check(got == want, f"{name} {alert} --for-steps {for_steps}: gacctl {got}, here {want}")
                j = next((x for x in jrows if x["run"] == name and x["alert"] == alert), {})
                check(j.get("first_alarm") == (None if step is None else step), f"{name} {alert}: JSON first_alarm")
            # Without a hold, the elevated alert is the analysis' level rule on |m_t| (window_mean column).
            if for_steps == 0:
                m_col = [abs(x) if x is not None else None for x in r["window_mean"]]
                check(a.level_alarm(r["step"], m_col, cal["window_c_low"]) == expected[(name, "GacAlignmentElevated")],
                      f"{name}: level rule on m differs from the elevated alert without a hold")

        # The summary against the analysis' score (the level rule's first eligible step is 51).
        rc, out, err = gacctl(binary, args + ["--format", "csv"])
        check(rc == 0, f"summary: rc {rc} {err}")
        summary = {row["alert"]: row for row in csv.DictReader(io.StringIO(out))}
        for r in runs.values():
            r["m"] = {"collapse": a.outcome(r["start"], r["evals"])[1]}
        for alert in ("GacAlignmentSpike", "GacAlignmentElevated"):
            s = a.score(runs, {k: expected[(k, alert)] for k in runs}, "level")
            row = summary.get(alert, {})
            threshold = c_high if alert == "GacAlignmentSpike" else window_c_low
            check(close(float(row.get("threshold", "nan")), threshold, 1e-12), f"{alert}: threshold {row.get('threshold')}")
            for key in ("alarmed", "tp", "fp", "fn", "tn"):
                check(int(row.get(key, -1)) == s[key], f"{alert} --for-steps {for_steps}: {key} {row.get(key)} vs {s[key]}")
            check(int(row.get("at_first_eligible", -1)) == s["at_first"], f"{alert}: at_first_eligible")
            check(int(row.get("not_evaluated", -1)) == 0, f"{alert}: not_evaluated {row.get('not_evaluated')}")
            for key, want in (("precision", s["precision"]), ("recall", s["recall"]),
                              ("lead_median", a.quantile(s["leads"], 0.5)), ("lead_q25", a.quantile(s["leads"], 0.25)),
                              ("lead_q75", a.quantile(s["leads"], 0.75)),
                              ("lead_min", min(s["leads"], default=None)), ("lead_max", max(s["leads"], default=None))):
                check(close(num(row.get(key)), want), f"{alert} --for-steps {for_steps}: {key} {row.get(key)} vs {want}")
        for alert in POLICY:
            row = summary.get(alert, {})
            check((row.get("runs"), row.get("not_evaluated"), row.get("alarmed")) == ("0", str(len(runs)), "0"),
                  f"{alert} on the recording: {row}")

    # The recording holds what it was chosen for.
    outcomes = {k: a.outcome(r["start"], r["evals"]) for k, r in runs.items()}
    check(outcomes["grpo_s32_seed5"] == ("collapsed", runs["grpo_s32_seed5"]["evals"][-1][0]),
          "grpo_s32_seed5 collapses at its last evaluation")
    check(outcomes["grpo_s16_seed1"][0] == "collapsed" and outcomes["grpo_s8_seed1"][0] == "learned",
          "grpo_s16_seed1 collapsed, grpo_s8_seed1 learned")

    errors(binary, runs_dir, cal_dir)
    guard(binary)
    policy(binary)
    if failures:
        print("\n".join(failures[:50]))
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("gacctl backtest agrees with the reference")


def errors(binary, runs_dir, cal_dir):
    run = os.path.join(runs_dir, "grpo_s8_seed1.csv")
    with tempfile.TemporaryDirectory() as tmp:
        def write(name, text):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(text)
            return path

        bad_col = write("nocos.csv", "step,heldout_acc\n1,\n")
        bad_num = write("badnum.csv", "step,cosine,heldout_acc\n1,,\n2,0.5,\n3,zero,\n")
        unfinished = write("unfinished.csv", "step,cosine,heldout_acc\n1,,0.5\n")
        write("unfinished.log", "start: held-out accuracy 0.5\n")
        cases = [
            ([run], 2, "give --c-high and --window-c-low, or --calibrate-on"),
            ([run, "--c-high", "0.9"], 2, "give --c-high and --window-c-low"),
            ([run, "--c-high", "0.9", "--window-c-low", "0.3", "--calibrate-on", cal_dir], 2, "not both"),
            ([run, "--c-high", "1.5", "--window-c-low", "0.3"], 2, "c_high 1.5 is outside (0, 1]"),
            ([run, "--calibrate-on", run], 2, "both calibrated on and tested"),
            ([os.path.join(tmp, "absent.csv"), "--c-high", "0.9", "--window-c-low", "0.3"], 2,
             "absent.csv: no such file"),
            ([tmp + "/absent-dir", "--calibrate-on", cal_dir], 2, "no such file"),
            ([run, "--c-high", "0.9", "--window-c-low", "0.3", "--for-steps", "-1"], 2, "--for-steps"),
            ([bad_col, "--c-high", "0.9", "--window-c-low", "0.3"], 1, "nocos.csv: no column 'cosine' for the alerts"),
            ([bad_num, "--c-high", "0.9", "--window-c-low", "0.3"], 1, "badnum.csv:4: column cosine: 'zero' is not a number"),
            ([run, "--calibrate-on", bad_num], 1, "badnum.csv:4"),
        ]
        for args, want_rc, has in cases:
            rc, out, err = gacctl(binary, args)
            check(rc == want_rc and out == "" and has in err and err.count("\n") == 1,
                  f"{args}: rc {rc} (want {want_rc}), stdout {out!r}, stderr {err!r} (want {has!r})")
        # An unfinished run is left out with a note, and the rest is backtested.
        rc, out, err = gacctl(binary, [run, unfinished, "--c-high", "0.9", "--window-c-low", "0.3", "--per-run",
                                       "--format", "csv"])
        check(rc == 0 and "unfinished.csv left out" in err and "unfinished" not in out and "grpo_s8_seed1" in out,
              f"unfinished run: rc {rc}, stderr {err!r}")


def guard_reference(norms, losses, injected, window, sigma, warmup, max_norm):
    """The spike guard's rule, written here: z against the last `window`
    held values (sample standard deviation), from `warmup` held; a step let
    through is held as it is, a spike at min(x, mean + sigma sd)."""
    held_n, held_l, spikes, caught = [], [], [], 0

    def score(x, held):
        """(z, bound) or None while warming up; bound None when sd is 0."""
        last = held[-window:]
        if len(last) < max(warmup, 2):
            return None
        mean, sd = statistics.fmean(last), statistics.stdev(last)
        if sd > 0:
            return (x - mean) / sd, mean + sigma * sd
        return (0.0 if x == mean else math.inf), None

    def entry(x, sc, spike):
        if not spike:
            return x
        if sc is None:
            return None
        return x if sc[1] is None else min(x, sc[1])

    for i, (n, l) in enumerate(zip(norms, losses)):
        sn, sl = score(n, held_n), (score(l, held_l) if l is not None else None)
        spike = (max_norm > 0 and n > max_norm) or (sn is not None and sn[0] > sigma) or \
                (sl is not None and sl[0] > sigma)
        if spike:
            spikes.append(i + 1)
            caught += injected[i]
        for held, x, sc in ((held_n, n, sn), (held_l, l, sl)):
            e = entry(x, sc, spike) if x is not None else None
            if e is not None:
                held.append(e)
    return spikes, caught


def guard(binary):
    """--spike-*: the guard replayed on grad_norm, loss and injected columns
    of runs made here, against guard_reference."""
    import random
    rng = random.Random(5)
    with tempfile.TemporaryDirectory() as tmp:
        expected = {}
        for run in range(3):
            norms, losses, injected = [], [], []
            for step in range(1, 301):
                inj = step > 40 and rng.random() < 0.03
                norms.append(rng.gauss(10, 1) * (1e3 if inj else 1))
                losses.append(None if step % 7 == 0 else rng.gauss(-0.5, 0.05) + (50 if step == 150 + run else 0))
                injected.append(1 if inj else 0)
            name = f"run{run}"
            # Every other run has no cosine column: the guard reads grad_norm and loss alone.
            cosine = "cosine," if run % 2 == 0 else ""
            with open(os.path.join(tmp, name + ".csv"), "w") as f:
                f.write(f"step,{cosine}heldout_acc,grad_norm,loss,injected\n")
                for i in range(300):
                    loss = "" if losses[i] is None else repr(losses[i])
                    f.write(f"{i + 1},{',' if cosine else ''},{norms[i]!r},{loss},{injected[i]}\n")
            expected[name] = (norms, losses, injected)
        for flags, (window, sigma, warmup, max_norm) in (
                (["--spike-sigma", "6"], (128, 6.0, 64, 0.0)),
                (["--spike-window", "32", "--spike-sigma", "4", "--spike-warmup", "8"], (32, 4.0, 8, 0.0)),
                (["--max-grad-norm", "100"], (None, None, None, 100.0))):
            rc, out, err = gacctl(binary, [tmp] + flags + ["--format", "csv"])
            check(rc == 0, f"guard {flags}: rc {rc} {err}")
            rows = {row["run"]: row for row in csv.DictReader(io.StringIO(out))}
            total_spikes = total_caught = total_injected = 0
            for name, (norms, losses, injected) in expected.items():
                if window is None:  # the bound alone
                    spikes = [i + 1 for i, n in enumerate(norms) if n > max_norm]
                    caught = sum(injected[i - 1] for i in spikes)
                else:
                    spikes, caught = guard_reference(norms, losses, injected, window, sigma, warmup, max_norm)
                row = rows.get(name, {})
                listed = [int(x) for x in row.get("spike_steps", "").split() if x != "..."]
                check(listed == spikes[:20], f"guard {flags} {name}: spike steps {listed} vs {spikes[:20]}")
                check((int(row.get("spikes", -1)), int(row.get("caught", -1)), int(row.get("injected", -1))) ==
                      (len(spikes), caught, sum(injected)), f"guard {flags} {name}: counts {row}")
                total_spikes += len(spikes)
                total_caught += caught
                total_injected += sum(injected)
            allrow = rows.get("all", {})
            check((int(allrow.get("spikes", -1)), int(allrow.get("caught", -1)), int(allrow.get("missed", -1)),
                   int(allrow.get("false_spikes", -1))) ==
                  (total_spikes, total_caught, total_injected - total_caught, total_spikes - total_caught),
                  f"guard {flags}: the all row {allrow}")
            check(total_injected > 10, "the runs made here have injected steps")
        nonorm = os.path.join(tmp, "nonorm.csv")
        with open(nonorm, "w") as f:
            f.write("step,cosine,heldout_acc\n1,,\n")
        for args, want_rc, has in (
                ([nonorm, "--spike-sigma", "6"], 1, "nonorm.csv: no column 'grad_norm' for the spike guard"),
                ([tmp, "--spike-sigma", "0"], 2, "spike_sigma must be finite and > 0"),
                ([tmp, "--spike-sigma", "6", "--c-high", "0.9"], 2, "--c-high is the alerts' setting"),
                ([tmp, "--spike-window", "1"], 2, "--spike-window")):
            rc, out, err = gacctl(binary, args)
            check(rc == want_rc and out == "" and has in err, f"guard {args}: rc {rc}, stderr {err!r} (want {has!r})")


def policy_reference(steps, columns, for_steps):
    """{alert: firing per step} of the policy-health alerts, written from their rules: each column read as
    gacd's gauge shows it (an empty cell keeps the last value), the early median of the first 20 values
    (statistics.median: the mean of the two middle ones), held for_steps further steps."""
    def gauge(values):
        last, early, out = None, [], []
        for v in values:
            if v is not None:
                last = v
                if len(early) < 20:
                    early.append(v)
            out.append((last, statistics.median(early) if len(early) == 20 else None))
        return out

    n = len(steps)
    ess = gauge(columns.get("ess_token", [None] * n))
    low = gauge(columns.get("clip_fraction_low", [None] * n))
    high = gauge(columns.get("clip_fraction_high", [None] * n))
    kl = gauge(columns.get("kl_k3", [None] * n))
    cond = {
        "GacPolicyEssLow": [v is not None and m is not None and v < 0.5 * m for v, m in ess],
        "GacPolicyClipped": [(lo is not None or hi is not None) and (lo or 0.0) + (hi or 0.0) > 0.2
                             for (lo, _), (hi, _) in zip(low, high)],
        "GacSamplerKlJump": [v is not None and m is not None and v > 4 * m and v > 0.001 for v, m in kl],
    }
    return {alert: held(c, for_steps) for alert, c in cond.items()}


def policy_runs(tmp):
    """Runs of 150 steps written to tmp: their steps, policy columns and evaluations, by name. Noisy
    values with planted stretches (an ESS drop, clipping, a KL jump), empty cells; one run without the
    columns and one whose clip columns are empty."""
    import random
    rng = random.Random(11)
    runs = {}
    for k in range(6):
        n = 150
        cols = {"ess_token": [], "clip_fraction_low": [], "clip_fraction_high": [], "kl_k3": []}
        for step in range(1, n + 1):
            drop = 60 + 10 * k <= step < 75 + 10 * k
            cols["ess_token"].append(rng.uniform(0.7, 0.95) * (0.45 if drop and k % 2 == 0 else 1.0))
            cols["clip_fraction_low"].append(rng.uniform(0.0, 0.12) + (0.1 if drop and k != 3 else 0.0))
            cols["clip_fraction_high"].append(rng.uniform(0.0, 0.1))
            cols["kl_k3"].append(rng.uniform(2e-4, 6e-4) * (8.0 if step >= 100 + 5 * k and k % 3 != 2 else 1.0))
        for values in cols.values():
            for i in range(n):
                if rng.random() < 0.05:
                    values[i] = None
        if k == 4:
            cols["clip_fraction_low"] = [None] * n  # a loss that clips nothing
            cols["clip_fraction_high"] = [None] * n
        if k == 5:
            cols = {}  # a CSV from before the columns
        evals = [(s, 0.6 if s <= 100 or k % 2 == 1 else 0.2) for s in range(20, n + 1, 20)]
        name = f"policy{k}"
        with open(os.path.join(tmp, name + ".csv"), "w") as f:
            f.write(",".join(["step", "cosine", "heldout_acc"] + list(cols)) + "\n")
            for i in range(n):
                acc = dict(evals).get(i + 1)
                cells = [str(i + 1), "", "" if acc is None else repr(acc)]
                cells += ["" if v[i] is None else repr(v[i]) for v in cols.values()]
                f.write(",".join(cells) + "\n")
        with open(os.path.join(tmp, name + ".log"), "w") as f:
            f.write("start: held-out accuracy 0.5\nsummary: done\n")
        runs[name] = (list(range(1, n + 1)), cols, evals)
    return runs


def policy(binary):
    """The policy-health alerts on runs made here against policy_reference and the scoring rule."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = policy_runs(tmp)
        fired = set()
        for for_steps in (0, 3):
            args = [tmp, "--c-high", "0.9", "--window-c-low", "0.3", "--for-steps", str(for_steps)]
            rc, out, err = gacctl(binary, args + ["--per-run", "--format", "csv"])
            check(rc == 0 and err == "", f"policy --for-steps {for_steps}: rc {rc} {err}")
            rows = {(r["run"], r["alert"]): r for r in csv.DictReader(io.StringIO(out))}
            counts = {a: {"runs": 0, "not_evaluated": 0, "tp": 0, "fp": 0, "fn": 0, "tn": 0} for a in POLICY}
            for name, (steps, cols, evals) in runs.items():
                col = collapse_step(0.5, evals)
                firing = policy_reference(steps, cols, for_steps)
                present = {a: any(v is not None for c in inputs for v in cols.get(c, []))
                           for a, inputs in (("GacPolicyEssLow", ["ess_token"]), ("GacSamplerKlJump", ["kl_k3"]),
                                             ("GacPolicyClipped", ["clip_fraction_low", "clip_fraction_high"]))}
                for alert in POLICY:
                    row = rows.get((name, alert), {})
                    if not present[alert]:
                        counts[alert]["not_evaluated"] += 1
                        check(row.get("verdict") == "not evaluated" and row.get("firing_steps") == "",
                              f"{name} {alert}: {row}")
                        continue
                    step, _, count = first_alarm(steps, firing[alert])
                    if col is not None:
                        verdict = "missed" if step is None else ("warned" if step <= col else "late")
                    else:
                        verdict = "quiet" if step is None else "false alarm"
                    key = {"warned": "tp", "late": "fn", "missed": "fn", "false alarm": "fp", "quiet": "tn"}[verdict]
                    counts[alert]["runs"] += 1
                    counts[alert][key] += 1
                    if step is not None:
                        fired.add(alert)
                    got = (num(row.get("first_alarm")), int(row.get("firing_steps") or -1), row.get("verdict"))
                    check(got == (step, count, verdict), f"{name} {alert} --for-steps {for_steps}: "
                                                         f"gacctl {got}, here {(step, count, verdict)}")
            rc, out, _ = gacctl(binary, args + ["--format", "csv"])
            summary = {r["alert"]: r for r in csv.DictReader(io.StringIO(out))}
            for alert in POLICY:
                got = {k: int(summary.get(alert, {}).get(k, -1)) for k in counts[alert]}
                check(got == counts[alert], f"{alert} summary --for-steps {for_steps}: {got} vs {counts[alert]}")
            rc, out, _ = gacctl(binary, args)
            check("GacPolicyClipped:" in out and "not evaluated in 2 of 6 runs" in out and
                  "not evaluated in 1 of 6 runs" in out, f"policy heading: {out[:1500]}")
        check(fired == set(POLICY), f"every policy alert fired on the runs made here: {fired}")


def collapse_step(start, evals):
    """The experiment's collapse rule (examples/grpo/analyze.py), for the runs made here."""
    accs = [a for _, a in evals]
    peak = start
    for i, (step, acc) in enumerate(evals):
        peak = max(peak, acc)
        if acc < 0.7 * peak and all(x < 0.7 * peak for x in accs[i + 1:]):
            return step
    return None


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
