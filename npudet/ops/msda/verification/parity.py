"""The parity engine: an MSDA implementation against the reference (``grid_sample``).

Every comparison of npudet runs here, on the same terms: an implementation's ``forward``
(``registry.get_impl(name).forward``, no dispatch) and its VJP with one cotangent give the
output and the gradients of value, sampling_locations and attention_weights (``vjp``);
``errors`` measures each against the reference's as (abs, rel): ``abs`` = max |got - ref|,
``rel`` = abs / max(max |ref|, 1) (relative to the reference's scale, absolute below 1, so
a near-zero reference does not blow it up); a shape mismatch or a non-finite value is
(inf, inf). Three users:

- ``check_impl``: ``auto``'s check before it trusts an implementation on a device
  (``PROBE_CASE`` only, a few ms): "" or the error;
- ``check_case`` / ``check_parity``: the device check (``tools/misc/check_device.py``), every
  case of ``PARITY_CASES`` against the reference computed on the CPU in float64 from the
  same (dtype-rounded) inputs; the cases add what the probe does not reach (levels of 1x1
  and five levels, one head, head_dim 3 and 33, one point, one query, locations far
  outside, NaN and infinite locations);
- ``compare_call``: ``MSDAParityHook``, a live call of a training run against the
  reference on the call's own inputs and device (``CallParity``).

Tolerances per dtype of the inputs: ``TOLERANCE``, on ``rel``.

Each case has one of three outcomes: ``passed``, ``failed`` (errors above the tolerance, or
a crash: an outcome, never an exception) or ``declined`` (outside the implementation's
declared limits, or a case the reference itself cannot answer: not run, never counted as
passed). An implementation is ``correct`` in a dtype when every case it ran passed and it
ran at least one; the counts say how many it declined.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from npudet.utils.torch_compat import is_autocast_available

from ..inputs import validate_inputs
from ..levels import level_start_index
from ..observe import MSDACall
from ..registry import get_impl
from .records import dtype_name, fingerprint

REFERENCE = "grid_sample"
PASSED, FAILED, DECLINED = "passed", "failed", "declined"

# Largest ``rel`` error per dtype of the inputs. Loose enough for kernels that compute in
# the input's precision (mmcv's half kernel), tight enough for the O(1) errors of a wrong
# index, a lost atomic add or a race.
TOLERANCE = {
    torch.float64: 1e-7,
    torch.float32: 1e-4,
    torch.float16: 3e-2,
    torch.bfloat16: 1e-1,
}
# Names of the tensors ``vjp`` returns, in order.
TENSORS = ("output", "grad value", "grad sampling_locations", "grad attention_weights")

# Keyword arguments of ``small_inputs``: the edge cases of the parity tests, tiny shapes.
# The first is ``auto``'s check (``check_impl``): within every implementation's declared
# limits (vendor kernels included), bs 2, levels 6x4 and 3x2, about 10% of the points off
# the map.
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
    """One case: its outcome (``PASSED``, ``FAILED`` or ``DECLINED``) and the largest
    ``rel`` errors of the output and of the three gradients.

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
    """The parity of one (implementation, device, dtype): ``correct`` when every case it ran
    passed and it ran at least one.

    ``declined`` lists the implementation's own reasons for not taking such inputs (then
    nothing ran and ``correct`` is False). ``counts``: cases per outcome. ``key``: the
    implementation's ``records.fingerprint`` in the process that ran it.
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
    return spatial, level_start_index(spatial), int(spatial.prod(1).sum())


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


def cotangent(shape: Sequence[int], seed: int = 1) -> torch.Tensor:
    """The fixed cotangent of every comparison: float64 ``randn`` of ``shape`` from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float64)


