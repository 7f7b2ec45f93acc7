"""The model and data of test_deepspeed.py and its workers: three linear
layers, 231 parameters (not a multiple of the ranks: ZeRO pads the last
partition), and batches that make every regime occur: a fresh batch, the
previous step's batch again (c_t near 1: skip), or half of it (in between)."""

from __future__ import annotations

from typing import Tuple

import torch

STEPS = 12
# What each step's batch is made of.
KINDS = ["fresh", "fresh", "repeat", "half", "fresh", "half", "repeat", "fresh", "half", "fresh", "repeat", "half"]


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 10), torch.nn.Tanh(), torch.nn.Linear(10, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, 3))


def _fresh(step: int, rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 12, generator=gen), torch.randn(4, 3, generator=gen)


def batch(step: int, rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s batch of step `step` (from 1): 4 examples."""
    kind = KINDS[step - 1]
    if kind == "fresh" or step == 1:
        return _fresh(step, rank)
    x0, y0 = batch(step - 1, rank)
    if kind == "repeat":
        return x0, y0
    x1, y1 = _fresh(step, rank)
    return torch.cat([x0[:2], x1[2:]]), torch.cat([y0[:2], y1[2:]])
