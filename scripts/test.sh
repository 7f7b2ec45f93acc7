#!/usr/bin/env bash
# The test suite: installs what it needs, builds, runs every test with ctest;
# then the gac wheel under two torches (scripts/wheel_check.sh: one wheel,
# tested with torch 2.15.0 and torch 2.6.0); then the checking builds of scripts/sanitize.sh (the suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer with the fuzz corpora, and
# the ThreadSanitizer tests) and each fuzz target for GAC_FUZZ_SECONDS
# (default 15) with scripts/fuzz.sh. GAC_CHECKS=0 leaves the checking
# builds out.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
bash scripts/build.sh -DGAC_BUILD_TESTS=ON -DGAC_BUILD_BENCHMARKS=ON -DGAC_BUILD_EXAMPLES=ON
# Every Debian package the build used is one setup.sh installs: a fresh machine has it too.
bash scripts/check_deps.sh "${GAC_BUILD_DIR:-build}"
ctest --test-dir "${GAC_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 900
bash scripts/wheel_check.sh
if [ "${GAC_CHECKS:-1}" != 0 ]; then
  bash scripts/sanitize.sh all
  GAC_FUZZ_JOBS=$(nproc) bash scripts/fuzz.sh "${GAC_FUZZ_SECONDS:-15}"
  bash scripts/check_deps.sh "${GAC_ASAN_DIR:-build-asan}" "${GAC_TSAN_DIR:-build-tsan}"
fi
echo "test: everything passed in $(( ($(date +%s) - start) / 60 )) min"
