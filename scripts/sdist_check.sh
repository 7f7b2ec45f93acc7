#!/usr/bin/env bash
# The source distribution: builds dist/gac-VERSION.tar.gz, then installs it
# with pip as a user would, (1) on this machine, which has the build
# dependencies (the package must build, import and decide), and (2) with
# gRPC hidden from CMake, where pip must stop with gac's one line naming
# what is missing and how to install it. Part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
env=build/wheel-env/cp311  # scikit-build-core and pybind11 (scripts/wheel.sh made it)
[ -x "$env/bin/python" ] || { echo "sdist_check: no $env (run scripts/wheel.sh first)" >&2; exit 1; }
mkdir -p dist
rm -f dist/gac-*.tar.gz
"$env/bin/python" -c 'from scikit_build_core.build import build_sdist; build_sdist("dist")' > build/sdist.log 2>&1 ||
  { cat build/sdist.log >&2; exit 1; }
sdist=$(ls dist/gac-*.tar.gz)
echo "sdist_check: $sdist ($(du -k "$sdist" | cut -f1) KiB, $(tar tzf "$sdist" | wc -l) files)"

work=build/sdist-check
rm -rf "$work"
mkdir -p "$work"
venv=$work/venv
"$env/bin/python" -m venv "$venv"
# It sees the build environment's backend (scikit-build-core, pybind11), nothing else.
"$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
  > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/build-env.pth"
# Unpacked at a fixed place, so that the compiler cache serves it (paths
# relative to its root, as scripts/wheel.sh's builds are to the checkout's).
tar xzf "$sdist" -C "$work"
root=$PWD/$work/$(basename "$sdist" .tar.gz)
install() {  # pip install of the unpacked sdist, with these extra arguments
  CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1 "$venv/bin/python" -m pip install --disable-pip-version-check \
    --no-build-isolation --no-deps --no-index -v \
    --config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache || true)" \
    --config-settings=build-dir=build/wheel-cp311 "$@" "$root"
}

# (2) Without gRPC's CMake files: gac's line, and nothing installed.
if install --config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_gRPC=ON > "$work/pip-missing.log" 2>&1; then
  echo "sdist_check: the build without gRPC succeeded" >&2
  exit 1
fi
line=$(grep -o "gac: building from source needs gRPC.*install a prebuilt gac wheel" "$work/pip-missing.log" | head -1)
[ -n "$line" ] || { tail -30 "$work/pip-missing.log" >&2; echo "sdist_check: no line naming what is missing" >&2; exit 1; }
echo "sdist_check: without gRPC, pip stops with: $line"
rm -rf "$root/build"

# (1) With everything: builds, installs, imports, decides.
install > "$work/pip.log" 2>&1 || { tail -30 "$work/pip.log" >&2; exit 1; }
(cd "$work" && env -u PYTHONPATH "$PWD/venv/bin/python" -c '
import gac
c = gac.Controller(c_low=0.05, c_high=0.3)
d = c.decide(dot=0.5, grad_sq=1.0, ref_sq=1.0)
assert d.regime == "skip", d.regime
print(f"sdist_check: built from the sdist and imported: gac {gac.__version__} from {gac.__file__}, cos 0.5 -> {d.regime}")')
