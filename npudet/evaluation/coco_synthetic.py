"""Generated COCO box annotations and detections (no images) for evaluating COCO backends.

``synthetic_coco_gt`` makes a COCO-format ground-truth dict whose box sizes span COCO's
small / medium / large ranges; ``synthetic_detections`` turns any ground truth into results
that score between 0 and 1: each box jittered (some dropped, some with a wrong class) plus
random false positives, so AP, AR and every area range come out non-trivial.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np


def synthetic_coco_gt(
    num_images: int,
    num_classes: int = 80,
    seed: int = 0,
    width: int = 640,
    height: int = 480,
    mean_objects: float = 7.0,
    crowd_fraction: float = 0.01,
) -> Dict:
    """A COCO ground-truth dict: ``images``, ``annotations`` (xywh boxes), ``categories``.

    Objects per image ~ Poisson(``mean_objects``) (at least one); box sides log-uniform in
    [4, 0.8 * image side], so areas fall in all three COCO ranges.
    """
    if num_images < 1:
        raise ValueError(f"num_images: expected >= 1, got {num_images}")
    if num_classes < 1:
        raise ValueError(f"num_classes: expected >= 1, got {num_classes}")
    rng = np.random.default_rng(seed)
    images: List[Dict] = []
    annotations: List[Dict] = []
    for image_id in range(1, num_images + 1):
        images.append(
            dict(id=image_id, file_name=f"{image_id:012d}.jpg", width=width, height=height)
        )
        count = max(1, int(rng.poisson(mean_objects)))
        sides = np.exp(rng.uniform(np.log(4), np.log(0.8 * min(width, height)), (count, 2)))
        for w, h in sides:
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=image_id,
                    category_id=int(rng.integers(1, num_classes + 1)),
                    bbox=[float(x), float(y), float(w), float(h)],
                    area=float(w * h),
                    iscrowd=int(rng.random() < crowd_fraction),
                )
            )
    categories = [dict(id=i, name=f"class_{i}") for i in range(1, num_classes + 1)]
    return dict(images=images, annotations=annotations, categories=categories)


def synthetic_detections(
    gt: Dict,
    seed: int = 0,
    false_positives: int = 3,
    jitter: float = 0.1,
    miss_rate: float = 0.1,
    wrong_class_rate: float = 0.05,
) -> List[Dict]:
    """COCO results (``image_id``, ``category_id``, xywh ``bbox``, ``score``) for ``gt``.

    Each non-crowd ground-truth box is kept with probability 1 - ``miss_rate``, its corners
    moved by N(0, ``jitter`` * side), its class replaced with probability
    ``wrong_class_rate``; scores of true boxes are U(0.2, 1). Each image also gets
    ``false_positives`` random boxes with scores U(0, 0.6).
    """
    if false_positives < 0:
        raise ValueError(f"false_positives: expected >= 0, got {false_positives}")
    rng = np.random.default_rng(seed)
    cat_ids = [c["id"] for c in gt["categories"]]
    sizes = {img["id"]: (img["width"], img["height"]) for img in gt["images"]}
    results: List[Dict] = []
    for ann in gt["annotations"]:
        if ann.get("iscrowd") or rng.random() < miss_rate:
            continue
        x, y, w, h = ann["bbox"]
        dx0, dy0, dx1, dy1 = rng.normal(0, jitter, 4) * [w, h, w, h]
        nw, nh = max(w + dx1 - dx0, 1.0), max(h + dy1 - dy0, 1.0)
        cat = ann["category_id"]
        if rng.random() < wrong_class_rate:
            cat = int(rng.choice(cat_ids))
        box = [float(x + dx0), float(y + dy0), float(nw), float(nh)]
        results.append(
            dict(
                image_id=ann["image_id"],
                category_id=cat,
                bbox=box,
                score=float(rng.uniform(0.2, 1)),
            )
        )
    for image_id, (width, height) in sizes.items():
        for _ in range(false_positives):
            w, h = rng.uniform(2, width / 2), rng.uniform(2, height / 2)
            box = [float(rng.uniform(0, width - w)), float(rng.uniform(0, height - h)), w, h]
            results.append(
                dict(
                    image_id=image_id,
                    category_id=int(rng.choice(cat_ids)),
                    bbox=[float(v) for v in box],
                    score=float(rng.uniform(0, 0.6)),
                )
            )
    return results
