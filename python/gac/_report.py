"""StepReport.to_dict: a step report as flat metric names for any logger.

Every key is ``prefix`` + the name of the StepReport field it comes from
(one name per concept: ``gac/cosine`` is ``report.cosine``); the fields
and their order are the report's field table
(gac/controller/report_fields.h, ``gac._controller.REPORT_FIELDS``), plus
one key per layer of ``Agent(layers=...)``: ``gac/cosine/<layer>``,
``gac/grad_norm/<layer>``.

With ``numeric=True`` (the default) every value is an int or a float, so the
dict goes as it is to wandb, TensorBoard, MLflow or a Trainer's logs: the
regime and the mode become their index in :data:`REGIMES` and :data:`MODES`
(ordered by how much GAC does) and the trigger in :data:`TRIGGERS`,
booleans become 0/1, and what has no value (``cosine`` and
``cosine_after`` without a reference, ``window_mean`` until the agent
holds ``window`` cosines, the rule's fields when gacd decided) and text
(``remote_error``) are left out rather than sent as None or NaN. With
``numeric=False`` the values are the report's own: strings, booleans and
None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Tuple

# REGIMES, MODES and TRIGGERS: the names of the C++ enums, by number (a
# regime's, a mode's and a trigger's number in numeric form is its index).
from gac._controller import MODES as MODES
from gac._controller import REGIMES as REGIMES
from gac._controller import REPORT_FIELDS
from gac._controller import TRIGGERS as TRIGGERS

if TYPE_CHECKING:
    from gac._controller import StepReport

_ENUMS: Dict[str, Tuple[str, ...]] = {"regime": REGIMES, "mode": MODES, "trigger": TRIGGERS}

# The report's fields (gac/controller/report_fields.h), in the order of the
# dict: (name, type).
_FIELDS: Tuple[Tuple[str, str], ...] = tuple((f[0], f[1]) for f in REPORT_FIELDS)


def report_to_dict(report: StepReport, prefix: str = "gac/", *, numeric: bool = True) -> Dict[str, object]:
    """Returns ``report``'s fields under flat names ``prefix + field``.

    prefix: put before every name (a str; "" gives the bare field names).
    numeric: True: only ints and floats (regime, mode and trigger as their
        index in REGIMES, MODES and TRIGGERS, booleans as 0/1, text and
        absent values left out); False: the report's own values (strings,
        booleans, None).
    """
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not isinstance(numeric, bool):
        raise TypeError(f"numeric must be a bool, got {type(numeric).__name__}")
    out: Dict[str, object] = {}
    for name, kind in _FIELDS:
        value: object = getattr(report, name)
        if numeric:
            if value is None or kind == "str":
                continue
            if kind in _ENUMS:
                value = _ENUMS[kind].index(str(value))
            elif isinstance(value, bool):
                value = int(value)
        out[prefix + name] = value
    for name, layer in report.layers.items():
        if layer.cosine is not None or not numeric:
            out[f"{prefix}cosine/{name}"] = layer.cosine
        out[f"{prefix}grad_norm/{name}"] = layer.grad_norm
    return out


def to_dict_method(self: StepReport, prefix: str = "gac/", *, numeric: bool = True) -> Dict[str, object]:
    """``StepReport.to_dict``, which gac/__init__.py puts on the class."""
    return report_to_dict(self, prefix, numeric=numeric)


to_dict_method.__name__ = "to_dict"
to_dict_method.__qualname__ = "StepReport.to_dict"
to_dict_method.__doc__ = report_to_dict.__doc__
