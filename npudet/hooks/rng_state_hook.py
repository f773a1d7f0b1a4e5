"""Save the random-number state in checkpoints and restore it on load."""

from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Store torch / numpy / python RNG states in ``checkpoint['meta']['rng_state']``.

    mmengine re-seeds on resume, so without this a run resumed at iteration k draws
    different dropout masks and augmentations than the uninterrupted run. States are
    kept as tensors and plain lists so that weights-only loading reads them.
    """

    priority = "VERY_LOW"

    def before_save_checkpoint(self, runner: Any, checkpoint: Dict) -> None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        version, state, gauss_next = random.getstate()
        checkpoint.setdefault("meta", {})["rng_state"] = dict(
            torch=torch.get_rng_state(),
            numpy=[kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
            python=[version, list(state), gauss_next],
        )

    def after_load_checkpoint(self, runner: Any, checkpoint: Dict) -> None:
        state = checkpoint.get("meta", {}).get("rng_state")
        if state is None:
            return
        torch.set_rng_state(state["torch"])
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        version, py_state, gauss_next = state["python"]
        random.setstate((version, tuple(py_state), gauss_next))
