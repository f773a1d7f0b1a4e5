"""The Ascend-shaped Triton kernels (``kernels/triton_ascend.py``): parity and lowering.

Parity: ``NPUDET_TRITON_SCHEDULE=ascend`` makes the ``triton`` implementation launch the
Ascend kernels as ``triton_ascend_launch.py`` plans them; without a device they run under the
Triton interpreter on CPU tensors (``conftest.py``), with few "cores" so that every program
loops over several work items. Every edge case of ``test_msda_parity.py`` is checked with
all three gradients against grid_sample, and, emulating triton-ascend (which reads every lane
of a masked load), no lane of any load, masked off or not, may touch memory around ``value``.

Lowering: the python of ``.venv-ascend`` (triton-ascend 3.2.0, made by ``tools/setup.sh``)
runs ``ascend_lowering.py`` on the planned launches of the benchmark cases. Without that
environment these tests fail and say how to make it: they never skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

import pytest
import torch
from msda_util import DEVICE, msda, random_inputs, reference, run
from test_msda_parity import EDGE_CASES

from npudet.benchmark.cases import CASES, launch_shapes
from npudet.ops.msda.backends import triton as triton_impl
from npudet.ops.msda.kernels import triton_ascend_launch, triton_launch
from npudet_dev.kernels import ascend_lowering, kernel_compile

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

pytest.importorskip("triton")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
ASCEND_PYTHON = os.path.join(ROOT, ".venv-ascend", "bin", "python")
LOWERING = ascend_lowering.__file__
# The Ascend kernels run compiled on an NPU (or a GPU), else interpreted on CPU tensors.
RUN_DEVICE = DEVICE if DEVICE != "cpu" else ("cuda" if torch.cuda.is_available() else "cpu")
FEW_CORES = 3


@pytest.fixture
def ascend(monkeypatch):
    """Force the Ascend schedule with FEW_CORES programs; yields the launches planned."""
    planned = []
    plan = triton_launch.SCHEDULES["ascend"]

    def recording_plan(*args):
        plans = plan(*args)
        planned.extend(plans.values())
        return plans

    monkeypatch.setenv(triton_launch.SCHEDULE_ENV, "ascend")
    monkeypatch.setitem(triton_launch.SCHEDULES, "ascend", recording_plan)
    monkeypatch.setattr(triton_ascend_launch, "vector_cores", lambda: FEW_CORES)
    # Launchers bound by an earlier call of the same signature would skip the planner.
    monkeypatch.setattr(triton_impl, "_LAUNCHERS", {}, raising=False)
    yield planned
    assert planned, "the triton implementation planned no Ascend launch"
    assert {p.module for p in planned} == {"triton_ascend"}


@contextlib.contextmanager
def lane_addresses(monkeypatch):
    """Record the address of every lane of every interpreted load and atomic, masks ignored."""
    import numpy as np
    from triton.runtime import interpreter

    seen = []
    builder = interpreter.InterpreterBuilder
    load, rmw = builder.create_masked_load, builder.create_atomic_rmw

    def recording_load(self, ptrs, mask, other, *args, **kwargs):
        seen.append(ptrs.data.ravel().astype(np.uint64))
        return load(self, ptrs, mask, other, *args, **kwargs)

    def recording_rmw(self, op, ptrs, val, mask, *args, **kwargs):
        seen.append(ptrs.data.ravel().astype(np.uint64))
        return rmw(self, op, ptrs, val, mask, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(builder, "create_masked_load", recording_load)
        patch.setattr(builder, "create_atomic_rmw", recording_rmw)
        yield seen


def guarded(value: torch.Tensor):
    """``value`` copied into the middle of a NaN buffer: (buffer, view equal to value)."""
    n = value.numel()
    buf = torch.full((3 * n + 4096,), float("nan"), dtype=value.dtype)
    view = buf[n + 2048 : 2 * n + 2048].view(value.shape)
    view.copy_(value)
    return buf, view


def lanes_outside(seen, buf: torch.Tensor, view: torch.Tensor) -> int:
    """How many recorded lanes fall in ``buf`` but outside ``view``."""
    import numpy as np

    lanes = np.concatenate(seen)
    size = buf.element_size()
    lo, v0 = buf.data_ptr(), view.data_ptr()
    v1, hi = v0 + view.numel() * size, lo + buf.numel() * size
    return int((((lanes >= lo) & (lanes < v0)) | ((lanes >= v1) & (lanes < hi))).sum())


def assert_close_to_reference(out, grads, inputs, rtol, atol):
    ref_out, ref_grads = reference(inputs)
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=rtol, atol=atol)
    for name, got, want in zip(("value", "locations", "weights"), grads, ref_grads):
        scale = max(want.abs().max().item(), 1.0)
        torch.testing.assert_close(
            got.float(),
            want.float(),
            rtol=rtol,
            atol=atol * scale,
            msg=lambda m, n=name: f"grad {n}: {m}",
        )


def assert_matches_reference(inputs, rtol=1e-4, atol=1e-4):
    out, grads = run("triton", inputs, device=RUN_DEVICE)
    assert_close_to_reference(out, grads, inputs, rtol, atol)


def assert_matches_in_bounds(monkeypatch, inputs, rtol=1e-4, atol=1e-4):
    """``assert_matches_reference``; interpreted, also no lane read around ``value``."""
    if RUN_DEVICE != "cpu":  # compiled: no lane addresses to record
        assert_matches_reference(inputs, rtol, atol)
        return
    value, spatial, starts, loc, attn = inputs
    buf, view = guarded(value)
    # value's leaf must stay inside the guard buffer: detach, never clone.
    leaves = [view.detach().requires_grad_(), loc.clone().requires_grad_()]
    leaves.append(attn.clone().requires_grad_())
    with lane_addresses(monkeypatch) as seen:
        out = msda(leaves[0], spatial, starts, leaves[1], leaves[2], impl="triton")
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad(out, leaves, grad)
    assert seen
    assert lanes_outside(seen, buf, view) == 0
    assert_close_to_reference(out, grads, inputs, rtol, atol)


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_parity_and_in_bounds_reads(case, ascend, monkeypatch):
    assert_matches_in_bounds(monkeypatch, random_inputs(**EDGE_CASES[case]))


def test_address_recording_sees_masked_off_lanes(monkeypatch):
    """The check above can fail: a masked load past the end of a tensor is caught."""
    if RUN_DEVICE != "cpu":
        pytest.skip("lane addresses are recorded only under the interpreter")
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(dst + i, tl.load(src + i, mask=i < n, other=0.0), mask=i < n)

    buf, view = guarded(torch.arange(8, dtype=torch.float32))
    out = torch.empty(8)
    with lane_addresses(monkeypatch) as seen:
        copy_kernel[(1,)](view, out, 8, BLOCK=16)
    assert torch.equal(out, view)
    assert lanes_outside(seen, buf, view) == 8


def test_exact_borders_match_grid_sample(ascend, monkeypatch):
    """Locations on pixel centres and edges, map edges and one pixel beyond (exact in float32).

    The bottom-right corner of the last level of the last batch is sampled: its unclamped x1
    and y1 corners lie past the end of value.
    """
    value, spatial, starts, _, attn = random_inputs(shapes=((4, 8), (2, 2)), queries=24, dim=5)
    grid = torch.arange(-3, 20, dtype=torch.float32) / 16
    gen = torch.Generator().manual_seed(3)
    loc = grid[torch.randint(0, grid.numel(), (*attn.shape, 2), generator=gen)]
    loc[-1, 0, -1, -1, 0] = 1.0
    assert_matches_in_bounds(monkeypatch, (value, spatial, starts, loc, attn), 1e-5, 1e-5)
    # head_dim 5 < 8: 32-byte windows, and the last row's window starts 3 channels before it
    assert {p.constexprs["DWIN"] for p in ascend} == {8}


def test_tiny_value_keeps_exact_windows(ascend, monkeypatch):
    """A value of fewer than two 32-byte windows (3 elements) is read row by row, in bounds."""
    inputs = random_inputs(shapes=((1, 1),), batch=1, queries=3, heads=1, dim=3, points=2)
    assert_matches_in_bounds(monkeypatch, inputs)
    assert {p.constexprs["DWIN"] for p in ascend} == {2}


def test_wide_head_dim_and_many_work_items(ascend, monkeypatch):
    """head_dim 129: two overlapping windows of 128; 20 queries: many items per program."""
    assert_matches_in_bounds(monkeypatch, random_inputs(queries=20, heads=1, dim=129, points=3))
    assert {p.constexprs["DWIN"] for p in ascend} == {128}


def test_nan_locations_contribute_nothing(ascend):
    value, spatial, starts, loc, attn = random_inputs(queries=4)
    loc = loc.clone()
    loc[:, 1] = float("nan")
    loc[:, 2, :, :, :, 0] = float("inf")
    out, grads = run("triton", (value, spatial, starts, loc, attn), device=RUN_DEVICE)
    assert torch.all(out[:, 1:3] == 0) and torch.isfinite(out).all()
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.all(grads[1][:, 1:3] == 0) and torch.all(grads[2][:, 1:3] == 0)


# 32-byte rows; 16-byte rows in 32-byte windows. Both keep the output's size a multiple of 16:
# run() draws grad_out in the output's dtype, and torch.randn's float16 draws match float32's
# (the reference's) only for such sizes.
@pytest.mark.parametrize("dim", [16, 8])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype, dim, ascend):
    inputs = random_inputs(dim=dim, low=0.0, high=1.0)
    ref_out, ref_grads = reference(inputs)
    out, grads = run(
        "triton",
        tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs),
        device=RUN_DEVICE,
    )
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    torch.testing.assert_close(out.float(), ref_out, rtol=5e-2, atol=5e-2)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.float(), want, rtol=5e-2, atol=5e-2 * want.abs().max())
    assert {p.constexprs["DWIN"] for p in ascend} == {16}


def test_float64_is_refused(monkeypatch):
    monkeypatch.setenv(triton_launch.SCHEDULE_ENV, "ascend")
    inputs = random_inputs(dtype=torch.float64)
    with pytest.raises(ValueError, match="float64"):
        run("triton", inputs, device=RUN_DEVICE)


def _shape_of(inputs) -> triton_launch.MSDAShape:
    value, spatial, _, loc, _ = inputs
    bs, keys, heads, dim = value.shape
    return triton_launch.MSDAShape(bs, keys, loc.shape[1], heads, dim, len(spatial), loc.shape[4])


def _shape(case) -> triton_launch.MSDAShape:
    return triton_launch.MSDAShape(
        case.batch,
        case.num_keys,
        case.num_queries,
        case.num_heads,
        case.head_dim,
        len(case.levels),
        case.num_points,
    )


def test_grid_is_one_program_per_core_and_never_above_65535(monkeypatch):
    huge = triton_launch.MSDAShape(64, 13600, 40000, 8, 32, 4, 4)  # 40k BEV queries, batch 64
    for cores in (24, 48, 100000):
        monkeypatch.setattr(triton_ascend_launch, "vector_cores", lambda c=cores: c)
        for launch in triton_launch.plan_launches("ascend", "float32", huge).values():
            assert launch.grid == (min(cores, triton_ascend_launch.MAX_PROGRAMS), 1, 1)
    tiny = triton_launch.MSDAShape(1, 4, 1, 1, 8, 1, 1)  # one work item
    assert triton_launch.plan_launches("ascend", "float32", tiny)["fwd"].grid == (1, 1, 1)


def lower(jobs):
    """Results of ``ascend_lowering.py`` run by .venv-ascend's python on ``jobs``."""
    if not os.path.exists(ASCEND_PYTHON):
        pytest.fail(
            f"{ASCEND_PYTHON} is missing: run `bash tools/setup.sh` (it makes .venv-ascend with "
            "triton-ascend 3.2.0 and ascendnpu-ir 1.2.0; its log says why if that failed)"
        )
    proc = subprocess.run(
        [ASCEND_PYTHON, "-I", LOWERING],  # -I: no PYTHONPATH, whose triton would shadow its own
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def compile_once(planned, **extra):
    """``{tag: answer}`` for ``{tag: launch}``, each distinct launch lowered (and with
    ``hivm=True`` compiled) once."""
    first = {}
    for tag, launch in planned.items():
        first.setdefault(kernel_compile.launch_key(launch) + str(launch.grid), tag)
    jobs = [kernel_compile.lowering_job(tag, planned[tag], **extra) for tag in first.values()]
    answers = {r["tag"]: r for r in lower(jobs)}
    assert set(answers) == set(first.values())
    return {
        tag: answers[first[kernel_compile.launch_key(launch) + str(launch.grid)]]
        for tag, launch in planned.items()
    }


ASCEND_DTYPES = ("float32", "float16", "bfloat16")
UB_BYTES = 192 * 1024  # the UB of an Ascend 910B AI vector core
LINALG_UB_BUDGET = 96 * 1024  # the estimate has no double buffering: half the UB


@pytest.fixture(scope="module")
def compiled():
    """Every planned ``ascend`` launch (benchmark cases and odd shapes x float32/float16/bfloat16
    x fwd/bwd, tagged "case/dtype/kind") lowered by triton-ascend and compiled by
    bishengir-compile through HIVM, each distinct launch once (about a minute on 2 cores)."""
    planned = {
        f"{case}/{dtype}/{kind}": launch
        for case, shape in kernel_compile.check_shapes(launch_shapes()).items()
        for dtype in ASCEND_DTYPES
        for kind, launch in triton_launch.plan_launches("ascend", dtype, shape).items()
    }
    return compile_once(planned, hivm=True)


def test_planned_launches_lower_without_scalar_atomics_or_loads(compiled):
    """Linalg (triton-ascend's stage): no scalar atomics or loads, any head_dim; UB estimate."""
    assert {"ddetr-enc/float32/fwd", "odd-d3/bfloat16/bwd", "odd-d257/float16/fwd"} <= set(compiled)
    for tag, r in compiled.items():
        where = f"{tag}: {r}"
        assert r["lowered"] and r["error"] is None, where
        assert r["scalar_atomics"] == 0 and r["scalar_loads"] == 0, where
        assert r["masked_gathers"] == 0, where  # no masked-off address is ever read
        assert 0 < r["ub_bytes"] <= LINALG_UB_BUDGET, where
        assert r["programs"] <= 65535, where
        assert r["row_gathers_per_item"] > 0, where
        if tag.endswith("/bwd"):
            assert r["row_atomics_per_item"] == r["row_gathers_per_item"], where


def assert_compiled_without_element_work(tag, r):
    """The HIVM rung passed: no scalar atomics, element copies in loops, global scalar loads
    or one-element vector ops; the UB plan fits on the first try."""
    where = f"{tag}: " + (r.get("hivm_error") or r.get("error") or str(r))
    assert r["lowered"] and r["hivm_ok"], where
    assert r["scalar_atomics"] == 0 and r["scalar_loads"] == 0, where
    assert r["plan_memory_runs"] == 1 and r["ub_planned_bytes"] <= UB_BYTES, where
    assert r["hivm_scalar_atomics"] == 0 and r["hivm_looped_element_copies"] == 0, where
    assert r["hivm_gm_scalar_loads"] == 0 and r["hivm_single_point_vector_ops"] == 0, where


def test_every_planned_launch_compiles_through_hivm(compiled):
    """bishengir-compile runs each launch through HFusion, HIVM, PlanMemory and GraphSyncSolver
    and stops only for want of hivmc. What it made: the UB plan fits with double buffering on
    the first try, one copy of the body, whole-row atomics only, no element copies or global
    scalar loads in any loop, no one-element vector op."""
    for tag, r in compiled.items():
        assert_compiled_without_element_work(tag, r)
        where = f"{tag}: {r}"
        assert r["hivm_error"] is None and r["multi_buffers"] > 0, where
        assert r["hivm_body_copies"] == 1, where
        assert r["hivm_vector_ops"] > 50 and r["hivm_sync_ops"] > 0, where
        atomics = 8 if tag.startswith("odd-d257") else 4  # 4 corners, in 1 or 2 windows
        assert r["hivm_row_atomics"] == (atomics if tag.endswith("/bwd") else 0), where


@pytest.mark.slow
def test_any_head_dim_compiles_through_hivm():
    """head_dim 1 to 128 (powers of two, one below and above them, odd ones) in float32 and
    float16, 3 levels: the same rung as the planned launches (about 2 minutes on 2 cores)."""
    planned = {
        f"d{dim}/{dtype}/{kind}": launch
        for dim in (1, 2, 4, 5, 6, 7, 9, 12, 15, 17, 24, 31, 33, 48, 96, 100, 128)
        for dtype in ("float32", "float16")
        for kind, launch in triton_launch.plan_launches(
            "ascend", dtype, triton_launch.MSDAShape(2, 121, 77, 4, dim, 3, 4)
        ).items()
    }
    for tag, r in compile_once(planned, hivm=True).items():
        assert_compiled_without_element_work(tag, r)


def test_triton_compile_stops_at_the_npu_binary_stage(compiled):
    """``triton.compile(src, target=GPUTarget("npu", ...))`` with bishengir-compile on PATH, as
    an NPU user's first call: its own Linalg is the one checked here, and without CANN it stops
    before calling the compiler (the target arch comes from CANN's runtime)."""
    launch = triton_launch.plan_launches("ascend", "float32", _shape(CASES["ddetr-dec"]))["fwd"]
    (r,) = lower([kernel_compile.lowering_job("triton.compile", launch, triton_compile=True)])
    assert r["lowered"] and r["triton_compile_same_linalg"], r
    if r["triton_compile"] != "compiled":
        assert r["triton_compile"] == "ConvertLinalgRToBinary", r
        assert "ASCEND_HOME_PATH is not set" in r["triton_compile_error"], r


def test_hivm_rung_fails_on_anything_but_the_missing_hivmc(tmp_path):
    """Only the exact hivmc complaint passes, and only after PlanMemory and GraphSyncSolver
    printed the kernel: another error, or no plan, fails with the compiler's own words."""
    launch = triton_launch.plan_launches("ascend", "float32", _shape(CASES["ddetr-dec"]))["fwd"]
    said = "\n".join(f"echo '{line}' >&2" for line in ascend_lowering.HIVMC_MISSING)
    fakes = {}
    for name, extra in (("no_plan", ""), ("other_error", "echo 'error: UB overflow' >&2")):
        fakes[name] = tmp_path / name
        fakes[name].write_text(f"#!/bin/sh\n{said}\n{extra}\nexit 1\n")
        fakes[name].chmod(0o755)
    jobs = [
        kernel_compile.lowering_job(name, launch, hivm=True, compiler=str(path))
        for name, path in fakes.items()
    ]
    jobs.append(kernel_compile.lowering_job("bad_target", launch, hivm=True, arch="Ascend000"))
    results = {r["tag"]: r for r in lower(jobs)}
    assert not any(r["hivm_ok"] for r in results.values()), results
    assert "no IR printed after hivm-plan-memory" in results["no_plan"]["hivm_error"]
    assert "UB overflow" in results["other_error"]["hivm_error"]
    assert "Cannot find option named 'Ascend000'" in results["bad_target"]["hivm_error"]


def test_parity_edge_shapes_lower():
    """The launches of every parity edge case (a one-query call included) lower: one-query
    tiles made triton-adapter-opt 3.2.0 assert in the backward."""
    planned = {
        f"{case}/{kind}": launch
        for case, kwargs in EDGE_CASES.items()
        for kind, launch in triton_launch.plan_launches(
            "ascend", "float32", _shape_of(random_inputs(**kwargs))
        ).items()
    }
    for tag, r in compile_once(planned).items():
        assert r["lowered"] and r["scalar_atomics"] == 0, f"{tag}: {r}"


def test_lowering_counts_what_it_claims(tmp_path):
    """A row-masked atomic and a masked gather are counted as scalar atomics / masked gathers,
    in the Linalg and after HIVM."""
    kernel = tmp_path / "bad_kernels.py"
    kernel.write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def scatter(dst, idx, src, D: tl.constexpr):\n"
        "    i = tl.load(idx + tl.arange(0, 8))\n"
        "    d = tl.arange(0, D)\n"
        "    m = (i > 0)[:, None] & (d < D)[None, :]\n"
        "    v = tl.load(src + i[:, None] * D + d[None, :], mask=m, other=0.0)\n"
        "    tl.atomic_add(dst + i[:, None] * D + d[None, :], v, mask=m)\n"
    )
    sig = {"dst": "*fp32", "idx": "*i32", "src": "*fp32"}
    bad = dict(tag="bad", module_path=str(kernel), kernel="scatter", signature=sig)
    (r,) = lower([dict(bad, constexprs={"D": 32}, grid=[70000, 1, 1], hivm=True)])
    assert r["lowered"] and r["hivm_ok"], r
    assert r["hivm_scalar_atomics"] == 1 and r["hivm_scalar_atomics_per_item"] == 8 * 32, r
    assert r["scalar_atomics"] == 1 and r["scalar_atomics_per_item"] == 8 * 32
    assert r["masked_gathers"] == 1 and r["row_gathers_per_item"] == 8
    assert not r["grid_ok"]


