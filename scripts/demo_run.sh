#!/usr/bin/env bash
# The main job's runs, on a build that exists (scripts/demo.sh installs and
# builds first; ctest's demo_smoke calls this with a short configuration).
#
#   1. starts gacd on its embedded SQLite store (insecure mode: loopback only);
#   2. synchronous GRPO (s = 0, agent in monitor mode): the |c_t| of its steps
#      after the first 50 calibrate the thresholds, once: c_low = q0.9 (the
#      SuggestThresholds rule) and c_high = max (the "gacmax" rule of
#      docs/RESULTS.md: a step more aligned than any synchronous one is skipped);
#   3. stale GRPO (s = $STALENESS) twice, side by side: agent in monitor mode,
#      and GAC with every decision made in gacd (remote mode, the calibrated
#      thresholds set on gacd's run);
#   4. prints a table and writes a figure (examples/grpo/demo_report.py),
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
#   GAC_DEMO_KEEP_GACD (1: leave gacd running at the end), PYTHON (/usr/bin/python3,
#   which has Debian's python3-matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/demo_run.sh BUILD_DIR}
out=${GAC_DEMO_OUT:-results/demo}
steps=${GAC_DEMO_STEPS:-400}
stale=${GAC_DEMO_STALENESS:-16}
sft=${GAC_DEMO_SFT_STEPS:-600}
seed=${GAC_DEMO_SEED:-1}
calib_skip=${GAC_DEMO_CALIB_SKIP:-50}
python=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
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
  "$build/server/gacd" --insecure --listen=127.0.0.1:0 --metrics-listen="$1" --data-dir="$data" \
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
metrics=$(sed -n 's/^metrics=//p' "$ready")
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
common=(--steps "$steps" --sft-steps "$sft" --lr 1e-3 --prompts 32 --group 8 --hidden 128 --seed "$seed"
        --every 1000000 --gacd "$grpc")
# shellcheck disable=SC2206  # GAC_DEMO_FLAGS is a list of flags
extra=(${GAC_DEMO_FLAGS:-})

# One line for the runs in flight: step, reward, held-out accuracy, |c_t| and regime.
status_of() {  # $1: label, $2: run name
  awk -F, -v label="$1" -v total="$steps" '
    NR > 1 { step = $1; reward = $3; if ($5 != "") heldout = $5; cv = $10; regime = $11 }
    END {
      if (step == "") { printf "%s: starting", label; exit }
      c = cv == "" ? "-" : sprintf("%.2f", cv < 0 ? -cv : cv)
      printf "%s %d/%d reward %.2f held-out %s |c| %s %s", label, step, total, reward,
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

echo "demo: 1/2 synchronous GRPO (s = 0), $steps steps after $sft supervised warm-up steps; calibrates c_low, c_high"
"$bin" "${common[@]}" "${extra[@]}" --staleness 0 --agent monitor --run "${prefix}sync" \
  --calib-skip "$calib_skip" --calibrate-out "$out/calibration.txt" --csv "$out/runs/sync.csv" >"$out/runs/sync.log" 2>&1 &
trainer_pids=($!)
follow "sync=sync"
c_low=$(sed -n 's/^c_low=//p' "$out/calibration.txt")
c_high=$(sed -n 's/^max=//p' "$out/calibration.txt")
echo "demo: calibrated c_low $c_low, c_high $c_high (q0.9 and max of the synchronous |c_t|)"

echo "demo: 2/2 stale GRPO (s = $stale) side by side: monitored, and GAC deciding in gacd (remote mode)"
"$bin" "${common[@]}" "${extra[@]}" --staleness "$stale" --agent monitor --c-low "$c_low" --c-high "$c_high" \
  --run "${prefix}stale" --csv "$out/runs/stale.csv" >"$out/runs/stale.log" 2>&1 &
trainer_pids=($!)
"$bin" "${common[@]}" "${extra[@]}" --staleness "$stale" --agent remote --c-low "$c_low" --c-high "$c_high" \
  --run "${prefix}gac" --csv "$out/runs/gac.csv" >"$out/runs/gac.log" 2>&1 &
trainer_pids+=($!)
follow "stale=stale" "stale+GAC=gac"
grep -h '^telemetry:' "$out"/runs/{sync,stale,gac}.log | sed 's/^/demo: /'

echo
"$python" examples/grpo/demo_report.py --runs "$out/runs" --calibration "$out/calibration.txt" --out "$out" \
  --run "synchronous (s=0)=sync" --run "stale (s=$stale)=stale" --run "stale (s=$stale) + GAC in gacd=gac" \
  --metrics "http://$metrics/metrics" --gacd-prefix "$prefix" --c-high "$c_high"

cat <<EOF

demo: results in $out (summary.md, demo.png, per-step CSVs in runs/); gacd's store is $data/gacd.db,
      runs ${prefix}sync, ${prefix}stale and ${prefix}gac.
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
