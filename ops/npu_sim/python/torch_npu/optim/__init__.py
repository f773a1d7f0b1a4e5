"""``torch_npu.optim``: the fused optimizers mmengine registers from torch_npu.

torch_npu's ``NpuFused*`` optimizers compute what torch's do, with parameters combined into
few device buffers for speed. Here they are torch's optimizers under torch_npu's names, so
a config naming one builds (mmengine's ``register_torch_npu_optimizers``).
"""

import torch


class NpuFusedAdamW(torch.optim.AdamW):
    """AdamW under torch_npu's name."""


class NpuFusedAdam(torch.optim.Adam):
    """Adam under torch_npu's name."""


class NpuFusedSGD(torch.optim.SGD):
    """SGD under torch_npu's name."""


__all__ = ["NpuFusedAdam", "NpuFusedAdamW", "NpuFusedSGD"]
