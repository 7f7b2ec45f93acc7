#!/usr/bin/env bash
# The gac wheels where trainers run them: builds one wheel per CPython
# (scripts/wheel.sh), checks what each carries (no torch library among what
# its modules need, gac.v1's generated modules, the CUDA kernels'
# architectures), and installs each, not rebuilt (`pip install --no-index
# --only-binary :all:`), into environments of PyPI packages only, one pair
# of CPython and torch per line of the table below:
#   3.10 + torch 2.6.0    the oldest pair gac supports
#   3.11 + torch 2.15.0   the project's own (.venv's packages, through a .pth file)
#   3.12 + torch 2.11.0   the trainer images' Python and the GPU machine's torch
#   3.13 + torch 2.15.0
# Each environment (.venv-pyXY-torchNN) is made once from its requirements
# file (tests/python/requirements-pyXY-torchNN.txt) and again only when that
# file changes, outside the checkout for every clone (scripts/venv.sh; its
# lock is held while the wheel is installed and tested there). In each, the
# package's tests run against the installed wheel (not the build tree): the
# fp64-reference parity tests, the errors, the controller, the multi-process
# Gloo tests and gac.attach; and `python -m gac --json` must name the same
# Python and torch. Part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
bash scripts/wheel.sh dist > /dev/null
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

for wheel in "$src"/dist/gac-*.whl; do
  name=$(basename "$wheel")
  rm -rf "$scratch/unpacked"
  .venv/bin/python -m zipfile -e "$wheel" "$scratch/unpacked"
  # No torch library among what the modules need.
  needed=$(for so in "$scratch"/unpacked/gac/*.so; do readelf -d "$so" | awk '/NEEDED/ {print $5}'; done | sort -u | tr -d '[]')
  if echo "$needed" | grep -E '^lib(torch|c10|shm)'; then
    echo "wheel_check: $name: a module links torch" >&2
    exit 1
  fi
  # gac.v1, the generated gRPC modules of gac's own .proto.
  for f in telemetry control query; do
    for g in "${f}_pb2.py" "${f}_pb2.pyi" "${f}_pb2_grpc.py"; do
      [ -f "$scratch/unpacked/gac/v1/$g" ] || { echo "wheel_check: $name: gac/v1/$g is missing" >&2; exit 1; }
    done
  done
  # The CUDA kernels' images (cuobjdump): sm_80 to sm_120 and PTX.
  archs=""
  [ "${GAC_WHEEL_CUDA:-1}" = 0 ] || archs=", $(bash scripts/wheel_archs.sh "$wheel" | tail -1)"
  echo "wheel_check: $name ($(du -k "$wheel" | cut -f1) KiB), modules need $(echo $needed)$archs"
done

run_tests() {  # VENV LABEL
  local venv=$1 label=$2 tag wheel
  tag=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  wheel=$(ls "$src"/dist/gac-*-"$tag"-"$tag"-*.whl)
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet --no-index --only-binary :all: \
    --no-deps --force-reinstall "$wheel"
  (cd "$scratch" &&
   export GAC_SOURCE_DIR="$src" PYTHONDONTWRITEBYTECODE=1 GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 &&
   env -u PYTHONPATH "$venv/bin/python" - "$label" <<'EOF' &&
import json, subprocess, sys
import gac, torch
assert "site-packages" in gac.__file__, gac.__file__
info = json.loads(subprocess.run([sys.executable, "-m", "gac", "--json"], check=True, capture_output=True, text=True).stdout)
assert info["python"] == sys.version.split()[0], info["python"]
assert info["torch"]["version"] == torch.__version__, info["torch"]
assert info["cuda_runtime"] == "12.9" and "sm_80" in info["cuda_archs"] and "compute_120" in info["cuda_archs"], info
print(f"wheel_check: {sys.argv[1]}: gac {info['version']} ({info['wheel']}), torch {torch.__version__}, "
      f"CUDA runtime {info['cuda_runtime']} ({' '.join(info['cuda_archs'])}), from {gac.__file__}")
EOF
   env -u PYTHONPATH "$venv/bin/python" -m pytest -q -p no:cacheprovider "$src/tests/python/test_agent.py" \
     "$src/tests/python/test_errors.py" "$src/tests/python/test_controller.py" \
     "$src/tests/python/test_distributed.py" "$src/tests/python/test_attach_control.py")
}

# 3.11 + torch 2.15.0: a fresh venv of Debian's python3 that sees the .venv's packages.
own=$src/build/wheel-venv-torch215
rm -rf "$own"
/usr/bin/python3 -m venv "$own"
gac_venv_share .venv/bin/python "$own"
run_tests "$own" "CPython 3.11 + torch 2.15.0"

while read -r v torch_version; do
  id=py${v/./}-torch${torch_version%.*}
  id=${id//./}
  # Held while the wheel is installed into it and tested: another run's wheel
  # must not replace this one's meanwhile.
  gac_venv --label wheel_check --python "$v" --hold "$src/.venv-$id" "tests/python/requirements-$id.txt"
  run_tests "$src/.venv-$id" "CPython $v + torch $torch_version"
  gac_venv_release
done <<'EOF'
3.10 2.6.0
3.12 2.11.0
3.13 2.15.0
EOF
echo "wheel_check: every wheel passed: CPython 3.10 + torch 2.6.0, 3.11 + 2.15.0, 3.12 + 2.11.0, 3.13 + 2.15.0"
