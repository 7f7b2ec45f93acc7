#!/usr/bin/env bash
# The CUDA kernels' compile matrix, without a GPU: compiles the wheel's
# kernels with NVRTC 12.9 for every architecture of pyproject.toml's
# GAC_CUDA_ARCHITECTURES exactly as the wheel's build does, and fails when
# an image lacks a kernel that kernel_library.cc launches by name (or has one
# it does not name), when a kernel's parameters exceed kKernelParamBytes,
# when ptxas spills more than the bound, or gives a kernel more registers
# than its __launch_bounds__ allows; prints ptxas's registers, spills and
# stack frame per kernel and architecture
# (agent/src/cuda/check_kernels.py). Part of scripts/test.sh.
#   usage: scripts/kernel_check.sh [check_kernels.py's options: --max-spill-bytes N, --names-from FILE, ...]
# Exit status: 0 when every check passes, 1 otherwise (the toolchain
# included: when scripts/cuda12.sh cannot install it, the check fails, it is
# never skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia=$(bash scripts/cuda12.sh) || { echo "kernel_check: scripts/cuda12.sh failed: no CUDA 12.9 toolchain" >&2; exit 1; }
py=.venv/bin/python
[ -x "$py" ] || py=python3
exec "$py" agent/src/cuda/check_kernels.py --nvidia "$nvidia" "$@"
