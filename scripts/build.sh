#!/usr/bin/env bash
# Configures and builds gac into ${GAC_BUILD_DIR:-build} (Release, Ninja).
# Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${GAC_BUILD_DIR:-build}
launcher=()
# A compiler cache, when one is installed, makes rebuilds of unchanged
# sources instant (GAC_CCACHE=0 turns it off).
if [ "${GAC_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  # Paths relative to the checkout: another clone of it hits the same entries.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
# Configure quietly, but say what is built (torch's version, the CUDA parts).
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" > "$build_dir/configure.log" 2>&1 ||
  { cat "$build_dir/configure.log"; exit 1; }
sed -n 's/^-- \(gac [0-9.]*: .*\)/build: \1/p' "$build_dir/configure.log"
cmake --build "$build_dir" -j "${GAC_JOBS:-$(nproc)}"
# The Python package, when built: .venv/bin/python imports it from this build.
if [ "${GAC_PYTHON_PATH:-1}" != 0 ] && [ -f "$build_dir/python/gac/__init__.py" ]; then
  bash scripts/python_path.sh "$build_dir"
fi
