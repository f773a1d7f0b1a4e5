"""Time MSDA implementations side by side on the shapes of real models.

    python tools/analysis_tools/benchmark_msda.py --threads 2 --json results/msda_cpu.json
    python tools/analysis_tools/benchmark_msda.py --cases ddetr-enc --threads 2 --runs 3
        --json r.json
    python tools/analysis_tools/benchmark_msda.py --host --threads 1 --runs 3
    python tools/analysis_tools/benchmark_msda.py --host-ratio --threads 1 --repeat 400
        --json r.json
    python tools/analysis_tools/benchmark_msda.py --cases ddetr-enc --impls grid_sample,cpu
        --limit  # checkout

The command line of ``npudet.benchmark.harness`` (what is timed and how: its
docstring). ``--runs N`` runs the whole benchmark N times in separate processes and
reports, per cell, the median of the runs and their spread (min-max): ratios are taken
within each run, where both sides met the same machine state, then summarised. Every case
records its load average, CPU and wall time; a loaded one is marked ``loaded`` beside its
CPU-time ratios (npudet.benchmark.conditions has the rule). ``--limit`` (a checkout's, with
the project's ``npudet_dev``) times the CPU kernel's gather-only probe beside them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

import torch

from npudet.benchmark import harness, host_cost
from npudet.benchmark.cases import parse_case
from npudet.benchmark.conditions import RULE
from npudet.benchmark.provenance import git_commit
from npudet.ops.msda import msda_impls, msda_variants


def run_separately(argv: List[str], runs: int) -> List[dict]:
    """Runs this tool ``runs`` times in separate processes with ``argv`` (no --runs/--json);
    each run's JSON payload, in order."""
    payloads = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            out = Path(tmp) / f"run{i}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--json", str(out)]
            print(f"[benchmark] run {i + 1}/{runs}", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            payloads.append(json.loads(out.read_text()))
    return payloads


def _strip_runs_and_json(argv: List[str]) -> List[str]:
    """argv without --runs and --json (and their values)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--runs", "--json"):
            skip = True
            continue
        if arg.startswith(("--runs=", "--json=")):
            continue
        kept.append(arg)
    return kept


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default=",".join(harness.DEFAULT_CASES),
        help="comma list of case[:pattern], pattern realistic|uniform",
    )
    parser.add_argument(
        "--impls",
        default=None,
        help="comma list of names from msda_impls() or msda_variants() (default: every "
        "implementation and experiment variant usable here that takes the inputs)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per case")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--host",
        action="store_true",
        help="time the host's cost per call on a 1-query problem (host_cost) instead of the "
        "cases; --repeat rounds of 1000 calls",
    )
    parser.add_argument(
        "--host-ratio",
        action="store_true",
        help="time only auto's forward+backward on the 1-query problem against one ATen "
        "grid_sample with autograd, alternating in --repeat short rounds (use hundreds); "
        "median and spread of each and of the per-round ratio",
    )
    parser.add_argument(
        "--limit",
        action="store_true",
        help="on the CPU, also time the gather-only probe (the row-load limit: limit ms, "
        "fwd / limit, bwd / limit); the project's npudet_dev (dev/, tools/setup.sh installs it)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="separate processes to run the benchmark in; > 1 reports the median and the "
        "spread (min-max) of the runs per cell",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: expected a positive integer")
    if args.host_ratio and args.runs > 1:
        parser.error("--runs: not with --host-ratio (its spread is over --repeat rounds)")
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads: expected a positive integer")
        torch.set_num_threads(args.threads)
    if args.repeat < 1:
        parser.error("--repeat: expected a positive integer")
    available = msda_impls() + msda_variants()
    impls = args.impls.split(",") if args.impls else available
    unknown = [name for name in impls if name not in available]
    if unknown:
        parser.error(f"--impls: {unknown} not usable here; expected names from {available}")
    if harness.BASELINE in available and harness.BASELINE not in impls:
        impls = [harness.BASELINE, *impls]
    specs = [s for s in args.cases.split(",") if s]
    try:
        for spec in specs:
            parse_case(spec)
    except ValueError as exc:
        parser.error(str(exc))
    probe, limit = None, ""
    if args.limit:
        try:
            from npudet_dev.kernels import cpu_probe
        except ImportError:
            parser.error(
                "--limit: needs npudet_dev (a checkout's dev/; tools/setup.sh installs it)"
            )
        probe, limit = cpu_probe.make_probe, cpu_probe.DESCRIPTION
    # Taken before anything is written: a result file that is tracked would mark it dirty.
    commit = git_commit()
    if args.runs > 1:
        argv = sys.argv[1:] if argv is None else argv
        payloads = run_separately(_strip_runs_and_json(argv), args.runs)
        summary = harness.summarize([p["results"] for p in payloads])
        info = payloads[0]["machine"]
        print(
            harness.header(
                info, args, f"median (min-max) of {args.runs} separate runs, each the ", limit
            )
        )
        print(harness.markdown(summary, args.host))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            payload = {
                "commit": commit,
                "machine": info,
                "loaded_rule": RULE,
                "runs": payloads,
                "summary": summary,
            }
            args.json.write_text(json.dumps(payload, indent=2))
        return 0
    info, rows = harness.run(args, impls, specs, probe)
    print(harness.header(info, args, "", limit))
    print(
        host_cost.ratio_markdown(rows[0]) if args.host_ratio else harness.markdown(rows, args.host)
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "commit": commit,
            "torch": info["torch"],
            "threads": info["threads"],
            "machine": info,
            "repeat": args.repeat,
            "loaded_rule": RULE,
            "results": rows,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
