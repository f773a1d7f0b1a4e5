"""Pieces shared by ``tools/train.py`` and ``tools/test.py``."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any, Callable, List, Mapping, NoReturn

from mmengine.config import Config, DictAction
from mmengine.hooks import CheckpointHook

from npudet.hooks.atomic_checkpoint import CheckpointSaveError
from npudet.hooks.non_finite_loss import NonFiniteLossError
from npudet.hooks.run_guard import (
    CheckpointCorruptError,
    NothingTrainedError,
    PeerLostError,
    TrainingFailed,
    TrainingInterrupted,
)

from .cfg_options import apply_cfg_options
from .preflight import PreflightError
from .work_dir_lock import lock_work_dir

# What tools/train.py adds to every run: a checkpoint on SIGINT / SIGTERM, checksums, and a
# stop before a NaN/Inf or diverged loss reaches the weights.
# NPUSetupHook logs "nothing to set up" off an NPU; on one it applies the settings Ascend
# training needs, which no shipped config names.
TRAINING_HOOKS = ["RunGuardHook", "CheckpointChecksumHook", "NonFiniteLossHook", "NPUSetupHook"]


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """``--work-dir --cfg-options --launcher --local-rank --msda-impl --msda-layers``
    (mmdet's spelling)."""
    parser.add_argument("--work-dir", help="the dir to save logs and models")
    parser.add_argument(
        "--cfg-options",
        nargs="+",
        action=DictAction,
        help="override config settings, key=value (e.g. model.msda.impl=cpu)",
    )
    parser.add_argument(
        "--launcher",
        choices=["none", "pytorch", "slurm", "mpi"],
        default="none",
        help="job launcher",
    )
    parser.add_argument("--local_rank", "--local-rank", type=int, default=0)
    parser.add_argument(
        "--msda-impl",
        help="MSDA implementation for every layer: 'auto' or a name from "
        "npudet.ops.msda_impls() (sets model.msda)",
    )
    parser.add_argument(
        "--msda-layers",
        help="the transformer layers' training-grade pieces: 'fast' (all, the default), "
        "'stock' (mmcv's layers as they are) or pieces joined by '+' from ffn, dropout, "
        "projections (sets model.msda.layers)",
    )
    parser.add_argument(
        "--skip-image-check",
        action="store_true",
        help="do not decode every image before the run (huge sets); files are still "
        "checked to exist",
    )


def config_parser(description: str, config_help: str) -> argparse.ArgumentParser:
    """The argument parser of a tool run on a config: ``config`` (``config_help``) and
    :func:`add_common_args`' options; the tool adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("config", help=config_help)
    add_common_args(parser)
    return parser


def fail(message: str) -> NoReturn:
    """Print one error line and exit with status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def load_config(args: argparse.Namespace, default_work_root: str = "./work_dirs") -> Config:
    """Read the config, apply ``--cfg-options`` / ``--msda-impl`` / ``--msda-layers`` /
    ``--work-dir``."""
    if "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
    if not os.path.isfile(args.config):
        fail(f"config file not found: {args.config}")
    # mmengine resolves `mmdet::` bases through pkg_resources, which warns on import.
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        try:
            apply_cfg_options(cfg, args.cfg_options)
        except PreflightError as err:
            fail(str(err))
    if args.msda_impl is not None or args.msda_layers is not None:
        # each flag sets its keys of model.msda and keeps the others (a non-dict value goes)
        msda = cfg.model.get("msda")
        msda = dict(msda) if isinstance(msda, Mapping) else {}
        if args.msda_impl is not None:
            msda.update(impl=args.msda_impl, encoder=None, decoder=None)
        if args.msda_layers is not None:
            msda["layers"] = args.msda_layers
        cfg.model.msda = msda
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get("work_dir") is None:
        name = os.path.splitext(os.path.basename(args.config))[0]
        cfg.work_dir = os.path.join(default_work_root, name)
    return cfg


def run_checks(*checks: Callable[[], None]) -> None:
    """Run preflight checks; the first failure ends the process with one line, and so does
    an interrupt (a native kernel build interrupted by Ctrl-C)."""
    for check in checks:
        try:
            check()
        except PreflightError as err:
            fail(str(err))
        except KeyboardInterrupt as err:
            interrupted(err)


def interrupted(err: KeyboardInterrupt) -> NoReturn:
    """End an interrupted run that saved nothing with one line (its cause, where the
    interrupt names one: a kernel build whose compiler was interrupted) and status 130."""
    why = f": {err}" if str(err) else ""
    print(f"interrupted{why} (no checkpoint saved)", file=sys.stderr)
    sys.exit(130)


def add_run_hooks(cfg: Config, names: List[str]) -> None:
    """Append the named npudet hooks (``RunGuardHook``, ``CheckpointChecksumHook``, ...) to
    ``cfg.custom_hooks`` unless the config has them."""
    hooks = list(cfg.get("custom_hooks") or [])
    for name in names:
        if not any(h.get("type") == name for h in hooks):
            hooks.append(dict(type=name))
    cfg.custom_hooks = hooks


def guard_training(cfg: Config) -> None:
    """Before a training builds its runner: lock the work dir for this run (rank 0), add
    ``TRAINING_HOOKS`` and save checkpoints atomically (``AtomicCheckpointHook`` in place of
    mmengine's ``CheckpointHook``). Raises PreflightError when the work dir is unusable or
    in use."""
    if int(os.environ.get("RANK", "0")) == 0:
        lock_work_dir(os.path.abspath(cfg.work_dir))
    add_run_hooks(cfg, TRAINING_HOOKS)
    checkpoint = (cfg.get("default_hooks") or {}).get("checkpoint")
    if checkpoint is not None and checkpoint.get("type") in ("CheckpointHook", CheckpointHook):
        checkpoint["type"] = "AtomicCheckpointHook"


def run_guarded(step: Callable[[], Any]) -> Any:
    """Run ``runner.train`` / ``runner.test`` (``step``); what npudet's hooks raise ends the
    process with one line and no traceback: an interrupt (already logged with its
    checkpoint by ``RunGuardHook``) with status 128 + the signal number, a run that trained
    nothing, a corrupt checkpoint, a checkpoint that could not be saved, a diverged run, a
    lost peer rank or a run whose data failed (a dataloader worker killed, an image that
    does not decode) with status 2."""
    try:
        return step()
    except TrainingInterrupted as err:
        sys.exit(128 + err.signum)
    except (
        NothingTrainedError,
        CheckpointCorruptError,
        CheckpointSaveError,
        NonFiniteLossError,
        PeerLostError,
        TrainingFailed,
    ) as err:
        fail(str(err))
    except KeyboardInterrupt as err:
        # Before RunGuardHook's handler is installed (building the model, loading data, a
        # kernel build) or a second Ctrl-C: nothing consistent to save.
        interrupted(err)
