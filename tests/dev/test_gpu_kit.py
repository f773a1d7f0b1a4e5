"""The GPU kit (dev/tools/gpu_kit.py, npudet_dev.gpu_kit): its CPU dry run end to end, the mmcv
bundle and build recipe, the report's goals, and that it needs no OpenMMLab package."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import types
from pathlib import Path

import pytest
import torch
from openmmlab_util import without_openmmlab

from npudet.benchmark.cases import CASES, LARGE_CASES, make_inputs
from npudet.ops.msda import get_impl, msda_impls
from npudet.ops.msda.backends import mmcv as mmcv_impl
from npudet.ops.msda.backends import mmcv_cuda_lib
from npudet_dev.gpu_kit import child, ddetr, report
from npudet_dev.gpu_kit import run as kit_run

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

ROOT = Path(__file__).resolve().parents[2]


def _env(hidden: Path) -> dict:
    """The environment of a GPU machine: no triton interpreter, and no OpenMMLab package
    (hidden by a ``sitecustomize`` in ``hidden``, in every child process)."""
    env = without_openmmlab(hidden)
    env.pop("TRITON_INTERPRET", None)  # as a user runs it: triton is no CPU kernel
    return env


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One ``run --device cpu --dry-run`` in a child process, as the README gives it, with
    mmcv, mmdet and mmengine hidden, as on the GPU machine."""
    out = tmp_path_factory.mktemp("gpu_kit")
    env = _env(tmp_path_factory.mktemp("no_openmmlab"))
    cmd = [sys.executable, str(ROOT / "dev" / "tools" / "gpu_kit.py"), "run", "--device", "cpu"]
    cmd += ["--dry-run", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads((out / "cpu-dry-run.json").read_text()), out


def test_dry_run_runs_every_part(dry_run):
    result, out = dry_run
    parts = result["parts"]
    for name in ("compile_grid_sample", "bench_float32", "bench_bfloat16", "train_grid_sample"):
        assert parts[name]["status"] == "ok", (name, parts[name])
    assert parts["train_gather"]["status"] == "ok" and parts["check_device"]["status"] == "ok"
    # The device tests ran on the CPU: their CPU versions pass, the CUDA ones skip.
    assert parts["device_tests"]["status"] == "ok", result["device_tests"]
    tests = result["device_tests"]
    assert tests["passed"] >= 2 and tests["skipped"] >= 3 and tests["failed"] == []
    # Nothing on the CPU to compare in float16 (mmcv and triton are CUDA kernels here).
    assert parts["bench_float16"]["status"].startswith("skipped")
    assert parts["mmcv_build"]["status"] == "skipped: no CUDA device"
    assert result["seconds"] < result["budget_s"]
    names = {p.name for p in out.iterdir()}
    assert names == {f"cpu-dry-run{s}" for s in (".json", ".md", ".log", "-check_device.json")}


def test_dry_run_benchmark_rows(dry_run):
    rows = dry_run[0]["bench"]["rows"]
    assert not dry_run[0]["bench"]["errors"]
    got = {(r["dtype"], r["impl"]) for r in rows}
    assert got == {(d, i) for d in ("float32", "bfloat16") for i in ("grid_sample", "gather")}
    for r in rows:
        assert r["case"] == "kit-dry" and r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0
        assert r["kernel_ms"] is None and r["fwd_device_ms"] is None  # GPU times: CUDA only
        limit = 1e-4 if r["dtype"] == "float32" else 5e-2
        assert r["max_rel_grad_err"] <= limit, r


def test_dry_run_training_and_compile(dry_run):
    result = dry_run[0]
    train = {r["impl"]: r for r in result["train"]}
    assert set(train) == {"grid_sample", "gather"}
    # Same seed, same model: the first loss depends on the MSDA implementation only through
    # round-off.
    assert train["gather"]["first_loss"] == pytest.approx(
        train["grid_sample"]["first_loss"], rel=1e-5
    )
    assert all(r["ms"] > 0 and r["params"] > 0 for r in train.values())
    (compiled,) = result["compile"]
    assert compiled["impl"] == "grid_sample" and compiled["backend"] == "eager"
    assert compiled["eager"]["ms"] > 0 and compiled["compiled"]["ms"] > 0


def test_dry_run_host_cost(dry_run):
    result = dry_run[0]
    assert result["parts"]["host_cost"]["status"] == "ok"
    impls = {r["impl"] for r in result["host_cost"]}
    assert {"grid_sample", "gather"} <= impls and "triton" not in impls


def test_dry_run_check_and_markdown(dry_run):
    result, out = dry_run
    correct = {(r["impl"], r["dtype"]): r["correct"] for r in result["check"]["summary"]["table"]}
    assert correct[("grid_sample", "float32")] and correct[("gather", "float32")]
    assert {impl for impl, _ in correct} == {"grid_sample", "gather"}  # the kit's, usable here
    text = (out / "cpu-dry-run.md").read_text()
    headings = ("## MSDA benchmark", "## Training iteration", "## torch.compile", "## Host cost")
    for heading in (*headings, "## Device check", "## Goals"):
        assert heading in text
    assert "| kit-dry | bfloat16 | gather |" in text
    assert "| grid_sample | float32 | yes |" in text  # the device check's summary, read back


def test_goals_from_a_report():
    def row(dtype, impl, ms, gpu):
        return {
            "case": "ddetr-enc-coco",
            "dtype": dtype,
            "impl": impl,
            "fwd_bwd_ms": ms,
            "kernel_ms": gpu,
        }

    rows = [row("float32", "mmcv", 3.0, 2.0), row("float32", "triton", 2.0, 1.0)]
    rows += [row("float16", "mmcv", 3.0, 2.0), row("bfloat16", "triton", 2.0, 0.5)]
    train = [{"impl": "grid_sample", "ms": 100.0}, {"impl": "triton", "ms": 80.0}]
    goals = {
        g["goal"].split(" at ")[0]: g
        for g in report.goals({"bench": {"rows": rows}, "train": train})
    }
    f32 = goals["triton vs mmcv fwd+bwd, float32"]
    assert (f32["x"], f32["gpu_x"], f32["met"]) == (1.5, 2.0, True)
    half = goals["triton bfloat16 vs mmcv float16 fwd+bwd"]
    assert (half["x"], half["gpu_x"], half["met"]) == (1.5, 4.0, False)  # per call below 2x
    assert goals["triton vs mmcv fwd+bwd, float16"]["x"] is None  # no float16 triton row
    training = goals["training iteration, triton vs grid_sample"]
    assert training["x"] == pytest.approx(1.25) and training["met"] is False


def test_gpu_plan_covers_the_issue_cases():
    """On a GPU with the mmcv library: every model and training-size case, the four
    implementations in float32, mmcv in float16 only (it has no bfloat16 kernel)."""
    if "triton" not in msda_impls():
        pytest.skip("triton not installed")
    plans = {d: kit_run.bench_plan(d, "cuda", False, mmcv_lib=True) for d in kit_run.DTYPE_IMPLS}
    cases, impls, repeat, _ = plans["float32"]
    assert set(cases) == set(CASES) | set(LARGE_CASES) and repeat == 10
    assert impls == ["grid_sample", "gather", "triton", "mmcv"]
    assert "mmcv" in plans["float16"][1] and "mmcv" not in plans["bfloat16"][1]
    assert "mmcv" not in kit_run.bench_plan("float32", "cuda", False, mmcv_lib=False)[1]
    assert kit_run.bench_plan("float32", "cpu", True, False)[1] == ["grid_sample", "gather"]


def test_markdown_of_a_run_cut_short():
    """Failed, timed-out and never-run parts are reported with their reasons, not dropped."""
    result = {
        "gpu": "NVIDIA H200",
        "dry_run": False,
        "budget_s": 540.0,
        "seconds": 541.0,
        "environment": {"torch": "2.11.0+cu130", "packages": {"triton": "3.6.0"}},
        "parts": {"train_triton": {"status": "timeout", "seconds": 60.0}},
        "mmcv_build": {"error": "nvcc failed (1): cusparse.h: No such file"},
        "bench": {"rows": [], "errors": {"bev-sca-base float32": "OutOfMemoryError: CUDA"}},
        "train": [{"impl": "triton", "error": "timeout"}],
        "compile": [
            {
                "impl": "triton",
                "mode": "reduce-overhead",
                "eager": {"ms": 2.0},
                "error": "BackendCompilerFailed: boom",
            }
        ],
        "host_cost": None,
        "check": None,
    }
    text = report.markdown(result)
    for expected in (
        "train_triton timeout (60 s)",
        "cusparse.h",
        "OutOfMemoryError",
        "| triton | - | - | - | - | timeout |",
        "BackendCompilerFailed: boom",
        "| triton | reduce-overhead | 2.00 | - | - |",
    ):
        assert expected in text, expected
    # benchmark table, host cost, device check, device tests
    assert text.count("(not run)") == 4
    assert "not measured" in text


def test_training_model_matches_the_benchmark_case():
    """The training iteration's encoder attends over the same map as ``ddetr-enc-coco``."""
    case = LARGE_CASES["ddetr-enc-coco"]
    shape = ddetr.DDETRShape()
    assert tuple(shape.level_shapes()) == case.levels
    assert (shape.batch, shape.heads, shape.dim // shape.heads, shape.points) == (
        case.batch,
        case.num_heads,
        case.head_dim,
        case.num_points,
    )


def test_hiding_openmmlab_works(tmp_path):
    """The dry run's environment really hides them (else the dry run proves nothing)."""
    code = "import importlib\nfor name in ('mmcv', 'mmdet', 'mmengine', 'torch'):\n"
    code += "    try:\n        importlib.import_module(name); print(name, 'imported')\n"
    code += "    except ImportError:\n        print(name, 'hidden')\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True
    )
    assert proc.stdout.split("\n")[:4] == [
        "mmcv hidden",
        "mmdet hidden",
        "mmengine hidden",
        "torch imported",
    ], proc.stdout + proc.stderr[-2000:]