def vjp(
    impl: str,
    inputs: Inputs,
    grad: torch.Tensor,
    device: Union[str, torch.device, None] = None,
    dtype: Optional[torch.dtype] = None,
) -> List[torch.Tensor]:
    """[output (bs, queries, heads * D), grad value, grad locations, grad weights] of
    ``impl``'s forward on ``inputs`` with cotangent ``grad``, detached, where it ran.

    The floating inputs and ``grad`` go to ``device`` and ``dtype`` first (None: as they
    are); the caller's tensors are not touched. A gradient the implementation leaves
    unused is zeros.
    """
    value, spatial, starts, loc, attn = inputs
    device = value.device if device is None else torch.device(device)
    leaves = [t.detach().to(device, dtype).requires_grad_() for t in (value, loc, attn)]
    with torch.enable_grad():
        out = get_impl(impl).forward(
            leaves[0], spatial.to(device), starts.to(device), leaves[1], leaves[2]
        )
        grads = torch.autograd.grad(out, leaves, grad.to(device, out.dtype), allow_unused=True)
    zeros = (torch.zeros_like(t) for t in leaves)
    return [out.detach(), *(z if g is None else g for g, z in zip(grads, zeros))]


def errors(got: torch.Tensor, want: torch.Tensor) -> Tuple[float, float]:
    """(abs, rel) error of ``got`` against the reference ``want`` (any devices, dtypes):
    abs = max |got - want|, rel = abs / max(max |want|, 1); (inf, inf) for a shape
    mismatch or a non-finite value in ``got``, (0, 0) for empty tensors."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    if got.shape != want.shape or not bool(torch.isfinite(got).all()):
        return float("inf"), float("inf")
    if got.numel() == 0:
        return 0.0, 0.0
    abs_err = float((got - want).abs().max())
    return abs_err, abs_err / max(float(want.abs().max()), 1.0)


def _declined(impl: str, device: str, inputs: Inputs) -> List[str]:
    """``impl``'s reasons for not taking ``inputs`` (CPU tensors) on ``device``."""
    info = validate_inputs(*inputs, check_values=False)
    return list(get_impl(impl).not_supported_reasons(replace(info, device_type=device)))


def _rounded_case(case: str, dtype: torch.dtype) -> Tuple[Inputs, torch.Tensor]:
    """``case``'s inputs and output cotangent on the CPU, rounded to ``dtype``: the values
    the implementation under test sees, and (in float64) the reference too."""
    value, spatial, starts, loc, attn = small_inputs(**PARITY_CASES[case])
    grad = cotangent((value.shape[0], loc.shape[1], value.shape[2] * value.shape[3]))
    return (value.to(dtype), spatial, starts, loc.to(dtype), attn.to(dtype)), grad.to(dtype)


def check_case(impl: str, device: str, dtype: torch.dtype, case: str) -> CaseResult:
    """Run one case of ``PARITY_CASES`` and compare with the float64 CPU reference."""
    kwargs = PARITY_CASES[case]
    try:
        rounded, grad = _rounded_case(case, dtype)
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
        want = vjp(REFERENCE, tuple(reference_inputs), grad.double(), "cpu")
        got = vjp(impl, rounded, grad, device)
    except Exception as exc:  # any failure of the implementation is an outcome, not a crash
        return CaseResult(case, FAILED, error=f"{type(exc).__name__}: {exc}"[:500])
    checked = [0, 1, 3] if kwargs.get("nan") else [0, 1, 2, 3]  # NaN location grads: any
    if got[0].dtype != dtype:
        return CaseResult(case, FAILED, error=f"output dtype {got[0].dtype}, expected {dtype}")
    rel = {TENSORS[i]: errors(got[i], want[i])[1] for i in checked}
    tol = TOLERANCE[dtype]
    bad = ", ".join(f"{name} {err:.2e}" for name, err in rel.items() if not err <= tol)
    error = f"max relative error {bad} > {tol:.0e}" if bad else ""
    grad_err = max(err for name, err in rel.items() if name != TENSORS[0])
    return CaseResult(case, FAILED if bad else PASSED, rel[TENSORS[0]], grad_err, error)


