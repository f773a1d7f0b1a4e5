"""Store a BEV training run (metrics.json + summary.md) from its tools/train.py work dir.

python dev/tools/bev_run_record.py WORK_DIR --out results/bev/NAME [--commit SHA]
    [--command "..."]... [--note TEXT]

Reads the latest run in WORK_DIR (``npudet_dev.bev_run_record``): the last validation's metrics,
per-class AP and errors, median iteration time and training wall time; names the commit
(default: the checkout's HEAD; pass the one the run trained at) and this machine's CPU.
"""

from __future__ import annotations

import argparse
import os

from npudet.benchmark.harness import machine_info
from npudet.benchmark.provenance import git_commit
from npudet_dev.bev_run_record import markdown, store_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", help="the tools/train.py --work-dir of the run")
    parser.add_argument("--out", required=True, help="folder for metrics.json and summary.md")
    parser.add_argument("--name", default=None, help="title (default: the out folder's name)")
    parser.add_argument("--commit", default=None, help="commit the run trained at (default HEAD)")
    parser.add_argument("--command", action="append", default=[], help="a command of the run")
    parser.add_argument("--note", default=None, help="anything else to say (e.g. machine load)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads the run trained on (default: this process's, i.e. the same settings)",
    )
    args = parser.parse_args()
    info = machine_info()
    threads = args.threads or info["threads"]
    cpu = f"{info['cpu_model']}, {os.cpu_count()} cores, {threads} torch threads"
    record = store_run(
        args.work_dir,
        args.out,
        args.name or os.path.basename(os.path.normpath(args.out)),
        args.commit or git_commit(),
        cpu,
        args.command,
        args.note,
    )
    print(markdown(record))


if __name__ == "__main__":
    main()
