"""One rank of test_megatron.py: megatron-core 0.19.2 on a Gloo group of 4 CPU
processes (megatron_cpu.py answers its few GPU-only calls), with GAC attached
by gac.integrations.megatron.

Megatron's own parallel_state (initialize_model_parallel), layers
(VocabParallelEmbedding, ColumnParallelLinear, RowParallelLinear, the
experts' SequentialMLP), DistributedDataParallel, finalize_model_grads (the
data-parallel reduction, the tied embedding's all-reduce between the first
and last stage), get_megatron_optimizer and its optimizer's step(); the
pipeline's activations and their gradients go between the stages by send
and recv, as Megatron's schedules send them. Per update the rank saves its
weights (before the update), the gradient the optimizer was handed and the
one it stepped with (this rank's tensor-parallel and expert parts, whole
over the data-parallel ranks: the distributed optimizer's shards gathered),
GAC's report, what step() returned, and whether the weights and the
optimizer's state moved.

usage: megatron_worker.py RANK WORLD INIT_FILE OUT_FILE LAYOUT MODE OPTIONS_JSON
"""

from __future__ import annotations

import datetime
import json
import sys
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

import megatron_cpu
from megatron_model import (FE, FF, LAYOUTS, LR, PROBS, STEPS, TOKENS, H, Layout, V, batch, cut, initial_weights,
                            local_name)


