"""The BEV detector as one traceable function: one frame and the previous BEV in, detections
and this frame's BEV out.

:class:`BEVGraph` runs ``BEVFormer.predict``'s path for the last frame of a queue (backbone,
neck, BEV encoder with temporal self-attention over the previous BEV, the head, its top-k
over the last decoder layer's sigmoid scores and the box decoding), batched, with the
previous frame as explicit inputs instead of a queue re-encoded from images: the caller
keeps the ``next_bev`` output of one frame and feeds it as ``prev_bev`` of the next, which
is what ``obtain_bev`` computes for a queue of two (and, frame after frame, the chain
BEVFormer's test-time ``prev_bev`` carries).

Spatial cross-attention runs unpacked (``SpatialCrossAttention.packed = False``): every
BEV cell in every camera, the ones a camera does not see masked, the same numbers at sizes
that do not depend on which cells a camera sees. The level shapes are the feature maps'
sizes, so the batch and the image size stay dynamic; the cameras, the BEV grid and the
channels are fixed by the model.

Left to the caller: decoding, resizing and normalising the images (``BEVDataPreprocessor``),
the ``lidar2img`` matrices of the input's pixels, the ego motion
``cur2prev = inv(ego2global_prev) @ ego2global`` in float64 (``ego_motion``; the graph
takes it as float32, as the model uses it), whether a previous frame exists
(``prev_exists``), and keeping ``next_bev`` for the next frame.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import Tensor, nn
from torch.export import Dim

from npudet.bev.models import BEVFormer, SpatialCrossAttention

from .detector import example_images, size_dims


class BEVGraph(nn.Module):
    """``forward(images, lidar2img, prev_bev, cur2prev, prev_valid)`` -> boxes, scores,
    labels, next_bev.

    Inputs: images (B, N, 3, H, W) float32 normalised; lidar2img (B, N, 4, 4) float32 into
    the input's pixels; prev_bev (B, Q, C) float32, the previous frame's ``next_bev``;
    cur2prev (B, 4, 4) float32, the current ego frame in the previous one; prev_valid (B,)
    bool, False where there is no previous frame (prev_bev and cur2prev are then ignored).
    Outputs: boxes (B, K, 9) (x, y, z, w, l, h, yaw, vx, vy) in the ego frame, scores (B, K)
    descending, labels (B, K) int64, next_bev (B, Q, C), with Q = bev_h * bev_w and
    K = ``test_cfg.max_per_img`` (at most queries x classes): ``BEVFormer.predict`` per sample.
    A model built with ``use_temporal=False`` treats every frame as the first. Wrapping
    puts the model in eval mode with its spatial cross-attention unpacked (both stay so).
    """

    input_names = ("images", "lidar2img", "prev_bev", "cur2prev", "prev_valid")
    output_names = ("boxes", "scores", "labels", "next_bev")

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        if not isinstance(detector, BEVFormer):
            raise TypeError(f"detector: expected npudet's BEVFormer, got {type(detector).__name__}")
        self.detector = detector.eval()
        for module in detector.modules():
            if isinstance(module, SpatialCrossAttention):
                module.packed = False  # fixed sizes: every cell in every camera, masked
        encoder = detector.encoder
        self.num_cams = encoder.cams_embeds.shape[0]
        self.bev_cells, self.embed_dims = encoder.bev_h * encoder.bev_w, encoder.embed_dims

    def forward(
        self,
        images: Tensor,
        lidar2img: Tensor,
        prev_bev: Tensor,
        cur2prev: Tensor,
        prev_valid: Tensor,
    ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """See the class; (B, K, 9), (B, K), (B, K), (B, Q, C)."""
        model, head = self.detector, self.detector.bbox_head
        # obtain_bev keeps no history without use_temporal: no sample has a previous frame.
        history = dict(
            prev_bev=prev_bev, cur2prev=cur2prev, prev_valid=prev_valid & model.use_temporal
        )
        img_shape = (images.shape[-2], images.shape[-1])
        bev = model.encoder(model.extract_feat(images), lidar2img, img_shape, **history)
        all_cls, all_codes = head(bev, **history)
        # The last decoder layer, as the head's predict: (B, nq, classes), (B, nq, 10).
        logits, codes = all_cls[-1], all_codes[-1]
        classes = logits.shape[2]
        k = min(head.test_cfg["max_per_img"], logits.shape[1] * classes)
        scores, index = logits.sigmoid().flatten(1).topk(k, dim=1)
        query = torch.div(index, classes, rounding_mode="floor")
        codes = codes.gather(1, query[..., None].expand(-1, -1, codes.shape[-1]))
        return head.coder.decode(codes), scores, index % classes, bev

    def example_inputs(self, batch: int, height: int, width: int) -> Tuple[Tensor, ...]:
        """The arguments to trace :meth:`forward` with (any values: no size depends on them):
        random images and previous BEV, identity cameras and ego motion, every sample with a
        previous frame."""
        n = self.num_cams
        images = example_images(batch * n, height, width).view(batch, n, 3, height, width)
        eye = torch.eye(4)
        return (
            images,
            eye.expand(batch, n, 4, 4).contiguous(),
            torch.randn(batch, self.bev_cells, self.embed_dims),
            eye.expand(batch, 4, 4).contiguous(),
            torch.ones(batch, dtype=torch.bool),
        )

    def dynamic_shapes(self) -> Tuple[Dict[int, Dim], ...]:
        """``torch.export``'s dynamic sizes of :meth:`forward`'s arguments: the batch of all
        five, the images' height and width."""
        dims = size_dims()
        batch = {0: dims["batch"]}
        return ({**batch, 3: dims["height"], 4: dims["width"]}, batch, batch, batch, batch)
