"""gac: Gradient Alignment Control for asynchronous RL, in PyTorch trainers.

The three lines a training loop needs (docs/PYTHON.md has the rest)::

    report = agent.step(step, model.parameters())   # after backward, before clipping
    if report.step_optimizer:
        optimizer.step()
    telemetry.send(report, scalars={"reward": reward})

Everything runs in gac's C++ libraries: :class:`Agent` (``gac._agent``, the
torch-free agent core, which reads tensors through torch's Python API and so
works with any torch 2.x) reads and projects the gradients in place,
:class:`Telemetry` and :class:`RemoteController` (``gac._transport``) talk
to gacd, and :class:`Controller` and the calibration helpers
(``gac._controller``) need neither torch nor gRPC. ``import gac`` loads only
the last; torch and the transport are loaded on first use of a name that
needs them. :mod:`gac.v1` holds gacd's gRPC API for Python clients (the
generated messages and stubs; protobuf and grpcio, ``gac[client]``) and is
imported only by its users.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from gac._controller import (
    AlignmentStats,
    CalibrationStats,
    CalibrationWindow,
    Controller,
    Decision,
    DecisionSource,
    LayerStats,
    StepReport,
    calibration_stats,
    cosine_after_projection,
    suggest_thresholds,
)
from gac._attach import Attachment, attach
from gac._report import MODES, REGIMES, _to_dict_method
from gac._errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    GacError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    StatusCode,
    UnavailableError,
    UnimplementedError,
)

if TYPE_CHECKING:
    from gac._agent import Agent
    from gac._transport import RemoteController, SpoolRecovery, Telemetry, TelemetryCounters

__version__ = "0.1.0"

# report.to_dict(): flat metric names ("gac/cosine", ...) for any logger (gac/_report.py).
StepReport.to_dict = _to_dict_method  # type: ignore[method-assign]

# Names loaded on first use, and the module (and what it needs) that has them.
_LAZY = {
    "Agent": ("gac._agent", "its native module gac._agent"),
    "Telemetry": ("gac._transport", "a build with gRPC (GAC_WITH_GRPC)"),
    "RemoteController": ("gac._transport", "a build with gRPC (GAC_WITH_GRPC)"),
    "TelemetryCounters": ("gac._transport", "a build with gRPC (GAC_WITH_GRPC)"),
    "SpoolRecovery": ("gac._transport", "a build with gRPC (GAC_WITH_GRPC)"),
}


# Former names, still served with a DeprecationWarning.
_DEPRECATED = {"GroupStats": "LayerStats"}


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        warnings.warn(f"gac.{name} is deprecated; use gac.{new}", DeprecationWarning, stacklevel=2)
        return globals()[new]
    if name not in _LAZY:
        raise AttributeError(f"module 'gac' has no attribute {name!r}")
    module, needs = _LAZY[name]
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ImportError(f"gac.{name} needs {needs}: {e}") from e
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Agent",
    "AlignmentStats",
    "Attachment",
    "CalibrationStats",
    "CalibrationWindow",
    "Controller",
    "Decision",
    "DecisionSource",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "GacError",
    "InvalidArgumentError",
    "LayerStats",
    "MODES",
    "NotFoundError",
    "PermissionDeniedError",
    "REGIMES",
    "RemoteController",
    "SpoolRecovery",
    "StatusCode",
    "StepReport",
    "Telemetry",
    "TelemetryCounters",
    "UnavailableError",
    "UnimplementedError",
    "attach",
    "calibration_stats",
    "cosine_after_projection",
    "suggest_thresholds",
]
