#!/usr/bin/env bash
# Makes ./gpu-pydeps (ignored by git): pytest and pybind11, pure Python, the
# versions of this checkout's .venv, for the GPU machine, whose image has
# PyTorch but may lack them and reaches no package index. Carry the folder
# to that machine with the working tree; scripts/gpu_check.sh puts it on
# PYTHONPATH, which lets CMake find pybind11 for the Python package and the
# `python` step run the package's CUDA tests.
#
#   scripts/gpu_pydeps.sh [PYTHON_VERSION]   (default 3.10: works for 3.10 and newer)
set -eu -o pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
py=$repo/.venv/bin/python
[ -x "$py" ] || { echo "gpu_pydeps: $py not found: run scripts/setup.sh first" >&2; exit 1; }
target=$repo/gpu-pydeps
version=$("$py" -c 'import pytest, pybind11; print(f"pytest=={pytest.__version__} pybind11=={pybind11.__version__}")')
rm -rf "$target"
# shellcheck disable=SC2086
"$py" -m pip install --quiet --disable-pip-version-check --target "$target" --python-version "${1:-3.10}" \
  --only-binary=:all: $version
echo "gpu_pydeps: $version in $target ($(du -sh "$target" | cut -f1))"
