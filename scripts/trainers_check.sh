#!/usr/bin/env bash
# GAC inside the trainers' own code from PyPI: verl 0.9.1, torchtitan 0.3.0
# (tests/python/test_trainers_pypi.py) and megatron-core 0.19.2
# (tests/python/test_megatron.py). Installs tests/python/
# requirements-trainers.txt with --no-deps into .venv-trainers, a venv that
# sees the .venv's packages through a .pth file (torch 2.15.0 is not
# downloaded twice), once, and afresh only when that file changes (kept
# outside the checkout for every clone: scripts/venv.sh); then runs
# the tests there against the gac package of a build (BUILD_DIR/python, as
# ctest does), with a missing trainer a failure rather than a skip.
#   usage: scripts/trainers_check.sh [BUILD_DIR (default: $GAC_BUILD_DIR or build)]
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
stage="$(cd "${1:-${GAC_BUILD_DIR:-build}}" && pwd)/python"
if [ ! -f "$stage/gac/__init__.py" ]; then
  echo "trainers_check: $stage has no gac package (build with scripts/build.sh first)" >&2
  exit 1
fi

venv=$src/.venv-trainers
req=tests/python/requirements-trainers.txt
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
# --ignore-requires-python: megatron-core 0.19.2 says >=3.12 and runs on 3.11
# (the requirements file says why).
gac_venv --label trainers_check --python /usr/bin/python3 --share .venv/bin/python --pip-arg --no-deps \
  --pip-arg --ignore-requires-python "$venv" "$req"

run() {
  env PYTHONPATH="$stage" GAC_SOURCE_DIR="$src" GAC_TRAINERS=required PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 \
    "$venv/bin/python" "$@"
}
run -c 'import gac, torch, importlib.metadata as m
print("trainers_check: verl", m.version("verl") + ", torchtitan", m.version("torchtitan") + ", megatron-core",
      m.version("megatron-core") + ", torch",
      torch.__version__ + ", gac from", gac.__file__)'
run -m pytest -q -p no:cacheprovider tests/python/test_trainers_pypi.py tests/python/test_megatron.py
