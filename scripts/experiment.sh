#!/usr/bin/env bash
# The async GRPO experiment of docs/RESULTS.md (outside CI; about 40 minutes
# on 2 idle cores for the default grid, ~550 runs of 5-9 CPU s):
#   1. synchronous GRPO (s = 0, agent in monitor mode) for every seed; their
#      pooled c_t after step 50 fix the thresholds once, by a rule written
#      before any stale run (analyze.py calibrate): c_low = q0.9 |c_t| and
#      c_high = min(3 x max |c_t|, 0.95), and the same of |m_t| (the signed
#      mean of c_t over 20 steps) for the windowed trigger; the calibration
#      seeds are left out of the report; an existing $OUT/calibration.txt is
#      kept, so adding seeds later does not move the thresholds;
#   2. the grid: s in $STALENESS x {grpo, m2po, bapo, is (unclipped
#      importance sampling), gac (paper alpha), gacexact (exact alpha),
#      gacwin (the windowed trigger), gac005 (the paper's own thresholds
#      0.05 / 0.3), gacproj and gacwinproj (gac and gacwin with c_high = 1:
#      projection only, never a skip)} x seeds; the losses are identical at
#      s = 0, so only the GAC variants run there besides grpo. Every run gets
#      the calibrated thresholds (monitor-mode runs report what GAC would do);
#   3. controls, per GAC variant, staleness and seed, with that run's
#      measured skip rate p: rskip-<v> (GRPO skipping each update with
#      probability p) and lrs-<v> (GRPO with lr x (1 - p));
#   4. the beta ablation at s = $BETA_S: gac with beta in $BETAS (gacb<beta>);
#   5. examples/grpo/analyze.py report: results.csv (one row per run),
#      summary.md (tables), detectors.csv, comparisons.csv and the plots;
#      its rules (collapse, outcomes, alarm rules, paired intervals) are in
#      analyze.py's docstring.
# Runs whose log already ends with a summary line are not run again.
#
# `scripts/experiment.sh pilot` instead runs the measurements that chose the
# configuration (docs/RESULTS.md, "Choosing the setting"): candidate tasks and
# policies x s in {0, 16} x seeds 1 2 (GRPO, monitor mode), into
# $OUT/pilot, and prints their table (analyze.py pilot).
#
# Environment: OUT (results/grpo), BUILD (build), STEPS (400), SEEDS
# ("1 2 3 4 5"), STALENESS ("0 4 8 16 32"), VARIANTS (every variant of step
# 2: "grpo m2po bapo is gac gacexact gacwin gac005 gacproj gacwinproj"),
# CONTROLS (the GAC variants that get the two controls of step 3; all by
# default), JOBS (2 parallel runs), BETAS ("0.5 2"; "" skips step 4), BETA_S (16),
# EXTRA (more flags for every run), PILOT_ONLY (the pilot's candidates to run,
# by name; all by default), PYTHON (the checkout's .venv/bin/python, which has
# matplotlib).
#
# The full grid of docs/RESULTS.md: scripts/experiment.sh (defaults; about
# 550 runs of 5-7 CPU s each). The grid that was run there (271 runs):
#   SEEDS="1 2 3 4 5" STALENESS="0 4 8 16 32" VARIANTS="grpo m2po bapo is gac gacexact gacwin gac005" \
#   CONTROLS="gac gacwin" BETAS="0.5 2" scripts/experiment.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/grpo}
BUILD=${BUILD:-build}
STEPS=${STEPS:-400}
SEEDS=${SEEDS:-"1 2 3 4 5"}
STALENESS=${STALENESS:-"0 4 8 16 32"}
VARIANTS=${VARIANTS:-"grpo m2po bapo is gac gacexact gacwin gac005 gacproj gacwinproj"}
PILOT_ONLY=${PILOT_ONLY:-}
CONTROLS=${CONTROLS:-"gac gacexact gacwin gac005 gacproj gacwinproj"}
JOBS=${JOBS:-2}
BETAS=${BETAS-"0.5 2"}
BETA_S=${BETA_S:-16}
EXTRA=${EXTRA:-}
PYTHON=${PYTHON:-.venv/bin/python}
BIN="$BUILD/examples/grpo/gac_grpo"
LR=3e-4
# The configuration chosen in the pilot (docs/RESULTS.md), the same for every run.
COMMON="--steps $STEPS --sft-steps 600 --lr $LR --prompts 64 --group 8 --width 128 --eval-every 20 \
--window 20 --pr-every 25 --mech-every 5 --every 1000 $EXTRA"
export OPENBLAS_NUM_THREADS=1  # one core per run; JOBS runs share the machine

mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "missing $BIN; build it first (scripts/build.sh -DGAC_BUILD_EXAMPLES=ON)" >&2; exit 1; }

# Runs the jobs of file $1 ("name flags" per line), JOBS at a time, into
# directory $2 (default $OUT/runs) with the flags $3 (default $COMMON) first.
run_jobs() {
  local todo="$1.todo" dir=${2:-$OUT/runs} common=${3:-$COMMON}
  mkdir -p "$dir"
  : > "$todo"
  while read -r name flags; do
    grep -qs '^summary:' "$dir/$name.log" && continue
    echo "$BIN $common $flags --csv $dir/$name.csv > $dir/$name.log 2>&1" >> "$todo"
  done < "$1"
  echo "   $(wc -l < "$todo") runs to do, $JOBS at a time"
  local start=$SECONDS
  xargs -P "$JOBS" -I{} -d '\n' sh -c '{}' < "$todo"
  echo "   done in $((SECONDS - start)) s"
}
# The fraction of updates run $1 skipped.
skip_rate() { sed -n 's/.* skipped=\([0-9]*\) .*/\1/p' "$OUT/runs/$1.log" | awk -v n="$STEPS" '{printf "%.4f", $1 / n}'; }

if [ "${1:-}" = pilot ]; then
  # name: flags. The chosen configuration is add-b10-w128-p64-lr3e-4.
  candidates=(
    "add-b10-w128-p32-lr1e-3: --prompts 32 --lr 1e-3 --sft-steps 600"
    "add-b10-w128-p32-lr3e-4: --prompts 32 --lr 3e-4 --sft-steps 600"
    "add-b10-w128-p64-lr3e-4: --prompts 64 --lr 3e-4 --sft-steps 600"
    "add-b16-w256-p32-lr3e-4: --prompts 32 --lr 3e-4 --task-base 16 --width 256 --sft-steps 1000"
    "t2-b16-w256-p32-lr1e-3: --prompts 32 --lr 1e-3 --tasks 2 --task-base 16 --width 256 --sft-steps 3000"
    "t8-b10-w256-p32-lr3e-4: --prompts 32 --lr 3e-4 --tasks 8 --width 256 --sft-steps 2000"
    "t8-b10-w256-p32-lr1e-3: --prompts 32 --lr 1e-3 --tasks 8 --width 256 --sft-steps 2000"
    "tf-add-b16-d64-p32-lr3e-4: --prompts 32 --lr 3e-4 --arch transformer --width 64 --layers 2 --heads 4 --task-base 16 --sft-steps 1500"
    "tf-t8-b16-d64-p32-lr3e-4: --prompts 32 --lr 3e-4 --arch transformer --width 64 --layers 2 --heads 4 --tasks 8 --task-base 16 --sft-steps 300"
  )
  : > "$OUT/pilot-jobs.txt"
  for c in "${candidates[@]}"; do
    [ -n "$PILOT_ONLY" ] && ! [[ " $PILOT_ONLY " == *" ${c%%:*} "* ]] && continue
    for s in 0 16; do
      for seed in 1 2; do echo "${c%%:*}_s${s}_seed$seed ${c#*:} --staleness $s --seed $seed" >> "$OUT/pilot-jobs.txt"; done
    done
  done
  echo "== pilot: $(wc -l < "$OUT/pilot-jobs.txt") runs"
  run_jobs "$OUT/pilot-jobs.txt" "$OUT/pilot" "--steps $STEPS --group 8 --eval-every 20 --window 20 --pr-every 25 \
--mech-every 5 --every 1000 --loss grpo --agent monitor $EXTRA"
  "$PYTHON" examples/grpo/analyze.py pilot --runs "$OUT/pilot"
  exit 0
