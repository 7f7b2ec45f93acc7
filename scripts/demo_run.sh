#!/usr/bin/env bash
# The main job's runs, on a build that exists (scripts/demo.sh installs and
# builds first; ctest's demo_smoke calls this with a short configuration).
#
#   1. starts gacd on its embedded SQLite store (insecure mode: loopback only);
#   2. synchronous GRPO (s = 0, agent in monitor mode) twice, side by side:
#      on a calibration seed (seed + 100, never the test seed), whose steps
#      after the first 50 set the thresholds by the rule of docs/RESULTS.md
#      (c_low = q0.9 |c_t|, c_high = 3 x max |c_t| capped at 0.95, and the
#      same of |m_t|, the signed mean of c_t over 20 steps, for the windowed
#      trigger), and on the test seed, the synchronous reference;
#   3. stale GRPO (s = $STALENESS, monitor) and stale GRPO with GAC deciding
#      in gacd (remote mode, the per-step rule, thresholds set on gacd's run),
#      side by side;
#   4. stale GRPO with the windowed trigger (decided in the trainer), and
#      stale training with the unclipped importance-sampling loss, side by
#      side;
#   5. the controls of the GAC run decided in gacd, side by side: stale GRPO
#      skipping exactly the steps it skipped (same rate and timing, no
#      projection), and stale GRPO with the learning rate scaled by its mean
#      |applied| / |raw| gradient (examples/grpo/analyze.py control);
#   6. prints a table and writes a figure (examples/grpo/demo_report.py),
#      checks that gacd counted every step of every run, and says where
#      gacd's page and /metrics are, and how to watch with Prometheus and Grafana.
# Every step of every run streams to gacd. A progress line follows the runs.
#
# Usage: scripts/demo_run.sh BUILD_DIR
# Environment: GAC_DEMO_OUT (results/demo), GAC_DEMO_STEPS (400),
#   GAC_DEMO_STALENESS (16), GAC_DEMO_SFT_STEPS (600), GAC_DEMO_SEED (1),
#   GAC_DEMO_CALIB_SKIP (50: synchronous steps left out of the calibration),
#   GAC_DEMO_FLAGS (more gac_grpo flags for every run),
#   GAC_DEMO_METRICS (127.0.0.1:9464; any free port when that is busy),
#   GAC_DEMO_KEEP_GACD (1: leave gacd running at the end), PYTHON (the checkout's
#   .venv/bin/python, which has matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/demo_run.sh BUILD_DIR}
out=${GAC_DEMO_OUT:-results/demo}
steps=${GAC_DEMO_STEPS:-400}
stale=${GAC_DEMO_STALENESS:-16}
sft=${GAC_DEMO_SFT_STEPS:-600}
seed=${GAC_DEMO_SEED:-1}
calib_skip=${GAC_DEMO_CALIB_SKIP:-50}
python=${PYTHON:-.venv/bin/python}
bin="$build/examples/grpo/gac_grpo"
for f in "$bin" "$build/server/gacd"; do
  [ -x "$f" ] || { echo "demo: missing $f (build with -DGAC_BUILD_EXAMPLES=ON and the server)" >&2; exit 1; }
