"""Launch plans of the Triton MSDA kernels: which kernel, grid, meta-parameters, warps.

One place decides how a call is launched, and both the custom ops (``triton_impl.py``)
and the compile checks (``kernel_compile.py``, ``dev/tools/compile_kernels.py``) read it, so
the checks compile exactly what runs. Nothing here needs torch, triton or a device.

A schedule is a planner ``(dtype_name, shape, index_dtype) -> {"fwd": ..., "bwd": ...}``:
``"cuda"`` (``triton.py``: many small programs, masked gathers, atomics) lives
here; other schedules register themselves with :func:`register_schedule` from a module
named ``triton_<schedule>_launch`` in this package, imported on first use (``"ascend"``).

Kernel runtime arguments are bound by name, so a kernel's non-constexpr parameters
must be named from :data:`RUNTIME_ARGS`; ``KernelLaunch.signature`` lists them in the
kernel's order with their Triton types.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union

SCHEDULE_ENV = "NPUDET_TRITON_SCHEDULE"

# The arguments the custom ops can pass, by name: tensors (pointers) and sizes.
RUNTIME_ARGS = {
    "value": "value (bs, num_keys, heads, D), the call's float dtype",
    "shapes": "spatial_shapes (levels, 2), index dtype",
    "starts": "level_start_index (levels,), index dtype",
    "loc": "sampling_locations (bs, num_queries, heads, levels, points, 2)",
    "attn": "attention_weights (bs, num_queries, heads, levels, points)",
    "out": "forward output (bs, num_queries, heads * D), the call's dtype",
    "grad_out": "gradient of the output (bs, num_queries, heads * D), the call's dtype",
    "grad_value": "zero-filled (bs, num_keys, heads, D) in float32 (float64 for float64)",
    "grad_loc": "gradient of sampling_locations, its shape and dtype",
    "grad_attn": "gradient of attention_weights, its shape and dtype",
    "batch": "bs",
    "num_keys": "num_keys",
    "num_queries": "num_queries",
}

_POINTER_TYPES = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float64": "*fp64"}
_INDEX_TYPES = {"int64": "*i64", "int32": "*i32"}
MAX_GRID_YZ = 65535  # CUDA's limit on grid dimensions 1 and 2 (and triton-ascend's total)
MAX_GRID_X = 2**31 - 1


@dataclass(frozen=True)
class MSDAShape:
    """The sizes a launch plan depends on (all positive)."""

    batch: int
    num_keys: int
    num_queries: int
    num_heads: int
    head_dim: int
    num_levels: int
    num_points: int


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: everything ``kernel[grid](**args, **constexprs, num_warps=...)`` needs."""

    module: str  # module inside npudet.ops.msda.kernels holding the kernel
    kernel: str
    grid: Tuple[int, int, int]
    constexprs: Dict[str, Union[int, bool, str]]  # JSON-serialisable only
    signature: Dict[str, str]  # non-constexpr argument -> Triton type, in kernel order
    num_warps: int
    why: str  # why these block sizes and warps


Planner = Callable[[str, MSDAShape, str], Dict[str, KernelLaunch]]
SCHEDULES: Dict[str, Planner] = {}


def register_schedule(name: str, planner: Planner) -> None:
    """Make ``planner`` the schedule ``name`` (``plan_launches(name, ...)`` calls it)."""
    SCHEDULES[name] = planner


def forced_schedule() -> Optional[str]:
    """The schedule ``NPUDET_TRITON_SCHEDULE`` forces (``cuda`` or ``ascend``; None when
    unset or empty); ValueError naming the variable and the allowed values for any other.
    The preflight of ``tools/train.py`` / ``tools/test.py`` calls it before any work."""
    forced = os.environ.get(SCHEDULE_ENV, "")
    if forced and forced not in ("cuda", "ascend"):
        raise ValueError(f"{SCHEDULE_ENV}={forced!r}: expected 'cuda' or 'ascend' (or unset)")
    return forced or None


def schedule_for(device_type: str) -> str:
    """The schedule a call on ``device_type`` uses: ``ascend`` on npu, else ``cuda``.

    ``NPUDET_TRITON_SCHEDULE=cuda|ascend`` forces one (tests run the Ascend kernels on CPU
    tensors under the interpreter with it).
    """
    return forced_schedule() or ("ascend" if device_type == "npu" else "cuda")


def pointer_type(dtype_name: str) -> str:
    """'float16' -> '*fp16' (the Triton signature type of a tensor of that dtype)."""
    if dtype_name not in _POINTER_TYPES:
        raise ValueError(
            f"dtype_name: expected one of {sorted(_POINTER_TYPES)}, got {dtype_name!r}"
        )
    return _POINTER_TYPES[dtype_name]


def int_type(value: int) -> str:
    """Triton's type for an int argument: ``i32`` unless it needs 64 bits (as its launcher)."""
    return "i32" if -(2**31) <= value < 2**31 else "i64"


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def kernel_signatures(
    ptr: str, idx: str, grad_value_ptr: str, sizes: Dict[str, str]
) -> Dict[str, Dict[str, str]]:
    """Signatures of an MSDA kernel pair: the runtime arguments every schedule shares, then
    ``sizes`` (the scalar arguments, in kernel order). ``ptr``: the inputs' pointer type,
    ``idx``: the level tensors', ``grad_value_ptr``: the value-gradient buffer's."""
    return {
        "fwd": dict(value=ptr, shapes=idx, starts=idx, loc=ptr, attn=ptr, out=ptr, **sizes),
        "bwd": dict(
            grad_out=ptr,
            value=ptr,
            shapes=idx,
            starts=idx,
            loc=ptr,
            attn=ptr,
            grad_value=grad_value_ptr,
            grad_loc=ptr,
            grad_attn=ptr,
            **sizes,
        ),
    }


