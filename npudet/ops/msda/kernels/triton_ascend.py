"""Ascend-shaped Triton MSDA kernels (triton-ascend): persistent programs, row gathers, row atomics.

Same math as ``triton.py`` (``grid_sample(bilinear, zeros, align_corners=False)``; what both
share is ``triton_bilinear.py``), scheduled for Ascend AI vector cores, whose compiler
(triton-ascend 3.2) lowers a Triton tile op by op into Linalg and then into UB (on-chip buffer)
copies:

- **Persistent programs.** The grid is ``(min(num_items, cores),)``; program ``p`` loops over
  work items ``p, p + grid, ...``. A work item is (batch, block of ``BLOCK_Q`` queries, head),
  ``num_items = batch * cdiv(num_queries, BLOCK_Q) * heads``. Never more programs than cores,
  never more than 65535 (triton-ascend's launcher limit).
- **Level tables in UB, no gathered scalar loads.** H, W and the start key of every level are
  loaded once per program as three strided vectors; a sample's own H, W and start come from a
  one-hot reduction over levels (vector ops). Indexing ``shapes`` by the sample's level, as the
  CUDA kernel does, lowers to one scalar load per sample.
- **Clamped corners, unmasked D-contiguous row gathers.** triton-ascend turns a masked load
  into an unmasked load plus a select, so a mask never keeps an address from being read. Every
  corner's (x, y) is clamped into its level (and samples that don't count are moved to (0, 0)),
  so every gathered row lies inside ``value``; a corner that does not count gets weight 0 and its
  dot product is zeroed. A (rows, D) tile whose row offsets are data-dependent lowers to one
  contiguous copy of D elements per row into UB.
- **Power-of-two D windows, never narrower than 32 bytes.** A row copy always reads the tile's
  full width, even under a mask on D, and bishengir-compile turns a gathered row of fewer than 32
  bytes into element copies (and an atomic row into scalar atomics). Three cases, by ``DWIN``:
  ``DWIN == HEAD_DIM`` (a power of two of >= 32 bytes): one exact window. ``DWIN < HEAD_DIM``:
  two overlapping windows ``[0, DWIN)`` and ``[HEAD_DIM - DWIN, HEAD_DIM)``, ``DWIN`` the largest
  power of two below ``HEAD_DIM``; the second window's overlap is kept out of sums and gradients,
  its output columns in the overlap are recomputed bit-identically and stored again.
  ``DWIN > HEAD_DIM`` (short rows): a 32-byte window starting at the row, which also covers
  channels of the next rows; a window that would run past the end of ``value`` starts
  ``DWIN - HEAD_DIM`` elements before its row instead (the planner takes this case only when
  ``value`` holds at least ``2 * DWIN`` elements, so that start is never negative). Only the
  row's own channels are used; the others get exactly 0 added by the atomics.
- **Backward with whole-row atomics.** Each corner's value-gradient contribution is a
  (rows, DWIN) tile added with an *unmasked* ``tl.atomic_add`` at clamped rows (weight 0 where
  the corner does not count). triton-ascend lowers that to one atomic add of a D-contiguous row
  per sample; any mask that depends on the row (as in the CUDA kernel) makes it one scalar atomic
  add under an ``scf.if`` per element. Rows are the granularity Ascend's atomic-add copy to
  global memory works at; an owner-computes partition would need a key-sorted inverse index.

float16/bfloat16/float32 inputs, float32 arithmetic; grad_value is a float32 buffer. No float64
(Ascend has none; the launch planner refuses it). Imports only ``triton``: the lowering worker
(``ascend_lowering.py``) loads this file (and so ``triton_bilinear.py`` beside it) by path in an
environment with triton-ascend and without torch.
"""

from __future__ import annotations

import importlib.util
import os

import triton
import triton.language as tl

# Executed afresh with this module, never imported (see its docstring).
_spec = importlib.util.spec_from_file_location(
    f"{__name__}_bilinear", os.path.join(os.path.dirname(__file__), "triton_bilinear.py")
)
bilinear = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bilinear)


