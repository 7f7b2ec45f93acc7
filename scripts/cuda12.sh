#!/usr/bin/env bash
# Installs the CUDA 12.9 toolchain of the gac wheel's kernels into .cuda12/
# in the checkout (pip --target; exactly python/requirements-cuda12.txt: NVRTC,
# nvFatbin, the static runtime and libcu++ headers, and cuobjdump for
# scripts/wheel_archs.sh), and prints the folder to configure the wheel with:
#   pip wheel . -C cmake.define.GAC_CUDA_NVRTC_ROOT="$(scripts/cuda12.sh)"
# Idempotent: installs again only when the requirements file changed.
# Progress goes to stderr, the path alone to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/requirements-cuda12.txt
dest=.cuda12
py=.venv/bin/python
[ -x "$py" ] || py=python3
if ! cmp -s "$req" "$dest/gac-requirements.txt"; then
  echo "cuda12: pip install -r $req into $dest (log: $dest/pip.log)" >&2
  rm -rf "$dest"
  mkdir -p "$dest"
  # --no-deps: the packages need none, and the list is the whole toolchain.
  "$py" -m pip install --disable-pip-version-check --progress-bar off --no-input --no-deps \
    --target "$dest/site" -r "$req" > "$dest/pip.log" 2>&1 || { tail -20 "$dest/pip.log" >&2; exit 1; }
  cp "$req" "$dest/gac-requirements.txt"
fi
echo "$PWD/$dest/site/nvidia"
