"""``tools/export.py`` on the BEV detector: a frame and the previous BEV in, boxes and the
next BEV out.

A BEV detector of the small synthetic config cut down (10x10 BEV, 1 encoder and 2 decoder
layers, 20 queries, the two-stage head with its history-velocity readout; random weights
whose class scores are spread) is saved as a checkpoint and exported by the tool traced at
batch 2 and 96x160 per camera. ONNX Runtime runs it over two consecutive frames, the second
fed the first's ``next_bev``, at batch 1 and 2 and two other image sizes; each frame must
give what ``BEVFormer.predict`` gives on the queue ending at it, and ``next_bev`` what
``obtain_bev`` gives. In the batch of 2 the second sample has no previous frame at frame 2.
The runtime tests are slow (two exports, 2-7 minutes on 2 cores); the eager graph's equality
with ``predict`` runs by default.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import pytest
import torch
from bev_util import ring_lidar2img
from mmdet.structures import DetDataSample
from mmengine.config import Config
from onnx_run_util import export_with_tool, op_types, run_onnx, spread_scores
from plugin_util import ROOT, build_model

from npudet.bev.models.temporal_self_attention import ego_motion
from npudet.deploy.bev_graph import BEVGraph
from npudet.deploy.detector import untied

BEV_CONFIG = os.path.join(ROOT, "configs/bev/bev-small_r18_synthetic.py")
EXPORT = (2, 96, 160)  # batch, height, width traced
RUNS = [(1, 80, 144), (2, 80, 144), (2, 112, 128)]  # other sizes, batch 1 and 2
ENCODER_LAYERS, DECODER_LAYERS = 1, 2
TOLERANCE = 1e-4


def tiny_config(tmp_path, extra: str = "") -> str:
    """The small BEV config on a 10x10 grid with 1 encoder and 2 decoder layers, 20 queries,
    no dropout, and the model's ``extra`` keyword arguments."""
    path = tmp_path / "tiny_bev.py"
    path.write_text(
        f"_base_ = [{BEV_CONFIG!r}]\n"
        "grid = dict(bev_h=10, bev_w=10, dropout=0.0)\n"
        f"model = dict(encoder=dict(grid, num_layers={ENCODER_LAYERS}),\n"
        f"             bbox_head=dict(grid, num_layers={DECODER_LAYERS}, num_queries=20),\n"
        f"             test_cfg=dict(max_per_img=20){extra})\n"
    )
    return str(path)


def tiny_model(tmp_path, extra: str = "") -> tuple:
    """The tiny config and its model (eval, spread scores)."""
    config = tiny_config(tmp_path, extra)
    model = build_model(Config.fromfile(config), seed=0).eval()
    spread_scores(model, 0.3, -1.0)
    return config, model


def pose(x: float, y: float, yaw: float) -> np.ndarray:
    """ego2global (4, 4) of an ego at global (x, y) heading ``yaw``."""
    m = np.eye(4)
    m[:2, :2] = [[np.cos(yaw), -np.sin(yaw)], [np.sin(yaw), np.cos(yaw)]]
    m[:2, 3] = x, y
    return m


def scene(batch: int, height: int, width: int, num_cams: int = 6) -> dict:
    """Two frames per sample: images (B, 2, N, 3, H, W) normalised-looking, lidar2img (2, N,
    4, 4) of a ring of cameras for the image size, ego2global (B, 2, 4, 4) far from the
    global origin (the ego drove 1.5-2.5 m and turned), prev_exists (B, 2): sample 1 has no
    previous frame at frame 2."""
    gen = torch.Generator().manual_seed(batch * 1000 + height)
    images = torch.randn(batch, 2, num_cams, 3, height, width, generator=gen)
    lidar2img = ring_lidar2img(num_cams, (height, width), focal=width / 2).numpy()
    ego = np.stack(
        [[pose(300.0 + b, -120.0, 0.4), pose(301.5 + b, -119.0, 0.45)] for b in range(batch)]
    )
    prev_exists = np.array([[False, b == 0] for b in range(batch)])
    return dict(images=images, lidar2img=np.stack([lidar2img] * 2), ego=ego, prev=prev_exists)


def reference(model: torch.nn.Module, frames: dict, count: int) -> list:
    """``BEVFormer.predict`` and ``obtain_bev`` on the queue of the first ``count`` frames:
    [(boxes (K, 9), scores, labels, bev (Q, C))] per sample, numpy."""
    images = frames["images"][:, :count]
    samples = [
        DetDataSample(
            metainfo=dict(
                img_shape=tuple(images.shape[-2:]),
                lidar2img=frames["lidar2img"][:count],
                ego2global=frames["ego"][b, :count],
                prev_exists=frames["prev"][b, :count],
            )
        )
        for b in range(images.shape[0])
    ]
    with torch.no_grad():
        bev = model.obtain_bev(images, samples)[0]
        results = [s.pred_instances_3d for s in model.predict(images, samples)]
    return [
        (r.bboxes_3d.numpy(), r.scores_3d.numpy(), r.labels_3d.numpy(), bev[b].numpy())
        for b, r in enumerate(results)
    ]


