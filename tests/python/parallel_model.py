"""The model of test_parallel.py and the layouts its ranks hold it in.

The full model is a few named tensors: a column-wise linear, a row-wise
linear, a norm weight, four experts and an embedding. Its gradients at each
step are drawn from a fixed seed (consecutive cosines set by RHOS), known to
every rank and to the test, which cuts each rank's parts from them: the
ranks hold exactly what the layout's placements say, and the test computes
the expected c_t over the full model, each value counted once.

Layouts (4 ranks): dp_tp (a 2-D mesh, dp x tp: column-wise (Shard(0),
Shard(0)), row-wise (Shard(0), Shard(1)), the norm (Shard(0), Replicate())),
dp_tp_ep (the same, and the experts on a 1-D expert mesh of their own),
hsdp_tp (replicate x shard x tp), pp_tp (two pipeline stages, each a tp mesh
of 2, the embedding tied across them), tp_plain (Megatron-style plain tensors:
tensor-parallel shards, a norm replicated on the tp group, data-parallel
replicas), and two that gac must refuse: partial (a Partial gradient) and
missing (a group that misses a tensor-parallel shard).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

STEPS = 8
# Cosines of consecutive full gradients: none, project, skip, safe, ...
RHOS = [0.0, 0.15, 0.7, 0.0, 0.2, 0.9, 0.02, 0.12]
# Step 5's gradient 30 times the others' (a spike for a bound between them).
SCALES = [1.0, 1.0, 1.0, 1.0, 30.0, 1.0, 1.0, 1.0]
SHAPES = {"w_col": (8, 6), "w_row": (6, 8), "norm": (6,), "experts": (4, 6, 6), "emb": (10, 6)}
_cache: Dict[int, Dict[str, torch.Tensor]] = {}


def full_gradients(step: int) -> Dict[str, torch.Tensor]:
    """The full model's fp32 gradients at `step` (1-based)."""
    if step not in _cache:
        gen = torch.Generator().manual_seed(1000 + step)
        noise = {k: torch.randn(s, generator=gen, dtype=torch.float64) for k, s in SHAPES.items()}
        if step == 1:
            raw = noise
        else:
            prev = full_raw(step - 1)
            rho = RHOS[step - 1]
            raw = {k: rho * prev[k] + math.sqrt(1 - rho * rho) * noise[k] for k in SHAPES}
        _raw[step] = raw
        _cache[step] = {k: (SCALES[step - 1] * v).float() for k, v in raw.items()}
    return _cache[step]


_raw: Dict[int, Dict[str, torch.Tensor]] = {}


def full_raw(step: int) -> Dict[str, torch.Tensor]:
    full_gradients(step)
    return _raw[step]


