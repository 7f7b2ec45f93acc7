#!/usr/bin/env bash
# The async GRPO experiment of docs/RESULTS.md (outside CI; about 380 runs of
# about 12 CPU s each on torch 2.15: 54 minutes two at a time). The lag
# is counted in optimizer steps, as the paper models it (a skipped update
# leaves the weights, so s skips make the samplers on-policy again).
#   0. calibration: synchronous GRPO (s = 0, monitor mode) on seeds of its
#      own ($CAL_SEEDS, never test seeds); analyze.py calibrate fixes the
#      thresholds once, by the rule in its docstring (c_low = on-policy q0.9,
#      c_high = 3 x the on-policy max capped at 0.95, for |c_t| and for the
#      windowed |m_t|); an existing $OUT/calibration.txt is kept;
#   1. synchronous GRPO on the test seeds ($SEEDS): the s = 0 reference;
#   2. the grid: s in $STALENESS x {grpo, m2po, bapo, is (unclipped importance
#      sampling), gac (paper alpha, calibrated), gacwin (the windowed trigger),
#      gacproj and gacwinproj (c_high = 1: projection only, never a skip),
#      gacmax (c_high = the on-policy max, the earlier rule: GAC acts mostly by
#      skipping)} x seeds; the losses are identical at s = 0, so only the GAC
#      variants run there besides grpo. Every run gets the calibrated
#      thresholds (monitor-mode runs report what GAC would do). Plus gacv:
#      gac at s = $VERSION_S with the lag counted in applied updates (--lag
#      versions: the rule of the earlier grid, in which a skip cannot reduce
#      the lag);
#   3. controls per GAC run (analyze.py control reads its skip rate p, the
#      steps it skipped and lr_scale, the mean of |applied| / |raw| gradient,
#      0 on a skip): where p > 0, rskip-<v> (GRPO skipping each update with
#      probability p: same rate, random timing) and mskip-<v> (GRPO skipping
#      exactly the steps the GAC run skipped: same rate and timing, no
#      projection); where lr_scale < $LRS_MIN, lrs-<v> (GRPO with lr x
#      lr_scale: with the lag in steps its expected drift over the lag window
#      equals the GAC run's). A run above both bounds is compared with GRPO
#      itself (its controls would be GRPO to within those margins);
#   4. the beta ablation at s = $BETA_S: gac with beta in $BETAS (gacb<beta>);
#   5. examples/grpo/analyze.py report: results.csv (one row per run),
#      comparisons.csv, detectors.csv, summary.md (tables) and the plots.
# Runs whose log already ends with a summary line are not run again.
#
# `scripts/experiment.sh replicate` instead runs the held-out replication
# registered in docs/RESULTS.md (after step 0, the calibration): seeds
# $REP_SEEDS (201-224), s in $REP_STALENESS ("16 32"), 432 runs, into
# $OUT/replication, and its table (analyze.py replicate).
#
# `scripts/experiment.sh sizes` instead runs the size sweep (docs/RESULTS.md,
# "Where c_t leaves its noise floor"): 21 synchronous runs into $OUT/sizes
# and its table (analyze.py sizes).
#
# `scripts/experiment.sh spikes` instead runs the spike guard's experiment
# (docs/RESULTS.md, "The spike guard"): 120 runs into $OUT/spikes and its
# table (examples/grpo/spikes.py).
#
# `scripts/experiment.sh second [a] [b] [c] [d]` instead runs the parts of the
# second registered experiment (docs/RESULTS.md), into $OUT/second; its stages
# are in scripts/experiment_second.sh.
#
# `scripts/experiment.sh pilot` instead runs the measurements that chose the
# configuration (docs/RESULTS.md, "Choosing the setting"): candidate tasks and
# policies x s in {0, 16} x seeds 1 2 (GRPO, monitor mode; $SEEDS is not
# read), into $OUT/pilot (the job list $OUT/pilot-jobs.txt), and prints their
# table (analyze.py pilot: $OUT/pilot.md, $OUT/pilot-runs.csv; the rows in
# the job list's order).
#
# Environment: OUT (results/grpo), BUILD (build), STEPS (400), SEEDS
# ("1 2 3 4 5"), CAL_SEEDS ("101 102 103"), STALENESS ("0 4 8 16 32"),
# VARIANTS (every variant of step 2), CONTROLS (the GAC variants that get
# controls; all by default), LRS_MIN (0.97), JOBS (2 parallel runs), BETAS
# ("0.5 2"; "" skips step 4), BETA_S (16), VERSION_S (16; "" skips gacv),
# EXTRA (more flags for every run), PILOT_ONLY (the pilot's candidates to run,
# by name; all by default), PYTHON (the checkout's .venv/bin/python, which has
# matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/grpo}
BUILD=${BUILD:-build}
STEPS=${STEPS:-400}
SEEDS=${SEEDS:-"1 2 3 4 5"}
CAL_SEEDS=${CAL_SEEDS:-"101 102 103"}
LRS_MIN=${LRS_MIN:-0.97}
VERSION_S=${VERSION_S-16}
STALENESS=${STALENESS:-"0 4 8 16 32"}
VARIANTS=${VARIANTS:-"grpo m2po bapo is gac gacwin gacproj gacwinproj gacmax"}
PILOT_ONLY=${PILOT_ONLY:-}
CONTROLS=${CONTROLS:-"gac gacwin gacproj gacwinproj gacmax gacv"}
JOBS=${JOBS:-2}
BETAS=${BETAS-"0.5 2"}
BETA_S=${BETA_S:-16}
EXTRA=${EXTRA:-}
PYTHON=${PYTHON:-.venv/bin/python}
BIN="$BUILD/examples/grpo/gac_grpo"
LR=3e-4
# The configuration chosen in the pilot (docs/RESULTS.md), the same for every run.
BASE="--steps $STEPS --sft-steps 600 --lr $LR --prompts 64 --group 8 --width 128 --eval-every 20 --window 20 --every 1000"
COMMON="$BASE --pr-every 25 --mech-every 5 $EXTRA"
# The controls skip the probes: they draw from streams of their own, so a run's
# trajectory is the same with or without them.
CONTROL_COMMON="$BASE $EXTRA"
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
  "$PYTHON" examples/grpo/analyze.py pilot --runs "$OUT/pilot" --jobs "$OUT/pilot-jobs.txt" --out "$OUT"
  exit 0
