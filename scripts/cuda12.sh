#!/usr/bin/env bash
# Installs the CUDA 12.9 toolchain of the gac wheel's kernels into .cuda12/
# in the checkout (pip --target; exactly python/requirements-cuda12.txt: NVRTC,
# nvFatbin, the static runtime and libcu++ headers, and cuobjdump for
# scripts/wheel_archs.sh), and prints the folder to configure the wheel with:
#   pip wheel . -C cmake.define.GAC_CUDA_NVRTC_ROOT="$(scripts/cuda12.sh)"
# Idempotent: installs again only when the requirements file changed; the
# packages (.cuda12/site) are a link to their copy kept outside the checkout
# for every clone (scripts/venv.sh; GAC_VENV_CACHE=off keeps them here).
# Progress goes to stderr, the path alone to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/requirements-cuda12.txt
dest=.cuda12
py=.venv/bin/python
[ -x "$py" ] || py=python3
# A .cuda12 made before scripts/venv.sh kept its requirements beside site/.
if [ -d "$dest/site" ] && [ ! -L "$dest/site" ] && [ ! -e "$dest/site/gac-requirements.txt" ] &&
   cmp -s "$req" "$dest/gac-requirements.txt"; then
  cp "$req" "$dest/site/gac-requirements.txt"
fi
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
# --no-deps: the packages need none, and the list is the whole toolchain.
gac_venv --label cuda12 --python "$py" --name cuda12 --target --quiet --pip-arg --no-deps "$dest/site" "$req" >&2
echo "$PWD/$dest/site/nvidia"