def graph_inputs(frames: dict, frame: int, prev_bev) -> dict:
    """The graph's inputs (numpy, by name) for ``frame`` (0 or 1) given the previous frame's
    ``next_bev`` (None at frame 0: zeros, every sample without a previous frame)."""
    images = frames["images"][:, frame]
    batch = images.shape[0]
    if prev_bev is None:
        prev_bev = np.zeros((batch, 100, 64), dtype=np.float32)
        cur2prev = np.tile(np.eye(4, dtype=np.float32), (batch, 1, 1))
    else:
        ego = torch.from_numpy(frames["ego"])
        cur2prev = ego_motion(ego[:, 1], ego[:, 0]).float().numpy()
    lidar2img = np.tile(frames["lidar2img"][frame], (batch, 1, 1, 1)).astype(np.float32)
    return dict(
        images=images.numpy(),
        lidar2img=lidar2img,
        prev_bev=prev_bev,
        cur2prev=cur2prev,
        prev_valid=frames["prev"][:, frame].copy(),
    )


def assert_matches(got, want) -> dict:
    """Per sample: boxes (metres, radians, m/s) and scores within TOLERANCE where scores are
    not tied, labels equal there, next_bev within TOLERANCE. The largest differences."""
    boxes, scores, labels, bev = got
    worst = dict(boxes=0.0, scores=0.0, bev=0.0)
    for i, (w_boxes, w_scores, w_labels, w_bev) in enumerate(want):
        keep = untied(w_scores)
        assert keep.mean() > 0.5, "too many tied scores to compare"
        diffs = dict(
            boxes=float(np.abs(boxes[i] - w_boxes)[keep].max()),
            scores=float(np.abs(scores[i] - w_scores).max()),
            bev=float(np.abs(bev[i] - w_bev).max()),
        )
        assert max(diffs.values()) <= TOLERANCE, diffs
        np.testing.assert_array_equal(labels[i][keep], w_labels[keep])
        worst = {k: max(worst[k], diffs[k]) for k in worst}
    return worst


def check_two_frames(model: torch.nn.Module, run, batch: int, height: int, width: int) -> dict:
    """``run(inputs)`` over frames 1 and 2 (fed frame 1's ``next_bev``) matches the model's
    predict on the queues ending at each; the largest differences."""
    frames = scene(batch, height, width)
    first = [np.asarray(t) for t in run(graph_inputs(frames, 0, None))]
    assert first[0].shape == (batch, 20, 9) and first[2].dtype == np.int64
    assert first[3].shape == (batch, 100, 64)
    want = reference(model, frames, 1)
    assert float(want[0][1].max() - want[0][1].min()) > 0.1  # scores are not all alike
    worst = assert_matches(first, want)
    second = [np.asarray(t) for t in run(graph_inputs(frames, 1, first[3]))]
    worst_second = assert_matches(second, reference(model, frames, 2))
    return {k: max(worst[k], worst_second[k]) for k in worst}


def export_tiny(tmp, fmt: str, msda_node: str = "gridsample") -> dict:
    """The tiny BEV detector exported by ``tools/export.py`` at ``EXPORT``
    (``export_with_tool``)."""
    config, model = tiny_model(tmp)
    return export_with_tool(config, model, tmp, fmt, msda_node, EXPORT)


@pytest.fixture(scope="module")
def bev(tmp_path_factory):
    """The tiny BEV detector and its plain ONNX export."""
    return export_tiny(tmp_path_factory.mktemp("export_bev"), "onnx")


@pytest.fixture(scope="module")
def bev_fused(tmp_path_factory):
    """The same detector exported with npudet's fused MSDA node."""
    return export_tiny(tmp_path_factory.mktemp("export_bev_fused"), "onnx", "npudet")


def msda_layers() -> int:
    """MSDA calls of the tiny model: TSA and SCA per encoder layer, one per decoder layer."""
    return 2 * ENCODER_LAYERS + DECODER_LAYERS


@pytest.mark.slow
def test_onnx_graph_is_plain_onnx_with_dynamic_batch_and_size(bev):
    graph = onnx.load(str(bev["out"]))
    onnx.checker.check_model(graph)
    assert {o.domain for o in graph.opset_import} <= {"", "ai.onnx"}
    dynamic = {
        v.name: [d.dim_param != "" for d in v.type.tensor_type.shape.dim] for v in graph.graph.input
    }
    assert dynamic == {
        "images": [True, False, False, True, True],  # B, N, 3, H, W
        "lidar2img": [True, False, False, False],
        "prev_bev": [True, False, False],
        "cur2prev": [True, False, False],
        "prev_valid": [True],
    }
    assert [o.name for o in graph.graph.output] == ["boxes", "scores", "labels", "next_bev"]


