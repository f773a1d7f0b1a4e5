"""Triton MSDA kernels: a program owns (query block, head, batch) and all its samples.

A program walks the ``levels * points`` samples of its queries in chunks of
``BLOCK_S``: for each sample the 4 bilinear corners are computed in registers, their
D-contiguous value rows (value layout (bs, keys, heads, D)) are fetched with masked
gathers as one (BLOCK_Q, BLOCK_S, BLOCK_D) tile per corner, weighted and accumulated in
``ACC`` (float32, or float64 when ``F64``); nothing sampled is written to memory.
Backward recomputes the corners, adds the value gradient with ``tl.atomic_add`` into an
``ACC`` buffer and computes the location and attention-weight gradients in-program from
dot products of the output gradient with the corner rows.

Semantics are ``grid_sample(bilinear, zeros, align_corners=False)``, as in the CPU
kernel; the bilinear math this schedule shares with the Ascend one is ``triton_bilinear.py``.

Safety on every backend: the address of every corner, masked off or not, lies inside
``value`` (corner rows are clamped into ``[0, num_keys)``), because some compilers
(triton-ascend) read masked-off addresses and select afterwards; every offset that
multiplies a row count by ``heads * D`` is int64; the whole (query block, head, batch)
space is on grid axis 0 (2**31 - 1 programs; axes 1 and 2 take only 65535). Block
sizes and warps come from ``triton_launch.py``.

``triton.jit`` decides at decoration whether a kernel is compiled or interpreted
(``TRITON_INTERPRET=1``), so that is fixed when this module is first imported:
``INTERPRETED``.
"""

from __future__ import annotations

import importlib.util
import os

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# Executed afresh with this module, never imported (see its docstring).
_spec = importlib.util.spec_from_file_location(
    f"{__name__}_bilinear", os.path.join(os.path.dirname(__file__), "triton_bilinear.py")
)
bilinear = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bilinear)


