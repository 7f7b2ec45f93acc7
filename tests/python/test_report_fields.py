"""The step report's field table (gac/controller/report_fields.h, exposed as
gac._controller.REPORT_FIELDS) against every Python view of the report:
the native properties, the stub (names, order and types), to_dict()'s keys
and docs/PYTHON.md's table of them; and the enums' names and the scalar
limit that the package reads from the C++ side. A field added to the table
and missing from a view fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Tuple

import torch

import gac
from gac import _controller

PACKAGE = Path(gac.__file__).parent
ROOT = Path(__file__).resolve().parents[2]
STUB_TYPES = {"int": "int", "float": "float", "bool": "bool", "str": "str", "regime": "Regime", "mode": "Mode",
              "trigger": "Trigger"}


def stub_properties() -> List[Tuple[str, str]]:
    """(name, annotation) of the stub's StepReport properties, in stub order."""
    tree = ast.parse((PACKAGE / "_controller.pyi").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "StepReport")
    return [(fn.name, ast.unparse(fn.returns) if fn.returns is not None else "") for fn in cls.body
            if isinstance(fn, ast.FunctionDef) and any(getattr(d, "id", "") == "property" for d in fn.decorator_list)]


def test_the_table_is_well_formed() -> None:
    names = [f[0] for f in _controller.REPORT_FIELDS]
    assert len(names) == len(set(names)) and len(names) >= 28
    for name, kind, optional, unit, help_ in _controller.REPORT_FIELDS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert kind in STUB_TYPES and isinstance(optional, bool) and isinstance(unit, str), name
        assert help_.endswith(".") and len(help_) > 10, name


def test_every_python_field_is_a_property_with_the_tables_help() -> None:
    for name, _kind, _optional, unit, help_ in _controller.REPORT_FIELDS:
        prop = vars(_controller.StepReport).get(name)
        assert isinstance(prop, property), name
        assert help_ in (prop.__doc__ or ""), name
        assert (f"Unit: {unit}." in (prop.__doc__ or "")) == bool(unit), name


def test_the_stub_lists_the_table_in_order_with_its_types() -> None:
    stub = stub_properties()
    rows = list(_controller.REPORT_FIELDS)
    assert [n for n, _ in stub[:len(rows)]] == [f[0] for f in rows]
    for (name, annotation), (_n, kind, optional, *_rest) in zip(stub, rows):
        expected = STUB_TYPES[kind]
        assert annotation == (f"Optional[{expected}]" if optional else expected), name
    # The rest of the stub's properties are the report's objects and deprecated names.
    assert {n for n, _ in stub[len(rows):]} == {"decision", "layers", "seconds", "groups"}


def test_values_have_the_tables_types_and_to_dict_every_logger_field() -> None:
    p = torch.nn.Parameter(torch.zeros(8))
    agent = gac.Agent(0.05, 0.3)
    reports = []
    for step, g in enumerate([[1.0] * 8, [1.0] * 8], start=1):
        p.grad = torch.tensor(g)
        reports.append(agent.step(step, [p]))
    types: Dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str, "regime": str, "mode": str,
                              "trigger": str}
    for r in reports:
        readable = r.to_dict(numeric=False)
        for name, kind, optional, _unit, _help in _controller.REPORT_FIELDS:
            value = getattr(r, name)
            assert (value is None and optional) or type(value) is types[kind], (name, value)
            assert readable["gac/" + name] == value, name


def test_the_docs_table_names_every_logger_key() -> None:
    text = (ROOT / "docs" / "PYTHON.md").read_text()
    section = text[text.index("## `report.to_dict()`"):]
    section = section[:section.index("\n## ")]
    missing = [f[0] for f in _controller.REPORT_FIELDS if f"`gac/{f[0]}`" not in section]
    assert not missing, f"docs/PYTHON.md's report.to_dict() table does not name {missing}"


def test_the_enums_are_the_native_ones_in_the_order_of_their_numbers() -> None:
    # The stub's Literal types name the same values; to_dict() logs a value's index.
    assert gac.REGIMES == ("safe", "project", "skip", "invalid", "spike") == _controller.REGIMES
    assert gac.MODES == ("monitor", "local", "remote") == _controller.MODES
    assert gac.TRIGGERS == ("per_step", "window") == _controller.TRIGGERS
    decision = _controller.Controller(0.05, 0.3).decide(0.0, 1.0, 1.0)
    assert decision.regime in _controller.REGIMES


def test_the_scalar_limits_are_gacds() -> None:
    # gacd's 64 a record (gac/proto/wire_limits.h), less the sender's 5 counters.
    assert _controller.MAX_SCALARS == 64
    assert _controller.MAX_TRAINER_SCALARS == 59