fi

echo "== 1. synchronous GRPO, seeds $SEEDS"
: > "$OUT/jobs1.txt"
for seed in $SEEDS; do echo "grpo_s0_seed$seed --staleness 0 --loss grpo --agent monitor --seed $seed" >> "$OUT/jobs1.txt"; done
run_jobs "$OUT/jobs1.txt"
# Calibrated once: a later invocation (more seeds, more staleness values) keeps the thresholds.
if [ -s "$OUT/calibration.txt" ]; then
  echo "   keeping the thresholds of $OUT/calibration.txt"
else
  "$PYTHON" examples/grpo/analyze.py calibrate --runs "$OUT/runs" --out "$OUT/calibration.txt"
fi
cal() { sed -n "s/^$1=//p" "$OUT/calibration.txt"; }
C_LOW=$(cal c_low); C_HIGH=$(cal c_high); W_LOW=$(cal window_c_low); W_HIGH=$(cal window_c_high)
echo "   c_low $C_LOW, c_high $C_HIGH; window: c_low $W_LOW, c_high $W_HIGH"

echo "== 2. the grid: s in {$STALENESS}"
: > "$OUT/jobs2.txt"
for s in $STALENESS; do
  for v in $VARIANTS; do
    [ "$s" = 0 ] && case $v in grpo|m2po|bapo|is) continue ;; esac
    case $v in
      grpo|m2po|bapo|is) flags="--loss $v --agent monitor --c-low $C_LOW --c-high $C_HIGH" ;;
      gac) flags="--agent local --c-low $C_LOW --c-high $C_HIGH" ;;
      gacexact) flags="--agent local --alpha-mode exact --c-low $C_LOW --c-high $C_HIGH" ;;
      gacwin) flags="--agent local --trigger window --c-low $W_LOW --c-high $W_HIGH" ;;
      gac005) flags="--agent local --c-low 0.05 --c-high 0.3" ;;
      gacproj) flags="--agent local --c-low $C_LOW --c-high 1" ;;
      gacwinproj) flags="--agent local --trigger window --c-low $W_LOW --c-high 1" ;;
    esac
    for seed in $SEEDS; do echo "${v}_s${s}_seed$seed --staleness $s $flags --seed $seed" >> "$OUT/jobs2.txt"; done
  done
done
run_jobs "$OUT/jobs2.txt"

echo "== 3. controls at each GAC run's skip rate"
: > "$OUT/jobs3.txt"
for s in $STALENESS; do
  for v in $CONTROLS; do
    [[ " $VARIANTS " == *" $v "* ]] || continue
    for seed in $SEEDS; do
      p=$(skip_rate "${v}_s${s}_seed$seed")
      [ "$p" = 0.0000 ] && continue  # no skip: both controls are the GRPO run
      lr=$(awk -v p="$p" -v lr="$LR" 'BEGIN { printf "%.6g", lr * (1 - p) }')
      echo "rskip-${v}_s${s}_seed$seed --staleness $s --agent monitor --c-low $C_LOW --c-high $C_HIGH --random-skip $p --seed $seed" >> "$OUT/jobs3.txt"
      echo "lrs-${v}_s${s}_seed$seed --staleness $s --agent monitor --c-low $C_LOW --c-high $C_HIGH --lr $lr --seed $seed" >> "$OUT/jobs3.txt"
    done
  done
done
run_jobs "$OUT/jobs3.txt"

echo "== 4. beta ablation at s = $BETA_S (betas: ${BETAS:-none})"
: > "$OUT/jobs4.txt"
for b in $BETAS; do
  for seed in $SEEDS; do
    echo "gacb${b}_s${BETA_S}_seed$seed --staleness $BETA_S --agent local --c-low $C_LOW --c-high $C_HIGH --beta $b --seed $seed" >> "$OUT/jobs4.txt"
  done
done
run_jobs "$OUT/jobs4.txt"

echo "== 5. analysis"
"$PYTHON" examples/grpo/analyze.py report --runs "$OUT/runs" --calibration "$OUT/calibration.txt" --out "$OUT"
