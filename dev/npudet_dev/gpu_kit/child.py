"""One part of the GPU kit, in a process of its own: ``python -m npudet_dev.gpu_kit.child PART``.

A part that crashes, hangs or poisons the device context costs only itself: the kit reads
the JSON a part writes (a benchmark part rewrites it after every case, so a part stopped at
its time limit still leaves what it measured).

    build    mmcv's MSDA CUDA library from the bundle (``mmcv_cuda_lib.build``)
    bench    ``npudet.benchmark.harness.run_case`` for cases x implementations in one dtype
    train    Deformable-DETR-sized training iterations with one implementation
    compile  one encoder layer, eager and under ``torch.compile``, with one implementation
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import types
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from npudet.benchmark import harness
from npudet.benchmark.cases import CASES, MSDACase, make_inputs, parse_case
from npudet.ops.msda.backends import mmcv_cuda_lib

from . import ddetr

FORWARD_CALLS = 5  # forward calls profiled for the forward's device time


def clean(value):
    """``value`` with NaN and infinities as None: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(clean(payload), indent=2))


def forward_device_ms(spec: str, impl: str, dtype: torch.dtype, device: str) -> float:
    """GPU time of one forward call (profiler, ``FORWARD_CALLS`` calls, after a warm-up):
    the benchmark's ``kernel_ms`` applied to the forward alone; NaN off CUDA (``kernel_ms``
    says so after the warm-up, so a dry run goes through the same steps)."""
    case, pattern = parse_case(spec)
    inputs = make_inputs(case, pattern, dtype=dtype, device=device)
    grad = torch.zeros(())  # unused: only the forward runs
    runner = harness.Runner(impl, inputs, grad)
    runner.forward()
    forward_only = types.SimpleNamespace(grads=runner.forward)
    return harness.kernel_ms(forward_only, device, FORWARD_CALLS)


# The dry run's benchmark case: a few hundred samples, so that the CPU spends its seconds
# on the kit's own code, not on arithmetic. Registered in the bench child only.
DRY_CASE = MSDACase("kit-dry", 1, ((8, 12), (4, 6)), 50, 2, 8, 2, False)


def repeat_for(spec: str, repeat: int) -> int:
    """Timed rounds: ``repeat`` for the model cases, half as many (>= 1) for the
    training-size ones, whose calls are tens of times longer."""
    return repeat if parse_case(spec)[0].name in CASES else max(1, repeat // 2)


def bench(args: argparse.Namespace) -> int:
    """``run_case`` per case with inputs in ``--dtype``; rows gain dtype and the forward's
    and backward's device times. Writes the JSON after every case."""
    CASES.setdefault(DRY_CASE.name, DRY_CASE)  # parse_case reads this dict at call time
    dtype = getattr(torch, args.dtype)
    rows: List[dict] = []
    errors: Dict[str, str] = {}
    for spec in args.cases.split(","):
        try:
            case_rows = harness.run_case(
                spec, args.impls.split(","), repeat_for(spec, args.repeat), args.device, dtype
            )
            for row in case_rows:
                row["dtype"] = args.dtype
                row["fwd_device_ms"] = forward_device_ms(spec, row["impl"], dtype, args.device)
                row["bwd_device_ms"] = row.get("kernel_ms", float("nan")) - row["fwd_device_ms"]
            rows.extend(case_rows)
        except Exception as exc:  # one case's failure must not lose the others
            errors[spec] = f"{type(exc).__name__}: {exc}"[:500]
        if args.device == "cuda":
            torch.cuda.empty_cache()
        write_json(args.json, {"dtype": args.dtype, "rows": rows, "errors": errors})
        print(f"[gpu_kit] bench {args.dtype} {spec} done", file=sys.stderr, flush=True)
    return 0


def _shape(dry_run: bool) -> ddetr.DDETRShape:
    return ddetr.DRY_SHAPE if dry_run else ddetr.DDETRShape()


def train(args: argparse.Namespace) -> int:
    warmup, iters = (1, 1) if args.dry_run else (3, 10)
    try:
        result = ddetr.time_training(args.impl, args.device, _shape(args.dry_run), warmup, iters)
    except Exception as exc:  # out of memory, a kernel error: the report says which
        write_json(args.json, {"impl": args.impl, "error": f"{type(exc).__name__}: {exc}"[:500]})
        raise
    write_json(args.json, result)
    return 0


def compile_layer(args: argparse.Namespace) -> int:
    """On CUDA ``mode="reduce-overhead"`` (inductor with CUDA graphs); in a dry run the
    ``eager`` backend, which checks that Dynamo traces the layer in seconds."""
    if args.dry_run:
        mode, backend, warmup, iters = None, "eager", 1, 1
    else:
        mode, backend, warmup, iters = "reduce-overhead", "inductor", 3, 10
    result = ddetr.time_encoder_layer(
        args.impl, args.device, _shape(args.dry_run), mode, backend, warmup, iters
    )
    write_json(args.json, result)
    return 0


def build(args: argparse.Namespace) -> int:
    """Build the library and, unless ``--compile-only``, load it and run one small forward
    (an undefined symbol or a kernel that does not launch shows here, not mid-benchmark)."""
    try:
        record = mmcv_cuda_lib.build(
            args.sources, args.build_dir, args.arch, args.compile_only, args.torch_root
        )
        if record["library"] and args.torch_root is None:  # built for this torch: load it
            ops = mmcv_cuda_lib.load(record["library"])
            inputs = make_inputs(DRY_CASE, device="cuda")
            out = ops.ms_deform_attn_forward(*inputs, 64)
            record["smoke_output_shape"] = list(out.shape)
    except (RuntimeError, FileNotFoundError, OSError) as exc:
        record = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    write_json(args.json, record)
    return 0 if "error" not in record else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    parts = {}
    for name, func in (
        ("bench", bench),
        ("train", train),
        ("compile", compile_layer),
        ("build", build),
    ):
        parts[name] = sub.add_parser(name)
        parts[name].add_argument("--json", type=Path, required=True)
        parts[name].set_defaults(func=func)
    for name in ("bench", "train", "compile"):
        parts[name].add_argument("--device", required=True)
    for name in ("train", "compile"):
        parts[name].add_argument("--impl", required=True)
        parts[name].add_argument("--dry-run", action="store_true")
    parts["bench"].add_argument("--dtype", required=True)
    parts["bench"].add_argument("--cases", required=True)
    parts["bench"].add_argument("--impls", required=True)
    parts["bench"].add_argument("--repeat", type=int, required=True)
    parts["build"].add_argument("--sources", type=Path, required=True)
    parts["build"].add_argument("--build-dir", type=Path, required=True)
    parts["build"].add_argument("--arch", default=None)
    parts["build"].add_argument("--compile-only", action="store_true")
    parts["build"].add_argument("--torch-root", type=Path, default=None)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
