"""Checks the agent's CUDA kernels for every architecture of the wheel without
a GPU: compiles them as build_fatbin.py does (the same NVRTC, sources,
options and __CUDACC_RTC__, one program per architecture), then checks each
image against what the code that launches them assumes:

  - its entry points (the PTX's .entry names) are exactly the names that
    kernel_library.cc looks up (its kNames table): a name missing from an
    image, or an entry point not in the table, fails;
  - each kernel's parameters (the PTX's .param declarations, laid out with
    their alignment) fit the kernel-parameter limit, kKernelParamBytes of
    multi_tensor.h;
  - ptxas's registers, spill stores and loads and stack frame of each kernel:
    printed as one table (kernel x architecture); spill stores or loads above
    --max-spill-bytes fail, and so do more registers than the kernel's
    __launch_bounds__ allows (65536 / threads per thread: the .maxntid that
    NVRTC writes into the PTX).

The architectures are GAC_CUDA_ARCHITECTURES of pyproject.toml in CMake's
syntax, read as cmake/GacOptions.cmake reads it ("80-real" a cubin, "120" a
cubin and PTX, "120-virtual" PTX only). A cubin's figures come from NVRTC's
own ptxas (-Xptxas=-v, which adds only the log); a PTX's from the toolchain's
ptxas (cuda_nvcc/bin/ptxas, the same 12.9) compiling it for that real
architecture, as the driver would. The kernel names, the sources (agent/
CMakeLists.txt's _gac_kernel_sources) and the limit are read from the
checkout at run time.

    check_kernels.py --nvidia DIR [--root ROOT] [--architectures "80-real;120"] [--names-from FILE]
                     [--max-spill-bytes N] [--jobs N]

DIR is the nvidia/ folder of the PyPI packages (scripts/cuda12.sh prints it;
scripts/kernel_check.sh runs this with it). Exit status: 0 when every check
passes, 1 when one fails (a line per failure naming the kernel and the
architecture), 2 on bad usage. Needs nothing but ctypes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_fatbin  # noqa: E402  (beside this file)

# Spill bytes allowed per kernel and architecture, stores and loads each.
# Measured with NVRTC 12.9.86 (docs/BENCHMARKS.md, "Registers and spills"):
# 6 of the 98 (kernel, architecture) pairs spill, 4 to 12 bytes stored and
# 8 to 88 loaded (gac_project_f32_inline on sm_120: 12 stored, 88 loaded),
# with 30 to 50 registers: a few 8-byte values in a stack frame of 8 bytes,
# reloaded at several places (hence loads above stores). 128 passes them and
# fails a kernel that starts spilling its vectors or its unrolled sums
# (hundreds of bytes); --max-spill-bytes tightens it.
MAX_SPILL_BYTES = 128

# Registers of one SM (every architecture from sm_80 to sm_120): a block of
# T threads launches only if each thread uses at most 65536 / T.
REGISTERS_PER_SM = 65536

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class Failure(Exception):
    """A check that cannot start (a file it reads lacks what it needs): exit 1."""


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def parse_architectures(text: str) -> Tuple[List[str], List[str]]:
    """GAC_CUDA_ARCHITECTURES ("80-real;120") as (cubin archs, PTX archs), as
    cmake/GacOptions.cmake reads it for the NVRTC build."""
    cubins, ptxs = [], []
    for entry in [a for a in text.split(";") if a]:
        m = re.fullmatch(r"([0-9]+[a-z]?)(-real|-virtual)?", entry)
        if not m:
            raise Failure(f"GAC_CUDA_ARCHITECTURES: NVRTC takes numbers (80, 80-real, 80-virtual), got '{entry}'")
        if m.group(2) != "-virtual":
            cubins.append(m.group(1))
        if m.group(2) != "-real":
            ptxs.append(m.group(1))
    return cubins, ptxs


def wheel_architectures(root: str) -> str:
    """GAC_CUDA_ARCHITECTURES of pyproject.toml ([tool.scikit-build.cmake.define])."""
    m = re.search(r'^GAC_CUDA_ARCHITECTURES\s*=\s*"([^"]*)"', _read(os.path.join(root, "pyproject.toml")), re.M)
    if not m:
        raise Failure("pyproject.toml: no GAC_CUDA_ARCHITECTURES")
    return m.group(1)


def kernel_names(path: str) -> List[str]:
    """The string literals of the kNames table of kernel_library.cc."""
    text = re.sub(r"//[^\n]*", "", _read(path))
    m = re.search(r"\bkNames\s*\[[^\]]*\]\s*=\s*\{(.*?)\};", text, re.S)
    if not m or not re.findall(r'"([^"]*)"', m.group(1)):
        raise Failure(f"{path}: no kNames table of kernel names")
    return re.findall(r'"([^"]*)"', m.group(1))


def param_limit(root: str) -> int:
    path = os.path.join(root, "agent", "src", "cuda", "multi_tensor.h")
    m = re.search(r"\bkKernelParamBytes\s*=\s*(\d+)", _read(path))
    if not m:
        raise Failure(f"{path}: no kKernelParamBytes")
    return int(m.group(1))


def kernel_sources(root: str) -> List[str]:
    """The .cu files that agent/CMakeLists.txt gives build_fatbin.py."""
    m = re.search(r"set\(_gac_kernel_sources\s+([^)]*)\)", _read(os.path.join(root, "agent", "CMakeLists.txt")))
    if not m:
        raise Failure("agent/CMakeLists.txt: no set(_gac_kernel_sources ...)")
    return [os.path.join(root, "agent", s) for s in m.group(1).split()]


@dataclass
class Entry:
    """One kernel of one image: from the PTX, then from ptxas's log."""
    param_bytes: int = 0
    threads: Optional[int] = None  # .maxntid / .reqntid: the __launch_bounds__
    registers: Optional[int] = None
    spill_stores: Optional[int] = None
    spill_loads: Optional[int] = None
    stack: Optional[int] = None