@triton.jit
def _level_tables(shapes, starts, NUM_LEVELS: tl.constexpr, LEVELS_P2: tl.constexpr):
    """(LEVELS_P2,) level index, H, W and start key (int32); padding levels are 1x1 at key 0."""
    lv = tl.arange(0, LEVELS_P2)
    lmask = lv < NUM_LEVELS
    H = tl.load(shapes + 2 * lv, mask=lmask, other=1).to(tl.int32)
    W = tl.load(shapes + 2 * lv + 1, mask=lmask, other=1).to(tl.int32)
    start = tl.load(starts + lv, mask=lmask, other=0).to(tl.int32)
    return lv, H, W, start


@triton.jit
def _floor_int(x):
    """floor(x) as int32, exact for |x| < 2**31 (truncation, minus 1 where it rounded up)."""
    t = x.to(tl.int32)
    return tl.where(t.to(tl.float32) > x, t - 1, t)


@triton.jit
def _materialized(key):
    """``key`` (BLOCK_Q, BLOCK_S) int32, through a reduction over a size-1 axis.

    triton-ascend's gather loop recomputes each row's address one row at a time from the
    nearest values it cannot trace further through elementwise ops. Without this it traces back
    to the sample's x and y (loading x, y, W, H and the level start and flooring per row); a
    reduction stops it, so each row loads its precomputed key (HIVM at ddetr-enc: about one
    scalar load per gathered row instead of five, for 4-12 more vector ops a work item).
    """
    return tl.sum(key[:, :, None] * tl.full((1, 1, 1), 1, tl.int32), axis=2)


@triton.jit
def _window_start(o, numel, HEAD_DIM: tl.constexpr, DWIN: tl.constexpr):
    """Short rows: (start of the DWIN-wide window read for the row at ``o``, whether it starts
    ``DWIN - HEAD_DIM`` before the row because it would otherwise run past ``numel``)."""
    tail = o + DWIN > numel
    return tl.where(tail, o - (DWIN - HEAD_DIM), o), tail