@triton.jit
def _program(num_queries, NUM_HEADS: tl.constexpr, BLOCK_Q: tl.constexpr):
    """This program's rows (BLOCK_Q,) of (bs * num_queries), int64, their mask, head, batch.

    Rows past the last query repeat it (masked), so even their addresses stay in bounds.
    """
    pid = tl.program_id(0)
    q_blocks = tl.cdiv(num_queries, BLOCK_Q)
    bh = pid // q_blocks
    q = (pid - bh * q_blocks) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    h = bh % NUM_HEADS
    b = (bh // NUM_HEADS).to(tl.int64)
    return b * num_queries + tl.minimum(q, num_queries - 1), q < num_queries, h, b


@triton.jit
def _channels(HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Channel offsets (BLOCK_D,) and their mask; padded lanes repeat the last channel."""
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    if BLOCK_D != HEAD_DIM:
        # Only then: a clamped range hides the contiguity that vectorises the loads.
        d = tl.minimum(d, HEAD_DIM - 1)
    return d, dmask


@triton.jit
def _samples(
    shapes,
    starts,
    loc,
    attn,
    qh,
    j0,
    qmask,
    num_keys,
    ROW: tl.constexpr,
    SAMPLES: tl.constexpr,
    NUM_POINTS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    ACC: tl.constexpr,
):
    """Geometry of samples ``j0 .. j0 + BLOCK_S`` (of ``SAMPLES`` = levels * points) of a
    query block.

    ``qh`` (BLOCK_Q,): query * heads + head of each query of the block; ``ROW``: elements
    of a value row (heads * head_dim). Returns (BLOCK_Q, BLOCK_S) tensors: the flat sample
    index ``s`` (int64) and its mask, the int64 offsets (in elements, from this batch and
    head) of the corner rows (y0,x0), (y0,x1), (y1,x0), (y1,x1) and their masks, fx, fy,
    1 - fx, 1 - fy and the attention weight (0 where the sample does not count); then
    (1, BLOCK_S): H and W in ``ACC``.
    """
    j = j0 + tl.arange(0, BLOCK_S)
    jmask = j < SAMPLES
    if (SAMPLES) % BLOCK_S != 0:
        j = tl.minimum(j, SAMPLES - 1)  # padded samples repeat the last one
    lvl = j // NUM_POINTS
    H = tl.load(shapes + 2 * lvl).to(tl.int32)[None, :]
    W = tl.load(shapes + 2 * lvl + 1).to(tl.int32)[None, :]
    start = tl.load(starts + lvl).to(tl.int64)[None, :]
    Hf = H.to(ACC)
    Wf = W.to(ACC)
    # Samples that do not count (NaN/inf included) move off the map, to -2: no corner is valid.
    s, smask, x, y, a, inside = bilinear.sample_points(
        loc, attn, qh, j, jmask, qmask, Hf, Wf, SAMPLES, -2.0, ACC
    )
    xf = tl.floor(x)
    yf = tl.floor(y)
    x0 = xf.to(tl.int32)
    y0 = yf.to(tl.int32)
    x_lo, x_hi, y_lo, y_hi = bilinear.corner_sides(inside, x0, y0, W, H)
    # Masked-off corners (off the map, moved to -2, or the x1/y1 corners past the end of
    # the last level) still get a row inside value: clamped into [0, num_keys).
    k00 = start + y0.to(tl.int64) * W + x0
    last = num_keys - 1
    k01 = tl.minimum(tl.maximum(k00 + 1, 0), last)
    k10 = tl.minimum(tl.maximum(k00 + W, 0), last)
    k11 = tl.minimum(tl.maximum(k00 + W + 1, 0), last)
    k00 = tl.minimum(tl.maximum(k00, 0), last)
    fx = x - xf
    fy = y - yf
    return (
        s,
        smask,
        k00 * ROW,
        k01 * ROW,
        k10 * ROW,
        k11 * ROW,
        y_lo & x_lo,
        y_lo & x_hi,
        y_hi & x_lo,
        y_hi & x_hi,
        fx,
        fy,
        1.0 - fx,
        1.0 - fy,
        a,
        Hf,
        Wf,
    )


@triton.jit
def _corner_rows(value, o, m, d3, dmask, ACC: tl.constexpr):
    """(BLOCK_Q, BLOCK_S, BLOCK_D) value rows at offsets ``o`` in ``ACC``, 0 where ``m`` is off."""
    return tl.load(value + o[:, :, None] + d3, mask=m[:, :, None] & dmask, other=0.0).to(ACC)


@triton.jit
def _scatter_dot(value, grad_value, g, o, m, w, d3, dmask, ACC: tl.constexpr):
    """Adds ``w * g`` to the corner rows at offsets ``o`` (masked atomics); returns the
    (BLOCK_Q, BLOCK_S) dots ``g . row``. ``g``: (BLOCK_Q, 1, BLOCK_D) in ``ACC``."""
    o = o[:, :, None] + d3
    m = m[:, :, None] & dmask
    tl.atomic_add(grad_value + o, w[:, :, None] * g, mask=m, sem="relaxed")
    return tl.sum(g * tl.load(value + o, mask=m, other=0.0).to(ACC), axis=2)


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
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    F64: tl.constexpr,
):
    """out (bs, num_queries, heads * D) of one (query block, head, batch)."""
    ACC: tl.constexpr = tl.float64 if F64 else tl.float32
    row, qmask, h, b = _program(num_queries, NUM_HEADS, BLOCK_Q)
    d, dm = _channels(HEAD_DIM, BLOCK_D)
    dmask = dm[None, None, :]
    d3 = d[None, None, :]
    qh = row * NUM_HEADS + h
    base = value + (b * num_keys * NUM_HEADS + h) * HEAD_DIM
    acc = tl.zeros((BLOCK_Q, BLOCK_S, BLOCK_D), dtype=ACC)
    ROW: tl.constexpr = NUM_HEADS * HEAD_DIM
    SAMPLES: tl.constexpr = NUM_LEVELS * NUM_POINTS
    for j0 in range(0, SAMPLES, BLOCK_S):
        _, _, o00, o01, o10, o11, m00, m01, m10, m11, fx, fy, gx, gy, a, _, _ = _samples(
            shapes,
            starts,
            loc,
            attn,
            qh,
            j0,
            qmask,
            num_keys,
            ROW,
            SAMPLES,
            NUM_POINTS,
            BLOCK_S,
            ACC,
        )
        acc += (
            (a * gy * gx)[:, :, None] * _corner_rows(base, o00, m00, d3, dmask, ACC)
            + (a * gy * fx)[:, :, None] * _corner_rows(base, o01, m01, d3, dmask, ACC)
            + (a * fy * gx)[:, :, None] * _corner_rows(base, o10, m10, d3, dmask, ACC)
            + (a * fy * fx)[:, :, None] * _corner_rows(base, o11, m11, d3, dmask, ACC)
        )
    o = qh[:, None] * HEAD_DIM + d[None, :]
    tl.store(out + o, tl.sum(acc, axis=1), mask=qmask[:, None] & dm[None, :])


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
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_LEVELS: tl.constexpr,
    NUM_POINTS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    F64: tl.constexpr,
):
    """grad_value (atomic adds, ACC), grad_loc, grad_attn of one (query block, head, batch)."""
    ACC: tl.constexpr = tl.float64 if F64 else tl.float32
    row, qmask, h, b = _program(num_queries, NUM_HEADS, BLOCK_Q)
    d, dm = _channels(HEAD_DIM, BLOCK_D)
    dmask = dm[None, None, :]
    d3 = d[None, None, :]
    qh = row * NUM_HEADS + h
    o = qh[:, None] * HEAD_DIM + d[None, :]
    g = tl.load(grad_out + o, mask=qmask[:, None] & dm[None, :], other=0.0)
    g = g.to(ACC)[:, None, :]
    start_offset = (b * num_keys * NUM_HEADS + h) * HEAD_DIM
    base = value + start_offset
    gbase = grad_value + start_offset
    ROW: tl.constexpr = NUM_HEADS * HEAD_DIM
    SAMPLES: tl.constexpr = NUM_LEVELS * NUM_POINTS
    for j0 in range(0, SAMPLES, BLOCK_S):
        s, smask, o00, o01, o10, o11, m00, m01, m10, m11, fx, fy, gx, gy, a, Hf, Wf = _samples(
            shapes,
            starts,
            loc,
            attn,
            qh,
            j0,
            qmask,
            num_keys,
            ROW,
            SAMPLES,
            NUM_POINTS,
            BLOCK_S,
            ACC,
        )
        dot00 = _scatter_dot(base, gbase, g, o00, m00, a * gy * gx, d3, dmask, ACC)
        dot01 = _scatter_dot(base, gbase, g, o01, m01, a * gy * fx, d3, dmask, ACC)
        dot10 = _scatter_dot(base, gbase, g, o10, m10, a * fy * gx, d3, dmask, ACC)
        dot11 = _scatter_dot(base, gbase, g, o11, m11, a * fy * fx, d3, dmask, ACC)
        bilinear.store_sample_grads(
            grad_loc, grad_attn, s, smask, a, fx, fy, gx, gy, dot00, dot01, dot10, dot11, Hf, Wf
        )


INTERPRETED: bool = isinstance(msda_fwd_kernel, InterpretedFunction)
