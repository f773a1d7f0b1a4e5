"""Distributed training on CPU (gloo) with mmengine's launcher, and the end of any run's
process group.

mmengine 0.10.7's ``pytorch`` launcher calls ``torch.cuda.set_device`` and wraps the
model with ``device_ids=[LOCAL_RANK]``, both of which fail without a GPU. On NPU it
uses HCCL and on GPU NCCL by itself; on CPU we start the gloo process group first
(mmengine then skips its own init) and ask for a CPU DDP wrapper. mmengine never destroys
the process group; left to the interpreter's exit, a rank can abort there after a complete
run ("terminate called without an active exception", seen once with gloo), failing the
launch, so the tools end it themselves (:func:`end_distributed`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.device import get_device


def setup_cpu_distributed(cfg: Config, launcher: str) -> bool:
    """For ``launcher='pytorch'`` on a CPU-only machine: init gloo, CPU DDP. True if done."""
    if launcher != "pytorch" or get_device() != "cpu":
        return False
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")
    wrapper = dict(cfg.get("model_wrapper_cfg") or {})
    wrapper.setdefault("type", "MMDistributedDataParallel")
    wrapper.setdefault("broadcast_buffers", False)
    wrapper.setdefault("find_unused_parameters", cfg.get("find_unused_parameters", False))
    wrapper["device_ids"] = None
    cfg.model_wrapper_cfg = wrapper
    cfg.setdefault("env_cfg", {}).setdefault("dist_cfg", {})["backend"] = "gloo"
    torch.set_num_threads(max(1, torch.get_num_threads() // dist.get_world_size()))
    return True


def end_distributed() -> None:
    """Destroy the default process group, if any (every backend): call once a run is over."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
