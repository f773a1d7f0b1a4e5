"""Short in-process trainings of a small config on the tiny shapes set (mmengine's train step,
the config's optim wrapper, the real dataloader), for the precision and determinism tests."""

from __future__ import annotations

import time
from typing import List, Optional, Tuple

import torch
from mmengine.optim import build_optim_wrapper
from mmengine.runner import Runner, set_random_seed
from plugin_util import SMALL_DETR, build_model, small_cfg

from npudet.hooks import compile_forward


def train_losses(
    data_root: str,
    impl: str,
    iters: int,
    optim_wrapper: Optional[dict] = None,
    config: str = SMALL_DETR,
    seed: int = 0,
    deterministic: bool = False,
    compile_options: Optional[dict] = None,
) -> Tuple[List[float], float]:
    """Total loss of each of ``iters`` training iterations and the mean seconds per
    iteration after the first. Same seed, weights and batches for every call.

    Args:
        data_root: a shapes set (the ``tiny_shapes`` fixture), cycled when shorter.
        impl: the MSDA implementation of every layer.
        optim_wrapper: replaces the config's ``optim_wrapper`` (e.g. a mixed-precision one).
        deterministic: what ``randomness=dict(deterministic=True)`` does (mmengine's
            ``set_random_seed``: ``torch.use_deterministic_algorithms(True)``); the caller
            turns it off again.
        compile_options: ``torch.compile`` options for the forward of the training step
            (what ``tools/train.py --compile`` does, through ``compile_forward``).
    """
    cfg = small_cfg(config, impl=impl)
    cfg.train_dataloader.dataset.data_root = data_root.rstrip("/") + "/"
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.sampler.seed = seed  # else a fresh random shuffle per call
    set_random_seed(seed, deterministic=deterministic)  # augmentations draw from numpy
    model = build_model(cfg, seed=seed)
    if compile_options is not None:
        compile_forward(model, compile_options)
    wrapper = build_optim_wrapper(model, optim_wrapper or cfg.optim_wrapper)
    loader = Runner.build_dataloader(cfg.train_dataloader, seed=seed)
    model.train()
    losses, times = [], []
    torch.manual_seed(seed)
    while len(losses) < iters:
        for batch in loader:
            start = time.perf_counter()
            log_vars = model.train_step(batch, wrapper)
            times.append(time.perf_counter() - start)
            losses.append(float(log_vars["loss"]))
            if len(losses) == iters:
                break
    per_iter = sum(times[1:]) / max(1, len(times) - 1)
    return losses, per_iter
