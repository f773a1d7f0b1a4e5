"""Count the ops and device-to-host syncs of a training iteration on the simulated NPU, stock
mmdet + mmcv beside npudet, split by where they come from; write JSON and a markdown table.

    .venv/bin/python dev/tools/count_dispatch.py \\
        configs/deformable_detr/deformable-detr-refine-twostage_r50_16xb2-50e_coco.py \\
        --size 320x320 --json results/npu_sim/dispatch_deformable-detr-refine-twostage_r50.json

Each run is a run of dev/tools/bench_iteration.py (the same generated batch, weights and seed,
its own process) with ``NPUDET_SIMULATED_NPU=1``, so the model trains on the ``npu`` device
(ops/npu_sim); the iterations after ``--warmup`` are counted
(npudet_dev.ablation.dispatch_count says what is counted and how it is attributed). Counts,
never times.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from npudet.engine.cli import fail
from npudet_dev.ablation.dispatch_count.run import count_dispatch, write_outputs
from npudet_dev.ablation.iteration_bench import add_run_options, run_options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument(
        "--impls",
        default="stock,auto",
        help="comma-separated: stock and/or npudet MSDA implementations (auto: npudet's "
        "default); IMPL:batched_matching runs IMPL with the Hungarian matchings batched "
        "(model.train_cfg.assigner.type='BatchedHungarianAssigner')",
    )
    add_run_options(parser, iters=2, warmup_help="iterations left uncounted")
    parser.add_argument("--json", required=True, help="output JSON; the .md beside it")
    args = parser.parse_args()
    if not os.path.isfile(args.config):
        fail(f"config: file not found: {args.config}")
    command = " ".join(["python", "dev/tools/count_dispatch.py", *map(shlex.quote, sys.argv[1:])])
    try:
        result = count_dispatch(
            args.config,
            [i.strip() for i in args.impls.split(",") if i.strip()],
            command=command,
            **run_options(args, "count_dispatch"),
        )
    except ValueError as err:
        fail(str(err))
    print(write_outputs(result, args.json), end="")
    print(f"[count_dispatch] wrote {args.json}, {os.path.splitext(args.json)[0]}.md")


if __name__ == "__main__":
    main()
