"""The all-reduce of the agent's statistics over a torch.distributed group.

The native agent links no torch (one build serves every torch 2.x), so the
three sums per step (and three per layer) that ranks holding shards of one
model's gradients must add up cross through here: one small fp64 tensor,
all-reduced with ``torch.distributed`` on the group's own device (the
rank's GPU for NCCL, the CPU for Gloo).
"""

from __future__ import annotations

from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Protocol, Sequence,
                    Set, Tuple, Union, cast)

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


class Reduction(NamedTuple):
    """How one rank's statistics join the others'. ``group``: the group the
    sums are all-reduced over (None: no all-reduce, every rank holds whole
    gradients). ``uncounted``: the parameters (indices) this rank holds
    but leaves out of its sums, because another rank of ``group`` holds the
    same values and counts them."""

    group: Optional[torch.distributed.ProcessGroup]
    uncounted: List[int]


# What replicated_on maps a plain tensor to: the group of the ranks that hold
# the same values (None: each rank holds its own part).
ReplicatedOn = Union[Mapping[Any, Optional["torch.distributed.ProcessGroup"]],
                     Callable[[Any], Optional["torch.distributed.ProcessGroup"]]]


def plan_reduction(params: Sequence[object], process_group: Optional[object] = None,
                   replicated_on: Optional[ReplicatedOn] = None) -> Reduction:
    """Every parameter's contribution summed over exactly the ranks that hold
    distinct parts of it, and counted once: what gac.Agent works out on its
    first step (no collective: the parameters' placements say it all).

    A DTensor parameter (FSDP2, HSDP, tensor parallelism, experts on their
    own mesh, any mix of ``Shard``, ``Replicate`` and torch's strided shard
    per mesh dimension) is held identically by the ranks of its mesh that
    share its coordinates on the dimensions it is sharded over; of those in
    the summing group, the lowest rank counts it. A plain tensor is the
    rank's own part, unless ``replicated_on`` names the group of ranks that
    hold the same values (``{param: group}`` or a function of the
    parameter; None for "its own part"): then the lowest of those in the
    summing group counts it. For a DTensor, ``replicated_on`` names a
    replication its mesh does not show (an embedding tied across pipeline
    stages, each on its own mesh): the rank counts it when it is the lowest
    holder both on its mesh and in that group. The summing group is ``process_group`` when
    given; else, for DTensors, the group of their one sharded mesh dimension,
    or the world when they are sharded over several dimensions or meshes
    that each span the world; None when nothing is sharded.

    Raises ValueError for what cannot be counted exactly: a ``Partial``
    placement (gradients not yet reduced), a plain tensor beside DTensors
    with no ``replicated_on`` entry, a group that misses a part of a
    sharded parameter, meshes that span part of the world when no group is
    given (the other ranks may hold other pipeline stages or replicas, which
    the placements cannot tell apart). Assumed, and not checkable: ranks of
    the group outside a parameter's mesh hold other parameters (pipeline
    stages), never replicas of it.
    """
    import torch.distributed as dist

    dtensors = [(i, cast(_DTensor, p)) for i, p in enumerate(params) if _is_dtensor(p)]
    if not dist.is_initialized():
        if process_group is not None or dtensors or (replicated_on is not None and not callable(replicated_on) and
                                                     any(g is not None for g in replicated_on.values())):
            raise ValueError("gac: process groups, DTensor parameters and replicated_on groups need "
                             "torch.distributed initialised (dist.init_process_group) before the first step")
        return Reduction(None, [])
    world = dist.get_world_size()
    rank = dist.get_rank()
    plain = [i for i, p in enumerate(params) if not _is_dtensor(p)]
    for i, p in dtensors:
        for d, placement in enumerate(p.placements):
            _kind(placement, i, d)
        grad = getattr(p, "grad", None)
        if grad is not None and _is_dtensor(grad):
            for d, placement in enumerate(cast(_DTensor, grad).placements):
                _kind(placement, i, d)
    replicas = _replicated_on(params, list(range(len(params))), replicated_on)
    if dtensors and any(i not in replicas for i in plain):
        i = next(i for i in plain if i not in replicas)
        raise ValueError(f"gac: parameter {i} is a plain tensor beside DTensor parameters: say which ranks hold the "
                         "same values, replicated_on={param: group} (None: each rank holds its own part), or make "
                         "it a DTensor")
    group = process_group
    if group is None:
        if not dtensors:
            if any(g is not None for g in replicas.values()):
                raise ValueError("gac: replicated_on names the ranks that hold the same values within the group "
                                 "that sums the statistics; pass that group as process_group= too")
            return Reduction(None, [])
        group = _group_of_meshes([p for _, p in dtensors], world)
        if group is None:
            return Reduction(None, [])
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError("gac: beside DTensor parameters or replicated_on, process_group must be a "
                        f"torch.distributed ProcessGroup, got a {type(group).__name__}")
    members = set(range(world)) if group is dist.group.WORLD else set(dist.get_process_group_ranks(group))

    def lowest_of(g: Optional[torch.distributed.ProcessGroup]) -> bool:
        """This rank is the lowest of g's ranks in the summing group (no g: true)."""
        if g is None:
            return True
        holders = set(dist.get_process_group_ranks(g)) & members
        return rank not in holders or min(holders) == rank

    uncounted = []
    lowest: Dict[Tuple[int, Tuple[int, ...]], int] = {}  # (mesh, its sharded dimensions) -> the lowest holder
    for i, p in dtensors:
        key = (id(p.device_mesh), tuple(d for d, pl in enumerate(p.placements) if _sharded(pl)))
        if key not in lowest:
            lowest[key] = _lowest_holder(i, p, members)
        if lowest[key] != rank or not lowest_of(replicas.get(i)):
            uncounted.append(i)
    for i in plain:
        if not lowest_of(replicas.get(i)):
            uncounted.append(i)
    return Reduction(group, sorted(uncounted))


