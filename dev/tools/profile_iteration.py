"""Profile training iterations of a config by op and split them into the MSDA layers' own
work and the rest, forward and backward; write JSON and a markdown table.

    nice -n 5 .venv/bin/python dev/tools/profile_iteration.py \\
        configs/deformable_detr/deformable-detr-refine-twostage_r50_16xb2-50e_coco.py \\
        --impl cpu --size 1333x800 --iters 2 --warmup 1 --threads 2 --json OUT.json

The run is one run of dev/tools/bench_iteration.py (the same generated batch, weights and seed,
its own process, its load recorded) with the iterations after ``--warmup`` profiled
(npudet_dev.ablation.op_profile says how they are split). A loaded run is marked.
"""

from __future__ import annotations

import argparse
import os

from npudet.engine.cli import fail
from npudet_dev.ablation.iteration_bench import add_run_options, run_options
from npudet_dev.ablation.op_profile.run import profile_iteration, write_outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--impl", default="cpu", help="the npudet MSDA implementation")
    add_run_options(parser, iters=2, warmup_help="iterations left unprofiled")
    parser.add_argument("--json", required=True, help="output JSON; the .md beside it")
    args = parser.parse_args()
    try:
        result = profile_iteration(args.config, args.impl, **run_options(args, "profile_iteration"))
    except ValueError as err:
        fail(str(err))
    print(write_outputs(result, args.json), end="")
    print(f"[profile_iteration] wrote {args.json}, {os.path.splitext(args.json)[0]}.md")


if __name__ == "__main__":
    main()
