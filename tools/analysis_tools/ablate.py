"""Train one config with several MSDA implementations side by side and compare them.

python tools/analysis_tools/ablate.py CONFIG --impls grid_sample,gather,cpu[,ENC/DEC][,NAME:LAYERS]
    --iters N
    [--work-dir DIR] [--threads 2] [--rounds 1] [--warmup 2] [--seed 0]
    [--compile [BACKEND]] [--cfg-options k=v ...]

Every variant trains from the same seed and the same initial weights (built once,
saved as ``init_weights.pth``) for N iterations, each in its own process, with
validation and checkpoints off and MSDA profiled per iteration. ``ENC/DEC`` picks the
encoder's and the decoder's implementation separately; ``:LAYERS`` after an item sets
``model.msda.layers`` for it (``cpu:stock,cpu:ffn,cpu:dropout,cpu:projections,cpu:fast``
prices each training-grade piece of the transformer layers). Every variant is checked to run on
the device before any training. With ``--rounds R`` the variants run R times, interleaved
round by round (A B A B), and the times pool all rounds. Each run records its load average,
CPU and wall time; a speed-up taken on a loaded machine is marked ``loaded`` beside its
CPU-time speed-up (docs/performance.md, "How to read the figures"). With ``--compile``
every variant also trains with its forward under ``torch.compile`` (npudet's
``TorchCompileHook``), right after its eager run, and the table gains the compiled
iteration time, its speed-up over eager, its loss deviation from eager and its graph
breaks (warm-up iterations, which compile, are left out). The work dir gets
``ablation.md``, ``ablation.csv``, ``ablation.json`` (the records the rest is drawn from),
``loss_curves.png``, ``iter_time_split.png`` and one folder per run; the markdown table is
also printed.
"""

from __future__ import annotations

import argparse

from mmengine.config import DictAction

import npudet.plugin  # noqa: F401  (registers what the configs name; checkpoint loading)
from npudet.ablation.ablate import ablate
from npudet.engine.cli import fail


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="MSDA implementation ablation")
    parser.add_argument("config", help="train config file path")
    parser.add_argument(
        "--impls",
        default=None,
        help="comma-separated variants, the first is the baseline; NAME for every layer or "
        "ENCODER/DECODER, NAME from msda_impls() or an experiment variant from "
        "msda_variants(), each optionally followed by :LAYERS (model.msda.layers: fast, "
        "stock or pieces such as ffn+dropout) (default: grid_sample,gather and the device's "
        "own: cpu on the CPU, mmcv,triton on CUDA)",
    )
    parser.add_argument("--iters", type=int, default=20, help="training iterations per run")
    parser.add_argument("--work-dir", help="output dir (default: work_dirs/ablate/CONFIG)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per run")
    parser.add_argument("--rounds", type=int, default=1, help="times each variant is run")
    parser.add_argument(
        "--warmup", type=int, default=2, help="first iterations left out of the timings"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and data order")
    parser.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        metavar="BACKEND",
        help="also run every variant with its forward under torch.compile (default backend: "
        "inductor) and add compiled columns",
    )
    parser.add_argument(
        "--cfg-options", nargs="+", action=DictAction, help="override config settings, k=v"
    )
    args = parser.parse_args()
    for name in ("iters", "threads", "rounds"):
        if getattr(args, name) < 1:
            fail(f"--{name}: expected a positive integer, got {getattr(args, name)}")
    if args.warmup < 0:
        fail(f"--warmup: expected a non-negative integer, got {args.warmup}")
    return args


def main() -> None:
    ablate(parse_args())


if __name__ == "__main__":
    main()