def _sdist(path: Path, members: dict) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_extract_sources_takes_only_the_named_members(tmp_path):
    csrc = f"mmcv-{mmcv_cuda_lib.MMCV_VERSION}/mmcv/ops/csrc/"
    members = {csrc + rel: rel.encode() for rel in mmcv_cuda_lib.SOURCES}
    members[mmcv_cuda_lib.LICENSE] = b"Apache"
    members[csrc + "pytorch/cuda/other_op.cu"] = b"not needed"
    members["../escape.txt"] = b"never written"
    sdist = _sdist(tmp_path / "mmcv.tar.gz", members)
    with pytest.raises(ValueError, match="sha256"):
        mmcv_cuda_lib.extract_sources(sdist, tmp_path / "out")
    dest = mmcv_cuda_lib.extract_sources(sdist, tmp_path / "out", expected_sha256=None)
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == sorted([*mmcv_cuda_lib.SOURCES, "LICENSE", "SOURCE.json"])
    assert (dest / mmcv_cuda_lib.KERNEL).read_bytes() == mmcv_cuda_lib.KERNEL.encode()
    assert not (tmp_path / "escape.txt").exists()
    del members[csrc + mmcv_cuda_lib.KERNEL]
    partial = _sdist(tmp_path / "partial.tar.gz", members)
    with pytest.raises(ValueError, match="missing"):
        mmcv_cuda_lib.extract_sources(partial, tmp_path / "out2", expected_sha256=None)


