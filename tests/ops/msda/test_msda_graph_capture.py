"""MSDA inside graph capture: ``prepare`` + one warm-up call, then captured calls decide
nothing and read nothing back.

On the CPU (every run) the capture's condition is checked directly: after ``prepare`` and a
warm-up call, calls read no device tensor back (tensors on ``meta`` under a dispatch mode
that records host reads, as in test_msda_dispatch.py) and never run verification. On CUDA
(``NPUDET_TEST_DEVICE=cuda``) the real thing: a ``torch.cuda.CUDAGraph`` of ``auto``'s
forward, and ``torch.compile(mode="reduce-overhead")`` of a Deformable DETR encoder layer
(``npudet_dev.gpu_kit.ddetr`` on ``npudet.nn.MSDeformAttn``), forward and backward, against
eager; on the CPU that layer compiles in inductor's default mode, against eager.
"""

from __future__ import annotations

import pytest
import torch
from msda_util import DEVICE, random_inputs
from test_msda_dispatch import HostReads

from npudet.ops import multi_scale_deformable_attn, prepare
from npudet.ops.msda import auto
from npudet.ops.msda.verification import parity


def _no_check(*args, **kwargs):
    raise AssertionError("verification ran after prepare")


def test_prepared_warm_calls_read_nothing_back_and_check_nothing(monkeypatch):
    auto.reset()
    assert prepare("cpu") == {torch.float32: "cpu"}
    monkeypatch.setattr(parity, "check_impl", _no_check)
    cpu = random_inputs()
    value, shapes, starts, loc, attn = (t.to("meta") for t in cpu)
    leaves = [t.requires_grad_() for t in (value, loc, attn)]
    mode = HostReads([(shapes, cpu[1]), (starts, cpu[2])])
    with mode:
        multi_scale_deformable_attn(leaves[0], shapes, starts, *leaves[1:])  # warm-up
        mode.reads.clear()
        for _ in range(5):
            out = multi_scale_deformable_attn(leaves[0], shapes, starts, *leaves[1:])
            torch.autograd.grad(out.sum(), leaves)
    assert mode.reads == []
    # And real CPU tensors take the prepared implementation without a check.
    multi_scale_deformable_attn(*cpu)


needs_cuda = pytest.mark.skipif(
    DEVICE != "cuda", reason="graph capture needs a CUDA device: NPUDET_TEST_DEVICE=cuda"
)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_replays_auto(dtype):
    prepare("cuda", (dtype,))
    value, shapes, starts, loc, attn = (
        t.to("cuda", dtype) if t.is_floating_point() else t.to("cuda")
        for t in random_inputs(queries=64, heads=8, dim=32, points=4)
    )
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(2):  # warm-up: kernel compilation, the plan, the level check
            multi_scale_deformable_attn(value, shapes, starts, loc, attn)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = multi_scale_deformable_attn(value, shapes, starts, loc, attn)
    loc.copy_(loc.flip(1))  # new inputs in the captured buffers
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        want = multi_scale_deformable_attn(value, shapes, starts, loc, attn)
    torch.testing.assert_close(out, want)


def test_compiled_encoder_layer_matches_eager():
    """One graph (fullgraph) of a Deformable DETR encoder layer with ``auto``'s MSDA, forward
    and backward, against eager: with CUDA graphs (``reduce-overhead``) on CUDA, inductor's
    default mode elsewhere."""
    from npudet_dev.gpu_kit import ddetr

    if DEVICE == "cuda":
        device, mode, image, dim = "cuda", "reduce-overhead", (256, 384), 256
    else:
        device, mode, image, dim = "cpu", None, (64, 96), 64
    shape = ddetr.DDETRShape(image=image, batch=2, dim=dim)
    prepare(device)
    torch.manual_seed(0)
    # eval(): dropout would draw new masks at every call, and no two calls could agree.
    layer = ddetr.EncoderLayer(shape, "auto").to(device).eval()
    batch = ddetr.make_batch(shape, device)
    args = (batch["pos"], batch["encoder_reference"], batch["shapes"], batch["starts"])
    compiled = torch.compile(layer, mode=mode, fullgraph=True)
    results = []
    for fn in (layer, compiled, compiled, compiled):  # eager, then compiled warm-ups, replay
        x = batch["features"].clone().requires_grad_()
        out = fn(x, *args)
        grad_x, *grad_params = torch.autograd.grad(out.square().mean(), [x, *layer.parameters()])
        results.append((out.detach().clone(), grad_x.clone(), [g.clone() for g in grad_params]))
    want_out, want_x, want_params = results[0]
    got_out, got_x, got_params = results[-1]
    torch.testing.assert_close(got_out, want_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_x, want_x, rtol=1e-3, atol=1e-5)
    for got, want in zip(got_params, want_params):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