@pytest.mark.slow
@pytest.mark.parametrize("batch,height,width", RUNS)
def test_onnx_runtime_matches_pytorch_over_two_frames(bev, batch, height, width):
    run = lambda feeds: run_onnx(bev["out"], feeds)  # noqa: E731
    print("largest differences", check_two_frames(bev["model"], run, batch, height, width))


@pytest.mark.slow
def test_fused_node_graph_has_one_node_per_msda_layer(bev, bev_fused):
    graph = onnx.load(str(bev_fused["out"]))
    onnx.checker.check_model(graph, full_check=True)
    fused, plain = op_types(bev_fused["out"]), op_types(bev["out"])
    assert fused.count(("npudet", "MultiScaleDeformableAttn")) == msda_layers()
    # The GridSample nodes left are the history-velocity readout's (one per decoder layer);
    # the plain graph has those plus one per level of each MSDA layer (SCA: 2 levels).
    readouts = fused.count(("", "GridSample"))
    assert readouts == DECODER_LAYERS
    assert plain.count(("", "GridSample")) == readouts + msda_layers() + ENCODER_LAYERS


@pytest.mark.slow
@pytest.mark.parametrize("batch,height,width", RUNS)
def test_fused_node_runs_in_onnx_runtime_through_the_library(bev_fused, batch, height, width):
    from npudet.deploy import ort_library

    library = ort_library()
    run = lambda feeds: run_onnx(bev_fused["out"], feeds, library)  # noqa: E731
    print("largest differences", check_two_frames(bev_fused["model"], run, batch, height, width))


def test_graph_equals_predict_in_eager(tmp_path):
    """The graph's path (cameras unpacked, one frame at a time) against ``predict`` on the
    queues, same implementation, without an export; the previous BEV matters."""
    _, model = tiny_model(tmp_path)
    graph = BEVGraph(copy.deepcopy(model))

    def run(feeds):
        return graph(*(torch.from_numpy(feeds[n]) for n in graph.input_names))

    with torch.no_grad():
        worst = check_two_frames(model, run, 2, 96, 160)
        frames = scene(1, 96, 160)
        feeds = graph_inputs(frames, 1, run(graph_inputs(frames, 0, None))[3].numpy())
        with_prev = run(feeds)
        feeds["prev_valid"][:] = False
        without = run(feeds)
    assert max(worst.values()) <= 1e-5, worst
    assert (with_prev[3] - without[3]).abs().max() > 1e-2  # temporal self-attention


def test_without_temporal_every_frame_is_the_first(tmp_path):
    _, model = tiny_model(tmp_path, ", use_temporal=False")
    graph = BEVGraph(copy.deepcopy(model))
    frames = scene(1, 96, 160)
    with torch.no_grad():
        feeds = graph_inputs(frames, 1, np.random.rand(1, 100, 64).astype(np.float32))
        got = graph(*(torch.from_numpy(feeds[n]) for n in graph.input_names))
    assert_matches([t.numpy() for t in got], reference(model, frames, 2))


def test_graph_names_a_bad_family():
    with pytest.raises(TypeError, match="detector: expected npudet's BEVFormer, got Linear"):
        BEVGraph(torch.nn.Linear(2, 2))


@pytest.mark.slow
@pytest.mark.parametrize(
    "flavour,node",
    [("mmdeploy", "MMCVMultiScaleDeformableAttention"), ("npu", "MultiScaleDeformableAttn")],
)
def test_engine_flavours_keep_the_node_contract(tmp_path, flavour, node):
    """TensorRT and ATC cannot run here: their graphs hold one node per MSDA layer in the
    parser's domain/name, five inputs with int32 level inputs, and no GridSample but the
    history-velocity readout's."""
    exported = export_tiny(tmp_path, "onnx", flavour)
    graph = onnx.load(str(exported["out"]))
    onnx.checker.check_model(graph, full_check=True)
    nodes = [n for n in graph.graph.node if (n.domain, n.op_type) == (flavour, node)]
    assert len(nodes) == msda_layers() and all(len(n.input) == 5 for n in nodes)
    assert op_types(exported["out"]).count(("", "GridSample")) == DECODER_LAYERS
    inferred = onnx.shape_inference.infer_shapes(graph).graph
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.value_info}
    assert {types[n.input[i]] for n in nodes for i in (1, 2)} == {onnx.TensorProto.INT32}


@pytest.mark.slow
def test_aoti_package_matches_pytorch_through_the_cpp_runner(tmp_path):
    from npudet.deploy import aoti

    exported = export_tiny(tmp_path, "aoti")
    names = BEVGraph.input_names

    def run(feeds):
        return aoti.run_package(exported["out"], [torch.from_numpy(feeds[n]) for n in names])

    for size in RUNS:
        print("largest differences", size, check_two_frames(exported["model"], run, *size))