def test_bundle_from_mmcv_sdist_fits_the_carry_limit(tmp_path):
    """The real bundle: mmcv 2.1.0's sdist (kept by ``dev/tools/gpu_kit.py bundle``, else
    downloaded by pip), its pinned hash, and what a device run sends, under 64 MiB."""
    kept = ROOT / ".gpu_kit" / "sdist" / mmcv_cuda_lib.SDIST_NAME
    try:
        sources = mmcv_cuda_lib.make_bundle(tmp_path, kept if kept.is_file() else None)
    except RuntimeError as exc:  # no network and no kept sdist
        pytest.skip(f"mmcv's sdist unavailable: {exc}")
    record = json.loads((sources / "SOURCE.json").read_text())
    assert record["sha256"] == mmcv_cuda_lib.SDIST_SHA256
    kernel = (sources / mmcv_cuda_lib.KERNEL).read_text()
    assert "ms_deform_attn_cuda_forward" in kernel and "ms_deform_attn_cuda_backward" in kernel
    size = mmcv_cuda_lib.folder_bytes(sources)
    assert 0 < size < 1 << 20
    assert kit_run.travel_bytes([sources]) < kit_run.CARRY_LIMIT


def test_build_commands(tmp_path):
    sources, cuda = tmp_path / "mmcv_msda", Path("/opt/cuda")
    nvcc, cxx, link = mmcv_cuda_lib.build_commands(sources, tmp_path, "90", cuda)
    assert nvcc[0] == "/opt/cuda/bin/nvcc" and nvcc[nvcc.index("-c") + 1].endswith(
        mmcv_cuda_lib.KERNEL
    )
    assert "-gencode=arch=compute_90,code=sm_90" in nvcc and "--expt-relaxed-constexpr" in nvcc
    assert cxx[cxx.index("-c") + 1].endswith(mmcv_cuda_lib.WRAPPER)
    assert f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}" in cxx
    assert {"-ltorch_cuda", "-lc10_cuda", "-lcudart", "-shared", "-Wl,--no-undefined"} <= set(link)
    assert link[-1] == str(tmp_path / mmcv_cuda_lib.LIB_NAME)
    assert f"-I{sysconfig.get_paths()['include']}" not in nvcc + cxx  # no Python headers
    torch_has_thc = (Path(torch.__file__).parent / "include" / "THC" / "THCAtomics.cuh").exists()
    assert any("compat" in arg for arg in nvcc) != torch_has_thc
    assert len(mmcv_cuda_lib.build_commands(sources, tmp_path, "90", cuda, compile_only=True)) == 2
    other = tmp_path / "unpacked" / "torch"  # another torch version's folder
    nvcc, cxx, link = mmcv_cuda_lib.build_commands(sources, tmp_path, "90", cuda, torch_root=other)
    assert f"-I{other / 'include'}" in nvcc and f"-I{other / 'include'}" in cxx
    assert f"-L{other / 'lib'}" in link


