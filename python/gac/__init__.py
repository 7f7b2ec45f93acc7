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

from typing import TYPE_CHECKING

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
from gac._attach import attach
from gac._attachment import Attachment
from gac._deprecation import extend_step_report, warn_deprecated
from gac._native import LAZY
from gac._report import MODES, REGIMES, TRIGGERS, to_dict_method
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

# report.to_dict(): flat metric names ("gac/cosine", ...) for any logger (gac/_report.py);
# report.groups and report.seconds, former names, warn (gac/_deprecation.py).
setattr(StepReport, "to_dict", to_dict_method)
extend_step_report(StepReport)

# The package's former names (gac/_deprecation.py lists every alias).
_FORMER_NAMES = {"GroupStats": LayerStats}


def __getattr__(name: str) -> object:
    # PEP 562: the names of the native modules loaded on first use (gac/_native.py), and the former names.
    if name in _FORMER_NAMES:
        warn_deprecated(f"gac.{name}", stacklevel=2)
        return _FORMER_NAMES[name]
    if name not in LAZY:
        raise AttributeError(f"module 'gac' has no attribute {name!r}")
    value = LAZY[name]()
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(LAZY))


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
    "TRIGGERS",
    "Telemetry",
    "TelemetryCounters",
    "UnavailableError",
    "UnimplementedError",
    "attach",
    "calibration_stats",
    "cosine_after_projection",
    "suggest_thresholds",
]
