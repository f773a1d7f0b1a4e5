"""Train a BEV config with and without temporal self-attention and compare the two
(``dev/tools/bev_temporal_ablation.py``'s command; its docstring describes the runs and outputs).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from typing import Dict, List

import numpy as np
import torch
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from npudet.bev.evaluation.velocity import velocity_by_motion
from npudet.engine.cli import fail, load_config, run_checks
from npudet.engine.preflight import check_data, check_msda, dataset_cfgs
from npudet.hooks import launch_env_setup

RUNS = ("temporal", "no_history")
LOADERS = ("train_dataloader", "val_dataloader", "test_dataloader")
SUMMARY = ("mAP", "NDS", "mATE", "mAVE")


def queue_lengths(cfg: Config) -> Dict[str, List[int]]:
    """``queue_length`` of every dataset under each dataloader, by loader key."""
    return {
        key: [int(d.get("queue_length", 1)) for d in dataset_cfgs(cfg.get(key, {}).get("dataset"))]
        for key in LOADERS
        if cfg.get(key)
    }


def variant_cfg(cfg: Config, run: str, work_dir: str) -> Config:
    """The config of one run: its own work dir, logger and visualizer names; history off
    for ``no_history``."""
    out = copy.deepcopy(cfg)
    out.work_dir = os.path.join(work_dir, run)
    # mmengine keeps loggers, message hubs and visualizers by name: one set per run
    out.experiment_name = run
    if out.get("visualizer"):
        out.visualizer.name = f"{out.visualizer.get('name', 'visualizer')}_{run}"
    if run == "no_history":
        out.model.use_temporal = False
        for key in LOADERS:
            if out.get(key):
                for dataset in dataset_cfgs(out[key].dataset):
                    dataset.queue_length = 1
    return out


def train_and_evaluate(cfg: Config) -> Dict[str, float]:
    """Train with mmengine's Runner (which validates after the last epoch); returns the
    final validation metrics (prefix dropped), iterations, the median seconds per
    training iteration and the wall time of training plus validation."""
    runner = Runner.from_cfg(cfg) if "runner_type" not in cfg else RUNNERS.build(cfg)
    start = time.perf_counter()
    runner.train()
    wall = time.perf_counter() - start
    hub = runner.message_hub
    metrics = {
        key.rsplit("/", 1)[-1]: float(buf.current())
        for key, buf in hub.log_scalars.items()
        if key.startswith("val/") and key.rsplit("/", 1)[-1] in SUMMARY
    }
    missing = [k for k in SUMMARY if k not in metrics]
    if missing:
        fail(f"val_evaluator: reported no {', '.join(missing)} (a BEV metric such as BEVDetMetric)")
    # the median: one slow iteration (a busy machine) does not move it
    iter_times = hub.get_scalar("train/time").data[0]
    speeds = velocity_by_motion(predicted_frames(runner))
    return {
        **metrics,
        **speeds,
        "iters": runner.iter,
        "sec_per_iter": float(np.median(iter_times)),
        "wall_s": wall,
    }


def predicted_frames(runner: Runner):
    """(pred boxes, scores, labels, true boxes, labels) of every validation frame, ego frame."""
    runner.model.eval()
    with torch.no_grad():
        for batch in runner.val_dataloader:
            for sample in runner.model.val_step(batch):
                pred, ann = sample.pred_instances_3d, sample.eval_ann_info
                yield (
                    pred.bboxes_3d.cpu().numpy(),
                    pred.scores_3d.cpu().numpy(),
                    pred.labels_3d.cpu().numpy(),
                    ann["gt_boxes"],
                    ann["gt_labels"],
                )


def markdown(config_name: str, records: Dict[str, Dict]) -> str:
    """The comparison table with a difference row (temporal minus no history)."""
    head = (
        "| run | history | mAP | NDS | mATE (m) | mAVE (m/s) | moving: true / predicted speed, "
        "along truth (m/s) | static: predicted speed (m/s) | iterations | s / iter (median) "
        "| train + val (min) |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for run, rec in records.items():
        rows.append(
            f"| {run} | {rec['history']} | {rec['mAP']:.4f} | {rec['NDS']:.4f} | "
            f"{rec['mATE']:.3f} | {rec['mAVE']:.3f} | {rec['moving_true_speed']:.2f} / "
            f"{rec['moving_pred_speed']:.2f}, {rec['moving_pred_along']:.2f} "
            f"(n={rec['moving_n']}) | {rec['static_pred_speed']:.2f} (n={rec['static_n']}) | "
            f"{rec['iters']} | {rec['sec_per_iter']:.3f} | {rec['wall_s'] / 60:.1f} |"
        )
    a, b = records["temporal"], records["no_history"]
    rows.append(
        f"| temporal - no_history | | {a['mAP'] - b['mAP']:+.4f} | {a['NDS'] - b['NDS']:+.4f} | "
        f"{a['mATE'] - b['mATE']:+.3f} | {a['mAVE'] - b['mAVE']:+.3f} | | | | "
        f"{a['sec_per_iter'] - b['sec_per_iter']:+.3f} | |"
    )
    title = (
        f"{config_name}: validation after the last epoch, same seed and schedule; speeds of "
        "the objects matched within 2 m (npudet.bev.evaluation.velocity)\n\n"
    )
    return title + head + "\n".join(rows) + "\n"


def temporal_ablation(args: argparse.Namespace) -> None:
    """Run the two trainings that ``dev/tools/bev_temporal_ablation.py``'s arguments describe."""
    name = os.path.splitext(os.path.basename(args.config))[0]
    cfg = load_config(args, default_work_root=os.path.join("work_dirs", "temporal_ablation"))
    work_dir = cfg.work_dir
    if "use_temporal" not in cfg.model:
        fail(f"{args.config}: model has no use_temporal switch (a BEVFormer config)")
    lengths = queue_lengths(cfg)
    short = {k: v for k, v in lengths.items() if min(v, default=2) < 2}
    if not lengths.get("train_dataloader") or short:
        fail(
            f"{args.config}: queue_length must be >= 2 in every dataset for the temporal run, "
            f"got {lengths}"
        )
    cfg.model.use_temporal = True
    run_checks(lambda: check_msda(cfg), lambda: check_data(cfg, ["train", "val"]))
    for action in launch_env_setup():
        print(f"[npudet] set {action.target}={action.value} ({action.reason})")

    records: Dict[str, Dict] = {}
    for run in RUNS:
        print(f"[temporal-ablation] training {run}", flush=True)
        run_cfg = variant_cfg(cfg, run, work_dir)
        record = train_and_evaluate(run_cfg)
        queue = queue_lengths(run_cfg)["train_dataloader"][0]
        record["history"] = f"{queue - 1} frame(s)" if run_cfg.model.use_temporal else "none"
        records[run] = record
    table = markdown(name, records)
    os.makedirs(work_dir, exist_ok=True)
    with open(os.path.join(work_dir, "temporal_ablation.md"), "w") as f:
        f.write(table)
    with open(os.path.join(work_dir, "temporal_ablation.json"), "w") as f:
        json.dump(dict(config=args.config, runs=records), f, indent=1)
    print(table, end="")
    print(f"[temporal-ablation] wrote temporal_ablation.md and .json to {work_dir}")
