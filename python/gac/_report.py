"""StepReport.to_dict: a step report as flat metric names for any logger.

Every key is ``prefix`` + the name of the StepReport field it comes from
(one name per concept: ``gac/cosine`` is ``report.cosine``), plus
``skipped`` (``not report.step_optimizer``) and one key per layer of
``Agent(layers=...)``: ``gac/cosine/<layer>``, ``gac/grad_norm/<layer>``.

With ``numeric=True`` (the default) every value is an int or a float, so the
dict goes as it is to wandb, TensorBoard, MLflow or a Trainer's logs: the
regime and the mode become their index in :data:`REGIMES` and :data:`MODES`
(ordered by how much GAC does), booleans become 0/1, and what has no value
(``cosine`` and ``cosine_after`` without a reference, ``window_mean``
until the agent holds ``window`` cosines, ``remote_error`` without an
error) is left out rather than sent as None or NaN. With
``numeric=False`` the values are the report's own: strings, booleans and
None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Tuple

if TYPE_CHECKING:
    from gac._controller import StepReport

# The regime's number in numeric form: 0 safe, 1 project, 2 skip, 3 invalid.
REGIMES: Tuple[str, ...] = ("safe", "project", "skip", "invalid")
# The mode's number in numeric form: 0 monitor, 1 local, 2 remote.
MODES: Tuple[str, ...] = ("monitor", "local", "remote")

# StepReport fields copied as they are, in the order of the dict.
_FIELDS = ("step", "mode", "regime", "cosine", "cosine_after", "window_mean", "alpha", "projection_coeff",
           "grad_norm", "ref_norm", "step_optimizer", "skipped", "gradient_modified", "fallback", "remote_error",
           "elements", "tensors", "strided_tensors", "stats_seconds", "decide_seconds", "apply_seconds",
           "agent_overhead_seconds")


def report_to_dict(report: StepReport, prefix: str = "gac/", *, numeric: bool = True) -> Dict[str, object]:
    """Returns ``report``'s fields under flat names ``prefix + field``.

    prefix: put before every name (a str; "" gives the bare field names).
    numeric: True: only ints and floats (regime and mode as their index in
        REGIMES and MODES, booleans as 0/1, absent values left out);
        False: the report's own values (strings, booleans, None).
    """
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not isinstance(numeric, bool):
        raise TypeError(f"numeric must be a bool, got {type(numeric).__name__}")
    out: Dict[str, object] = {}
    for name in _FIELDS:
        value: object = not report.step_optimizer if name == "skipped" else getattr(report, name)
        if numeric:
            if value is None or name == "remote_error":
                continue
            if name == "regime":
                value = REGIMES.index(value)
            elif name == "mode":
                value = MODES.index(value)
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
