"""The CUDA Triton kernels compiled by the real toolchain, and the launch plans' limits.

triton compiles for sm_80/sm_90 without a GPU (``kernel_compile.py``): every launch the
``cuda`` schedule plans for the benchmark cases and the odd shapes, in every dtype, must
compile with no spills and at most 128 registers a thread. The plans keep grid axes 1
and 2 within 65535 for any size, and the kernels compute value, output and gradient
offsets in int64 (checked in the TTIR).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

triton = pytest.importorskip("triton")

from npudet.benchmark.cases import launch_shapes  # noqa: E402
from npudet.ops.msda.kernels.triton_launch import (  # noqa: E402
    MAX_GRID_X,
    MAX_GRID_YZ,
    SCHEDULE_ENV,
    MSDAShape,
    plan_launches,
    schedule_for,
)
from npudet_dev.kernels import kernel_compile  # noqa: E402
from npudet_dev.kernels.compile_table import cuda_table  # noqa: E402

MAX_REGISTERS = 128
ROOT = Path(__file__).resolve().parents[2]


# ~33 s per target: the default run compiles for the newest (the lent H100/H200), -m slow the rest.
@pytest.mark.parametrize(
    "target",
    [
        t if t == max(kernel_compile.CUDA_TARGETS) else pytest.param(t, marks=pytest.mark.slow)
        for t in sorted(kernel_compile.CUDA_TARGETS)
    ],
)
def test_every_planned_cuda_launch_compiles_within_limits(target):
    rows = kernel_compile.check_cuda(kernel_compile.check_shapes(launch_shapes()), [target])
    kernels = {r["kernel"] for r in rows}
    assert kernels == {"msda_fwd_kernel", "msda_bwd_kernel"}
    assert {r["dtype"] for r in rows} == set(kernel_compile.CUDA_DTYPES)
    assert {"ddetr-enc", "bev-sca", "odd-d3", "odd-d257"} <= {r["case"] for r in rows}
    bad = [
        f"{r['kernel']} {r['dtype']} {r['case']} warps={r['num_warps']}: "
        + (r["error"] or f"{r['registers']} registers, {r['stack_bytes']} B stack")
        for r in rows
        if not r["compiled"]
        or r["registers"] > MAX_REGISTERS
        or r["stack_bytes"] != 0
        or r["local_bytes"] != 0
    ]
    assert not bad, "\n".join(bad)
    # The stored report the docs quote is what this checkout compiles (same triton): a kernel
    # or planner change must regenerate it (python dev/tools/compile_kernels.py --json ...).
    stored = json.loads(STORED.read_text())
    if stored["triton"] == triton.__version__:
        figures = ("registers", "stack_bytes", "num_warps")
        want = {
            _row_key(r): [r[f] for f in figures] for r in stored["rows"] if r["target"] == target
        }
        got = {_row_key(r): [r[f] for f in figures] for r in rows}
        assert got == want, f"{STORED.name} is stale for {target}: rerun {stored['command']}"


STORED = ROOT / "results" / "kernel_compile.json"


def _row_key(row: dict) -> tuple:
    return (row["kernel"], row["dtype"], row["case"])


@pytest.mark.parametrize(
    ("page", "report"),
    [
        ("docs/ops/triton-cuda.md", "results/kernel_compile.json"),
        ("docs/ops/gpu-runs.md", "results/kernel_compile_triton3.6.0.json"),
    ],
)
def test_docs_quote_the_stored_register_tables(page, report):
    """The register tables on the pages are ``--table-of`` of the stored reports, verbatim."""
    stored = json.loads((ROOT / report).read_text())
    assert stored["commit"] and stored["machine"]["cpu_model"]
    assert cuda_table(stored) in (ROOT / page).read_text(), (
        f"{page}: paste the output of python dev/tools/compile_kernels.py --table-of {report}"
    )
    cuda = [r for r in stored["rows"] if r["target"] in kernel_compile.CUDA_TARGETS]
    mangled = dict(stored, rows=[dict(r, registers=r["registers"] + 1) for r in cuda])
    assert cuda_table(mangled) not in (ROOT / page).read_text()


HUGE = MSDAShape(
    batch=64, num_keys=21760, num_queries=40000, num_heads=8, head_dim=32, num_levels=4,
    num_points=4,
)  # fmt: skip


@pytest.mark.parametrize("dtype", kernel_compile.CUDA_DTYPES)
@pytest.mark.parametrize(
    "shape",
    [HUGE, MSDAShape(70000, 4, 1, 1, 1, 1, 1), MSDAShape(2, 100, 1, 70000, 3, 1, 2)],
    ids=["bs64-40000q", "bs70000", "heads70000"],
)
def test_grid_axes_1_and_2_stay_within_65535(shape, dtype):
    for name, launch in plan_launches("cuda", dtype, shape).items():
        grid = launch.grid
        assert grid[1] <= MAX_GRID_YZ and grid[2] <= MAX_GRID_YZ, (name, grid)
        assert grid[0] <= MAX_GRID_X
        # One program per (query block, head, batch): the kernels decode axis 0 so.
        q_blocks = -(-shape.num_queries // launch.constexprs["BLOCK_Q"])
        assert grid[0] * grid[1] * grid[2] == q_blocks * shape.num_heads * shape.batch


def test_plan_refuses_more_programs_than_axis_0_holds():
    with pytest.raises(ValueError, match="sampling_locations"):
        plan_launches("cuda", "float32", MSDAShape(2**20, 10, 2**20, 8, 32, 1, 1))


def test_schedule_follows_the_device_unless_forced(monkeypatch):
    monkeypatch.delenv(SCHEDULE_ENV, raising=False)
    assert [schedule_for(d) for d in ("cuda", "npu", "cpu")] == ["cuda", "ascend", "cuda"]
    monkeypatch.setenv(SCHEDULE_ENV, "ascend")
    assert schedule_for("cpu") == "ascend"
    monkeypatch.setenv(SCHEDULE_ENV, "rocm")
    with pytest.raises(ValueError, match=SCHEDULE_ENV):
        schedule_for("cuda")


def test_plan_arguments_are_checked():
    with pytest.raises(ValueError, match="dtype_name"):
        plan_launches("cuda", "int8", HUGE)
    with pytest.raises(ValueError, match="schedule"):
        plan_launches("tpu", "float32", HUGE)
    with pytest.raises(ValueError, match="shape"):
        plan_launches("cuda", "float32", MSDAShape(0, 1, 1, 1, 1, 1, 1))


# "%name = op operands... : types": the ops of a TTIR function by the value they define.
_DEF = re.compile(r"^\s*(%[\w.]+)(?::\d+)? = ([\w.]+)(.*)$")
_ADDPTR = re.compile(r"tt\.addptr (%[\w.]+), (%[\w.]+) : (?P<ptr>[^,]+), (?P<off>[^ ]+)")


def _ttir_defs(ttir):
    defs = {}
    for line in ttir.splitlines():
        found = _DEF.match(line)
        if found:
            body = found[3].split(" loc(")[0]
            defs[found[1]] = (found[2], re.findall(r"%[\w.]+", body.split(" : ")[0]))
    return defs


def _compile_time_bounded(name, defs, seen=None):
    """Whether the value ``name`` is computed from constants and ranges only."""
    seen = set() if seen is None else seen
    if name in seen:
        return True
    seen.add(name)
    if name not in defs:  # a kernel argument or loop variable: known only at run time
        return False
    op, operands = defs[name]
    if op in ("tt.make_range", "arith.constant"):
        return True
    if op in ("tt.load", "tt.get_program_id", "tt.get_num_programs"):
        return False
    return all(_compile_time_bounded(o, defs, seen) for o in operands)


@pytest.mark.parametrize("kernel", ["fwd", "bwd"])
def test_offsets_into_value_output_and_gradients_are_int64(kernel):
    """Float pointers (value, locations, weights, out, grads) move by int64 offsets, or by
    int32 ones built from constants and ranges only (a channel lane, the ``+ 1`` of y).

    Rows of value are ``bs * num_keys`` and of the output ``bs * num_queries``, times
    ``heads * D``: both pass 2**31 elements in real runs (a 200x200 BEV at batch 8 with
    256 channels), so an int32 offset that depends on sizes or program ids would wrap.
    """
    launch = plan_launches("cuda", "float32", HUGE)[kernel]
    result, ir = kernel_compile.compile_cuda(launch, 90, want_ir=True)
    assert result.compiled, result.error
    defs = _ttir_defs(ir["ttir"])
    moves = wide = 0
    narrow = []
    for line in ir["ttir"].splitlines():
        found = _ADDPTR.search(line)
        if not found or not re.search(r"ptr<(f32|f64|f16|bf16)>", found["ptr"]):
            continue
        moves += 1
        if "i64" in found["off"]:
            wide += 1
        elif not _compile_time_bounded(found[2], defs):
            narrow.append(line.strip())
    assert moves > 10 and wide > 5, (moves, wide)
    assert not narrow, "int32 offsets that depend on run-time values:\n" + "\n".join(narrow)


def test_compile_kernels_tool_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "compile.json"
    cmd = [
        sys.executable,
        str(ROOT / "dev" / "tools" / "compile_kernels.py"),
        "--targets",
        "cuda:80",
    ]
    cmd += ["--dtypes", "float16", "--cases", "bev-tsa", "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| msda_bwd_kernel | cuda:80 | float16 | bev-tsa | yes |" in proc.stdout
    report = json.loads(out.read_text())
    assert report["ascend"] == "not requested"
    assert [(r["kernel"], r["compiled"], r["stack_bytes"]) for r in report["rows"]] == [
        ("msda_fwd_kernel", True, 0),
        ("msda_bwd_kernel", True, 0),
    ]
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([*cmd[:2], "--targets", "cuda:75"], check=True, capture_output=True)
