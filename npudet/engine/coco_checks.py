"""What mmdet's ``CocoDataset``, its pipeline and the COCO evaluator read from an annotation
file, checked entry by entry before a run, so that a bad entry is one line naming the file
and the entry instead of a KeyError (or no ground truth at all) mid-run.

Each function returns the first problem as one line (``None`` when there is none); the
caller prefixes the config key and raises.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

IMAGE_FIELDS = ("id", "file_name", "height", "width")
ANNOTATION_FIELDS = ("id", "image_id", "category_id", "bbox", "area")
CATEGORY_FIELDS = ("id", "name")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _entry(kind: str, index: int, entry: Any) -> str:
    ident = entry.get("id") if isinstance(entry, dict) else None
    return f"{kind}[{index}]" + ("" if ident is None else f" (id {ident})")


def _missing(entry: Any, fields: Sequence[str]) -> Optional[str]:
    if not isinstance(entry, dict):
        return f"expected an object, got {type(entry).__name__}"
    absent = [field for field in fields if field not in entry]
    return f"no {', '.join(repr(f) for f in absent)}" if absent else None


def entries_problem(data: Dict, path: str, evaluated: bool) -> Optional[str]:
    """The first entry of ``data`` (a COCO dict) that the dataset or the evaluator cannot
    read. ``evaluated``: the file is an evaluator's (pycocotools reads ``iscrowd`` too)."""
    images = data["images"]
    if not isinstance(images, list) or not images:
        return f"{path} lists no images ('images' is empty): nothing to train or evaluate on"
    sizes: Dict[Any, Tuple[int, int]] = {}  # image id -> (width, height)
    first_index: Dict[Any, int] = {}
    for i, img in enumerate(images):
        problem = _missing(img, IMAGE_FIELDS)
        if problem is None and not all(
            isinstance(img[k], int) and img[k] > 0 for k in ("height", "width")
        ):
            problem = f"height {img['height']!r} / width {img['width']!r}: expected integers > 0"
        if problem is None and not isinstance(img["file_name"], str):
            problem = f"file_name {img['file_name']!r}: expected a string"
        if problem is None and img["id"] in first_index:
            problem = f"id {img['id']!r} is also the id of images[{first_index[img['id']]}]"
        if problem:
            return f"{path}: {_entry('images', i, img)}: {problem}"
        first_index[img["id"]] = i
        sizes[img["id"]] = (img["width"], img["height"])
    cat_ids = set()
    for i, cat in enumerate(data["categories"]):
        problem = _missing(cat, CATEGORY_FIELDS)
        if problem:
            return f"{path}: {_entry('categories', i, cat)}: {problem}"
        cat_ids.add(cat["id"])
    fields = (*ANNOTATION_FIELDS, "iscrowd") if evaluated else ANNOTATION_FIELDS
    for i, ann in enumerate(data["annotations"]):
        problem = _missing(ann, fields) or _annotation_problem(ann, sizes, cat_ids)
        if problem:
            where = _entry("annotations", i, ann)
            if isinstance(ann, dict) and "image_id" in ann:
                where += f" of image_id {ann['image_id']}"
            return f"{path}: {where}: {problem}"
    return None


def _annotation_problem(
    ann: Dict, sizes: Dict[Any, Tuple[int, int]], cat_ids: set
) -> Optional[str]:
    bbox = ann["bbox"]
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(_number(v) for v in bbox)):
        return f"bbox {bbox!r}: expected 4 numbers [x, y, width, height]"
    if bbox[2] <= 0 or bbox[3] <= 0:
        return f"bbox {bbox!r}: width and height must be > 0"
    if not _number(ann["area"]):
        return f"area {ann['area']!r}: expected a number"
    if ann["image_id"] not in sizes:
        return f"image_id {ann['image_id']!r} is not the id of any image"
    width, height = sizes[ann["image_id"]]
    x, y, w, h = bbox
    if x >= width or y >= height or x + w <= 0 or y + h <= 0:
        # mmdet clips boxes to the image and drops the empty ones: no ground truth, no error
        return f"bbox {bbox!r} lies outside its image ({width} x {height})"
    if ann["category_id"] not in cat_ids:
        return f"category_id {ann['category_id']!r} is not the id of any category"
    return None


def classes_problem(data: Dict, path: str, classes: Sequence[str]) -> Optional[str]:
    """Every class of the config is a category name of the file (mmdet silently drops the
    others: a run with no ground truth)."""
    names = [cat["name"] for cat in data["categories"]]
    missing = [c for c in classes if c not in names]
    if not missing:
        return None
    lower = {n.lower(): n for n in names}
    case = [f"{c!r} vs {lower[c.lower()]!r}" for c in missing if c.lower() in lower]
    hint = f"; names differ in case: {', '.join(case)}" if case else ""
    return (
        f"classes {missing} of the config's metainfo.classes {list(classes)} are not category "
        f"names of {path}, whose categories are {names}{hint}"
    )


