"""megatron-core's GPU-only calls, answered on the CPU, for test_megatron.py's
ranks (imported before megatron; only in those processes).

megatron-core 0.19.2 runs its tensor-parallel layers, experts and groups on
the CPU as they are (Gloo collectives), but its DDP wrapper and optimizers
name the GPU in a few places, none of which decides anything gac reads:

- device="cuda" / torch.cuda.current_device() for small tensors and the
  buffers: optimizer/optimizer.py (MixedPrecisionOptimizer.__init__:
  found_inf, _dummy_overflow_buf, _scale_one, lines 690-702;
  FP32Optimizer.__init__: _scale, line 1249; has_grad_norm_group, line 315),
  optimizer/clip_grads.py (get_grad_norm_fp32: total_norm, lines 96-112;
  clip_grad_by_total_norm_fp32, line 180; count_zeros_fp32, line 231),
  utils.py (local_multi_tensor_l2_norm, line 1332),
  distributed/param_and_grad_buffer.py (_ParamAndGradBuffer: param_data and
  grad_data, lines 1162-1186): those factories make CPU tensors here;
- torch.cuda.current_stream(): _ParamAndGradBucketGroup.start_grad_sync
  waits on CUDA-graph events with it (param_and_grad_buffer.py line 632):
  a stream that waits for nothing;
- Tensor.type() compared with 'torch.cuda.FloatTensor' /
  'torch.cuda.BFloat16Tensor': Float16OptimizerWithFloat16Params.__init__
  (optimizer.py lines 1009-1028), DistributedOptimizer.__init__ and
  _build_model_and_main_param_groups (distrib_optimizer.py lines 401, 466,
  758), clip_grad_by_total_norm_fp32 (clip_grads.py line 174): a CPU
  tensor's type() names the CUDA type of its dtype.

Everything else is Megatron's own code (DistributedDataParallel,
finalize_model_grads, get_megatron_optimizer, the optimizers' step).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like", "empty_like")


def _on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def make(*args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)
    return make


class _Stream:
    def wait_event(self, event: object) -> None:
        pass

    def wait_stream(self, stream: object) -> None:
        pass


_type = torch.Tensor.type


def _cuda_type(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
    if dtype is None and not kwargs:
        name: str = _type(self)
        cpu = self.device.type == "cpu" and not name.startswith("torch.cuda.")  # (a subclass may ask twice)
        return name.replace("torch.", "torch.cuda.", 1) if cpu else name
    return _type(self, dtype, non_blocking, **kwargs)


def install() -> None:
    for name in _FACTORIES:
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    setattr(torch.cuda, "current_device", lambda: "cpu")
    setattr(torch.cuda, "current_stream", lambda *args, **kwargs: _Stream())
    setattr(torch.Tensor, "type", _cuda_type)
