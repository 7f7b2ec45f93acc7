"""``python -m gac``: what this gac is and whether it works here.

Prints gac's version and the wheel it was installed from, Python, the torch
found and whether gac supports it (torch >= 2.6), the CUDA runtime gac
carries and the architectures of its kernels, the CUDA driver and the GPUs
found and whether gac's kernels run on each; with ``--gacd ADDRESS``,
whether gacd answers there (its gRPC health service); with ``--selftest``,
gac's kernels and its torch-ops path run on every device against fp64
(gac/_selftest.py). ``--json`` prints the same as one JSON object.

Exit status: 0 when everything works; 1 when something does not (listed
last): a torch gac does not support, a GPU none of gac's kernels runs on,
gacd not answering; 2 for bad arguments. Neither torch nor a GPU is needed
to run it: without them it says so.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import gac

# The oldest torch gac supports (docs/PYTHON.md).
TORCH_MIN = (2, 6)


def _wheel_tag() -> Optional[str]:
    """The tag of the wheel this gac was installed from (its dist-info's
    WHEEL file), or None when the gac imported is not an installed one."""
    try:
        dist = importlib.metadata.distribution("gac")
    except importlib.metadata.PackageNotFoundError:
        return None
    if Path(str(dist.locate_file("gac/__init__.py"))).resolve() != Path(gac.__file__).resolve():
        return None  # another gac is installed; this one comes from a build tree
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]
    return ", ".join(tags) or None


def _torch(problems: List[str]) -> Optional[Dict[str, Any]]:
    """torch's version, its CUDA and whether gac supports it; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    except Exception as e:  # a broken install fails in many ways
        problems.append(f"torch does not import: {type(e).__name__}: {e}")
        return None
    version = str(torch.__version__)
    m = re.match(r"(\d+)\.(\d+)", version)
    supported = m is not None and (int(m.group(1)), int(m.group(2))) >= TORCH_MIN
    if not supported:
        problems.append(f"torch {version} is older than {TORCH_MIN[0]}.{TORCH_MIN[1]}, the oldest gac supports")
    gpus = torch.cuda.device_count() if torch.version.cuda else 0
    return {"version": version, "cuda": torch.version.cuda, "supported": supported, "gpus": gpus}


