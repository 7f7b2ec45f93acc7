"""Compiles the agent's CUDA kernels with NVRTC into one fatbin and writes it
as a C++ source file (the build of gac::agent_cuda with GAC_CUDA_NVRTC_ROOT;
kernel_library.cc loads it at run time).

Used where no nvcc of the wanted CUDA release exists: PyPI's CUDA 12 packages
carry NVRTC and nvFatbin but no nvcc (python/requirements-cuda12.txt). The
sources are compiled as device code only (__CUDACC_RTC__), once per
architecture: a cubin for each of --cubin, PTX for each of --ptx, packed by
nvFatbin. The array is put in the section .nv_fatbin, where nvcc puts its
fatbins, so that cuobjdump lists its images (scripts/wheel_archs.sh).

    build_fatbin.py --nvidia DIR --include ROOT --cubin "80;90" --ptx "90" --output OUT.cc [--cache CACHE] SOURCE...
    build_fatbin.py --nvidia DIR --version        # prints NVRTC's version, e.g. 12.9

DIR is the nvidia/ folder of the PyPI packages (scripts/cuda12.sh prints it).
CACHE keeps the output by a hash of what makes it (NVRTC's version, the
architectures, this script and every file of the sources' folders), so that
the builds of a wheel per CPython compile the kernels once (about a minute).
Needs nothing but ctypes.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import hashlib
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import List, Tuple


def _library(nvidia: str, folder: str, name: str) -> ctypes.CDLL:
    found = sorted(glob.glob(os.path.join(nvidia, folder, "lib", f"lib{name}.so.*")))
    if not found:
        sys.exit(f"build_fatbin: no lib{name}.so.* in {os.path.join(nvidia, folder, 'lib')}")
    return ctypes.CDLL(found[0])


class Nvrtc:
    def __init__(self, nvidia: str) -> None:
        self.lib = _library(nvidia, "cuda_nvrtc", "nvrtc")
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def version(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return f"{major.value}.{minor.value}"

    def _check(self, result: int, what: str, log: str = "") -> None:
        if result != 0:
            sys.exit(f"build_fatbin: {what}: {self.lib.nvrtcGetErrorString(result).decode()}\n{log}")

    def compile(self, source: str, options: List[str], cubin: bool) -> Tuple[bytes, str]:
        """The cubin (or PTX) of `source` and NVRTC's log."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"gac_kernels.cu", 0, None, None),
                    "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            result = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            text = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, text)
            log = text.value.decode(errors="replace").strip()
            self._check(result, f"compiling for {options[0]}", log)
            kind = "CUBIN" if cubin else "PTX"
            self._check(getattr(self.lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)), f"nvrtcGet{kind}Size")
            image = ctypes.create_string_buffer(size.value)
            self._check(getattr(self.lib, f"nvrtcGet{kind}")(prog, image), f"nvrtcGet{kind}")
            return image.raw, log
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _fatbin(nvidia: str, images: List[Tuple[str, str, bytes]]) -> bytes:
    """(kind 'cubin' or 'ptx', arch, image) packed by nvFatbin."""
    lib = _library(nvidia, "nvfatbin", "nvfatbin")
    lib.nvFatbinGetErrorString.restype = ctypes.c_char_p

    def check(result: int, what: str) -> None:
        if result != 0:
            sys.exit(f"build_fatbin: {what}: {lib.nvFatbinGetErrorString(result).decode()}")

    handle = ctypes.c_void_p()
    # -compress-all: the cubins too (a quarter of their size), in the default
    # mode, the one nvcc uses (the "size" and "balance" modes are newer).
    options = (ctypes.c_char_p * 3)(b"-64", b"-host=linux", b"-compress-all")
    check(lib.nvFatbinCreate(ctypes.byref(handle), options, 3), "nvFatbinCreate")
    try:
        for kind, arch, image in images:
            if kind == "cubin":
                check(lib.nvFatbinAddCubin(handle, image, len(image), arch.encode(), b"gac_kernels"), f"adding sm_{arch}")
            else:
                check(lib.nvFatbinAddPTX(handle, image, len(image), arch.encode(), b"gac_kernels", b""),
                      f"adding compute_{arch}")
        size = ctypes.c_size_t()
        check(lib.nvFatbinSize(handle, ctypes.byref(size)), "nvFatbinSize")
        out = ctypes.create_string_buffer(size.value)
        check(lib.nvFatbinGet(handle, out), "nvFatbinGet")
        return out.raw
    finally:
        lib.nvFatbinDestroy(ctypes.byref(handle))


