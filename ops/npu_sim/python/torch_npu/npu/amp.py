"""``torch.npu.amp``: autocast and the gradient scaler on the simulated device.

torch_npu's classes are torch's device-generic ones bound to ``"npu"``; so are these. The
autocast op lists are CUDA's, registered for the device in ``npu_sim.cpp``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast('npu', ...)``; float16 by default, as on torch_npu."""

    def __init__(
        self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True
    ) -> None:
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler('npu', ...)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("device", None)
        super().__init__("npu", *args, **kwargs)


custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="npu")
custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="npu")
