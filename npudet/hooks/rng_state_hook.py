"""Save the random-number state in checkpoints and restore it on load."""

from __future__ import annotations

import random
from typing import Any, Dict, Iterator, Tuple

import numpy as np
import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook

# Devices with a generator of their own (torch.cuda, torch_npu's torch.npu, ...): dropout
# on them draws from it, not from the CPU's.
_ACCELERATORS = ("cuda", "npu", "mlu", "musa", "xpu")


def _accelerators() -> Iterator[Tuple[str, Any]]:
    """``(name, torch.<name>)`` for each accelerator present in this process."""
    for name in _ACCELERATORS:
        module = getattr(torch, name, None)
        if module is not None and hasattr(module, "get_rng_state_all") and module.is_available():
            yield name, module


@HOOKS.register_module()
class RNGStateHook(Hook):
    """Store torch (CPU and each accelerator's) / numpy / python RNG states in
    ``checkpoint['meta']['rng_state']``.

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
            devices={name: module.get_rng_state_all() for name, module in _accelerators()},
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
        saved = state.get("devices", {})
        for name, module in _accelerators():
            if name not in saved:
                continue
            if len(saved[name]) != module.device_count():
                # Another number of devices: which state belongs to which is unknown.
                runner.logger.warning(
                    f"the checkpoint holds {name} RNG states of {len(saved[name])} devices, this "
                    f"process sees {module.device_count()}: {name} draws restart from the seed"
                )
                continue
            module.set_rng_state_all(saved[name])
