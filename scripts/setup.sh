#!/usr/bin/env bash
# Installs the Debian packages gac builds with. Idempotent: installs only what
# is missing, and runs apt-get update only then. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build git
  libtorch-dev libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libsqlite3-dev prometheus openssl
  libgtest-dev libgmock-dev
  # The checking builds (scripts/sanitize.sh, scripts/fuzz.sh): clang with its
  # sanitizer and libFuzzer runtimes, llvm-symbolizer for readable reports.
  clang-14 libclang-rt-14-dev llvm-14
  python3-yaml python3-matplotlib
  # LibTorch's BLAS: Debian's libtorch links the reference BLAS unless this
  # optimised one is installed (the example trainer runs about 5x faster).
  libopenblas0-pthread
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all packages present"
