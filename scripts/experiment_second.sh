# The second registered experiment (docs/RESULTS.md, "Second registered
# experiment: pre-registered design"), one stage per part, sourced by
# scripts/experiment.sh (its run_jobs, calibrate_in, BIN, BASE, PYTHON):
#   scripts/experiment.sh second [a] [b] [c] [d]     (default: all four, in that order)
# into $OUT/second (results/grpo/second): calibration.txt and calibration-runs
# (the replication's rule on $CAL_SEEDS, run again with this binary), then one
# folder per part, each with a copy of calibration.txt, its job lists, its
# runs (runs/ or, for C, sizes/runs, sizes-t2/runs and long/runs) and what
# the part's analysis wrote (exp2-<part>.md, exp2-<part>-runs.csv):
#   a  losses x GAC: grpo, m2po, bapo, tis each in monitor mode and with GAC
#      (gacmax: c_high = the on-policy max, local mode), s in {16, 32}, seeds
#      1001-1024, with the probes; then P_s and L_s and the burst masks
#      (analyze.py burst), each grpo-gacmax run's masks (analyze.py control:
#      mskip, bskip, cskip) and the controls mskip-, burst-, rskip- (at P_s),
#      bskip-, cskip-gacmax without probes; examples/grpo/exp2_losses.py;
#   b  detectors: GRPO at s = 2 jumping to 16 or 32 at the seed's step J of
#      the registered table (jumps.txt), and the no-jump twins, 660 steps,
#      seeds 2001-2024, no probes; examples/grpo/exp2_jumps.py;
#   c  the size sweep on T1 (base-32 addition, 2,000 warm-up steps), widths
#      2048 down to 128, seeds 3001-3003; when T1 does not qualify
#      (exp2_scale.py qualifies), the same on T2 (8 tasks in base 16, seeds
#      3004-3006); then the 800-step runs at s = 16 (Setup, seeds 3101-3124;
#      T1 at width 512, seeds 3201-3212); examples/grpo/exp2_scale.py;
#   d  the spike guard: cleanguard and injguard-<k> (spikes of k x the recent
#      norm, k in 2 3 5 10 30, from step 51 with probability 0.01), s in
#      {0, 16}, no clipping, GAC out of reach, seeds 4001-4024;
#      examples/grpo/exp2_guard.py.
# Finished runs are not run again, so a stage can be stopped and resumed.

SECOND=${SECOND:-$OUT/second}
# The jump step J of each seed of part B, drawn before any run with
# random.Random(52), randint(100, 250) once per seed in seed order (docs/RESULTS.md).
SECOND_JUMPS="2001 168
2002 113
2003 231
2004 223
2005 194
2006 204
2007 108
2008 135
2009 140
2010 205
2011 146
2012 188
2013 212
2014 100
2015 108
2016 239
2017 199
2018 212
2019 102
2020 160
2021 117
2022 140
2023 143
2024 223"

# Calibrates once into $SECOND and copies calibration.txt into part folder $1.
second_calibration() {
  mkdir -p "$SECOND" "$1"
  echo "== second: calibration (seeds $CAL_SEEDS, not test seeds), into $SECOND"
  calibrate_in "$SECOND"
  cp "$SECOND/calibration.txt" "$1/calibration.txt"
}

