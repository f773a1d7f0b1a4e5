"""Checks run before a Runner exists, so that bad input stops with one clear line.

Each failure raises :class:`PreflightError` whose message names the file or config
key; the tools print it and exit without creating or touching the work dir.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from mmengine.config import Config

from npudet.hooks.run_guard import CheckpointCorruptError, verify_checkpoint
from npudet.utils.output_path import output_path_error

from . import coco_checks


class PreflightError(Exception):
    """Bad input found before training / testing started (the message is one line)."""


def check_msda(cfg: Config, device: Optional[str] = None) -> None:
    """``model.msda`` names known implementations that can run on the run's device.

    ``device``: the device type the run trains / tests on (default: mmengine's
    ``get_device()``). A name usable on this machine may still not take the run's tensors
    (``triton`` on CPU tensors without the interpreter): that stops here, not at the first
    forward after the work dir exists. The op library's environment variables are checked
    first (``check_environment``).
    """
    from npudet.models import resolve_msda_cfg

    check_environment()
    try:
        parts = resolve_msda_cfg(cfg.model.get("msda"))
    except ValueError as err:
        raise PreflightError(str(err)) from None
    check_msda_parts(cfg)
    if device is None:
        from mmengine.device import get_device

        device = get_device()
    msda = cfg.model.get("msda") or {}
    for part, name in parts.items():
        reasons = _device_reasons(name, device)
        if reasons:
            key = "model.msda." + (part if msda.get(part) is not None else "impl")
            raise PreflightError(
                f"{key}: MSDA implementation {name!r} cannot run on this run's device "
                f"{device!r} ({'; '.join(reasons)}); usable on {device!r}: "
                f"{['auto', *usable_impls(device)]}"
            )


def check_msda_deterministic(cfg: Config, device: Optional[str] = None) -> None:
    """Under ``randomness.deterministic=True`` a training's ``model.msda`` names only
    implementations whose backward is deterministic on the run's device (``auto`` picks one
    itself); else the op would refuse at the first backward, after the work dir exists.

    ``device``: as in ``check_msda`` (run it first: it checks the names).
    """
    from npudet.models import resolve_msda_cfg
    from npudet.ops.msda import get_impl

    if not (cfg.get("randomness") or {}).get("deterministic"):
        return
    if device is None:
        from mmengine.device import get_device

        device = get_device()
    msda = cfg.model.get("msda") or {}
    for part, name in resolve_msda_cfg(msda).items():
        if name == "auto" or device in get_impl(name).DETERMINISTIC:
            continue
        key = "model.msda." + (part if msda.get(part) is not None else "impl")
        choices = [n for n in usable_impls(device) if device in get_impl(n).DETERMINISTIC]
        raise PreflightError(
            f"{key}: MSDA implementation {name!r} has no deterministic backward on {device!r} "
            f"and randomness.deterministic=True is set; deterministic on {device!r}: "
            f"{['auto', *choices]}"
        )


def check_msda_parts(cfg: Config) -> None:
    """``model.msda``'s part overrides (``encoder`` / ``decoder``) name parts the model has:
    read from its class (``msda_parts``) without building it; a class that does not declare
    them (one made by ``switch_msda``) is built here, before the work dir exists."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    from npudet.models.detectors.msda_config import PARTS, missing_part_error
    from npudet.models.detectors.msda_model import MSDAModel

    msda = cfg.model.get("msda") or {}
    if all(msda.get(part) is None for part in PARTS):
        return
    model_type = cfg.model.get("type")
    if model_type is None:
        return  # a config of the MSDA choice alone (tools/analysis_tools/ablate.py's)
    init_default_scope(cfg.get("default_scope", "mmdet"))
    cls = model_type if isinstance(model_type, type) else MODELS.get(model_type)
    if cls is None:
        return  # an unknown type: the runner's build names it
    parts = getattr(cls, "msda_parts", None)
    problem = None
    if parts is not None:
        problem = missing_part_error(cls.__name__, msda, parts)
    elif isinstance(cls, type) and issubclass(cls, MSDAModel):
        try:
            MODELS.build(copy.deepcopy(cfg.model))  # build mutates its cfg
        except ValueError as err:
            # another build error is the runner's to report, where it builds the model
            if str(err).startswith("model.msda."):
                problem = str(err)
    if problem:
        raise PreflightError(problem)


