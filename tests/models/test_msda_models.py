"""The one ``model.msda`` mechanism across mmdet's MSDA models (``npudet.models.detectors``):
every family written out as a class and registered under mmdet's name, mmdet's unchanged
configs converted in place, and a new model switched with one call."""

from __future__ import annotations

import pickle

import pytest
import torch
from mmcv.ops import MultiScaleDeformableAttention as MMCVMSDA
from mmengine.config import Config
from mmengine.model import BaseModule
from msda_models_util import build, layer_impls, mmdet_config, record_msda

import npudet.models
from npudet.models import MSDA_MODELS, MSDAModel, MultiScaleDeformableAttention, switch_msda

FAMILIES = ("DeformableDETR", "DINO", "DDQDETR", "GroundingDINO", "Mask2Former")


def test_every_family_is_switched() -> None:
    from mmdet.registry import MODELS

    assert set(FAMILIES) - {"DeformableDETR", "DINO"} <= set(MSDA_MODELS)
    for name in (*FAMILIES, "Mask2FormerVideo"):
        cls = MODELS.get(name)
        # the class npudet writes out (its API pages document it), not one made at run time
        assert cls is getattr(npudet.models, name), (name, cls)
        assert cls.__module__.startswith("npudet.models.detectors."), cls.__module__
        assert issubclass(cls, MSDAModel), name
        assert cls.msda_parts, name  # declared: the preflight checks model.msda unbuilt
        # mmdet's own class is a base: its isinstance checks and checkpoints hold
        mmdet_bases = [b for b in cls.__mro__ if b.__module__.startswith("mmdet.")]
        assert mmdet_bases and mmdet_bases[0].__name__ == name, cls.__mro__
        assert pickle.loads(pickle.dumps(cls)) is cls
        assert switch_msda(name) is cls  # switching a written-out class changes nothing


# mmdet's R50 configs, unchanged but for custom_imports (and model.msda where given): how
# many MSDA layers each builds (encoder + decoder; Mask2Former: its pixel decoder's encoder)
UNCHANGED = [
    ("ddq/ddq-detr-4scale_r50_8xb2-12e_coco.py", None, 12),
    ("mask2former/mask2former_r50_8xb2-lsj-50e_coco.py", "cpu", 6),
    ("mask2former/mask2former_r50_8xb2-lsj-50e_coco-panoptic.py", None, 6),
]


@pytest.mark.parametrize("rel, impl, layers", UNCHANGED, ids=lambda v: str(v).split("/")[0])
def test_unchanged_mmdet_config_plus_custom_imports(rel: str, impl: str, layers: int) -> None:
    """mmdet's own config with the plugin added (as a user would, read through mmengine's
    ``Config``, which imports ``custom_imports``) builds npudet's layers only: ``auto``
    without ``model.msda``, every layer ``impl`` with it. (A fresh process through mmdet's own
    ``tools/train.py``: test_mmdet_train_tool below.)"""
    cfg = mmdet_config(rel)
    cfg.custom_imports = dict(imports=["npudet.plugin"], allow_failed_imports=False)
    if impl is not None:
        cfg.model.msda = dict(impl=impl)
    cfg = Config.fromstring(cfg.pretty_text, ".py")
    cfg.model.backbone.init_cfg = None  # nothing downloaded
    model = build(cfg.model, init=False)
    assert type(model).__module__ == "npudet.models.detectors.switched"
    impls = layer_impls(model)
    assert len(impls) == layers and set(impls.values()) == {impl or "auto"}, impls