class Built:
    """This rank's parameters and how to set and gather their gradients."""

    def __init__(self) -> None:
        self.names: List[str] = []
        self.params: List[torch.nn.Parameter] = []
        self.placements: List[object] = []  # per parameter: (mesh, placements), or a slicing function
        self.replicated_on: Dict[int, Optional[dist.ProcessGroup]] = {}
        self.group: Optional[dist.ProcessGroup] = None

    def add_dtensor(self, name: str, mesh: object, placements: List[object]) -> None:
        from torch.distributed.tensor import distribute_tensor

        full = full_gradients(1)[name]
        self.names.append(name)
        self.params.append(torch.nn.Parameter(distribute_tensor(torch.zeros_like(full), mesh, placements)))
        self.placements.append((mesh, placements))

    def add_plain(self, name: str, cut: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.names.append(name)
        self.params.append(torch.nn.Parameter(cut(torch.zeros(SHAPES[name])).clone()))
        self.placements.append(lambda t: cut(t).clone())

    def set_gradients(self, full: Dict[str, torch.Tensor]) -> None:
        from torch.distributed.tensor import distribute_tensor

        for name, p, how in zip(self.names, self.params, self.placements):
            if callable(how):
                p.grad = how(full[name])
            else:
                mesh, placements = how
                p.grad = distribute_tensor(full[name].clone(), mesh, placements)

    def gather(self) -> Dict[str, torch.Tensor]:
        """The full gradients of this rank's DTensor parameters after a step
        (a collective on each mesh), and this rank's cut of the plain ones."""
        out = {}
        for name, p, how in zip(self.names, self.params, self.placements):
            g = p.grad
            out[name] = g.full_tensor().clone() if not callable(how) else (
                g.to_local().clone() if hasattr(g, "to_local") else g.clone())
        return out


def _mesh(shape: tuple, names: tuple) -> object:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def dp_tp(rank: int, world: int, experts: bool = False) -> Built:
    from torch.distributed.tensor import Replicate, Shard

    b = Built()
    mesh = _mesh((2, 2), ("dp", "tp"))
    b.add_dtensor("w_col", mesh, [Shard(0), Shard(0)])
    b.add_dtensor("w_row", mesh, [Shard(0), Shard(1)])
    b.add_dtensor("norm", mesh, [Shard(0), Replicate()])
    if experts:
        b.add_dtensor("experts", _mesh((world,), ("ep",)), [Shard(0)])
    return b


def hsdp_tp(rank: int, world: int) -> Built:
    from torch.distributed.tensor import Replicate, Shard

    b = Built()
    mesh = _mesh((2, 1, 2), ("replicate", "shard", "tp"))
    b.add_dtensor("w_col", mesh, [Replicate(), Shard(0), Shard(0)])
    b.add_dtensor("w_row", mesh, [Replicate(), Shard(0), Shard(1)])
    b.add_dtensor("norm", mesh, [Replicate(), Shard(0), Replicate()])
    return b


def pp_tp(rank: int, world: int) -> Built:
    """Stage 0 (ranks 0, 1): w_col and the embedding; stage 1 (ranks 2, 3):
    w_row, the norm and the same embedding (tied), each stage on its own tp
    mesh; the embedding's holders of one tp shard form a group of 2."""
    from torch.distributed.tensor import Replicate, Shard

    b = Built()
    world_mesh = _mesh((2, 2), ("pp", "tp"))
    tp = world_mesh["tp"]
    stage = rank // 2
    tied = [dist.new_group([k, 2 + k]) for k in range(2)]  # every rank creates both, in order
    if stage == 0:
        b.add_dtensor("w_col", tp, [Shard(0)])
    else:
        b.add_dtensor("w_row", tp, [Shard(1)])
        b.add_dtensor("norm", tp, [Replicate()])
    b.add_dtensor("emb", tp, [Shard(0)])
    b.replicated_on[len(b.params) - 1] = tied[rank % 2]
    return b


def tp_plain(rank: int, world: int) -> Built:
    """Plain tensors as Megatron holds them after the data-parallel
    all-reduce: tp rank k holds rows k of w_col, columns k of w_row and the
    whole norm; the two dp replicas hold the same."""
    b = Built()
    tp_groups = [dist.new_group([2 * d, 2 * d + 1]) for d in range(2)]
    k = rank % 2
    b.add_plain("w_col", lambda t: t.chunk(2, 0)[k])
    b.add_plain("w_row", lambda t: t.chunk(2, 1)[k])
    b.add_plain("norm", lambda t: t)
    b.group = tp_groups[rank // 2]
    b.replicated_on[2] = b.group
    b.replicated_on[0] = b.replicated_on[1] = None  # its own part
    return b


def partial(rank: int, world: int) -> Built:
    """A gradient not yet reduced over its mesh: Partial."""
    from torch.distributed.tensor import DTensor, Partial, Shard

    b = Built()
    mesh = _mesh((world,), ("dp",))
    b.add_dtensor("w_col", mesh, [Shard(0)])
    b.placements[0] = lambda t: DTensor.from_local(t.clone(), mesh, [Partial()])
    return b


def missing(rank: int, world: int) -> Built:
    b = dp_tp(rank, world)
    b.group = b.placements[0][0].get_group("dp")
    return b


LAYOUTS: Dict[str, Callable[[int, int], Built]] = {
    "dp_tp": dp_tp,
    "dp_tp_ep": lambda r, w: dp_tp(r, w, experts=True),
    "hsdp_tp": hsdp_tp,
    "pp_tp": pp_tp,
    "tp_plain": tp_plain,
    "partial": partial,
    "missing": missing,
}

# The full model each layout holds (the names whose values are counted).
MODEL = {
    "dp_tp": ["w_col", "w_row", "norm"],
    "dp_tp_ep": ["w_col", "w_row", "norm", "experts"],
    "hsdp_tp": ["w_col", "w_row", "norm"],
    "pp_tp": ["w_col", "w_row", "norm", "emb"],
    "tp_plain": ["w_col", "w_row", "norm"],
}
