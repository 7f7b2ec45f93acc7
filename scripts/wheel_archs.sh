#!/usr/bin/env bash
# Checks the CUDA kernels a gac wheel carries, as cuobjdump reads them from
# its agent module (gac/_agent*.so): a cubin for each of sm_80, sm_86, sm_89,
# sm_90, sm_100 and sm_120, PTX for compute_120 (later GPUs), and every
# image made by CUDA 12 (cubins of toolkit 12.x, PTX ISA 8.x), which drivers
# since CUDA 12.0 (>= 525) load (CUDA 13's need drivers >= 580); and every
# kernel the module launches by name compiled for each of those architectures.
# Prints what it found; exits 1 when something is missing or newer, 2 on bad
# usage.
#   usage: scripts/wheel_archs.sh WHEEL
# cuobjdump comes from .cuda12/ (scripts/cuda12.sh installs it).
set -euo pipefail
wheel=${1:?usage: scripts/wheel_archs.sh WHEEL}
[ -f "$wheel" ] || { echo "wheel_archs: no file $wheel" >&2; exit 2; }
wheel=$(realpath "$wheel")
cd "$(dirname "$0")/.."
cuobjdump=$(bash scripts/cuda12.sh)/cu13/bin/cuobjdump
want_cubins="sm_80 sm_86 sm_89 sm_90 sm_100 sm_120"
want_ptx="compute_120"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 -m zipfile -e "$wheel" "$scratch/unpacked"
module=$(ls "$scratch"/unpacked/gac/_agent*.so 2>/dev/null | head -1)
[ -n "$module" ] || { echo "wheel_archs: $(basename "$wheel") has no gac/_agent*.so" >&2; exit 1; }
# Each cubin's header: "64bit elf: type=2, abi=7, sm=80, toolkit=129, ..." or,
# from sm_100 on, "64-bit ELF: type=ET_EXEC, ABI=8, sm=100, toolkit=12.9, ...";
# each PTX's: "arch = sm_120" and "code version = [8,8]" (its ISA).
"$cuobjdump" --dump-elf "$module" 2> "$scratch/err" | grep -o 'sm=[0-9a-z]*, toolkit=[0-9.]*' > "$scratch/cubins" ||
  { cat "$scratch/err" >&2; true; }
"$cuobjdump" --dump-ptx "$module" 2> "$scratch/err" | awk '/^Fatbin ptx code/ {p = 1} p && /^arch = / {a = $3}
  p && /^code version = / {print a, $4; p = 0}' > "$scratch/ptx"
words() { sort -uV | tr '\n' ' ' | sed 's/ $//'; }
cubins=$(sed 's/sm=\([0-9a-z]*\),.*/sm_\1/' "$scratch/cubins" | words)
ptx=$(awk '{sub("sm_", "compute_", $1); print $1}' "$scratch/ptx" | words)
toolkits=$(sed 's/.*toolkit=//; s/^\([0-9][0-9]\)\([0-9]\)$/\1.\2/' "$scratch/cubins" | words)
isas=$(awk '{print $2}' "$scratch/ptx" | words)
echo "wheel_archs: $(basename "$module"): cubins ${cubins:-none} (toolkit ${toolkits:-none}), PTX ${ptx:-none} (ISA ${isas:-none})"

missing=()
for a in $want_cubins; do [[ " $cubins " == *" $a "* ]] || missing+=("$a cubin"); done
for a in $want_ptx; do [[ " $ptx " == *" $a "* ]] || missing+=("$a PTX"); done
for t in $toolkits; do [ "${t%%.*}" = 12 ] || missing+=("CUDA 12 cubins (found toolkit $t)"); done
for v in $isas; do [[ "$v" == "[8,"* ]] || missing+=("PTX ISA 8.x (found $v)"); done
# Every kernel that agent/src/cuda/kernel_library.cc launches by name has a
# cubin of each architecture (nvcc's builds have one fatbin per source file).
"$cuobjdump" --dump-elf-symbols "$module" 2> "$scratch/err" |
  awk '/^arch = / {a = $3} /STO_ENTRY/ {print $NF, a}' | sort -u | awk '{print $1}' | uniq -c > "$scratch/entries"
narchs=$(echo $cubins | wc -w)
for k in $(grep -o '"gac_[a-z0-9_]*"' agent/src/cuda/kernel_library.cc | tr -d '"'); do
  n=$(awk -v k="$k" '$2 == k {print $1}' "$scratch/entries")
  [ "${n:-0}" = "$narchs" ] || missing+=("kernel $k (in ${n:-0} of $narchs architectures)")
done
if ((${#missing[@]})); then
  printf 'wheel_archs: missing: %s\n' "${missing[@]}" >&2
  exit 1
fi
echo "wheel_archs: $(basename "$wheel"): every architecture present, all from CUDA 12"
