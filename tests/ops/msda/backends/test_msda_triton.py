"""The Triton kernels: tiling edge cases, the custom ops, and when ``triton`` may run.

Without a GPU the kernels run under the Triton interpreter on CPU tensors (see
``conftest.py``). ``test_msda_parity.py`` runs ``triton`` through every shared edge case
(borders, 1x1 and 1/5 levels, heads 1/8, head_dim 3/32/33, points 1/8, batch 1/3, one
query, non-contiguous inputs, NaN locations, float64 gradcheck, half precision); this file
adds what depends on how the kernels tile the work.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from msda_util import REFERENCE, candidate_impls, random_inputs
from test_msda_parity import EDGE_CASES

from npudet.ops import msda_impls, multi_scale_deformable_attn
from npudet.ops.msda import MSDAInputs, auto_order, get_impl, select_impl, validate_inputs
from npudet.ops.msda.verification.parity import level_layout

pytest.importorskip("triton")
from npudet.ops.msda.backends import triton as triton_impl  # noqa: E402

# Compiled kernels where there is a GPU, the interpreter on CPU tensors elsewhere.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def run_on(impl, inputs, device):
    """Output and grads (value, locations, weights) of ``impl`` on ``device``, on the CPU."""
    value, spatial, starts, loc, attn = (t.to(device) for t in inputs)
    leaves = [t.detach().clone().requires_grad_() for t in (value, loc, attn)]
    out = multi_scale_deformable_attn(leaves[0], spatial, starts, leaves[1], leaves[2], impl=impl)
    gen = torch.Generator().manual_seed(1)
    grad = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(device)
    grads = torch.autograd.grad(out, leaves, grad)
    return out.cpu(), [g.cpu() for g in grads]


def assert_triton_matches(inputs, rtol=1e-4, atol=1e-4):
    """triton on DEVICE against grid_sample on the CPU, like ``assert_matches_reference``."""
    out, grads = run_on("triton", inputs, DEVICE)
    ref_out, ref_grads = run_on(REFERENCE, inputs, "cpu")
    torch.testing.assert_close(out, ref_out, rtol=rtol, atol=atol)
    for name, got, want in zip(("value", "locations", "weights"), grads, ref_grads):
        scale = max(want.abs().max().item(), 1.0)
        torch.testing.assert_close(
            got, want, rtol=rtol, atol=atol * scale, msg=lambda m, n=name: f"grad {n}: {m}"
        )


def _on(inputs):
    return tuple(t.to(DEVICE) for t in inputs)


def test_triton_is_listed_and_runs_the_shared_parity_suite():
    assert "triton" in msda_impls()
    assert "triton" in candidate_impls()


def test_auto_never_takes_triton_on_cpu():
    assert "triton" not in auto_order("cpu")
    assert select_impl("auto", validate_inputs(*random_inputs())).NAME != "triton"
    assert auto_order("cuda")[:2] == ["mmcv", "triton"]  # mmcv first until measured slower


# Cases chosen against the tiling of ``triton_launch.plan_launches`` (``cuda`` schedule:
# tiles of 1024 elements forward, 512 backward, at 4 warps).
TILING_CASES = {
    # 8 (forward) or 4 (backward) queries a block: full blocks and a partial one
    "query-blocks": dict(queries=70, dim=32, heads=2),
    # levels * points = 9 padded to 16 samples, masked
    "padded-samples": dict(shapes=((5, 7), (3, 3), (2, 5)), points=3, dim=8),
    # head_dim 1024 (the maximum): 1 sample a chunk, 8 chunks; backward on 8 warps
    "max-head-dim": dict(shapes=((3, 4), (2, 2)), points=4, dim=1024, heads=1, queries=3),
    "head-dim-1": dict(dim=1),
    "head-dim-129": dict(dim=129, heads=1, queries=3),
    # every query samples the same few pixels: heavy atomic contention on grad_value
    "contention": dict(shapes=((2, 2),), queries=64, heads=1, points=8, low=0.3, high=0.7),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_edge_cases_match_grid_sample(case):
    assert_triton_matches(random_inputs(**EDGE_CASES[case]))


@pytest.mark.parametrize("case", sorted(TILING_CASES))
def test_tiling_matches_grid_sample(case):
    assert_triton_matches(random_inputs(**TILING_CASES[case]))


def test_float64_accumulates_in_float64():
    inputs = random_inputs(
        shapes=((5, 7), (3, 3), (2, 5)), points=3, queries=20, dtype=torch.float64
    )
    assert_triton_matches(inputs, rtol=1e-12, atol=1e-12)


def test_float32_exact_borders():
    """Pixel centres, pixel edges, map edges and one pixel beyond, where x is exact."""
    spatial, starts, keys = level_layout(((4, 8), (2, 2)))
    gen = torch.Generator().manual_seed(7)
    value = torch.randn(2, keys, 2, 5, generator=gen)
    grid = torch.arange(-3, 20, dtype=torch.float32) / 16
    loc = grid[torch.randint(0, grid.numel(), (2, 30, 2, 2, 3, 2), generator=gen)]
    attn = torch.rand(2, 30, 2, 2, 3, generator=gen)
    assert_triton_matches((value, spatial, starts, loc, attn))


def test_int32_level_tensors():
    value, spatial, starts, loc, attn = _on(random_inputs())
    got = multi_scale_deformable_attn(value, spatial.int(), starts.int(), loc, attn, impl="triton")
    want = multi_scale_deformable_attn(value, spatial, starts, loc, attn, impl="grid_sample")
    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-4, atol=1e-4)


def test_nan_and_inf_give_zero_gradients_not_nan():
    value, spatial, starts, loc, attn = random_inputs(queries=3)
    loc = loc.clone()
    loc[:, 0] = float("nan")
    loc[:, 1, ..., 1] = -float("inf")
    out, (g_value, g_loc, g_attn) = run_on("triton", (value, spatial, starts, loc, attn), DEVICE)
    assert torch.all(out[:, :2] == 0)
    assert torch.all(g_loc[:, :2] == 0) and torch.all(g_attn[:, :2] == 0)
    assert torch.isfinite(g_value).all() and torch.isfinite(g_loc).all()


@pytest.mark.parametrize("op", ["msda_triton_forward", "msda_triton_backward"])
def test_ops_pass_torch_opcheck(op):
    """The two ops are primitives (their autograd is ``msda_triton``'s Function, checked by
    the gradcheck in test_msda_parity.py): schema, fake kernel and AOT dispatch."""
    inputs = _on(random_inputs(dtype=torch.float64, low=0.1, high=0.9, queries=3, dim=3))
    if op == "msda_triton_backward":
        inputs = (torch.randn(2, 3, 6, dtype=torch.float64, device=DEVICE), *inputs)
    torch.library.opcheck(getattr(triton_impl, op), inputs)


def test_backward_op_fake_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    inputs = _on(random_inputs(batch=3, queries=4, heads=2, dim=5, dtype=torch.float16))
    grad = torch.randn(3, 4, 10, dtype=torch.float16, device=DEVICE)
    real = triton_impl.msda_triton_backward(grad, *inputs)
    with FakeTensorMode() as mode:
        fake = triton_impl.msda_triton_backward(
            mode.from_tensor(grad), *[mode.from_tensor(t) for t in inputs]
        )
    for f, r in zip(fake, real):
        assert f.shape == r.shape and f.dtype == r.dtype == torch.float16


def test_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()

    def layer(value, spatial, starts, loc, logits):
        attn = logits.softmax(-1).view(loc.shape[:-1])
        return multi_scale_deformable_attn(value, spatial, starts, loc, attn, impl="triton")

    value, spatial, starts, loc, attn = _on(random_inputs(queries=6))
    logits = attn.flatten(-2).log()
    results = []
    for fn in (torch.compile(layer, fullgraph=True, backend="aot_eager"), layer):
        leaves = [t.clone().requires_grad_() for t in (value, loc, logits)]
        out = fn(leaves[0], spatial, starts, leaves[1], leaves[2])
        results.append((out, torch.autograd.grad(out.square().sum(), leaves)))
    (out, grads), (ref, ref_grads) = results
    torch.testing.assert_close(out, ref)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


def _cpu_inputs(dtype=torch.float32):
    return MSDAInputs("cpu", dtype, 1, 10, 2, 8, 1, 4, 2, False)


def test_cpu_needs_the_interpreter(monkeypatch):
    impl = get_impl("triton")
    monkeypatch.delitem(sys.modules, triton_impl._KERNELS, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reasons = impl.not_supported_reasons(_cpu_inputs())
    assert any("TRITON_INTERPRET=1" in r for r in reasons)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert impl.not_supported_reasons(_cpu_inputs()) == []


def test_cpu_refused_when_kernels_were_compiled(monkeypatch):
    compiled = types.ModuleType(triton_impl._KERNELS)
    compiled.INTERPRETED = False
    monkeypatch.setitem(sys.modules, triton_impl._KERNELS, compiled)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    reasons = get_impl("triton").not_supported_reasons(_cpu_inputs())
    assert any("compiled before" in r for r in reasons)


def test_limits_are_reasons():
    impl = get_impl("triton")
    assert any(
        "head_dim 1025" in r
        for r in impl.not_supported_reasons(
            MSDAInputs("cuda", torch.float32, 1, 10, 2, 1025, 1, 4, 2, False)
        )
    )
    assert any(
        "float64" in r
        for r in impl.not_supported_reasons(
            MSDAInputs("npu", torch.float64, 1, 10, 2, 32, 1, 4, 2, False)
        )
    )
    assert (
        impl.not_supported_reasons(MSDAInputs("cuda", torch.float64, 1, 10, 2, 32, 1, 4, 2, False))
        == []
    )


class _AddressLog:
    """Every lane's address of every load, store and atomic the interpreter executes."""

    def __init__(self, monkeypatch):
        from triton.runtime import interpreter

        self.accesses = []
        builder = interpreter.InterpreterBuilder
        for name, arg in (
            ("create_masked_load", 0),
            ("create_masked_store", 0),
            ("create_atomic_rmw", 1),
        ):
            monkeypatch.setattr(builder, name, self._logged(getattr(builder, name), arg))

    def _logged(self, method, arg):
        def logged(builder, *args):
            ptrs = args[arg]
            size = ptrs.get_element_ty().primitive_bitwidth // 8
            self.accesses.append((method.__name__, ptrs.data.astype("int64").ravel(), size))
            return method(builder, *args)

        return logged

    def outside(self, tensors):
        """Accesses with a lane (masked off or not) outside the tensor their first lane hits."""
        spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors]
        bad = []
        for name, lanes, size in self.accesses:
            first = int(lanes.min())
            span = next(((lo, hi) for lo, hi in spans if lo <= first < hi), None)
            if span is None or int(lanes.max()) + size > span[1]:
                bad.append(f"{name}: lanes {first}..{int(lanes.max())} not inside one tensor")
        return bad


