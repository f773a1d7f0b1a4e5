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
from npudet_dev.ablation.iteration_bench import parse_size
from npudet_dev.ablation.op_profile.run import profile_iteration, write_outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--impl", default="cpu", help="the npudet MSDA implementation")
    parser.add_argument(
        "--size", default=None, help="WxH of the generated images (default: the config's)"
    )
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1, help="iterations left unprofiled")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--json", required=True, help="output JSON; the .md beside it")
    args = parser.parse_args()
    name = os.path.splitext(os.path.basename(args.config))[0]
    try:
        result = profile_iteration(
            args.config,
            args.impl,
            args.iters,
            args.warmup,
            args.work_dir or os.path.join("work_dirs", "profile_iteration", name),
            size=parse_size(args.size) if args.size else None,
            seed=args.seed,
            threads=args.threads,
        )
    except ValueError as err:
        fail(str(err))
    print(write_outputs(result, args.json), end="")
    print(f"[profile_iteration] wrote {args.json}, {os.path.splitext(args.json)[0]}.md")


if __name__ == "__main__":
    main()
