"""A trained small Deformable DETR leaves PyTorch with its accuracy (slow: 10-25 minutes).

The model is the main job's (the small config, 4 epochs on the built-in shapes set): the
checkpoint ``bash tools/main_job.sh`` left in ``work_dirs/main_job``, or trained here by the
same recipe when there is none;
``tools/test.py`` scores it in PyTorch on the val split with ``grid_sample`` (the graph's math);
``tools/export.py`` writes it as plain ONNX and with npudet's fused node, and
``tools/deployment/eval_export.py`` scores each in ONNX Runtime through the config's own data
pipeline and evaluator. The bbox AP must stay within 0.005, and on val images the trained model's
boxes and scores must match PyTorch within 1e-4.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from plugin_util import ROOT, SMALL_DETR, data_options, main_job_checkpoint, run_tool
from test_export_detector import assert_matches, reference

from npudet.datasets import make_shapes_dataset
from npudet.deploy.evaluate import load_config, onnx_session, preprocessed, split_loader
from npudet.deploy.export import load_detector

AP_TOLERANCE = 0.005
NODES = ("gridsample", "npudet")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The main job's model (its checkpoint when ``tools/main_job.sh`` ran here, else
    trained by the same recipe) and its PyTorch val metrics."""
    root = f"{ROOT}/data/shapes"
    make_shapes_dataset(root)  # the main job's set; kept when it exists
    work = tmp_path_factory.mktemp("export_coco")
    options = data_options(root)
    checkpoint = main_job_checkpoint()
    if checkpoint is None:
        done = run_tool(
            ["tools/train.py", SMALL_DETR, "--work-dir", str(work / "train"), "--msda-impl",
             "cpu", "--cfg-options", *options],
            timeout=3600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        checkpoint = (work / "train" / "last_checkpoint").read_text().strip()
    done = run_tool(
        ["tools/test.py", SMALL_DETR, checkpoint, "--work-dir", str(work / "test"),
         "--msda-impl", "grid_sample", "--cfg-options", *options],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((work / "test" / "coco_bbox_test.json").read_text())["bbox"]
    return dict(work=work, checkpoint=checkpoint, options=options, ap=metrics)


@pytest.fixture(scope="module", params=NODES)
def exported(trained, request):
    """The trained model exported with MSDA as ``request.param``'s nodes."""
    out = trained["work"] / f"model_{request.param}.onnx"
    done = run_tool(
        ["tools/export.py", SMALL_DETR, trained["checkpoint"], "--format", "onnx",
         "--out", str(out), "--msda-node", request.param],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_exported_model_keeps_the_coco_ap(trained, exported):
    metrics_file = exported.with_suffix(".json")
    done = run_tool(
        ["tools/deployment/eval_export.py", SMALL_DETR, str(exported), "--json", str(metrics_file),
         "--cfg-options", *trained["options"]],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    onnx_ap = json.loads(metrics_file.read_text())
    print(f"\n{exported.name}: ONNX Runtime {onnx_ap}\nPyTorch (grid_sample): {trained['ap']}")
    assert trained["ap"]["AP50"] >= 0.5, trained["ap"]  # the model is trained
    assert abs(onnx_ap["coco/bbox_mAP"] - trained["ap"]["AP"]) <= AP_TOLERANCE, (
        onnx_ap,
        trained["ap"],
    )


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_exported_model_matches_pytorch_on_val_images(trained, exported):
    """Boxes (normalised) and scores within 1e-4 on val images, batches of 1 and 2."""
    model = load_detector(SMALL_DETR, trained["checkpoint"], "grid_sample").detector
    session = onnx_session(exported)
    cfg = load_config(SMALL_DETR, dict(o.split("=", 1) for o in trained["options"]))
    for batch_size in (1, 2):
        _, data = next(preprocessed(cfg, split_loader(cfg, batch_size)))
        images = data["inputs"]  # the shapes set's images share one size: no padding
        got = [np.asarray(t) for t in session.run(None, {"images": images.numpy()})]
        want = reference(model, images)
        assert all(float(scores.max()) > 0.5 for _, scores, _ in want), "not trained?"
        worst = assert_matches(got, want, *images.shape[2:])
        print(f"\n{exported.name}, batch {batch_size}: largest differences {worst}")
