#!/usr/bin/env bash
# The checking builds (clang): the test suite under AddressSanitizer and
# UndefinedBehaviorSanitizer, the LibTorch agent tests and the fuzz targets'
# corpora included (tree ${GAC_ASAN_DIR:-build-asan}), and the
# ThreadSanitizer tests of tests/tsan (tree ${GAC_TSAN_DIR:-build-tsan}).
# Every sanitizer report fails its test (-fno-sanitize-recover=all,
# halt_on_error); tests/sanitizers/ holds the suppressions, each with its
# reason. Benchmarks and examples are left to the Release build.
#
#   bash scripts/sanitize.sh [asan|tsan|all] [extra ctest arguments]
#
# GAC_SANITIZE_TEST=0 builds without running the tests. Needs the packages
# of scripts/setup.sh (clang-14, libclang-rt-14-dev, llvm-14).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
root=$PWD
jobs=${GAC_JOBS:-$(nproc)}
launcher=()
if [ "${GAC_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# -O1 with line tables: readable reports at a modest cost; no -DNDEBUG.
common=(-G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"
        -DGAC_WITH_CUDA=OFF -DGAC_BUILD_BENCHMARKS=OFF -DGAC_BUILD_EXAMPLES=OFF -DGAC_BUILD_TESTS=ON
        "${launcher[@]}")

# The options apply to the test discovery at build time as well.
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$root/tests/sanitizers/ubsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/sanitizers/tsan.supp"
if [ -x /usr/bin/llvm-symbolizer-14 ]; then
  export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14 TSAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14
  export UBSAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14
fi

build_and_test() {  # dir, cmake arguments...
  local dir=$1
  shift
  cmake -S . -B "$dir" "${common[@]}" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  if [ "${GAC_SANITIZE_TEST:-1}" != 0 ]; then
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 900 "${ctest_args[@]}"
  fi
}
ctest_args=("$@")

if [ "$what" = asan ] || [ "$what" = all ]; then
  echo "sanitize: AddressSanitizer + UndefinedBehaviorSanitizer (${GAC_ASAN_DIR:-build-asan})"
  build_and_test "${GAC_ASAN_DIR:-build-asan}" -DGAC_SANITIZE=address,undefined -DGAC_BUILD_FUZZERS=ON
fi
if [ "$what" = tsan ] || [ "$what" = all ]; then
  echo "sanitize: ThreadSanitizer (${GAC_TSAN_DIR:-build-tsan})"
  build_and_test "${GAC_TSAN_DIR:-build-tsan}" -DGAC_SANITIZE=thread -DGAC_WITH_TORCH=OFF
fi
