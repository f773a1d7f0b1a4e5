"""``tools/export.py``: a trained-like Deformable DETR / DINO leaves PyTorch as one graph.

A small Deformable DETR (the shapes config with 1 encoder and 2 decoder layers, random
weights whose class scores are spread over (0, 1)) is saved as a checkpoint, exported by the
tool to ONNX traced at batch 2 and 128x160, and run in stock ONNX Runtime at batch 1 and 2 and
two other image sizes; it must give what mmdet's ``predict(rescale=False)`` gives on the same
images. The export path (level shapes as the maps' sizes, ``LevelPairsMixin``) must also equal
mmdet's own path exactly in eager mode, for both families.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from mmdet.structures import DetDataSample
from mmengine.config import Config
from onnx_run_util import export_with_tool, op_types, run_onnx, spread_scores
from plugin_util import SMALL_DETR, SMALL_DINO, build_model, tiny_config

from npudet.deploy.detector import DetectorGraph, example_images, untied
from npudet.deploy.export import export_onnx, main

EXPORT = (2, 128, 160)  # batch, height, width traced
RUNS = [(1, 96, 128), (2, 96, 128), (1, 160, 96), (2, 160, 96)]  # other sizes, batch 1 and 2


def reference(model: torch.nn.Module, images: torch.Tensor):
    """mmdet's ``predict`` on full images, no rescale: [(boxes, scores, labels)] per image."""
    h, w = images.shape[2:]
    meta = dict(img_shape=(h, w), batch_input_shape=(h, w), ori_shape=(h, w), scale_factor=(1, 1))
    samples = [DetDataSample(metainfo=meta) for _ in range(images.shape[0])]
    with torch.no_grad():
        results = model.predict(images, samples, rescale=False)
    return [
        (r.pred_instances.bboxes, r.pred_instances.scores, r.pred_instances.labels) for r in results
    ]


def assert_matches(got, want, height: int, width: int) -> dict:
    """Per image: boxes in normalised coordinates and scores within 1e-4, labels equal where
    scores are not tied. Returns the largest differences."""
    boxes, scores, labels = got
    scale = np.array([width, height, width, height], dtype=np.float32)
    worst = dict(boxes=0.0, scores=0.0)
    for i, (w_boxes, w_scores, w_labels) in enumerate(want):
        keep = untied(w_scores.numpy())
        assert keep.mean() > 0.5, "too many tied scores to compare"
        box_diff = np.abs(boxes[i] / scale - w_boxes.numpy() / scale)[keep].max()
        score_diff = np.abs(scores[i] - w_scores.numpy()).max()
        assert box_diff <= 1e-4 and score_diff <= 1e-4, (box_diff, score_diff)
        np.testing.assert_array_equal(labels[i][keep], w_labels.numpy()[keep])
        worst = dict(boxes=max(worst["boxes"], box_diff), scores=max(worst["scores"], score_diff))
    return worst


def export_tiny(tmp, base: str, fmt: str, msda_node: str = "gridsample") -> dict:
    """A tiny detector on config ``base`` exported by ``tools/export.py`` at ``EXPORT``
    (``export_with_tool``)."""
    config = tiny_config(tmp, base)
    model = build_model(Config.fromfile(config), seed=0).eval()
    spread_scores(model, 0.1, -2.0)  # top-50 scores over about 0.3..0.6 at the sizes tried
    return export_with_tool(config, model, tmp, fmt, msda_node, EXPORT)


@pytest.fixture(scope="module")
def detr(tmp_path_factory):
    """The tiny Deformable DETR and its ONNX export."""
    return export_tiny(tmp_path_factory.mktemp("export_detr"), SMALL_DETR, "onnx")


@pytest.fixture(scope="module")
def detr_fused(tmp_path_factory):
    """The same tiny Deformable DETR exported with npudet's fused MSDA node."""
    return export_tiny(tmp_path_factory.mktemp("export_fused"), SMALL_DETR, "onnx", "npudet")


def run_images(path, images: torch.Tensor, library=None):
    """ONNX Runtime on ``images``: [boxes, scores, labels] as numpy."""
    return run_onnx(path, {"images": images.numpy()}, library)


def check_size(exported: dict, run, batch: int, height: int, width: int) -> dict:
    """``run(images)`` matches mmdet's ``predict`` at one size; the largest differences."""
    images = example_images(batch, height, width, seed=batch * 1000 + height)
    got = [np.asarray(t) for t in run(images)]
    want = reference(exported["model"], images)
    assert got[0].shape == (batch, 50, 4) and got[2].dtype == np.int64
    assert float(want[0][1].max() - want[0][1].min()) > 0.1  # scores are not all alike
    return assert_matches(got, want, height, width)


def check_runs(exported: dict, run) -> None:
    """``run(images)`` matches mmdet's ``predict`` at every size of ``RUNS``."""
    for size in RUNS:
        check_size(exported, run, *size)


def test_onnx_graph_is_plain_onnx_with_dynamic_batch_and_size(detr):
    graph = onnx.load(str(detr["out"]))
    onnx.checker.check_model(graph)
    assert {o.domain for o in graph.opset_import} <= {"", "ai.onnx"}
    assert max(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) >= 16
    ops = [node.op_type for node in graph.graph.node]
    assert ops.count("GridSample") >= 4  # MSDA per level, as plain nodes
    dims = graph.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param != "" for d in dims] == [True, False, True, True]  # B, 3, H, W
    assert [o.name for o in graph.graph.output] == ["boxes", "scores", "labels"]


