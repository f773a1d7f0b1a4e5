"""What a call costs the host: MSDA on a problem with next to no kernel work.

One query on a 2x2 map (batch 1, 1 head, head_dim 8, 1 level, 1 point): the kernels do a
few dozen flops, so a call's time is the host's work around them - validation, the
implementation's choice, op dispatch, autograd, launches. Timed per call, in us:

- ``fwd``: forward with inputs that require grad (what a training step's forward pays);
- ``fwd_bwd``: forward + ``.sum().backward()``;
- ``nograd_fwd``: forward under ``torch.no_grad()`` (inference).

For the public op with ``impl="auto"`` and each implementation, beside floors timed in the
same rounds: ``aten grid_sample`` (one ATen op with autograd, two differentiable inputs;
the issue's yardstick), ``aten addcmul`` (one ATen op with three differentiable inputs,
as MSDA has) and, for ``cpu``, ``cpu kernel op`` (the kernel's torch op called directly,
forward op + backward op without autograd). Functions are interleaved round by round and
each cell is the median of the rounds, so machine noise meets every row alike.

:func:`measure_ratio` is the measurement of the host-cost goal alone: ``auto``'s
forward+backward and the yardstick's, alternating in many short rounds (the order swapped
every round: A B, B A, A B, ...), with the median and spread (quartiles, min-max) of each and of
the per-round ratio; a machine whose load moves shows as a wide spread, not as a different
median. Both record their conditions (npudet.benchmark.conditions).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from npudet.ops.msda.api import multi_scale_deformable_attn
from npudet.ops.msda.backends import cpu as cpu_impl
from npudet.ops.msda.backends import cpu_library
from npudet.ops.msda.inputs import validate_inputs
from npudet.ops.msda.registry import get_impl, msda_impls

from .conditions import Recorder, mark, record_reasons

TIMES = ("fwd_us", "fwd_bwd_us", "nograd_fwd_us")
YARDSTICK = "aten grid_sample"
RATIO_CALLS = 100  # calls per side and round of measure_ratio


def host_case(device: str = "cpu") -> Tuple[torch.Tensor, ...]:
    """(value, spatial_shapes, level_start_index, locations, weights) of the 1-query case;
    value, locations and weights require grad."""
    gen = torch.Generator().manual_seed(0)
    value = torch.randn(1, 4, 1, 8, generator=gen)
    loc = torch.rand(1, 1, 1, 1, 1, 2, generator=gen)
    attn = torch.rand(1, 1, 1, 1, 1, generator=gen)
    shapes = torch.tensor([[2, 2]])
    starts = torch.tensor([0])
    value, loc, attn = (t.to(device).requires_grad_() for t in (value, loc, attn))
    return value, shapes.to(device), starts.to(device), loc, attn


Calls = Dict[str, Callable[[], object]]


def _autograd_calls(fwd: Callable[[], torch.Tensor]) -> Calls:
    """The three timed calls of a differentiable forward: alone, with ``.sum().backward()``,
    and (timed under ``torch.no_grad()``) alone."""
    return {"fwd_us": fwd, "fwd_bwd_us": lambda: fwd().sum().backward(), "nograd_fwd_us": fwd}


def _op_calls(impl: str, inputs: Tuple[torch.Tensor, ...]) -> Calls:
    value, shapes, starts, loc, attn = inputs

    def fwd():
        return multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl=impl)

    return _autograd_calls(fwd)


def _grid_sample_calls(device: str) -> Calls:
    image = torch.randn(1, 8, 2, 2, device=device, requires_grad=True)
    grid = torch.rand(1, 1, 1, 2, device=device, requires_grad=True)

    def fwd():
        return F.grid_sample(image, grid, mode="bilinear", align_corners=False)

    return _autograd_calls(fwd)


def _addcmul_calls(device: str) -> Calls:
    a, b, c = (torch.randn(8, device=device, requires_grad=True) for _ in range(3))

    def fwd():
        return torch.addcmul(a, b, c)

    return _autograd_calls(fwd)


def _cpu_kernel_calls(inputs: Tuple[torch.Tensor, ...]) -> Calls:
    """The ``cpu`` kernel's ops called directly: forward op, backward op, no autograd."""
    value, shapes, starts, loc, attn = (t.detach() for t in inputs)
    options = cpu_impl.CPUImpl.OPTIONS.as_ints()
    grad = torch.ones(1, 1, 8)
    forward, backward = cpu_library.forward_op(), cpu_library.backward_op()

    def fwd():
        return forward(value, shapes, starts, loc, attn, options)

    def fwd_bwd():
        fwd()
        return backward(grad, value, shapes, starts, loc, attn, options)

    return {"fwd_us": fwd, "fwd_bwd_us": fwd_bwd, "nograd_fwd_us": fwd}


def rows_to_time(device: str, impls: Optional[List[str]] = None) -> Dict[str, Calls]:
    """Label -> the three calls of each row: ``auto``, each implementation usable on
    ``device`` that takes the case, and the floors (module docstring)."""
    inputs = host_case(device)
    info = validate_inputs(*inputs)
    names = impls if impls is not None else msda_impls()
    rows: Dict[str, Calls] = {"auto": _op_calls("auto", inputs)}
    for name in names:
        if get_impl(name).not_supported_reasons(info):
            continue
        if name == "triton" and device == "cpu":
            continue  # the Triton interpreter is a test path, not a CPU kernel
        rows[name] = _op_calls(name, inputs)
    rows[YARDSTICK] = _grid_sample_calls(device)
    rows["aten addcmul"] = _addcmul_calls(device)
    if device == "cpu" and "cpu" in rows:
        rows["cpu kernel op"] = _cpu_kernel_calls(inputs)
    return rows


