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
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
cmake --build "$build_dir" -j "${GAC_JOBS:-$(nproc)}"
# The Python package, when built: Debian's python3 imports it from this build.
if [ "${GAC_PYTHON_PATH:-1}" != 0 ] && [ -f "$build_dir/python/gac/__init__.py" ]; then
  bash scripts/python_path.sh "$build_dir"
fi
