#!/usr/bin/env bash
# Installs the Debian packages gac builds with, and the npm packages of
# gacd's page (web/package-lock.json). Idempotent: installs only what is
# missing, and runs apt-get update only then. Needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build git
  libtorch-dev libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libsqlite3-dev prometheus openssl
  # The PostgreSQL store (libpq) and the PostgreSQL 15 server its tests start.
  libpq-dev postgresql
  libgtest-dev libgmock-dev
  # The checking builds (scripts/sanitize.sh, scripts/fuzz.sh): clang with its
  # sanitizer and libFuzzer runtimes, llvm-symbolizer for readable reports.
  clang-14 libclang-rt-14-dev llvm-14
  python3-yaml python3-matplotlib
  # The gac Python package: headers and pybind11 to build it, Debian's torch
  # (the same LibTorch as libtorch-dev) to run it, pytest and mypy for its
  # tests, venv and wheel for the documented pip install into a venv.
  python3-dev pybind11-dev python3-torch python3-pytest python3-mypy python3-venv python3-wheel
  # gacctl's CSV export is checked by loading it with pandas (tests/cli).
  python3-pandas
  # LibTorch's BLAS: Debian's libtorch links the reference BLAS unless this
  # optimised one is installed (the example trainer runs about 5x faster).
  libopenblas0-pthread
  # gacd's HTTP port (/metrics, the JSON API, the page) and the page's
  # browser test (headless).
  libcivetweb-dev zlib1g-dev chromium
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm for the page's charting library: Debian's, unless a node is installed.
command -v npm >/dev/null || missing+=(nodejs npm)
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all packages present"

# The page's charting library, compiled into gacd, and the browser test's
# driver: exactly the versions of web/package-lock.json, fetched again only
# when the lock file is newer than the last install.
if [ ! -f web/node_modules/.package-lock.json ] || [ web/package-lock.json -nt web/node_modules/.package-lock.json ]; then
  echo "setup: npm ci in web/"
  npm ci --prefix web --no-audit --no-fund --loglevel=error
  touch web/node_modules/.package-lock.json
fi
echo "setup: web/node_modules matches web/package-lock.json"