def _gacd(address: str, token: Optional[str], tls: Optional[str], timeout: float,
          problems: List[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"address": address, "status": None, "error": None}
    try:
        from gac._transport import check_gacd
    except ImportError as e:
        out["error"] = f"not checked: this gac has no transport to gacd (built without gRPC): {e}"
    else:
        try:
            out["status"] = check_gacd(address, token=token, tls=tls, timeout=timeout)
        except (ConnectionError, TimeoutError) as e:  # gac's UnavailableError, DeadlineExceededError
            out["error"] = f"not answering: {e}"
        except Exception as e:  # a bad address or TLS file
            out["error"] = f"{type(e).__name__}: {e}"
        else:
            if out["status"] != "SERVING":
                out["error"] = f"answers {out['status']}"
    if out["error"] is not None:
        problems.append(f"gacd at {address}: {out['error']}")
    return out


def collect(gacd: Optional[str] = None, token: Optional[str] = None, tls: Optional[str] = None,
            timeout: float = 3.0) -> Dict[str, Any]:
    """Everything ``python -m gac`` reports, as the dict --json prints;
    "problems" lists what does not work (empty: all does)."""
    problems: List[str] = []
    info: Dict[str, Any] = {
        "version": gac.__version__,
        "wheel": _wheel_tag(),
        "location": str(Path(gac.__file__).resolve().parent),
        "python": platform.python_version(),
        "python_executable": sys.executable,
    }
    info["torch"] = _torch(problems)
    build: Dict[str, Any] = {"cuda_runtime": None, "cuda_runtime_static": None, "cuda_archs": [],
                             "cuda_compiler": None, "compiler": None, "glibc_built_against": None}
    devices: Dict[str, Any] = {"driver": None, "error": None, "devices": []}
    try:
        from gac import _agent
    except ImportError as e:
        problems.append(f"gac's native agent module does not load: {e}")
    else:
        build.update(_agent.build_info())
        devices.update(_agent.cuda_devices())
    info.update(build)
    info["cuda_driver"] = devices["driver"]
    info["cuda_error"] = devices["error"]
    info["gpus"] = [dict(d, kernels_run=d["kernels"] is not None) for d in devices["devices"]]
    for d in info["gpus"]:
        if not d["kernels_run"]:
            problems.append(f"GPU {d['index']} ({d['name']}, compute capability {d['compute_capability']}) runs "
                            f"none of gac's kernels ({' '.join(build['cuda_archs'])}; CUDA driver "
                            f"{devices['driver']})")
    torch_gpus = info["torch"]["gpus"] if info["torch"] else 0
    if build["cuda_runtime"] is None and torch_gpus:
        problems.append(f"torch sees {torch_gpus} GPU(s) but this gac has no CUDA kernels")
    if gacd is not None:
        info["gacd"] = _gacd(gacd, token, tls, timeout, problems)
    info["problems"] = problems
    return info


def _report(info: Dict[str, Any]) -> List[str]:
    lines = [f"gac {info['version']}: " + (f"wheel {info['wheel']}" if info["wheel"] else "built from source tree")
             + f" ({info['location']})",
             f"Python {info['python']} ({info['python_executable']})"]
    t = info["torch"]
    if t is None:
        lines.append("torch: not found (gac.Agent needs it; Telemetry, RemoteController and Controller do not)")
    else:
        lines.append(f"torch {t['version']} (CUDA {t['cuda'] or 'none'}): "
                     + ("supported" if t["supported"] else "NOT supported")
                     + f" (gac needs torch >= {TORCH_MIN[0]}.{TORCH_MIN[1]})")
    if info["cuda_runtime"] is None:
        lines.append("gac's CUDA kernels: none (a build without CUDA: CPU gradients only)")
    else:
        linked = "linked in" if info["cuda_runtime_static"] else "shared"
        lines.append(f"gac's CUDA kernels: {' '.join(info['cuda_archs'])} ({info['cuda_compiler']}), "
                     f"CUDA runtime {info['cuda_runtime']} {linked}")
    lines.append(f"built with {info['compiler']}, glibc {info['glibc_built_against']}")
    if info["cuda_driver"] is None:
        lines.append("CUDA driver: none" + (f" ({info['cuda_error']})" if info["cuda_error"] else ""))
    else:
        lines.append(f"CUDA driver {info['cuda_driver']}"
                     + (f": {info['cuda_error']}" if info["cuda_error"] else f", {len(info['gpus'])} GPU(s)"))
    for d in info["gpus"]:
        runs = f"gac's kernels run ({d['kernels']})" if d["kernels_run"] else "gac's kernels do NOT run"
        lines.append(f"GPU {d['index']}: {d['name']}, compute capability {d['compute_capability']}: {runs}")
    if "gacd" in info:
        g = info["gacd"]
        lines.append(f"gacd at {g['address']}: " + (g["status"] if g["error"] is None else f"FAILED: {g['error']}"))
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gac", description=__doc__.split("\n\n")[0].strip("`"))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--gacd", metavar="ADDR", help="check that gacd answers at host:port")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token", metavar="T", help="bearer token sent to gacd")
    token.add_argument("--token-file", metavar="F", help="read the bearer token from F")
    parser.add_argument("--tls", metavar="PEM", help="gacd's TLS roots (a PEM file); default plaintext")
    parser.add_argument("--timeout", type=float, default=3.0, metavar="S", help="seconds to wait for gacd (3)")
    parser.add_argument("--selftest", action="store_true",
                        help="run gac's passes (its kernels and the torch-ops path) on every device against fp64")
    args = parser.parse_args(argv)
    if (args.token or args.token_file or args.tls) and not args.gacd:
        parser.error("--token, --token-file and --tls go with --gacd")
    secret = args.token
    if args.token_file:
        try:
            secret = Path(args.token_file).read_text().strip()
        except OSError as e:
            parser.error(f"--token-file: {e}")
    info = collect(args.gacd, secret, args.tls, args.timeout)
    if args.selftest:
        if info["torch"] is None:
            info["problems"].append("--selftest needs torch")
        else:
            from gac import _selftest

            info["selftest"] = _selftest.run()
            info["problems"] += info["selftest"]["problems"]
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print("\n".join(_report(info)))
        if "selftest" in info:
            from gac import _selftest

            print("\n".join(_selftest.report_lines(info["selftest"])))
        for p in info["problems"]:
            print(f"problem: {p}", file=sys.stderr)
    return 1 if info["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
