"""Checks run before a Runner exists, so that bad input stops with one clear line.

Each failure raises :class:`PreflightError` whose message names the file or config
key; the tools print it and exit without creating or touching the work dir.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from mmengine.config import Config


class PreflightError(Exception):
    """Bad input found before training / testing started (the message is one line)."""


def check_msda(cfg: Config) -> None:
    """``model.msda`` names known, usable implementations."""
    from npudet.models import resolve_msda_cfg

    try:
        resolve_msda_cfg(cfg.model.get("msda"))
    except ValueError as err:
        raise PreflightError(str(err)) from None


def dataset_cfgs(cfg: Optional[Dict]) -> Iterator[Dict]:
    """Leaf dataset configs inside a (possibly wrapped or concatenated) dataset config."""
    if not cfg:
        return
    if "dataset" in cfg:
        yield from dataset_cfgs(cfg["dataset"])
    elif "datasets" in cfg:
        for sub in cfg["datasets"]:
            yield from dataset_cfgs(sub)
    else:
        yield cfg


def _join(root: Optional[str], path: str) -> str:
    return path if not root or os.path.isabs(path) or "://" in path else os.path.join(root, path)


def read_coco_annotations(path: str, key: str) -> Dict:
    """Load a COCO annotation file, or raise naming the file and what is wrong."""
    if not os.path.isfile(path):
        raise PreflightError(f"{key}: annotation file not found: {path}")
    try:
        with open(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PreflightError(f"{key}: corrupt annotation file {path}: {err}") from None
    missing = [
        k
        for k in ("images", "annotations", "categories")
        if not isinstance(data, dict) or k not in data
    ]
    if missing:
        raise PreflightError(f"{key}: annotation file {path} lacks COCO keys {missing}")
    return data


def check_bev_dataset(path: str, root: Optional[str], key: str) -> None:
    """A BEV info file: readable, of the expected version, every camera image present."""
    from npudet.bev.infos.schema import load_bev_info

    if not os.path.isfile(path):
        raise PreflightError(f"{key}: info file not found: {path}")
    try:
        info = load_bev_info(path)
    except ValueError as err:
        raise PreflightError(f"{key}: {err}") from None
    samples = info["data_list"]
    for sample in samples:
        for cam, entry in sample["cams"].items():
            img = _join(root, entry["img_path"])
            if not os.path.isfile(img):
                raise PreflightError(
                    f"{key}: sample_idx {sample['sample_idx']} camera {cam}: image file "
                    f"not found: {img} ({len(samples)} samples listed in {path})"
                )


def check_dataset(dataset: Dict, key: str) -> None:
    """A dataset config: annotation file readable, every image file present (COCO or BEV)."""
    ann_file = dataset.get("ann_file")
    if not ann_file or "://" in str(ann_file):
        return
    root = dataset.get("data_root")
    path = _join(root, ann_file)
    if dataset.get("type") == "BEVDataset":
        check_bev_dataset(path, root, f"{key}.ann_file")
        return
    data = read_coco_annotations(path, f"{key}.ann_file")
    prefix = _join(root, (dataset.get("data_prefix") or {}).get("img", ""))
    if "://" in prefix:
        return
    missing = [
        os.path.join(prefix, img["file_name"])
        for img in data["images"]
        if not os.path.isfile(os.path.join(prefix, img["file_name"]))
    ]
    if missing:
        raise PreflightError(
            f"{key}: image file not found: {missing[0]} ({len(missing)} of "
            f"{len(data['images'])} listed in {path} are missing)"
        )


def check_data(cfg: Config, loaders: List[str]) -> None:
    """Datasets of the named dataloaders and the matching evaluators' annotation files."""
    for name in loaders:
        loader = cfg.get(f"{name}_dataloader")
        if not loader:
            continue
        for dataset in dataset_cfgs(loader.get("dataset")):
            check_dataset(dataset, f"{name}_dataloader.dataset")
        evaluators = cfg.get(f"{name}_evaluator")
        if evaluators is None:
            continue
        for evaluator in evaluators if isinstance(evaluators, list) else [evaluators]:
            ann_file = evaluator.get("ann_file")
            if ann_file and "://" not in ann_file and evaluator.get("type") != "BEVDetMetric":
                read_coco_annotations(ann_file, f"{name}_evaluator.ann_file")


def _load_state_dict(path: str, key: str) -> Dict[str, torch.Tensor]:
    if not os.path.isfile(path):
        raise PreflightError(f"{key}: checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is reported the same way
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PreflightError(f"{key}: cannot read checkpoint {path}: {first_line}") from None
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise PreflightError(f"{key}: {path} holds no model state_dict")
    return {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}


def compare_state_dicts(
    model: Dict[str, torch.Tensor], ckpt: Dict[str, torch.Tensor]
) -> Tuple[List[str], List[str], List[str]]:
    """(missing from checkpoint, unexpected in checkpoint, shape mismatches)."""
    missing = [k for k in model if k not in ckpt]
    unexpected = [k for k in ckpt if k not in model]
    mismatched = [
        f"{k} {tuple(ckpt[k].shape)} vs model {tuple(v.shape)}"
        for k, v in model.items()
        if k in ckpt and ckpt[k].shape != v.shape
    ]
    return missing, unexpected, mismatched


def check_checkpoint(cfg: Config, path: str, key: str, strict: bool) -> None:
    """The checkpoint at ``path`` belongs to ``cfg.model``.

    ``strict``: every parameter must match (test, resume); otherwise (``load_from``
    for fine-tuning) at least half of the model's entries must match by name and shape.
    """
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    ckpt = _load_state_dict(path, key)
    init_default_scope(cfg.get("default_scope", "mmdet"))
    model = MODELS.build(copy.deepcopy(cfg.model)).state_dict()  # build mutates its cfg
    missing, unexpected, mismatched = compare_state_dicts(model, ckpt)
    matched = len(model) - len(missing) - len(mismatched)
    if (strict and (missing or unexpected or mismatched)) or matched < len(model) / 2:
        parts = [
            f"{len(items)} {what} (e.g. {items[0]})"
            for items, what in (
                (missing, "missing"),
                (unexpected, "unexpected"),
                (mismatched, "shape mismatches"),
            )
            if items
        ]
        raise PreflightError(
            f"{key}: checkpoint {path} does not fit model {cfg.model.get('type')}: "
            + ", ".join(parts)
        )
