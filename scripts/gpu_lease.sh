#!/usr/bin/env bash
# The CUDA path on a GPU in one short lease: one command of at most 8
# minutes that builds nothing, run on the GPU machine in a copy of the
# working tree that carries gpu-lease/ (made here by --prep):
#
#   scripts/gpu_lease.sh --prep      here: builds and stages what the lease carries, prints the run
#   scripts/gpu_lease.sh --dry-run   here, without a GPU: --prep, then the lease with what can run
#   scripts/gpu_lease.sh             on the GPU machine: the lease; results in $OUT (default ./gpu-out)
#
# gpu-lease/ (ignored by git, about 30 MB) holds the cp312 wheel (dist/, from
# scripts/wheel.sh; GAC_LEASE_WHEEL_DIR names another folder), cuda_test
# (tests/cuda: the CUDA passes against an fp64 host reference, every dtype
# pair, 1,000 tensors in one launch, a tensor beyond 32-bit indexing when
# 8.5 GiB are free, non-finite input; built in build-gpuprep/ like the wheel:
# no LibTorch, no gRPC, the kernels compiled by NVRTC 12.9, which --prep
# checks are byte for byte the wheel's, and CUDA 12.9's static runtime; it
# needs glibc 2.34 and GCC 11's libstdc++, no libgtest), pytest for an image
# without it (scripts/gpu_pydeps.sh) and MANIFEST.txt.
#
# The lease, in order of what matters most, each step with its own time
# budget, the whole within GAC_LEASE_BUDGET_S (default 450 s; a step that
# would pass it is cut short or not run):
#   env        nvidia-smi, driver, gVisor (uname/proc version/dmesg), tools     env.txt
#   install    the wheel into a venv with --system-site-packages (pip
#              --no-index --no-deps), which sees the machine's torch
#              (a .pth file if the interpreter is itself a venv)                env.txt
#   gac        python -m gac --json: gac's kernels on this GPU                  gac.json
#   selftest   python -m gac --selftest --json: the kernels and the torch-ops
#              path on every device against fp64, and their step times       selftest.json
#   cuda_test  the torch-free CUDA tests                                        cuda_test.log
#   pytest     tests/python/test_cuda.py on the installed wheel                 pytest.log
#   sanitize   compute-sanitizer memcheck, racecheck, synccheck on cuda_test
#              (its 2^31-element case left out); says when it cannot attach
#              (e.g. gVisor)                                                    sanitizer.log
#   bench      bench/cuda_wheel_bench.py: the wheel's kernels on 50 M in 200
#              tensors, 2,000 small tensors and Llama-3-8B's 291 shapes in
#              bf16 against the D2D copy, torch._foreach_norm and
#              clip_grad_norm_(foreach=True)                                    bench.txt
# and summary.txt, one line per step, written as it goes (a run cut short
# still says how far it got). Exit status: 0 every step passed; 1 one
# failed; 2 none failed but one timed out or was not run.
#
# Environment: OUT (the result folder, set by the GPU machine), GAC_LEASE_PYTHON
# (the machine's Python 3.12 with torch; default python3.12, else python3;
# in --dry-run .venv-py312-torch211/bin/python, the same CPython and torch),
# GAC_LEASE_STEPS (a subset for a rerun, e.g. "sanitize bench"; env and
# install always run), GAC_LEASE_BENCH_ARGS (e.g. "--workloads a,b,o"),
# GAC_LEASE_SANITIZER_ARGS (extra compute-sanitizer options), GAC_LEASE_DIR
# (default gpu-lease), GAC_LEASE_BUDGET_S.
set -u -o pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
mode=run
case "${1:-}" in
  --prep) mode=prep ;;
  --dry-run) mode=dry ;;
  "") ;;
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_lease: unknown argument '$1' (--prep, --dry-run, or none)" >&2; exit 2 ;;
esac
lease=${GAC_LEASE_DIR:-$repo/gpu-lease}
build=$repo/build-gpuprep

