"""The model of test_tp_fsdp.py: a small decoder without attention, as
torchtitan's Llama is made (token embedding, blocks of RMSNorm and a SwiGLU
feed-forward with a residual, a final RMSNorm, the output projection), and
torchtitan's 2-D recipe for it: tensor parallelism with sequence
parallelism on the "tp" dimension of a (dp 2 x tp 2) DeviceMesh (the plan
of torchtitan's apply_tp: ColwiseParallel for w1 and w3, RowwiseParallel
for w2 and the embedding, SequenceParallel for the norms), then FSDP2's
fully_shard of each block and of the root on the "dp" dimension.

The weights never move (no optimizer), so each step's full gradient is an
fp64 forward and backward of the unsharded model over the data-parallel
replicas' batches, averaged as FSDP averages them.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

V, H, FF, LAYERS = 32, 16, 24, 2
BATCH, SEQ = 2, 4  # per data-parallel replica; the sequence is split over the tp ranks
DP, TP = 2, 2
STEPS = 7
# Update 5 repeats update 4's batches: its gradient is update 4's (a skip);
# update 3's first replica's first sequence is update 2's (c_t between the thresholds: a projection).
REPEAT = {5: 4}
SHARED = {3: 2}


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(H, FF, bias=False)
        self.w2 = nn.Linear(FF, H, bias=False)
        self.w3 = nn.Linear(H, FF, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ffn_norm = nn.RMSNorm(H, eps=1e-5)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.feed_forward(self.ffn_norm(x))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, H)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = nn.RMSNorm(H, eps=1e-5)
        self.output = nn.Linear(H, V, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def make_model(dtype: torch.dtype = torch.float32) -> Decoder:
    torch.manual_seed(3)
    model = Decoder()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the norms' weights off 1
    return model.to(dtype)


def batch(step: int, replica: int) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10 * REPEAT.get(step, step) + replica)
    tokens = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    if step in SHARED and replica == 0:
        earlier = batch(SHARED[step], 0)
        tokens[0], targets[0] = earlier[0][0], earlier[1][0]
    return tokens, targets


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def apply_tp(model: Decoder, tp_mesh: object) -> None:
    """torchtitan's apply_tp for this model (sequence parallel, no loss parallel)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    parallelize_module(model, tp_mesh, {  # type: ignore[arg-type]
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {  # type: ignore[arg-type]
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })


def apply_fsdp(model: Decoder, dp_mesh: object) -> None:
    """torchtitan's apply_fsdp: each block, then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh)  # type: ignore[arg-type]
    fully_shard(model, mesh=dp_mesh)  # type: ignore[arg-type]


def full_gradients(step: int) -> Dict[str, torch.Tensor]:
    """The unsharded model's gradient at a step in fp64, averaged over the replicas' batches."""
    model = make_model(torch.float64)
    for replica in range(DP):
        tokens, targets = batch(step, replica)
        (loss_of(model(tokens), targets) / DP).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def names() -> List[str]:
    return [n for n, _ in make_model().named_parameters()]