def build(layout: Layout, load: bool = True) -> Tuple[Any, Any, Any]:
    """This rank's stage as Megatron's DDP model chunk, its optimizer, and the config;
    the weights megatron_model.py's (load), or Megatron's initialisation."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.moe.experts import SequentialMLP

    dtype = torch.bfloat16 if layout.bf16 else torch.float32
    experts = dict(num_moe_experts=4, expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=1,
                   moe_ffn_hidden_size=FE) if layout.experts else {}
    config = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=2, ffn_hidden_size=FF,
                               tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
                               use_cpu_initialization=True, gradient_accumulation_fusion=False, add_bias_linear=True,
                               bias_activation_fusion=False, params_dtype=dtype, pipeline_dtype=dtype, bf16=layout.bf16,
                               **experts)
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()

    class Stage(MegatronModule):  # type: ignore[misc]
        """One pipeline stage of megatron_model.py's model, made of Megatron's layers."""

        def __init__(self) -> None:
            super().__init__(config=config)
            self.pre_process, self.post_process = first, last
            self.share_embeddings_and_output_weights = True
            init = config.init_method
            if first:
                self.emb = VocabParallelEmbedding(V, H, init_method=init, config=config)
                self.col = ColumnParallelLinear(H, FF, config=config, init_method=init, bias=True,
                                                gather_output=False)
            if last:
                self.row = RowParallelLinear(FF, H, config=config, init_method=init, bias=True,
                                             input_is_parallel=True, skip_bias_add=False)
                self.norm = torch.nn.LayerNorm(H, dtype=dtype)
                if layout.experts:
                    self.experts = SequentialMLP(
                        2, config, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
                        pg_collection=ProcessGroupCollection.use_mpu_process_groups())
                # The output layer: with one stage it reads the embedding's weight; on the last
                # of two it holds a copy, kept equal by finalize_model_grads' all-reduce.
                self.out = ColumnParallelLinear(H, V, config=config, init_method=init, bias=False,
                                                gather_output=True, skip_weight_param_allocation=first)
            if layout.pp > 1:
                # What LanguageModule.setup_embeddings_and_output_layer marks (language_module.py
                # lines 270 and 283-284); the copies' values it then all-reduces on the GPU (line 307).
                if first:
                    self.emb.weight.shared_embedding = True
                if last:
                    self.out.weight.shared = True
                    self.out.weight.shared_embedding = True

        def shared_embedding_or_output_weight(self) -> torch.Tensor:
            return self.emb.weight if first else self.out.weight

        def forward(self, ids: torch.Tensor, hidden: Any = None, targets: Any = None) -> torch.Tensor:
            from megatron.core.tensor_parallel.mappings import (copy_to_tensor_model_parallel_region,
                                                                reduce_from_tensor_model_parallel_region)

            if first:
                hidden = torch.nn.functional.gelu(self.col(self.emb(ids))[0])
            if not last:
                return hidden
            z = self.norm(self.row(hidden)[0])
            if layout.experts:
                # Every token to every expert, weighed by its router probability; the
                # expert-parallel ranks' outputs summed (Megatron's mappings over the EP group).
                ep = ps.get_expert_model_parallel_group()
                x = copy_to_tensor_model_parallel_region(z, group=ep).reshape(TOKENS, H)
                local = [ps.get_expert_model_parallel_rank() * 2 + j for j in range(2)]
                probs = torch.cat([torch.full((TOKENS,), PROBS[e], dtype=x.dtype) for e in local])
                y, _ = self.experts(x.repeat(2, 1), torch.tensor([TOKENS, TOKENS]), probs)
                y = y.reshape(2, TOKENS, H).sum(0).reshape(TOKENS, 1, H)
                z = z + reduce_from_tensor_model_parallel_region(y, group=ep)
            weight = self.emb.weight if first else None
            logits = self.out(z, weight=weight)[0].reshape(TOKENS, V)
            return torch.nn.functional.cross_entropy(logits.float(), targets)

    stage = Stage()
    full = initial_weights()
    for name, p in stage.named_parameters() if load else []:
        n = local_name(name, ps.get_expert_model_parallel_rank(), 2)
        assert n is not None, name
        p.data.copy_(cut(full[n], n, ps.get_tensor_model_parallel_rank(), layout.tp))
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=layout.distributed, grad_reduce_in_fp32=True,
                                               overlap_grad_reduce=False, overlap_param_gather=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "full_param_layout not provided": DDP computes it
        model = DistributedDataParallel(config, ddp_config, stage)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=LR, weight_decay=0.0, clip_grad=0.0, bf16=layout.bf16,
                        use_distributed_optimizer=layout.distributed), [model])
    return model, optimizer, config


def forward_backward(model: Any, layout: Layout, step: int) -> Optional[float]:
    """One update's forward and backward through the pipeline, then Megatron's finalize_model_grads."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import finalize_model_grads

    ids, targets = batch(step, ps.get_data_parallel_rank())
    ids = ids.reshape(TOKENS, 1)
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    dtype = torch.bfloat16 if layout.bf16 else torch.float32
    loss = None
    if first and last:
        loss = model(ids, targets=targets)
        loss.backward()
    elif first:
        hidden = model(ids)
        dist.send(hidden.detach().contiguous(), ps.get_pipeline_model_parallel_next_rank())
        grad = torch.empty_like(hidden)
        dist.recv(grad, ps.get_pipeline_model_parallel_next_rank())
        hidden.backward(grad)
    else:
        hidden = torch.empty(TOKENS, 1, FF // layout.tp, dtype=dtype)
        dist.recv(hidden, ps.get_pipeline_model_parallel_prev_rank())
        hidden.requires_grad_(True)
        loss = model(ids, hidden=hidden, targets=targets)
        loss.backward()
        dist.send(hidden.grad.contiguous(), ps.get_pipeline_model_parallel_prev_rank())
    finalize_model_grads([model])
    return None if loss is None else float(loss.detach())


def gradients(model: Any, optimizer: Any, layout: Layout, stepped: bool) -> Dict[str, torch.Tensor]:
    """Each of this rank's parameters' gradient, whole over the data-parallel ranks
    (a distributed optimizer's shards gathered), fp32: the one DDP reduced into
    main_grad (stepped False: before the step), or the .grad of the parameter the
    inner optimizer stepped (after the step: what GAC read and projected)."""
    from megatron.core import parallel_state as ps

    owner = {}  # model parameter -> (its optimizer, the parameter stepped for it on this rank)
    for leaf in getattr(optimizer, "chained_optimizers", [optimizer]):
        for model_group, main_group in _model_and_main(leaf):
            for p, main in zip(model_group, main_group):
                owner[id(p)] = (leaf, main)
    out = {}
    for name, p in model.module.named_parameters():
        if layout.distributed:
            # The shards of the data-parallel ranks are disjoint: their sum is the whole.
            whole = torch.zeros(p.numel(), dtype=torch.float32)
            if id(p) in owner:
                leaf, main = owner[id(p)]
                r = leaf._get_model_param_range_map(p)["param"]
                whole[r.start:r.end] = main.grad if stepped else p.main_grad.view(-1)[r.start:r.end]
            expert = not getattr(p, "allreduce", True)
            group = (ps.get_expert_data_parallel_group(partial_expert_data_parallel=True) if expert else
                     ps.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True))
            dist.all_reduce(whole, group=group)
            out[name] = whole.reshape(p.shape)
        else:
            main = owner[id(p)][1]
            out[name] = (main.grad if stepped else p.main_grad).detach().float().clone()
    return out


