"""A Deformable-DETR-sized transformer in plain torch, to time training iterations.

GPU machines without OpenMMLab cannot build mmdet's model, so this is mmdet 3.3's
``DeformableDetrTransformerEncoder`` / ``Decoder`` layers (post-norm; encoder: MSDA
self-attention + FFN; decoder: multi-head self-attention over the queries + MSDA
cross-attention + FFN; dropout 0.1) in torch around npudet's own MSDA layer,
:class:`npudet.nn.MSDeformAttn` (mmcv's module, parameters and initialisation, with no
OpenMMLab import), on multi-level features standing in for the backbone and neck. A class
and box head on every decoder layer (the auxiliary losses) closes the loss.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from npudet.nn import MSDeformAttn
from npudet.ops.msda import level_start_index


@dataclass(frozen=True)
class DDETRShape:
    """Model and input sizes; the default is Deformable DETR on an 800x1216 COCO batch."""

    image: Tuple[int, int] = (800, 1216)
    batch: int = 2
    dim: int = 256
    heads: int = 8
    levels: int = 4
    points: int = 4
    ffn: int = 1024
    encoder_layers: int = 6
    decoder_layers: int = 6
    queries: int = 300
    classes: int = 80

    def level_shapes(self) -> List[Tuple[int, int]]:
        """(H, W) of each level: strides 8, 16, 32, 64 with ceil rounding, as ResNet's."""
        shapes, (h, w) = [], self.image
        for _ in range(3):  # conv1, max-pool and layer2 halve it: C3 at stride 8
            h, w = math.ceil(h / 2), math.ceil(w / 2)
        for _ in range(self.levels):
            shapes.append((h, w))
            h, w = math.ceil(h / 2), math.ceil(w / 2)
        return shapes


# Small enough for a CPU in seconds: the dry run's model.
DRY_SHAPE = DDETRShape(
    image=(64, 96), dim=64, ffn=128, encoder_layers=2, decoder_layers=2, queries=20
)


def _attention(shape: DDETRShape, impl: str) -> MSDeformAttn:
    """npudet's MSDA module as mmdet's Deformable DETR configures it (batch first)."""
    return MSDeformAttn(
        shape.dim, shape.heads, shape.levels, shape.points, batch_first=True, impl=impl
    )


def _levels(reference: Tensor, shapes: Tensor, starts: Tensor) -> Dict[str, Tensor]:
    """The MSDA layer's level arguments, by mmcv's names."""
    return dict(reference_points=reference, spatial_shapes=shapes, level_start_index=starts)


