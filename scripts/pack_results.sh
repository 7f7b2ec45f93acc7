#!/usr/bin/env bash
# Packs the data behind docs/RESULTS.md's rebuilt tables into
# examples/grpo/data (committed): the replication's, the exploratory grid's,
# the size sweep's, the spike guard's and the configuration pilot's per-step
# CSVs and logs (replication.tar.xz, grid.tar.xz, sizes.tar.xz, spikes.tar.xz,
# pilot.tar.xz: xz, sorted, timestamps and owners zeroed, so the same runs give
# the same bytes) and their per-run rows (replication-runs.csv, grid-runs.csv,
# sizes-runs.csv, spikes-runs.csv, pilot-runs.csv), then rebuilds the tables
# into docs/RESULTS.md (analyze.py tables --write). The calibration runs and
# calibration.txt, which the replication and the grid share
# ($OUT/calibration-runs), are stored once, in replication.tar.xz; grid.tar.xz
# holds the grid's runs ($OUT/runs), its skip masks and its job lists;
# pilot.tar.xz the pilot's runs ($OUT/pilot, as runs/) and its job list
# ($OUT/pilot-jobs.txt, as jobs.txt: the order of the table's rows).
#   OUT      the experiment's output folder (results/grpo)
#   PYTHON   .venv/bin/python; for OLMo-core's columns of spikes-runs.csv,
#            olmo_core importable (PYTHONPATH; examples/grpo/spikes.py)
#   BUILD    the build folder (build), whose cli/gacctl replays the spike guard (second, part D)
#
# `scripts/pack_results.sh second [a] [b] [c] [d]` instead packs the second
# registered experiment ($OUT/second, scripts/experiment.sh second; the parts
# named, all four by default): one archive per part,
# exp2-a.tar.xz ... exp2-d.tar.xz, each holding the part's folder (runs, job
# lists, calibration.txt, masks, P_s and L_s, the jump table) with the per-step
# CSVs cut to the columns its tables read (docs/RESULTS.md, "Data"), and the
# per-run rows exp2-a-runs.csv ... exp2-d-runs.csv its analysis writes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/grpo}
PYTHON=${PYTHON:-.venv/bin/python}
DATA=examples/grpo/data
pack() { XZ_OPT=-9e tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$stage/$1" -cJf "$DATA/$1.tar.xz" .; }

if [ "${1:-}" = second ]; then
  shift
  [ $# -gt 0 ] || set -- a b c d
  POLICY="ess_token ess_sequence clip_fraction_low clip_fraction_high truncation_fraction log_ratio_max log_ratio_p99 \
log_ratio_p1 kl_k3 log_ratio_abs_mean entropy_mean staleness_min staleness_mean staleness_max"
  A_COLUMNS="step heldout_acc cosine window_mean regime stepped lag_updates drift sampler_kl grad_norm $POLICY"
  declare -A COLUMNS=([a]="$A_COLUMNS" [b]="$A_COLUMNS staleness" [c]="step heldout_acc cosine noise_cos pr_pop grad_norm"
                      [d]="step heldout_acc loss grad_norm regime stepped injected inject_factor")
  declare -A TOOL=([a]=exp2_losses [b]=exp2_jumps [c]=exp2_scale [d]=exp2_guard)
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$DATA"
  for part in "$@"; do
    [ -n "${TOOL[$part]:-}" ] || { echo "pack_results: no part '$part' (a, b, c, d)" >&2; exit 1; }
    [ -d "$OUT/second/$part" ] || { echo "pack_results: missing $OUT/second/$part (scripts/experiment.sh second $part)" >&2; exit 1; }
    mkdir -p "$stage/exp2-$part"
    "$PYTHON" - "$OUT/second/$part" "$stage/exp2-$part" ${COLUMNS[$part]} <<'PY'
import csv, os, shutil, sys
src, dst, keep = sys.argv[1], sys.argv[2], sys.argv[3:]
for root, _, files in os.walk(src):
    for name in files:
        path, out = os.path.join(root, name), os.path.join(dst, os.path.relpath(root, src), name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if name.endswith((".log", ".txt")):  # logs, job lists, calibration.txt, masks, P_s and L_s, jumps.txt
            shutil.copyfile(path, out)
        elif name.endswith(".csv") and "_seed" in name:  # a run's per-step CSV: the columns the tables read
            with open(path, newline="") as f, open(out, "w", newline="") as g:
                rows = csv.DictReader(f)
                missing = [c for c in keep if c not in rows.fieldnames]
                if missing:
                    sys.exit(f"pack_results: {path} lacks the columns {missing}")
                w = csv.writer(g)
                w.writerow(keep)
                w.writerows([row[c] for c in keep] for row in rows)
PY
    # The calibration runs, whole (their thresholds are checked against calibration.txt), with part A.
    [ "$part" = a ] && cp -r "$OUT/second/calibration-runs" "$stage/exp2-a/calibration-runs"
    pack "exp2-$part"
    # Part D: OLMo-core's class where experiment.sh installed it, and the backtest's columns (gacctl).
    extra=(); [ "$part" = d ] && extra=(--gacctl "${BUILD:-build}/cli/gacctl")
    PYTHONPATH="$OUT/second/olmo-target${PYTHONPATH:+:$PYTHONPATH}" \
      "$PYTHON" "examples/grpo/${TOOL[$part]}.py" --root "$stage/exp2-$part" --out "$stage/out-$part" "${extra[@]}" > /dev/null
    cp "$stage/out-$part"/exp2-$part-*.csv "$DATA/"  # the per-run rows (and part A's facts: P_s, L_s, thresholds)
  done
  du -ch "$DATA"/exp2-* | tail -1 | sed 's/^/pack_results: /'
  "$PYTHON" examples/grpo/analyze.py tables --write docs/RESULTS.md
  exit 0
fi

for need in "$OUT/replication/runs" "$OUT/calibration-runs" "$OUT/calibration.txt" "$OUT/runs" "$OUT/masks" \
            "$OUT/jobs2.txt" "$OUT/sizes/runs" "$OUT/spikes/runs" "$OUT/pilot" "$OUT/pilot-jobs.txt"; do
  [ -e "$need" ] || { echo "pack_results: missing $need (scripts/experiment.sh replicate, the grid, sizes, spikes, pilot)" >&2; exit 1; }
done
mkdir -p "$DATA"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/replication" "$stage/grid" "$stage/sizes" "$stage/spikes" "$stage/pilot/runs"
cp -r "$OUT/replication/runs" "$OUT/replication/masks" "$OUT/calibration-runs" "$OUT/calibration.txt" \
  "$OUT"/replication/jobs[12].txt "$stage/replication/"
cp -r "$OUT/runs" "$OUT/masks" "$OUT"/jobs[0-4].txt "$stage/grid/"
cp -r "$OUT/sizes/runs" "$OUT/sizes/jobs.txt" "$stage/sizes/"
cp -r "$OUT/spikes/runs" "$OUT/spikes/jobs.txt" "$stage/spikes/"
cp "$OUT"/pilot/*_s*_seed*.csv "$OUT"/pilot/*_s*_seed*.log "$stage/pilot/runs/"  # the runs alone
cp "$OUT/pilot-jobs.txt" "$stage/pilot/jobs.txt"
find "$stage" -name '*.todo' -delete
pack replication
pack grid
pack sizes
pack spikes
pack pilot
"$PYTHON" examples/grpo/analyze.py replicate --runs "$OUT/replication/runs" --out "$stage/rep" > /dev/null
cp "$stage/rep/replication-runs.csv" "$DATA/replication-runs.csv"
"$PYTHON" examples/grpo/analyze.py report --runs "$OUT/runs" --calibration "$OUT/calibration.txt" --out "$stage/gr" \
  --no-plots > /dev/null
cp "$stage/gr/grid-runs.csv" "$DATA/grid-runs.csv"
"$PYTHON" examples/grpo/analyze.py sizes --runs "$OUT/sizes/runs" --out "$stage/sz" > /dev/null
cp "$stage/sz/sizes-runs.csv" "$DATA/sizes-runs.csv"
"$PYTHON" examples/grpo/spikes.py --runs "$OUT/spikes/runs" --out "$stage/spikes" > /dev/null
cp "$stage/spikes/spikes.csv" "$DATA/spikes-runs.csv"
"$PYTHON" examples/grpo/analyze.py pilot --runs "$OUT/pilot" --jobs "$OUT/pilot-jobs.txt" --out "$stage/pi" > /dev/null
cp "$stage/pi/pilot-runs.csv" "$DATA/pilot-runs.csv"
du -ch "$DATA"/* | tail -1 | sed 's/^/pack_results: /'
"$PYTHON" examples/grpo/analyze.py tables --write docs/RESULTS.md
