#!/usr/bin/env bash
# gac's main job: installs what it needs, builds, then scripts/demo_run.sh:
# gacd on its embedded SQLite store, and asynchronous GRPO on digit addition
# three times with every step streamed to gacd: synchronous (calibrates
# c_low / c_high), stale, and stale with GAC deciding in gacd. It prints a
# progress line, a summary table, writes a figure, and says where /metrics is
# and how to bring up Prometheus and Grafana (deploy/).
# Environment variables of scripts/demo_run.sh set the length and staleness.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh -DGAC_BUILD_TESTS=OFF -DGAC_BUILD_BENCHMARKS=OFF -DGAC_BUILD_EXAMPLES=ON
exec bash scripts/demo_run.sh "${GAC_BUILD_DIR:-build}"
