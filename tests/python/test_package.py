"""The package as shipped: its stubs (.pyi) say what the modules have, with
the same parameter names; mypy --strict accepts the package itself, and the
example and the benchmark against it; its modules import one another
without a cycle and use no other module's private names; every deprecated
alias is in the glossary with its removal version; one LibTorch is loaded
(the interpreter's own); and
the documented install (a wheel of the build, installed into another
virtual environment that has the same torch) works; and the build's path
file makes an interpreter import the build."""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

import gac
from conftest import SOURCE_DIR

PACKAGE = Path(gac.__file__).resolve().parent
MODULES = ["gac._controller", "gac._transport", "gac._agent"]


def stub_signature(fn: ast.FunctionDef) -> Tuple[List[str], List[str]]:
    """(positional parameter names without self, keyword-only names)."""
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if names and names[0] == "self":
        names = names[1:]
    return names, [a.arg for a in fn.args.kwonlyargs]


def runtime_signature(doc: str, name: str) -> Optional[Tuple[List[str], List[str]]]:
    """The same from pybind11's docstring, "name(self: T, a: int, *, b: float = 1.0) -> R"."""
    line = doc.splitlines()[0] if doc else ""
    m = re.match(rf"{re.escape(name)}\((.*)\) -> ", line)
    if not m:
        return None
    params, depth, cur = [], 0, ""
    for ch in m.group(1):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            params.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        params.append(cur.strip())
    positional: List[str] = []
    keyword: List[str] = []
    target = positional
    for p in params:
        if p == "*":
            target = keyword
            continue
        target.append(p.split(":")[0].strip())
    if positional and positional[0] == "self":
        positional = positional[1:]
    return positional, keyword


def stub_members(cls: ast.ClassDef) -> Dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


# pybind11 >= 3 gives every class _pybind11_conduit_v1_ (its cross-module
# interoperability hook), which no stub lists.
RUNTIME_ONLY = {"__repr__", "__module__", "__doc__", "__dict__", "__weakref__", "_pybind11_conduit_v1_"}


@pytest.mark.parametrize("module_name", MODULES)
def test_stubs_match_the_modules(module_name: str) -> None:
    module = importlib.import_module(module_name)
    tree = ast.parse((PACKAGE / (module_name.split(".")[1] + ".pyi")).read_text())
    stub_names: Set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "TypedDict" for b in node.bases):
            stub_names.add(node.name)  # the shape of a dict a function returns: a stub-only name
        elif isinstance(node, ast.ClassDef):
            stub_names.add(node.name)
            cls = getattr(module, node.name, None)
            assert isinstance(cls, type), f"{module_name}.{node.name} is in the stub only"
            members = stub_members(node)
            runtime = {k for k in vars(cls) if not (k.startswith("__") and k not in ("__init__", "__enter__",
                                                                                       "__exit__"))}
            runtime -= RUNTIME_ONLY
            if type(vars(cls).get("__init__")).__name__ == "wrapper_descriptor":
                runtime.discard("__init__")  # no constructor: pybind11's slot that refuses
            assert set(members) == runtime, f"{node.name}: stub {sorted(members)} vs runtime {sorted(runtime)}"
            for name, fn in members.items():
                value = vars(cls)[name]
                is_property = any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)
                is_setter = any(isinstance(d, ast.Attribute) and d.attr == "setter" for d in fn.decorator_list)
                if is_property or is_setter:
                    assert isinstance(value, property), f"{node.name}.{name} is not a property"
                    if is_setter:
                        assert value.fset is not None, f"{node.name}.{name} has no setter"
                    continue
                assert not isinstance(value, property), f"{node.name}.{name} is a property"
                sig = runtime_signature(getattr(value, "__doc__", "") or "", name)
                if sig is not None and name not in ("__exit__",):
                    assert stub_signature(fn) == sig, f"{node.name}.{name}: stub {stub_signature(fn)} vs {sig}"
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stub_names.add(node.target.id)  # a module constant
            assert hasattr(module, node.target.id), f"{module_name}.{node.target.id} is in the stub only"
        elif isinstance(node, ast.FunctionDef):
            stub_names.add(node.name)
            fn_rt = getattr(module, node.name, None)
            assert fn_rt is not None, f"{module_name}.{node.name} is in the stub only"
            assert stub_signature(node) == runtime_signature(fn_rt.__doc__ or "", node.name), node.name
    public = {k for k in vars(module) if not k.startswith("_")}
    assert public <= stub_names | {"annotations"}, f"not in the stub: {sorted(public - stub_names)}"


def test_the_package_exports_what_it_says() -> None:
    for name in gac.__all__:
        assert getattr(gac, name) is not None, name
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert f'version = "{gac.__version__}"' in pyproject
    assert (PACKAGE / "py.typed").exists()


