#!/usr/bin/env bash
# One wheel, two torches: builds the gac wheel (scripts/wheel.sh), checks
# that its native modules name no torch library, and installs that one
# file, not rebuilt, into two virtual environments of PyPI packages only:
#   build/wheel-venv-torch215  torch 2.15.0, requirements.txt's (the .venv's
#                              packages, through a .pth file: no second download)
#   .venv-torch26              torch 2.6.0 (tests/python/requirements-torch26.txt,
#                              installed once, again only when that file changes)
# and runs the package's tests in each against the installed wheel (not the
# build tree): the fp64-reference parity tests, the errors, the controller,
# and the multi-process Gloo tests. Part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
bash scripts/wheel.sh dist > /dev/null
wheel=$(ls "$src"/dist/gac-*.whl)
echo "wheel_check: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

# No torch library among what the modules need.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 -m zipfile -e "$wheel" "$scratch/unpacked"
needed=$(for so in "$scratch"/unpacked/gac/*.so; do readelf -d "$so" | awk '/NEEDED/ {print $5}'; done | sort -u | tr -d '[]')
if echo "$needed" | grep -E '^lib(torch|c10|shm)'; then
  echo "wheel_check: a module of the wheel links torch" >&2
  exit 1
fi
echo "wheel_check: the modules need $(echo "$needed" | tr '\n' ' ')"
# gac.v1, the generated gRPC modules of gac's own .proto, is in the wheel.
for name in telemetry control query; do
  for f in "${name}_pb2.py" "${name}_pb2.pyi" "${name}_pb2_grpc.py"; do
    [ -f "$scratch/unpacked/gac/v1/$f" ] || { echo "wheel_check: gac/v1/$f is not in the wheel" >&2; exit 1; }
  done
done

run_tests() {  # venv label
  local venv=$1 label=$2
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps --force-reinstall "$wheel"
  (cd "$scratch" &&
   env -u PYTHONPATH GAC_SOURCE_DIR="$src" PYTHONDONTWRITEBYTECODE=1 GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 \
     "$venv/bin/python" -c 'import gac, torch, sys; assert "site-packages" in gac.__file__, gac.__file__; print(f"wheel_check: {sys.argv[1]}: torch {torch.__version__}, gac from {gac.__file__}")' "$label" &&
   env -u PYTHONPATH GAC_SOURCE_DIR="$src" PYTHONDONTWRITEBYTECODE=1 GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 \
     "$venv/bin/python" -m pytest -q -p no:cacheprovider "$src/tests/python/test_agent.py" \
       "$src/tests/python/test_errors.py" "$src/tests/python/test_controller.py" \
       "$src/tests/python/test_distributed.py")
}

# torch 2.15.0: a fresh venv that sees the .venv's packages.
new=$src/build/wheel-venv-torch215
rm -rf "$new"
/usr/bin/python3 -m venv "$new"
"$new/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$scratch/site"
.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$(cat "$scratch/site")/torch-env.pth"
run_tests "$new" "torch 2.15"

# torch 2.6.0: its own venv, PyPI only.
old=$src/.venv-torch26
req=tests/python/requirements-torch26.txt
[ -x "$old/bin/python" ] || /usr/bin/python3 -m venv "$old"
if ! cmp -s "$req" "$old/gac-requirements.txt"; then
  echo "wheel_check: pip install -r $req into $old (log: $old/pip.log)"
  "$old/bin/python" -m pip install --disable-pip-version-check --progress-bar off --no-input -r "$req" \
    > "$old/pip.log" 2>&1 || { tail -20 "$old/pip.log" >&2; exit 1; }
  cp "$req" "$old/gac-requirements.txt"
fi
run_tests "$old" "torch 2.6"
echo "wheel_check: the same wheel passed under torch 2.15.0 and torch 2.6.0"
