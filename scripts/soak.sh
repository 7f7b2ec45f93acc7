#!/usr/bin/env bash
# Reliability soak (outside CI): kill -9 gacd at random moments N times
# (default 100) during a telemetry run of 250 steps per kill (at 1 step/ms),
# restarting it each time,
# and check that the store holds every step exactly once.
#   bash scripts/soak.sh [KILLS]     (builds into ${GAC_BUILD_DIR:-build})
set -euo pipefail
cd "$(dirname "$0")/.."
kills="${1:-100}"
build_dir=${GAC_BUILD_DIR:-build}
bash scripts/build.sh -DGAC_BUILD_TESTS=ON >/dev/null
steps=$(( kills * 250 ))
echo "soak: ${kills} kill -9 cycles during a ${steps}-step run"
start=$(date +%s)
GAC_SOAK_KILLS="${kills}" GAC_SOAK_STEPS="${steps}" "$build_dir/tests/transport/transport_test" \
  --gtest_filter='Telemetry.KillNineTwentyTimesLosesAndDuplicatesNothing' --gtest_brief=1
echo "soak: passed in $(( $(date +%s) - start )) s"