class FFN(nn.Module):
    def __init__(self, shape: DDETRShape):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(shape.dim, shape.ffn),
            nn.ReLU(inplace=True),
            nn.Dropout(0.1),
            nn.Linear(shape.ffn, shape.dim),
            nn.Dropout(0.1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class EncoderLayer(nn.Module):
    """Post-norm: x = norm(x + msda(x + pos)); x = norm(x + ffn(x))."""

    def __init__(self, shape: DDETRShape, impl: str):
        super().__init__()
        self.attn, self.ffn = _attention(shape, impl), FFN(shape)
        self.norms = nn.ModuleList(nn.LayerNorm(shape.dim) for _ in range(2))

    def forward(self, x: Tensor, pos: Tensor, reference: Tensor, shapes: Tensor, starts: Tensor):
        """x, pos (bs, keys, dim); reference (bs, keys, levels, 2) -> (bs, keys, dim)."""
        # npudet's MSDA adds its query (``identity``) back: x + msda(x + pos)
        x = self.norms[0](self.attn(x, query_pos=pos, **_levels(reference, shapes, starts)))
        return self.norms[1](x + self.ffn(x))


class DecoderLayer(nn.Module):
    """Post-norm: self-attention over the queries, MSDA into the memory, FFN."""

    def __init__(self, shape: DDETRShape, impl: str):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(shape.dim, shape.heads, 0.1, batch_first=True)
        self.cross_attn, self.ffn = _attention(shape, impl), FFN(shape)
        self.norms = nn.ModuleList(nn.LayerNorm(shape.dim) for _ in range(3))

    def forward(self, q, pos, memory, reference, shapes, starts) -> Tensor:
        """q, pos (bs, queries, dim); memory (bs, keys, dim); reference (bs, queries, levels,
        2) -> (bs, queries, dim)."""
        qk = q + pos
        q = self.norms[0](q + self.self_attn(qk, qk, q, need_weights=False)[0])
        levels = _levels(reference, shapes, starts)
        q = self.norms[1](self.cross_attn(q, value=memory, query_pos=pos, **levels))
        return self.norms[2](q + self.ffn(q))


class DeformableTransformer(nn.Module):
    """Encoder, decoder and per-layer heads; ``forward`` returns the training loss."""

    def __init__(self, shape: DDETRShape, impl: str):
        super().__init__()
        self.shape = shape
        self.level_embed = nn.Parameter(torch.randn(shape.levels, shape.dim) * 0.02)
        self.encoder = nn.ModuleList(EncoderLayer(shape, impl) for _ in range(shape.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(shape, impl) for _ in range(shape.decoder_layers))
        self.query_embedding = nn.Embedding(shape.queries, 2 * shape.dim)
        self.reference_points = nn.Linear(shape.dim, 2)
        self.cls_head = nn.Linear(shape.dim, shape.classes)
        self.box_head = nn.Sequential(
            nn.Linear(shape.dim, shape.dim), nn.ReLU(), nn.Linear(shape.dim, 4)
        )

    def forward(self, batch: Dict[str, Tensor]) -> Tensor:
        """``make_batch``'s tensors -> a scalar loss (a stand-in for the matched losses:
        cross-entropy on the labels, L1 on the boxes, summed over the decoder layers)."""
        shapes, starts = batch["shapes"], batch["starts"]
        sizes = [h * w for h, w in self.shape.level_shapes()]
        level_pos = torch.cat([e.expand(n, -1) for e, n in zip(self.level_embed, sizes)])
        x, pos = batch["features"], batch["pos"] + level_pos
        reference = batch["encoder_reference"]
        for layer in self.encoder:
            x = layer(x, pos, reference, shapes, starts)
        bs = x.shape[0]
        query_pos, q = self.query_embedding.weight.expand(bs, -1, -1).split(self.shape.dim, -1)
        ref = self.reference_points(query_pos).sigmoid()
        ref = ref[:, :, None].expand(-1, -1, self.shape.levels, -1)
        loss = x.new_zeros(())
        for layer in self.decoder:
            q = layer(q, query_pos, x, ref, shapes, starts)
            logits = self.cls_head(q).flatten(0, 1)
            loss = loss + F.cross_entropy(logits, batch["labels"].flatten())
            loss = loss + F.l1_loss(self.box_head(q).sigmoid(), batch["boxes"])
        return loss


def encoder_reference(shape: DDETRShape, device: str) -> Tensor:
    """Every pixel's centre, normalised, seen from every level: (bs, keys, levels, 2)."""
    points = []
    for h, w in shape.level_shapes():
        ys, xs = torch.meshgrid(
            (torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij"
        )
        points.append(torch.stack((xs, ys), -1).reshape(-1, 2))
    ref = torch.cat(points)[None, :, None].expand(shape.batch, -1, shape.levels, -1)
    return ref.contiguous().to(device)


def make_batch(shape: DDETRShape, device: str, seed: int = 0) -> Dict[str, Tensor]:
    """Random multi-level features and positions (the backbone and neck's output, not
    trained), level shapes, reference points and random targets, on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    levels = shape.level_shapes()
    keys = sum(h * w for h, w in levels)
    b, q = shape.batch, shape.queries
    tensors = {
        "features": torch.randn(b, keys, shape.dim, generator=gen),
        "pos": torch.randn(b, keys, shape.dim, generator=gen),
        "shapes": torch.tensor(levels, dtype=torch.long),
        "starts": level_start_index(torch.tensor(levels, dtype=torch.long)),
        "labels": torch.randint(0, shape.classes, (b, q), generator=gen),
        "boxes": torch.rand(b, q, 4, generator=gen),
    }
    batch = {k: v.to(device) for k, v in tensors.items()}
    batch["encoder_reference"] = encoder_reference(shape, device)
    return batch


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(step: Callable[[], object], device: str, warmup: int, iters: int) -> List[float]:
    """Wall ms of ``iters`` calls of ``step``, each between two device syncs, after
    ``warmup`` untimed ones (the first compiles Triton kernels or a torch.compile graph)."""
    times = []
    for i in range(warmup + iters):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return times


def _summary(times: List[float], device: str) -> Dict[str, float]:
    summary = {"ms": statistics.median(times), "ms_min": min(times), "ms_max": max(times)}
    if device == "cuda":
        summary["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return summary


def time_training(
    impl: str, device: str, shape: DDETRShape = DDETRShape(), warmup: int = 3, iters: int = 10
) -> Dict[str, object]:
    """Median wall ms of a training iteration (forward, backward, gradient clipping at 0.1
    and an AdamW step, as Deformable DETR's config) with MSDA ``impl``; its spread, the
    first and last loss, and on CUDA the peak memory."""
    torch.manual_seed(0)
    model = DeformableTransformer(shape, impl).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=1e-4)
    batch = make_batch(shape, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses: List[float] = []

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = model(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()
        losses.append(loss.detach())

    times = _timed(step, device, warmup, iters)
    return {
        "impl": impl,
        **_summary(times, device),
        "iters": iters,
        "first_loss": losses[0].item(),
        "last_loss": losses[-1].item(),
        "params": sum(p.numel() for p in model.parameters()),
    }


def time_encoder_layer(
    impl: str,
    device: str,
    shape: DDETRShape = DDETRShape(),
    mode: Optional[str] = None,
    backend: str = "inductor",
    warmup: int = 3,
    iters: int = 10,
) -> Dict[str, object]:
    """Forward+backward ms of one encoder layer over the whole feature map (the
    ``ddetr-enc-coco`` MSDA call inside), eager, and compiled with ``torch.compile(mode,
    backend)`` unless ``backend`` is None; the compiled call's first-run seconds."""
    torch.manual_seed(0)
    layer = EncoderLayer(shape, impl).to(device)
    batch = make_batch(shape, device)
    args = (batch["features"], batch["pos"], batch["encoder_reference"])
    args += (batch["shapes"], batch["starts"])
    grad = torch.randn_like(batch["features"])
    result: Dict[str, object] = {"impl": impl, "mode": mode, "backend": backend}

    def step(fn: Callable[..., Tensor]) -> Callable[[], None]:
        def run() -> None:
            if mode == "reduce-overhead":  # a new iteration: CUDA-graph outputs may be reused
                torch.compiler.cudagraph_mark_step_begin()
            fn(*args).backward(grad)

        return run

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result["eager"] = _summary(_timed(step(layer), device, warmup, iters), device)
    if backend is None:
        return result
    compiled = torch.compile(layer, mode=mode, backend=backend)
    start = time.perf_counter()
    try:
        step(compiled)()
        _sync(device)
    except Exception as exc:  # that it does not compile is a result too
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
        return result
    result["compile_s"] = time.perf_counter() - start
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result["compiled"] = _summary(_timed(step(compiled), device, warmup, iters), device)
    result["speedup"] = result["eager"]["ms"] / result["compiled"]["ms"]
    return result
