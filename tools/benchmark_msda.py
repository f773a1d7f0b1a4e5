"""Time MSDA implementations side by side on the shapes of real models.

    python tools/benchmark_msda.py --threads 2 --json results/msda_cpu.json

Every implementation runs in this one process, interleaved round by round after a
warm-up, so machine noise hits all of them alike; the table gives medians and ratios
against ``grid_sample``. Outputs and all three gradients are checked against it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npudet.ops import msda_impls, multi_scale_deformable_attn  # noqa: E402
from npudet.ops.msda import get_impl, msda_variants, validate_inputs  # noqa: E402
from npudet.ops.msda.cases import CASES, make_inputs, parse_case  # noqa: E402
from npudet.ops.msda.cpu_impl import isa  # noqa: E402

BASELINE = "grid_sample"
DEFAULT_CASES = [*CASES, "ddetr-enc:uniform"]


def _accelerator(device: str):
    """``torch.cuda`` or ``torch.npu`` (registered by torch_npu) for those devices, else None."""
    return getattr(torch, device, None) if device in ("cuda", "npu") else None


def _sync(device: str) -> None:
    module = _accelerator(device)
    if module is not None:
        module.synchronize()


def _timed(fn: Callable[[], object], device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


class Runner:
    """Forward / backward closures of one implementation on one set of inputs."""

    def __init__(self, impl: str, inputs: Tuple[torch.Tensor, ...], grad: torch.Tensor):
        value, shapes, starts, loc, attn = inputs
        self.impl = impl
        self.leaves = [t.detach().clone().requires_grad_() for t in (value, loc, attn)]
        self.shapes, self.starts = shapes, starts
        self.grad = grad

    def forward(self) -> torch.Tensor:
        value, loc, attn = self.leaves
        return multi_scale_deformable_attn(
            value, self.shapes, self.starts, loc, attn, impl=self.impl
        )

    def grads(self) -> Tuple[torch.Tensor, ...]:
        out = self.forward()
        return (out, *torch.autograd.grad(out, self.leaves, self.grad))

    def time_round(self, device: str) -> Dict[str, float]:
        fwd = _timed(self.forward, device)
        out = self.forward()
        bwd = _timed(lambda: torch.autograd.grad(out, self.leaves, self.grad), device)
        both = _timed(self.grads, device)
        return {"fwd_ms": fwd, "bwd_ms": bwd, "fwd_bwd_ms": both}


def peak_memory_mb(runner: Runner, device: str) -> float:
    """Peak memory allocated during one forward+backward, above what was live before."""
    module = _accelerator(device)
    if module is not None:
        module.synchronize()
        module.reset_peak_memory_stats()
        base = module.memory_allocated()
        runner.grads()
        module.synchronize()
        return (module.max_memory_allocated() - base) / 2**20
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runner.grads()
    allocations = []  # (time, +bytes allocated / -bytes freed), from the profiler's tree
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            allocations.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, delta in sorted(allocations):
        live += delta
        peak = max(peak, live)
    return peak / 2**20


def run_case(spec: str, impls: List[str], repeat: int, device: str) -> List[dict]:
    case, pattern = parse_case(spec)
    inputs = make_inputs(case, pattern, device=device)
    info = validate_inputs(*inputs)
    skipped = {name: get_impl(name).not_supported_reasons(info) for name in impls}
    for name, reasons in skipped.items():
        if reasons:
            print(f"[benchmark] {spec}: skipping {name}: {'; '.join(reasons)}", file=sys.stderr)
    if device == "cpu" and "triton" in impls and not skipped["triton"]:
        skipped["triton"] = ["the Triton interpreter is a test path, not a CPU kernel"]
        print(f"[benchmark] {spec}: skipping triton: {skipped['triton'][0]}", file=sys.stderr)
    impls = [name for name in impls if not skipped[name]]
    gen = torch.Generator().manual_seed(1)
    grad = torch.randn(
        case.batch, case.num_queries, case.num_heads * case.head_dim, generator=gen
    ).to(device)
    runners = {name: Runner(name, inputs, grad) for name in impls}
    reference = runners[BASELINE].grads() if BASELINE in runners else None
    errors = {}
    for name, runner in runners.items():
        got = runner.grads()  # also the warm-up
        runner.grads()
        if reference is None:
            errors[name] = (float("nan"), float("nan"))
        else:
            out_err = (got[0] - reference[0]).abs().max().item()
            grad_err = max(
                ((g - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
                for g, r in zip(got[1:], reference[1:])
            )
            errors[name] = (out_err, grad_err)
    rounds: Dict[str, List[Dict[str, float]]] = {name: [] for name in impls}
    for _ in range(repeat):
        for name in impls:
            rounds[name].append(runners[name].time_round(device))
    rows = []
    for name in impls:
        row = {"case": spec, "impl": name}
        for key in ("fwd_ms", "bwd_ms", "fwd_bwd_ms"):
            row[key] = statistics.median(r[key] for r in rounds[name])
        row["peak_mem_mb"] = peak_memory_mb(runners[name], device)
        row["max_abs_err"], row["max_rel_grad_err"] = errors[name]
        rows.append(row)
    return rows


def markdown(rows: List[dict]) -> str:
    base = {r["case"]: r for r in rows if r["impl"] == BASELINE}
    lines = [
        "| case | impl | fwd ms | bwd ms | fwd+bwd ms | fwd x | bwd x | fwd+bwd x "
        "| peak MB | mem / base | out max abs err | grad max rel err |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b = base.get(r["case"])

        def ratio(key: str, r=r, b=b) -> str:
            return f"{b[key] / r[key]:.1f}" if b else "-"

        mem = f"{r['peak_mem_mb'] / b['peak_mem_mb']:.2f}" if b and b["peak_mem_mb"] else "-"
        lines.append(
            f"| {r['case']} | {r['impl']} | {r['fwd_ms']:.2f} | {r['bwd_ms']:.2f} "
            f"| {r['fwd_bwd_ms']:.2f} | {ratio('fwd_ms')} | {ratio('bwd_ms')} "
            f"| {ratio('fwd_bwd_ms')} | {r['peak_mem_mb']:.1f} | {mem} | {r['max_abs_err']:.1e} "
            f"| {r['max_rel_grad_err']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
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
    args = parser.parse_args(argv)
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
    if BASELINE in available and BASELINE not in impls:
        impls = [BASELINE, *impls]
    specs = [s for s in args.cases.split(",") if s]
    try:
        for spec in specs:
            parse_case(spec)
    except ValueError as exc:
        parser.error(str(exc))
    rows: List[dict] = []
    for spec in specs:
        rows.extend(run_case(spec, impls, args.repeat, args.device))
        print(f"[benchmark] {spec} done", file=sys.stderr, flush=True)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
        f"median of {args.repeat} interleaved rounds; x = speed-up over {BASELINE}"
    )
    print(f"cpu kernel variant {isa()}, ATen {torch.backends.cpu.get_cpu_capability()}")
    print(markdown(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"torch": torch.__version__, "threads": torch.get_num_threads(), "results": rows}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
