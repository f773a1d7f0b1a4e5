"""Training under ``torch.compile`` (issue: ``tools/train.py --compile``): the small
Deformable DETR and DINO with the fused ``cpu`` and the ``gather`` implementations give
eager's losses, and no graph break falls inside the MSDA op or layers."""

from __future__ import annotations

import json

import pytest
import torch
from mmengine.config import Config
from plugin_util import (
    SMALL_DETR,
    SMALL_DINO,
    build_model,
    fake_batch,
    small_cfg,
    train_tool,
)
from train_util import train_losses

from npudet.hooks import compile_with_hook
from npudet.hooks.graph_breaks import MSDA_FILES, GraphBreakRecorder
from npudet.models.layers import deformable_layers

CONFIGS = {"ddetr": SMALL_DETR, "dino": SMALL_DINO}
# Inductor draws random numbers its own way unless told to fall back to eager's generator;
# DINO's denoising queries are random, so without it the losses differ from the first step.
INDUCTOR = dict(backend="inductor", options=dict(fallback_random=True))


@pytest.mark.parametrize(
    ("model", "impl"),
    [
        # 2-6 minutes each on 2 cores with a cold inductor cache (ddetr/cpu: 292 s in a fresh
        # clone), so all run with -m slow; the default run compiles a training through
        # tools/train.py --compile eager (test_train_tool_compile) and the layers (below).
        pytest.param("ddetr", "cpu", marks=pytest.mark.slow),
        pytest.param("ddetr", "gather", marks=pytest.mark.slow),
        pytest.param("dino", "cpu", marks=pytest.mark.slow),
        pytest.param("dino", "gather", marks=pytest.mark.slow),
    ],
)
def test_compiled_losses_match_eager(tiny_shapes, model, impl):
    """The first 3 iterations' losses under inductor equal eager's to fp32 round-off, and
    the graph breaks (the Hungarian matching's scipy call, data-dependent loss code) all lie
    outside the MSDA op and layers."""
    eager, _ = train_losses(tiny_shapes, impl, 3, config=CONFIGS[model])
    torch._dynamo.reset()
    recorder = GraphBreakRecorder()
    recorder.start()
    try:
        compiled, _ = train_losses(
            tiny_shapes, impl, 3, config=CONFIGS[model], compile_options=INDUCTOR
        )
    finally:
        recorder.stop()
        torch._dynamo.reset()
    breaks = recorder.breaks()
    print(f"{model}/{impl}: eager {eager}, compiled {compiled}, {len(breaks)} distinct breaks")
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=0)
    assert any("hungarian_assigner" in b.location for b in breaks), breaks
    assert not [b for b in breaks if b.in_files(MSDA_FILES)]


def _layer_calls(model: torch.nn.Module, batch: dict):
    """(layer, args, kwargs) of the first call of every MSDA layer in one eager forward."""
    calls = {}

    def grab(module, args, kwargs):
        calls.setdefault(module, (args, kwargs))

    layers = [layer for _, layer in deformable_layers(model)]
    handles = [m.register_forward_pre_hook(grab, with_kwargs=True) for m in layers]
    with torch.no_grad():
        model(**model.data_preprocessor(batch, True), mode="loss")
    for handle in handles:
        handle.remove()
    assert len(calls) == len(layers) > 0
    return [(m, *calls[m]) for m in layers]


@pytest.mark.parametrize("impl", ["cpu", "gather"])
@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_msda_layers_compile_without_graph_breaks(model, impl):
    """Every MSDA layer of the model, called with the inputs it gets in training, compiles
    as one graph (``fullgraph=True``) and matches eager in output and gradients."""
    net = build_model(small_cfg(CONFIGS[model], impl=impl))
    net.train()
    for layer, args, kwargs in _layer_calls(net, fake_batch()):
        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        query = kwargs["query"].detach().requires_grad_()
        out = compiled(*args, **{**kwargs, "query": query})
        (grad,) = torch.autograd.grad(out.square().sum(), query)
        ref_query = query.detach().requires_grad_()
        ref = layer(*args, **{**kwargs, "query": ref_query})
        (ref_grad,) = torch.autograd.grad(ref.square().sum(), ref_query)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "backend",
    [
        # inductor's code generation for the whole detector: 290 s on 2 cores with a cold
        # cache (a fresh clone), so slow; dynamo's eager backend captures the same graphs
        # and breaks
        pytest.param("inductor", marks=pytest.mark.slow),
        "eager",
    ],
)
def test_train_tool_compile(tiny_shapes, tmp_path, backend):
    """``tools/train.py --compile BACKEND``: trains an epoch with the forward compiled,
    evaluates, saves a checkpoint and writes graph_breaks.json (none inside the MSDA op /
    layers)."""
    work = tmp_path / "compiled"
    proc = train_tool(
        tiny_shapes,
        work,
        "--compile",
        backend,
        "--msda-impl",
        "cpu",
        options=["train_dataloader.batch_size=2"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (report_path,) = work.glob("*/graph_breaks.json")
    report = json.loads(report_path.read_text())
    assert report["options"]["backend"] == backend
    assert report["total"] > 0 and report["in_msda"] == 0, report
    assert (work / "epoch_1.pth").is_file()
    log = next(work.glob("*/*.log")).read_text()
    assert f"torch.compile(backend='{backend}'" in log and "0 inside the MSDA op / layers" in log


def test_compile_setting_routed_to_the_hook():
    """mmengine's ``compile`` key becomes TorchCompileHook (mmengine would compile
    train_step, optimiser step included); ``--compile BACKEND`` overrides the backend; a
    bad value names the key."""
    cfg = Config(dict(compile=dict(mode="max-autotune"), custom_hooks=[]))
    assert compile_with_hook(cfg, "aot_eager")
    assert cfg.compile is None
    assert cfg.custom_hooks == [
        dict(type="TorchCompileHook", mode="max-autotune", backend="aot_eager")
    ]
    plain = Config(dict(compile=True))
    assert compile_with_hook(plain) and plain.custom_hooks == [dict(type="TorchCompileHook")]
    off = Config(dict(compile=False))
    assert not compile_with_hook(off) and "custom_hooks" not in off
    with pytest.raises(ValueError, match="compile: expected True, False or a dict"):
        compile_with_hook(Config(dict(compile=3)))
