"""torch.compile, fake tensors and the custom ops' registration."""

from __future__ import annotations

import pytest
import torch
from msda_util import DEVICE, DYNAMO_2_1, EXERCISED, candidate_impls, random_inputs, run, to_device
from torch._subclasses.fake_tensor import FakeTensorMode

from npudet.ops import multi_scale_deformable_attn
from npudet.ops.msda.backends import cpu_library
from npudet.ops.msda.backends.cpu_options import CPUKernelOptions


def _layer(impl):
    def fn(value, spatial, starts, loc, logits):
        attn = logits.softmax(-1).view(loc.shape[:-1])
        return multi_scale_deformable_attn(value, spatial, starts, loc, attn, impl=impl) * 2

    return fn


# On the CPU the fused kernel under inductor and gather under aot_eager; on a device run
# (NPUDET_TEST_DEVICE) every implementation available there, against grid_sample on the CPU.
COMPILED = (
    [("cpu", "inductor"), ("gather", "aot_eager")]
    if DEVICE == "cpu"
    else [(name, "aot_eager") for name in candidate_impls(compiling=True)]
)


@DYNAMO_2_1
@pytest.mark.parametrize(("impl", "backend"), COMPILED)
def test_compile_fullgraph_forward_and_backward(impl, backend):
    torch._dynamo.reset()
    value, spatial, starts, loc, attn = random_inputs(queries=6)
    logits = attn.flatten(-2).log()
    on_device = to_device((value, spatial, starts, loc, logits))
    leaves = [on_device[i].clone().requires_grad_() for i in (0, 3, 4)]
    compiled = torch.compile(_layer(impl), fullgraph=True, backend=backend)
    out = compiled(leaves[0], on_device[1], on_device[2], leaves[1], leaves[2])
    EXERCISED.add((impl, out.device.type))
    grads = [g.cpu() for g in torch.autograd.grad(out.sum(), leaves)]
    ref_leaves = [t.clone().requires_grad_() for t in (value, loc, logits)]
    ref = _layer("grid_sample")(ref_leaves[0], spatial, starts, ref_leaves[1], ref_leaves[2])
    ref_grads = torch.autograd.grad(ref.sum(), ref_leaves)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    "options",
    [
        CPUKernelOptions(),
        CPUKernelOptions(backward="atomic"),
        CPUKernelOptions(backward="owner", order="head"),
        CPUKernelOptions(fused_corners=False, prefetch=False),
    ],
)
def test_fake_kernels_match_real_shapes(options):
    variant = options.as_ints()
    inputs = random_inputs(batch=3, queries=4, heads=2, dim=5)
    real_out = cpu_library.forward_op()(*inputs, variant)
    grad = torch.randn_like(real_out)
    real_grads = cpu_library.backward_op()(grad, *inputs, variant)
    with FakeTensorMode() as mode:
        fake_inputs = [mode.from_tensor(t) for t in inputs]
        fake_out = cpu_library.forward_op()(*fake_inputs, variant)
        fake_grads = cpu_library.backward_op()(mode.from_tensor(grad), *fake_inputs, variant)
    assert fake_out.shape == real_out.shape and fake_out.dtype == real_out.dtype
    for fake, real in zip(fake_grads, real_grads):
        assert fake.shape == real.shape and fake.dtype == real.dtype


@pytest.mark.skipif(
    not hasattr(torch.library, "opcheck"),
    reason="torch.library.opcheck arrived in torch 2.4 (on 2.1-2.3 the fake kernels are "
    "checked by test_fake_kernels_match_real_shapes only)",
)
def test_custom_op_passes_torch_opcheck():
    inputs = random_inputs(dtype=torch.float64, low=0.1, high=0.9)
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    args = (*leaves, CPUKernelOptions().as_ints())
    torch.library.opcheck(cpu_library.forward_op(), args)


def test_variants_agree_with_each_other():
    inputs = random_inputs(heads=8, dim=32, queries=40, points=4)
    out, grads = run("cpu", inputs)
    for other in ("cpu_atomic", "cpu_owner", "cpu_corner", "cpu_noprefetch", "cpu_headmajor"):
        out2, grads2 = run(other, inputs)
        torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-5)
        for a, b in zip(grads2, grads):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("impl", ["cpu", "cpu_owner"])
def test_backward_partitions_with_more_threads_than_work(impl):
    """One (batch, head) pair on 2 threads: ownership splits queries into reduced chunks."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        inputs = random_inputs(batch=1, heads=1, queries=9, dim=32, points=4)
        out, grads = run(impl, inputs)
    finally:
        torch.set_num_threads(threads)
    ref_out, ref_grads = run("grid_sample", inputs)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
