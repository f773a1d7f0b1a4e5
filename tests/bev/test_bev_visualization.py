"""The BEV detector's pictures: boxes land where the cameras' projection and the BEV scale say,
the hook writes both pictures per sample, and tools/test.py --show-dir drives it."""

from __future__ import annotations

import glob
import os
from types import SimpleNamespace
from typing import Tuple

import numpy as np
import pytest
import torch
from mmdet.registry import VISUALIZERS
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData

from npudet.bev.infos.synthetic import CAMERA_NAMES, camera_rigs
from npudet.visualization import BEVLocalVisualizer, BEVVisualizationHook

W, H = 320, 192
GT_RGB = (0, 170, 0)
CAR_RGB = (230, 25, 75)  # class 0 of DEFAULT_PALETTE
# a car 10 m ahead, 2 m left, heading along x, moving 3 m/s forward
PRED = [10.0, 2.0, 0.85, 1.9, 4.6, 1.7, 0.0, 3.0, 0.0]
GT = [-6.0, -4.0, 0.85, 1.9, 4.6, 1.7, 0.0, 0.0, 0.0]
# past the BEV picture's edge (25 m): it must not move the view
OUT_OF_RANGE = [-25.0, 0.0, 0.85, 1.9, 4.6, 1.7, 0.0, 0.0, 0.0]


def _lidar2img() -> np.ndarray:
    """(6, 4, 4) of the built-in set's cameras, written out here rather than by the code under
    test: K @ inv(cam2ego)."""
    rigs = camera_rigs(W, H)
    mats = []
    for name in CAMERA_NAMES:
        k4 = np.eye(4)
        k4[:3, :3] = rigs[name]["intrinsic"]
        mats.append(k4 @ np.linalg.inv(rigs[name]["cam2ego"]))
    return np.stack(mats)


def _sample() -> DetDataSample:
    sample = DetDataSample(
        metainfo=dict(lidar2img=_lidar2img()[None], cameras=list(CAMERA_NAMES), sample_idx=7)
    )
    sample.gt_instances_3d = InstanceData(
        bboxes_3d=torch.tensor([GT, OUT_OF_RANGE]), labels_3d=torch.tensor([0, 0])
    )
    sample.pred_instances_3d = InstanceData(
        bboxes_3d=torch.tensor([PRED, [5.0, -5.0, 0.85, 1.9, 4.6, 1.7, 0.0, 0.0, 0.0]]),
        labels_3d=torch.tensor([0, 0]),
        scores_3d=torch.tensor([0.9, 0.1]),  # the second is under the score threshold
    )
    return sample


def _has(img: np.ndarray, col: float, row: float, rgb: Tuple[int, int, int], r: int = 2) -> bool:
    """Is there a pixel within ``r`` of (col, row) whose colour is close to ``rgb``?"""
    c, w = int(col), int(row)
    patch = img[max(w - r, 0) : w + r + 1, max(c - r, 0) : c + r + 1].astype(int)
    return bool((np.abs(patch - np.array(rgb)).max(axis=-1) < 60).any())


def _visualizer(name: str) -> BEVLocalVisualizer:
    """Built through mmdet's registry; ``name``: a new one per test (mmengine keeps instances)."""
    vis = VISUALIZERS.build(
        dict(type="BEVLocalVisualizer", name=name, bev_range=25.0, bev_size=200)
    )
    vis.dataset_meta = dict(classes=("car", "truck", "pedestrian"))
    return vis


def test_boxes_land_where_the_projection_and_the_bev_scale_say() -> None:
    vis = _visualizer("bev_vis_boxes")
    sample = _sample()
    pred = sample.pred_instances_3d[sample.pred_instances_3d.scores_3d > 0.3]
    images = np.full((6, H, W, 3), 128, np.uint8)
    cams = vis.draw_cameras(images, sample.metainfo["lidar2img"][0], pred, CAMERA_NAMES)
    assert cams.shape == (2 * H, 3 * W, 3)
    # the box's 8 corners through CAM_FRONT (mosaic slot: row 0, column 1)
    x, y, z, w, ln, h = PRED[:6]
    corners = np.array(
        [
            [x + sx * ln / 2, y + sy * w / 2, z + sz * h / 2, 1.0]
            for sx in (-1, 1)
            for sy in (-1, 1)
            for sz in (-1, 1)
        ]
    )
    q = corners @ _lidar2img()[CAMERA_NAMES.index("CAM_FRONT")].T
    uv = q[:, :2] / q[:, 2:3]
    assert (q[:, 2] > 0).all() and (uv >= 0).all() and (uv[:, 0] < W).all() and (uv[:, 1] < H).all()
    for u, v in uv:
        assert _has(cams, W + u, v, CAR_RGB), (u, v)
    # not drawn beyond the box's image, nor on the other tiles
    assert not _has(cams, W + uv[:, 0].min() - 8, uv[:, 1].min() - 8, CAR_RGB, r=3)
    back_tile = cams[H:, W : 2 * W]  # CAM_BACK sees neither drawn box
    assert (np.abs(back_tile.astype(int) - 128).max(axis=-1) < 60).mean() > 0.95

    bev = vis.draw_bev(sample.gt_instances_3d, pred)
    scale = 200 / 50.0  # pixels per metre
    for box, rgb in ((PRED, CAR_RGB), (GT, GT_RGB)):
        for sx in (-1, 1):
            for sy in (-1, 1):
                cx, cy = box[0] + sx * box[4] / 2, box[1] + sy * box[3] / 2
                assert _has(bev, 100 - cy * scale, 100 - cx * scale, rgb), (box, sx, sy)
    # heading line (centre to the front) and the velocity arrow's tip, 3 m ahead of the centre
    assert _has(bev, 100 - PRED[1] * scale, 100 - (PRED[0] + 1.5) * scale, CAR_RGB)
    assert _has(bev, 100 - PRED[1] * scale, 100 - (PRED[0] + 3.0) * scale, CAR_RGB)
    # nothing of the predicted colour where the box under the threshold would be
    assert not _has(bev, 100 + 5.0 * scale, 100 - 5.0 * scale, CAR_RGB, r=4)


