#!/usr/bin/env bash
# The test suite: installs what it needs, builds, checks that the build used
# no Debian package setup.sh does not install (scripts/check_deps.sh), runs
# every test with ctest (after the CUDA kernels' compile matrix,
# scripts/kernel_check.sh); then the gac wheels, one per CPython 3.10-3.13, each
# installed beside a torch from PyPI (scripts/wheel_check.sh), gac inside
# verl's, torchtitan's and megatron-core's own code (scripts/trainers_check.sh), the sdist
# installed by pip (scripts/sdist_check.sh); then the checking builds of scripts/sanitize.sh (the suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer with the fuzz corpora, and
# the ThreadSanitizer tests) and each fuzz target for GAC_FUZZ_SECONDS
# (default 15) with scripts/fuzz.sh. GAC_CHECKS=0 leaves the checking
# builds out.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
times=()
phase() {  # NAME COMMAND...: runs it, then one line with its time (and all phases' at the end)
  local name=$1 t0=$SECONDS
  shift
  "$@"
  times+=("$name $((SECONDS - t0))s")
  echo "test: $name took $((SECONDS - t0)) s"
}
phase setup bash scripts/setup.sh
phase build bash scripts/build.sh -DGAC_BUILD_TESTS=ON -DGAC_BUILD_BENCHMARKS=ON -DGAC_BUILD_EXAMPLES=ON
# Every Debian package the build used is one setup.sh installs: a fresh machine has it too.
phase deps bash scripts/check_deps.sh "${GAC_BUILD_DIR:-build}"
# The CUDA kernels compiled for every architecture of the wheel, without a GPU
# (scripts/kernel_check.sh): the entry points against kernel_library.cc's
# names, the parameters against the 4 KiB limit, ptxas's spills against a
# bound and its registers against __launch_bounds__. It installs the CUDA
# 12.9 toolchain (.cuda12) first, which ctest's test of the check
# (tests/python/test_kernel_check.py) needs, and fails when it cannot.
phase kernels bash scripts/kernel_check.sh
phase ctest ctest --test-dir "${GAC_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 900
phase wheels bash scripts/wheel_check.sh
# The GPU lease's script, dry: every step that can run without a GPU runs.
phase gpu-dry-run bash scripts/gpu_lease.sh --dry-run
phase trainers bash scripts/trainers_check.sh "${GAC_BUILD_DIR:-build}"
phase sdist bash scripts/sdist_check.sh
if [ "${GAC_CHECKS:-1}" != 0 ]; then
  phase asan bash scripts/sanitize.sh asan
  phase tsan bash scripts/sanitize.sh tsan
  phase fuzz env GAC_FUZZ_JOBS="$(nproc)" bash scripts/fuzz.sh "${GAC_FUZZ_SECONDS:-15}"
  phase deps-checking bash scripts/check_deps.sh "${GAC_ASAN_DIR:-build-asan}" "${GAC_TSAN_DIR:-build-tsan}"
fi
echo "test: everything passed in $(( ($(date +%s) - start) / 60 )) min (${times[*]})"
