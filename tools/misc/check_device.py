"""Check which MSDA implementations are correct and fast on this machine's device.

    python tools/misc/check_device.py                      # the machine's device (npu, cuda or cpu)
    python tools/misc/check_device.py --device cuda --json results/check_cuda.json --save
    python tools/misc/check_device.py --device cpu --fast  # well under a minute

Reports the environment (packages, device, CPU), the parity of every implementation
available on the device (edge cases, forward and the three gradients, each dtype it
declares; each case passed, failed or declined: a declined case is not run and never counted
as a pass) against ``grid_sample`` on the CPU, the MSDA benchmark side by side
(``npudet.benchmark.harness``, as ``tools/analysis_tools/benchmark_msda.py``), the Triton kernels'
compile figures where the compile tool exists, and a summary table with the recommended
``auto`` order. ``--save`` records which are correct, and their times, for ``auto``, each
keyed by the sources, package versions and driver of the process that checked it
(``npudet.ops.msda.verification.records``). The check itself is
``npudet.benchmark.device_check``; parity is the engine's (``verification.parity``).

On an accelerator each implementation's parity check, and the benchmark, run in a child
process of their own (``--isolate``, the default there), so a kernel that crashes the
process or poisons the device context is reported as failed with its error and the check
goes on. Budget: a few minutes on one GPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional

from npudet.benchmark import device_check
from npudet.benchmark.cases import parse_case
from npudet.ops.environment import environment_problem
from npudet.ops.msda.registry import registered_impls
from npudet.ops.msda.verification import records
from npudet.utils.device import current_device_type
from npudet.utils.environment import device_problem
from npudet.utils.output_path import output_path_error


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    """The options, checked: the device is usable, the plan's defaults filled in."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda or npu (default: this machine's)")
    parser.add_argument("--json", type=Path, default=None, help="write the full report here")
    parser.add_argument("--save", action="store_true", help="record the results for impl='auto'")
    parser.add_argument(
        "--fast", action="store_true", help="one small benchmark case, 1 round, no compile figures"
    )
    parser.add_argument("--impls", default=None, help="comma list (default: all for the device)")
    parser.add_argument("--cases", default=None, help="benchmark cases (comma list)")
    parser.add_argument("--repeat", type=int, default=None, help="timed benchmark rounds")
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a child process per implementation (default: on for cuda/npu, off for cpu)",
    )
    parser.add_argument(
        "--no-compile", action="store_true", help="skip the Triton kernels' compile figures"
    )
    parser.add_argument("--child", choices=("parity", "bench"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Before the device is probed: NPUDET_SIMULATED_NPU decides which one there is, and a bad
    # NPUDET_TRITON_SCHEDULE would be reported as a failed Triton parity check. No usage line:
    # the command line is not at fault.
    problem = environment_problem()
    if problem:
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    args.device = (args.device or current_device_type()).lower()
    problem = device_problem(args.device)
    if problem:
        parser.error(f"--device {args.device}: device unavailable: {problem}")
    if args.isolate is None:
        args.isolate = args.device != "cpu"
    default = device_check.FAST_CASES if args.fast else device_check.FULL_CASES
    args.cases = args.cases.split(",") if args.cases else default
    for spec in args.cases:
        try:
            parse_case(spec)
        except ValueError as err:
            parser.error(str(err))
    if args.repeat is None:
        args.repeat = 1 if args.fast else 10
    if args.repeat < 1:
        parser.error("--repeat: expected a positive integer")
    args.impls = args.impls.split(",") if args.impls else None
    unknown = [name for name in args.impls or [] if name not in registered_impls()]
    if unknown:
        parser.error(
            f"--impls: unknown MSDA implementation {unknown[0]!r}; known: {registered_impls()}"
        )
    if not args.child:  # the files written at the end: checked before the minutes of work
        outputs = {"--json": args.json, "--save": records.records_path() if args.save else None}
        for key, path in outputs.items():
            problem = output_path_error(path, key) if path is not None else None
            if problem:
                parser.error(problem)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.device == "npu":
        import torch_npu  # noqa: F401  (registers the npu device with torch)
    return device_check.run(Path(__file__).resolve(), args)


if __name__ == "__main__":
    raise SystemExit(main())