@pytest.mark.skipif(DEVICE != "cpu", reason="reads addresses through the Triton interpreter")
def test_every_lane_address_stays_inside_its_tensor(monkeypatch):
    """Masked-off lanes too: past the last query, padded samples and channels, corners off
    the map, samples moved off the map, and the x1/y1 corners of the last level's last
    pixel (past the end of value unless clamped). Compilers that read masked-off lanes
    (triton-ascend) must never leave the tensors."""
    value, spatial, starts, loc, attn = random_inputs(
        shapes=((3, 4), (2, 3)), queries=5, heads=2, dim=3, points=3, low=-0.3, high=1.3
    )
    loc = loc.clone()
    loc[:, 0] = 0.99  # every corner (y1, x1) past the bottom-right pixel of each level
    loc[:, 1, 0] = float("nan")
    grad = torch.randn(2, 5, 6)
    log = _AddressLog(monkeypatch)
    out = triton_impl.msda_triton_forward(value, spatial, starts, loc, attn)
    grads = triton_impl.msda_triton_backward(grad, value, spatial, starts, loc, attn)
    assert len(log.accesses) > 20
    assert log.outside([value, spatial, starts, loc, attn, grad, out, *grads]) == []


def test_ops_launch_exactly_the_plan_bound_once_per_signature(monkeypatch):
    from npudet.ops.msda.kernels.triton_launch import MSDAShape, plan_launches

    built = []
    build = triton_impl.build_launchers
    monkeypatch.setattr(triton_impl, "_LAUNCHERS", {})
    monkeypatch.setattr(
        triton_impl, "build_launchers", lambda *a: built.append(build(*a)) or built[-1]
    )
    inputs = _on(random_inputs(batch=2, queries=7, heads=2, dim=5, points=3))
    for _ in range(3):
        run_on("triton", inputs, DEVICE)
    plans = plan_launches("cuda", "float32", MSDAShape(2, 30, 7, 2, 5, 2, 3))
    assert [[launcher.launch for launcher in pair] for pair in built] == [
        [plans["fwd"], plans["bwd"]]
    ]
