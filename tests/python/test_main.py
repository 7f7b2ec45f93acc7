"""`python -m gac`, run as a user runs it (a subprocess): what it reports
checked against facts found here independently (the interpreter, torch and
its view of the GPUs), its exit status, its answer without torch, and its
gacd check against a real gacd, a closed port and a port that never answers."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from typing import Any, Dict, List, Tuple

import pytest

import gac
from conftest import Gacd

# Runs gac's __main__ in an interpreter where `import torch` fails.
WITHOUT_TORCH = ("import runpy, sys; sys.modules['torch'] = None; sys.argv[0] = 'gac'; "
                 "runpy.run_module('gac', run_name='__main__', alter_sys=True)")


def run(*args: str, without_torch: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", WITHOUT_TORCH] if without_torch else [sys.executable, "-m", "gac"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


def run_json(*args: str, without_torch: bool = False) -> Tuple[Dict[str, Any], subprocess.CompletedProcess[str]]:
    out = run("--json", *args, without_torch=without_torch)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout), out


def test_json_reports_this_interpreter_torch_and_gac() -> None:
    info, out = run_json()
    assert out.returncode == (1 if info["problems"] else 0), info["problems"]
    assert info["version"] == gac.__version__
    assert info["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert info["python_executable"] == sys.executable
    assert info["location"] == str(__import__("pathlib").Path(gac.__file__).resolve().parent)
    try:
        import torch
    except ImportError:
        assert info["torch"] is None
    else:
        assert info["torch"]["version"] == torch.__version__
        assert info["torch"]["cuda"] == torch.version.cuda
        assert info["torch"]["supported"] is True  # the suite runs on torch >= 2.6
    # What the module was built with, in the forms documented.
    assert info["cuda_runtime"] is None or re.fullmatch(r"\d+\.\d", info["cuda_runtime"])
    assert isinstance(info["cuda_archs"], list)
    assert all(re.fullmatch(r"(sm|compute)_\d+[a-z]?", a) for a in info["cuda_archs"]), info["cuda_archs"]
    assert (info["cuda_runtime"] is None) == (info["cuda_archs"] == []) == (info["cuda_compiler"] is None)
    assert re.match(r"(GCC|clang) \d", info["compiler"]), info["compiler"]
    assert info["glibc_built_against"] is None or re.fullmatch(r"2\.\d+", info["glibc_built_against"])


def test_the_gpus_are_the_ones_torch_sees() -> None:
    info, _ = run_json()
    import torch
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if info["cuda_runtime"] is None:
        assert info["gpus"] == []
        return
    if torch.version.cuda is None:
        pytest.skip("a torch without CUDA sees no GPU to compare with")
    assert len(info["gpus"]) == visible, info
    if visible == 0:
        # No driver or no GPU is an answer, not a failure.
        assert info["cuda_error"] or info["cuda_driver"], info
        assert not info["problems"], info["problems"]
    for d in info["gpus"]:
        major, minor = torch.cuda.get_device_capability(d["index"])
        assert d["name"] == torch.cuda.get_device_name(d["index"])
        assert d["compute_capability"] == f"{major}.{minor}"
        assert d["kernels_run"] == (d["kernels"] is not None)
        if d["kernels"] is not None:
            assert d["kernels"] in info["cuda_archs"]
        else:
            assert any(f"GPU {d['index']}" in p for p in info["problems"]), info["problems"]


def test_the_text_report_says_the_same() -> None:
    info, _ = run_json()
    out = run()
    assert out.returncode == (1 if info["problems"] else 0)
    assert f"gac {gac.__version__}" in out.stdout
    assert "Python %d.%d.%d" % sys.version_info[:3] in out.stdout
    if info["cuda_runtime"] is not None:
        assert f"CUDA runtime {info['cuda_runtime']}" in out.stdout
        assert " ".join(info["cuda_archs"]) in out.stdout
    assert out.stderr.count("problem: ") == len(info["problems"])


def test_without_torch_it_says_so_and_works() -> None:
    info, out = run_json(without_torch=True)
    assert info["torch"] is None
    assert info["version"] == gac.__version__
    assert out.returncode == (1 if info["problems"] else 0)
    text = run(without_torch=True)
    assert "torch: not found" in text.stdout
    assert "Traceback" not in text.stderr


def gacd_problems(info: Dict[str, Any]) -> List[str]:
    return [p for p in info["problems"] if p.startswith("gacd")]


def test_gacd_answers(gacd: Gacd, tmp_path: Any) -> None:
    info, out = run_json("--gacd", gacd.address)
    assert info["gacd"] == {"address": gacd.address, "status": "SERVING", "error": None}
    assert not gacd_problems(info)
    token = tmp_path / "token"
    token.write_text("  some-token-of-32-characters-xx \n")
    text = run("--gacd", gacd.address, "--token-file", str(token))
    assert f"gacd at {gacd.address}: SERVING" in text.stdout
    assert "gacd" not in text.stderr


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_gacd_on_a_closed_port_fails_at_once_in_one_line() -> None:
    address = f"127.0.0.1:{closed_port()}"
    info, out = run_json("--gacd", address, "--timeout", "20")
    # Refused, not waited out: the error is the refusal's, not the deadline's.
    assert "DEADLINE" not in info["gacd"]["error"].upper(), info["gacd"]
    assert out.returncode == 1
    assert info["gacd"]["status"] is None and info["gacd"]["error"]
    assert gacd_problems(info) == [f"gacd at {address}: {info['gacd']['error']}"]
    text = run("--gacd", address)
    assert text.returncode == 1
    failed = [line for line in text.stderr.splitlines() if "gacd" in line]
    assert len(failed) == 1 and address in failed[0] and "not answering" in failed[0], text.stderr
    assert "Traceback" not in text.stderr


def test_gacd_that_never_answers_fails_after_the_timeout() -> None:
    # A socket that listens but never speaks: the connection is made, no
    # answer comes.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        address = f"127.0.0.1:{s.getsockname()[1]}"
        info, out = run_json("--gacd", address, "--timeout", "1")
    assert out.returncode == 1
    assert info["gacd"]["error"], info["gacd"]


@pytest.mark.parametrize("args", [["--token", "x", "--token-file", "f", "--gacd", "h:1"], ["--token", "x"],
                                  ["--gacd", "h:1", "--token-file", "/nonexistent/token"]])
def test_bad_arguments_exit_2(args: List[str]) -> None:
    out = run(*args)
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr


def test_an_address_that_is_not_host_port_is_a_clear_failure() -> None:
    info, out = run_json("--gacd", "a:1,b:2")
    assert out.returncode == 1
    assert "host:port" in info["gacd"]["error"]
