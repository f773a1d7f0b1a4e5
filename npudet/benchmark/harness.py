"""The MSDA benchmark harness (``tools/analysis_tools/benchmark_msda.py`` is its command line): time
implementations side by side on the shapes of real models.

Every implementation runs in this one process, interleaved round by round after a
warm-up, so machine noise hits all of them alike; the table gives medians and ratios
against ``grid_sample``. Outputs and all three gradients are checked against it.

A caller may pass a probe, an extra timer built per case and timed on the CPU in the same
rounds (``tools/analysis_tools/benchmark_msda.py --limit`` passes the project's gather-only probe,
``npudet_dev.kernels.cpu_probe``: the corner rows each sample reads, summed, nothing else
computed): its time is the machine's row-load limit for the case, and ``fwd / limit`` and
``bwd / limit`` say how far each implementation is from it. The header and the JSON name
the CPU model, its vector features, ATen's capability and the ``cpu`` kernel's
instruction-set variant.

On an accelerator two more times per implementation: ``queued ms``, forward+backward calls
queued back to back between two syncs, per call (what training sees: the larger of the host's
and the device's time), and on CUDA ``kernel ms``, the GPU's own time per call from the
profiler. Columns nothing measured are left out of the table.

Each case's rounds record their conditions (``conditions``: load average before and after,
the process's CPU and wall time, threads); the CPU time of every timed call is kept beside its
wall time, so a case timed on a loaded machine is marked ``loaded`` (JSON, table, plot) with
its CPU-time ratios (``*_cpu_x``) beside the wall-time ones.

``--host`` times instead what a call costs the host (``host_cost``): a
1-query problem whose kernels do next to nothing, per-call us of forward, forward+backward
and no-grad forward for ``auto`` and each implementation, beside one ATen op's:

    python tools/analysis_tools/benchmark_msda.py --host --threads 1 --runs 3

``--host-ratio`` times only ``auto``'s forward+backward against the ATen yardstick, the two
alternating in many short rounds, and reports the median and spread of each and of the
per-round ratio (``host_cost.measure_ratio``).

``--runs N`` runs the whole benchmark N times in separate processes and reports, per
cell, the median of the runs and their spread (min-max): ratios are taken within each run,
where both sides met the same machine state, then summarised.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from npudet.ops.msda.api import multi_scale_deformable_attn
from npudet.ops.msda.backends import cpu_isa
from npudet.ops.msda.backends.cpu_library import isa
from npudet.ops.msda.inputs import validate_inputs
from npudet.ops.msda.registry import get_impl
from npudet.ops.msda.verification.parity import REFERENCE, errors

from . import host_cost
from .cases import CASES, MSDACase, make_inputs, parse_case
from .conditions import RULE, Recorder, mark, record_reasons

BASELINE = REFERENCE
DEFAULT_CASES = [*CASES, "ddetr-enc:uniform"]
# Vector features worth naming in the header (/proc/cpuinfo names), where the CPU has them.
FEATURES = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "sve",
)
TIMES = ("fwd_ms", "bwd_ms", "fwd_bwd_ms")
# A probe: built once per case from its inputs and case, a call timed beside the
# implementations on the CPU ("limit ms"), or None where it cannot run.
Probe = Callable[[Tuple[torch.Tensor, ...], MSDACase], Optional[Callable[[], object]]]
CPU_TIMES = tuple(key.replace("_ms", "_cpu_ms") for key in TIMES)


def machine_info() -> dict:
    """The CPU model, its vector features, ATen's capability and the cpu kernel variant."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
            )
    except OSError:
        pass
    flags = cpu_isa.cpu_flags()
    return {
        "cpu_model": model,
        "cpu_features": [f for f in FEATURES if flags and f in flags],
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_kernel_variant": isa(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def _accelerator(device: str):
    """``torch.cuda`` or ``torch.npu`` (registered by torch_npu) for those devices, else None."""
    return getattr(torch, device, None) if device in ("cuda", "npu") else None


def _sync(device: str) -> None:
    module = _accelerator(device)
    if module is not None:
        module.synchronize()


def _timed(fn: Callable[[], object], device: str) -> float:
    return _timed_cpu(fn, device)[0]


def _timed_cpu(fn: Callable[[], object], device: str) -> Tuple[float, float]:
    """(wall ms, this process's CPU ms) of one synced call of ``fn``."""
    _sync(device)
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3, (time.process_time() - cpu) * 1e3


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
        """Wall and CPU ms of a forward, a backward and a forward+backward."""
        fwd = _timed_cpu(self.forward, device)
        out = self.forward()
        bwd = _timed_cpu(lambda: torch.autograd.grad(out, self.leaves, self.grad), device)
        both = _timed_cpu(self.grads, device)
        times = {"fwd_ms": fwd, "bwd_ms": bwd, "fwd_bwd_ms": both}
        return {
            **{key: wall for key, (wall, _) in times.items()},
            **{key.replace("_ms", "_cpu_ms"): cpu for key, (_, cpu) in times.items()},
        }


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


QUEUED_CALLS = 20  # back-to-back forward+backward calls per queued measurement


def queued_ms(runner: Runner, device: str) -> float:
    """Forward+backward ms per call with ``QUEUED_CALLS`` calls queued between two syncs.

    On an accelerator the host runs ahead of the device as it does in training, so this is
    the larger of the device's time and the host's launch overhead; a single synced call
    (``fwd_bwd_ms``) adds the two. NaN on the CPU, where there is nothing to queue.
    """
    if _accelerator(device) is None:
        return float("nan")
    return _timed(lambda: [runner.grads() for _ in range(QUEUED_CALLS)], device) / QUEUED_CALLS


def kernel_ms(runner: Runner, device: str, calls: int = 5) -> float:
    """Device time (kernels, copies, fills) of one forward+backward on CUDA, by the
    profiler: what the implementation costs the GPU, host overhead excluded. NaN elsewhere."""
    if device != "cuda":
        return float("nan")
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            runner.grads()
        torch.cuda.synchronize()
    device_us = sum(e.self_device_time_total for e in prof.key_averages())
    return device_us / 1e3 / calls


def run_case(
    spec: str,
    impls: List[str],
    repeat: int,
    device: str,
    dtype: torch.dtype = torch.float32,
    probe: Optional[Probe] = None,
) -> List[dict]:
    """Rows (one per implementation that takes the case) of case ``spec`` on ``device`` in
    ``dtype``: median wall and CPU times of ``repeat`` interleaved rounds (every
    implementation once per round), the rounds' conditions, peak memory, errors against
    ``BASELINE``; with ``probe`` on the CPU, its median time in the same rounds
    (``limit_ms``)."""
    case, pattern = parse_case(spec)
    inputs = make_inputs(case, pattern, dtype=dtype, device=device)
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
    limit_call = probe(inputs, case) if probe is not None and device == "cpu" else None
    reference = runners[BASELINE].grads() if BASELINE in runners else None
    errs = {}
    for name, runner in runners.items():
        got = runner.grads()  # also the warm-up
        runner.grads()
        if reference is None:
            errs[name] = (float("nan"), float("nan"))
        else:
            measured = [errors(g, r) for g, r in zip(got, reference)]
            errs[name] = (measured[0][0], max(rel for _, rel in measured[1:]))
    rounds: Dict[str, List[Dict[str, float]]] = {name: [] for name in impls}
    limits: List[float] = []
    with Recorder(torch.get_num_threads(), cpu_bound=device == "cpu") as recorder:
        for _ in range(repeat):
            for name in impls:
                rounds[name].append(runners[name].time_round(device))
            if limit_call is not None:
                limits.append(_timed(limit_call, device))
    limit = statistics.median(limits) if limits else float("nan")
    rows = []
    for name in impls:
        row = {"case": spec, "impl": name, "conditions": recorder.record}
        for key in (*TIMES, *CPU_TIMES):
            row[key] = statistics.median(r[key] for r in rounds[name])
        row["peak_mem_mb"] = peak_memory_mb(runners[name], device)
        row["max_abs_err"], row["max_rel_grad_err"] = errs[name]
        row["limit_ms"] = limit
        row["queued_ms"] = queued_ms(runners[name], device)
        row["kernel_ms"] = kernel_ms(runners[name], device)
        rows.append(row)
    return derive(rows)


def derive(rows: List[dict]) -> List[dict]:
    """Adds the ratios of each row: speed-up (wall and CPU time) and memory against the
    baseline's row of the same case, fwd / bwd time over the probe's (the row-load limit),
    and whether the case's rounds were loaded (``loaded``, ``loaded_why``)."""
    base = {r["case"]: r for r in rows if r["impl"] == BASELINE}
    nan = float("nan")
    for r in rows:
        b = base.get(r["case"])
        for key in (*TIMES, *CPU_TIMES, "queued_ms", "kernel_ms"):
            r[key.replace("_ms", "_x")] = b[key] / r[key] if b and r[key] else nan
        r.update(mark(record_reasons(r.get("conditions"))))
        r["mem_ratio"] = r["peak_mem_mb"] / b["peak_mem_mb"] if b and b["peak_mem_mb"] else nan
        r["fwd_x_limit"] = r["fwd_ms"] / r["limit_ms"]
        r["bwd_x_limit"] = r["bwd_ms"] / r["limit_ms"]
    return rows


# (header, key, format) of the table's columns.
COLUMNS = (
    ("fwd ms", "fwd_ms", ".2f"),
    ("bwd ms", "bwd_ms", ".2f"),
    ("fwd+bwd ms", "fwd_bwd_ms", ".2f"),
    ("fwd x", "fwd_x", ".1f"),
    ("bwd x", "bwd_x", ".1f"),
    ("fwd+bwd x", "fwd_bwd_x", ".1f"),
    ("fwd CPU x", "fwd_cpu_x", ".1f"),
    ("bwd CPU x", "bwd_cpu_x", ".1f"),
    ("fwd+bwd CPU x", "fwd_bwd_cpu_x", ".1f"),
    ("queued ms", "queued_ms", ".3f"),
    ("queued x", "queued_x", ".1f"),
    ("kernel ms", "kernel_ms", ".3f"),
    ("kernel x", "kernel_x", ".1f"),
    ("limit ms", "limit_ms", ".2f"),
    ("fwd / limit", "fwd_x_limit", ".2f"),
    ("bwd / limit", "bwd_x_limit", ".2f"),
    ("peak MB", "peak_mem_mb", ".1f"),
    ("mem / base", "mem_ratio", ".2f"),
    ("out max abs err", "max_abs_err", ".1e"),
    ("grad max rel err", "max_rel_grad_err", ".1e"),
)


# Columns of a summary of runs that show the spread; the others show the median alone.
SPREAD = {key for _, key, _ in COLUMNS} - {
    "peak_mem_mb",
    "mem_ratio",
    "max_abs_err",
    "max_rel_grad_err",
}


def _measured(value) -> bool:
    """False for NaN (not measured), also as the median of a summary of runs."""
    number = value["median"] if isinstance(value, dict) else value
    return number == number


def _cell(value, fmt: str, spread: bool) -> str:
    """A number, or a summary of runs as 'median (min-max)' (``spread``) or its median;
    '-' when not measured."""
    if not _measured(value):
        return "-"
    if not isinstance(value, dict):
        return f"{value:{fmt}}"
    if not spread:
        return f"{value['median']:{fmt}}"
    return f"{value['median']:{fmt}} ({value['min']:{fmt}}-{value['max']:{fmt}})"


def markdown(rows: List[dict], host: bool = False) -> str:
    """The results as a markdown table (x = speed-up over the baseline, / limit = time over
    the gather-only probe's; queued and kernel times on accelerators). A column no row
    measured (the probe off the CPU, the accelerator timings on it) is left out. ``host``:
    the host-cost table (``host_cost.COLUMNS``, every column with its spread)."""
    table = host_cost.COLUMNS if host else COLUMNS
    spread = {key for _, key, _ in table} if host else SPREAD
    columns = [c for c in table if any(_measured(r.get(c[1], float("nan"))) for r in rows)]
    lines = [
        "| case | impl | " + " | ".join(h for h, _, _ in columns) + " | conditions |",
        "|---|---|" + "---:|" * len(columns) + "---|",
    ]
    for r in rows:
        cells = [_cell(r.get(key, float("nan")), fmt, key in spread) for _, key, fmt in columns]
        cells.append(conditions_cell(r))
        lines.append(f"| {r['case']} | {r['impl']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def conditions_cell(row: dict) -> str:
    """``quiet``, ``loaded (why)`` or ``load not recorded`` (rows stored before)."""
    if "loaded" not in row:
        return "load not recorded"
    return f"loaded ({row['loaded_why']})" if row["loaded"] else "quiet"


def summarize(runs: List[List[dict]]) -> List[dict]:
    """Per (case, impl) and numeric key, the median, min and max over the runs; ``loaded``
    when any run was (``loaded_why`` names the runs)."""
    summary = []
    for first in runs[0]:
        same = [
            next(r for r in run if (r["case"], r["impl"]) == (first["case"], first["impl"]))
            for run in runs
        ]
        row = {"case": first["case"], "impl": first["impl"], "runs": len(runs)}
        whys = [f"run {i + 1}: {r['loaded_why']}" for i, r in enumerate(same) if r.get("loaded")]
        if any("loaded" in r for r in same):
            row.update(loaded=bool(whys), loaded_why="; ".join(whys))
        for key, value in first.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values = [r[key] for r in same]
                row[key] = {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                }
        summary.append(row)
    return summary


def header(info: dict, args: argparse.Namespace, runs: str, limit: str = "") -> str:
    """The table's two header lines: the machine, then what the numbers are (``limit``: what
    the probe timed as the limit is, when one was)."""
    machine = (
        f"{info['cpu_model']} ({' '.join(info['cpu_features']) or 'no listed features'}), "
        f"ATen capability {info['aten_capability']}, cpu kernel variant "
        f"{info['cpu_kernel_variant']}\n"
        f"torch {info['torch']}, {info['threads']} threads, device {args.device}, {runs}"
    )
    if args.host_ratio:
        return machine + (
            f"{args.repeat} rounds alternating {host_cost.RATIO_CALLS} calls of each (the order "
            f"swapped every round); host cost per call (1 query, 2x2 map), forward + "
            f".sum().backward(); {RULE}"
        )
    if args.host:
        return machine + (
            f"median of {args.repeat} interleaved rounds of 1000 calls; host cost per call "
            f"(1 query, 2x2 map); / aten = over {host_cost.YARDSTICK} (fwd + .sum().backward())"
            f"; {RULE}"
        )
    return machine + (
        f"median of {args.repeat} interleaved rounds; x = speed-up over {BASELINE} (CPU x: in "
        f"CPU time); {f'limit = {limit}; ' if limit else ''}{RULE}"
    )


def run(
    args: argparse.Namespace, impls: List[str], specs: List[str], probe: Optional[Probe] = None
) -> Tuple[dict, List[dict]]:
    """(machine info, rows) of one benchmark run in this process: the host cost
    (``args.host``) or every case of ``specs`` for ``impls`` (with ``probe``: see
    :func:`run_case`)."""
    rows: List[dict] = []
    if args.host_ratio:
        rows = [host_cost.measure_ratio(args.device, rounds=args.repeat)]
    elif args.host:
        named = args.impls.split(",") if args.impls else None  # default: msda_impls()
        rows = host_cost.measure(args.device, named, rounds=args.repeat)
    for spec in [] if args.host or args.host_ratio else specs:
        rows.extend(run_case(spec, impls, args.repeat, args.device, probe=probe))
        print(f"[benchmark] {spec} done", file=sys.stderr, flush=True)
    return machine_info(), rows