second_a() {
  local A=$SECOND/a seeds seed s loss flags name p monitor
  seeds=$(seq -s ' ' 1001 1024)
  second_calibration "$A"
  echo "== second A1: the eight loss arms, s in {16, 32}, seeds 1001-1024"
  : > "$A/jobs1.txt"
  for s in 16 32; do
    for seed in $seeds; do
      for loss in grpo m2po bapo tis; do
        flags="--loss $loss"; [ "$loss" = tis ] && flags="--loss tis --tis-cap 2"
        echo "${loss}_s${s}_seed$seed --staleness $s $flags --agent monitor --c-low $C_LOW --c-high $C_MAX --seed $seed" >> "$A/jobs1.txt"
        echo "${loss}-gacmax_s${s}_seed$seed --staleness $s $flags --agent local --c-low $C_LOW --c-high $C_MAX --seed $seed" >> "$A/jobs1.txt"
      done
    done
  done
  run_jobs "$A/jobs1.txt" "$A/runs"
  echo "== second A2: P_s, L_s, the masks and the five controls"
  mkdir -p "$A/masks"
  : > "$A/jobs2.txt"
  for s in 16 32; do
    local csvs=()
    for seed in $seeds; do
      name=grpo-gacmax_s${s}_seed$seed
      grep -qs '^summary:' "$A/runs/$name.log" || { echo "second A: $name has not finished; the controls need all 24" >&2; return 1; }
      csvs+=("$A/runs/$name.csv")
    done
    "$PYTHON" examples/grpo/analyze.py burst --csv "${csvs[@]}" --staleness $s --seeds 1001-1024 --out "$A/masks" > "$A/burst_s$s.txt"
    p=$(sed -n 's/^P=\([^ ]*\) .*$/\1/p' "$A/burst_s$s.txt")
    [ -n "$p" ] || { echo "second A: analyze.py burst gave no P at s = $s" >&2; return 1; }
    echo "   s = $s: P_s $p, $(sed -n 's/^P=[^ ]* runs_of_skips=\([0-9]*\) .*$/\1/p' "$A/burst_s$s.txt") runs of skips"
    for seed in $seeds; do
      name=grpo-gacmax_s${s}_seed$seed
      "$PYTHON" examples/grpo/analyze.py control --csv "$A/runs/$name.csv" --mask-out "$A/masks/$name.txt" \
        --block-mask-out "$A/masks/$name.block.txt" --count-mask-out "$A/masks/$name.count.txt" \
        --seed $((100 * seed + s)) > /dev/null
      monitor="--staleness $s --loss grpo --agent monitor --c-low $C_LOW --c-high $C_MAX --seed $seed"
      echo "mskip-gacmax_s${s}_seed$seed $monitor --skip-steps $A/masks/$name.txt" >> "$A/jobs2.txt"
      echo "burst-gacmax_s${s}_seed$seed $monitor --skip-steps $A/masks/burst_s${s}_seed$seed.txt" >> "$A/jobs2.txt"
      echo "rskip-gacmax_s${s}_seed$seed $monitor --random-skip $p" >> "$A/jobs2.txt"
      echo "bskip-gacmax_s${s}_seed$seed $monitor --skip-steps $A/masks/$name.block.txt" >> "$A/jobs2.txt"
      echo "cskip-gacmax_s${s}_seed$seed $monitor --skip-steps $A/masks/$name.count.txt" >> "$A/jobs2.txt"
    done
  done
  run_jobs "$A/jobs2.txt" "$A/runs" "$CONTROL_COMMON"
  echo "== second A3: analysis"
  "$PYTHON" examples/grpo/exp2_losses.py --root "$A" --out "$A"
}

second_b() {
  local B=$SECOND/b seed j
  second_calibration "$B"
  echo "$SECOND_JUMPS" > "$B/jumps.txt"
  echo "== second B: jumps from s = 2 to 16 and 32, and the no-jump twins, seeds 2001-2024, 660 steps"
  : > "$B/jobs.txt"
  while read -r seed j; do
    local common="--steps 660 --staleness 2 --loss grpo --agent monitor --c-low $C_LOW --c-high $C_MAX --seed $seed"
    echo "jump16_s2_seed$seed $common --jump-staleness 16 --jump-at $j" >> "$B/jobs.txt"
    echo "jump32_s2_seed$seed $common --jump-staleness 32 --jump-at $j" >> "$B/jobs.txt"
    echo "nojump_s2_seed$seed $common" >> "$B/jobs.txt"
  done < "$B/jumps.txt"
  run_jobs "$B/jobs.txt" "$B/runs" "$CONTROL_COMMON"
  "$PYTHON" examples/grpo/exp2_jumps.py --root "$B" --out "$B"
}