def test_hook_writes_the_bev_and_camera_pictures_of_each_sample(tmp_path) -> None:
    vis = _visualizer("bev_vis_hook")
    hook = BEVVisualizationHook(draw=True, test_out_dir="show")
    hook._visualizer = vis  # the hook takes the current instance; another test may have built one
    runner = SimpleNamespace(
        work_dir=str(tmp_path),
        timestamp="t0",
        model=SimpleNamespace(data_preprocessor=SimpleNamespace(bgr_to_rgb=True)),
    )
    # two frames of six BGR cameras; the current (last) frame's images are pure blue in BGR
    imgs = torch.zeros(2, 6, 3, H, W, dtype=torch.uint8)
    imgs[-1, :, 0] = 255
    batch = dict(inputs=dict(imgs=[imgs]), data_samples=[_sample()])  # pseudo_collate's layout
    hook.before_test(runner)
    hook.after_test_iter(runner, 0, batch, [_sample()])
    out = tmp_path / "t0" / "show"
    assert sorted(os.listdir(out)) == ["000007_bev.png", "000007_cameras.png"]
    import mmcv

    cams = mmcv.imread(str(out / "000007_cameras.png"), channel_order="rgb")
    assert cams.shape == (2 * H, 3 * W, 3)
    assert tuple(cams[H + H // 2, 5]) == (0, 0, 255)  # blue, shown as blue
    assert mmcv.imread(str(out / "000007_bev.png")).shape[:2] == (200, 200)


def test_without_an_out_file_the_vis_backends_get_both_pictures(tmp_path) -> None:
    """As TensorBoard would: mmengine's LocalVisBackend records NAME_bev and NAME_cameras."""
    vis = VISUALIZERS.build(
        dict(
            type="BEVLocalVisualizer",
            name="bev_vis_backends",
            vis_backends=[dict(type="LocalVisBackend")],
            save_dir=str(tmp_path),
        )
    )
    vis.add_datasample("val_bev", np.zeros((6, H, W, 3), np.uint8), _sample(), step=3)
    saved = sorted(os.listdir(tmp_path / "vis_data" / "vis_image"))
    assert saved == ["val_bev_bev_3.png", "val_bev_cameras_3.png"], saved


def test_bad_input_names_the_argument() -> None:
    vis = _visualizer("bev_vis_bad_input")
    with pytest.raises(ValueError, match="images"):
        vis.draw_cameras(np.zeros((6, H, W)), _lidar2img(), None)
    with pytest.raises(ValueError, match="lidar2img"):
        vis.draw_cameras(np.zeros((6, H, W, 3)), _lidar2img()[:5], None)
    with pytest.raises(ValueError, match="bev_range"):
        BEVLocalVisualizer(name="bad", bev_range=0)


@pytest.mark.slow
def test_tools_test_show_dir_writes_the_pictures_of_the_small_bev_config(tmp_path) -> None:
    from bev_util import tiny_bev_set
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from plugin_util import ROOT, run_tool

    import npudet.plugin  # noqa: F401

    config = os.path.join(ROOT, "configs", "bev", "bev-small_r18_synthetic.py")
    data_root = f"{tmp_path}/bev/"
    tiny_bev_set(data_root)
    init_default_scope("mmdet")
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(config).model)
    model.init_weights()
    ckpt = str(tmp_path / "untrained.pth")
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), ckpt)
    proc = run_tool(
        [
            "tools/test.py",
            config,
            ckpt,
            "--work-dir",
            str(tmp_path / "work"),
            "--show-dir",
            "show",
            "--cfg-options",
            f"test_dataloader.dataset.data_root={data_root}",
            "test_dataloader.dataset.indices=2",
            "default_hooks.visualization.score_thr=0.0",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = sorted(os.path.basename(p) for p in glob.glob(f"{tmp_path}/work/*/show/*.png"))
    assert written == [
        "000000_bev.png",
        "000000_cameras.png",
        "000001_bev.png",
        "000001_cameras.png",
    ], written
