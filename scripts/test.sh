#!/usr/bin/env bash
# The test suite: installs what it needs, builds, runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh -DGAC_BUILD_TESTS=ON -DGAC_BUILD_BENCHMARKS=ON -DGAC_BUILD_EXAMPLES=ON
ctest --test-dir "${GAC_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 900