# The size sweep of part C on task flags $2 (name $1: t1 or t2), seeds $3, into $SECOND/c/$4.
second_sweep() {
  local C=$SECOND/c w seed
  : > "$C/$4-jobs.txt"
  for w in 2048 1024 512 256 128; do  # the largest first
    for seed in $3; do echo "mlp-w${w}_s0_seed$seed $2 --width $w --seed $seed" >> "$C/$4-jobs.txt"; done
  done
  run_jobs "$C/$4-jobs.txt" "$C/$4/runs" "--steps 400 --lr $LR --prompts 64 --group 8 --eval-every 20 --window 20 \
--every 1000 --pr-every 25 --mech-every 0 --staleness 0 --loss grpo --agent monitor --sft-steps 2000 $EXTRA"
}

second_c() {
  local C=$SECOND/c seed rc=0 common
  second_calibration "$C"
  echo "== second C1: the size sweep on T1 (base-32 addition), seeds 3001-3003, widths 2048..128"
  second_sweep t1 "--task-base 32" "3001 3002 3003" sizes
  "$PYTHON" examples/grpo/exp2_scale.py qualifies --root "$C" --task t1 || rc=$?
  if [ "$rc" = 1 ]; then
    echo "== second C1: T1 does not qualify; the same sweep on T2 (8 tasks in base 16), seeds 3004-3006"
    second_sweep t2 "--tasks 8 --task-base 16" "3004 3005 3006" sizes-t2
  elif [ "$rc" != 0 ]; then
    return 1
  fi
  echo "== second C2: 800-step runs at s = 16 (Setup, seeds 3101-3124; T1 at width 512, seeds 3201-3212)"
  : > "$C/long-jobs.txt"
  common="--steps 800 --staleness 16 --loss grpo --agent monitor --c-low $C_LOW --c-high $C_MAX"
  for seed in $(seq 3101 3124); do echo "setup_s16_seed$seed $common --seed $seed" >> "$C/long-jobs.txt"; done
  for seed in $(seq 3201 3212); do
    echo "t1-w512_s16_seed$seed $common --task-base 32 --width 512 --sft-steps 2000 --seed $seed" >> "$C/long-jobs.txt"
  done
  run_jobs "$C/long-jobs.txt" "$C/long/runs" "$CONTROL_COMMON"
  "$PYTHON" examples/grpo/exp2_scale.py --root "$C" --out "$C"
}

second_d() {
  local D=$SECOND/d s seed k
  second_calibration "$D"
  echo "== second D: the spike guard on spikes of 2-30x the recent norm, s in {0, 16}, seeds 4001-4024"
  : > "$D/jobs.txt"
  for s in 0 16; do
    for seed in $(seq 4001 4024); do
      local common="--staleness $s --clip-grad 1e9 --agent local --c-low 0.999 --c-high 1 --spike-sigma 6 --seed $seed"
      echo "cleanguard_s${s}_seed$seed $common" >> "$D/jobs.txt"
      for k in 2 3 5 10 30; do
        echo "injguard-${k}_s${s}_seed$seed $common --inject-spikes 0.01 --inject-scale $k --inject-after 50 --inject-relative 128" >> "$D/jobs.txt"
      done
    done
  done
  run_jobs "$D/jobs.txt" "$D/runs" "$CONTROL_COMMON"
  # OLMo-core's SkipStepOptimizer judges the same steps: ai2-olmo-core 3.0.0 beside the venv's torch, without
  # its torch pin (examples/grpo/spikes.py); gacctl backtest replays gac's guard at sigma 3-6.
  local olmo=$SECOND/olmo-target
  if [ ! -d "$olmo/olmo_core" ]; then
    "$PYTHON" -m pip install -q --target "$olmo" cached-path dataclass-extensions rich bettermap safetensors \
      importlib_resources pyyaml && "$PYTHON" -m pip install -q --target "$olmo" --no-deps ai2-olmo-core==3.0.0 ||
      echo "second D: OLMo-core's class could not be installed; its stand-in (olmo_skip.h in Python) judges" >&2
  fi
  PYTHONPATH="$olmo${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" examples/grpo/exp2_guard.py --root "$D" --out "$D" \
    --gacctl "$BUILD/cli/gacctl"
}

second_part() {
  case $1 in
    a) second_a ;;
    b) second_b ;;
    c) second_c ;;
    d) second_d ;;
    *) echo "experiment.sh second: no part '$1' (a, b, c, d)" >&2; return 1 ;;
  esac
}
