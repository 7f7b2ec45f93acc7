"""The native modules that gac loads on first use, and what each needs.

``gac._controller`` is loaded with the package; ``gac._agent`` (the agent
core) and ``gac._transport`` (the telemetry sender and gacd as a decision
source: a build with gRPC) are loaded when one of their classes is first
asked for, through the functions below: ``gac.Agent`` and the other names
of :data:`LAZY` (the package's ``__getattr__``), and the package's own
modules. A module that cannot be loaded raises ImportError saying what the
name needs. The native classes keep their deprecated aliases themselves,
warning through gac/_deprecation.py.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Type

if TYPE_CHECKING:
    from gac._agent import Agent
    from gac._transport import RemoteController, SpoolRecovery, Telemetry, TelemetryCounters

_AGENT = "its native module gac._agent"
_TRANSPORT = "a build with gRPC (GAC_WITH_GRPC)"


@contextlib.contextmanager
def _needs(name: str, what: str) -> Iterator[None]:
    try:
        yield
    except ImportError as e:
        raise ImportError(f"gac.{name} needs {what}: {e}") from e


def agent_class() -> Type[Agent]:
    """gac.Agent (``gac._agent``)."""
    with _needs("Agent", _AGENT):
        from gac._agent import Agent
    return Agent


def telemetry_class() -> Type[Telemetry]:
    """gac.Telemetry (``gac._transport``)."""
    with _needs("Telemetry", _TRANSPORT):
        from gac._transport import Telemetry
    return Telemetry


def remote_controller_class() -> Type[RemoteController]:
    """gac.RemoteController (``gac._transport``)."""
    with _needs("RemoteController", _TRANSPORT):
        from gac._transport import RemoteController
    return RemoteController


def _telemetry_counters_class() -> Type[TelemetryCounters]:
    with _needs("TelemetryCounters", _TRANSPORT):
        from gac._transport import TelemetryCounters
    return TelemetryCounters


def _spool_recovery_class() -> Type[SpoolRecovery]:
    with _needs("SpoolRecovery", _TRANSPORT):
        from gac._transport import SpoolRecovery
    return SpoolRecovery


# The package's names loaded on first use, and the function that loads each.
LAZY: Dict[str, Callable[[], type]] = {
    "Agent": agent_class,
    "Telemetry": telemetry_class,
    "RemoteController": remote_controller_class,
    "TelemetryCounters": _telemetry_counters_class,
    "SpoolRecovery": _spool_recovery_class,
}
