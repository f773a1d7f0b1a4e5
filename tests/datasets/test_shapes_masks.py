"""The shapes set's instance masks: exact (what is drawn and seen), in COCO RLE that mmdet's
loader reads."""

from __future__ import annotations

import json
import os

import numpy as np
from pycocotools import mask as mask_utils

from npudet.datasets.shapes import make_image, visible_masks


def test_visible_masks_are_the_drawn_pixels() -> None:
    rng = np.random.default_rng(5)
    covered = 0
    for _ in range(30):
        img, objects = make_image(rng, 96, max_objects=4)
        masks = visible_masks(objects, 96)
        assert len(masks) == len(objects)
        assert (sum(m.astype(int) for m in masks) <= 1).all(), "visible masks overlap"
        for (_, (x, y, w, h)), mask in zip(objects, masks):
            ys, xs = np.nonzero(mask)
            if not len(ys):
                covered += 1
                continue
            # inside its box (a circle's outline reaches the pixel past an even-sized box:
            # cv2.ellipse around x + w // 2 with semi-axis w // 2), and one colour: shapes are
            # painted flat over the noisy background, so a mask off by a pixel would take in a
            # background colour
            assert xs.min() >= x and xs.max() <= x + w and ys.min() >= y and ys.max() <= y + h
            assert len(np.unique(img[ys, xs], axis=0)) == 1
    assert covered < 3


def test_annotations_carry_rle_masks(tiny_shapes: str) -> None:
    with open(os.path.join(tiny_shapes, "annotations", "instances_train.json")) as f:
        coco = json.load(f)
    assert coco["annotations"]
    for ann in coco["annotations"]:
        rle = ann["segmentation"]
        assert rle["size"] == [256, 256] and isinstance(rle["counts"], str)
        mask = mask_utils.decode(dict(rle, counts=rle["counts"].encode()))
        x, y, w, h = (int(v) for v in ann["bbox"])
        assert mask.sum() <= w * h and not mask[:, : max(x, 0)].any()


def test_semantic_maps_are_the_instance_masks_labelled(tiny_shapes: str) -> None:
    import cv2

    from npudet.datasets import SEMANTIC_CLASSES, write_semantic_maps

    write_semantic_maps(tiny_shapes)
    assert not write_semantic_maps(tiny_shapes)  # up to date: nothing rewritten
    assert SEMANTIC_CLASSES == ("background", "circle", "square", "triangle")
    with open(os.path.join(tiny_shapes, "annotations", "instances_val.json")) as f:
        coco = json.load(f)
    for img in coco["images"]:
        stem = os.path.splitext(img["file_name"])[0]
        path = os.path.join(tiny_shapes, "semantic", "val", f"{stem}.png")
        labels = cv2.imread(path, cv2.IMREAD_UNCHANGED)
        expected = np.zeros((img["height"], img["width"]), np.uint8)
        for ann in coco["annotations"]:
            if ann["image_id"] == img["id"]:
                rle = dict(ann["segmentation"], counts=ann["segmentation"]["counts"].encode())
                expected[mask_utils.decode(rle) > 0] = ann["category_id"]
        assert labels.dtype == np.uint8 and (labels == expected).all()
        assert set(np.unique(labels)) - {0}, "an image with no shape"
