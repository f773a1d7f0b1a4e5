"""Helpers for the mmdet-plugin tests: small configs, models and fake batches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.config import Config

from npudet.utils.pretrained import drop_pretrained  # noqa: F401  (the tests' import)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_DETR = os.path.join(ROOT, "configs/small/deformable-detr-refine-twostage_r18-tiny_shapes.py")
SMALL_DINO = os.path.join(ROOT, "configs/small/dino-4scale_r18-tiny_shapes.py")


def small_cfg(path: str = SMALL_DETR, **msda: Optional[str]) -> Config:
    cfg = Config.fromfile(path)
    if msda:
        cfg.model.msda = {**dict(impl="auto", encoder=None, decoder=None), **msda}
    return cfg


def build_model(cfg: Config, seed: int = 0) -> torch.nn.Module:
    """Build and initialise ``cfg.model`` from ``seed``; pretrained weights are dropped
    first (:func:`drop_pretrained`: nothing is downloaded)."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    import npudet.models  # noqa: F401

    drop_pretrained(cfg)
    init_default_scope(cfg.get("default_scope", "mmdet"))  # an mmseg config builds in mmseg's
    torch.manual_seed(seed)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model


def tiny_config(tmp_path, base: str, extra: str = "") -> str:
    """A config on ``base`` with 1 encoder and 2 decoder layers (a short graph to export),
    and the model's ``extra`` keyword arguments."""
    path = tmp_path / "tiny.py"
    path.write_text(
        f"_base_ = [{base!r}]\n"
        f"model = dict(encoder=dict(num_layers=1), decoder=dict(num_layers=2){extra})\n"
    )
    return str(path)


def fake_batch(num_classes: int = 3, seed: int = 0) -> Dict:
    from mmdet.testing import demo_mm_inputs

    torch.manual_seed(seed)
    return demo_mm_inputs(
        batch_size=2, image_shapes=(3, 96, 128), num_items=[2, 3], num_classes=num_classes
    )


def loss_and_grads(model: torch.nn.Module, batch: Dict, seed: int = 0):
    """Total loss and {param name: grad} of one training step on ``batch``."""
    model.train()
    model.zero_grad()
    torch.manual_seed(seed)
    data = model.data_preprocessor(batch, True)
    losses = model(**data, mode="loss")
    # mmengine's sum of every "loss" term, a list term (DDQ-DETR's auxiliary losses) included
    total, _ = model.parse_losses(losses)
    total.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    losses = {k: sum(v) if isinstance(v, list) else v for k, v in losses.items()}
    return {k: v.detach() for k, v in losses.items()}, grads


def run_tool(
    args: List[str], cwd: str = ROOT, env: Optional[Dict[str, str]] = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """Run ``python tools/...`` with this interpreter; captures stdout / stderr."""
    full_env = dict(os.environ, PYTHONWARNINGS="ignore", **(env or {}))
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def data_options(root: str) -> List[str]:
    """``--cfg-options`` pointing the small configs at a shapes set under ``root``."""
    root = root.rstrip("/") + "/"
    ann = os.path.join(root, "annotations", "instances_val.json")
    return [
        f"train_dataloader.dataset.data_root={root}",
        f"val_dataloader.dataset.data_root={root}",
        f"test_dataloader.dataset.data_root={root}",
        f"val_evaluator.ann_file={ann}",
        f"test_evaluator.ann_file={ann}",
    ]


def train_args(config: str, work: str, *args: str, options: Sequence[str] = ()) -> List[str]:
    """``run_tool``'s arguments for ``tools/train.py config --work-dir work *args
    --cfg-options *options``."""
    return ["tools/train.py", config, "--work-dir", str(work), *args, "--cfg-options", *options]


def train_tool(
    data_root: str, work: str, *args: str, options: Sequence[str] = (), timeout: int = 600
) -> subprocess.CompletedProcess:
    """``tools/train.py`` on the small Deformable DETR for one epoch on the shapes set at
    ``data_root``, logging every iteration, into ``work``; ``args`` (e.g. ``--amp``) go before
    ``--cfg-options``, ``options`` after the data roots (a later option wins)."""
    cfg_options = ["default_hooks.logger.interval=1", *data_options(data_root)]
    cfg_options += ["train_cfg.max_epochs=1", *options]
    return run_tool(train_args(SMALL_DETR, work, *args, options=cfg_options), timeout=timeout)


def main_job_checkpoint() -> Optional[str]:
    """The checkpoint ``bash tools/main_job.sh`` left in its work dir, if it ran here."""
    pointer = Path(ROOT, "work_dirs", "main_job", "last_checkpoint")
    if pointer.is_file():
        path = Path(pointer.read_text().strip())
        path = path if path.is_absolute() else Path(ROOT, path)
        if path.is_file() and path.parent == pointer.parent:
            return str(path)
    return None
