"""Per-image inference latency of the exported detector, route by route, in one run.

    nice -n 5 python dev/tools/bench_deploy.py --models small,r50 --runs 5 \\
        --json results/deploy/speed.json

Routes: PyTorch eager (grid_sample, cpu), ONNX Runtime (GridSample graph, fused npudet node),
the AOTInductor package; models: the small Deformable DETR at 256x256 and the R50 config at
800x1333 (random weights), or CONFIG@HxW. Writes the JSON and a markdown table next to it
(.md). The logic is ``npudet_dev.deploy.bench``; see docs/deploy.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import npudet.plugin  # noqa: F401  (registers what the configs name)
from npudet.engine.cli import fail
from npudet_dev.deploy.bench import ROUTES, bench_deploy, parse_models, parse_routes
from npudet_dev.deploy.bench_report import markdown, read_result, write_outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="small,r50", help="small, r50 or CONFIG@HxW, comma-separated"
    )
    parser.add_argument("--routes", default=",".join(ROUTES), help="comma-separated routes")
    parser.add_argument("--runs", type=int, default=5, help="timed runs (the median is reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--threads", type=int, default=1, help="torch and ORT intra-op threads")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' and image's seed")
    parser.add_argument(
        "--export-timeout", type=float, default=3600.0, help="seconds one export may take"
    )
    parser.add_argument(
        "--work-dir", type=Path, default=Path("work_dirs/bench_deploy"),
        help="exported files (reused while weights, route and size are the same)",
    )  # fmt: skip
    parser.add_argument("--json", required=True, help="output JSON; .md next to it")
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: rewrite .md from --json"
    )
    args = parser.parse_args()
    if args.report_only:
        try:
            result = read_result(args.json)
        except ValueError as err:
            fail(str(err))
        write_outputs(result, args.json)
        print(markdown(result), end="")
        return
    for name in ("runs", "threads"):
        if getattr(args, name) < 1:
            fail(f"argument --{name}: expected >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        fail(f"argument --warmup: expected >= 0, got {args.warmup}")
    try:
        specs, routes = parse_models(args.models), parse_routes(args.routes)
    except ValueError as err:
        fail(str(err))
    result = bench_deploy(
        specs, routes, args.work_dir, args.threads, args.warmup, args.runs, args.seed,
        args.export_timeout, on_model=lambda r: write_outputs(r, args.json),
    )  # fmt: skip
    print(markdown(result), end="")


if __name__ == "__main__":
    main()
