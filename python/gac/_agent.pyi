"""The in-process GAC agent, over torch's Python API (no LibTorch)."""

from typing import Dict, Iterable, List, Literal, Optional, Tuple, TypedDict, Union

import torch
import torch.distributed

from gac._controller import AlphaMode, DecisionSource, Mode, StepReport, Trigger
from gac._dist import ReplicatedOn
from gac.rl import PolicySignals

class Agent:
    def __init__(
        self,
        c_low: float = 0.05,
        c_high: float = 0.3,
        *,
        mode: Mode = "local",
        alpha_mode: AlphaMode = "paper",
        snapshot_dtype: Union[torch.dtype, Literal["float32", "bfloat16"]] = "float32",
        reference: Literal["raw_gradient", "applied_update"] = "raw_gradient",
        layers: Optional[Dict[str, Iterable[torch.Tensor]]] = None,
        groups: Optional[Dict[str, Iterable[torch.Tensor]]] = None,  # deprecated: layers
        process_group: Optional[torch.distributed.ProcessGroup] = None,
        decision_source: Optional[DecisionSource] = None,
        num_threads: int = 0,
        chunk_elements: int = 65536,
        trigger: Trigger = "per_step",
        window: int = 20,
        window_c_low: float = 0.05,
        window_c_high: float = 0.3,
        max_grad_norm: Optional[float] = None,
        spike_sigma: Optional[float] = None,
        spike_window: Optional[int] = None,
        spike_warmup: Optional[int] = None,
        passes: Literal["auto", "kernels", "torch"] = "auto",
        replicated_on: Optional[ReplicatedOn] = None,
    ) -> None: ...
    def step(self, step: int, params: Iterable[torch.Tensor],
             loss: Union[float, torch.Tensor, None] = None,
             policy: Optional[PolicySignals] = None) -> StepReport: ...
    def reset(self) -> None: ...
    @property
    def mode(self) -> Mode: ...
    @mode.setter
    def mode(self, mode: Mode) -> None: ...
    def set_thresholds(self, c_low: float, c_high: float) -> None: ...
    @property
    def fallbacks(self) -> int: ...
    @property
    def c_low(self) -> float: ...
    @property
    def c_high(self) -> float: ...
    @property
    def alpha_mode(self) -> AlphaMode: ...
    @property
    def trigger(self) -> Trigger: ...
    @property
    def window(self) -> int: ...
    @property
    def window_c_low(self) -> float: ...
    @property
    def window_c_high(self) -> float: ...
    @property
    def window_held(self) -> int: ...
    @property
    def max_grad_norm(self) -> float: ...
    @property
    def spike_sigma(self) -> Optional[float]: ...
    @property
    def spike_window(self) -> Optional[int]: ...
    @property
    def spike_warmup(self) -> Optional[int]: ...
    @property
    def snapshot_dtype(self) -> Literal["float32", "bfloat16"]: ...
    @property
    def reference(self) -> Literal["raw_gradient", "applied_update"]: ...
    @property
    def chunk_elements(self) -> int: ...
    @property
    def passes(self) -> Literal["auto", "kernels", "torch"]: ...
    @property
    def layer_names(self) -> Optional[List[str]]: ...
    @property
    def decision_source(self) -> Optional[DecisionSource]: ...
    @property
    def process_group(self) -> Optional[torch.distributed.ProcessGroup]: ...
    @process_group.setter
    def process_group(self, group: Optional[torch.distributed.ProcessGroup]) -> None: ...
    @property
    def replicated_on(self) -> Optional[ReplicatedOn]: ...
    @property
    def snapshot_bytes(self) -> int: ...
    @property
    def num_threads(self) -> int: ...
    @property
    def kernel_isa(self) -> str: ...
    def _time_cpp_step(self, step: int) -> Tuple[float, StepReport]: ...

class BuildInfo(TypedDict):
    cuda_runtime: Optional[str]
    cuda_runtime_static: Optional[bool]
    cuda_archs: List[str]
    cuda_compiler: Optional[str]
    compiler: str
    glibc_built_against: Optional[str]

class CudaDevice(TypedDict):
    index: int
    name: str
    compute_capability: str
    kernels: Optional[str]

class CudaDevices(TypedDict):
    driver: Optional[str]
    error: Optional[str]
    devices: List[CudaDevice]

def build_info() -> BuildInfo: ...
def cuda_devices() -> CudaDevices: ...
