"""The CUDA kernels' compile matrix check (agent/src/cuda/check_kernels.py,
scripts/kernel_check.sh) fails when it should, naming the kernel and the
architecture: a kernel name of kernel_library.cc's kNames table misspelt
(one architecture compiled, a few seconds), a spill bound of 0 (every
architecture of the wheel, about 15 s on 2 cores); and on made-up ptxas
figures, registers beyond a kernel's __launch_bounds__ and parameters beyond
kKernelParamBytes, which the kernels do not reach.

Needs the CUDA 12.9 toolchain in .cuda12/ (scripts/cuda12.sh, which the test
command's kernels phase runs before ctest): the tests that compile skip, and
say so, where it is absent; nothing here installs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional, Set, Tuple

import pytest

SOURCE_DIR = Path(os.environ.get("GAC_SOURCE_DIR", Path(__file__).resolve().parents[2]))
CUDA_DIR = SOURCE_DIR / "agent" / "src" / "cuda"
SCRIPT = CUDA_DIR / "check_kernels.py"
NVIDIA = SOURCE_DIR / ".cuda12" / "site" / "nvidia"

sys.path.insert(0, str(CUDA_DIR))
import check_kernels  # noqa: E402

needs_toolchain = pytest.mark.skipif(not (NVIDIA / "cuda_nvrtc").is_dir(),
                                     reason=f"no CUDA 12.9 toolchain in {NVIDIA} (bash scripts/cuda12.sh installs it)")


def first_arch() -> str:
    cubins, _ = check_kernels.parse_architectures(check_kernels.wheel_architectures(str(SOURCE_DIR)))
    return cubins[0]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--nvidia", str(NVIDIA), "--root", str(SOURCE_DIR), *args],
                          capture_output=True, text=True, timeout=600)


def spilling(stdout: str) -> Set[Tuple[str, str]]:
    """The (kernel, image) pairs whose cell of the table ("registers
    stores/loads stack") shows spill stores or loads."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["kernel", "params", "threads"])
    images = lines[header].split()[3:]
    out = set()
    for line in lines[header + 1:]:
        if line.startswith("check_kernels:"):
            break
        kernel, cells = line.split()[0], re.findall(r"\d+ (\d+)/(\d+) \d+", line)
        assert len(cells) == len(images), line
        out |= {(kernel, image) for image, (stores, loads) in zip(images, cells) if int(stores) or int(loads)}
    return out


@needs_toolchain
def test_misspelt_name_fails(tmp_path: Path) -> None:
    source = (CUDA_DIR / "kernel_library.cc").read_text()
    name = check_kernels.kernel_names(str(CUDA_DIR / "kernel_library.cc"))[0]
    wrong = name[:-1] + "x"  # gac_stats_f32_inline -> gac_stats_f32_inlinx
    copy = tmp_path / "kernel_library.cc"
    copy.write_text(source.replace(f'"{name}"', f'"{wrong}"'))
    arch = first_arch()
    result = run("--architectures", f"{arch}-real", "--names-from", str(copy))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.count("FAIL:") == 2, result.stderr
    assert f"FAIL: {wrong}: in kNames but not an entry point of sm_{arch}" in result.stderr, result.stderr
    assert f"FAIL: {name} (sm_{arch}): an entry point that kNames does not name" in result.stderr, result.stderr


@needs_toolchain
def test_spill_bound_zero() -> None:
    """--max-spill-bytes 0 fails exactly the (kernel, architecture) pairs
    that the table shows spilling, every architecture of the wheel (with
    NVRTC 12.9 some always have: gac_project_f32_device on sm_90, ...);
    were none to spill, the run would pass."""
    result = run("--max-spill-bytes", "0")
    assert re.search(r"NVRTC 12\.9, ptxas V12\.9", result.stdout), result.stdout
    expected = spilling(result.stdout)
    fails = [line for line in result.stderr.splitlines() if "FAIL:" in line]
    failed = {m.groups() for m in (re.search(r"FAIL: (\w+) \((\w+)\): spills \d+ bytes stored, \d+ loaded, "
                                             r"above the bound of 0 \(--max-spill-bytes\)$", line)
                                   for line in fails) if m}
    assert len(failed) == len(fails), result.stderr  # only spills fail
    assert failed == expected, result.stdout + result.stderr
    assert result.returncode == (1 if expected else 0), result.stderr


def image(registers: int, threads: Optional[int], param_bytes: int = 16) -> check_kernels.Image:
    entry = check_kernels.Entry(param_bytes=param_bytes, threads=threads, registers=registers, spill_stores=0,
                                spill_loads=0, stack=0)
    return check_kernels.Image("sm_80", {"k": entry})


def test_registers_beyond_launch_bounds_fail() -> None:
    # 512 threads: 128 registers per thread at most.
    assert check_kernels.check([image(128, 512)], ["k"], 4096, 0) == []
    assert check_kernels.check([image(130, 512)], ["k"], 4096, 0) == [
        "k (sm_80): 130 registers, above 128 per thread for __launch_bounds__(512)"]
    assert check_kernels.check([image(40, None)], ["k"], 4096, 0) == [
        "k (sm_80): no __launch_bounds__ (.maxntid) to check 40 registers against"]


def test_parameters_beyond_the_limit_fail() -> None:
    assert check_kernels.check([image(32, 256, 4097)], ["k"], 4096, 0) == [
        "k (sm_80): 4097 bytes of parameters, above kKernelParamBytes = 4096"]


def test_ptx_and_ptxas_log_parsing() -> None:
    # Parameters laid out with their alignment: 4 + (4 padding) + 8 + 3968.
    ptx = """
.visible .entry k(
	.param .u32 k_param_0,
	.param .u64 .ptr .global .align 8 k_param_1,
	.param .align 8 .b8 k_param_2[3968]
)
.maxntid 512, 1, 1
{
}
"""
    img = check_kernels.Image("sm_80")
    check_kernels.parse_ptx(ptx, img)
    assert (img.entries["k"].param_bytes, img.entries["k"].threads) == (3984, 512)
    # A helper's properties (not inlined) are not the kernel's.
    check_kernels.parse_ptxas_log("""ptxas info    : Function properties for helper
ptxas         .     96 bytes stack frame, 96 bytes spill stores, 96 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_80'
ptxas info    : Function properties for k
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 24 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 376 bytes cmem[0]
""", img)
    e = img.entries["k"]
    assert (e.registers, e.spill_stores, e.spill_loads, e.stack) == (40, 8, 24, 16)
    assert check_kernels.check([img], ["k"], 4096, 16) == [
        "k (sm_80): spills 8 bytes stored, 24 loaded, above the bound of 16 (--max-spill-bytes)"]