@triton.jit
def _work_item(w, num_queries, num_keys, NUM_HEADS: tl.constexpr, BLOCK_Q: tl.constexpr):
    """Work item ``w`` -> ((BLOCK_Q,) rows of (bs * num_queries), int64, and their mask, head
    h, and the row of (batch, key 0, h) in value seen as (rows, HEAD_DIM), int64)."""
    h = w % NUM_HEADS
    t = w // NUM_HEADS
    num_qblocks = tl.cdiv(num_queries, BLOCK_Q)
    b = (t // num_qblocks).to(tl.int64)
    q = (t % num_qblocks) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    qmask = q < num_queries
    return b * num_queries + q, qmask, h, b * num_keys * NUM_HEADS + h


@triton.jit
def _corners(
    loc,
    attn,
    lv,
    lvl_H,
    lvl_W,
    lvl_start,
    row,
    qmask,
    h,
    j0,
    base_row,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Samples ``j0 .. j0 + BLOCK_S`` of a work item's queries, as (BLOCK_Q, BLOCK_S) tiles.

    Returns the flat sample index and its mask; the element offsets (int64, into value) of
    the 4 corner rows (y0,x0), (y0,x1), (y1,x0), (y1,x1), clamped into the sample's level;
    their masks (the corner is on the map and the sample counts); the attention weight (0
    where the sample does not count); fx, fy; and (1, BLOCK_S) W, H as float32.
    ``base_row`` is the row index of (b, key 0, h) in value seen as (rows, HEAD_DIM).
    """
    j = j0 + tl.arange(0, BLOCK_S)
    jmask = j < NUM_LEVELS * NUM_POINTS
    lvl = tl.where(jmask, j // NUM_POINTS, 0)
    onehot = lvl[:, None] == lv[None, :]
    H = tl.sum(tl.where(onehot, lvl_H[None, :], 0), axis=1)[None, :]
    W = tl.sum(tl.where(onehot, lvl_W[None, :], 0), axis=1)[None, :]
    start = tl.sum(tl.where(onehot, lvl_start[None, :], 0), axis=1)[None, :]
    Hf = H.to(tl.float32)
    Wf = W.to(tl.float32)
    qh = row * NUM_HEADS + h
    # Samples that don't count (NaN/inf included) sit at (0, 0) with no valid corner.
    s, smask, x, y, a, inside = bilinear.sample_points(
        loc, attn, qh, j, jmask, qmask, Hf, Wf, NUM_LEVELS * NUM_POINTS, 0.0, tl.float32
    )
    # floor by truncation and a correction, not tl.floor: the gather loops recompute each row's
    # address from x and y element by element, and a floor there is a one-element vector op
    # (with its scalar/vector pipe synchronisation) per row; these are scalar instructions.
    x0 = _floor_int(x)
    y0 = _floor_int(y)
    xf = x0.to(tl.float32)
    yf = y0.to(tl.float32)
    # x0 is in [-1, W-1] and y0 in [-1, H-1]: clamping keeps every corner inside its level.
    x0c = tl.maximum(x0, 0)
    x1c = tl.minimum(x0 + 1, W - 1)
    y0c = start + tl.maximum(y0, 0) * W
    y1c = start + tl.minimum(y0 + 1, H - 1) * W
    x_lo, x_hi, y_lo, y_hi = bilinear.corner_sides(inside, x0, y0, W, H)
    return (
        s,
        smask,
        (base_row + _materialized(y0c + x0c).to(tl.int64) * NUM_HEADS) * HEAD_DIM,
        (base_row + _materialized(y0c + x1c).to(tl.int64) * NUM_HEADS) * HEAD_DIM,
        (base_row + _materialized(y1c + x0c).to(tl.int64) * NUM_HEADS) * HEAD_DIM,
        (base_row + _materialized(y1c + x1c).to(tl.int64) * NUM_HEADS) * HEAD_DIM,
        y_lo & x_lo,
        y_lo & x_hi,
        y_hi & x_lo,
        y_hi & x_hi,
        a,
        x - xf,
        y - yf,
        Wf,
        Hf,
    )


@triton.jit
def _bilinear(m00, m01, m10, m11, a, fx, fy):
    """(1 - fx, 1 - fy, and the weight of each corner row: attention x bilinear, 0 where
    the corner's mask is off), each (BLOCK_Q, BLOCK_S)."""
    gx = 1.0 - fx
    gy = 1.0 - fy
    w00 = tl.where(m00, a * gy * gx, 0.0)
    w01 = tl.where(m01, a * gy * fx, 0.0)
    w10 = tl.where(m10, a * fy * gx, 0.0)
    w11 = tl.where(m11, a * fy * fx, 0.0)
    return gx, gy, w00, w01, w10, w11


@triton.jit
def _blend(value, o00, o01, o10, o11, w00, w01, w10, w11, D0: tl.constexpr, DWIN: tl.constexpr):
    """(BLOCK_Q, DWIN) sum over samples of the weighted corner rows, channels D0 .. D0 + DWIN."""
    d = (D0 + tl.arange(0, DWIN))[None, None, :]
    v = tl.load(value + o00[:, :, None] + d).to(tl.float32) * w00[:, :, None]
    v += tl.load(value + o01[:, :, None] + d).to(tl.float32) * w01[:, :, None]
    v += tl.load(value + o10[:, :, None] + d).to(tl.float32) * w10[:, :, None]
    v += tl.load(value + o11[:, :, None] + d).to(tl.float32) * w11[:, :, None]
    return tl.sum(v, axis=1)


@triton.jit
def _blend_short(value, numel, o, w, acc_row, acc_tail, HEAD_DIM: tl.constexpr, DWIN: tl.constexpr):
    """Short rows, one corner: adds the weighted DWIN-wide windows to the accumulator of
    windows that start at their row (``acc_row``) or ``DWIN - HEAD_DIM`` before it
    (``acc_tail``), both (BLOCK_Q, DWIN)."""
    start, tail = _window_start(o, numel, HEAD_DIM, DWIN)
    c = tl.arange(0, DWIN)[None, None, :]
    v = tl.load(value + start[:, :, None] + c).to(tl.float32) * w[:, :, None]
    acc_row += tl.sum(tl.where(tail[:, :, None], 0.0, v), axis=1)
    acc_tail += tl.sum(tl.where(tail[:, :, None], v, 0.0), axis=1)
    return acc_row, acc_tail


@triton.jit
def _move_channels(t, SHIFT: tl.constexpr, DWIN: tl.constexpr):
    """(BLOCK_Q, DWIN) ``r[:, j] = t[:, j - SHIFT]`` (0 where that is outside the window), by
    selects, never multiplies, so no non-finite channel leaks into another."""
    c = tl.arange(0, DWIN)
    pick = c[None, :, None] + SHIFT == c[None, None, :]  # (1, from, to)
    return tl.sum(tl.where(pick, t[:, :, None], 0.0), axis=1)


@triton.jit
def _scatter_dot_short(
    grad_value, value, numel, g_row, g_tail, o, w, HEAD_DIM: tl.constexpr, DWIN: tl.constexpr
):
    """Short rows, one corner: adds ``w * g`` to the row's own channels of its window (0 to the
    others: one whole-window atomic) and returns the dot products ``g . row``.

    ``g_row``/``g_tail``: (BLOCK_Q, DWIN) the output gradient laid out as in a window that starts
    at the row / ``DWIN - HEAD_DIM`` before it, 0 elsewhere.
    """
    start, tail = _window_start(o, numel, HEAD_DIM, DWIN)
    c = tl.arange(0, DWIN)[None, None, :]
    t3 = tail[:, :, None]
    own = tl.where(t3, c >= DWIN - HEAD_DIM, c < HEAD_DIM)
    g = tl.where(t3, g_tail[:, None, :], g_row[:, None, :])
    tl.atomic_add(grad_value + start[:, :, None] + c, tl.where(own, w[:, :, None] * g, 0.0))
    v = tl.load(value + start[:, :, None] + c).to(tl.float32)
    return tl.sum(tl.where(own, g * v, 0.0), axis=2)


@triton.jit
def _scatter_dot(
    grad_value,
    value,
    g,
    o00,
    o01,
    o10,
    o11,
    w00,
    w01,
    w10,
    w11,
    D0: tl.constexpr,
    DWIN: tl.constexpr,
):
    """Adds ``w * g`` to each corner row (whole-row atomics); returns the 4 dots ``g . row``.

    g is (BLOCK_Q, DWIN), channels D0 .. D0 + DWIN, zero on channels another window owns.
    """
    d = (D0 + tl.arange(0, DWIN))[None, None, :]
    g3 = g[:, None, :]
    # No mask: a mask that depends on the row would turn each row atomic into per-element
    # scalar atomics; rows are in-bounds and corners that don't count add w = 0.
    tl.atomic_add(grad_value + o00[:, :, None] + d, w00[:, :, None] * g3)
    tl.atomic_add(grad_value + o01[:, :, None] + d, w01[:, :, None] * g3)
    tl.atomic_add(grad_value + o10[:, :, None] + d, w10[:, :, None] * g3)
    tl.atomic_add(grad_value + o11[:, :, None] + d, w11[:, :, None] * g3)
    dot00 = tl.sum(g3 * tl.load(value + o00[:, :, None] + d).to(tl.float32), axis=2)
    dot01 = tl.sum(g3 * tl.load(value + o01[:, :, None] + d).to(tl.float32), axis=2)
    dot10 = tl.sum(g3 * tl.load(value + o10[:, :, None] + d).to(tl.float32), axis=2)
    dot11 = tl.sum(g3 * tl.load(value + o11[:, :, None] + d).to(tl.float32), axis=2)
    return dot00, dot01, dot10, dot11


@triton.jit
def msda_fwd_kernel(
    value,
    shapes,
    starts,
    loc,
    attn,
    out,
    num_keys,
    num_queries,
    batch,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr,
    LEVELS_P2: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DWIN: tl.constexpr,
):
    """out (bs, num_queries, heads * D): each program loops over its work items."""
    lv, lvl_H, lvl_W, lvl_start = _level_tables(shapes, starts, NUM_LEVELS, LEVELS_P2)
    dw = tl.arange(0, DWIN)
    numel = batch.to(tl.int64) * num_keys * (NUM_HEADS * HEAD_DIM)
    num_items = batch * tl.cdiv(num_queries, BLOCK_Q) * NUM_HEADS
    for w in range(tl.program_id(0), num_items, tl.num_programs(0)):
        row, qmask, h, base_row = _work_item(w, num_queries, num_keys, NUM_HEADS, BLOCK_Q)
        acc0 = tl.zeros((BLOCK_Q, DWIN), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_Q, DWIN), dtype=tl.float32)
        for j0 in range(0, NUM_LEVELS * NUM_POINTS, BLOCK_S):
            s, smask, o00, o01, o10, o11, m00, m01, m10, m11, a, fx, fy, Wf, Hf = _corners(
                loc,
                attn,
                lv,
                lvl_H,
                lvl_W,
                lvl_start,
                row,
                qmask,
                h,
                j0,
                base_row,
                NUM_HEADS,
                HEAD_DIM,
                NUM_LEVELS,
                NUM_POINTS,
                BLOCK_S,
            )
            _, _, w00, w01, w10, w11 = _bilinear(m00, m01, m10, m11, a, fx, fy)
            if DWIN > HEAD_DIM:  # short rows: acc0 / acc1 sum windows at / before their rows
                acc0, acc1 = _blend_short(value, numel, o00, w00, acc0, acc1, HEAD_DIM, DWIN)
                acc0, acc1 = _blend_short(value, numel, o01, w01, acc0, acc1, HEAD_DIM, DWIN)
                acc0, acc1 = _blend_short(value, numel, o10, w10, acc0, acc1, HEAD_DIM, DWIN)
                acc0, acc1 = _blend_short(value, numel, o11, w11, acc0, acc1, HEAD_DIM, DWIN)
            else:
                acc0 += _blend(value, o00, o01, o10, o11, w00, w01, w10, w11, 0, DWIN)
            if DWIN < HEAD_DIM:
                acc1 += _blend(value, o00, o01, o10, o11, w00, w01, w10, w11, HEAD_DIM - DWIN, DWIN)
        o = (row * NUM_HEADS + h)[:, None] * HEAD_DIM + dw[None, :]
        if DWIN > HEAD_DIM:
            acc0 += _move_channels(acc1, HEAD_DIM - DWIN, DWIN)
            tl.store(out + o, acc0, mask=qmask[:, None] & (dw < HEAD_DIM)[None, :])
        else:
            tl.store(out + o, acc0, mask=qmask[:, None])
        if DWIN < HEAD_DIM:
            # Overlapping channels get the same sums again, bit for bit.
            tl.store(out + o + (HEAD_DIM - DWIN), acc1, mask=qmask[:, None])


@triton.jit
def msda_bwd_kernel(
    grad_out,
    value,
    shapes,
    starts,
    loc,
    attn,
    grad_value,
    grad_loc,
    grad_attn,
    num_keys,
    num_queries,
    batch,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr,
    LEVELS_P2: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DWIN: tl.constexpr,
):
    """grad_value (float32, row atomics), grad_loc, grad_attn; programs loop over work items."""
    lv, lvl_H, lvl_W, lvl_start = _level_tables(shapes, starts, NUM_LEVELS, LEVELS_P2)
    dw = tl.arange(0, DWIN)
    numel = batch.to(tl.int64) * num_keys * (NUM_HEADS * HEAD_DIM)
    num_items = batch * tl.cdiv(num_queries, BLOCK_Q) * NUM_HEADS
    for w in range(tl.program_id(0), num_items, tl.num_programs(0)):
        row, qmask, h, base_row = _work_item(w, num_queries, num_keys, NUM_HEADS, BLOCK_Q)
        o = (row * NUM_HEADS + h)[:, None] * HEAD_DIM + dw[None, :]
        if DWIN > HEAD_DIM:
            # Short rows: g0 / g1 as a window at / DWIN - HEAD_DIM before the row sees them.
            gmask = qmask[:, None] & (dw < HEAD_DIM)[None, :]
            g0 = tl.load(grad_out + o, mask=gmask, other=0.0).to(tl.float32)
            g1 = _move_channels(g0, DWIN - HEAD_DIM, DWIN)
        else:
            g0 = tl.load(grad_out + o, mask=qmask[:, None], other=0.0).to(tl.float32)
            g1 = g0
        if DWIN < HEAD_DIM:
            # The second window leaves the channels the first one covers to it.
            g1 = tl.load(grad_out + o + (HEAD_DIM - DWIN), mask=qmask[:, None], other=0.0)
            g1 = tl.where((dw >= 2 * DWIN - HEAD_DIM)[None, :], g1.to(tl.float32), 0.0)
        for j0 in range(0, NUM_LEVELS * NUM_POINTS, BLOCK_S):
            s, smask, o00, o01, o10, o11, m00, m01, m10, m11, a, fx, fy, Wf, Hf = _corners(
                loc,
                attn,
                lv,
                lvl_H,
                lvl_W,
                lvl_start,
                row,
                qmask,
                h,
                j0,
                base_row,
                NUM_HEADS,
                HEAD_DIM,
                NUM_LEVELS,
                NUM_POINTS,
                BLOCK_S,
            )
            gx, gy, w00, w01, w10, w11 = _bilinear(m00, m01, m10, m11, a, fx, fy)
            if DWIN > HEAD_DIM:
                dot00 = _scatter_dot_short(
                    grad_value, value, numel, g0, g1, o00, w00, HEAD_DIM, DWIN
                )
                dot01 = _scatter_dot_short(
                    grad_value, value, numel, g0, g1, o01, w01, HEAD_DIM, DWIN
                )
                dot10 = _scatter_dot_short(
                    grad_value, value, numel, g0, g1, o10, w10, HEAD_DIM, DWIN
                )
                dot11 = _scatter_dot_short(
                    grad_value, value, numel, g0, g1, o11, w11, HEAD_DIM, DWIN
                )
            else:
                dot00, dot01, dot10, dot11 = _scatter_dot(
                    grad_value, value, g0, o00, o01, o10, o11, w00, w01, w10, w11, 0, DWIN
                )
            if DWIN < HEAD_DIM:
                e00, e01, e10, e11 = _scatter_dot(
                    grad_value,
                    value,
                    g1,
                    o00,
                    o01,
                    o10,
                    o11,
                    w00,
                    w01,
                    w10,
                    w11,
                    HEAD_DIM - DWIN,
                    DWIN,
                )
                dot00 += e00
                dot01 += e01
                dot10 += e10
                dot11 += e11
            # A corner off the map contributes no dot product (its clamped row was read).
            dot00 = tl.where(m00, dot00, 0.0)
            dot01 = tl.where(m01, dot01, 0.0)
            dot10 = tl.where(m10, dot10, 0.0)
            dot11 = tl.where(m11, dot11, 0.0)
            bilinear.store_sample_grads(
                grad_loc, grad_attn, s, smask, a, fx, fy, gx, gy, dot00, dot01, dot10, dot11, Hf, Wf
            )
