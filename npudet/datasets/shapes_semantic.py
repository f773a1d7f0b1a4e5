"""The shapes set's semantic maps, for semantic segmentation (MMSegmentation's data layout).

Each image's label map is drawn from its instance masks (``annotations/instances_<split>.json``,
the visible masks, which never overlap): 0 the background, ``1 + class index`` a shape's
pixels. Written as ``semantic/<split>/<image stem>.png`` beside the images, which mmseg's
``BaseSegDataset`` reads with ``data_prefix=dict(img_path=split, seg_map_path='semantic/' +
split)``.
"""

from __future__ import annotations

import json
import os
from typing import Tuple

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from ..utils.json_io import recorded_settings_match, write_json_atomic
from .shapes import CLASSES, SPLITS

SEMANTIC_CLASSES: Tuple[str, ...] = ("background", *CLASSES)


def write_semantic_split(root: str, split: str) -> int:
    """Write ``root/semantic/<split>/*.png`` from the split's instance masks; the count."""
    with open(os.path.join(root, "annotations", f"instances_{split}.json")) as fh:
        coco = json.load(fh)
    folder = os.path.join(root, "semantic", split)
    os.makedirs(folder, exist_ok=True)
    labels = {
        img["id"]: np.zeros((img["height"], img["width"]), np.uint8) for img in coco["images"]
    }
    for ann in coco["annotations"]:
        mask = mask_utils.decode(
            dict(size=ann["segmentation"]["size"], counts=ann["segmentation"]["counts"].encode())
        )
        labels[ann["image_id"]][mask > 0] = ann["category_id"]  # category ids are 1 + index
    for img in coco["images"]:
        stem = os.path.splitext(img["file_name"])[0]
        cv2.imwrite(os.path.join(folder, f"{stem}.png"), labels[img["id"]])
    return len(coco["images"])


def write_semantic_maps(root: str) -> bool:
    """Write the semantic maps of the shapes set under ``root`` (made by
    ``make_shapes_dataset``) unless they exist for the set's recorded settings. Returns True
    if files were written."""
    meta_file = os.path.join(root, "meta.json")
    with open(meta_file) as fh:
        settings = dict(shapes=json.load(fh), labels=list(SEMANTIC_CLASSES))
    done_file = os.path.join(root, "semantic", "meta.json")
    if recorded_settings_match(done_file, settings):
        return False
    for split in SPLITS:
        write_semantic_split(root, split)
    write_json_atomic(done_file, settings)
    return True
