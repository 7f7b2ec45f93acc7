#!/usr/bin/env bash
# gac's main job: installs what it needs, builds, starts gacd on its embedded
# SQLite store (insecure local mode, loopback only), and trains a small
# LibTorch model three times while every step streams to gacd:
#   synchronous (calibrates c_low / c_high), stale (GAC watching),
#   stale with GAC deciding remotely in gacd.
# Then it stops gacd (SIGTERM: everything acknowledged is committed).
# Extra arguments go to gac_train_demo (e.g. --steps 600 --staleness 16).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh -DGAC_BUILD_TESTS=OFF -DGAC_BUILD_BENCHMARKS=OFF -DGAC_BUILD_EXAMPLES=ON
build=${GAC_BUILD_DIR:-build}
data=${GACD_DATA_DIR:-$build/demo-gacd}
ready=$(mktemp -u /tmp/gacd-ready.XXXXXX)
mkdir -p "$data"

start_gacd() {  # $1: metrics address
  "$build/server/gacd" --insecure --listen=127.0.0.1:0 --metrics-listen="$1" --data-dir="$data" \
    --ready-file="$ready" 2>"$data/gacd.log" &
  gacd_pid=$!
  for _ in $(seq 100); do
    [ -s "$ready" ] && return 0
    kill -0 "$gacd_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# Prometheus configs in deploy/ scrape 127.0.0.1:9464; any free port if it is taken.
if ! start_gacd 127.0.0.1:9464; then
  echo "demo: port 9464 is busy, letting the OS choose the metrics port"
  start_gacd 127.0.0.1:0 || { cat "$data/gacd.log"; exit 1; }
fi
trap 'kill -TERM "$gacd_pid" 2>/dev/null; wait "$gacd_pid" 2>/dev/null || true; rm -f "$ready"' EXIT
grpc=$(sed -n 's/^grpc=//p' "$ready")
metrics=$(sed -n 's/^metrics=//p' "$ready")
echo "demo: gacd serving gRPC on $grpc, metrics on http://$metrics/metrics, store $data/gacd.db"

# A fresh prefix per invocation: gacd keeps the first copy of a (run, rank,
# step) key, so reusing run names would keep the older run's steps.
prefix="demo-$(date +%Y%m%d-%H%M%S)"
"$build/examples/gac_train_demo" --gacd "$grpc" --remote --run-prefix "$prefix" "$@"

echo
echo "gacd kept every step in $data/gacd.db (runs $prefix-sync, $prefix-stale, $prefix-gac)."
echo "While gacd runs, Prometheus can scrape http://$metrics/metrics; deploy/ has the"
echo "Prometheus and Grafana setup (docs/OPERATIONS.md). To browse the stored runs later:"
echo "  $build/server/gacd --insecure --data-dir=$data"
