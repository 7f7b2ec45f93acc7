"""The model and data of test_sharded.py and its workers: three linear
layers whose first dimensions (10, 7, 3) do not divide evenly among 4
ranks, so that FSDP gives some ranks short and empty shards."""

from __future__ import annotations

from typing import Tuple

import torch

STEPS = 10


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 10), torch.nn.Tanh(), torch.nn.Linear(10, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, 3))


def batch(step: int, rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s batch of step `step`: 4 examples."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 12, generator=gen), torch.randn(4, 3, generator=gen)
