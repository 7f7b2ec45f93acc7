"""Telemetry to gacd and gacd as a decision source (no torch)."""

import os
from types import TracebackType
from typing import Dict, Mapping, Optional, Type, Union

from gac._controller import AlphaMode, DecisionSource, Mode, StepReport

_Tls = Union[str, bytes, "os.PathLike[str]", None]

class TelemetryCounters:
    @property
    def enqueued(self) -> int: ...
    @property
    def dropped_queue_full(self) -> int: ...
    @property
    def records_sent(self) -> int: ...
    @property
    def records_acknowledged(self) -> int: ...
    @property
    def records_spooled(self) -> int: ...
    @property
    def batches_replayed(self) -> int: ...
    @property
    def records_replayed(self) -> int: ...
    @property
    def records_rejected(self) -> int: ...
    @property
    def spool_errors(self) -> int: ...
    @property
    def dropped_at_close(self) -> int: ...
    @property
    def reconnects(self) -> int: ...
    @property
    def failovers(self) -> int: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def unacknowledged(self) -> int: ...
    def to_dict(self) -> Dict[str, int]: ...

class SpoolRecovery:
    @property
    def entries(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def dropped_entries(self) -> int: ...
    @property
    def dropped_bytes(self) -> int: ...
    @property
    def detail(self) -> str: ...

class Telemetry:
    def __init__(
        self,
        address: str,
        run: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        spool_dir: Union[str, "os.PathLike[str]", None] = None,
        token: Optional[str] = None,
        tls: _Tls = None,
        queue_capacity: int = 65536,
        flush_interval: float = 0.05,
        spool_max_bytes: int = 268435456,
        fsync: bool = False,
    ) -> None: ...
    def send(
        self,
        report: StepReport,
        scalars: Optional[Mapping[str, float]] = None,
        staleness: Optional[int] = None,
    ) -> bool: ...
    def flush(self, timeout: float = 10.0) -> bool: ...
    def close(self, timeout: float = 10.0) -> None: ...
    @property
    def counters(self) -> TelemetryCounters: ...
    @property
    def recovery(self) -> SpoolRecovery: ...
    @property
    def last_error(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def run(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def __enter__(self) -> "Telemetry": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...

class RemoteController(DecisionSource):
    def __init__(
        self,
        address: str,
        run: str,
        *,
        rank: int = 0,
        token: Optional[str] = None,
        tls: _Tls = None,
        deadline: float = 0.05,
    ) -> None: ...
    def set_thresholds(
        self,
        c_low: float,
        c_high: float,
        alpha_mode: AlphaMode = "paper",
        reason: str = "",
        mode: Optional[Mode] = None,
    ) -> None: ...
    def set_spike_guard(
        self,
        *,
        max_grad_norm: Optional[float] = None,
        spike_sigma: Optional[float] = None,
        spike_window: Optional[int] = None,
        spike_warmup: Optional[int] = None,
        reason: str = "",
    ) -> None: ...
    def set_run_thresholds(self, c_low: float, c_high: float, alpha_mode: AlphaMode = "paper", reason: str = "") -> None: ...  # deprecated: set_thresholds (removed in 0.3.0)

def check_gacd(address: str, *, token: Optional[str] = None, tls: _Tls = None, timeout: float = 2.0) -> str: ...
