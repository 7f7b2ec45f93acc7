"""One rank of test_parallel.py: DTensor parameters laid out by tensor,
pipeline, expert and sharded data parallelism on a Gloo group of CPU
processes, their gradients cut from full tensors known to every rank
(parallel_model.py), and gac.Agent stepping over this rank's parameters.
Saves per step the report and, in local mode, the full gradients after the
step (gathered), so that the test can compare both with fp64 over the full
model, each value counted once.

usage: parallel_worker.py RANK WORLD INIT_FILE OUT_FILE LAYOUT MODE OPTIONS_JSON
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any, Dict, List

import torch
import torch.distributed as dist

import gac
from parallel_model import LAYOUTS, STEPS, full_gradients


def main() -> None:
    rank, world, init_file, out_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    layout, mode, options = sys.argv[5], sys.argv[6], json.loads(sys.argv[7])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    built = LAYOUTS[layout](rank, world)
    group = {"world": dist.group.WORLD, None: None}[options.pop("process_group", None)]
    if built.group is not None:
        group = built.group
    replicated = {built.params[i]: g for i, g in built.replicated_on.items()} or None
    out: Dict[str, Any] = {"reports": [], "full": [], "error": None, "uncounted": None}
    try:
        agent = gac.Agent(mode=mode, process_group=group, replicated_on=replicated, num_threads=1, **options)
        for step in range(1, STEPS + 1):
            full = full_gradients(step)
            built.set_gradients(full)
            r = agent.step(step, built.params)
            out["reports"].append(dict(regime=r.regime, cosine=r.cosine, grad_norm=r.grad_norm, ref_norm=r.ref_norm,
                                       window_mean=r.window_mean, grad_norm_z=r.grad_norm_z,
                                       projection_coeff=r.decision.projection_coeff))
            if mode == "local":
                out["full"].append(built.gather())
    except ValueError as e:  # a layout gac refuses: the message, on every rank
        out["error"] = str(e)
    torch.save(out, out_file)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