done
mkdir -p "$out/runs"
out=$(cd "$out" && pwd)
rm -f "$out"/runs/*.csv "$out"/runs/*.log "$out/demo.png"
data="$out/gacd"
mkdir -p "$data"
ready=$(mktemp -u /tmp/gacd-ready.XXXXXX)

gacd_pid=""
start_gacd() {  # $1: metrics address
  rm -f "$ready"
  "$build/server/gacd" --insecure --listen=127.0.0.1:0 --http-listen="$1" --store=sqlite:"$data" \
    --ready-file="$ready" 2>>"$data/gacd.log" &
  gacd_pid=$!
  for _ in $(seq 100); do
    [ -s "$ready" ] && return 0
    kill -0 "$gacd_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
trainer_pids=()
cleanup() {
  for p in "${trainer_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -n "$gacd_pid" ] && [ "${GAC_DEMO_KEEP_GACD:-0}" != 1 ]; then
    kill -TERM "$gacd_pid" 2>/dev/null || true
    wait "$gacd_pid" 2>/dev/null || true
  fi
  rm -f "$ready"
}
trap cleanup EXIT
metrics_listen=${GAC_DEMO_METRICS:-127.0.0.1:9464}
if ! start_gacd "$metrics_listen"; then
  # deploy/prometheus.yml scrapes 127.0.0.1:9464; take any free port if it is busy.
  echo "demo: cannot serve metrics on $metrics_listen, letting the OS choose the port"
  start_gacd 127.0.0.1:0 || { tail -n 20 "$data/gacd.log" >&2; exit 1; }
fi
grpc=$(sed -n 's/^grpc=//p' "$ready")
metrics=$(sed -n 's/^http=//p' "$ready")
echo "demo: gacd serves gRPC on $grpc and metrics on http://$metrics/metrics; store $data/gacd.db"
echo "demo: watch the runs live in a browser: http://$metrics/"
# deploy/prometheus.yml, pointed at this gacd and the repository's rules (no Alertmanager).
sed -e "s#gacd:9464#$metrics#" -e "s#- rules/\*\.yml#- $PWD/dashboards/gac.rules.yml#" \
    -e 's/scrape_interval: 15s/scrape_interval: 5s/' -e '/^alerting:/,/^$/d' \
    deploy/prometheus.yml >"$out/prometheus.yml"
echo "demo: to watch live, in another shell: prometheus --config.file=$out/prometheus.yml" \
     "--storage.tsdb.path=$out/prometheus-data --web.listen-address=127.0.0.1:9090"

# gacd keeps the first copy of a (run, rank, step) key: a fresh prefix per invocation.
prefix="demo-$(date +%Y%m%d-%H%M%S)-"
# The configuration of docs/RESULTS.md.
common=(--steps "$steps" --sft-steps "$sft" --lr 3e-4 --prompts 64 --group 8 --width 128 --seed "$seed"
        --eval-every 20 --window 20 --every 1000000 --gacd "$grpc")
# shellcheck disable=SC2206  # GAC_DEMO_FLAGS is a list of flags
extra=(${GAC_DEMO_FLAGS:-})
export OPENBLAS_NUM_THREADS=1  # one core per trainer

# One line for the runs in flight: step, reward, held-out accuracy, c_t and regime.
status_of() {  # $1: label, $2: run name
  awk -F, -v label="$1" -v total="$steps" '
    NR > 1 { step = $1; reward = $4; if ($6 != "") heldout = $6; cv = $12; regime = $15 }
    END {
      if (step == "") { printf "%s: starting", label; exit }
      c = cv == "" ? "-" : sprintf("%+.2f", cv)
      printf "%s %d/%d reward %.2f held-out %s c %s %s", label, step, total, reward,
             heldout == "" ? "-" : heldout, c, regime
    }' "$out/runs/$2.csv" 2>/dev/null || printf '%s: starting' "$1"
}
follow() {  # "label=name"...: waits for the trainers in trainer_pids, printing progress
  local began=$SECONDS last=-1 line spec
  while :; do
    local alive=0
    for p in "${trainer_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    line="  [$((SECONDS - began)) s]"
    for spec in "$@"; do line+="  $(status_of "${spec%%=*}" "${spec#*=}")"; done
    if [ -t 1 ]; then
      printf '\r\033[K%s' "$line"
    elif [ $alive = 0 ] || [ $((SECONDS - last)) -ge 10 ]; then
      echo "$line"
      last=$SECONDS
    fi
    [ $alive = 1 ] || break
    sleep 1
  done
  [ -t 1 ] && echo
  local rc=0
  for p in "${trainer_pids[@]}"; do wait "$p" || rc=1; done
  trainer_pids=()
  for spec in "$@"; do
    local log="$out/runs/${spec#*=}.log"
    if [ $rc != 0 ] || ! grep -q '^summary:' "$log"; then
      echo "demo: run ${spec%%=*} failed; the end of $log:" >&2
      tail -n 15 "$log" >&2
      exit 1
    fi
  done
}
launch() {  # $1: run name, then gac_grpo flags
  local name=$1
  shift
  "$bin" "${common[@]}" "${extra[@]}" --run "$prefix$name" --csv "$out/runs/$name.csv" "$@" >"$out/runs/$name.log" 2>&1 &
  trainer_pids+=($!)
}

calib_seed=$((seed + 100))
echo "demo: 1/4 synchronous GRPO (s = 0), $steps steps after $sft supervised warm-up steps, on the calibration" \
     "seed $calib_seed (sets the thresholds) and on seed $seed (the reference), side by side"
launch calib --staleness 0 --agent monitor --seed "$calib_seed" --calib-skip "$calib_skip" \
  --calibrate-out "$out/sync-calibration.txt"
launch sync --staleness 0 --agent monitor
follow "calibration=calib" "sync=sync"
cal() { sed -n "s/^$1=//p" "$out/sync-calibration.txt"; }
# The rule of docs/RESULTS.md: c_low = q0.9, c_high = min(3 x max, 0.95), of |c_t| and of |m_t|.
high() { awk -v m="$1" 'BEGIN { h = 3 * m; if (h > 0.95) h = 0.95; printf "%.6g", h }'; }
c_low=$(cal q90) c_high=$(high "$(cal max)") w_low=$(cal window_q90) w_high=$(high "$(cal window_max)")
printf 'c_low=%s\nc_high=%s\nwindow_c_low=%s\nwindow_c_high=%s\nc_q90=%s\nc_max=%s\nwindow_q90=%s\nwindow_max=%s\nseeds=%s\n' \
  "$c_low" "$c_high" "$w_low" "$w_high" "$(cal q90)" "$(cal max)" "$(cal window_q90)" "$(cal window_max)" \
  "$calib_seed" >"$out/calibration.txt"
echo "demo: calibrated on seed $calib_seed: c_low $c_low, c_high $c_high (q0.9 and 3 x max of |c_t|, at most 0.95);" \
     "windowed: $w_low, $w_high"

echo "demo: 2/4 stale GRPO (s = $stale) side by side: monitored, and GAC deciding in gacd (remote mode, per-step rule)"
launch stale --staleness "$stale" --agent monitor --c-low "$c_low" --c-high "$c_high"
launch gac --staleness "$stale" --agent remote --c-low "$c_low" --c-high "$c_high"
follow "stale=stale" "stale+GAC=gac"

echo "demo: 3/4 stale GRPO with the windowed trigger (decided in the trainer), and the unclipped IS loss, side by side"
launch gacwin --staleness "$stale" --agent local --trigger window --c-low "$w_low" --c-high "$w_high"
launch is --staleness "$stale" --agent monitor --loss is --c-low "$c_low" --c-high "$c_high"
follow "stale+GAC window=gacwin" "stale IS=is"

read -r rate scale < <("$python" examples/grpo/analyze.py control --csv "$out/runs/gac.csv" --mask-out "$out/gac-skipped.txt" |
                      sed -n 's/^skip_rate=\([^ ]*\) lr_scale=\([^ ]*\)$/\1 \2/p')
lr=$(awk -v x="$scale" 'BEGIN { printf "%.6g", 3e-4 * x }')
echo "demo: 4/4 the controls of GAC in gacd: its $(wc -l < "$out/gac-skipped.txt") skipped steps replayed (rate $rate)," \
     "and lr x its mean |applied| / |raw| gradient $scale = $lr"
launch mskip --staleness "$stale" --agent monitor --c-low "$c_low" --c-high "$c_high" --skip-steps "$out/gac-skipped.txt"
launch lrs --staleness "$stale" --agent monitor --c-low "$c_low" --c-high "$c_high" --lr "$lr"
follow "same skips=mskip" "lr scaled=lrs"
grep -h '^telemetry:' "$out"/runs/{calib,sync,stale,gac,gacwin,is,mskip,lrs}.log | sed 's/^/demo: /'

echo
"$python" examples/grpo/demo_report.py --runs "$out/runs" --calibration "$out/calibration.txt" --out "$out" \
  --run "synchronous (s=0)=sync" --run "stale (s=$stale)=stale" --run "stale + GAC in gacd=gac" \
  --run "stale + GAC window=gacwin" --run "stale, unclipped IS=is" \
  --run "stale, GAC's skips replayed=mskip" --run "stale, lr x GAC's gradient scale=lrs" \
  --metrics "http://$metrics/metrics" --gacd-prefix "$prefix"

cat <<EOF

demo: results in $out (summary.md, demo.png, per-step CSVs in runs/); gacd's store is $data/gacd.db,
      runs ${prefix}calib, ${prefix}sync, ${prefix}stale, ${prefix}gac, ${prefix}gacwin, ${prefix}is, ${prefix}mskip,
      ${prefix}lrs.
demo: gacd's page, the runs without installing anything: http://$metrics/
      (GAC_DEMO_KEEP_GACD=1 keeps gacd, and the page, up after the runs).
demo: gacd exported Prometheus metrics at http://$metrics/metrics (gac_cosine, gac_decisions_total, ...).
      Prometheus: prometheus --config.file=$out/prometheus.yml (this gacd, the alert rules of
      dashboards/gac.rules.yml); Grafana: import dashboards/gac.json with that Prometheus as the
      datasource. The full stack (gacd, Prometheus, Alertmanager, Grafana with the dashboard
      provisioned): docker compose -f deploy/compose.yaml up -d --build; see docs/OPERATIONS.md.
      GAC_DEMO_KEEP_GACD=1 leaves gacd running after the runs.
EOF
if [ "${GAC_DEMO_KEEP_GACD:-0}" = 1 ]; then
  echo "demo: gacd keeps running (pid $gacd_pid), its page at http://$metrics/; stop it with: kill $gacd_pid"
fi
