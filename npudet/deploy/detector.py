"""A Deformable DETR / DINO detector as one traceable function: images in, detections out.

:class:`DetectorGraph` runs mmdet's ``predict`` path (backbone, neck, transformer, the last
decoder layer's head outputs, ``predict_by_feat``'s top-k over the sigmoid class scores and
cxcywh -> xyxy in pixels) on a batch of normalised, padded images, batched over the images,
with the level shapes taken from the feature maps (``forward_transformer(feats, None)``,
``npudet.models.detectors.level_pairs``): the batch and the image size stay dynamic.

It assumes every image fills the batch tensor (no padding within the batch: mmdet's masks
would be all valid), as ``predict`` does when each ``img_shape`` equals the batch's shape.
Left to the caller: decoding, resizing, normalising and padding the image (the data
preprocessor), scaling the boxes back to the original image (``predict``'s ``rescale``);
DETRs need no NMS.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import torch
from torch import Tensor, nn
from torch.export import Dim

from npudet.models.detectors import DINO, DeformableDETR

FAMILIES = (DeformableDETR, DINO)
# Two runs of one detector (eager and exported, say) may swap the detections of places whose
# scores tie in the top-k: they are held to agree only where a score is apart from both
# neighbours by more than TIE.
TIE = 1e-6
# The smallest image side the export accepts: every level of the 64x-strided pyramid keeps at
# least 2 cells a side (torch.export specializes a size that could be 1).
MIN_SIDE = 65


def size_dims(batch_max: int = 64, side_max: int = 4096) -> Dict[str, Dim]:
    """The dynamic sizes of an export's images: ``batch``, ``height`` and ``width``."""
    return dict(
        batch=Dim("batch", min=1, max=batch_max),
        height=Dim("height", min=MIN_SIDE, max=side_max),
        width=Dim("width", min=MIN_SIDE, max=side_max),
    )


def example_images(batch: int, height: int, width: int, seed: int = 0) -> Tensor:
    """(batch, 3, height, width) normalised-looking images to trace with."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, height, width, generator=gen)


class DetectorGraph(nn.Module):
    """``forward(images (B, 3, H, W) float32)`` -> boxes (B, N, 4) xyxy in the input's
    pixels (clamped to it), scores (B, N) float32 descending, labels (B, N) int64, with
    N = ``test_cfg.max_per_img``: mmdet's ``predict(..., rescale=False)`` per image."""

    input_names = ("images",)
    output_names = ("boxes", "scores", "labels")

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        if not isinstance(detector, FAMILIES):
            names = ", ".join(f.__name__ for f in FAMILIES)
            raise TypeError(
                f"detector: expected one of npudet's {names}, got {type(detector).__name__}"
            )
        if not detector.bbox_head.loss_cls.use_sigmoid:
            raise ValueError("detector: the export takes sigmoid class scores (focal loss)")
        self.detector = detector.eval()
        head = detector.bbox_head
        self.num_classes = head.num_classes
        self.max_per_img = int(head.test_cfg.get("max_per_img", detector.num_queries))

    def forward(self, images: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """images (B, 3, H, W) -> boxes (B, N, 4), scores (B, N), labels (B, N)."""
        feats = self.detector.extract_feat(images)
        head_inputs = self.detector.forward_transformer(feats, None)
        all_scores, all_boxes = self.detector.bbox_head(
            head_inputs["hidden_states"], head_inputs["references"]
        )
        # The last decoder layer, as predict_by_feat: (B, Q, classes), (B, Q, 4) cxcywh in [0, 1].
        logits, cxcywh = all_scores[-1], all_boxes[-1]
        scores, index = logits.sigmoid().flatten(1).topk(self.max_per_img, dim=1)
        labels = index % self.num_classes
        query = torch.div(index, self.num_classes, rounding_mode="floor")
        cxcywh = cxcywh.gather(1, query.unsqueeze(-1).expand(-1, -1, 4))
        return _to_pixels(cxcywh, images.shape[2], images.shape[3]), scores, labels

    def example_inputs(self, batch: int, height: int, width: int) -> Tuple[Tensor]:
        """The arguments to trace :meth:`forward` with: images (batch, 3, height, width)."""
        return (example_images(batch, height, width),)

    def dynamic_shapes(self) -> Tuple[Dict[int, Dim]]:
        """``torch.export``'s dynamic sizes of :meth:`forward`'s arguments: B, H, W."""
        dims = size_dims()
        return ({0: dims["batch"], 2: dims["height"], 3: dims["width"]},)


def _to_pixels(cxcywh: Tensor, height, width) -> Tensor:
    """(B, N, 4) normalised cxcywh -> xyxy in pixels of a (height, width) image, clamped to it
    (``predict_by_feat``'s scaling by ``img_shape``)."""
    cx, cy, w, h = cxcywh.unbind(-1)
    x1, y1, x2, y2 = cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h
    xs = (torch.stack((x1, x2), -1) * width).clamp(min=0, max=width)
    ys = (torch.stack((y1, y2), -1) * height).clamp(min=0, max=height)
    return torch.stack((xs[..., 0], ys[..., 0], xs[..., 1], ys[..., 1]), -1)


def untied(scores: np.ndarray) -> np.ndarray:
    """(N,) True where a score of ``scores`` (N,), sorted descending, is apart from both
    neighbours by more than :data:`TIE`."""
    gaps = np.abs(np.diff(scores)) > TIE
    return np.concatenate(([True], gaps)) & np.concatenate((gaps, [True]))