def _model_and_main(leaf: Any) -> List[Tuple[List[Any], List[Any]]]:
    """(model parameters, the parameters the inner optimizer steps for them), per group."""
    name = type(leaf).__name__
    if name == "FP32Optimizer":
        params = [p for g in leaf.optimizer.param_groups for p in g["params"]]
        return [(params, params)]
    if name == "DistributedOptimizer":
        return list(zip(leaf.model_float16_groups, leaf.shard_fp32_from_float16_groups)) + list(
            zip(leaf.model_fp32_groups, leaf.shard_fp32_groups))
    return list(zip(leaf.float16_groups, leaf.fp32_from_float16_groups)) + [
        (g, g) for g in leaf.fp32_from_fp32_groups]


def _name(model: Any, p: torch.Tensor) -> str:
    return next(n for n, q in model.module.named_parameters() if q is p)


def optimizer_state(optimizer: Any) -> List[torch.Tensor]:
    leaves = optimizer.chained_optimizers if hasattr(optimizer, "chained_optimizers") else [optimizer]
    out = []
    for leaf in leaves:
        for g in leaf.optimizer.param_groups:
            for p in g["params"]:
                out.append(p.detach().clone())
                for v in leaf.optimizer.state.get(p, {}).values():
                    out.append(torch.as_tensor(v).detach().clone())
    return out


def main() -> None:
    rank, world, init_file, out_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    layout_name, mode, options = sys.argv[5], sys.argv[6], json.loads(sys.argv[7])
    layout = LAYOUTS[layout_name]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    megatron_cpu.install()
    warnings.filterwarnings("ignore", module="megatron")
    from megatron.core import parallel_state as ps

    import gac
    from gac.integrations import megatron as gac_megatron

    # Layouts gac refuses: generalized tensor parallelism; an embedding group of the first
    # stage only (Megatron's get_embedding_ranks), which leaves the last stage's tied copy uncounted.
    gtp = options.pop("gtp_remat_size", 1)
    embedding_ranks = (lambda ranks, *rest: ranks[:1]) if options.pop("first_stage_embedding_group", False) else None
    ps.initialize_model_parallel(tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
                                 expert_model_parallel_size=layout.ep,
                                 expert_tensor_parallel_size=1 if layout.experts else None, gtp_remat_size=gtp,
                                 get_embedding_ranks=embedding_ranks)
    out: Dict[str, Any] = {"error": None, "steps": [], "rank": rank, "tp_rank": ps.get_tensor_model_parallel_rank(),
                           "pp_rank": ps.get_pipeline_model_parallel_rank(),
                           "ep_rank": ps.get_expert_model_parallel_rank(), "dp_rank": ps.get_data_parallel_rank()}
    model, optimizer, _ = build(layout, load=gtp == 1)
    out["optimizers"] = [type(o).__name__ for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    try:
        attachment = gac_megatron.attach(optimizer, mode=mode, num_threads=1, **options)
    except (ValueError, NotImplementedError) as e:  # what gac refuses: the message, on every rank
        out["error"] = f"{type(e).__name__}: {e}"
        torch.save(out, out_file)
        dist.barrier()
        dist.destroy_process_group()
        return
    out["attachment"] = repr(attachment)
    for step in range(1, STEPS + 1):
        weights = {n: p.detach().float().clone() for n, p in model.module.named_parameters()}
        model.zero_grad_buffer()
        optimizer.zero_grad()
        loss = forward_backward(model, layout, step)
        handed = gradients(model, optimizer, layout, stepped=False)  # before GAC: the step projects in place
        state = optimizer_state(optimizer)
        successful, grad_norm, _ = optimizer.step()
        r = attachment.last_report
        assert r is not None and attachment.reports == step
        after = optimizer_state(optimizer)
        out["steps"].append(dict(
            weights=weights, handed=handed, stepped=gradients(model, optimizer, layout, stepped=True),
            report=dict(regime=r.regime, cosine=r.cosine, grad_norm=r.grad_norm, ref_norm=r.ref_norm,
                        step_optimizer=r.step_optimizer, gradient_modified=r.gradient_modified),
            loss=loss, successful=bool(successful), megatron_grad_norm=float(grad_norm),
            state_unchanged=len(state) == len(after) and all(torch.equal(a, b) for a, b in zip(state, after))))
    out["counters"] = dict(reports=attachment.reports, skipped=attachment.skipped, projected=attachment.projected)
    # Detached, step() is Megatron's own again: no report, the update taken.
    attachment.detach()
    model.zero_grad_buffer()
    optimizer.zero_grad()
    forward_backward(model, layout, 1)
    out["detached"] = dict(successful=bool(optimizer.step()[0]), reports=attachment.reports)
    out["gac_version"] = gac.__version__
    torch.save(out, out_file)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