def test_mmcv_cuda_lib_route_reports_a_library_that_does_not_load(monkeypatch, tmp_path):
    missing = tmp_path / "absent.so"
    monkeypatch.setenv(mmcv_cuda_lib.LIB_ENV, str(missing))
    mmcv_impl._cuda_lib.cache_clear()
    try:
        ops, reason = mmcv_impl._cuda_lib()
        assert ops is None and str(missing) in reason
        monkeypatch.delenv(mmcv_cuda_lib.LIB_ENV)
        mmcv_impl._cuda_lib.cache_clear()
        assert mmcv_impl._cuda_lib() == (None, "")
    finally:
        mmcv_impl._cuda_lib.cache_clear()


def test_mmcv_cuda_lib_route_wiring(monkeypatch):
    """The ``cuda_lib`` route's autograd.Function against stand-in operators with the
    library's signatures (computed by ``grid_sample``): outputs and the three gradients
    arrive in the places mmcv's Function gives them."""
    reference = get_impl("grid_sample")
    calls = []

    def forward(value, shapes, starts, locations, weights, step):
        calls.append(step)
        return reference.forward(value, shapes, starts, locations, weights)

    def backward(value, shapes, starts, locations, weights, grad_output, step):
        leaves = [t.detach().requires_grad_() for t in (value, locations, weights)]
        with torch.enable_grad():  # a Function's backward runs without grad mode
            out = reference.forward(leaves[0], shapes, starts, leaves[1], leaves[2])
            return torch.autograd.grad(out, leaves, grad_output)

    stand_in = types.SimpleNamespace(
        ms_deform_attn_forward=forward, ms_deform_attn_backward=backward
    )
    monkeypatch.setattr(mmcv_impl, "_cuda_lib", lambda: (stand_in, ""))
    monkeypatch.setattr(mmcv_impl, "compiled_cuda_version", lambda: None)
    assert mmcv_impl.route() == "cuda_lib"
    value, shapes, starts, loc, attn = make_inputs(child.DRY_CASE, dtype=torch.float64)
    leaves = [t.requires_grad_() for t in (value, loc, attn)]
    out = get_impl("mmcv").forward(leaves[0], shapes.int(), starts.int(), leaves[1], leaves[2])
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad)
    expected_out = reference.forward(leaves[0], shapes, starts, leaves[1], leaves[2])
    expected = torch.autograd.grad(expected_out, leaves, grad)
    torch.testing.assert_close(out, expected_out)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert calls == [mmcv_impl.IM2COL_STEP]