@pytest.mark.parametrize("batch,height,width", RUNS)
def test_onnx_runtime_matches_pytorch_at_other_sizes(detr, batch, height, width):
    check_size(detr, lambda images: run_images(detr["out"], images), batch, height, width)


def test_fused_node_graph_has_one_node_per_msda_layer(detr, detr_fused):
    graph = onnx.load(str(detr_fused["out"]))
    onnx.checker.check_model(graph, full_check=True)
    fused = op_types(detr_fused["out"]).count(("npudet", "MultiScaleDeformableAttn"))
    assert ("", "GridSample") not in op_types(detr_fused["out"])
    # The plain graph samples each level of each MSDA layer with one GridSample node.
    levels = Config.fromfile(detr["config"]).model.num_feature_levels
    assert fused > 0 and fused * levels == op_types(detr["out"]).count(("", "GridSample"))


@pytest.mark.parametrize("batch,height,width", RUNS)
def test_fused_node_runs_in_onnx_runtime_through_the_library(detr_fused, batch, height, width):
    from npudet.deploy import ort_library

    library = ort_library()
    run = lambda images: run_images(detr_fused["out"], images, library)  # noqa: E731
    check_size(detr_fused, run, batch, height, width)


@pytest.mark.slow
@pytest.mark.parametrize(
    "flavour,node",
    [("mmdeploy", "MMCVMultiScaleDeformableAttention"), ("npu", "MultiScaleDeformableAttn")],
)
def test_engine_flavours_keep_the_node_contract(tmp_path, flavour, node):
    """TensorRT and ATC cannot run here: their graphs hold one node per MSDA layer in the
    parser's domain/name, int32 level inputs, and no GridSample."""
    exported = export_tiny(tmp_path, SMALL_DETR, "onnx", flavour)
    graph = onnx.load(str(exported["out"]))
    onnx.checker.check_model(graph, full_check=True)
    nodes = [n for n in graph.graph.node if (n.domain, n.op_type) == (flavour, node)]
    layers = 1 + 2  # tiny_config: 1 encoder layer, 2 decoder layers, one MSDA each
    assert len(nodes) == layers and ("", "GridSample") not in op_types(exported["out"])
    assert all(len(n.input) == 5 for n in nodes)
    inferred = onnx.shape_inference.infer_shapes(graph).graph
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.value_info}
    assert {types[n.input[i]] for n in nodes for i in (1, 2)} == {onnx.TensorProto.INT32}


@pytest.mark.slow
def test_dino_onnx_matches_pytorch(tmp_path):
    exported = export_tiny(tmp_path, SMALL_DINO, "onnx")
    check_runs(exported, lambda images: run_images(exported["out"], images))


@pytest.mark.slow
def test_aoti_package_matches_pytorch_through_the_cpp_runner(tmp_path):
    from npudet.deploy import aoti

    exported = export_tiny(tmp_path, SMALL_DETR, "aoti")
    check_runs(exported, lambda images: aoti.run_package(exported["out"], [images]))


@pytest.mark.parametrize(
    "config,extra",
    [
        (SMALL_DETR, ""),
        # mmdet's plain Deformable DETR: learned queries, no proposals, no box refinement.
        (SMALL_DETR, ", as_two_stage=False, with_box_refine=False"),
        (SMALL_DINO, ""),
    ],
    ids=["deformable_detr", "deformable_detr_one_stage", "dino"],
)
def test_export_path_equals_mmdet_path_in_eager(tmp_path, config, extra):
    model = build_model(Config.fromfile(tiny_config(tmp_path, config, extra)), seed=0).eval()
    spread_scores(model, 0.1, -2.0)
    images = example_images(2, 96, 128, seed=5)
    with torch.no_grad():
        boxes, scores, labels = DetectorGraph(model)(images)
    for i, (w_boxes, w_scores, w_labels) in enumerate(reference(model, images)):
        torch.testing.assert_close(boxes[i], w_boxes, rtol=0, atol=1e-5)
        torch.testing.assert_close(scores[i], w_scores, rtol=0, atol=1e-6)
        assert torch.equal(labels[i], w_labels)


def test_export_names_a_bad_msda_node_and_family(detr, tmp_path):
    images = (example_images(*EXPORT),)
    with pytest.raises(ValueError, match=r"msda_node: expected one of .*gridsample.*, got 'trt'"):
        export_onnx(DetectorGraph(detr["model"]), images, tmp_path / "x", "trt")
    with pytest.raises(TypeError, match="detector: expected one of npudet's DeformableDETR"):
        DetectorGraph(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--format", "tflite"], "argument --format: invalid choice: 'tflite'"),
        (["--format", "onnx", "--shape", "32", "64"], "argument --shape: expected H and W >= 65"),
        (["--format", "onnx", "--batch", "1"], "argument --batch: expected >= 2"),
        (["--format", "aoti", "--msda-node", "npu"], "argument --msda-node: ONNX only"),
        (["--format", "onnx", "--missing"], "checkpoint: checkpoint not found"),
    ],
    ids=["unknown-format", "small-shape", "batch-1", "aoti-node", "missing-checkpoint"],
)
def test_cli_bad_arguments_are_one_line(detr, tmp_path, capsys, args, message):
    # In process: the tool itself runs in the detr fixture; this is its argument handling.
    checkpoint = str(tmp_path / "none.pth") if "--missing" in args else str(detr["checkpoint"])
    args = [a for a in args if a != "--missing"]
    with pytest.raises(SystemExit) as exit_info:
        main([detr["config"], checkpoint, *args, "--out", str(tmp_path / "m.onnx")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "m.onnx").exists()
