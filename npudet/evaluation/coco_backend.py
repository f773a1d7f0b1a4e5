"""The COCO API behind box evaluation: faster-coco-eval when installed, pycocotools otherwise.

Both backends expose the same two classes: ``COCO`` (ground truth / results, with mmdet's
snake-case aliases such as ``get_cat_ids``) and ``COCOeval(coco_gt, coco_dt, iou_type)`` with
``evaluate`` / ``accumulate`` / ``summarize`` and the 12 numbers in ``stats[:12]``.
faster-coco-eval runs the per-image matching and the accumulation in C++; its numbers match
pycocotools' (tests/evaluation/test_coco_backend.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Tuple

BACKENDS: Tuple[str, ...] = ("auto", "faster_coco_eval", "pycocotools")


@dataclass(frozen=True)
class CocoBackend:
    """A resolved backend: its name and its ``COCO`` / ``COCOeval`` classes."""

    name: str
    coco: type
    cocoeval: Callable[..., Any]


def faster_coco_eval_available() -> bool:
    """Whether the ``faster_coco_eval`` package can be imported."""
    return importlib.util.find_spec("faster_coco_eval") is not None


def _faster_coco_eval() -> CocoBackend:
    from faster_coco_eval import COCO, COCOeval_faster

    class FasterCOCOeval(COCOeval_faster):
        """``COCOeval_faster`` printing its summary to stdout, as pycocotools does.

        faster-coco-eval logs through its own logger by default, which mmengine does not
        show; mmdet's CocoMetric relies on the printed table.
        """

        def __init__(self, cocoGt: Any = None, cocoDt: Any = None, iouType: str = "segm", **kw):
            kw.setdefault("print_function", print)
            super().__init__(cocoGt, cocoDt, iouType, **kw)

    return CocoBackend("faster_coco_eval", COCO, FasterCOCOeval)


def _pycocotools() -> CocoBackend:
    # mmdet's wrappers: pycocotools' classes plus the snake-case aliases CocoMetric calls.
    from mmdet.datasets.api_wrappers import COCO, COCOeval

    return CocoBackend("pycocotools", COCO, COCOeval)


def coco_backend(name: str = "auto") -> CocoBackend:
    """Resolve ``name`` (one of ``BACKENDS``) to a backend.

    ``auto`` is faster-coco-eval when installed, pycocotools otherwise; asking for
    ``faster_coco_eval`` when it is not installed raises ImportError.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {name!r}")
    if name == "pycocotools" or (name == "auto" and not faster_coco_eval_available()):
        return _pycocotools()
    if not faster_coco_eval_available():
        raise ImportError(
            "backend='faster_coco_eval' needs the faster-coco-eval package "
            "(pip install 'npudet[coco]', which tools/setup.sh installs)"
        )
    return _faster_coco_eval()