@pytest.mark.slow
def test_mmcv_kernel_compiles_for_sm90(tmp_path, monkeypatch):
    """nvcc compiles mmcv's kernel and the wrapper for sm_90 against this torch's headers.

    A CPU torch wheel lacks the generated ``c10/cuda/impl/cuda_cmake_macros.h`` (one define,
    written here) and the CUDA libraries' headers (cuSPARSE, cuBLAS, cuSOLVER: from the
    nvidia pip packages, named by ``$NPUDET_CUDA_INCLUDE``); no link without CUDA libtorch.
    """
    if mmcv_cuda_lib.cuda_home() is None:
        pytest.skip("no CUDA toolkit (nvcc)")
    if not any((d / "cusparse.h").is_file() for d in mmcv_cuda_lib.library_include_dirs()):
        pytest.skip(f"no cusparse.h: set {mmcv_cuda_lib.INCLUDE_ENV} to the nvidia headers")
    kept = ROOT / ".gpu_kit" / "sdist" / mmcv_cuda_lib.SDIST_NAME
    if not kept.is_file():
        pytest.skip("run dev/tools/gpu_kit.py bundle first")
    sources = mmcv_cuda_lib.make_bundle(tmp_path, kept)
    stub = tmp_path / "stub"
    macros = (
        Path(torch.__file__).parent / "include" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    )
    if not macros.exists():
        (stub / "c10" / "cuda" / "impl").mkdir(parents=True)
        (stub / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("#pragma once\n")
    extra = os.pathsep.join([str(stub), os.environ.get(mmcv_cuda_lib.INCLUDE_ENV, "")])
    monkeypatch.setenv(mmcv_cuda_lib.INCLUDE_ENV, extra)
    record = mmcv_cuda_lib.build(sources, tmp_path / "build", "90", compile_only=True)
    assert record["arch"] == "sm_90" and all(size > 0 for size in record["outputs"].values())
    cuobjdump = shutil.which("cuobjdump") or shutil.which(
        "cuobjdump", path=str(Path(mmcv_cuda_lib.cuda_home()) / "bin")
    )
    if cuobjdump:
        listed = subprocess.run(
            [cuobjdump, "--list-elf", str(tmp_path / "build" / "ms_deform_attn_cuda.o")],
            capture_output=True,
            text=True,
        ).stdout
        assert "sm_90" in listed
