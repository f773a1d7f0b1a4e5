"""Built-in detection data: a deterministic COCO-format set of coloured shapes.

Each object has its box and its exact visible mask (the shape as drawn, less what later
shapes cover), stored as COCO compressed RLE, so instance segmentation trains on it too.
"""

from __future__ import annotations

import os
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from ..utils.json_io import recorded_settings_match, write_json_atomic

CLASSES: Tuple[str, ...] = ("circle", "square", "triangle")
SPLITS: Tuple[str, ...] = ("train", "val")


def _draw(img: np.ndarray, cls: str, box: Sequence[int], colour: Tuple[int, ...]) -> None:
    x, y, w, h = box
    if cls == "circle":
        cv2.ellipse(img, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360, colour, -1)
    elif cls == "square":
        cv2.rectangle(img, (x, y), (x + w - 1, y + h - 1), colour, -1)
    else:
        pts = np.array([[x + w // 2, y], [x, y + h - 1], [x + w - 1, y + h - 1]], np.int32)
        cv2.fillPoly(img, [pts], colour)


def _iou(a: Sequence[int], b: Sequence[int]) -> float:
    ix = max(0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / float(a[2] * a[3] + b[2] * b[3] - inter)


def make_image(
    rng: np.random.Generator, size: int, max_objects: int, max_overlap: float = 0.25
) -> Tuple[np.ndarray, List[Tuple[int, List[int]]]]:
    """One image (size, size, 3) uint8 BGR and its objects [(class index, [x, y, w, h])]."""
    bg = rng.integers(0, 256, 3)
    img = np.empty((size, size, 3), np.uint8)
    img[:] = bg
    noise = rng.normal(0, 8, (size, size, 1))
    img = np.clip(img + noise, 0, 255).astype(np.uint8)
    objects: List[Tuple[int, List[int]]] = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(20):
            w = int(rng.integers(size // 8, size // 2))
            aspect = rng.uniform(0.7, 1.4)
            h = int(np.clip(w * aspect, size // 8, size // 2))
            box = [int(rng.integers(0, size - w)), int(rng.integers(0, size - h)), w, h]
            if all(_iou(box, other) <= max_overlap for _, other in objects):
                break
        else:
            continue
        cls = int(rng.integers(len(CLASSES)))
        if CLASSES[cls] == "square":
            box[3] = box[2]
            box[1] = min(box[1], size - box[3])
        colour = rng.integers(0, 256, 3)
        while np.abs(colour.astype(int) - bg).sum() < 150:
            colour = rng.integers(0, 256, 3)
        _draw(img, CLASSES[cls], box, tuple(int(c) for c in colour))
        objects.append((cls, box))
    return img, objects


def visible_masks(objects: Sequence[Tuple[int, Sequence[int]]], size: int) -> List[np.ndarray]:
    """(size, size) uint8 0/1 mask of each of :func:`make_image`'s objects as seen: the
    shape redrawn alone, less every shape drawn after it (those are painted over it)."""
    drawn = []
    for cls, box in objects:
        mask = np.zeros((size, size), np.uint8)
        _draw(mask, CLASSES[cls], box, (1,))
        drawn.append(mask)
    covered = np.zeros((size, size), np.uint8)
    visible = []
    for mask in reversed(drawn):
        visible.append(mask & (1 - covered))
        covered |= mask
    return visible[::-1]


def encode_mask(mask: np.ndarray) -> Dict:
    """COCO compressed RLE of a (H, W) 0/1 mask, JSON-ready (``counts`` as str)."""
    rle = mask_utils.encode(np.asfortranarray(mask))
    return dict(size=[int(v) for v in rle["size"]], counts=rle["counts"].decode("ascii"))


def _split_seed(seed: int, split: str) -> int:
    return seed * 1000 + SPLITS.index(split)


def write_split(
    root: str, split: str, num_images: int, seed: int, size: int, max_objects: int
) -> str:
    """Write ``root/<split>/*.jpg`` and ``root/annotations/instances_<split>.json``."""
    rng = np.random.default_rng(_split_seed(seed, split))
    os.makedirs(os.path.join(root, split), exist_ok=True)
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    images: List[Dict] = []
    annotations: List[Dict] = []
    for index in range(num_images):
        img, objects = make_image(rng, size, max_objects)
        name = f"{index:06d}.jpg"
        cv2.imwrite(os.path.join(root, split, name), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        images.append(dict(id=index + 1, file_name=name, width=size, height=size))
        for (cls, box), mask in zip(objects, visible_masks(objects, size)):
            # area stays the box's, as before masks: the box metrics' size ranges unchanged
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=index + 1,
                    category_id=cls + 1,
                    bbox=[float(v) for v in box],
                    area=float(box[2] * box[3]),
                    segmentation=encode_mask(mask),
                    iscrowd=0,
                )
            )
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(CLASSES)]
    ann_file = os.path.join(root, "annotations", f"instances_{split}.json")
    return write_json_atomic(
        ann_file, dict(images=images, annotations=annotations, categories=categories)
    )


def make_shapes_dataset(
    root: str,
    num_train: int = 1000,
    num_val: int = 200,
    seed: int = 0,
    size: int = 256,
    max_objects: int = 4,
) -> bool:
    """Generate the shapes set under ``root`` unless it exists with these settings.

    Returns True if files were written. A ``meta.json`` records the settings; it is
    written last, so an interrupted run is redone (and a set written before masks existed,
    whose settings lack ``masks``, is rewritten: same images and boxes, plus the masks).
    """
    settings = dict(
        num_train=num_train,
        num_val=num_val,
        seed=seed,
        size=size,
        max_objects=max_objects,
        classes=list(CLASSES),
        masks="visible, RLE",
    )
    meta_file = os.path.join(root, "meta.json")
    if recorded_settings_match(meta_file, settings):
        return False
    for split, count in zip(SPLITS, (num_train, num_val)):
        write_split(root, split, count, seed, size, max_objects)
    write_json_atomic(meta_file, settings)
    return True