def _device_reasons(name: str, device: str) -> List[str]:
    from npudet.ops.msda import get_impl, typical_inputs

    if name == "auto":
        return []
    return get_impl(name).not_supported_reasons(typical_inputs(device))


def usable_impls(device: str) -> List[str]:
    """Implementations usable on this machine that take ``device`` tensors."""
    from npudet.ops import msda_impls

    return [name for name in msda_impls() if not _device_reasons(name, device)]


def dataset_cfgs(cfg: Optional[Dict]) -> Iterator[Dict]:
    """Leaf dataset configs inside a (possibly wrapped or concatenated) dataset config."""
    if not cfg:
        return
    if "dataset" in cfg:
        yield from dataset_cfgs(cfg["dataset"])
    elif "datasets" in cfg:
        for sub in cfg["datasets"]:
            yield from dataset_cfgs(sub)
    else:
        yield cfg


def _join(root: Optional[str], path: str) -> str:
    return path if not root or os.path.isabs(path) or "://" in path else os.path.join(root, path)


def data_hint(path: str) -> str:
    """Which npudet tool makes the data at ``path`` (empty when it is no built-in set)."""
    folder = os.path.dirname(path)
    if os.path.basename(folder) == "annotations":
        folder = os.path.dirname(folder)
    for marker, tool in (
        ("shapes", "python tools/dataset_converters/make_shapes_dataset.py --root {}"),
        ("bev_synth", "python tools/dataset_converters/make_bev_dataset.py --root {}"),
        ("nuscenes", "python tools/dataset_converters/create_nuscenes_infos.py --dataroot {}"),
    ):
        if marker in path:
            return f" (make it with: {tool.format(folder or '.')})"
    return ""


