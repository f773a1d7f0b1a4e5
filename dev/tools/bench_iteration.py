"""Train a config for a few iterations at its real input size with stock mmdet + mmcv and
each npudet MSDA implementation, side by side; write JSON, a markdown table and a plot.

    nice -n 5 .venv/bin/python dev/tools/bench_iteration.py \\
        configs/dino/dino-4scale_r50_8xb2-12e_coco.py --impls stock,grid_sample,gather,cpu \\
        --size 1333x800 --iters 3 --warmup 1 --rounds 2 --json results/realsize/dino.json

Every run starts from the same weights, seed and batch, each in its own process (its own
peak memory); ``stock`` is mmdet's own config and classes with mmcv's MSDA, no npudet
layer (npudet_dev.ablation.iteration_bench says how the runs are made comparable). With
``--rounds R`` the runs are interleaved round by round (stock, cpu, stock, cpu, ...); every
run records its load average, CPU and wall time, and a speed-up taken on a loaded machine is
marked ``loaded`` (JSON, table, plot) beside its CPU-time speed-up. One command writes the
JSON, the table (.md) and the plot (_split.png).
"""

from __future__ import annotations

import argparse
import os

from npudet.engine.cli import fail
from npudet_dev.ablation.iteration_bench import (
    add_run_options,
    bench_iteration,
    report_again,
    run_options,
)
from npudet_dev.ablation.iteration_report import header, markdown_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", help="the config (not with --report-only)")
    parser.add_argument(
        "--impls",
        default="stock,grid_sample,gather,cpu",
        help="comma-separated: stock and/or npudet MSDA implementations; IMPL:LAYERS sets "
        "model.msda.layers (e.g. cpu:stock: mmcv's FFNs and layers as they are); IMPL@T runs "
        "IMPL on T threads, a round-off control (e.g. stock@1)",
    )
    add_run_options(parser, iters=4, warmup_help="iterations left out of medians")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="times each run is repeated, interleaved round by round (timings pool the rounds)",
    )
    parser.add_argument("--json", required=True, help="output JSON; .md and .png next to it")
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help="keep the runs stored in --json (same config, size, iterations, seed); run the rest",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: re-judge the runs stored in --json and rewrite it, .md and .png",
    )
    args = parser.parse_args()
    if args.report_only:
        try:
            result = report_again(args.json)
        except ValueError as err:
            fail(str(err))
        print(f"{header(result)}\n\n{markdown_table(result)}", end="")
        return
    if not args.config:
        fail("a config is needed (or --report-only)")
    try:
        result = bench_iteration(
            args.config,
            [i.strip() for i in args.impls.split(",") if i.strip()],
            json_out=args.json,
            keep_runs=args.keep_runs,
            rounds=args.rounds,
            **run_options(args, "bench_iteration"),
        )
    except ValueError as err:
        fail(str(err))
    stem = os.path.splitext(args.json)[0]
    print(f"{header(result)}\n\n{markdown_table(result)}", end="")
    print(f"[bench_iteration] wrote {args.json}, {stem}.md, {stem}_split.png")


if __name__ == "__main__":
    main()
