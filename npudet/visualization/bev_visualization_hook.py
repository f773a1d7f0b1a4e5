"""BEVVisualizationHook: mmdet's DetVisualizationHook for the multi-camera BEV detector.

mmdet's hook reads one image per sample from ``data_sample.img_path``; a BEV sample has six
cameras and no such path. This one takes the camera images the batch already holds (the last
frame of ``inputs['imgs']``, (T, Ncam, 3, H, W) uint8) and gives them with the sample to the
visualizer (``BEVLocalVisualizer``); the options and their meaning are mmdet's.
"""

from __future__ import annotations

import os.path as osp
from typing import Any, Optional, Sequence

import numpy as np
from mmdet.engine.hooks import DetVisualizationHook
from mmdet.registry import HOOKS
from mmengine.runner import Runner
from mmengine.utils import mkdir_or_exist


def camera_images(data_batch: dict, index: int, bgr: bool) -> np.ndarray:
    """Sample ``index``'s current cameras (Ncam, H, W, 3) RGB uint8 from a batch whose
    ``inputs`` are per-sample dicts or a dict of per-sample lists (pseudo_collate)."""
    inputs = data_batch["inputs"]
    imgs = inputs[index]["imgs"] if isinstance(inputs, (list, tuple)) else inputs["imgs"][index]
    cams = np.asarray(imgs[-1]).transpose(0, 2, 3, 1)  # last frame: (Ncam, H, W, 3)
    return np.ascontiguousarray(cams[..., ::-1] if bgr else cams)


def _sample_name(sample: Any, fallback: int) -> str:
    idx = sample.metainfo.get("sample_idx", fallback)
    return f"{idx:06d}" if isinstance(idx, (int, np.integer)) else str(idx)


@HOOKS.register_module()
class BEVVisualizationHook(DetVisualizationHook):
    """Draws BEV samples in validation (the first of a batch every ``interval`` iterations) and
    test (every sample): ``test_out_dir`` (under WORK_DIR/TIMESTAMP/) receives
    ``SAMPLE_bev.png`` and ``SAMPLE_cameras.png``; without it the vis backends get them."""

    def before_test(self, runner: Runner) -> None:
        if self.draw and self.test_out_dir is not None:
            self.test_out_dir = osp.join(runner.work_dir, runner.timestamp, self.test_out_dir)
            mkdir_or_exist(self.test_out_dir)

    @staticmethod
    def _bgr(runner: Runner) -> bool:
        """The batch's images are BGR when the model's preprocessor flips them to RGB."""
        model = getattr(runner.model, "module", runner.model)
        return bool(getattr(model.data_preprocessor, "bgr_to_rgb", False))

    def after_val_iter(
        self, runner: Runner, batch_idx: int, data_batch: dict, outputs: Sequence[Any]
    ) -> None:
        if not self.draw:
            return
        step = runner.iter + batch_idx
        if step % self.interval == 0:
            self._visualizer.add_datasample(
                _sample_name(outputs[0], batch_idx) if self.show else "val_bev",
                camera_images(data_batch, 0, self._bgr(runner)),
                data_sample=outputs[0],
                show=self.show,
                wait_time=self.wait_time,
                pred_score_thr=self.score_thr,
                step=step,
            )

    def after_test_iter(
        self, runner: Runner, batch_idx: int, data_batch: dict, outputs: Sequence[Any]
    ) -> None:
        if not self.draw:
            return
        bgr = self._bgr(runner)
        for i, sample in enumerate(outputs):
            self._test_index += 1
            name = _sample_name(sample, self._test_index)
            out_file: Optional[str] = None
            if self.test_out_dir is not None:
                out_file = osp.join(self.test_out_dir, f"{name}.png")
            self._visualizer.add_datasample(
                name if self.show else "test_bev",
                camera_images(data_batch, i, bgr),
                data_sample=sample,
                show=self.show,
                wait_time=self.wait_time,
                out_file=out_file,
                pred_score_thr=self.score_thr,
                step=self._test_index,
            )