def training_problem(
    data: Dict, path: str, classes: Sequence[str], filter_cfg: Optional[Dict]
) -> Optional[str]:
    """The training set keeps at least one image with ground truth after mmdet's
    ``filter_cfg`` (``filter_empty_gt``, ``min_size``)."""
    wanted = {cat["id"] for cat in data["categories"] if cat["name"] in classes}
    with_gt = {ann["image_id"] for ann in data["annotations"] if ann["category_id"] in wanted}
    if not with_gt:
        return (
            f"{path} has no annotation of the classes {list(classes)}: no ground truth to train on"
        )
    filter_cfg = filter_cfg or {}
    min_size = filter_cfg.get("min_size", 0)
    kept = [
        img
        for img in data["images"]
        if (not filter_cfg.get("filter_empty_gt") or img["id"] in with_gt)
        and min(img["width"], img["height"]) >= min_size
    ]
    if not kept:
        return f"no image of {path} is left after filter_cfg={dict(filter_cfg)}"
    return None


def image_problem(data: Dict, prefix: str, path: str, decode: bool) -> Optional[str]:
    """Every image file exists and (``decode``) decodes as the pipeline's
    ``LoadImageFromFile`` decodes it (mmcv, cv2)."""
    missing: List[str] = []
    for img in data["images"]:
        file = os.path.join(prefix, img["file_name"])
        if not os.path.isfile(file):
            missing.append(file)
    if missing:
        return (
            f"image file not found: {missing[0]} ({len(missing)} of {len(data['images'])} "
            f"listed in {path} are missing)"
        )
    if not decode:
        return None
    import mmcv

    for i, img in enumerate(data["images"]):
        file = os.path.join(prefix, img["file_name"])
        try:
            with open(file, "rb") as f:
                array = mmcv.imfrombytes(f.read(), flag="color", backend="cv2")
        except Exception as err:  # noqa: BLE001 - any decoder error means the same
            array, why = None, f": {str(err).strip().splitlines()[0] if str(err).strip() else err}"
        else:
            why = ""
        if array is None or getattr(array, "size", 0) == 0:
            return (
                f"{_entry('images', i, img)} of {path}: image {file} does not decode{why} "
                "(--skip-image-check skips decoding)"
            )
        # mmdet scales the boxes with the decoded size but evaluates at the file's: a size
        # that differs trains and scores silently wrong boxes
        if array.shape[:2] != (img["height"], img["width"]):
            return (
                f"{_entry('images', i, img)} of {path}: image {file} is "
                f"{array.shape[1]} x {array.shape[0]} (width x height), the file says "
                f"{img['width']} x {img['height']}"
            )
    return None


def split_problem(dataset: Dict, evaluated: Dict, dataset_path: str, path: str) -> Optional[str]:
    """The evaluator's annotation file ``evaluated`` scores the dataset's images against
    their ground truth: it has annotations, and every image of ``dataset`` with the same id,
    file name and boxes; else pycocotools prints -1 for every number, or scores another
    split (whose ids and file names may well be the same: only the boxes tell)."""
    if not evaluated["annotations"]:
        return f"{path} has no annotations: every COCO number would be -1"
    names = {img["id"]: img["file_name"] for img in evaluated["images"]}
    truth, theirs = _boxes_by_image(dataset), _boxes_by_image(evaluated)
    for i, img in enumerate(dataset["images"]):
        if names.get(img["id"]) != img["file_name"]:
            why = "is not in it"
        elif truth.get(img["id"], []) != theirs.get(img["id"], []):
            why = "has other boxes there"
        else:
            continue
        return (
            f"{path} is not the ground truth of {dataset_path}: its "
            f"{_entry('images', i, img)} ({img['file_name']!r}) {why} (another split's file?)"
        )
    return None


def _boxes_by_image(data: Dict) -> Dict[Any, List[Tuple]]:
    boxes: Dict[Any, List[Tuple]] = {}
    for ann in data["annotations"]:
        box = tuple(round(float(v), 2) for v in ann["bbox"])
        boxes.setdefault(ann["image_id"], []).append((ann["category_id"], box))
    return {image: sorted(found) for image, found in boxes.items()}


def masks_problem(
    data: Dict, path: str, step: str, classes: Optional[Sequence[str]]
) -> Optional[str]:
    """Every annotation mmdet's ``CocoDataset`` loads (not ``ignore``, area > 0, sides >= 1,
    a class of ``classes`` when known) has a non-empty ``segmentation``, which the pipeline
    step ``step`` (``LoadAnnotations(with_mask=True)``) reads: the dataset keeps an instance
    without one, and the step fails mid-run with ``KeyError: 'mask'``. Checked after
    :func:`entries_problem`."""
    wanted = {cat["id"] for cat in data["categories"] if classes is None or cat["name"] in classes}
    loaded = [
        (i, ann)
        for i, ann in enumerate(data["annotations"])
        if not ann.get("ignore")
        and ann["area"] > 0
        and min(ann["bbox"][2:]) >= 1
        and ann["category_id"] in wanted
    ]
    without = [(i, ann) for i, ann in loaded if not ann.get("segmentation")]
    if not without:
        return None
    needs = f"{step} needs a mask for each"
    if len(without) == len(loaded):
        return (
            f"{path} has no segmentation in any of its {len(loaded)} annotations (box-only "
            f"data), but {needs}: use annotations with masks or a config for boxes"
        )
    i, ann = without[0]
    return (
        f"{path}: {_entry('annotations', i, ann)} has no segmentation ({len(without)} of "
        f"{len(loaded)} annotations have none), but {needs}"
    )
