"""COCO evaluation of an exported detector in ONNX Runtime: the logic of
``tools/deployment/eval_export.py``.

The exported graph (``npudet.deploy.export``) takes the data preprocessor's output and
returns boxes in the input's pixels. Here the config's own test dataloader, data
preprocessor and test evaluator do what stays outside the graph: the images are loaded,
resized and normalised as ``tools/test.py`` does, the graph runs one image at a time (no
padding within a batch, the graph's assumption), the boxes are scaled back to the original
image as ``predict(rescale=True)`` does, and the evaluator scores them: the same numbers
``tools/test.py`` prints for the PyTorch model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.config import Config, DictAction

from npudet.engine.cli import fail
from npudet.engine.preflight import PreflightError, check_data
from npudet.utils.output_path import output_path_error

from .onnx_nodes import FLAVOURS
from .ort_custom_ops import ort_library, ort_session

# The fused nodes npudet's ONNX Runtime library runs; the others need their engine (ATC).
ORT_LIBRARY_DOMAINS = ("npudet", "mmdeploy")


def read_onnx(path: str | Path):
    """The ONNX model at ``path`` (external data not loaded): a detector graph with an
    ``images`` input, as ``tools/export.py`` writes. ValueError naming ``model`` for a file of
    another kind (it failed in ONNX Runtime's parser: "DecodeError: Wire format was corrupt")."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError, ParseError, ...
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"model: {path} is not an ONNX model ({reason}); expected the .onnx written by "
            "tools/export.py"
        ) from None
    inputs = [i.name for i in model.graph.input]
    if "images" not in inputs:
        raise ValueError(
            f"model: {path} takes inputs {inputs}; expected a detector graph with an 'images' "
            "input (tools/export.py of a Deformable DETR / DINO)"
        )
    return model


def onnx_session(path: str | Path, threads: Optional[int] = None):
    """An ONNX Runtime CPU session on ``path`` (``read_onnx``), with npudet's custom-op
    library registered when the graph holds a fused MSDA node it runs. ``threads``: intra-op
    threads (default: ONNX Runtime's). ValueError naming the node for a flavour only its
    engine runs."""
    domains = {node.domain for node in read_onnx(path).graph.node}
    engine_only = sorted(d for d in domains & set(FLAVOURS) if d not in ORT_LIBRARY_DOMAINS)
    if engine_only:
        flavour = FLAVOURS[engine_only[0]]
        raise ValueError(
            f"model: {flavour.domain}::{flavour.op_type} runs in {flavour.runs_on}, not in ONNX "
            f"Runtime; export with --msda-node gridsample or npudet to run it here"
        )
    library = ort_library() if domains & set(ORT_LIBRARY_DOMAINS) else None
    return ort_session(path, threads, library)


def to_original(boxes: np.ndarray, scale_factor: Sequence[float]) -> np.ndarray:
    """(N, 4) xyxy in the resized input's pixels -> the original image's pixels, as
    ``predict_by_feat(rescale=True)`` (``scale_factor`` = (w_scale, h_scale))."""
    sx, sy = scale_factor
    return boxes / np.array([sx, sy, sx, sy], dtype=boxes.dtype)


def load_config(config: str, cfg_options: Optional[dict] = None) -> Config:
    """The config with ``cfg_options`` merged, its default scope set."""
    from mmengine.registry import init_default_scope

    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    init_default_scope(cfg.get("default_scope", "mmdet"))
    return cfg


def split_loader(cfg: Config, batch_size: int = 1):
    """The config's test dataloader at ``batch_size``."""
    from mmengine.runner import Runner

    return Runner.build_dataloader(dict(cfg.test_dataloader, batch_size=batch_size))


def preprocessed(cfg: Config, loader) -> Iterator[Tuple[dict, dict]]:
    """``loader``'s batches as the PyTorch model sees them: (raw batch, the data
    preprocessor's output: ``inputs`` (B, 3, H, W) normalised, ``data_samples``)."""
    from mmdet.registry import MODELS

    preprocessor = MODELS.build(cfg.model.data_preprocessor)
    with torch.no_grad():
        for batch in loader:
            yield batch, preprocessor(batch, training=False)


def evaluate_onnx(
    cfg: Config, model: str | Path, threads: Optional[int] = None
) -> Dict[str, float]:
    """The test evaluator's metrics of ``cfg`` (``load_config``'s, e.g. ``coco/bbox_mAP``)
    for the ONNX graph ``model`` on the config's test split, one image at a time (the graph
    assumes no padding within a batch)."""
    from mmengine.evaluator import Evaluator
    from mmengine.structures import InstanceData

    loader = split_loader(cfg)
    evaluator = Evaluator(cfg.test_evaluator)
    evaluator.dataset_meta = loader.dataset.metainfo
    session = onnx_session(model, threads)
    for batch, data in preprocessed(cfg, loader):
        boxes, scores, labels = session.run(None, {"images": data["inputs"].numpy()})
        sample = data["data_samples"][0]
        sample.pred_instances = InstanceData(
            bboxes=torch.from_numpy(to_original(boxes[0], sample.scale_factor)),
            scores=torch.from_numpy(scores[0]),
            labels=torch.from_numpy(labels[0]),
        )
        evaluator.process(data_samples=[sample], data_batch=batch)
    return evaluator.evaluate(len(loader.dataset))


def checked_inputs(args: argparse.Namespace) -> Config:
    """The config of ``tools/deployment/eval_export.py``'s arguments, once every input is checked:
    the files exist, the model is an exported detector, ``--json`` can be written, the test
    split's annotations and images are there (the preflight of ``tools/test.py``: a missing
    set names the tool that makes it). The first problem ends the process with one line."""
    for name, path in (("config", Path(args.config)), ("model", args.model)):
        if not path.is_file():
            fail(f"{name}: file not found: {path}")
    problem = output_path_error(args.json, "--json") if args.json is not None else None
    if problem:
        fail(problem)
    try:
        read_onnx(args.model)
        cfg = load_config(args.config, args.cfg_options)
        # Files checked to exist, not decoded: the evaluation reads every image anyway.
        check_data(cfg, ["test"], check_images=False)
    except (ValueError, PreflightError) as err:
        fail(str(err))
    return cfg


def main(argv: Optional[List[str]] = None) -> Dict[str, float]:
    """``tools/deployment/eval_export.py``: evaluate, print the metrics, optionally write them as
    JSON."""
    parser = argparse.ArgumentParser(description="COCO evaluation of an exported ONNX detector")
    parser.add_argument("config", help="the config the model was trained with")
    parser.add_argument("model", type=Path, help="the .onnx written by tools/export.py")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads")
    parser.add_argument("--json", type=Path, default=None, help="write the metrics here")
    parser.add_argument("--cfg-options", nargs="+", action=DictAction, default=None)
    args = parser.parse_args(argv)
    cfg = checked_inputs(args)
    try:
        metrics = evaluate_onnx(cfg, args.model, args.threads)
    except ValueError as err:
        fail(str(err))
    for key, value in metrics.items():
        print(f"{key}: {value:.4f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics
