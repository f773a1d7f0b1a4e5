"""Mixed precision for training: bfloat16 autocast on CPU, mmengine's AMP on accelerators.

mmengine's ``AmpOptimWrapper`` refuses CPU ("AmpOptimizerWrapper is only available
training on gpu, npu, mlu or musa"). ``CPUAmpOptimWrapper`` is the plain ``OptimWrapper``
with the forward (data preprocessing, model, losses) under
``torch.autocast("cpu", dtype=torch.bfloat16)``. bfloat16 has float32's exponent range, so
no loss scaling is needed; parameters, gradients and optimizer state stay float32 (autocast
casts per op). ``amp_optim_wrapper`` turns a config's ``optim_wrapper`` into the right one
for a device: ``tools/train.py --amp`` calls it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Union

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

# Autocast dtypes per device type: the first is the default. CPU has no float16 fast path
# worth training with. On NPU float16 is mmengine's default; Ascend 910B and later (the
# SoCs mmengine trains in full precision) compute bfloat16 too, and torch_npu's autocast
# takes it (torch.npu.get_amp_supported_dtype).
AMP_DTYPES = {
    "cpu": ("bfloat16",),
    "cuda": ("float16", "bfloat16"),
    "npu": ("float16", "bfloat16"),
}


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """``OptimWrapper`` whose ``optim_context`` runs the forward under CPU autocast.

    Args:
        dtype: the autocast dtype, ``"bfloat16"`` (default) or ``torch.bfloat16``.
        **kwargs: ``OptimWrapper``'s arguments (optimizer, clip_grad, accumulative_counts).
    """

    def __init__(self, dtype: Union[str, torch.dtype] = "bfloat16", **kwargs) -> None:
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, None)
        if dtype != torch.bfloat16:
            raise ValueError(f"dtype: expected 'bfloat16' for CPU autocast, got {dtype}")
        super().__init__(**kwargs)
        self.cast_dtype = dtype

    @contextmanager
    def optim_context(self, model: torch.nn.Module) -> Iterator[None]:
        """Gradient-accumulation context of ``OptimWrapper`` plus CPU autocast."""
        with super().optim_context(model), torch.autocast("cpu", dtype=self.cast_dtype):
            yield


def amp_optim_wrapper(optim_wrapper: dict, device: str, dtype: Optional[str] = None) -> dict:
    """The ``optim_wrapper`` config that trains with mixed precision on ``device``.

    Args:
        optim_wrapper: the config's ``optim_wrapper`` (type, optimizer, clip_grad, ...).
        device: ``"cpu"``, ``"cuda"`` or ``"npu"`` (mmengine's ``get_device()``).
        dtype: ``"bfloat16"`` or ``"float16"``; None takes the device's default
            (bfloat16 on CPU, float16 on CUDA and NPU).

    Returns:
        A copy with ``type`` CPUAmpOptimWrapper (cpu) or mmengine's AmpOptimWrapper (with
        dynamic loss scaling) and ``dtype`` set.

    Raises:
        ValueError: a device without an AMP path here, or a dtype it does not train with.
    """
    if device not in AMP_DTYPES:
        raise ValueError(f"device: expected one of {sorted(AMP_DTYPES)} for --amp, got {device!r}")
    allowed = AMP_DTYPES[device]
    dtype = allowed[0] if dtype is None else dtype
    if dtype not in allowed:
        raise ValueError(f"dtype: --amp on {device} takes {list(allowed)}, got {dtype!r}")
    wrapper = dict(optim_wrapper)
    wrapper["dtype"] = dtype
    if device == "cpu":
        wrapper["type"] = "CPUAmpOptimWrapper"
        wrapper.pop("loss_scale", None)
    else:
        wrapper["type"] = "AmpOptimWrapper"
        wrapper["loss_scale"] = "dynamic"
    return wrapper
