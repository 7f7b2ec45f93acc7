#!/usr/bin/env bash
# The async GRPO experiment of docs/RESULTS.md:
#   1. calibration: synchronous GRPO (s = 0, seed 1, agent in monitor mode);
#      gac::SuggestThresholds turns its |c_t| after step 50 into (c_low, c_high);
#   2. the grid s in {0, 8, 16, 32} x {grpo, m2po, bapo, gac, gacmax} x seeds,
#      with the calibrated thresholds for every run (gac = GRPO loss + agent
#      in local mode; gacmax = the same with c_high = the synchronous run's max
#      |c_t|, a second threshold rule; the others run the agent in monitor mode);
#   3. examples/grpo/analyze.py: results.csv (one row per run), summary.csv
#      (per setting, mean and spread over seeds), summary.md and the plots.
#
# Environment: OUT (default results/grpo), BUILD (build-grpo), STEPS (400),
# SEEDS ("1 2 3"), STALENESS ("0 8 16 32"), VARIANTS ("grpo m2po bapo gac"),
# JOBS (2 parallel runs), EXTRA (more trainer flags for every run), PYTHON (python3).
# Needs: build-grpo/examples/grpo/gac_grpo (see docs/RESULTS.md), python3 with
# matplotlib for the plots (apt-get install -y python3-matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/grpo}
BUILD=${BUILD:-build-grpo}
STEPS=${STEPS:-400}
SEEDS=${SEEDS:-"1 2 3"}
STALENESS=${STALENESS:-"0 8 16 32"}
VARIANTS=${VARIANTS:-"grpo m2po bapo gac gacmax"}
JOBS=${JOBS:-2}
EXTRA=${EXTRA:-}
BIN="$BUILD/examples/grpo/gac_grpo"
# The configuration chosen in the pilot (docs/RESULTS.md); the same for every run.
COMMON="--steps $STEPS --sft-steps 600 --lr 1e-3 --prompts 32 --group 8 --hidden 128 --every 100 $EXTRA"

[ -x "$BIN" ] || { echo "missing $BIN; build it first" >&2; exit 1; }
mkdir -p "$OUT/runs"

echo "== calibration: synchronous GRPO, seed 1"
"$BIN" $COMMON --staleness 0 --loss grpo --agent monitor --seed 1 \
  --calibrate-out "$OUT/calibration.txt" --csv "$OUT/runs/grpo_s0_seed1.csv" > "$OUT/runs/grpo_s0_seed1.log"
C_LOW=$(sed -n 's/^c_low=//p' "$OUT/calibration.txt")
C_HIGH=$(sed -n 's/^c_high=//p' "$OUT/calibration.txt")
C_MAX=$(sed -n 's/^max=//p' "$OUT/calibration.txt")
echo "calibrated: c_low $C_LOW, c_high $C_HIGH (gacmax: c_high = the synchronous max $C_MAX)"

jobs_file="$OUT/jobs.txt"
: > "$jobs_file"
for s in $STALENESS; do
  for v in $VARIANTS; do
    for seed in $SEEDS; do
      name="${v}_s${s}_seed${seed}"
      [ "$name" = grpo_s0_seed1 ] && continue  # the calibration run, same flags
      high=$C_HIGH
      case $v in
        gac) flags="--loss grpo --agent local" ;;
        gacmax) flags="--loss grpo --agent local"; high=$C_MAX ;;
        *) flags="--loss $v --agent monitor" ;;
      esac
      echo "$BIN $COMMON --staleness $s $flags --seed $seed --c-low $C_LOW --c-high $high --csv $OUT/runs/$name.csv > $OUT/runs/$name.log" >> "$jobs_file"
    done
  done
done
echo "== grid: $(wc -l < "$jobs_file") runs, $JOBS at a time"
start=$(date +%s)
xargs -P "$JOBS" -I{} -d '\n' sh -c '{}' < "$jobs_file"
echo "grid done in $(( $(date +%s) - start )) s"

"${PYTHON:-python3}" examples/grpo/analyze.py --runs "$OUT/runs" --calibration "$OUT/calibration.txt" --out "$OUT"
