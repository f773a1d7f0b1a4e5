"""Evaluate a checkpoint (mmdet's tools/test.py, plus npudet's MSDA switch and checks).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--msda-impl grid_sample]
        [--msda-layers fast|stock]
        [--out results.pkl] [--show-dir DIR] [--cfg-options k=v ...] [--launcher pytorch]

The 12 COCO box numbers are printed as a table and written to
``WORK_DIR/coco_bbox_test.json`` (by ``CocoSummaryHook``, added if the config lacks it).
"""

from __future__ import annotations

import argparse
import os

from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import npudet.plugin  # noqa: F401  (registers what the configs name; checkpoint loading)
from npudet.engine.cli import (
    add_run_hooks,
    config_parser,
    fail,
    load_config,
    run_checks,
    run_guarded,
)
from npudet.engine.cpu_dist import end_distributed, setup_cpu_distributed
from npudet.engine.msda_log import msda_summary
from npudet.engine.preflight import (
    check_checkpoint,
    check_data,
    check_msda,
    check_output_file,
    check_work_dir,
)


def parse_args() -> argparse.Namespace:
    parser = config_parser("Evaluate a detector checkpoint", "test config file path")
    parser.add_argument("checkpoint", help="checkpoint file")
    parser.add_argument("--out", help="dump predictions to this pickle file (.pkl)")
    parser.add_argument("--show", action="store_true", help="show predictions in a window")
    parser.add_argument("--show-dir", help="save drawn predictions under WORK_DIR/TIMESTAMP/")
    parser.add_argument("--wait-time", type=float, default=2, help="--show interval (s)")
    return parser.parse_args()


def _enable_visualization(cfg, args: argparse.Namespace) -> None:
    hook = cfg.default_hooks.get("visualization")
    if hook is None:
        fail("--show/--show-dir: the config has no default_hooks.visualization")
    hook["draw"] = True
    if args.show:
        hook["show"] = True
        hook["wait_time"] = args.wait_time
    if args.show_dir:
        hook["test_out_dir"] = args.show_dir


def main() -> None:
    args = parse_args()
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        _enable_visualization(cfg, args)
    if args.out is not None and not args.out.endswith((".pkl", ".pickle")):
        fail(f"--out: expected a .pkl or .pickle file, got {args.out}")
    add_run_hooks(
        cfg, ["EvalProgressHook", "CocoSummaryHook", "CheckpointChecksumHook", "NPUSetupHook"]
    )

    run_checks(
        lambda: check_output_file(args.out, "--out") if args.out else None,
        lambda: check_work_dir(cfg.work_dir),
        lambda: check_msda(cfg),
        lambda: check_data(cfg, ["test"], check_images=not args.skip_image_check),
        lambda: check_checkpoint(cfg, args.checkpoint, "checkpoint", strict=True),
    )

    setup_cpu_distributed(cfg, args.launcher)

    def test() -> None:
        runner = Runner.from_cfg(cfg) if "runner_type" not in cfg else RUNNERS.build(cfg)
        runner.logger.info(msda_summary(runner.model))
        if args.out is not None:
            from mmdet.evaluation import DumpDetResults

            runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=args.out))
        runner.test()

    try:
        run_guarded(test)
    finally:
        end_distributed()
    if args.out is not None:
        print(f"predictions written to {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