def read_coco_annotations(path: str, key: str) -> Dict:
    """Load a COCO annotation file, or raise naming the file and what is wrong."""
    if not os.path.isfile(path):
        raise PreflightError(f"{key}: annotation file not found: {path}{data_hint(path)}")
    try:
        with open(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PreflightError(f"{key}: corrupt annotation file {path}: {err}") from None
    missing = [
        k
        for k in ("images", "annotations", "categories")
        if not isinstance(data, dict) or k not in data
    ]
    if missing:
        raise PreflightError(f"{key}: annotation file {path} lacks COCO keys {missing}")
    return data


def check_bev_dataset(path: str, root: Optional[str], key: str) -> None:
    """A BEV info file: readable, of the expected version, every camera image present."""
    from npudet.bev.infos.schema import load_bev_info

    if not os.path.isfile(path):
        raise PreflightError(f"{key}: info file not found: {path}{data_hint(path)}")
    try:
        info = load_bev_info(path)
    except ValueError as err:
        raise PreflightError(f"{key}: {err}") from None
    samples = info["data_list"]
    for sample in samples:
        for cam, entry in sample["cams"].items():
            img = _join(root, entry["img_path"])
            if not os.path.isfile(img):
                raise PreflightError(
                    f"{key}: sample_idx {sample['sample_idx']} camera {cam}: image file "
                    f"not found: {img} ({len(samples)} samples listed in {path})"
                )


def dataset_classes(dataset: Dict) -> Optional[Tuple[str, ...]]:
    """The classes a dataset config trains on: its ``metainfo.classes``, else its class's
    ``METAINFO`` (mmdet's ``CocoDataset``: the 80 COCO classes); None if unknown."""
    classes = (dataset.get("metainfo") or {}).get("classes")
    if classes is None:
        try:
            from mmdet.registry import DATASETS

            cls = DATASETS.get(dataset.get("type"))
        except Exception:  # noqa: BLE001 - an unregistered type: nothing to compare with
            cls = None
        classes = (getattr(cls, "METAINFO", None) or {}).get("classes")
    return None if classes is None else tuple(classes)


def _coco_path(dataset: Dict) -> Optional[str]:
    """The local COCO annotation file of a dataset config, or None (remote, BEV, none)."""
    ann_file = dataset.get("ann_file")
    if not ann_file or "://" in str(ann_file) or dataset.get("type") == "BEVDataset":
        return None
    return _join(dataset.get("data_root"), ann_file)


def mask_step(pipeline: Optional[List]) -> Optional[str]:
    """The step of a dataset's ``pipeline`` that reads the annotations' masks
    (``pipeline[1] LoadAnnotations(with_mask=True)``), or None."""
    for i, step in enumerate(pipeline or []):
        kind = step.get("type") if isinstance(step, dict) else None
        name = getattr(kind, "__name__", str(kind)).rsplit(".", 1)[-1]  # a class, mmdet.X
        if name == "LoadAnnotations" and step.get("with_mask"):
            return f"pipeline[{i}] LoadAnnotations(with_mask=True)"
    return None


def check_dataset(dataset: Dict, key: str, check_images: bool = True) -> None:
    """A dataset config: annotation file readable with every field the dataset reads,
    categories matching the config's classes, ground truth left after filtering (training
    sets), a mask for every annotation where the pipeline loads masks, every image file
    present and (``check_images``) decodable (COCO or BEV)."""
    ann_file = dataset.get("ann_file")
    if not ann_file or "://" in str(ann_file):
        return
    root = dataset.get("data_root")
    path = _join(root, ann_file)
    if dataset.get("type") == "BEVDataset":
        check_bev_dataset(path, root, f"{key}.ann_file")
        return
    data = read_coco_annotations(path, f"{key}.ann_file")
    problem = coco_checks.entries_problem(data, path, evaluated=False)
    classes = dataset_classes(dataset)
    if problem is None and classes is not None:
        problem = coco_checks.classes_problem(data, path, classes)
        if problem is None and not dataset.get("test_mode"):
            problem = coco_checks.training_problem(data, path, classes, dataset.get("filter_cfg"))
    step = mask_step(dataset.get("pipeline"))
    if problem is None and step is not None:
        problem = coco_checks.masks_problem(data, path, step, classes)
    if problem:
        raise PreflightError(f"{key}.ann_file: {problem}")
    prefix = _join(root, (dataset.get("data_prefix") or {}).get("img", ""))
    if "://" in prefix:
        return
    problem = coco_checks.image_problem(data, prefix, path, decode=check_images)
    if problem:
        raise PreflightError(f"{key}: {problem}")


def check_data(cfg: Config, loaders: List[str], check_images: bool = True) -> None:
    """Datasets of the named dataloaders and the matching evaluators' annotation files
    (``check_images``: decode every image; ``--skip-image-check`` turns it off)."""
    for name in loaders:
        loader = cfg.get(f"{name}_dataloader")
        if not loader:
            continue
        for dataset in dataset_cfgs(loader.get("dataset")):
            check_dataset(dataset, f"{name}_dataloader.dataset", check_images)
        evaluators = cfg.get(f"{name}_evaluator")
        if evaluators is None:
            continue
        for evaluator in evaluators if isinstance(evaluators, list) else [evaluators]:
            ann_file = evaluator.get("ann_file")
            if ann_file and "://" not in ann_file and evaluator.get("type") != "BEVDetMetric":
                key = f"{name}_evaluator.ann_file"
                data = read_coco_annotations(ann_file, key)
                problem = coco_checks.entries_problem(data, ann_file, evaluated=True)
                # format_only writes predictions for a server (test-dev): no ground truth here
                datasets = None if evaluator.get("format_only") else loader.get("dataset")
                for dataset in dataset_cfgs(datasets):
                    path = _coco_path(dataset)
                    if problem is None and path is not None:
                        dataset_data = read_coco_annotations(path, f"{name}_dataloader.dataset")
                        problem = coco_checks.split_problem(dataset_data, data, path, ann_file)
                if problem:
                    raise PreflightError(f"{key}: {problem}")


def check_output_file(path: str, key: str) -> None:
    """``path`` can be written when the run ends (``output_path_error``). Checked first, not
    after the work it would hold."""
    problem = output_path_error(path, key)
    if problem:
        raise PreflightError(problem)


def check_work_dir(work_dir: str) -> None:
    """The work dir a run writes its logs and results into can be created or written (a
    file in the way, a read-only folder): checked before the model is loaded."""
    problem = output_path_error(work_dir, "work dir", folder=True)
    if problem:
        raise PreflightError(f"{problem}; pass a writable --work-dir")


def check_environment() -> None:
    """The environment variables of the op library and the device hold documented values
    (``npudet.ops.environment``: ``NPUDET_TRITON_SCHEDULE``, ``NPUDET_CPU_SANITIZE``,
    ``NPUDET_SIMULATED_NPU``): a typo stops here with one line, not as a traceback at the first
    forward after the work dir exists, nor as a switch to another build or device."""
    from npudet.ops.environment import environment_problem

    problem = environment_problem()
    if problem:
        raise PreflightError(problem)


def check_train_length(cfg: Config) -> None:
    """``train_cfg`` asks for at least one epoch or iteration."""
    train_cfg = cfg.get("train_cfg") or {}
    for field in ("max_epochs", "max_iters"):
        value = train_cfg.get(field)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise PreflightError(
                f"train_cfg.{field}={value!r}: nothing to train (expected an integer >= 1)"
            )


def load_state_dict(path: str, key: str) -> Dict[str, torch.Tensor]:
    """The model state_dict of the checkpoint at ``path`` (``module.`` prefixes dropped);
    PreflightError naming ``key`` when it is missing, unreadable, corrupt or holds none."""
    if not os.path.isfile(path):
        raise PreflightError(f"{key}: checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is reported the same way
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PreflightError(f"{key}: cannot read checkpoint {path}: {first_line}") from None
    try:
        verify_checkpoint(checkpoint, path)
    except CheckpointCorruptError as err:
        raise PreflightError(f"{key}: {err}") from None
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise PreflightError(f"{key}: {path} holds no model state_dict")
    return {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}


def compare_state_dicts(
    model: Dict[str, torch.Tensor], ckpt: Dict[str, torch.Tensor]
) -> Tuple[List[str], List[str], List[str]]:
    """(missing from checkpoint, unexpected in checkpoint, shape mismatches). An unexpected
    entry equal to an expected one is a module registered twice, not counted: DDQ-DETR's
    decoder takes its head's auxiliary branches during training."""
    missing = [k for k in model if k not in ckpt]
    expected = [v for k, v in ckpt.items() if k in model]
    unexpected = [
        k
        for k, v in ckpt.items()
        if k not in model and not any(e.shape == v.shape and torch.equal(e, v) for e in expected)
    ]
    mismatched = [
        f"{k} {tuple(ckpt[k].shape)} vs model {tuple(v.shape)}"
        for k, v in model.items()
        if k in ckpt and ckpt[k].shape != v.shape
    ]
    return missing, unexpected, mismatched


def check_checkpoint(cfg: Config, path: str, key: str, strict: bool) -> None:
    """The checkpoint at ``path`` belongs to ``cfg.model``.

    ``strict``: every parameter must match (test, resume); otherwise (``load_from``
    for fine-tuning) at least half of the model's entries must match by name and shape.
    """
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    ckpt = load_state_dict(path, key)
    init_default_scope(cfg.get("default_scope", "mmdet"))
    model = MODELS.build(copy.deepcopy(cfg.model)).state_dict()  # build mutates its cfg
    missing, unexpected, mismatched = compare_state_dicts(model, ckpt)
    matched = len(model) - len(missing) - len(mismatched)
    if (strict and (missing or unexpected or mismatched)) or matched < len(model) / 2:
        parts = [
            f"{len(items)} {what} (e.g. {items[0]})"
            for items, what in (
                (missing, "missing"),
                (unexpected, "unexpected"),
                (mismatched, "shape mismatches"),
            )
            if items
        ]
        raise PreflightError(
            f"{key}: checkpoint {path} does not fit model {cfg.model.get('type')}: "
            + ", ".join(parts)
        )
