"""The bilinear-sampling math both Triton MSDA schedules share (``triton.py`` for CUDA,
``triton_ascend.py`` for Ascend); where they differ (level lookup, floor, corner addresses,
gathers and atomics) stays in each schedule.

Semantics are ``grid_sample(bilinear, zeros, align_corners=False)``: a sample at (loc_x,
loc_y) of a level of H x W sits at ``x = loc_x * W - 0.5``, ``y = loc_y * H - 0.5`` and counts
when ``-1 <= x < W`` and ``-1 <= y < H`` (NaN/inf never do); its corners (y0,x0), (y0,x1),
(y1,x0), (y1,x1) weigh ``a (1-fy)(1-fx)``, ``a (1-fy) fx``, ``a fy (1-fx)``, ``a fy fx`` (``a``
the attention weight, ``fx = x - x0``); a corner off the map contributes nothing.

The helpers are inlined where they are called, and only what both schedules compute in the
same order is here: register allocation (CUDA) and UB plans (Ascend) follow the order of the
operations, so, e.g., the corner weights, which the CUDA kernels interleave with their row
loads, stay in each schedule.

Each schedule executes this file afresh by path when it is itself executed, never through
``import``: the schedules are loaded by path where npudet does not import (the Ascend
lowering worker) and a second time with the interpreter off (the CUDA compile check), and
these helpers must be decorated under the same ``TRITON_INTERPRET`` as the kernels calling
them. Imports only ``triton``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sample_points(
    loc,
    attn,
    qh,
    j,
    jmask,
    qmask,
    Hf,
    Wf,
    SAMPLES: tl.constexpr,
    OFF_MAP: tl.constexpr,
    ACC: tl.constexpr,
):
    """Samples ``j`` (BLOCK_S,) of the query rows ``qh`` (BLOCK_Q,) (query * heads + head),
    as (BLOCK_Q, BLOCK_S) tiles: the flat sample index ``s`` and its mask, x and y in pixels
    (``OFF_MAP`` where the sample does not count), the attention weight (0 there) and whether
    the sample counts. ``Hf``, ``Wf``: (1, BLOCK_S) the sample's level size in ``ACC``."""
    s = qh[:, None] * SAMPLES + j[None, :]
    smask = qmask[:, None] & jmask[None, :]
    x = tl.load(loc + 2 * s, mask=smask, other=0.0).to(ACC) * Wf - 0.5
    y = tl.load(loc + 2 * s + 1, mask=smask, other=0.0).to(ACC) * Hf - 0.5
    a = tl.load(attn + s, mask=smask, other=0.0).to(ACC)
    inside = smask & (x >= -1.0) & (y >= -1.0) & (x < Wf) & (y < Hf)
    x = tl.where(inside, x, OFF_MAP)
    y = tl.where(inside, y, OFF_MAP)
    a = tl.where(inside, a, 0.0)
    return s, smask, x, y, a, inside


@triton.jit
def corner_sides(inside, x0, y0, W, H):
    """(x_lo, x_hi, y_lo, y_hi): whether columns x0, x0 + 1 and rows y0, y0 + 1 lie on the
    map, the column tests false too where the sample does not count; corner (y0,x1) is valid
    where ``y_lo & x_hi``. Where a sample counts, x0 is in [-1, W-1] and y0 in [-1, H-1]: one
    test a side."""
    x_lo = inside & (x0 >= 0)
    x_hi = inside & (x0 + 1 < W)
    y_lo = y0 >= 0
    y_hi = y0 + 1 < H
    return x_lo, x_hi, y_lo, y_hi


@triton.jit
def store_sample_grads(
    grad_loc, grad_attn, s, smask, a, fx, fy, gx, gy, dot00, dot01, dot10, dot11, Hf, Wf
):
    """Stores each sample's attention-weight and location gradients from the dot products
    ``dot..`` of the output gradient with its corner rows (0 for a corner off the map)."""
    g_attn = gy * (gx * dot00 + fx * dot01) + fy * (gx * dot10 + fx * dot11)
    g_x = gy * (dot01 - dot00) + fy * (dot11 - dot10)
    g_y = gx * (dot10 - dot00) + fx * (dot11 - dot01)
    tl.store(grad_attn + s, g_attn, mask=smask)
    tl.store(grad_loc + 2 * s, a * g_x * Wf, mask=smask)
    tl.store(grad_loc + 2 * s + 1, a * g_y * Hf, mask=smask)
