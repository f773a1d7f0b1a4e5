"""Parity of one MSDA implementation on one device and dtype against ``grid_sample``.

The device check (``tools/check_device.py``) runs every case below through an
implementation on the device under test, forward and the three gradients, and compares
with ``grid_sample`` computed on the CPU in float64 from the same (dtype-rounded) inputs.
Errors are relative to the largest reference magnitude (at least 1), with the tolerances
per dtype of ``auto``'s own check (``verification.TOLERANCE``); the cases add what that
single small call does not reach (levels of 1x1 and five levels, one head, head_dim 3 and
33, one point, one query, locations far outside, NaN and infinite locations).

Each case has one of three verdicts: ``passed``, ``failed`` (errors above the tolerance, or
a crash: a verdict, never an exception) or ``declined`` (outside the implementation's
declared limits, or a case the reference itself cannot answer: not run, never counted as
passed). An implementation is ``correct`` in a dtype when every case it ran passed and it
ran at least one; the counts say how many it declined.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .api import multi_scale_deformable_attn
from .inputs import validate_inputs
from .registry import get_impl
from .verification import TOLERANCE, dtype_name, fingerprint

REFERENCE = "grid_sample"
PASSED, FAILED, DECLINED = "passed", "failed", "declined"

# Keyword arguments of ``small_inputs``: the edge cases of the parity tests, tiny shapes.
# The first is within every implementation's declared limits (vendor kernels included).
PROBE_CASE = "within-limits"
PARITY_CASES: Dict[str, dict] = {
    PROBE_CASE: dict(queries=32, heads=4, dim=32, points=4, low=-0.1, high=1.1),
    "basic": {},
    "one-level": dict(shapes=((5, 7),)),
    "five-levels": dict(shapes=((8, 8), (4, 6), (3, 3), (2, 1), (1, 1))),
    "1x1-levels": dict(shapes=((1, 1), (1, 1), (2, 3))),
    "heads-1": dict(heads=1),
    "heads-8": dict(heads=8, dim=4),
    "dim-3": dict(dim=3),
    "dim-32": dict(dim=32, queries=40),
    "dim-33": dict(dim=33),
    "points-1": dict(points=1),
    "points-8": dict(points=8),
    "batch-3": dict(batch=3),
    "one-query": dict(queries=1),
    "all-outside": dict(low=1.01, high=3.0),
    "far-outside": dict(low=-50.0, high=50.0),
    "nan-locations": dict(nan=True),
}

Inputs = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class CaseResult:
    """One case: its verdict (``PASSED``, ``FAILED`` or ``DECLINED``) and the largest
    relative errors of the output and of the three gradients.

    ``declined``: the reasons for not running the case (``status`` is then ``DECLINED``).
    """

    case: str
    status: str
    out_err: Optional[float] = None
    grad_err: Optional[float] = None
    error: str = ""
    declined: List[str] = field(default_factory=list)


@dataclass
class ParityResult:
    """Verdict of one (implementation, device, dtype): ``correct`` when every case it ran
    passed and it ran at least one.

    ``declined`` lists the implementation's own reasons for not taking such inputs (then
    nothing ran and ``correct`` is False). ``counts``: cases per verdict. ``key``: the
    implementation's ``verification.fingerprint`` in the process that ran it.
    """

    impl: str
    device: str
    dtype: str
    correct: bool
    error: str = ""
    declined: List[str] = field(default_factory=list)
    seconds: float = 0.0
    cases: List[CaseResult] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)
    key: Optional[Dict[str, Optional[str]]] = None

    def to_json(self) -> dict:
        return asdict(self)


def case_summary(row: dict) -> str:
    """``"16 passed, 1 declined (nan-locations)"`` from a ``ParityResult.to_json()``."""
    counts = row.get("counts") or {}
    parts = [f"{counts[s]} {s}" for s in (PASSED, FAILED, DECLINED) if counts.get(s)]
    names = [c["case"] for c in row.get("cases", ()) if c["status"] == DECLINED]
    if names:
        parts[-1] += f" ({', '.join(names)})"
    return ", ".join(parts) or "no case run"


def level_layout(shapes: Sequence[Tuple[int, int]]) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """(spatial_shapes (levels, 2) long, level_start_index (levels,) long, num_keys) of levels."""
    spatial = torch.tensor(shapes, dtype=torch.long)
    sizes = spatial.prod(1)
    starts = torch.cat((sizes.new_zeros(1), sizes.cumsum(0)[:-1]))
    return spatial, starts, int(sizes.sum())


def small_inputs(
    shapes: Sequence[Tuple[int, int]] = ((6, 4), (3, 2)),
    batch: int = 2,
    queries: int = 5,
    heads: int = 2,
    dim: int = 8,
    points: int = 2,
    low: float = -0.2,
    high: float = 1.2,
    nan: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> Inputs:
    """CPU (value, shapes, starts, locations (x, y), weights) of one small case, drawn in ``dtype``.

    With ``nan``, query 1 has NaN locations and query 2 infinite x: such samples must
    contribute nothing (as if they were outside the map).
    """
    gen = torch.Generator().manual_seed(seed)
    spatial, starts, keys = level_layout(shapes)
    levels = len(shapes)
    value = torch.randn(batch, keys, heads, dim, generator=gen, dtype=dtype)
    loc = low + (high - low) * torch.rand(
        batch, queries, heads, levels, points, 2, generator=gen, dtype=dtype
    )
    if nan and queries > 2:
        loc[:, 1] = float("nan")
        loc[:, 2, :, :, :, 0] = float("inf")
    attn = torch.rand(batch, queries, heads, levels, points, generator=gen, dtype=dtype)
    return value, spatial, starts, loc, attn


def _run(impl: str, inputs: Inputs, grad: torch.Tensor, device: str) -> List[torch.Tensor]:
    """Output and grads (value, locations, weights) of ``impl`` on ``device``, on the CPU."""
    value, spatial, starts, loc, attn = (t.to(device) for t in inputs)
    leaves = [t.detach().clone().requires_grad_() for t in (value, loc, attn)]
    out = multi_scale_deformable_attn(leaves[0], spatial, starts, leaves[1], leaves[2], impl=impl)
    grads = torch.autograd.grad(out, leaves, grad.to(device=device, dtype=out.dtype))
    return [t.detach().cpu() for t in (out, *grads)]


_NAMES = ("output", "grad value", "grad sampling_locations", "grad attention_weights")


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if got.shape != want.shape:
        return float("inf")
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - want).abs().max() / want.abs().max().clamp_min(1.0)).item()


def _declined(impl: str, device: str, inputs: Inputs) -> List[str]:
    """``impl``'s reasons for not taking ``inputs`` (CPU tensors) on ``device``."""
    info = validate_inputs(*inputs, check_values=False)
    return list(get_impl(impl).not_supported_reasons(replace(info, device_type=device)))


