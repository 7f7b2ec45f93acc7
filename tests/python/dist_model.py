"""The model of the sharded-gradient test: its gradients at each step (the
same on every process, from a seed) and how they are sharded (each tensor
flattened and cut into `world` contiguous slices, as FSDP does)."""

from __future__ import annotations

import math
from typing import List

import torch

C_LOW, C_HIGH, ALPHA_MODE = 0.05, 0.3, "exact"
STEPS = 8
# (elements, dtype); sizes not divisible by 4 give uneven and empty shards.
SHAPES = [(30001, torch.float32), (4097, torch.bfloat16), (3, torch.float32), (80000, torch.float32),
          (999, torch.float16)]
# Target cosines: safe, project, skip, project, safe, project, skip.
RHOS = [0.0, 0.02, 0.15, 0.7, -0.2, 0.0, 0.1, 0.9]


def full_gradients(step: int) -> List[torch.Tensor]:
    """The unsharded gradients of `step` (1-based), in their dtypes."""
    gen = torch.Generator().manual_seed(1234)
    raw = [torch.randn(n, dtype=torch.float64, generator=gen) for n, _ in SHAPES]
    for t in range(1, step):
        rho = RHOS[t]
        raw = [rho * r + math.sqrt(1 - rho * rho) * torch.randn(r.shape, dtype=torch.float64, generator=gen)
               for r in raw]
    return [r.to(dtype) for r, (_, dtype) in zip(raw, SHAPES)]


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = t.numel()
    per = -(-n // world)
    return t.reshape(-1)[min(n, rank * per):min(n, (rank + 1) * per)].clone()