def _is_dtensor(p: object) -> bool:
    return hasattr(p, "device_mesh") and hasattr(p, "placements")


def _replicated_on(params: Sequence[object], indices: List[int],
                   replicated_on: Optional[ReplicatedOn]) -> Dict[int, Optional[torch.distributed.ProcessGroup]]:
    """The parameters replicated_on says something of: index -> group."""
    if replicated_on is None:
        return {}
    out = {}
    for i in indices:
        if callable(replicated_on):
            out[i] = replicated_on(params[i])
        elif params[i] in replicated_on:  # tensors hash by identity
            out[i] = replicated_on[params[i]]
    return out


def _group_of_meshes(params: Sequence[_DTensor], world: int) -> Optional[torch.distributed.ProcessGroup]:
    """The summing group when none is given: see plan_reduction."""
    import torch.distributed as dist

    meshes: List[DeviceMesh] = []
    sharded = set()
    for p in params:
        if not any(p.device_mesh is m or p.device_mesh == m for m in meshes):
            meshes.append(p.device_mesh)
        m = next(k for k, m in enumerate(meshes) if p.device_mesh is m or p.device_mesh == m)
        sharded |= {(m, d) for d, pl in enumerate(p.placements) if _sharded(pl)}
    if not sharded:
        return None
    partial = [m for m in meshes if m.size() != world]
    if partial:
        raise ValueError(f"gac: the parameters' device mesh spans {partial[0].size()} of the world's {world} "
                         "ranks; the others hold other pipeline stages or replicas, which the placements cannot "
                         "tell apart. Pass process_group=dist.group.WORLD when they hold other parameters "
                         "(pipeline parallelism: each part is counted once), or the group of the mesh's ranks "
                         "when they hold replicas of these")
    if len(sharded) == 1:
        m, d = next(iter(sharded))
        mesh = meshes[m]
        return mesh.get_group(d) if mesh.ndim > 1 else mesh.get_group()
    return dist.group.WORLD


def _lowest_holder(i: int, p: _DTensor, members: Set[int]) -> int:
    """The lowest rank of `members` that holds the same part of parameter i as
    this rank: same coordinates on its sharded mesh dimensions. ValueError when
    `members` misses a part of it."""
    mesh = p.device_mesh
    ranks = mesh.mesh  # the mesh's ranks, one tensor dimension per mesh dimension
    coordinate = mesh.get_coordinate()
    assert coordinate is not None, "a DTensor parameter on a mesh without this rank"
    sharded = [d for d, pl in enumerate(p.placements) if _sharded(pl)]
    index = tuple(coordinate[d] if d in sharded else slice(None) for d in range(mesh.ndim))
    holders = {int(r) for r in ranks[index].flatten().tolist()} & members
    # Every part needs a holder in the group, or its sums are missing.
    parts = {tuple(int(c) for c in (ranks == r).nonzero()[0][sharded].tolist()) for r in members
             if bool((ranks == r).any())}
    needed = 1
    for d in sharded:
        needed *= mesh.size(d)
    if len(parts) < needed:
        names = [str(n) for n in mesh.mesh_dim_names] if mesh.mesh_dim_names else [str(d) for d in range(mesh.ndim)]
        raise ValueError(f"gac: parameter {i} is sharded over mesh dimensions {[names[d] for d in sharded]}, "
                         f"and the group that sums the statistics holds {len(parts)} of its {needed} parts: the "
                         "others would be missing. Pass a group that spans every dimension the parameters are "
                         "sharded over (dist.group.WORLD spans them all)")
    return min(holders)


def _sharded(placement: Placement) -> bool:
    """Shard, or torch's strided shard (what fully_shard over tensor
    parallelism gives column-wise weights), which from torch 2.10 on is
    neither a Shard nor is_shard(). Which elements a rank holds, not how
    often: counted like Shard."""
    return placement.is_shard() or type(placement).__name__ in ("_StridedShard", "StridedShard")


def _kind(placement: Placement, i: int, d: int) -> str:
    if _sharded(placement):
        return "shard"
    if placement.is_replicate():
        return "replicate"
    if placement.is_partial():
        raise ValueError(f"gac: parameter {i} is placed {placement} (Partial) on mesh dimension {d}: its gradient is "
                         "not yet reduced over that dimension. Call agent.step after the gradients are reduced (after "
                         "backward, once FSDP or the parallel plan has reduced them), or redistribute them to "
                         "Shard or Replicate first")
    raise ValueError(f"gac: parameter {i} is placed {placement} on mesh dimension {d}, a placement gac does not know: "
                     "it cannot tell which ranks hold the same values")