fi

if [ "${1:-}" = sizes ]; then
  # Where c_t leaves its noise floor (docs/RESULTS.md, "the size sweep"):
  # synchronous GRPO in monitor mode on the calibration seeds $CAL_SEEDS, the
  # configuration of "Setup" but for the policy: MLPs of 2 hidden layers of
  # width 64-1024, the transformer (2 blocks, 4 heads, 1,500 warm-up steps)
  # at widths 64 and 128. Longest first. Then analyze.py sizes: its table
  # and sizes-runs.csv (one row per run).
  SZ=$OUT/sizes
  mkdir -p "$SZ"
  : > "$SZ/jobs.txt"
  for p in "tf-d128: --arch transformer --layers 2 --heads 4 --width 128 --sft-steps 1500" \
           "mlp-w1024: --width 1024 --sft-steps 600" \
           "tf-d64: --arch transformer --layers 2 --heads 4 --width 64 --sft-steps 1500" \
           "mlp-w512: --width 512 --sft-steps 600" "mlp-w256: --width 256 --sft-steps 600" \
           "mlp-w128: --width 128 --sft-steps 600" "mlp-w64: --width 64 --sft-steps 600"; do
    for seed in $CAL_SEEDS; do echo "${p%%:*}_s0_seed$seed ${p#*:} --seed $seed" >> "$SZ/jobs.txt"; done
  done
  run_jobs "$SZ/jobs.txt" "$SZ/runs" "--steps $STEPS --lr $LR --prompts 64 --group 8 --eval-every 20 --window 20 \
--every 1000 --pr-every 25 --mech-every 0 --staleness 0 --loss grpo --agent monitor $EXTRA"
  "$PYTHON" examples/grpo/analyze.py sizes --runs "$SZ/runs" --out "$SZ"
  exit 0
fi