def test_mypy_accepts_the_example_and_the_benchmark(tmp_path: Path) -> None:
    files = [SOURCE_DIR / "examples" / "python" / "grpo.py", SOURCE_DIR / "bench" / "python_agent_bench.py"]
    # torch's own sources are not analysed (minutes); its names are Any.
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nstrict = True\n[mypy-torch.*]\nfollow_imports = skip\nfollow_imports_for_stubs = True\n")
    env = dict(os.environ, MYPYPATH=str(PACKAGE.parent))
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir",
                          str(tmp_path / "cache"), *map(str, files)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_accepts_the_package(tmp_path: Path) -> None:
    # `mypy --strict python/gac`, as the issue tracker runs it: torch and transformers analysed (a minute or two).
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"),
                          "python/gac"], capture_output=True, text=True, cwd=SOURCE_DIR, timeout=600,
                         env={k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")})
    assert out.returncode == 0, out.stdout + out.stderr


def _package_modules() -> Dict[str, ast.Module]:
    """The package's Python modules in the source tree, by module name."""
    root = SOURCE_DIR / "python"
    modules = {}
    for path in sorted((root / "gac").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return modules


def _imports(module: ast.Module, known: Set[str]) -> List[Tuple[str, List[str]]]:
    """(the package module imported, the names taken from it) for every import
    of the package anywhere in `module` (functions and TYPE_CHECKING blocks too);
    `from gac import _x` of a submodule is an import of that submodule."""
    out: List[Tuple[str, List[str]]] = []
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.split(".")[0] == "gac"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gac":
            names = []
            for a in node.names:
                if f"{node.module}.{a.name}" in known or (PACKAGE.parent / node.module.replace(".", "/") /
                                                          f"{a.name}.pyi").exists():
                    out.append((f"{node.module}.{a.name}", []))
                else:
                    names.append(a.name)
            if names:
                out.append((node.module, names))
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_the_package_imports_no_cycle_and_no_private_name() -> None:
    modules = _package_modules()
    graph: Dict[str, Set[str]] = {name: set() for name in modules}
    reach_ins = []
    for name, tree in modules.items():
        for target, names in _imports(tree, set(modules)):
            if target in modules:
                graph[name].add(target)
            reach_ins += [f"{name} imports {target}.{n}" for n in names if _private(n)]
        # Attributes: a private name read or set on anything is one this module defines for itself.
        own = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
        own |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        reach_ins += [f"{name} uses .{n.attr}" for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in own]
    assert not reach_ins, reach_ins
    # Depth-first: a module met again while on the path closes a circle.
    state: Dict[str, int] = {}

    def visit(module: str, path: List[str]) -> None:
        state[module] = 1
        for nxt in sorted(graph[module]):
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join(path[path.index(nxt):] + [module, nxt])
            if nxt not in state:
                visit(nxt, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert "gac.integrations.transformers" in graph["gac._attach"]  # the walk sees imports inside functions


def test_every_deprecated_alias_is_in_the_glossary_with_its_removal_version() -> None:
    from gac._deprecation import ALIASES, REMOVED_IN
    assert REMOVED_IN == "0.3.0" and gac.__version__ == "0.1.0"
    text = (SOURCE_DIR / "docs" / "ARCHITECTURE.md").read_text()
    glossary = text[text.index("## Glossary"):]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| ([0-9.]+) \|$", glossary, re.MULTILINE)
    assert sorted(rows) == sorted((a.old, a.new, a.removed_in) for a in ALIASES.values())


def test_the_options_attach_passes_on_are_the_agents() -> None:
    from gac._attachment import AgentOptions
    tree = ast.parse((PACKAGE / "_agent.pyi").read_text())
    agent = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Agent")
    positional, keyword = stub_signature(stub_members(agent)["__init__"])
    assert set(AgentOptions.__annotations__) == set(positional + keyword) - {"mode"}


# Each option gac.attach passes on (AgentOptions), given a value unlike its
# default, reaches the C++ agent's options and reads back from the Agent's
# property of that name (READ_AS: another name). An option added to
# AgentOptions fails here until it has a value below, or a reason in
# NOT_READ_BACK.
OPTION_VALUES = {
    "c_low": 0.07, "c_high": 0.4, "alpha_mode": "exact", "snapshot_dtype": "bfloat16",
    "reference": "applied_update", "num_threads": 11, "chunk_elements": 4096, "trigger": "window", "window": 7,
    "window_c_low": 0.11, "window_c_high": 0.45, "max_grad_norm": 12.5, "spike_sigma": 5.0, "spike_window": 32,
    "spike_warmup": 9, "passes": "torch",
}
READ_AS = {"layers": "layer_names"}
NOT_READ_BACK = {
    "groups": "deprecated name of layers (test_agent.py: test_groups_is_a_deprecated_alias_of_layers)",
    "process_group": "needs an initialised group: test_distributed.py gives one and reads agent.process_group",
    "replicated_on": "names groups, which need an initialised group: test_parallel.py gives them",
}


def test_every_agent_option_reaches_the_agent() -> None:
    torch = pytest.importorskip("torch")
    from gac._attachment import AgentOptions
    source = gac.RemoteController("127.0.0.1:1", run="options")
    layer = [torch.zeros(3, requires_grad=True)]
    values = dict(OPTION_VALUES, layers={"first": layer}, decision_source=source)
    expected = dict(values, layers=["first"])
    default = gac.Agent()
    for name in AgentOptions.__annotations__:
        if name in NOT_READ_BACK:
            continue
        assert name in values, f"give the new agent option {name} a value in OPTION_VALUES, or a reason in NOT_READ_BACK"
        agent = gac.Agent(**{name: values[name]})
        assert getattr(agent, READ_AS.get(name, name)) == expected[name], name
        assert getattr(default, READ_AS.get(name, name)) != expected[name], f"{name}: the test value is the default"


def test_the_verl_plugin_accepts_every_agent_option_a_config_can_carry() -> None:
    pytest.importorskip("torch")
    from gac._attachment import AgentOptions
    from gac.integrations import verl
    # Every agent option the plug-in leaves out is named there with its reason; every other one is a key.
    accepted = set(getattr(verl, "_AGENT_OPTIONS"))
    left_out: Dict[str, str] = getattr(verl, "_LEFT_OUT")
    assert set(left_out) <= set(AgentOptions.__annotations__) and all(left_out.values())
    assert accepted == set(AgentOptions.__annotations__) - set(left_out)
    doc = verl.AdamW.__doc__ or ""
    keys = getattr(verl, "_GAC_OPTIONS")
    assert {f"gac_{name}" for name in accepted} <= set(keys)
    assert all(key in doc for key in keys), "the plug-in's docstring names every key it accepts"


def test_no_module_links_a_torch_library() -> None:
    # One build for every torch 2.x: the modules read tensors through torch's
    # Python API and name no libtorch, libtorch_python or libc10.
    needed: Dict[str, List[str]] = {}
    for module in PACKAGE.glob("_*.so"):
        out = subprocess.run(["readelf", "-d", str(module)], capture_output=True, text=True, check=True, timeout=60)
        needed[module.name] = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out.stdout)
    assert len(needed) == 3 and all(needed.values()), needed
    torch_libs = [lib for libs in needed.values() for lib in libs if lib.startswith(("libtorch", "libc10", "libshm"))]
    assert not torch_libs, needed


def test_the_wheel_of_the_build_installs_into_another_venv(tmp_path: Path) -> None:
    # The documented install: `pip wheel` of the staged package with this
    # interpreter's setuptools, offline, then `pip install` of that wheel
    # into a second environment whose torch is this one's (a .pth file
    # naming this environment's site-packages stands for installing it).
    staged = PACKAGE.parent
    src = tmp_path / "src"
    shutil.copytree(staged, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    dist = tmp_path / "dist"
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-index",
                            "--no-deps", "-w", str(dist), str(src)],
                           capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    import torch
    wheels = list(dist.glob("gac-*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    torch_site = Path(torch.__file__).resolve().parent.parent
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(site) / "torch-env.pth").write_text(f"{torch_site}\n")
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", str(wheels[0])],
                         capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    code = ("import gac, torch\n"
            "p = torch.nn.Parameter(torch.zeros(4)); p.grad = torch.ones(4)\n"
            "print(gac.__file__); print(gac.Agent().step(1, [p]).regime); print(gac.Telemetry.__name__)\n")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    file, regime, telemetry = out.stdout.split()
    assert file.startswith(str(venv)) and regime == "safe" and telemetry == "Telemetry"


def test_the_builds_path_file_makes_the_interpreter_import_the_build(tmp_path: Path) -> None:
    # What scripts/build.sh does after a build (scripts/python_path.sh), so
    # that `.venv/bin/python -c "import gac"` works after the README's first
    # command; aimed here at an isolated venv (no system site packages: the
    # build's gac.pth of the real interpreter is not seen there) so that only
    # the file the script writes can make the import work.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = [python, "-c", "import gac; print(gac.__file__)"]
    before = subprocess.run(probe, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert before.returncode != 0 and "No module named 'gac'" in before.stderr
    build_dir = PACKAGE.parent.parent
    script = subprocess.run(["bash", str(SOURCE_DIR / "scripts" / "python_path.sh"), str(build_dir)],
                            capture_output=True, text=True, env={**env, "GAC_PYTHON": python}, timeout=60)
    assert script.returncode == 0, script.stderr
    after = subprocess.run(probe, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert after.returncode == 0, after.stderr
    assert Path(after.stdout.strip()).resolve() == PACKAGE / "__init__.py"