def plan_launches(
    schedule: str, dtype_name: str, shape: MSDAShape, index_dtype: str = "int64"
) -> Dict[str, KernelLaunch]:
    """The forward (``"fwd"``) and backward (``"bwd"``) launches of one MSDA call.

    Args:
        schedule: ``"cuda"`` or a registered schedule (``"ascend"``).
        dtype_name: the float dtype of value, locations and weights (``"float32"``, ...).
        shape: the call's sizes.
        index_dtype: dtype of spatial_shapes and level_start_index, ``"int64"``/``"int32"``.
    """
    pointer_type(dtype_name)
    if index_dtype not in _INDEX_TYPES:
        raise ValueError(f"index_dtype: expected 'int64' or 'int32', got {index_dtype!r}")
    sizes = vars(shape)
    if any(not isinstance(v, int) or v <= 0 for v in sizes.values()):
        raise ValueError(f"shape: expected positive int sizes, got {sizes}")
    if schedule not in SCHEDULES:
        try:
            importlib.import_module(f"{__package__}.triton_{schedule}_launch")
        except ModuleNotFoundError:
            pass
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {sorted(SCHEDULES)}, got {schedule!r}")
    return SCHEDULES[schedule](dtype_name, shape, index_dtype)


# Registers per thread are what limits these gather kernels on CUDA: every element of a
# (BLOCK_Q, BLOCK_S, BLOCK_D) tile a thread holds costs a 64-bit address per corner and
# one or two values (float64: two registers each), and the backward keeps the corner rows,
# the output gradient and the atomic operands live together. Elements of a tile per
# thread, per kernel and accumulator dtype (float64 or not), measured with
# dev/tools/compile_kernels.py over the benchmark cases and odd shapes, sm_80 and sm_90:
#   fwd 32-bit: 8 -> <= 63 registers (16 -> up to 128, and 8 B spills)
#   fwd float64: 4 -> <= 56 (8 -> up to 128)
#   bwd 32-bit: 4 -> <= 96 (8 -> up to 222; the old 2048-element tile: 255)
#   bwd float64: 2 -> <= 79 (4 -> up to 165; the old tile: 255 and up to 3.6 KB spills)
# so every planned launch stays <= 128 registers without spills (25% occupancy or more
# on sm_80/sm_90, where 255 registers gave 12.5%).
_ELEMS_PER_THREAD = {
    ("fwd", False): 8,
    ("fwd", True): 4,
    ("bwd", False): 4,
    ("bwd", True): 2,
}
# A narrow head_dim sizes the tile as if 8 wide: each sample also keeps ~20 registers of
# (BLOCK_Q, BLOCK_S) state (4 int64 corner offsets, masks, weights), which 4 channels
# would not pay for (head_dim 3 at 8x16 samples: 126 registers in the backward).
_MIN_TILE_D = 8
_NUM_WARPS = 4  # warps of a program whose tile is full; more only for wide head_dim
_MAX_NUM_WARPS = 16
_MAX_BLOCK_Q = 64


def _cuda_plan(dtype_name: str, shape: MSDAShape, index_dtype: str) -> Dict[str, KernelLaunch]:
    """``triton.py``: a program per (query block, head, batch), all on grid axis 0."""
    f64 = dtype_name == "float64"
    ptr = pointer_type(dtype_name)
    acc_ptr = "*fp64" if f64 else "*fp32"
    idx = _INDEX_TYPES[index_dtype]
    sizes = dict(num_keys=int_type(shape.num_keys), num_queries=int_type(shape.num_queries))
    signatures = kernel_signatures(ptr, idx, acc_ptr, sizes)
    block_d = next_power_of_2(shape.head_dim)
    samples = shape.num_levels * shape.num_points
    plans = {}
    for name, kernel in (("fwd", "msda_fwd_kernel"), ("bwd", "msda_bwd_kernel")):
        per_thread = _ELEMS_PER_THREAD[(name, f64)]
        tile = per_thread * 32 * _NUM_WARPS
        width = max(block_d, _MIN_TILE_D)
        block_s = min(next_power_of_2(samples), max(1, tile // width))
        block_q = min(
            _MAX_BLOCK_Q,
            max(1, tile // (block_s * width)),
            next_power_of_2(shape.num_queries),
        )
        elems = block_q * block_s * width
        # A tile wider than the budget (head_dim > tile) gets more warps, not more registers.
        num_warps = min(_MAX_NUM_WARPS, max(1, elems // (32 * per_thread)))
        programs = -(-shape.num_queries // block_q) * shape.num_heads * shape.batch
        if programs > MAX_GRID_X:
            raise ValueError(
                f"sampling_locations: {programs} (query block, head, batch) programs exceed "
                f"the grid limit {MAX_GRID_X}; split the batch"
            )
        plans[name] = KernelLaunch(
            module="triton",
            kernel=kernel,
            # Axis 0 takes up to 2**31 - 1 programs; axes 1 and 2 only 65535.
            grid=(programs, 1, 1),
            constexprs=dict(
                NUM_HEADS=shape.num_heads,
                HEAD_DIM=shape.head_dim,
                NUM_LEVELS=shape.num_levels,
                NUM_POINTS=shape.num_points,
                BLOCK_Q=block_q,
                BLOCK_S=block_s,
                BLOCK_D=block_d,
                F64=f64,
            ),
            signature=signatures[name],
            num_warps=num_warps,
            why=(
                f"{block_q}x{block_s}x{block_d} tile over {num_warps} warps: <= {per_thread} "
                f"elements a thread keeps {name} {'float64' if f64 else dtype_name} within "
                "128 registers without spills"
            ),
        )
    return plans


register_schedule("cuda", _cuda_plan)
