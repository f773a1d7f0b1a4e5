"""Evaluate one checkpoint with several MSDA implementations and compare their detections:
the cross-implementation checkpoint tests (``test_train_eval_e2e.py``, and
``test_checkpoint_trained.py`` on a model trained long enough to be confident).

``shifted_for_test`` (``msda_perturbed.py``) is the negative control: it must fail the
comparison that every real implementation passes.
"""

from __future__ import annotations

import json
import os
import pickle
from typing import Dict, List

import msda_perturbed as perturbed
import torch
from plugin_util import SMALL_DETR, data_options, run_tool

# Between implementations the MSDA outputs differ by float32 round-off. Measured on the tiny
# set's 4 val images (scores 0.03-0.07 after 4 iterations): scores within 4e-8 to 6e-8, boxes
# equal, same order. The tolerances leave room for other CPUs' round-off (scores 250x, boxes
# 1e-2 px of 256), far below what a wrong sample moves: sampling a tenth of a pixel off
# (``msda_perturbed``) moved the largest score change per image by 1.8e-3 to 3.9e-3, 180-390x
# SCORE_TOL (the negative-control tests hold it above 50x).
SCORE_TOL, BOX_TOL = 1e-5, 1e-2
Predictions = Dict[int, Dict[str, torch.Tensor]]


def evaluate(work: str, ckpt: str, impl: str, data: str) -> Dict[str, float]:
    """``tools/test.py`` with ``impl`` on the val images of the shapes set at ``data``: the
    COCO metrics; the predictions go to ``work/preds.pkl`` (:func:`predictions`).

    ``shifted_for_test`` is registered in the tool's process by running the tool through
    ``msda_perturbed.py``.
    """
    wrapper = [perturbed.__file__] if impl == perturbed.NAME else []
    proc = run_tool(
        [
            *wrapper,
            "tools/test.py",
            SMALL_DETR,
            ckpt,
            "--work-dir",
            work,
            "--msda-impl",
            impl,
            "--out",
            os.path.join(work, "preds.pkl"),
            "--cfg-options",
            *data_options(data),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AP50" in proc.stdout + proc.stderr
    with open(os.path.join(work, "coco_bbox_test.json")) as f:
        return json.load(f)["bbox"]


def predictions(work: str) -> Predictions:
    """image id -> ``pred_instances`` (bboxes (N, 4) xyxy pixels, scores (N,), labels (N,))."""
    with open(os.path.join(work, "preds.pkl"), "rb") as f:
        return {r["img_id"]: r["pred_instances"] for r in pickle.load(f)}


def evaluate_with_each(ckpt: str, data: str, root: str, impls: List[str]) -> dict:
    """impl -> (metrics, predictions) of ``ckpt`` evaluated with each of ``impls``, each in
    its own work dir under ``root``."""
    out = {}
    for impl in impls:
        work = os.path.join(root, impl)
        out[impl] = (evaluate(work, ckpt, impl, data), predictions(work))
    return out


def val_ids(data: str) -> List[int]:
    """The image ids of the val split of the shapes set at ``data``, sorted."""
    with open(os.path.join(data, "annotations", "instances_val.json")) as f:
        return sorted(image["id"] for image in json.load(f)["images"])


def assert_same_detections(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor]) -> None:
    """Each wanted detection has one of the same label, score and box in ``got``.

    Scores closer than ``SCORE_TOL`` may trade places (top-k order), so detections are
    matched, not compared by index; at the top-k boundary one of two near-tied candidates
    may be kept by each run, so only detections scored above the boundary must match.
    """
    assert len(got["scores"]) == len(want["scores"]) > 0
    torch.testing.assert_close(
        got["scores"].sort(descending=True).values,
        want["scores"].sort(descending=True).values,
        atol=SCORE_TOL,
        rtol=0,
    )
    boundary = float(want["scores"].min()) + SCORE_TOL
    unused = set(range(len(got["scores"])))
    for box, score, label in zip(want["bboxes"], want["scores"], want["labels"]):
        match = next(
            (
                j
                for j in sorted(unused)
                if got["labels"][j] == label
                and abs(float(got["scores"][j] - score)) <= SCORE_TOL
                and float((got["bboxes"][j] - box).abs().max()) <= BOX_TOL
            ),
            None,
        )
        if match is None:
            assert float(score) <= boundary, (float(score), label, box)
        else:
            unused.discard(match)


def images_that_differ(got: Predictions, want: Predictions) -> List[int]:
    """The image ids whose detections fail :func:`assert_same_detections`."""
    failed = []
    for img_id in sorted(want):
        try:
            assert_same_detections(got[img_id], want[img_id])
        except AssertionError:
            failed.append(img_id)
    return failed


def _ranked(prediction: dict) -> torch.Tensor:
    return prediction["scores"].sort(descending=True).values


def largest_score_change(got: Predictions, want: Predictions) -> float:
    """Over the images of ``want``, the largest change of a score in rank order."""
    return max(float((_ranked(got[i]) - _ranked(want[i])).abs().max()) for i in want)


def assert_impls_agree(runs: dict, data: str) -> None:
    """``runs`` (from :func:`evaluate_with_each`, ``grid_sample`` the reference): every other
    real implementation gives the same detections on every val image of ``data``, its
    largest score change within ``SCORE_TOL``."""
    want = runs["grid_sample"][1]
    ids = val_ids(data)
    assert sorted(want) == ids
    others = [impl for impl in runs if impl not in ("grid_sample", perturbed.NAME)]
    assert others, "no implementation to compare with grid_sample"
    for impl in others:
        got = runs[impl][1]
        assert sorted(got) == ids, impl
        assert images_that_differ(got, want) == [], impl
        assert largest_score_change(got, want) <= SCORE_TOL, impl


def assert_perturbed_differs(runs: dict) -> None:
    """The negative control in ``runs`` fails the comparison with ``grid_sample`` on some
    image, its largest score change over 50x ``SCORE_TOL``."""
    want, shifted = runs["grid_sample"][1], runs[perturbed.NAME][1]
    assert images_that_differ(shifted, want), "a sampling shift of a tenth of a pixel passed"
    assert largest_score_change(shifted, want) > 50 * SCORE_TOL