if [ "${1:-}" = spikes ]; then
  # The spike guard on injected gradient spikes (docs/RESULTS.md, "The spike
  # guard"): seeds $SPIKE_SEEDS, s in {0, 16}, gradient clipping at 1 (the
  # default) and none, arms clean, clean+guard, inj, inj+guard; injected:
  # each step after 50 has its gradient multiplied by 1e3 with probability
  # 0.01 (the same steps in every arm of a seed), and cleanolmo, injolmo:
  # OLMo-core's skip-step rule in the trainer instead of gac's guard
  # (--olmo-skip-sigma 6, window 128). GAC's thresholds are out of
  # reach (c_low 0.999, c_high 1, local mode): the guard alone decides. Then
  # examples/grpo/spikes.py: the guard's recall and false skips, held-out
  # accuracy, and OLMo-core's SkipStepOptimizer on the same steps when
  # olmo_core is importable (PYTHONPATH, see the script).
  SPIKE_SEEDS=${SPIKE_SEEDS:-"301 302 303 304 305"}
  SP=$OUT/spikes
  mkdir -p "$SP"
  : > "$SP/jobs.txt"
  for s in 0 16; do
    for clip in 1 none; do
      cf=""; [ "$clip" = none ] && cf="--clip-grad 1e9"
      for seed in $SPIKE_SEEDS; do
        common="--staleness $s --agent local --c-low 0.999 --c-high 1 --seed $seed $cf"
        echo "clean_clip${clip}_s${s}_seed$seed $common" >> "$SP/jobs.txt"
        echo "cleanguard_clip${clip}_s${s}_seed$seed $common --spike-sigma 6" >> "$SP/jobs.txt"
        echo "inj_clip${clip}_s${s}_seed$seed $common --inject-spikes 0.01" >> "$SP/jobs.txt"
        echo "injguard_clip${clip}_s${s}_seed$seed $common --inject-spikes 0.01 --spike-sigma 6" >> "$SP/jobs.txt"
        echo "cleanolmo_clip${clip}_s${s}_seed$seed $common --olmo-skip-sigma 6" >> "$SP/jobs.txt"
        echo "injolmo_clip${clip}_s${s}_seed$seed $common --inject-spikes 0.01 --olmo-skip-sigma 6" >> "$SP/jobs.txt"
      done
    done
  done
  run_jobs "$SP/jobs.txt" "$SP/runs" "$CONTROL_COMMON"
  "$PYTHON" examples/grpo/spikes.py --runs "$SP/runs" --out "$SP"
  exit 0
fi

# Calibrates into folder $1: synchronous GRPO on $CAL_SEEDS ($1/calibration-runs), then
# $1/calibration.txt once (an existing file is kept); sets C_LOW, C_HIGH, C_MAX, W_LOW, W_HIGH.
calibrate_in() {
  : > "$1/jobs0.txt"
  for seed in $CAL_SEEDS; do echo "grpo_s0_seed$seed --staleness 0 --loss grpo --agent monitor --seed $seed" >> "$1/jobs0.txt"; done
  run_jobs "$1/jobs0.txt" "$1/calibration-runs"
  # Calibrated once: a later invocation (more seeds, more staleness values) keeps the thresholds.
  if [ -s "$1/calibration.txt" ]; then
    echo "   keeping the thresholds of $1/calibration.txt"
  else
    "$PYTHON" examples/grpo/analyze.py calibrate --runs "$1/calibration-runs" --out "$1/calibration.txt"
  fi
  cal() { sed -n "s/^$1=//p" "$CAL_FILE"; }
  CAL_FILE=$1/calibration.txt
  C_LOW=$(cal c_low); C_HIGH=$(cal c_high); C_MAX=$(cal c_max)
  W_LOW=$(cal window_c_low); W_HIGH=$(cal window_c_high)
  echo "   c_low $C_LOW, c_high $C_HIGH (on-policy max $C_MAX); window: c_low $W_LOW, c_high $W_HIGH"
}

