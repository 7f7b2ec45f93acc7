#!/usr/bin/env bash
# gac's main job: installs what it needs, builds, and trains a small LibTorch
# model on stale gradients with the GAC agent deciding every step, first in
# monitor mode (what GAC sees) and then in local mode (GAC acting).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh -DGAC_BUILD_TESTS=OFF -DGAC_BUILD_BENCHMARKS=OFF -DGAC_BUILD_EXAMPLES=ON
demo=${GAC_BUILD_DIR:-build}/examples/gac_train_demo
echo; echo "== monitor mode: staleness 8, GAC only watches =="
"$demo" --mode monitor --staleness 8 --steps 200 --every 20 "$@"
echo; echo "== local mode: staleness 8, GAC projects or skips =="
"$demo" --mode local --staleness 8 --steps 200 --every 20 "$@"
