"""Generated training data at a config's real input size, for the iteration benchmark.

2D detectors: a COCO-format set (``annotations/instances_train.json`` + ``train/*.jpg``)
of W x H images with the shapes set's objects (:func:`npudet.datasets.shapes.make_image`,
drawn square and stretched to W x H) and their visible masks (for instance segmentation,
e.g. Mask2Former), labelled with the first classes of the config's dataset so mmdet's
``CocoDataset`` keeps them. BEV detectors: the synthetic multi-camera
set in npudet's nuScenes info format (:mod:`npudet.bev.infos.synthetic`, the format
``tools/dataset_converters/create_nuscenes_infos.py`` writes) with nuScenes' 1600 x 900 cameras.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Sequence

import cv2
import numpy as np
from mmengine.config import Config, ConfigDict

from npudet.bev.infos.synthetic import CLASSES as BEV_CLASSES
from npudet.bev.infos.synthetic import make_bev_dataset
from npudet.datasets.shapes import encode_mask, make_image, visible_masks

NUSCENES_CAMERA = (1600, 900)  # width, height of a nuScenes camera image


def write_coco_images(
    root: str, width: int, height: int, num_images: int, classes: Sequence[str], seed: int = 0
) -> str:
    """Write ``num_images`` W x H JPEGs and their COCO annotations under ``root``.

    The shapes' three kinds become ``classes[0..2]``; each object carries its box and its
    visible mask (compressed RLE); returns the annotation file path.
    """
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "train"), exist_ok=True)
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    side = min(width, height)
    sx, sy = width / side, height / side
    images: List[Dict[str, Any]] = []
    annotations: List[Dict[str, Any]] = []
    for index in range(num_images):
        img, objects = make_image(rng, side, max_objects=4)
        name = f"{index:06d}.jpg"
        cv2.imwrite(os.path.join(root, "train", name), cv2.resize(img, (width, height)))
        images.append(dict(id=index + 1, file_name=name, width=width, height=height))
        for (cls, (x, y, w, h)), mask in zip(objects, visible_masks(objects, side)):
            box = [x * sx, y * sy, w * sx, h * sy]
            stretched = cv2.resize(mask, (width, height), interpolation=cv2.INTER_NEAREST)
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=index + 1,
                    category_id=cls + 1,
                    bbox=box,
                    area=box[2] * box[3],
                    segmentation=encode_mask(stretched),
                    iscrowd=0,
                )
            )
    categories = [dict(id=k + 1, name=name) for k, name in enumerate(classes[:3])]
    path = os.path.join(root, "annotations", "instances_train.json")
    with open(path, "w") as f:
        json.dump(dict(images=images, annotations=annotations, categories=categories), f)
    return path


def dataset_classes(cfg: Config) -> List[str]:
    """The class names the config's training dataset keeps (its metainfo, else the
    dataset class's own)."""
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope

    dataset = cfg.train_dataloader.dataset
    meta = dataset.get("metainfo") or {}
    if meta.get("classes"):
        return list(meta["classes"])
    init_default_scope(cfg.get("default_scope", "mmdet"))
    return list(DATASETS.get(dataset.type).METAINFO["classes"])


def use_coco_images(cfg: Config, root: str, width: int, height: int) -> None:
    """Point ``cfg``'s training data at :func:`write_coco_images`' set, in place.

    The pipeline loads (masks too where the config's own pipeline does), resizes to W x H
    (keeping the ratio: a no-op on these images) and packs: the config's random multi-scale
    resize and crop are left out so every iteration has the same input size; batch 1, no
    worker processes (data time is in the iteration), no shuffling (every run sees the same
    images in the same order).
    """
    dataset = cfg.train_dataloader.dataset
    with_mask = any(
        step.get("type") == "LoadAnnotations" and step.get("with_mask", False)
        for step in dataset.get("pipeline", [])
    )
    dataset.data_root = root.rstrip("/") + "/"
    dataset.ann_file = "annotations/instances_train.json"
    dataset.data_prefix = ConfigDict(img="train/")
    dataset.filter_cfg = ConfigDict(filter_empty_gt=False)
    dataset.pipeline = [
        dict(type="LoadImageFromFile"),
        dict(type="LoadAnnotations", with_bbox=True, with_mask=with_mask),
        dict(type="Resize", scale=(width, height), keep_ratio=True),
        dict(type="PackDetInputs"),
    ]
    _single_sample_loader(cfg)


def write_bev_frames(root: str, frames: int, seed: int = 0) -> Dict[str, Any]:
    """One training scene of ``frames`` frames x 6 nuScenes-size cameras (and one val scene)."""
    width, height = NUSCENES_CAMERA
    return make_bev_dataset(root, 1, 1, frames, seed, width, height)


def use_bev_frames(cfg: Config, root: str) -> None:
    """Point ``cfg``'s training data at :func:`write_bev_frames`' set, in place; the
    config's own pipeline (its resize to the model's input size) is kept. The set has three
    of nuScenes' classes (car, truck, pedestrian), which the dataset must be told; the model
    keeps its head (labels 0-2 of its classes: the same work per iteration)."""
    dataset = cfg.train_dataloader.dataset
    dataset.data_root = root.rstrip("/") + "/"
    dataset.ann_file = "infos_train.json"
    dataset.metainfo = ConfigDict(classes=list(BEV_CLASSES))
    _single_sample_loader(cfg)


def _single_sample_loader(cfg: Config) -> None:
    loader = cfg.train_dataloader
    loader.batch_size = 1
    loader.num_workers = 0
    loader.persistent_workers = False
    loader.sampler = ConfigDict(type="DefaultSampler", shuffle=False)
    loader.pop("batch_sampler", None)