die() { echo "gpu_lease: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# --prep: here, with the checkout's toolchain.

fatbin_sha() {  # ELF file -> sha256 of its .nv_fatbin section
  local tmp
  tmp=$(mktemp)
  objcopy -O binary --only-section=.nv_fatbin "$1" "$tmp" && [ -s "$tmp" ] && sha256sum < "$tmp" | cut -c1-64
  rm -f "$tmp"
}

prep() {
  local t0 nvidia archs wheel_dir wheel scratch so want got
  t0=$(date +%s)
  nvidia=$(bash scripts/cuda12.sh) || die "scripts/cuda12.sh failed"
  archs=$(sed -n 's/^GAC_CUDA_ARCHITECTURES = "\(.*\)"$/\1/p' pyproject.toml)
  [ -n "$archs" ] || die "no GAC_CUDA_ARCHITECTURES in pyproject.toml"
  local launcher=()
  command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  mkdir -p "$build"
  # The wheel's configuration (pyproject.toml, scripts/wheel.sh) without the
  # Python package: the kernels from the same fatbin cache, hence the same bytes.
  if ! cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGAC_WITH_TORCH=OFF -DGAC_WITH_GRPC=OFF \
       -DGAC_WITH_SERVER=OFF -DGAC_WITH_PYTHON=OFF -DGAC_WITH_NCCL=OFF -DGAC_BUILD_TESTS=ON \
       -DGAC_BUILD_BENCHMARKS=OFF -DGAC_BUILD_EXAMPLES=OFF -DGAC_CUDA_STATIC_RUNTIME=ON \
       -DGAC_CUDA_NVRTC_ROOT="$nvidia" -DGAC_CUDA_ARCHITECTURES="$archs" \
       -DGAC_CUDA_FATBIN_CACHE="$repo/.cuda12/fatbins" "${launcher[@]}" > "$build/prep-configure.log" 2>&1; then
    tail -30 "$build/prep-configure.log" >&2
    die "configure failed (log: $build/prep-configure.log)"
  fi
  if ! cmake --build "$build" --target cuda_test > "$build/prep-build.log" 2>&1; then
    tail -40 "$build/prep-build.log" >&2
    die "building cuda_test failed (log: $build/prep-build.log)"
  fi
  wheel_dir=${GAC_LEASE_WHEEL_DIR:-$repo/dist}
  wheel=$(ls "$wheel_dir"/gac-*-cp312-cp312-manylinux*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || die "no cp312 wheel in $wheel_dir: run scripts/wheel.sh (or GAC_WHEEL_PYTHONS=3.12 bash scripts/wheel.sh DIR, then GAC_LEASE_WHEEL_DIR=DIR)"
  # The test program must test the wheel's kernels: the same fatbin.
  scratch=$(mktemp -d)
  python3 -m zipfile -e "$wheel" "$scratch" || die "$wheel is not a zip file"
  so=$(ls "$scratch"/gac/_agent*.so 2>/dev/null | head -1)
  [ -n "$so" ] || { rm -rf "$scratch"; die "$wheel has no gac/_agent*.so"; }
  want=$(fatbin_sha "$so")
  got=$(fatbin_sha "$build/tests/cuda/cuda_test")
  rm -rf "$scratch"
  [ -n "$want" ] || die "$wheel's gac/_agent module has no CUDA kernels (.nv_fatbin): a GAC_WHEEL_CUDA=0 wheel?"
  [ "$want" = "$got" ] || die "cuda_test's kernels (fatbin $got) are not $(basename "$wheel")'s ($want): the wheel is older than the sources? rebuild it (scripts/wheel.sh)"
  if ! [ -f "$repo/gpu-pydeps/pytest/__init__.py" ]; then
    bash scripts/gpu_pydeps.sh 3.12 > /dev/null || die "scripts/gpu_pydeps.sh failed"
  fi
  rm -rf "$lease"
  mkdir -p "$lease/pydeps"
  cp "$wheel" "$lease/"
  cp "$build/tests/cuda/cuda_test" "$lease/"
  # pytest and what it imports; not pybind11 (nothing is built there).
  (cd "$repo/gpu-pydeps" && find . -mindepth 1 -maxdepth 1 ! -name 'pybind11*' ! -name bin ! -name __pycache__ \
     -exec cp -r {} "$lease/pydeps/" \;)
  find "$lease/pydeps" -name __pycache__ -type d -prune -exec rm -rf {} +
  {
    echo "gpu-lease staged $(date -u +%FT%TZ) by scripts/gpu_lease.sh --prep"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null) ($(git status --porcelain 2>/dev/null | wc -l) files changed or untracked)"
    echo "kernels: NVRTC $("$repo/.venv/bin/python" agent/src/cuda/build_fatbin.py --nvidia "$nvidia" --version 2>/dev/null || echo '?'), $archs; fatbin sha256 $got (the wheel's)"
    echo "cuda_test needs: $(objdump -T "$lease/cuda_test" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)," \
         "$(objdump -T "$lease/cuda_test" | grep -o 'GLIBCXX_[0-9.]*' | sort -Vu | tail -1);" \
         "$(readelf -d "$lease/cuda_test" | awk '/NEEDED/ {print $5}' | tr -d '[]' | tr '\n' ' ')"
    echo "pytest: $(ls -d "$lease"/pydeps/pytest-*.dist-info | xargs -n1 basename)"
    (cd "$lease" && sha256sum ./*.whl cuda_test)
  } > "$lease/MANIFEST.txt"
  echo "gpu_lease: staged $lease in $(( $(date +%s) - t0 )) s: $(du -sh "$lease" | cut -f1)" \
       "($(du -sh "$lease"/*.whl | cut -f1) wheel, $(du -sh "$lease/cuda_test" | cut -f1) cuda_test," \
       "$(du -sh "$lease/pydeps" | cut -f1) pydeps); the tree: $(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | awk '{printf "%.1f MB", $1 / 1e6}')"
  echo "gpu_lease: on the GPU machine: bash scripts/gpu_lease.sh (carry: $(realpath --relative-to="$repo" "$lease"))"
}

if [ "$mode" = prep ]; then
  prep
  exit $?
fi
if [ "$mode" = dry ]; then
  bash -n "$0" || die "$0 does not parse"
fi
if [ "$mode" = dry ] && [ "${GAC_LEASE_NO_PREP:-0}" != 1 ]; then
  prep || exit 1
fi

# ---------------------------------------------------------------------------
# The lease (and its dry run).

start=$(date +%s)
budget=${GAC_LEASE_BUDGET_S:-450}
deadline=$((start + budget))
if [ "$mode" = dry ]; then
  out=${GAC_LEASE_OUT:-$build/dry-run-out}
else
  out=${OUT:-$repo/gpu-out}
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
find "$out" -mindepth 1 -delete  # the folder itself may be the machine's
summary=$out/summary.txt
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
steps=${GAC_LEASE_STEPS:-gac selftest cuda_test pytest sanitize bench}
want() { [[ " $steps " == *" $1 "* ]]; }
failed=() incomplete=()

log() { echo "[gpu_lease +$(( $(date +%s) - start ))s] $*" | tee -a "$summary"; }
# The seconds a step may take: its own budget, or what the lease has left
# (less 15 s to write the summary), whichever is smaller.
allowed() {
  local left=$((deadline - $(date +%s) - 15))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
# cap FILE: at most 4 MB of it kept (its first and last 2 MB).
cap() {
  local size
  size=$(stat -c %s "$1")
  if [ "$size" -gt 4000000 ]; then
    { head -c 2000000 "$1"; printf '\n[... %d bytes left out ...]\n' $((size - 4000000)); tail -c 2000000 "$1"; } > "$1.cap"
    mv "$1.cap" "$1"
  fi
}
# run_timed NAME BUDGET LOG CMD...: CMD under timeout (its output appended to
# LOG); sets rc (124: timed out) and took; a budget spent before it starts
# leaves it not run (rc 125).
run_timed() {
  local name=$1 limit
  limit=$(allowed "$2")
  local file=$3
  shift 3
  if [ "$limit" -lt 10 ]; then
    rc=125 took=0
    echo "[$name: not run: the lease budget is spent]" >> "$file"
    return
  fi
  local t0
  t0=$(date +%s)
  echo "\$ $*   [budget ${limit} s]" >> "$file"
  timeout -k 10 "$limit" "$@" >> "$file" 2>&1
  rc=$?
  took=$(( $(date +%s) - t0 ))
  [ "$rc" -eq 137 ] && rc=124
  echo "[exit $rc after $took s]" >> "$file"
}
# verdict NAME CONDITION-RC DETAIL: PASS/FAIL/TIMEOUT/NOT RUN into the summary.
verdict() {
  local name=$1 ok=$2 detail=$3
  if [ "$rc" -eq 124 ]; then
    incomplete+=("$name"); log "$(printf '%-11s TIMEOUT  (%s s) %s' "$name" "$took" "$detail")"
  elif [ "$rc" -eq 125 ]; then
    incomplete+=("$name"); log "$(printf '%-11s NOT RUN  lease budget spent' "$name")"
  elif [ "$ok" -eq 0 ]; then
    log "$(printf '%-11s PASS     (%s s) %s' "$name" "$took" "$detail")"
  else
    failed+=("$name"); log "$(printf '%-11s FAIL     (%s s) %s' "$name" "$took" "$detail")"
  fi
}
# would CMD...: a GPU-only command, in the dry run: printed, not run.
would() { log "$(printf '%-11s would run on the GPU: %s' "$1" "$2")"; }

[ "$mode" = dry ] && log "DRY RUN on $(hostname) (no GPU expected): every step that can run here runs; GPU-only steps print their command"
log "lease budget ${budget} s; steps: env install $steps; results in $out"

# --- env ---------------------------------------------------------------------
wheel=$(ls "$lease"/gac-*-cp312-cp312-*.whl 2>/dev/null | head -1)
cuda_test=$lease/cuda_test
if [ -f "$cuda_test" ] && [ ! -x "$cuda_test" ]; then  # a copy that lost its mode bits
  cp "$cuda_test" "$scratch/cuda_test" && chmod +x "$scratch/cuda_test" && cuda_test=$scratch/cuda_test
fi
[ -n "$wheel" ] && [ -x "$cuda_test" ] && [ -f "$lease/pydeps/pytest/__init__.py" ] ||
  { log "env         FAIL     $lease lacks the wheel, cuda_test or pydeps/pytest: run scripts/gpu_lease.sh --prep here and carry $(basename "$lease")"; exit 1; }
if [ "$mode" = dry ]; then
  py=${GAC_LEASE_PYTHON:-$repo/.venv-py312-torch211/bin/python}
else
  # The first CPython 3.12 that imports torch, else the first 3.12.
  if [ -z "${GAC_LEASE_PYTHON:-}" ]; then
    for c in python3 python3.12 python; do
      command -v "$c" > /dev/null || continue
      if timeout 60 "$c" -c 'import sys, torch; sys.exit(sys.version_info[:2] != (3, 12))' 2> /dev/null; then
        py=$(command -v "$c")
        break
      fi
    done
  fi
  py=${GAC_LEASE_PYTHON:-${py:-$(command -v python3.12 || command -v python3)}}
fi
[ -x "$(command -v "$py")" ] || { log "env         FAIL     no Python ($py): set GAC_LEASE_PYTHON"; exit 1; }
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /usr/local/cuda-*/bin; do
  [ -d "$d" ] && PATH=$PATH:$d
done
sanitizer=$(command -v compute-sanitizer || true)
gvisor=no
if grep -qi gvisor /proc/version 2>/dev/null || dmesg 2>/dev/null | grep -qi gvisor; then
  gvisor="yes (/proc/version or dmesg)"
elif [ "$(uname -r)" = 4.4.0 ]; then
  gvisor="probably (kernel 4.4.0, gVisor's)"
fi
gpu_line=$(timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -1)
{
  echo "== gpu_lease $mode, $(date -u +%FT%TZ), $(hostname)"
  cat "$lease/MANIFEST.txt"
  echo "== uname: $(uname -a)"
  echo "== /proc/version: $(cat /proc/version 2>/dev/null)"
  echo "== gVisor: $gvisor"
  echo "== dmesg (head):"; dmesg 2>&1 | head -5
  echo "== os-release:"; grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release 2>/dev/null
  echo "== nvidia-smi:"; timeout 15 nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  echo "== nvcc: $(nvcc --version 2>&1 | tail -2 | tr '\n' ' ')"
  echo "== compute-sanitizer: ${sanitizer:-not found} $([ -n "$sanitizer" ] && "$sanitizer" --version 2>&1 | tail -1)"
  echo "== python: $py: $("$py" -c 'import sys; print(sys.version)' 2>&1)"
  echo "== torch: $(timeout 45 "$py" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"
  echo "== cuda_test: ldd:"; ldd "$cuda_test" 2>&1
  echo "== cpus $(nproc), memory $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}'), disk $(df -h "$scratch" | awk 'NR == 2 {print $4 " free"}')"
} > "$out/env.txt" 2>&1
log "$(printf '%-11s %s' env "GPU: ${gpu_line:-none visible (nvidia-smi)}; gVisor: $gvisor; compute-sanitizer: ${sanitizer:-not found}; python: $("$py" -c 'import sys; print(sys.version.split()[0])' 2>&1)")"
if [ "$mode" = run ] && [ -z "$gpu_line" ]; then
  log "env         no GPU visible to nvidia-smi: the GPU steps below will say what they see"
fi
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
[ "$pyver" = 3.12 ] || { log "env         FAIL     $py is CPython $pyver; the carried wheel is cp312: set GAC_LEASE_PYTHON"; exit 1; }

# --- install -------------------------------------------------------------------
# A venv that sees the machine's packages; pip if the venv has it, else the
# interpreter's own pip pointed at it.
venv=$scratch/venv
install_log=$scratch/install.log
install() {
  if "$py" -m venv --system-site-packages "$venv" && "$venv/bin/python" -m pip --version; then
    "$venv/bin/python" -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check "$wheel"
  else
    rm -rf "$venv"
    "$py" -m venv --system-site-packages --without-pip "$venv" &&
      "$py" -m pip --python "$venv/bin/python" install --no-index --no-deps --no-cache-dir "$wheel"
  fi || return 1
  # An interpreter that is itself a venv: its packages (torch) reach the new
  # one through a .pth file.
  if ! "$venv/bin/python" -c 'import torch' 2> /dev/null; then
    local site
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$py" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
      > "$site/zz_gac_lease_machine_packages.pth"
    echo "torch reached through $site/zz_gac_lease_machine_packages.pth: $(tr '\n' ' ' < "$site/zz_gac_lease_machine_packages.pth")"
  fi
  "$venv/bin/python" - "$venv" <<'EOF'
import sys
import gac, torch
assert gac.__file__.startswith(sys.argv[1]), f"gac imported from {gac.__file__}, not the venv"
print(f"installed: gac {gac.__version__} at {gac.__file__}; torch {torch.__version__} at {torch.__file__}")
EOF
}
rc=0 took=0
t0=$(date +%s)
export -f install
export py venv wheel
timeout -k 5 120 bash -c install >> "$install_log" 2>&1
rc=$?
took=$(( $(date +%s) - t0 ))
{ echo "== install:"; cat "$install_log"; } >> "$out/env.txt"
verdict install "$rc" "$(basename "$wheel") into a venv on $py: $(grep '^installed:' "$install_log" | cut -c12-)"
if [ "$rc" -ne 0 ]; then
  tail -5 "$install_log" | tee -a "$summary"
  log "RESULT: FAIL (the wheel does not install; nothing else runs)"
  exit 1
fi
vpy=$venv/bin/python

# --- gac ---------------------------------------------------------------------
if want gac; then
  run_timed gac 30 "$scratch/gac.err" "$vpy" -m gac --json
  # The JSON is stdout's; the command line and exit lines are the wrapper's.
  sed -n '/^{/,/^}/p' "$scratch/gac.err" > "$out/gac.json"
  detail=$("$vpy" - "$out/gac.json" <<'EOF' 2>&1
import json, sys
i = json.load(open(sys.argv[1]))
gpus = "; ".join(f"{g['name']} sm_{g['compute_capability'].replace('.', '')}: kernels {g['kernels']}" for g in i["gpus"])
print(f"driver {i['cuda_driver']}, {gpus or 'no GPU'} ({i['cuda_error'] or 'no error'}); runtime {i['cuda_runtime']}"
      f" static; problems: {i['problems'] or 'none'}")
EOF
)
  ok=$rc
  [ "$mode" = run ] && ! grep -q '"kernels_run": true' "$out/gac.json" && ok=1
  verdict gac "$ok" "$detail"
fi

# --- selftest ------------------------------------------------------------------
if want selftest; then
  run_timed selftest 90 "$scratch/selftest.err" "$vpy" -m gac --selftest --json
  sed -n '/^{/,/^}/p' "$scratch/selftest.err" > "$out/selftest.json"
  detail=$("$vpy" - "$out/selftest.json" <<'EOF' 2>&1
import json, sys
s = json.load(open(sys.argv[1]))["selftest"]
rows = {}
for r in s["results"]:
    key = f"{r['device']} {r['path']}"
    ok, worst = rows.get(key, (True, 0.0))
    rows[key] = (ok and r["ok"], max(worst, r.get("stats_relative_error", float("inf"))))
print("; ".join(f"{k}: {'ok' if ok else 'OFF'} (stats {w:.1e})" for k, (ok, w) in rows.items())
      + f"; problems: {s['problems'] or 'none'}")
EOF
)
  ok=$rc
  [ "$mode" = run ] && ! grep -q '"cuda' "$out/selftest.json" && ok=1  # the GPU must be among the devices
  verdict selftest "$ok" "$detail"
fi

# --- cuda_test -----------------------------------------------------------------
if want cuda_test; then
  run_timed cuda_test 120 "$out/cuda_test.log" "$cuda_test"
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$out/cuda_test.log" | grep -oE '[0-9]+$')
  skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$out/cuda_test.log" | sed 's/^\[  SKIPPED \] //; s/ (.*//' | sort -u)
  nskipped=$(echo "$skipped" | grep -c . || true)
  failed_tests=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$out/cuda_test.log" | sed 's/^\[  FAILED  \] //; s/ (.*//; s/, where .*//' | sort -u | tr '\n' ' ')
  ok=$rc
  if [ "$mode" = dry ]; then
    # Without a GPU: the host half passes, the GPU cases say so and skip.
    grep -q "no usable CUDA device" "$out/cuda_test.log" || ok=1
    detail="${passed:-0} passed, $nskipped skipped"
    if [ "$ok" -eq 0 ]; then
      detail+=" (no CUDA device here: the GPU cases skip, as they should)"
    else
      detail+=" (expected: exit 0, the host cases passed, the GPU cases skipped with 'no usable CUDA device')"
    fi
  else
    # On the GPU: only the no-GPU case, and the 2^31-element one when memory lacks, may skip.
    others=$(echo "$skipped" | grep -v -e WithoutGpuCreationFailsCleanly -e TensorBeyond32BitIndexing | grep . | tr '\n' ' ')
    [ -n "$others" ] && ok=1
    detail="${passed:-0} passed, $nskipped skipped ($(echo "$skipped" | tr '\n' ' '))"
    grep -q "TensorBeyond32BitIndexing" <<< "$skipped" && detail+="; the 2^31-element case was skipped: $(grep -oE 'needs [0-9]+ MiB of device memory, [0-9]+ MiB free' "$out/cuda_test.log" | head -1)"
  fi
  [ -n "$failed_tests" ] && detail+="; FAILED: $failed_tests"
  verdict cuda_test "$ok" "$detail"
  cap "$out/cuda_test.log"
fi

# --- pytest ----------------------------------------------------------------------
if want pytest; then
  pypath=""
  "$vpy" -c 'import pytest' 2> /dev/null || pypath=$lease/pydeps
  run_timed pytest 120 "$out/pytest.log" env -C "$repo/tests/python" PYTHONPATH="$pypath" GAC_SOURCE_DIR="$repo" \
    PYTHONDONTWRITEBYTECODE=1 "$vpy" -m pytest -q -rs -p no:cacheprovider test_cuda.py
  line=$(grep -E '(passed|skipped|failed|error)' "$out/pytest.log" | grep -E ' in [0-9.]+s' | tail -1)
  ok=$rc
  if [ "$mode" = dry ]; then
    echo "$line" | grep -q "skipped" && ! echo "$line" | grep -qE "passed|failed|error" || ok=1
  else
    echo "$line" | grep -qE "skipped|failed|error" && ok=1
  fi
  verdict pytest "$ok" "test_cuda.py on the installed wheel: ${line:-no pytest summary line}$([ -n "$pypath" ] && echo ' (pytest from pydeps)')"
  cap "$out/pytest.log"
fi

# --- sanitize --------------------------------------------------------------------
if want sanitize; then
  filter='--gtest_filter=-*Beyond32Bit*'
  budgets=(memcheck:75 racecheck:75 synccheck:45)
  if [ "$mode" = dry ] || [ -z "$sanitizer" ]; then
    for tb in "${budgets[@]}"; do
      would "sanitize" "compute-sanitizer --tool ${tb%%:*} --error-exitcode 3 --print-limit 50 ${GAC_LEASE_SANITIZER_ARGS:-}$([ -n "${GAC_LEASE_SANITIZER_ARGS:-}" ] && echo ' ')$cuda_test $filter --gtest_brief=1   [budget ${tb##*:} s]"
    done
    if [ -z "$sanitizer" ]; then
      if [ "$mode" = dry ]; then
        log "$(printf '%-11s %s' sanitize "compute-sanitizer not found here (no CUDA toolkit): nothing run, as expected")"
      else
        incomplete+=(sanitize)
        log "$(printf '%-11s NOT RUN  %s' sanitize "compute-sanitizer not found (PATH, /usr/local/cuda*/bin): the sanitizers did not run")"
      fi
    fi
  else
    : > "$out/sanitizer.log"
    for tb in "${budgets[@]}"; do
      tool=${tb%%:*}
      tlog=$scratch/sanitize_$tool.log
      # shellcheck disable=SC2086
      run_timed "sanitize $tool" "${tb##*:}" "$tlog" "$sanitizer" --tool "$tool" --error-exitcode 3 --print-limit 50 \
        ${GAC_LEASE_SANITIZER_ARGS:-} "$cuda_test" "$filter" --gtest_brief=1
      cap "$tlog"
      { echo "===== $tool"; cat "$tlog"; } >> "$out/sanitizer.log"
      summary_line=$(grep -E 'ERROR SUMMARY' "$tlog" | tail -1 | sed 's/^========= //')
      if [ "$rc" -ne 124 ] && [ "$rc" -ne 125 ] && [ -z "$summary_line" ]; then
        # The tool never reported: it did not attach to the program (not a
        # finding about the code: the run is incomplete, not failed).
        incomplete+=("$tool")
        log "$(printf '%-11s CANNOT RUN (%s s) compute-sanitizer did not run the program (exit %s; gVisor: %s): %s' \
               "$tool" "$took" "$rc" "$gvisor" "$(grep -v '^\$ ' "$tlog" | grep -v '^=* *COMPUTE-SANITIZER$' | head -3 | tr '\n' ' ')")"
        log "sanitize    the other tools are not tried: compute-sanitizer cannot attach here$([ "$gvisor" != no ] && echo ' (gVisor)')"
        break
      fi
      tests=$(grep -oE '^\[  PASSED  \] [0-9]+ tests?' "$tlog" | tail -1)
      api=$(grep -c 'Program hit ' "$tlog" || true)
      ok=$rc
      detail="${summary_line:-no ERROR SUMMARY}$([ "$api" -gt 0 ] && echo " ($api of them CUDA API errors)"); ${tests:-no gtest summary}"
      if grep -q "no usable CUDA device" "$tlog"; then
        ok=1 detail+="; the GPU cases skipped under the tool: it checked nothing"
      fi
      verdict "$tool" "$ok" "$detail"
    done
    cap "$out/sanitizer.log"
  fi
fi

# --- bench -----------------------------------------------------------------------
if want bench; then
  # shellcheck disable=SC2086
  gpu_cmd="$vpy bench/cuda_wheel_bench.py ${GAC_LEASE_BENCH_ARGS:-}"
  if [ "$mode" = dry ]; then
    would bench "${gpu_cmd% }   [budget 150 s]"
    run_timed bench 60 "$out/bench.txt" "$vpy" bench/cuda_wheel_bench.py --device cpu --quick
    verdict bench "$rc" "its CPU smoke run (--device cpu --quick: every line of it, no GPU): $(tail -1 "$out/bench.txt" | grep -o 'exit [0-9]* after [0-9]* s')"
  else
    # shellcheck disable=SC2086
    run_timed bench 150 "$out/bench.txt" "$vpy" bench/cuda_wheel_bench.py ${GAC_LEASE_BENCH_ARGS:-}
    detail=$(grep -E '^  \(.*(of copy|clip wall)' "$out/bench.txt" | sed 's/^  //' | tr '\n' ';' | cut -c1-600)
    verdict bench "$rc" "${detail:-$(grep -v '^\[exit' "$out/bench.txt" | tail -1 | cut -c1-300)}"
  fi
  cap "$out/bench.txt"
fi

# --- result ----------------------------------------------------------------------
if [ "${#failed[@]}" -gt 0 ]; then
  log "RESULT: FAIL (${failed[*]})$([ "${#incomplete[@]}" -gt 0 ] && echo "; incomplete: ${incomplete[*]}") after $(( $(date +%s) - start )) s"
  exit 1
elif [ "${#incomplete[@]}" -gt 0 ]; then
  log "RESULT: INCOMPLETE (${incomplete[*]}), nothing failed, after $(( $(date +%s) - start )) s"
  exit 2
fi
log "RESULT: PASS$([ "$mode" = dry ] && echo ' (dry run: the script and what it carries work; nothing ran on a GPU)') after $(( $(date +%s) - start )) s"
exit 0