if [ "${1:-}" = second ]; then
  shift
  . scripts/experiment_second.sh  # second_part, the stages of the second registered design
  [ $# -gt 0 ] || set -- a b c d
  for part in "$@"; do second_part "$part"; done
  exit 0
fi

echo "== 0. calibration: synchronous GRPO, seeds $CAL_SEEDS (not test seeds)"
calibrate_in "$OUT"

echo "== 1. synchronous GRPO, test seeds $SEEDS"
: > "$OUT/jobs1.txt"
for seed in $SEEDS; do
  echo "grpo_s0_seed$seed --staleness 0 --loss grpo --agent monitor --c-low $C_LOW --c-high $C_HIGH --seed $seed" >> "$OUT/jobs1.txt"
done
run_jobs "$OUT/jobs1.txt"

# The flags of GAC variant $1.
gac_flags() {
  case $1 in
    gac|gacv) echo "--agent local --c-low $C_LOW --c-high $C_HIGH" ;;
    gacwin) echo "--agent local --trigger window --c-low $W_LOW --c-high $W_HIGH" ;;
    gacproj) echo "--agent local --c-low $C_LOW --c-high 1" ;;
    gacwinproj) echo "--agent local --trigger window --c-low $W_LOW --c-high 1" ;;
    gacmax) echo "--agent local --c-low $C_LOW --c-high $C_MAX" ;;
  esac
}

if [ "${1:-}" = replicate ]; then
  # The held-out replication, as registered in docs/RESULTS.md before it ran:
  # seeds $REP_SEEDS (never used before), s in $REP_STALENESS, the arms grpo,
  # gac, gacmax, gacwin, the controls of gacmax (rskip, mskip, bskip: its
  # mask's runs in a random order, cskip: its count per 50-step block at
  # random positions) and lrs-gacwin (lr scaled by gacwin's median drift over
  # the lag window over grpo's, same seed), then analyze.py replicate.
  REP_SEEDS=${REP_SEEDS:-$(seq -s ' ' 201 224)}
  REP_STALENESS=${REP_STALENESS:-"16 32"}
  REP=$OUT/replication
  mkdir -p "$REP/masks"
  echo "== R1. arms, s in {$REP_STALENESS}, seeds $REP_SEEDS"
  : > "$REP/jobs1.txt"
  for s in $REP_STALENESS; do
    for seed in $REP_SEEDS; do
      echo "grpo_s${s}_seed$seed --staleness $s --loss grpo --agent monitor --c-low $C_LOW --c-high $C_HIGH --seed $seed" >> "$REP/jobs1.txt"
      for v in gac gacmax gacwin; do echo "${v}_s${s}_seed$seed --staleness $s $(gac_flags "$v") --seed $seed" >> "$REP/jobs1.txt"; done
    done
  done
  run_jobs "$REP/jobs1.txt" "$REP/runs"
  echo "== R2. controls of gacmax and gacwin"
  # The median drift over the lag window of run $1 (analyze.py control's drift line).
  drift() { "$PYTHON" examples/grpo/analyze.py control --csv "$REP/runs/$1.csv" --mask-out /dev/null | sed -n 's/^drift=\([^ ]*\)$/\1/p'; }
  : > "$REP/jobs2.txt"
  for s in $REP_STALENESS; do
    for seed in $REP_SEEDS; do
      monitor="--staleness $s --agent monitor --c-low $C_LOW --c-high $C_HIGH --seed $seed"
      name=gacmax_s${s}_seed$seed
      read -r p _ < <("$PYTHON" examples/grpo/analyze.py control --csv "$REP/runs/$name.csv" --mask-out "$REP/masks/$name.txt" \
                        --block-mask-out "$REP/masks/$name.block.txt" --count-mask-out "$REP/masks/$name.count.txt" \
                        --seed $((seed * 100 + s)) | sed -n 's/^skip_rate=\([^ ]*\) lr_scale=.*$/\1 x/p')
      [ -n "${p:-}" ] || { echo "analyze.py control gave nothing for $name" >&2; exit 1; }
      echo "rskip-gacmax_s${s}_seed$seed $monitor --random-skip $p" >> "$REP/jobs2.txt"
      echo "mskip-gacmax_s${s}_seed$seed $monitor --skip-steps $REP/masks/$name.txt" >> "$REP/jobs2.txt"
      echo "bskip-gacmax_s${s}_seed$seed $monitor --skip-steps $REP/masks/$name.block.txt" >> "$REP/jobs2.txt"
      echo "cskip-gacmax_s${s}_seed$seed $monitor --skip-steps $REP/masks/$name.count.txt" >> "$REP/jobs2.txt"
      dw=$(drift "gacwin_s${s}_seed$seed"); dg=$(drift "grpo_s${s}_seed$seed")
      [ -n "$dw" ] && [ -n "$dg" ] || { echo "no drift logged for seed $seed at s = $s" >&2; exit 1; }
      echo "lrs-gacwin_s${s}_seed$seed $monitor --lr $(awk -v a="$dw" -v b="$dg" -v lr="$LR" 'BEGIN { printf "%.6g", lr * a / b }')" >> "$REP/jobs2.txt"
    done
  done
  run_jobs "$REP/jobs2.txt" "$REP/runs" "$CONTROL_COMMON"
  echo "== R3. analysis"
  "$PYTHON" examples/grpo/analyze.py replicate --runs "$REP/runs" --out "$REP"
  exit 0