def check_parity(
    impl: str, device: str, dtype: torch.dtype, cases: Optional[Sequence[str]] = None
) -> ParityResult:
    """Every case (default all of ``PARITY_CASES``) of ``impl`` on ``device`` in ``dtype``."""
    start = time.perf_counter()
    name = dtype_name(dtype)
    try:
        key = fingerprint(impl, device)
        declined = _declined(impl, device, _rounded_case(PROBE_CASE, dtype)[0])
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


@contextlib.contextmanager
def _check_context(device_type: str) -> Iterator[None]:
    """Whatever the caller's state: gradients on, inference mode and autocast off (the check
    runs in the dtype it names), and one intra-op CPU thread for its tiny CPU work
    (measured on a loaded 2-core machine: 4 ms per check on one thread, 60 ms on two, whose
    OpenMP workers wait for a busy core at every parallel region)."""
    threads = torch.get_num_threads()
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        for kind in {"cpu", device_type}:
            if is_autocast_available(kind):
                stack.enter_context(torch.autocast(kind, enabled=False))
        torch.set_num_threads(1)
        stack.callback(torch.set_num_threads, threads)
        yield


def check_impl(impl: str, device: Union[str, torch.device], dtype: torch.dtype) -> str:
    """``auto``'s check: ``PROBE_CASE`` through ``impl`` on ``device`` in ``dtype`` against
    the reference in float64 on the CPU: "" or the error (the first tensor whose ``rel``
    exceeds ``TOLERANCE[dtype]``, a crash, non-finite values)."""
    device = torch.device(device)
    with _check_context(device.type):
        rounded, grad = _rounded_case(PROBE_CASE, dtype)
        # In float64: vjp hands the implementation ``dtype`` copies, the reference these.
        inputs = tuple(t.double() if t.is_floating_point() else t for t in rounded)
        grad = grad.double()
        info = validate_inputs(*inputs, check_values=False)
        reasons = get_impl(impl).not_supported_reasons(
            replace(info, device_type=device.type, dtype=dtype)
        )
        if reasons:
            return f"the check case is outside its limits: {'; '.join(reasons)}"
        want = vjp(REFERENCE, inputs, grad, "cpu")
        try:
            got = vjp(impl, inputs, grad, device, dtype)
        except Exception as exc:  # any failure of a kernel makes it untrusted: say which
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    for name, g, w in zip(TENSORS, got, want):
        if g.shape != w.shape:
            return f"{name}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        if not bool(torch.isfinite(g).all()):
            return f"{name}: non-finite values"
        _, error = errors(g, w)
        if error > TOLERANCE[dtype]:
            return f"{name}: max error {error:.2e} > {TOLERANCE[dtype]:.0e} vs {REFERENCE}"
    return ""


@dataclass(frozen=True)
class CallParity:
    """Errors of one observed call: ``errors[tensor] = (abs, rel)`` (``errors``) for
    "output" and "grad_<input>" of value, sampling_locations and attention_weights."""

    iteration: int
    layer: str
    impl: str
    reference: str
    errors: Dict[str, Tuple[float, float]]

    @property
    def max_abs(self) -> float:
        return max(a for a, _ in self.errors.values())

    @property
    def max_rel(self) -> float:
        return max(r for _, r in self.errors.values())


def compare_call(
    call: MSDACall, reference: str = REFERENCE, seed: int = 0
) -> Dict[str, Tuple[float, float]]:
    """(abs, rel) errors of ``call.impl`` against ``reference`` on the call's inputs, on
    the call's device and dtype.

    Keys: ``"output"`` and ``"grad_<input>"`` for value, sampling_locations and
    attention_weights; the cotangent is ``cotangent`` of the output's shape from ``seed``.
    """
    inputs = call.tensors()
    value, _, _, loc, _ = inputs
    grad = cotangent((value.shape[0], loc.shape[1], value.shape[2] * value.shape[3]), seed)
    grad = grad.to(value.device, value.dtype)
    live = vjp(call.impl, inputs, grad)
    ref = vjp(reference, inputs, grad)
    names = ["output", *(f"grad_{name.split()[-1]}" for name in TENSORS[1:])]
    return {name: errors(a, b) for name, a, b in zip(names, live, ref)}
