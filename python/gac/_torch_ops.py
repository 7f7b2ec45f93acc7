"""The torch-ops path: gac's statistics, projection and snapshot computed with
torch's own operations on the gradients' device.

gac's kernels run on CPUs and on NVIDIA GPUs its wheel carries an image for
(sm_80 and later). Anywhere else torch runs (AMD ROCm, Intel XPU, Apple MPS,
an older NVIDIA GPU), and wherever ``gac.Agent(passes="torch")`` asks for
it, the native agent calls these passes instead (its FrontPasses,
``gac/agent/front_passes.h``) and keeps everything else: the checks of the
gradients, the all-reduce, the spike guard, the decision and the report.
They are also the reference gac's CUDA kernels are checked against on their
first steps on a GPU.

Semantics are the kernels': per tensor the sums accumulate in fp32 (the
gradient and the snapshot read as fp32), across tensors in fp64; the
projection is computed in fp32 and stored rounded to nearest even in the
gradient's type; the snapshot (fp32 or bf16) holds the raw or the projected
gradient. Memory: one snapshot, a tensor per parameter on its device, and
per-tensor temporaries (an fp32 copy of a bf16 gradient while it is read);
never a flattened copy of the model. One device-to-host transfer per step
(the sums). It is the portable path, not the fast one: a few small kernel
launches per tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Sequence

if TYPE_CHECKING:
    import torch

# Elements per piece of a tensor's sums (16 MiB of fp32 temporaries).
_PIECE = 1 << 22


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what the native agent reads), else t."""
    local = getattr(t, "_local_tensor", None)
    return local if local is not None else t


class TorchOpsPasses:
    """The passes over ``params`` (the list the agent steps over, in its
    order). ``group_of[i]``: parameter i's layer, or -1."""

    name = "torch"

    def __init__(self, params: Sequence[torch.Tensor], bf16_snapshot: bool, group_of: Sequence[int],
                 num_groups: int) -> None:
        import torch

        self._torch = torch
        self._params = list(params)
        self._num_groups = num_groups
        dtype = torch.bfloat16 if bf16_snapshot else torch.float32
        # Zeros, as the kernels' snapshot starts: a first statistics pass
        # with a reference reads zeros.
        self._snapshot: List[torch.Tensor] = [
            torch.zeros(_local(p).shape, dtype=dtype, device=_local(p).device) for p in self._params]
        self.snapshot_bytes = sum(s.numel() * s.element_size() for s in self._snapshot)
        device = _local(self._params[0]).device if self._params else torch.device("cpu")
        self._device = device
        # Row 0 collects the parameters of no layer; layer k is row k + 1.
        self._rows = torch.tensor([g + 1 for g in group_of], dtype=torch.long, device=device)
        self._present: List[int] = []

    def _grad(self, i: int) -> torch.Tensor:
        g = self._params[i].grad
        assert g is not None, f"parameter {i} has no gradient"  # the native agent checked it
        return _local(g)

    def statistics(self, present: bytes, with_p: bool) -> List[float]:
        """This rank's [dot, |g|^2, |p|^2, then three per layer] over the
        parameters marked 1 in ``present`` (0: no gradient; 2: a gradient
        another rank counts)."""
        torch = self._torch
        # 1: a gradient to count; 2: one another rank counts (applied, not summed).
        self._present = [i for i, has in enumerate(present) if has]
        counted = [i for i, has in enumerate(present) if has == 1]
        sums = torch.zeros(self._num_groups + 1, 3, dtype=torch.float64, device=self._device)
        if counted:
            per_tensor = [self._tensor_sums(i, with_p) for i in counted]
            sums.index_add_(0, self._rows[counted], torch.stack(per_tensor))
        total = sums.sum(0, keepdim=True)
        values: List[float] = torch.cat((total, sums[1:])).reshape(-1).tolist()
        return values

    def _tensor_sums(self, i: int, with_p: bool) -> torch.Tensor:
        """(dot, |g|^2, |p|^2) of parameter i in fp64: fp32 sums of pieces of
        at most _PIECE elements (torch.sum's cascade; torch.dot's fp32
        accumulation is 100 times less accurate on bf16 values), added in
        fp64. The temporaries are a piece's products."""
        th = self._torch
        g = self._grad(i).reshape(-1)
        p = self._snapshot[i].reshape(-1)
        pieces = []
        for start in range(0, g.numel(), _PIECE):
            gf = g[start:start + _PIECE].float()
            if with_p:
                pf = p[start:start + _PIECE].float()
                pieces.append(th.stack(((gf * pf).sum(), (gf * gf).sum(), (pf * pf).sum())))
            else:
                gg = (gf * gf).sum()
                pieces.append(th.stack((th.zeros_like(gg), gg, th.zeros_like(gg))))
        sums: torch.Tensor = (th.stack(pieces).double().sum(0) if pieces
                              else th.zeros(3, dtype=th.float64, device=g.device))  # an empty tensor
        return sums

    def apply(self, project: bool, coeff: float, snapshot_projected: bool) -> None:
        """With ``project``: g <- g - coeff * p, and p <- the stored new g or
        the old g; else p <- g. Over the last statistics()' parameters."""
        for i in self._present:
            g = self._grad(i)
            snapshot = self._snapshot[i]
            if not project:
                snapshot.copy_(g)
                continue
            new = self._torch.add(g.float(), snapshot.float(), alpha=-coeff)
            if snapshot_projected:
                g.copy_(new)
                snapshot.copy_(g)
            else:
                snapshot.copy_(g)
                g.copy_(new)