fi

echo "== 2. the grid: s in {$STALENESS}"
: > "$OUT/jobs2.txt"
for s in $STALENESS; do
  for v in $VARIANTS; do
    case $v in
      grpo|m2po|bapo|is) [ "$s" = 0 ] && continue; flags="--loss $v --agent monitor --c-low $C_LOW --c-high $C_HIGH" ;;
      *) flags=$(gac_flags "$v") ;;
    esac
    for seed in $SEEDS; do echo "${v}_s${s}_seed$seed --staleness $s $flags --seed $seed" >> "$OUT/jobs2.txt"; done
  done
done
if [ -n "$VERSION_S" ]; then
  for seed in $SEEDS; do
    echo "gacv_s${VERSION_S}_seed$seed --staleness $VERSION_S --lag versions $(gac_flags gacv) --seed $seed" >> "$OUT/jobs2.txt"
  done
fi
run_jobs "$OUT/jobs2.txt"

echo "== 3. controls of each GAC run (skip rate, skipped steps, lr scale)"
: > "$OUT/jobs3.txt"
mkdir -p "$OUT/masks"
for run in "$OUT"/runs/gac*_s*_seed*.csv; do
  name=$(basename "$run" .csv)
  v=${name%%_s*}
  [[ " $CONTROLS " == *" $v "* ]] || continue
  rest=${name#*_s}; s=${rest%%_seed*}; seed=${rest#*_seed}
  lag=""; [ "$v" = gacv ] && lag="--lag versions"
  read -r p scale < <("$PYTHON" examples/grpo/analyze.py control --csv "$run" --mask-out "$OUT/masks/$name.txt" |
                       sed -n 's/^skip_rate=\([^ ]*\) lr_scale=\([^ ]*\)$/\1 \2/p')
  [ -n "${p:-}" ] || { echo "analyze.py control gave nothing for $run" >&2; exit 1; }
  monitor="--staleness $s $lag --agent monitor --c-low $C_LOW --c-high $C_HIGH --seed $seed"
  if awk -v p="$p" 'BEGIN { exit !(p > 0) }'; then
    echo "rskip-${name} $monitor --random-skip $p" >> "$OUT/jobs3.txt"
    echo "mskip-${name} $monitor --skip-steps $OUT/masks/$name.txt" >> "$OUT/jobs3.txt"
  fi
  if awk -v x="$scale" -v m="$LRS_MIN" 'BEGIN { exit !(x < m) }'; then
    echo "lrs-${name} $monitor --lr $(awk -v x="$scale" -v lr="$LR" 'BEGIN { printf "%.6g", lr * x }')" >> "$OUT/jobs3.txt"
  fi
done
run_jobs "$OUT/jobs3.txt" "$OUT/runs" "$CONTROL_COMMON"

echo "== 4. beta ablation at s = $BETA_S (betas: ${BETAS:-none})"
: > "$OUT/jobs4.txt"
for b in $BETAS; do
  for seed in $SEEDS; do
    echo "gacb${b}_s${BETA_S}_seed$seed --staleness $BETA_S $(gac_flags gac) --beta $b --seed $seed" >> "$OUT/jobs4.txt"
  done
done
run_jobs "$OUT/jobs4.txt"

echo "== 5. analysis"
"$PYTHON" examples/grpo/analyze.py report --runs "$OUT/runs" --calibration "$OUT/calibration.txt" --out "$OUT"