def test_float64_does_not_lower():
    """triton-ascend's front end refuses float64: the planner's refusal is not a guess."""
    launch = triton_launch.plan_launches("ascend", "float32", _shape(CASES["ddetr-dec"]))["fwd"]
    f64 = kernel_compile.lowering_job("f64", launch)
    f64["signature"] = {k: v.replace("fp32", "fp64") for k, v in launch.signature.items()}
    (r,) = lower([f64])
    assert not r["lowered"] and "fp64" in r["error"]


def _tool_run(code: str) -> None:
    """A real child process in triton-adapter-opt's place (``check=True``, as triton runs it)."""
    import sys

    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_a_crashed_lowering_is_retried_once_and_a_diagnostic_is_not(monkeypatch):
    """triton-adapter-opt killed by a signal (an MLIR assertion aborts it) is run once more and
    the crash is reported beside the result; a crash on the rerun, or a tool that exits with a
    diagnostic, fails as before."""
    tries = []

    def crash_then(then: str):
        def fake_lower(fn, signature, constexprs):
            tries.append(1)
            _tool_run("import os; os.abort()" if len(tries) == 1 else then)
            return "ttir", "linalg"

        return fake_lower

    monkeypatch.setattr(ascend_lowering, "lower", crash_then("pass"))
    ttir, linalg, crash = ascend_lowering.lower_retrying_a_crash(None, {}, {})
    assert (ttir, linalg, len(tries)) == ("ttir", "linalg", 2) and crash is not None
    tries.clear()
    monkeypatch.setattr(ascend_lowering, "lower", crash_then("import os; os.abort()"))
    with pytest.raises(subprocess.CalledProcessError):
        ascend_lowering.lower_retrying_a_crash(None, {}, {})
    assert len(tries) == 2
    tries.clear()

    def diagnostic(fn, signature, constexprs):
        tries.append(1)
        _tool_run("import sys; sys.exit('error: bad op')")

    monkeypatch.setattr(ascend_lowering, "lower", diagnostic)
    with pytest.raises(subprocess.CalledProcessError):
        ascend_lowering.lower_retrying_a_crash(None, {}, {})
    assert len(tries) == 1
