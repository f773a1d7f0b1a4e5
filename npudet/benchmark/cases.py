"""MSDA shapes of real models, with sampling patterns like those of trained models.

``realistic``: every query has a reference point (its own pixel for encoders, a spread of
learned points for decoders) and each head samples along its own direction at distance
(point + 1) pixels of the level, the pattern mmcv's ``init_weights`` starts from, plus
small jitter; attention weights are a softmax over levels x points.
``uniform``: locations uniform in [0, 1] and random weights: a cache-hostile stress test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from npudet.ops.msda.kernels.triton_launch import MSDAShape
from npudet.ops.msda.levels import level_start_index

PATTERNS = ("realistic", "uniform")


@dataclass(frozen=True)
class MSDACase:
    """An MSDA call of a real model: shapes, and how its queries are placed."""

    name: str
    batch: int
    levels: Tuple[Tuple[int, int], ...]
    num_queries: int
    num_heads: int
    head_dim: int
    num_points: int
    encoder: bool  # queries are the pixels of the value map (self-attention)

    @property
    def num_keys(self) -> int:
        return sum(h * w for h, w in self.levels)

    def launch_shape(self) -> MSDAShape:
        """The sizes the Triton launch planner takes (``kernels.triton_launch``)."""
        return MSDAShape(
            self.batch,
            self.num_keys,
            self.num_queries,
            self.num_heads,
            self.head_dim,
            len(self.levels),
            self.num_points,
        )


_DDETR_LEVELS = ((64, 80), (32, 40), (16, 20), (8, 10))

CASES: Dict[str, MSDACase] = {
    c.name: c
    for c in (
        MSDACase("ddetr-enc", 2, _DDETR_LEVELS, 6800, 8, 32, 4, True),
        MSDACase("ddetr-dec", 2, _DDETR_LEVELS, 300, 8, 32, 4, False),
        MSDACase("dino-dec", 2, _DDETR_LEVELS, 1100, 8, 32, 4, False),
        MSDACase("bev-sca", 6, ((15, 25),), 2500, 8, 32, 8, False),
        MSDACase("bev-tsa", 2, ((50, 50),), 2500, 8, 32, 4, True),
    )
}

# The other mmdet models on MSDA, at the sizes of ``CASES`` (512x640): DDQ-DETR's decoder (900
# queries + 1350 dense + 200 denoising) and Mask2Former's pixel-decoder encoder (3 levels,
# every pixel a query). Named by tools/misc/check_device.py; not in ``launch_shapes`` (the compile
# checks' stored reports list ``CASES``).
MODEL_CASES: Dict[str, MSDACase] = {
    c.name: c
    for c in (
        MSDACase("ddq-dec", 2, _DDETR_LEVELS, 2450, 8, 32, 4, False),
        MSDACase("m2f-enc", 2, _DDETR_LEVELS[:3], 6720, 8, 32, 4, True),
    )
}

# Full training sizes, for accelerators (named, never in a default CPU list): Deformable DETR's
# encoder on an 800x1216 padded COCO batch of 2; BEVFormer-base's temporal self-attention (200x200
# BEV, previous and current stacked) and spatial cross-attention (6 cameras of 1600x900, 4 FPN
# levels, up to 10000 visible cells each, 2 points x 4 pillar heights).
LARGE_CASES: Dict[str, MSDACase] = {
    c.name: c
    for c in (
        MSDACase(
            "ddetr-enc-coco", 2, ((100, 152), (50, 76), (25, 38), (13, 19)), 20197, 8, 32, 4, True
        ),
        MSDACase("bev-tsa-base", 2, ((200, 200),), 40000, 8, 32, 4, True),
        MSDACase(
            "bev-sca-base", 6, ((116, 200), (58, 100), (29, 50), (15, 25)), 10000, 8, 32, 8, False
        ),
    )
}


def parse_case(spec: str) -> Tuple[MSDACase, str]:
    """'ddetr-enc' or 'ddetr-enc:uniform' (any of ``CASES``, ``MODEL_CASES`` or
    ``LARGE_CASES``) -> (case, pattern)."""
    name, _, pattern = spec.partition(":")
    pattern = pattern or "realistic"
    known = {**CASES, **MODEL_CASES, **LARGE_CASES}
    if name not in known:
        raise ValueError(f"--cases: unknown case {name!r}; expected one of {sorted(known)}")
    if pattern not in PATTERNS:
        raise ValueError(f"--cases: unknown pattern {pattern!r} in {spec!r}; expected {PATTERNS}")
    return known[name], pattern


def _reference_points(case: MSDACase, gen: torch.Generator) -> torch.Tensor:
    """(bs, num_queries, 2) reference points in [0, 1]."""
    if case.encoder:
        pts: List[torch.Tensor] = []
        for h, w in case.levels:
            ys, xs = torch.meshgrid(
                (torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij"
            )
            pts.append(torch.stack((xs, ys), -1).reshape(-1, 2))
        ref = torch.cat(pts)[: case.num_queries]
        return ref.unsqueeze(0).expand(case.batch, -1, -1).contiguous()
    return 0.05 + 0.9 * torch.rand(case.batch, case.num_queries, 2, generator=gen)


def make_inputs(
    case: MSDACase,
    pattern: str = "realistic",
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)."""
    gen = torch.Generator().manual_seed(seed)
    b, q, nh, d, p = case.batch, case.num_queries, case.num_heads, case.head_dim, case.num_points
    nl = len(case.levels)
    shapes = torch.tensor(case.levels, dtype=torch.long)
    starts = level_start_index(shapes)
    value = torch.randn(b, case.num_keys, nh, d, generator=gen)
    if pattern == "uniform":
        loc = torch.rand(b, q, nh, nl, p, 2, generator=gen)
        logits = torch.randn(b, q, nh, nl, p, generator=gen)
    else:
        ref = _reference_points(case, gen).view(b, q, 1, 1, 1, 2)
        angle = torch.arange(nh) * (2 * math.pi / nh)
        direction = torch.stack((angle.cos(), angle.sin()), -1)
        direction = direction / direction.abs().max(-1, keepdim=True).values
        steps = torch.arange(1, p + 1, dtype=torch.float32).view(1, p, 1)
        offset = direction.view(nh, 1, 1, 2) * steps  # (heads, 1, points, 2) pixels
        offset = offset + 0.5 * torch.randn(b, q, nh, nl, p, 2, generator=gen)
        wh = shapes.flip(-1).to(torch.float32).view(1, 1, 1, nl, 1, 2)
        loc = ref + offset / wh
        logits = 0.5 * torch.randn(b, q, nh, nl, p, generator=gen)
    attn = logits.view(b, q, nh, nl * p).softmax(-1).view(b, q, nh, nl, p)
    return (
        value.to(device=device, dtype=dtype),
        shapes.to(device),
        starts.to(device),
        loc.to(device=device, dtype=dtype),
        attn.to(device=device, dtype=dtype),
    )


def launch_shapes() -> Dict[str, MSDAShape]:
    """Case name -> ``launch_shape()`` of every case of ``CASES``."""
    return {name: case.launch_shape() for name, case in CASES.items()}
