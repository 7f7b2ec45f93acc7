"""The model of test_megatron.py, the layouts its 4 ranks hold it in with
megatron-core, and its fp64 reference.

The full model, a tiny language model: a word embedding W_emb (V x H), a
column-parallel linear (W1, b1; GELU), a row-parallel linear (W2, b2), a
LayerNorm (ln_w, ln_b), optionally E experts (each an MLP of Megatron's,
E{e}.W1, E{e}.b1, E{e}.W2, E{e}.b2, its output, bias included, weighed by a
fixed router probability PROBS[e], as Megatron's MLP weighs an expert's, and
added to the normed hidden state), and the output
layer tied to the embedding (logits = z W_emb^T); the loss is the mean
cross-entropy over the tokens, averaged over the data-parallel replicas'
batches.

Megatron's layers hold it cut by their attributes (partition_dim): W_emb,
W1, b1 by rows across the tensor-parallel ranks, W2 by columns; b2, the
norm and the experts' weights (expert tensor parallelism 1) whole; the
experts split over the expert-parallel ranks; with two pipeline stages the
first holds the embedding and W1, the last W2, the norm, the experts and a
copy of the embedding (the output layer's weight, Megatron's `shared`).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

V, H, FF, FE, E = 16, 8, 12, 6, 4  # vocabulary, hidden, ffn, expert ffn, experts
TOKENS = 6  # per data-parallel replica and step
STEPS = 7
PROBS = [0.9, 0.6, 0.4, 0.7]  # each expert's router probability (every token goes to every expert)
# Update 5 repeats update 4's batches: its gradient points where the last one did (a skip).
REPEAT = {5: 4}
LR = 0.02


@dataclasses.dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    ep: int = 1
    distributed: bool = False  # Megatron's distributed optimizer (use_distributed_optimizer)
    bf16: bool = False  # bf16 parameters (Float16OptimizerWithFloat16Params / fp32 main shards)

    @property
    def dp(self) -> int:
        return 4 // (self.tp * self.pp)

    @property
    def experts(self) -> bool:
        return self.ep > 1


LAYOUTS = {
    # tp 2 x pp 2: the embedding on stage 0, its tied copy on stage 1 (non-distributed FP32Optimizer)
    "tp_pp": Layout(tp=2, pp=2),
    # tp 2 x dp 2, 4 experts on 2 expert-parallel ranks: ChainedOptimizer of a dense and an expert FP32Optimizer
    "tp_dp_ep": Layout(tp=2, pp=1, ep=2),
    # the same with the distributed optimizer: each data-parallel rank holds shards
    "tp_dp_ep_distopt": Layout(tp=2, pp=1, ep=2, distributed=True),
    # dp 2 x pp 2, the tied embedding sharded by the distributed optimizer on both stages
    "dp_pp_distopt": Layout(tp=1, pp=2, distributed=True),
    # bf16 parameters, fp32 main copies (Float16OptimizerWithFloat16Params), tp 2 x pp 2
    "tp_pp_bf16": Layout(tp=2, pp=2, bf16=True),
}

# Full name -> (shape, the dimension tensor parallelism cuts, or None: held whole).
SHAPES: Dict[str, Tuple[Tuple[int, ...], Optional[int]]] = {
    "W_emb": ((V, H), 0), "W1": ((FF, H), 0), "b1": ((FF,), 0), "W2": ((H, FF), 1), "b2": ((H,), None),
    "ln_w": ((H,), None), "ln_b": ((H,), None),
}
for _e in range(E):
    SHAPES.update({f"E{_e}.W1": ((FE, H), None), f"E{_e}.b1": ((FE,), None), f"E{_e}.W2": ((H, FE), None),
                   f"E{_e}.b2": ((H,), None)})


def names(layout: Layout) -> List[str]:
    """The full model's parameters, each once (the tied embedding once)."""
    return [n for n in SHAPES if layout.experts or not n.startswith("E")]


def initial_weights() -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    out = {}
    for name, (shape, _) in SHAPES.items():
        scale = 1.0 if name == "W_emb" else 0.3
        out[name] = scale * torch.randn(shape, generator=gen, dtype=torch.float64)
    out["ln_w"] = 1.0 + 0.1 * out["ln_w"]
    return {k: v.float() for k, v in out.items()}


def batch(step: int, replica: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The token ids and targets of a data-parallel replica at an update (1-based)."""
    gen = torch.Generator().manual_seed(100 * REPEAT.get(step, step) + replica)
    ids = torch.randint(0, V, (TOKENS,), generator=gen)
    return ids, torch.randint(0, V, (TOKENS,), generator=gen)


def local_name(name: str, ep_rank: int, experts_per_rank: int) -> Optional[str]:
    """The full name of a Megatron module's parameter on a rank (the worker's Stage)."""
    fixed = {"emb.weight": "W_emb", "out.weight": "W_emb", "col.weight": "W1", "col.bias": "b1",
             "row.weight": "W2", "row.bias": "b2", "norm.weight": "ln_w", "norm.bias": "ln_b"}
    if name in fixed:
        return fixed[name]
    # experts.local_experts.<j>.linear_fc<1|2>.<weight|bias>
    parts = name.split(".")
    if parts[0] == "experts":
        e = ep_rank * experts_per_rank + int(parts[2])
        return f"E{e}.{'W' if parts[4] == 'weight' else 'b'}{parts[3][-1]}"
    return None


def cut(full: torch.Tensor, name: str, tp_rank: int, tp: int) -> torch.Tensor:
    """A tensor-parallel rank's part of a full tensor."""
    dim = SHAPES[name][1]
    return full if dim is None else full.chunk(tp, dim)[tp_rank]


def join(parts: List[torch.Tensor], name: str) -> torch.Tensor:
    """The full tensor from the tensor-parallel ranks' parts, in rank order."""
    dim = SHAPES[name][1]
    return parts[0] if dim is None else torch.cat(parts, dim)


def reference_gradients(layout: Layout, weights: Dict[str, torch.Tensor], step: int) -> Dict[str, torch.Tensor]:
    """The full model's gradients in fp64 at an update, from the full weights."""
    w = {k: v.double().clone().requires_grad_(True) for k, v in weights.items() if k in names(layout)}
    losses = []
    for replica in range(layout.dp):
        ids, targets = batch(step, replica)
        e = w["W_emb"][ids]
        a = F.gelu(e @ w["W1"].T + w["b1"])
        h = a @ w["W2"].T + w["b2"]
        z = F.layer_norm(h, (H,), w["ln_w"], w["ln_b"], eps=1e-5)
        if layout.experts:
            z = z + sum(PROBS[k] * (F.gelu(z @ w[f"E{k}.W1"].T + w[f"E{k}.b1"]) @ w[f"E{k}.W2"].T
                                    + w[f"E{k}.b2"]) for k in range(E))
        losses.append(F.cross_entropy(z @ w["W_emb"].T, targets))
    loss = torch.stack(losses).mean()
    grads = torch.autograd.grad(loss, [w[n] for n in names(layout)])
    return dict(zip(names(layout), grads))

