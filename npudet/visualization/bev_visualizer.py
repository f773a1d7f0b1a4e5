"""BEVLocalVisualizer: the BEV plane and the camera images of one BEV detector sample.

Registered in mmdet's VISUALIZERS like mmdet's ``DetLocalVisualizer``, and drawn through
mmengine's ``Visualizer`` (``set_image`` + ``draw_*`` + ``get_image``), so ``add_datasample``
reaches every configured vis backend (local files, TensorBoard, ...) under the names
``NAME_bev`` and ``NAME_cameras``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import mmcv
import numpy as np
from mmdet.registry import VISUALIZERS
from mmengine.structures import InstanceData
from mmengine.visualization import Visualizer

from .box_geometry import bev_pixels, box_segments, corners, project_segments

# class colours of predictions (RGB), cycled; a dataset's metainfo ``palette`` replaces them
DEFAULT_PALETTE: Tuple[Tuple[int, int, int], ...] = (
    (230, 25, 75),
    (0, 110, 255),
    (255, 140, 0),
    (145, 30, 180),
    (0, 170, 170),
    (240, 50, 230),
)
# nuScenes' way to lay out its six cameras: the front row, then the back row
NUSCENES_LAYOUT: Tuple[Tuple[str, ...], ...] = (
    ("CAM_FRONT_LEFT", "CAM_FRONT", "CAM_FRONT_RIGHT"),
    ("CAM_BACK_LEFT", "CAM_BACK", "CAM_BACK_RIGHT"),
)
# a white backing that keeps legend text readable over grid lines and boxes
LABEL_BOX = dict(facecolor="white", alpha=0.8, pad=1, edgecolor="none")
EGO_LW = (4.5, 1.9)  # length, width (m) of the ego vehicle drawn at the centre


@VISUALIZERS.register_module()
class BEVLocalVisualizer(Visualizer):
    """Draws a BEV detector sample (``gt_instances_3d`` / ``pred_instances_3d``, bboxes_3d (N, 9)).

    Args:
        bev_range: metres from the ego (the centre) to each edge of the BEV picture.
        bev_size: side of the BEV picture in pixels.
        grid_step: metres between the BEV picture's grid lines (labelled on its edges).
        gt_color: RGB of ground-truth boxes; predictions take their class's colour.
        line_width: box line width in pixels.
        velocity_seconds: a velocity arrow ends where the box would be after this many seconds.
        camera_layout: rows of camera names for the camera mosaic; cameras it does not name
            (another rig) are laid out in the data's order, three to a row.
    """

    def __init__(
        self,
        name: str = "visualizer",
        vis_backends: Optional[List[dict]] = None,
        save_dir: Optional[str] = None,
        bev_range: float = 50.0,
        bev_size: int = 512,
        grid_step: float = 10.0,
        gt_color: Tuple[int, int, int] = (0, 170, 0),
        line_width: float = 2.0,
        velocity_seconds: float = 1.0,
        camera_layout: Sequence[Sequence[str]] = NUSCENES_LAYOUT,
    ) -> None:
        super().__init__(name=name, vis_backends=vis_backends, save_dir=save_dir)
        if bev_range <= 0 or bev_size <= 0 or grid_step <= 0:
            raise ValueError(
                f"bev_range, bev_size, grid_step: expected > 0, got {bev_range}, {bev_size}, "
                f"{grid_step}"
            )
        self.bev_range = float(bev_range)
        self.bev_size = int(bev_size)
        self.grid_step = float(grid_step)
        self.gt_color = tuple(gt_color)
        self.line_width = line_width
        self.velocity_seconds = velocity_seconds
        self.camera_layout = [list(row) for row in camera_layout]

    def class_colors(self, labels: np.ndarray) -> List[Tuple[int, int, int]]:
        """RGB colour per label (N,), from the dataset's ``palette`` or DEFAULT_PALETTE."""
        palette = (self.dataset_meta or {}).get("palette") or DEFAULT_PALETTE
        return [tuple(palette[int(i) % len(palette)]) for i in labels]

    def _class_names(self) -> List[str]:
        return list((self.dataset_meta or {}).get("classes") or [])

    def _set_canvas(self, image: np.ndarray) -> None:
        """``set_image``, the view held to the image: matplotlib would otherwise widen it at
        draw time to take in lines beyond the edge (a box past the BEV range), moving every
        pixel."""
        self.set_image(image)
        self.ax_save.set_xlim(0, image.shape[1])
        self.ax_save.set_ylim(image.shape[0], 0)

    # ---- the BEV plane ----------------------------------------------------------------------
    def _px(self, xy: np.ndarray) -> np.ndarray:
        return bev_pixels(xy, self.bev_range, self.bev_size)

    def _draw_grid(self) -> None:
        """Grid lines every ``grid_step`` metres, labelled in metres; x forward is up."""
        ticks = np.arange(0.0, self.bev_range, self.grid_step)
        ticks = np.concatenate([-ticks[:0:-1], ticks])
        r = self.bev_range
        fwd = self._px(np.stack([[[t, -r], [t, r]] for t in ticks]))  # x = t: a row
        side = self._px(np.stack([[[-r, t], [r, t]] for t in ticks]))  # y = t: a column
        lines = np.concatenate([fwd, side])
        self.draw_lines(lines[..., 0], lines[..., 1], colors=(215, 215, 215), line_widths=1)
        labels = [f"{t:g} m" for t in ticks]
        rows = fwd[:, 0, 1]
        cols = side[:, 0, 0]
        font = max(8, self.bev_size // 60)
        self.draw_texts(
            labels + labels,
            np.concatenate(
                [
                    np.stack([np.full_like(rows, 2.0), rows], 1),
                    np.stack([cols, np.full_like(cols, self.bev_size - 2.0)], 1),
                ]
            ),
            colors=(110, 110, 110),
            font_sizes=font,
            vertical_alignments=["center"] * len(rows) + ["bottom"] * len(cols),
            horizontal_alignments=["left"] * len(rows) + ["center"] * len(cols),
        )
        self.draw_texts(
            "x forward, y left, ego at the centre",
            np.array([self.bev_size - 4.0, 4.0]),
            colors=(110, 110, 110),
            font_sizes=font,
            vertical_alignments="top",
            horizontal_alignments="right",
            bboxes=LABEL_BOX,
        )

    def _draw_ego(self) -> None:
        ln, w = EGO_LW
        ego = np.array([0.0, 0.0, 0.0, w, ln, 1.5, 0.0, 0.0, 0.0])
        footprint = self._px(corners(ego[None])[0, :4, :2])
        self.draw_polygons(footprint, edge_colors=(0, 0, 0), face_colors=(60, 60, 60), alpha=1.0)
        self._draw_arrows(np.zeros((1, 2)), np.array([[ln, 0.0]]), (0, 0, 0))

    def _draw_arrows(self, start: np.ndarray, end: np.ndarray, colors, width: float = 1.5) -> None:
        """Arrows (N, 2) -> (N, 2) in metres: a shaft and two head strokes each."""
        if not len(start):
            return
        a, b = self._px(start), self._px(end)
        d = b - a
        n = np.linalg.norm(d, axis=1, keepdims=True)
        u = d / np.maximum(n, 1e-9)
        head = np.minimum(6.0, 0.4 * n)
        perp = np.stack([-u[:, 1], u[:, 0]], 1)
        left = b - head * (u - 0.5 * perp)
        right = b - head * (u + 0.5 * perp)
        segs = np.concatenate(
            [np.stack([a, b], 1), np.stack([b, left], 1), np.stack([b, right], 1)]
        )
        colors = colors if isinstance(colors[0], (int, float)) else list(colors) * 3
        self.draw_lines(segs[..., 0], segs[..., 1], colors=colors, line_widths=width)

    def _draw_bev_boxes(self, boxes: np.ndarray, colors: List[Tuple[int, int, int]]) -> None:
        """Footprints, a heading line (centre to the front face) and a velocity arrow per box."""
        if not len(boxes):
            return
        footprints = self._px(corners(boxes)[:, :4, :2])
        self.draw_polygons(list(footprints), edge_colors=colors, line_widths=self.line_width)
        centre = boxes[:, :2]
        yaw = boxes[:, 6]
        front = centre + 0.5 * boxes[:, 4:5] * np.stack([np.cos(yaw), np.sin(yaw)], 1)
        heading = self._px(np.stack([centre, front], 1))
        self.draw_lines(
            heading[..., 0], heading[..., 1], colors=colors, line_widths=self.line_width
        )
        moving = np.linalg.norm(boxes[:, 7:9], axis=1) > 0.2  # m/s; slower: no arrow
        if moving.any():
            end = centre + self.velocity_seconds * boxes[:, 7:9]
            self._draw_arrows(centre[moving], end[moving], [c for c, m in zip(colors, moving) if m])

    def _draw_legend(self, labels: np.ndarray, draw_gt: bool) -> None:
        names = self._class_names()
        texts, colors = (["ground truth"], [self.gt_color]) if draw_gt else ([], [])
        for label in np.unique(labels).astype(int):
            texts.append(names[label] if label < len(names) else f"class {label}")
            colors.append(self.class_colors(np.array([label]))[0])
        if not texts:
            return
        font = max(8, self.bev_size // 50)
        step = 1.4 * font
        positions = np.stack([np.full(len(texts), 4.0), 4.0 + step * np.arange(len(texts))], 1)
        self.draw_texts(texts, positions, colors=colors, font_sizes=font, bboxes=LABEL_BOX)

    def draw_bev(
        self,
        gt: Optional[InstanceData],
        pred: Optional[InstanceData],
    ) -> np.ndarray:
        """The BEV plane (bev_size, bev_size, 3) RGB: grid in metres, the ego at the centre,
        ``gt`` boxes in ``gt_color`` and ``pred`` boxes in class colours, each with a heading
        line and (moving) a velocity arrow. ``gt`` / ``pred``: bboxes_3d (N, 9), labels_3d."""
        self._set_canvas(np.full((self.bev_size, self.bev_size, 3), 255, np.uint8))
        with _lines_may_reach_the_edge():
            self._draw_grid()
            self._draw_ego()
            if gt is not None:
                boxes = _numpy(gt.bboxes_3d)
                self._draw_bev_boxes(boxes, [self.gt_color] * len(boxes))
            labels = np.zeros(0, int)
            if pred is not None:
                labels = _numpy(pred.labels_3d)
                self._draw_bev_boxes(_numpy(pred.bboxes_3d), self.class_colors(labels))
            self._draw_legend(labels, gt is not None)
        return self.get_image()

    # ---- the cameras ------------------------------------------------------------------------
    def mosaic_slots(self, cameras: Sequence[str]) -> List[Tuple[int, int]]:
        """(row, column) of each camera in the mosaic."""
        where = {n: (r, c) for r, row in enumerate(self.camera_layout) for c, n in enumerate(row)}
        if all(n in where for n in cameras):
            return [where[n] for n in cameras]
        return [(i // 3, i % 3) for i in range(len(cameras))]

    def draw_cameras(
        self,
        images: np.ndarray,
        lidar2img: np.ndarray,
        pred: Optional[InstanceData],
        cameras: Optional[Sequence[str]] = None,
    ) -> np.ndarray:
        """The camera images (Ncam, H, W, 3) RGB with ``pred``'s boxes (bboxes_3d (N, 9),
        labels_3d) projected by each camera's ``lidar2img`` (Ncam, 4, 4): 12 edges and a cross
        on the front face per box, in class colours; tiled by :meth:`mosaic_slots`."""
        images = np.asarray(images)
        if images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(f"images: expected (Ncam, H, W, 3), got {images.shape}")
        n, h, w = images.shape[:3]
        lidar2img = np.asarray(lidar2img, np.float64)
        if lidar2img.shape != (n, 4, 4):
            raise ValueError(f"lidar2img: expected ({n}, 4, 4), got {lidar2img.shape}")
        cameras = list(cameras) if cameras is not None else [f"camera {i}" for i in range(n)]
        slots = self.mosaic_slots(cameras)
        rows, cols = max(r for r, _ in slots) + 1, max(c for _, c in slots) + 1
        canvas = np.zeros((rows * h, cols * w, 3), np.uint8)
        for img, (r, c) in zip(images, slots):
            canvas[r * h : (r + 1) * h, c * w : (c + 1) * w] = img
        self._set_canvas(canvas)
        boxes = _numpy(pred.bboxes_3d) if pred is not None else np.zeros((0, 9))
        colors = self.class_colors(_numpy(pred.labels_3d)) if pred is not None else []
        segments = box_segments(boxes)
        per_box = len(segments) // max(len(boxes), 1)
        lines, line_colors = [], []
        for cam, (r, c) in enumerate(slots):
            uv, index = project_segments(segments, lidar2img[cam], (h, w))
            lines.append(uv + np.array([c * w, r * h]))
            line_colors += [colors[i // per_box] for i in index]
        if line_colors:
            xy = np.concatenate(lines)
            with _lines_may_reach_the_edge():
                self.draw_lines(
                    xy[..., 0], xy[..., 1], colors=line_colors, line_widths=self.line_width
                )
        font = max(8, h // 16)
        self.draw_texts(
            cameras,
            np.array([[c * w + 3.0, r * h + 3.0] for r, c in slots]),
            colors=(255, 255, 255),
            font_sizes=font,
            bboxes=[dict(facecolor="black", alpha=0.5, pad=1, edgecolor="none")] * n,
        )
        return self.get_image()

    # ---- mmengine's entry point -------------------------------------------------------------
    def add_datasample(
        self,
        name: str,
        image: np.ndarray,
        data_sample=None,
        draw_gt: bool = True,
        draw_pred: bool = True,
        show: bool = False,
        wait_time: float = 0,
        out_file: Optional[str] = None,
        pred_score_thr: float = 0.3,
        step: int = 0,
    ) -> None:
        """Draw the BEV plane and the cameras of ``data_sample`` (its ``lidar2img`` (T, Ncam,
        4, 4) metainfo, the last frame being the sample's), ``image`` = the cameras (Ncam, H, W,
        3) RGB uint8. Shown (``show``), written to ``STEM_bev.png`` / ``STEM_cameras.png`` next
        to ``out_file``, or else given to the vis backends as ``NAME_bev`` / ``NAME_cameras``."""
        data_sample = data_sample.cpu()
        gt = data_sample.get("gt_instances_3d") if draw_gt else None
        pred = data_sample.get("pred_instances_3d") if draw_pred else None
        if pred is not None:
            pred = pred[pred.scores_3d >= pred_score_thr]
        lidar2img = np.asarray(data_sample.metainfo["lidar2img"])
        drawn: Dict[str, np.ndarray] = {
            "bev": self.draw_bev(gt, pred),
            "cameras": self.draw_cameras(
                image,
                lidar2img[-1] if lidar2img.ndim == 4 else lidar2img,
                pred,
                data_sample.metainfo.get("cameras"),
            ),
        }
        for kind, img in drawn.items():
            if show:
                self.show(img, win_name=f"{name}_{kind}", wait_time=wait_time)
            if out_file is not None:
                stem = os.path.splitext(out_file)[0]
                mmcv.imwrite(img[..., ::-1], f"{stem}_{kind}.png")
            else:
                self.add_image(f"{name}_{kind}", img, step)


@contextlib.contextmanager
def _lines_may_reach_the_edge() -> Iterator[None]:
    """Lines that reach or cross the picture's edge (the grid, a box out of range, a segment
    cut at a camera's border) are cut there by matplotlib, as wanted; mmengine warns of each."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*out of bounds")
        yield


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
