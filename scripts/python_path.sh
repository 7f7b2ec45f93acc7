#!/usr/bin/env bash
# Makes Debian's python3 import the gac Python package of a build: writes
# gac.pth (one line: BUILD_DIR/python, absolute) into the interpreter's
# site directory (/usr/local/lib/python3.X/dist-packages when writable, as
# root; else the user's site directory). The package is then used from the
# build tree, so a rebuild needs no reinstall. scripts/build.sh runs it after
# every build that has the package (GAC_PYTHON_PATH=0 skips it); for a
# virtual environment use pip instead (docs/PYTHON.md).
#   usage: scripts/python_path.sh [BUILD_DIR (default: build)]
set -euo pipefail
cd "$(dirname "$0")/.."
stage="$(cd "${1:-build}" && pwd)/python"
python=${GAC_PYTHON:-/usr/bin/python3}
if [ ! -f "$stage/gac/__init__.py" ]; then
  echo "python_path: $stage has no gac package (configure with -DGAC_WITH_PYTHON=ON)" >&2
  exit 1
fi
site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
if ! { mkdir -p "$site" 2>/dev/null && [ -w "$site" ]; }; then
  site=$("$python" -m site --user-site)
  mkdir -p "$site"
fi
echo "$stage" > "$site/gac.pth"
echo "python: $python imports gac from $stage ($site/gac.pth)"
