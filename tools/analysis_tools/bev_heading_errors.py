"""Per-class heading errors of a BEV detector's predictions: flipped, turned or unlearned.

python tools/test.py CONFIG CHECKPOINT --out preds.pkl
python tools/analysis_tools/bev_heading_errors.py preds.pkl [--classes car truck pedestrian]
    [--json OUT]

Reads the predictions and ground truth that ``tools/test.py --out`` dumps, pairs each true
box with the nearest prediction of its class (``npudet.bev.evaluation.heading``) and prints
the distribution of the signed heading error per class as a markdown table.
"""

from __future__ import annotations

import argparse
import os
import pickle

from npudet.bev.evaluation.heading import heading_errors, markdown
from npudet.bev.infos.synthetic import CLASSES
from npudet.engine.cli import fail
from npudet.utils.json_io import write_json_atomic


def _frames(samples: list):
    """(pred boxes, scores, labels, true boxes, labels) of every dumped sample."""
    for i, s in enumerate(samples):
        pred, ann = s.get("pred_instances_3d"), s.get("eval_ann_info")
        if pred is None or ann is None:
            fail(
                f"preds: sample {i} lacks pred_instances_3d or eval_ann_info (tools/test.py --out)"
            )
        yield (
            pred["bboxes_3d"].numpy(),
            pred["scores_3d"].numpy(),
            pred["labels_3d"].numpy(),
            ann["gt_boxes"],
            ann["gt_labels"],
        )


def _load_preds(path: str) -> list:
    """The samples ``tools/test.py --out`` pickled to ``path``; one error line if it cannot."""
    made_by = "write it with tools/test.py CONFIG CHECKPOINT --out preds.pkl"
    if not os.path.isfile(path):
        fail(f"preds {path}: no such file; {made_by}")
    try:
        with open(path, "rb") as f:
            samples = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        fail(f"preds {path}: not a pickle of predictions ({exc}); {made_by}")
    if not isinstance(samples, list):
        fail(f"preds {path}: holds a {type(samples).__name__}, not a list of samples; {made_by}")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preds", help="the pickle tools/test.py --out wrote")
    parser.add_argument("--classes", nargs="+", default=list(CLASSES), help="label names")
    parser.add_argument("--max-dist", type=float, default=2.0, help="match radius (m)")
    parser.add_argument("--min-score", type=float, default=0.3, help="lowest score kept")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    samples = _load_preds(args.preds)
    errors = heading_errors(_frames(samples), args.classes, args.max_dist, args.min_score)
    print(markdown(errors))
    if args.json:
        write_json_atomic(args.json, dict(preds=args.preds, classes=args.classes, errors=errors))


if __name__ == "__main__":
    main()