def _source_file(data: bytes, sources: List[str], compiler: str, archs: List[str]) -> str:
    rows = [",".join(str(b) for b in data[i:i + 32]) for i in range(0, len(data), 32)]
    names = " ".join(os.path.basename(s) for s in sources)
    return (f"// Generated by agent/src/cuda/build_fatbin.py from {names}:\n"
            f"// {compiler}, {' '.join(archs)}. kernel_library.cc loads it.\n"
            "#include <cstddef>\n\n"
            "namespace gac::agent::cuda {\n\n"
            "// In nvcc's section for fatbins, where cuobjdump finds them.\n"
            "alignas(16) __attribute__((section(\".nv_fatbin\"), used)) extern const unsigned char kKernelFatbin[] = {\n"
            + ",\n".join(rows) + "};\n"
            "extern const std::size_t kKernelFatbinSize = sizeof(kKernelFatbin);\n\n"
            "}  // namespace gac::agent::cuda\n")


def _cache_file(cache: str, version: str, cubins: List[str], ptxs: List[str], sources: List[str]) -> str:
    """Where `cache` keeps the output of these inputs: NVRTC's version, the
    architectures, this script and every file of the sources' folders."""
    key = hashlib.sha256(f"{version} {cubins} {ptxs}".encode())
    inputs = {__file__} | {f for s in sources for f in glob.glob(os.path.join(os.path.dirname(s), "*"))
                           if os.path.isfile(f)}
    for path in sorted(inputs):
        with open(path, "rb") as f:
            key.update(os.path.basename(path).encode() + f.read())
    return os.path.join(cache, key.hexdigest() + ".cc")


def _archs(text: str) -> List[str]:
    return [a for a in text.replace(",", ";").split(";") if a]


def program_source(sources: List[str]) -> str:
    """The one program NVRTC compiles: an #include of each source."""
    return "".join(f'#include "{os.path.abspath(s)}"\n' for s in sources)


def arch_option(kind: str, arch: str) -> str:
    """NVRTC's option for a cubin ('cubin') or PTX ('ptx') of `arch`."""
    return f"-arch={'sm' if kind == 'cubin' else 'compute'}_{arch}"


def compile_options(nvidia: str, include: str) -> List[str]:
    """NVRTC's options besides the architecture (shared with check_kernels.py)."""
    # -default-device: the lambdas inside kernels are device code (nvcc infers it).
    return ["-std=c++17", "-default-device", f"-I{include}",
            f"-I{os.path.join(nvidia, 'cuda_runtime', 'include')}",
            f"-I{os.path.join(nvidia, 'cuda_cccl', 'include')}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nvidia", required=True, help="the nvidia/ folder of the PyPI CUDA packages")
    parser.add_argument("--version", action="store_true", help="print NVRTC's version and exit")
    parser.add_argument("--include", help="the include root of the sources (the checkout)")
    parser.add_argument("--cubin", default="", help="architectures to compile cubins for: '80;90'")
    parser.add_argument("--ptx", default="", help="architectures to emit PTX for: '90'")
    parser.add_argument("--output", help="the C++ file to write")
    parser.add_argument("--cache", help="a folder that keeps outputs by the hash of their inputs")
    parser.add_argument("sources", nargs="*")
    args = parser.parse_args()
    nvrtc = Nvrtc(args.nvidia)
    if args.version:
        print(nvrtc.version())
        return
    cubins, ptxs = _archs(args.cubin), _archs(args.ptx)
    if not (args.include and args.output and args.sources and (cubins or ptxs)):
        parser.error("--include, --output, a source and --cubin or --ptx are needed")
    cached = _cache_file(args.cache, nvrtc.version(), cubins, ptxs, args.sources) if args.cache else None
    if cached and os.path.exists(cached):
        shutil.copyfile(cached, args.output)
        return
    source = program_source(args.sources)
    common = compile_options(args.nvidia, args.include)
    jobs = [("cubin", a) for a in cubins] + [("ptx", a) for a in ptxs]

    def build(job: Tuple[str, str]) -> Tuple[str, str, bytes]:
        kind, arch = job
        image, log = nvrtc.compile(source, [arch_option(kind, arch), *common], kind == "cubin")
        if log:
            print(f"build_fatbin: {kind} {arch}: {log}", file=sys.stderr)
        return kind, arch, image

    # NVRTC compiles separate programs concurrently; ctypes releases the GIL.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        images = list(pool.map(build, jobs))
    names = [f"{'sm' if kind == 'cubin' else 'compute'}_{arch}" for kind, arch, _ in images]
    text = _source_file(_fatbin(args.nvidia, images), args.sources, f"NVRTC {nvrtc.version()}", names)
    for path in [args.output] + ([cached] if cached else []):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
