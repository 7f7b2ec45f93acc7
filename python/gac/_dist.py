"""The all-reduce of the agent's statistics over a torch.distributed group.

The native agent links no torch (one build serves every torch 2.x), so the
three sums per step (and three per layer) that ranks holding shards of one
model's gradients must add up cross through here: one small fp64 tensor,
all-reduced with ``torch.distributed`` on the group's own device (the
rank's GPU for NCCL, the CPU for Gloo).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence, Tuple, cast

if TYPE_CHECKING:
    import torch
    import torch.distributed
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.placement_types import Placement


class _Work(Protocol):
    def wait(self) -> object: ...


class _Backend(Protocol):
    """A bare c10d backend (``dist.ProcessGroupGloo(store, rank, size)``)."""

    def allreduce(self, tensors: List[torch.Tensor]) -> _Work: ...
    def size(self) -> int: ...
    def rank(self) -> int: ...


class _DTensor(Protocol):
    """What is read of a DTensor parameter."""

    device_mesh: DeviceMesh
    placements: Sequence[Placement]


class AllReduce:
    """``AllReduce(group)(values)`` returns the sums of ``values`` over ``group``.

    group: a ``torch.distributed`` ProcessGroup (``dist.group.WORLD``,
    ``dist.new_group(...)``, a DeviceMesh's group) or a bare c10d backend such
    as ``dist.ProcessGroupGloo(store, rank, size)``.
    """

    def __init__(self, group: object) -> None:
        import torch
        import torch.distributed as dist

        self._torch = torch
        self._group: Optional[torch.distributed.ProcessGroup] = None
        self._backend: Optional[_Backend] = None
        if isinstance(group, dist.ProcessGroup):
            self._group = group
            self.rank = dist.get_rank(group)
            self.world_size = dist.get_world_size(group)
            name = str(dist.get_backend(group)).lower()
        elif hasattr(group, "allreduce") and hasattr(group, "size") and hasattr(group, "rank"):
            self._backend = cast(_Backend, group)
            self.rank = self._backend.rank()
            self.world_size = self._backend.size()
            name = str(group.getBackendName() if hasattr(group, "getBackendName") else "").lower()
        else:
            raise TypeError("process_group must be a torch.distributed ProcessGroup (e.g. dist.group.WORLD or "
                            "dist.new_group(...)) or a c10d backend (dist.ProcessGroupGloo(...)), got a "
                            + type(group).__name__)
        self._device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in name else torch.device("cpu")

        # One buffer per length, held here for the agent's life. The c10d work
        # object keeps the tensor it reduced, and a Gloo worker thread drops
        # that reference after the call returns; were Python's reference gone
        # by then, the worker would free the tensor's Python object and need
        # the GIL for it, while a thread destroying the process group holds
        # the GIL and joins that worker: a deadlock seen at exit with torch 2.6.
        # (Set after _group, they are also released after it.)
        self._buffers: Dict[int, torch.Tensor] = {}

    def __call__(self, values: Sequence[float]) -> List[float]:
        import torch.distributed as dist

        torch = self._torch
        n = len(values)
        t = self._buffers.get(n)
        if t is None:
            t = self._buffers[n] = torch.zeros(n, dtype=torch.float64, device=self._device)
        t.copy_(torch.tensor(list(values), dtype=torch.float64))
        if self._backend is not None:
            self._backend.allreduce([t]).wait()
        else:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self._group)
        sums: List[float] = t.tolist()
        return sums


def dtensor_group(params: Sequence[object]) -> Optional[torch.distributed.ProcessGroup]:
    """The group over which the local shards of DTensor parameters (FSDP2's
    ``fully_shard``, HSDP) are summed so that every element counts once: the
    mesh dimension their placements shard (``Shard``), not the ones they
    replicate (``Replicate``: every replica holds the same shard, and summing
    over it would count it once per replica). None when no dimension is
    sharded (every rank holds whole gradients). gac.Agent calls it on its
    first step when no ``process_group`` is given.

    Raises ValueError for what one group cannot sum exactly: plain tensors
    beside DTensors, several meshes, placements that differ between
    parameters on a dimension (tensor parallelism), or ``Partial``
    placements (gradients not yet reduced); pass ``process_group=`` then.
    """
    import torch.distributed as dist

    mesh: Optional[DeviceMesh] = None
    kinds: Optional[Tuple[str, ...]] = None
    for i, param in enumerate(params):
        if not hasattr(param, "device_mesh") or not hasattr(param, "placements"):
            raise ValueError(f"gac: parameter {i} is a plain tensor beside DTensor parameters; "
                             "pass process_group= to say over which group the statistics are summed")
        p = cast(_DTensor, param)
        if mesh is None:
            mesh = p.device_mesh
        elif p.device_mesh != mesh:
            raise ValueError(f"gac: parameter {i} lives on another device mesh than parameter 0; "
                             "pass process_group= explicitly")
        these = tuple(_kind(pl, i) for pl in p.placements)
        if kinds is None:
            kinds = these
        elif these != kinds:
            raise ValueError(f"gac: parameter {i} is placed {these} and parameter 0 {kinds}: placements that "
                             "differ between parameters (tensor parallelism) are not summed by one group; "
                             "pass process_group= explicitly")
    if mesh is None or kinds is None:
        return None
    sharded = [d for d, k in enumerate(kinds) if k == "shard"]
    if not sharded:
        return None
    if len(sharded) == 1:
        return mesh.get_group(sharded[0]) if mesh.ndim > 1 else mesh.get_group()
    if len(sharded) == mesh.ndim and mesh.size() == dist.get_world_size():
        return dist.group.WORLD
    raise ValueError(f"gac: the parameters are sharded on mesh dimensions {sharded} of {mesh.ndim}; "
                     "pass process_group= with the group over those dimensions")


def _kind(placement: Placement, i: int) -> str:
    if placement.is_shard():
        return "shard"
    if placement.is_replicate():
        return "replicate"
    raise ValueError(f"gac: parameter {i} has placement {placement} (gradients not yet reduced); "
                     "call agent.step after the data-parallel reduction")