def _per_call_us(fn: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def measure(
    device: str = "cpu",
    impls: Optional[List[str]] = None,
    rounds: int = 5,
    calls: int = 1000,
) -> List[dict]:
    """Per row, the median over ``rounds`` of the per-call us of each of ``TIMES``, and the
    ratios over the yardstick's (``*_x_aten``: 1.0 = as cheap as one ATen op)."""
    module = getattr(torch, device, None) if device != "cpu" else None
    sync = module.synchronize if module is not None else (lambda: None)
    rows = rows_to_time(device, impls)
    for table in rows.values():  # warm-up: builds, verification, first-call plans
        for key, fn in table.items():
            with torch.set_grad_enabled(key != "nograd_fwd_us"):
                for _ in range(20):
                    fn()
    samples: Dict[Tuple[str, str], List[float]] = {}
    with Recorder(torch.get_num_threads(), cpu_bound=module is None) as recorder:
        for _ in range(rounds):
            for label, table in rows.items():
                for key, fn in table.items():
                    with torch.set_grad_enabled(key != "nograd_fwd_us"):
                        us = _per_call_us(fn, calls, sync)
                    samples.setdefault((label, key), []).append(us)
    results = []
    loaded = mark(record_reasons(recorder.record))
    for label, table in rows.items():
        row = {"case": "host-1q", "impl": label, "conditions": recorder.record, **loaded}
        for key in table:
            row[key] = statistics.median(samples[(label, key)])
        results.append(row)
    base = next(r for r in results if r["impl"] == YARDSTICK)
    for row in results:
        for key in TIMES:
            row[key.replace("_us", "_x_aten")] = row[key] / base[key]
    return results


def spread(values: List[float]) -> Dict[str, float]:
    """Median, quartiles and range of ``values``."""
    p25, _, p75 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return {
        "median": statistics.median(values),
        "p25": p25,
        "p75": p75,
        "min": min(values),
        "max": max(values),
    }


def measure_ratio(
    device: str = "cpu", impl: str = "auto", rounds: int = 200, calls: int = RATIO_CALLS
) -> dict:
    """``impl``'s forward+backward on the 1-query case against the yardstick's, alternating in
    ``rounds`` rounds of ``calls`` calls each (A B, then B A, ...): per-call us of each and the
    per-round ratio, each as :func:`spread`, with the rounds' conditions."""
    module = getattr(torch, device, None) if device != "cpu" else None
    sync = module.synchronize if module is not None else (lambda: None)
    pair = {
        impl: _op_calls(impl, host_case(device))["fwd_bwd_us"],
        YARDSTICK: _grid_sample_calls(device)["fwd_bwd_us"],
    }
    for fn in pair.values():  # warm-up: builds, verification, first-call plans
        for _ in range(20):
            fn()
    samples: Dict[str, List[float]] = {name: [] for name in pair}
    ratios: List[float] = []
    with Recorder(torch.get_num_threads(), cpu_bound=module is None) as recorder:
        for r in range(rounds):
            for name in list(pair) if r % 2 == 0 else list(pair)[::-1]:
                samples[name].append(_per_call_us(pair[name], calls, sync))
            ratios.append(samples[impl][-1] / samples[YARDSTICK][-1])
    return {
        "case": "host-1q",
        "impl": impl,
        "rounds": rounds,
        "calls_per_round": calls,
        "fwd_bwd_us": spread(samples[impl]),
        "aten_fwd_bwd_us": spread(samples[YARDSTICK]),
        "ratio": spread(ratios),
        "conditions": recorder.record,
        **mark(record_reasons(recorder.record)),
    }


def ratio_markdown(row: dict) -> str:
    """:func:`measure_ratio`'s result as a table: median, quartiles and range per line."""
    lines = [
        "| host cost, 1 query, fwd+bwd | median | p25-p75 | min-max |",
        "|---|---:|---:|---:|",
    ]
    for label, key, fmt in (
        (f"`{row['impl']}` us per call", "fwd_bwd_us", ".1f"),
        (f"{YARDSTICK} us per call", "aten_fwd_bwd_us", ".1f"),
        (f"`{row['impl']}` / {YARDSTICK}, per round", "ratio", ".2f"),
    ):
        s = row[key]
        lines.append(
            f"| {label} | {s['median']:{fmt}} | {s['p25']:{fmt}}-{s['p75']:{fmt}} | "
            f"{s['min']:{fmt}}-{s['max']:{fmt}} |"
        )
    state = f"loaded ({row['loaded_why']})" if row["loaded"] else "quiet"
    load = "-".join(f"{v:.1f}" for v in row["conditions"]["load_1m"])
    return "\n".join(lines) + f"\n\nconditions: load {load}, {state}"


# (header, key, format) of the host table's columns.
COLUMNS = (
    ("fwd us", "fwd_us", ".1f"),
    ("fwd+bwd us", "fwd_bwd_us", ".1f"),
    ("no-grad fwd us", "nograd_fwd_us", ".1f"),
    ("fwd / aten", "fwd_x_aten", ".2f"),
    ("fwd+bwd / aten", "fwd_bwd_x_aten", ".2f"),
    ("no-grad fwd / aten", "nograd_fwd_x_aten", ".2f"),
)
