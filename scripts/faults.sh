#!/usr/bin/env bash
# The network fault suite in its full form (each fault 60 s unless
# --fault-seconds says otherwise; about 10 minutes), on hosts made of network
# namespaces: see tests/faults/faults.py. ctest runs the short form
# (faults_short). Needs root, nftables, iproute2 (tc) and PostgreSQL
# (scripts/setup.sh installs them). Arguments go to faults.py, e.g.
#   bash scripts/faults.sh --case partition --fault-seconds 300 --report /tmp/faults.md
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${GAC_BUILD_DIR:-build}
cmake --build "$build_dir" --target gacd fault_trainer -j "${GAC_JOBS:-$(nproc)}" >/dev/null
exec python3 tests/faults/faults.py --gacd "$build_dir/server/gacd" \
  --trainer "$build_dir/tests/faults/fault_trainer" "$@"