def check_case(impl: str, device: str, dtype: torch.dtype, case: str) -> CaseResult:
    """Run one case of ``PARITY_CASES`` and compare with the float64 CPU reference."""
    kwargs = PARITY_CASES[case]
    try:
        inputs64 = small_inputs(**kwargs)
        # Round the inputs to the dtype under test; the reference sees the same values.
        value, spatial, starts, loc, attn = inputs64
        rounded = (value.to(dtype), spatial, starts, loc.to(dtype), attn.to(dtype))
        declined = _declined(impl, device, rounded)
        if kwargs.get("nan") and impl == REFERENCE:
            declined.append("F.grid_sample propagates NaN locations into the output")
        if declined:
            return CaseResult(case, DECLINED, declined=declined)
        reference_inputs = [t.double() if t.is_floating_point() else t for t in rounded]
        if kwargs.get("nan"):
            # Outside the map contributes exactly zero, like NaN / infinite locations.
            clean = reference_inputs[3].clone()
            clean[~torch.isfinite(clean).all(-1)] = 5.0
            reference_inputs[3] = clean
        out_shape = (value.shape[0], loc.shape[1], value.shape[2] * value.shape[3])
        grad = torch.randn(out_shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        want = _run(REFERENCE, tuple(reference_inputs), grad.double(), "cpu")
        got = _run(impl, rounded, grad, device)
    except Exception as exc:  # any failure of the implementation is a verdict, not a crash
        return CaseResult(case, FAILED, error=f"{type(exc).__name__}: {exc}"[:500])
    checked = [0, 1, 3] if kwargs.get("nan") else [0, 1, 2, 3]  # NaN location grads: any
    if got[0].dtype != dtype:
        return CaseResult(case, FAILED, error=f"output dtype {got[0].dtype}, expected {dtype}")
    errors = {_NAMES[i]: _relative_error(got[i], want[i]) for i in checked}
    tol = TOLERANCE[dtype]
    bad = ", ".join(f"{name} {err:.2e}" for name, err in errors.items() if not err <= tol)
    error = f"max relative error {bad} > {tol:.0e}" if bad else ""
    grad_err = max(err for name, err in errors.items() if name != _NAMES[0])
    return CaseResult(case, FAILED if bad else PASSED, errors[_NAMES[0]], grad_err, error)


def check_parity(
    impl: str, device: str, dtype: torch.dtype, cases: Optional[Sequence[str]] = None
) -> ParityResult:
    """Every case (default all of ``PARITY_CASES``) of ``impl`` on ``device`` in ``dtype``."""
    start = time.perf_counter()
    name = dtype_name(dtype)
    try:
        key = fingerprint(impl, device)
        probe = small_inputs(**PARITY_CASES[PROBE_CASE])
        rounded = tuple(t.to(dtype) if t.is_floating_point() else t for t in probe)
        declined = _declined(impl, device, rounded)
    except Exception as exc:
        return ParityResult(impl, device, name, False, f"{type(exc).__name__}: {exc}"[:500])
    if declined:
        return ParityResult(
            impl, device, name, False, "declined", declined=list(declined), key=dict(key)
        )
    results = [check_case(impl, device, dtype, case) for case in (cases or PARITY_CASES)]
    counts = {s: sum(r.status == s for r in results) for s in (PASSED, FAILED, DECLINED)}
    failed = [r for r in results if r.status == FAILED]
    error = "; ".join(f"{r.case}: {r.error}" for r in failed[:3])
    if len(failed) > 3:
        error += f"; and {len(failed) - 3} more cases"
    # Every case declined: the dtype is declined as a whole, with the cases' reasons.
    declined = [] if counts[PASSED] or failed else sorted({d for r in results for d in r.declined})
    return ParityResult(
        impl,
        device,
        name,
        counts[PASSED] > 0 and not failed,
        "declined" if declined else error,
        declined=declined,
        seconds=time.perf_counter() - start,
        cases=results,
        counts=counts,
        key=dict(key),
    )
