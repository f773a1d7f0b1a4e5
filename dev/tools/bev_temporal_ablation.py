"""Train a BEV config with and without temporal self-attention and compare the two.

python dev/tools/bev_temporal_ablation.py CONFIG [--work-dir DIR] [--msda-impl cpu]
    [--cfg-options k=v ...]

Trains CONFIG twice with mmengine's Runner, from the same seed, weights and schedule:
``temporal`` as configured (temporal self-attention over the ego-motion-aligned previous
BEV) and ``no_history`` (``model.use_temporal=False`` and ``queue_length=1`` in every
dataset, so no earlier frame is loaded or encoded: temporal self-attention attends to the
current BEV queries alone). Each run is evaluated by the config's ``val_evaluator`` after
its last epoch. The work dir (default ``work_dirs/temporal_ablation/CONFIG``) gets one
folder per run (mmengine's logs and checkpoints), ``temporal_ablation.md`` (mAP, NDS,
mATE, mAVE, the predicted speeds of moving and static objects, median iteration time and
wall time of both runs; also printed) and ``temporal_ablation.json``. The speeds come from
``npudet.bev.evaluation.velocity`` on the validation set after training: mAVE rewards
predicting zero where most objects stand still, the split says whether a run perceives motion.
"""

from __future__ import annotations

import argparse

import npudet.plugin  # noqa: F401  (registers what the configs name; checkpoint loading)
from npudet.engine.cli import config_parser, fail
from npudet_dev.ablation.bev_temporal import temporal_ablation


def parse_args() -> argparse.Namespace:
    parser = config_parser("BEV temporal self-attention ablation", "BEV train config file path")
    args = parser.parse_args()
    if args.launcher != "none":
        fail("--launcher: the ablation runs its two trainings in one process, without a launcher")
    return args


def main() -> None:
    temporal_ablation(parse_args())


if __name__ == "__main__":
    main()
