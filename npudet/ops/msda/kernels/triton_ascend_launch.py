"""``ascend`` launch plans for ``triton_ascend.py``: one program per AI vector core.

Registered as the ``ascend`` schedule of ``triton_launch.py`` (npu tensors, or any tensors
with ``NPUDET_TRITON_SCHEDULE=ascend``). The grid is ``(min(work items, cores), 1, 1)``,
never above 65535 programs; each program loops over its work items (batch, query block,
head). Block sizes keep every tile of a work item small enough that its live tiles fit in
half the 192 KB UB (the other half for double buffering): ``ascend_lowering.py`` measures
the live tiles on the lowered IR and the tests hold each planned launch to 96 KB.
"""

from __future__ import annotations

import functools
import sys
from typing import Dict

from .triton_launch import (
    KernelLaunch,
    MSDAShape,
    int_type,
    kernel_signatures,
    next_power_of_2,
    pointer_type,
    register_schedule,
)

# Ascend 910B3 (20 AI cores, 2 vector cores each), the target the compile checks lower for;
# used where no NPU is in use (interpreter tests, compile checks).
DEFAULT_VECTOR_CORES = 40
MAX_PROGRAMS = 65535  # triton-ascend's launcher refuses larger grids
# Elements of one (BLOCK_Q, BLOCK_S, DWIN) corner tile: 8 KB in float32. A work item keeps
# about 5 such tiles live (lowered IR: 37 KB forward, 30 KB backward at ddetr-enc).
TILE_ELEMS = 2048
# Rows a work item gathers per corner: each costs int64 offsets, masks and weights in UB and
# a copy descriptor, which dominate once rows are short (small head_dim).
MAX_ROWS = 64
# Short rows (head_dim below 32 bytes) carry (rows, window) masks and selects per corner; at 64
# rows bishengir-compile 1.2.0's PlanMemory ran for minutes on the backward (32 rows: 6 s).
MAX_ROWS_SHORT = 32
_MAX_BLOCK_Q = 64
# triton-adapter-opt 3.2.0 asserts on the backward with one-query tiles
# (InterleaveOptimization.cpp:635), so a tile always has at least two query rows.
MIN_BLOCK_Q = 2
_INDEX_TYPES = {"int64": "*i64", "int32": "*i32"}


@functools.cache
def _device_vector_cores(index: int) -> int:
    import torch

    props = torch.npu.get_device_properties(index)
    cores = int(getattr(props, "vector_core_num", 0) or 0)
    if cores <= 0:  # torch_npu builds without the field: ask triton-ascend's driver
        import triton

        utils = triton.runtime.driver.active.utils
        cores = int(utils.get_device_properties(index).get("num_vectorcore", 0))
    return cores if cores > 0 else DEFAULT_VECTOR_CORES


def vector_cores() -> int:
    """AI vector cores of the current NPU (torch_npu's device properties), else the default.

    Reads torch_npu only where it is already imported, so planning never imports torch.
    """
    if "torch_npu" not in sys.modules:
        return DEFAULT_VECTOR_CORES
    import torch

    if not torch.npu.is_available():
        return DEFAULT_VECTOR_CORES
    return _device_vector_cores(torch.npu.current_device())


# bishengir-compile copies a gathered row into UB with one DMA only from 32 bytes up; a shorter
# row becomes element copies, and a shorter atomic row scalar atomics (the HIVM compile check).
MIN_ROW_BYTES = 32
_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def window(head_dim: int, dtype_name: str = "float32", numel: int = 2**31) -> int:
    """Width of the power-of-two channel windows of rows of ``value`` (``numel`` elements).

    Rows of 32 bytes or more: head_dim itself, or the largest power of two below it (a
    non-power-of-two head_dim is covered by two overlapping windows, so no row copy reads past
    its row). Shorter rows: one 32-byte window (DWIN > head_dim), when ``value`` holds at least
    two such windows; else head_dim's exact windows (element copies, for tiny tensors only).
    See ``triton_ascend.py``.
    """
    short = MIN_ROW_BYTES // _ELEMENT_BYTES[dtype_name]
    if head_dim < short and numel >= 2 * short:
        return short
    pow2 = next_power_of_2(head_dim)
    return head_dim if pow2 == head_dim else pow2 // 2


def plan(dtype_name: str, shape: MSDAShape, index_dtype: str) -> Dict[str, KernelLaunch]:
    """Forward and backward launches of the Ascend-shaped kernels for one call.

    Raises ValueError for float64 (Ascend has no float64 arithmetic) and for calls with more
    than 2**31 - 1 work items.
    """
    if dtype_name == "float64":
        raise ValueError(
            "dtype: float64 is not supported on Ascend (no float64 arithmetic; triton-ascend "
            "refuses it); use float32"
        )
    ptr = pointer_type(dtype_name)
    idx = _INDEX_TYPES[index_dtype]
    numel = shape.batch * shape.num_keys * shape.num_heads * shape.head_dim
    dwin = window(shape.head_dim, dtype_name, numel)
    samples = shape.num_levels * shape.num_points
    rows = min(MAX_ROWS_SHORT if dwin > shape.head_dim else MAX_ROWS, max(1, TILE_ELEMS // dwin))
    block_s = min(next_power_of_2(samples), max(1, rows // MIN_BLOCK_Q))
    block_q = min(_MAX_BLOCK_Q, rows // block_s, next_power_of_2(shape.num_queries))
    block_q = max(MIN_BLOCK_Q, block_q)
    qblocks = -(-shape.num_queries // block_q)
    items = shape.batch * qblocks * shape.num_heads
    if items >= 2**31:
        raise ValueError(
            f"sampling_locations: {items} work items (batch x query blocks x heads) exceed "
            "2**31 - 1; split the batch"
        )
    cores = vector_cores()
    programs = min(items, cores, MAX_PROGRAMS)
    sizes = dict(
        num_keys=int_type(shape.num_keys),
        num_queries=int_type(shape.num_queries),
        batch=int_type(shape.batch),
    )
    signatures = kernel_signatures(ptr, idx, "*fp32", sizes)
    windows = 2 if dwin < shape.head_dim else 1
    why = (
        f"{items} work items (batch {shape.batch} x {qblocks} query blocks of {block_q} x "
        f"{shape.num_heads} heads) looped over {programs} programs = min(items, {cores} "
        f"vector cores); {block_q}x{block_s}x{dwin} corner tiles ({block_q * block_s * dwin * 4}"
        f" B in float32), head_dim {shape.head_dim} in {windows} window(s) of {dwin}; "
        "num_warps is unused by triton-ascend's vector kernels"
    )
    constexprs = dict(
        NUM_HEADS=shape.num_heads,
        HEAD_DIM=shape.head_dim,
        NUM_LEVELS=shape.num_levels,
        NUM_POINTS=shape.num_points,
        LEVELS_P2=next_power_of_2(shape.num_levels),
        BLOCK_Q=block_q,
        BLOCK_S=block_s,
        DWIN=dwin,
    )
    return {
        name: KernelLaunch(
            module="triton_ascend",
            kernel=kernel,
            grid=(programs, 1, 1),
            constexprs=dict(constexprs),
            signature=signatures[name],
            num_warps=1,
            why=why,
        )
        for name, kernel in (("fwd", "msda_fwd_kernel"), ("bwd", "msda_bwd_kernel"))
    }


register_schedule("ascend", plan)
