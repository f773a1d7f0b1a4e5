"""tools/misc/check_device.py's benchmark cases cover every model npudet switches (issue 47,
item 6): DDQ-DETR, Mask2Former and Grounding DINO beside Deformable DETR, DINO and BEVFormer.

Each new model is built from its shipped config (R50, nothing downloaded: Grounding DINO's
text encoder is a 2-layer BERT the test writes, ``HF_HUB_OFFLINE``), and the case named for
each of its parts has the sizes of that part's MSDA layers: heads, levels, points, head
width, and the queries of a training step.
"""

from __future__ import annotations

import os

# before transformers (imported by mmdet's BertModel) reads it
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
from msda_models_util import msda_layers, write_tiny_bert  # noqa: E402
from plugin_util import ROOT  # noqa: E402

from npudet.benchmark import device_check  # noqa: E402
from npudet.benchmark.cases import parse_case  # noqa: E402

# registered model type -> (the name check_device reports, shipped config, {part: case})
MODELS = {
    "DDQDETR": (
        "DDQ-DETR",
        "configs/ddq/ddq-detr-4scale_r50_8xb2-12e_coco.py",
        {"encoder": "ddetr-enc", "decoder": "ddq-dec"},
    ),
    "GroundingDINO": (
        "Grounding DINO",
        "configs/grounding_dino/grounding_dino_r50_scratch_8xb2_1x_coco.py",
        {"encoder": "ddetr-enc", "decoder": "dino-dec"},
    ),
    # Mask2FormerVideo runs the same pixel decoder per frame
    "Mask2Former": (
        "Mask2Former",
        "configs/mask2former/mask2former_r50_8xb2-lsj-50e_coco.py",
        {"encoder": "m2f-enc"},
    ),
}


def test_every_switched_model_has_its_cases() -> None:
    from npudet.models.detectors import MSDA_MODELS

    assert set(MSDA_MODELS) - {"Mask2FormerVideo"} <= set(MODELS)
    for name, _, parts in MODELS.values():
        for case in parts.values():
            assert name in device_check.CASE_MODELS[case], (name, case)
    assert set(device_check.FULL_CASES) == set(device_check.CASE_MODELS)


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_cases_have_the_sizes_of_the_models_layers(model_type, tmp_path) -> None:
    from mmdet.registry import MODELS as REGISTRY
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import npudet.plugin  # noqa: F401  (the switched models)
    from npudet.utils.pretrained import drop_pretrained

    _, config, parts = MODELS[model_type]
    cfg = Config.fromfile(os.path.join(ROOT, config))
    drop_pretrained(cfg)
    if model_type == "GroundingDINO":
        cfg.model.language_model.name = write_tiny_bert(str(tmp_path), ["person", "car"])
        cfg.model.encoder.num_cp = 0  # fairscale's activation checkpointing: not installed
    init_default_scope("mmdet")
    model = REGISTRY.build(cfg.model)
    assert type(model).__name__ == model_type
    layers = msda_layers(model)
    seen = set()
    for name, layer in layers.items():
        part = "decoder" if name.startswith("decoder.") else "encoder"
        case, _ = parse_case(parts[part])
        sizes = (layer.num_heads, layer.num_levels, layer.num_points)
        assert (*sizes, layer.embed_dims // layer.num_heads) == (
            case.num_heads,
            len(case.levels),
            case.num_points,
            case.head_dim,
        ), (name, case.name)
        seen.add(part)
    assert seen == set(parts), sorted(layers)
    for part, name in parts.items():
        case, _ = parse_case(name)
        if part == "encoder":  # every pixel of the levels is a query
            assert case.encoder and case.num_queries == case.num_keys
        else:  # a training step's: the queries, DDQ's dense ones, the denoising groups
            dense = int(cfg.model.num_queries * cfg.model.get("dense_topk_ratio", 0))
            dn = 2 * cfg.model.dn_cfg.group_cfg.num_dn_queries
            assert case.num_queries == cfg.model.num_queries + dense + dn, case.name


@pytest.mark.slow
def test_the_new_cases_run_in_the_benchmark() -> None:
    """One round of each new case through the device check's benchmark, on the CPU (slow: the
    harness's warm-up and timed passes at full size)."""
    bench = device_check.benchmark("cpu", ["grid_sample", "gather"], ["ddq-dec", "m2f-enc"], 1)
    assert bench["errors"] == {}
    assert {(r["case"], r["impl"]) for r in bench["rows"]} == {
        (case, impl) for case in ("ddq-dec", "m2f-enc") for impl in ("grid_sample", "gather")
    }