@dataclass
class Image:
    name: str  # sm_80 (a cubin) or compute_120 (PTX)
    entries: Dict[str, Entry] = field(default_factory=dict)


_PARAM_TYPE_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8}


def parse_ptx(ptx: str, image: Image) -> None:
    """Entry points, their parameter bytes and launch bounds."""
    # ".entry name(params)", its performance directives (.maxntid, ...), "{".
    for m in re.finditer(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)([^{]*)\{", ptx):
        entry = Entry()
        offset = 0
        for decl in [d.strip() for d in m.group(2).split(",") if d.strip()]:
            # ".param .align 8 .b8 name[3968]" or ".param .u64 .ptr .global .align 1 name"
            array = re.search(r"\.align\s+(\d+)\s+\.b8\s+\S+\[(\d+)\]$", decl)
            if array:
                align, size = int(array.group(1)), int(array.group(2))
            else:
                scalar = re.match(r"\.param\s+\.[subf](8|16|32|64)\b", decl)
                if not scalar:
                    raise Failure(f"{image.name}: {m.group(1)}: a parameter PTX declares as '{decl}' is not understood")
                align = size = _PARAM_TYPE_BYTES[scalar.group(1)]
            offset = (offset + align - 1) // align * align + size
        entry.param_bytes = offset
        bounds = re.search(r"\.(?:maxntid|reqntid)\s+([\d,\s]+)", m.group(3))
        if bounds:
            entry.threads = 1
            for n in bounds.group(1).replace(",", " ").split():
                entry.threads *= int(n)
        image.entries[m.group(1)] = entry


def parse_ptxas_log(log: str, image: Image) -> None:
    """ptxas -v's figures of each entry function of the image (a device
    function that is not inlined has "Function properties" of its own,
    which are not a kernel's)."""
    entry: Optional[Entry] = None  # the entry being compiled: "Used N registers"
    props: Optional[Entry] = None  # the entry whose properties follow: the stack and spills
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            entry = image.entries.setdefault(m.group(1), Entry())
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = image.entries.get(m.group(1))
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and props is not None:
            props.stack, props.spill_stores, props.spill_loads = (int(g) for g in m.groups())
            props = None
        m = re.search(r"Used (\d+) registers", line)
        if m and entry is not None:
            entry.registers = int(m.group(1))
            entry = None


def ptxas_version(ptxas: str) -> str:
    out = subprocess.run([ptxas, "--version"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"release [\d.]+, (V[\d.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1]


def compile_image(nvrtc: build_fatbin.Nvrtc, ptxas: str, source: str, common: List[str], kind: str,
                  arch: str) -> Tuple[Image, str]:
    """One image as build_fatbin.py compiles it, read back: (image, warnings)."""
    if kind == "cubin":
        # build_fatbin.py's options and -Xptxas=-v: ptxas's figures in the log,
        # the code unchanged. NVRTC keeps the PTX it handed its ptxas.
        ptx, log = nvrtc.compile(source, [build_fatbin.arch_option(kind, arch), *common, "-Xptxas=-v"], False)
        image = Image(f"sm_{arch}")
    else:
        ptx, log = nvrtc.compile(source, [build_fatbin.arch_option(kind, arch), *common], False)
        image = Image(f"compute_{arch}")
    text = ptx.rstrip(b"\0").decode()
    parse_ptx(text, image)
    if kind == "ptx":
        # What the driver compiles this PTX into on a GPU of that architecture.
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(text)
            f.flush()
            run = subprocess.run([ptxas, "-v", f"-arch=sm_{arch}", "-o", os.devnull, f.name],
                                 capture_output=True, text=True)
        if run.returncode != 0:
            raise Failure(f"{image.name}: ptxas -arch=sm_{arch} failed:\n{run.stderr}")
        parse_ptxas_log(run.stderr, image)
    else:
        parse_ptxas_log(log, image)
    warnings = "\n".join(l for l in log.splitlines() if not l.startswith("ptxas"))
    return image, warnings


def check(images: List[Image], names: List[str], limit: int, max_spill: int) -> List[str]:
    """A line per failed check, naming the kernel and the image."""
    failures = []
    for image in images:
        for name in names:
            if name not in image.entries:
                failures.append(f"{name}: in kNames but not an entry point of {image.name}")
        for name, e in image.entries.items():
            where = f"{name} ({image.name})"
            if name not in names:
                failures.append(f"{where}: an entry point that kNames does not name")
            if e.param_bytes > limit:
                failures.append(f"{where}: {e.param_bytes} bytes of parameters, above kKernelParamBytes = {limit}")
            if e.registers is None or e.spill_stores is None:
                failures.append(f"{where}: ptxas reported no registers or spills")
                continue
            spill = max(e.spill_stores, e.spill_loads or 0)
            if spill > max_spill:
                failures.append(f"{where}: spills {e.spill_stores} bytes stored, {e.spill_loads} loaded, "
                                f"above the bound of {max_spill} (--max-spill-bytes)")
            if e.threads is None:
                failures.append(f"{where}: no __launch_bounds__ (.maxntid) to check {e.registers} registers against")
            elif e.registers > REGISTERS_PER_SM // e.threads:
                failures.append(f"{where}: {e.registers} registers, above {REGISTERS_PER_SM // e.threads} per thread "
                                f"for __launch_bounds__({e.threads})")
    return failures


def table(images: List[Image], names: List[str]) -> str:
    """Kernel x image: registers, spill stores/loads and stack frame (bytes),
    with the parameter bytes and threads (the same in every image)."""
    kernels = list(names) + sorted({k for i in images for k in i.entries} - set(names))
    headers = ["kernel", "params", "threads"] + [i.name for i in images]
    rows = []
    for k in kernels:
        first = next((i.entries[k] for i in images if k in i.entries), Entry())
        row = [k, str(first.param_bytes), str(first.threads or "-")]
        for i in images:
            e = i.entries.get(k)
            row.append("missing" if e is None or e.registers is None else
                       f"{e.registers} {e.spill_stores}/{e.spill_loads} {e.stack}")
        rows.append(row)
    widths = [max(len(r[c]) for r in [headers] + rows) for c in range(len(headers))]
    lines = ["  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(r, widths)))
             for r in [headers] + rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvidia", required=True, help="the nvidia/ folder of the PyPI CUDA packages")
    parser.add_argument("--root", default=ROOT, help="the checkout (default: the one holding this script)")
    parser.add_argument("--architectures", help="GAC_CUDA_ARCHITECTURES to check (default: pyproject.toml's)")
    parser.add_argument("--names-from", help="the C++ file with the kNames table (default: kernel_library.cc)")
    parser.add_argument("--max-spill-bytes", type=int, default=MAX_SPILL_BYTES,
                        help=f"spill stores or loads allowed per kernel and architecture (default {MAX_SPILL_BYTES})")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiles at once (default: the cores)")
    args = parser.parse_args()
    started = time.monotonic()
    try:
        root = os.path.abspath(args.root)
        cubins, ptxs = parse_architectures(args.architectures or wheel_architectures(root))
        names = kernel_names(args.names_from or os.path.join(root, "agent", "src", "cuda", "kernel_library.cc"))
        limit = param_limit(root)
        sources = kernel_sources(root)
        ptxas = os.path.join(args.nvidia, "cuda_nvcc", "bin", "ptxas")
        if not os.access(ptxas, os.X_OK):
            raise Failure(f"no ptxas at {ptxas} (scripts/cuda12.sh installs it)")
        nvrtc = build_fatbin.Nvrtc(args.nvidia)
        print(f"check_kernels: NVRTC {nvrtc.version()}, ptxas {ptxas_version(ptxas)}; "
              f"{' '.join(os.path.relpath(s, root) for s in sources)} for "
              f"{' '.join([f'sm_{a}' for a in cubins] + [f'compute_{a}' for a in ptxs])}")
        source = build_fatbin.program_source(sources)
        common = build_fatbin.compile_options(args.nvidia, root)
        jobs = [("cubin", a) for a in cubins] + [("ptx", a) for a in ptxs]
        # NVRTC compiles separate programs concurrently (ctypes releases the
        # GIL), as in build_fatbin.py: the architectures are independent.
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(lambda job: compile_image(nvrtc, ptxas, source, common, *job), jobs))
    except Failure as e:
        print(f"check_kernels: {e}", file=sys.stderr)
        return 1
    images = [image for image, _ in results]
    for image, warnings in results:
        if warnings:
            print(f"check_kernels: {image.name}: {warnings}", file=sys.stderr)
    print(f"registers, spill stores/loads (bytes), stack frame (bytes) per kernel; params: bytes "
          f"(limit {limit}); threads: __launch_bounds__")
    print(table(images, names))
    failures = check(images, names, limit, args.max_spill_bytes)
    for f in failures:
        print(f"check_kernels: FAIL: {f}", file=sys.stderr)
    took = time.monotonic() - started
    if failures:
        print(f"check_kernels: {len(failures)} check(s) failed ({took:.1f} s)", file=sys.stderr)
        return 1
    print(f"check_kernels: {len(names)} kernels x {len(images)} images: entry points, parameters within {limit} "
          f"bytes, spills within {args.max_spill_bytes} bytes, registers within launch bounds ({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
