#!/usr/bin/env bash
# Installs the Debian packages gac builds with; the Python environment .venv
# (from Debian's /usr/bin/python3, 3.11; a link to its copy kept outside the
# checkout for every clone, scripts/venv.sh) with exactly the
# packages of requirements.txt: torch from PyPI, its CUDA 13 runtime and NCCL
# wheels, the CUDA compiler of the same CUDA release, and the Python tools;
# and the npm packages of gacd's page (web/package-lock.json). Idempotent:
# installs only what is missing or changed, and runs apt-get update only
# then. Needs root (or sudo) for the Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build git
  # The compiler cache of scripts/build.sh: the test command builds the tree
  # several times (Release, sanitizers, a wheel per CPython).
  ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libsqlite3-dev prometheus openssl
  # The PostgreSQL store (libpq) and the PostgreSQL 15 server its tests start.
  libpq-dev postgresql
  libgtest-dev libgmock-dev
  # Gloo's headers: torch's ProcessGroupGloo.hpp includes them and the torch
  # wheel ships none (tests/agent/sharded_test.cc builds Gloo groups).
  libgloo-dev
  # The network fault suite (tests/faults): nft for DROP rules, tc for
  # shaping the links of its namespaces.
  nftables iproute2
  # The checking builds (scripts/sanitize.sh, scripts/fuzz.sh): clang with its
  # sanitizer and libFuzzer runtimes, llvm-symbolizer for readable reports.
  clang-14 libclang-rt-14-dev llvm-14
  # The Python environment (.venv, below) and the headers the gac Python
  # package is compiled against.
  python3-dev python3-venv
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

# The Python environment: torch (the one LibTorch of the whole project: the
# C++ agent, the examples, the benchmarks, the tests and the Python package),
# nvcc, pytest, mypy, pybind11, matplotlib, pandas, PyYAML, every one pinned
# with its dependencies in requirements.txt. Debian's python3, not one
# earlier on the PATH, and no system site-packages: nothing but these
# packages. Made again only when requirements.txt changes (about 3 GB to
# download the first time), and kept outside the checkout for every clone
# on this machine (scripts/venv.sh; GAC_VENV_CACHE=off keeps it in .venv).
# One line per package as progress; the whole log in the environment's
# pip.log. DeepSpeed comes as an sdist: built without its ops (compiled on use).
venv=.venv
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
gac_venv --label setup --python /usr/bin/python3 --progress --check \
  --env DS_BUILD_OPS=0 --env DS_ACCELERATOR=cpu --pip-arg --require-virtualenv "$venv" requirements.txt
echo "setup: $venv matches requirements.txt ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"

# The page's charting library, compiled into gacd, and the browser test's
# driver: exactly the versions of web/package-lock.json, fetched again only
# when the lock file is newer than the last install.
if [ ! -f web/node_modules/.package-lock.json ] || [ web/package-lock.json -nt web/node_modules/.package-lock.json ]; then
  echo "setup: npm ci in web/"
  npm ci --prefix web --no-audit --no-fund --loglevel=error
  touch web/node_modules/.package-lock.json
fi
echo "setup: web/node_modules matches web/package-lock.json"
