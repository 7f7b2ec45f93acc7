#!/usr/bin/env bash
# Configures and builds gac into ${GAC_BUILD_DIR:-build} (Release, Ninja).
# Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${GAC_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j "${GAC_JOBS:-$(nproc)}"