class _Toy(BaseModule):
    """A model of the kind switch_msda is for: mmcv's MSDA built inside, no npudet code."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.ModuleList(
            [MMCVMSDA(embed_dims=32, num_levels=1, batch_first=True)]
        )
        self.head = MMCVMSDA(embed_dims=32, num_levels=1, batch_first=True)


def test_a_new_model_needs_one_call() -> None:
    from mmdet.registry import MODELS

    name = "NpudetTestToyModel"
    MODELS.register_module(name=name, module=_Toy)
    try:
        cls = switch_msda(name)
        assert switch_msda(name) is cls and MODELS.get(name) is cls
        model = MODELS.build(dict(type=name, msda=dict(impl="gather", encoder="grid_sample")))
        assert isinstance(model, _Toy) and model.msda_impls["encoder"] == "grid_sample"
        assert layer_impls(model) == {"encoder.0": "grid_sample", "head": "gather"}
        assert all(type(m) is MultiScaleDeformableAttention for m in (model.head, model.encoder[0]))
        query = torch.rand(1, 6, 32)
        with record_msda(model) as record:
            model.head(
                query,
                reference_points=torch.rand(1, 6, 1, 2),
                spatial_shapes=torch.tensor([[2, 3]]),
                level_start_index=torch.tensor([0]),
            )
        assert dict(record.npudet) == {"gather": 1} and record.mmcv == 0
        with pytest.raises(ValueError, match=r"model\.msda\.decoder: NpudetTestToyModel has no "):
            MODELS.build(dict(type=name, msda=dict(decoder="cpu")))
    finally:
        MODELS._module_dict.pop(name, None)
    with pytest.raises(ValueError, match=r"name: no model registered as 'NoSuchModel'"):
        switch_msda("NoSuchModel")


def test_the_record_sees_mmcvs_msda() -> None:
    """The counter the model tests rely on does count a stock mmcv layer's computation."""
    layer = MMCVMSDA(embed_dims=32, num_levels=1)
    with record_msda(torch.nn.Sequential(layer)) as record:
        layer(
            torch.rand(6, 1, 32),
            reference_points=torch.rand(1, 6, 1, 2),
            spatial_shapes=torch.tensor([[2, 3]]),
            level_start_index=torch.tensor([0]),
        )
    assert record.mmcv == 1 and not record.npudet


@pytest.mark.slow
def test_mmdet_train_tool(tiny_shapes: str, tmp_path) -> None:
    """mmdet's own ``tools/train.py`` (shipped in its package), in a fresh process, on a
    config whose only npudet part is ``custom_imports`` (the small Mask2Former: mmdet's types
    throughout): one epoch on the tiny shapes set, the MSDA layers on npudet's op (``auto``
    announces its choice in the run's log)."""
    import os

    import mmdet
    from plugin_util import ROOT, data_options, run_tool

    tool = os.path.join(os.path.dirname(mmdet.__file__), ".mim", "tools", "train.py")
    config = os.path.join(ROOT, "configs", "small", "mask2former_r18-tiny_shapes.py")
    options = [*data_options(tiny_shapes), "train_cfg.max_epochs=1", "train_cfg.val_interval=1"]
    proc = run_tool([tool, config, "--work-dir", str(tmp_path), "--cfg-options", *options])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "npudet MSDA auto on cpu float32: using" in out, out[-3000:]
    assert "coco/segm_mAP" in out, out[-3000:]


_OVERRIDES = """
import mmdet.registry, mmengine.registry
from mmdet.utils import register_all_modules
from mmengine.registry import Registry

register_all_modules(init_default_scope=False)
registries = {
    f"{module.__name__}.{attr}": reg
    for module in (mmdet.registry, mmengine.registry)
    for attr, reg in vars(module).items()
    if isinstance(reg, Registry)
}
before = {key: dict(reg.module_dict) for key, reg in registries.items()}
import npudet.plugin
for key, reg in registries.items():
    for name, obj in reg.module_dict.items():
        if name in before[key] and before[key][name] is not obj:
            print(key, name)
"""


def test_the_plugin_docstring_lists_every_name_it_overrides() -> None:
    """In a fresh process, every mmdet / mmengine registry entry that importing
    ``npudet.plugin`` replaces (``force=True``) is named in the plugin's docstring, and no
    registry but mmdet's ``MODELS`` is touched."""
    from plugin_util import run_tool

    import npudet.plugin

    proc = run_tool(["-c", _OVERRIDES], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    overridden = [line.split() for line in proc.stdout.splitlines()]
    assert {key for key, _ in overridden} == {"mmdet.registry.MODELS"}, overridden
    names = {name for _, name in overridden}
    assert names == {"DeformableDETR", "DINO", "DeformableDETRHead", *MSDA_MODELS}, names
    missing = [name for name in names if f"``{name}``" not in npudet.plugin.__doc__]
    assert not missing, missing
