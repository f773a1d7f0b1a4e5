"""Train a detector (mmdet's tools/train.py, plus npudet's MSDA switch and input checks).

python tools/train.py CONFIG [--work-dir DIR] [--msda-impl cpu] [--resume [CKPT]]
    [--amp [--amp-dtype bfloat16|float16]] [--compile [BACKEND]] [--auto-scale-lr]
    [--skip-image-check] [--cfg-options k=v ...]
    [--launcher pytorch]

A worker that torchrun restarted (``tools/dist_train.sh`` with ``MAX_RESTARTS=N``) resumes
from the work dir's last checkpoint by itself.
"""

from __future__ import annotations

import argparse
import os

from mmengine.device import get_device
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import npudet.plugin  # noqa: F401  (registers what the configs name; checkpoint loading)
from npudet.engine.amp import amp_optim_wrapper
from npudet.engine.cli import (
    config_parser,
    fail,
    guard_training,
    load_config,
    run_checks,
    run_guarded,
)
from npudet.engine.cpu_dist import end_distributed, setup_cpu_distributed
from npudet.engine.msda_log import msda_summary
from npudet.engine.preflight import (
    PreflightError,
    check_checkpoint,
    check_data,
    check_msda,
    check_msda_deterministic,
    check_train_length,
)
from npudet.engine.resume import plan_elastic_restart, plan_resume, resume_config_warning
from npudet.hooks import compile_with_hook, launch_env_setup, train_keeping_progress


def parse_args() -> argparse.Namespace:
    parser = config_parser("Train a detector", "train config file path")
    parser.add_argument(
        "--amp",
        action="store_true",
        help="automatic mixed precision: bfloat16 autocast on CPU (npudet's "
        "CPUAmpOptimWrapper), mmengine's AmpOptimWrapper on CUDA / NPU",
    )
    parser.add_argument(
        "--amp-dtype",
        choices=["bfloat16", "float16"],
        help="autocast dtype for --amp (default: bfloat16 on CPU, float16 on CUDA / NPU)",
    )
    parser.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        metavar="BACKEND",
        help="train with the model's forward under torch.compile (default backend: inductor; "
        "npudet's TorchCompileHook, which also takes the config's `compile` setting)",
    )
    parser.add_argument("--auto-scale-lr", action="store_true", help="scale LR by batch size")
    parser.add_argument(
        "--resume",
        nargs="?",
        type=str,
        const="auto",
        help="resume from this checkpoint, or (no value) from the one the work dir's "
        "last_checkpoint names, else its newest epoch_N.pth / iter_N.pth",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    cfg = load_config(args)
    if args.amp_dtype is not None and not args.amp:
        fail("--amp-dtype: only with --amp")
    if args.amp:
        try:
            cfg.optim_wrapper = amp_optim_wrapper(cfg.optim_wrapper, get_device(), args.amp_dtype)
        except ValueError as err:
            fail(f"--amp: {err}")
    try:
        compile_with_hook(cfg, args.compile)
    except ValueError as err:
        fail(str(err))
    if args.auto_scale_lr:
        if "base_batch_size" not in cfg.get("auto_scale_lr", {}):
            fail("--auto-scale-lr: the config has no auto_scale_lr.base_batch_size")
        cfg.auto_scale_lr.enable = True
    if args.resume == "auto":
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume

    try:
        # plan_resume after the restart's plan: --resume alone with no checkpoint yet
        resume_notes = [plan_elastic_restart(cfg, os.environ), plan_resume(cfg)]
    except PreflightError as err:
        fail(str(err))
    checks = [
        lambda: check_msda(cfg),
        lambda: check_msda_deterministic(cfg),
        lambda: check_train_length(cfg),
        lambda: check_data(cfg, ["train", "val"], check_images=not args.skip_image_check),
    ]
    if cfg.load_from:
        key = "--resume" if cfg.get("resume") else "load_from"
        strict = bool(cfg.get("resume"))
        checks.append(lambda: check_checkpoint(cfg, cfg.load_from, key, strict=strict))
    run_checks(*checks)
    resume_notes = [note for note in resume_notes if note]
    for note in resume_notes:
        print(f"[npudet] {note}")
    run_checks(lambda: guard_training(cfg))

    for action in launch_env_setup():
        print(f"[npudet] set {action.target}={action.value} ({action.reason})")
    setup_cpu_distributed(cfg, args.launcher)

    def train() -> None:
        runner = Runner.from_cfg(cfg) if "runner_type" not in cfg else RUNNERS.build(cfg)
        runner.logger.info(msda_summary(runner.model))
        for note in resume_notes:
            runner.logger.info(note)
        if cfg.get("resume") and cfg.load_from:
            warning = resume_config_warning(cfg.load_from, runner.cfg)
            if warning:
                runner.logger.warning(warning)
        train_keeping_progress(runner)

    try:
        run_guarded(train)
    finally:
        end_distributed()


if __name__ == "__main__":
    main()
