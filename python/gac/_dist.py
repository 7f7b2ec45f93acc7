"""The all-reduce of the agent's statistics over a torch.distributed group.

The native agent links no torch (one build serves every torch 2.x), so the
three sums per step (and three per layer) that ranks holding shards of one
model's gradients must add up cross through here: one small fp64 tensor,
all-reduced with ``torch.distributed`` on the group's own device (the
rank's GPU for NCCL, the CPU for Gloo).
"""

from __future__ import annotations

from typing import Any, List, Sequence


class AllReduce:
    """``AllReduce(group)(values)`` returns the sums of ``values`` over ``group``.

    group: a ``torch.distributed`` ProcessGroup (``dist.group.WORLD``,
    ``dist.new_group(...)``, a DeviceMesh's group) or a bare c10d backend such
    as ``dist.ProcessGroupGloo(store, rank, size)``.
    """

    def __init__(self, group: Any) -> None:
        import torch
        import torch.distributed as dist

        self._torch = torch
        if isinstance(group, dist.ProcessGroup):
            self._group = group
            self._backend = None
            self.rank = dist.get_rank(group)
            self.world_size = dist.get_world_size(group)
            name = str(dist.get_backend(group)).lower()
        elif hasattr(group, "allreduce") and hasattr(group, "size") and hasattr(group, "rank"):
            self._group = None
            self._backend = group
            self.rank = group.rank()
            self.world_size = group.size()
            name = str(group.getBackendName() if hasattr(group, "getBackendName") else "").lower()
        else:
            raise TypeError("process_group must be a torch.distributed ProcessGroup (e.g. dist.group.WORLD or "
                            "dist.new_group(...)) or a c10d backend (dist.ProcessGroupGloo(...)), got a "
                            + type(group).__name__)
        self._device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in name else torch.device("cpu")

    def __call__(self, values: Sequence[float]) -> List[float]:
        import torch.distributed as dist

        t = self._torch.tensor(list(values), dtype=self._torch.float64, device=self._device)
        if self._group is not None:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self._group)
        else:
            self._backend.allreduce([t]).wait()
        return t.tolist()  # type: ignore[no-any-return]
