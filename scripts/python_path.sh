#!/usr/bin/env bash
# Makes the checkout's Python environment (.venv, scripts/setup.sh) import
# the gac Python package of a build: writes gac.pth (one line:
# BUILD_DIR/python, absolute) into its site-packages. The package is then
# used from the build tree, so a rebuild needs no reinstall.
# scripts/build.sh runs it after every build that has the package
# (GAC_PYTHON_PATH=0 skips it); GAC_PYTHON names another interpreter (its
# torch must be the one the package was built against).
#   usage: scripts/python_path.sh [BUILD_DIR (default: build)]
set -euo pipefail
cd "$(dirname "$0")/.."
stage="$(cd "${1:-build}" && pwd)/python"
python=${GAC_PYTHON:-.venv/bin/python}
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
