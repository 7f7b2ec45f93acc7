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
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/grpo}
PYTHON=${PYTHON:-.venv/bin/python}
DATA=examples/grpo/data
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
pack() { XZ_OPT=-9e tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$stage/$1" -cJf "$DATA/$1.tar.xz" .; }
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
