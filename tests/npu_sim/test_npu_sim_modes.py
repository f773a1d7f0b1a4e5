"""Training modes on the simulated NPU (slow: each is a tools/ run of its own): mixed precision
in float16 and bfloat16, mmengine's forced AMP on a SoC without full precision, two ranks over
the hccl stand-in, ``--compile``, ``tools/misc/check_device.py`` and
``tools/analysis_tools/ablate.py``.

Glue only: the simulated device computes with the CPU's kernels (``ops/npu_sim/README.md``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from npu_sim_util import npu_env
from plugin_util import ROOT, SMALL_DETR, data_options, run_tool
from table_util import markdown_rows
from test_npu_sim_train import FAST, ONE_STEP, TWO_IMAGES, _log, _losses, _test

pytestmark = pytest.mark.slow


def _train(tmp_path, tiny_shapes, *args, env=None, ranks=0):
    """tools/train.py on the simulated NPU, or ``bash tools/dist_train.sh`` with ``ranks``."""
    work = tmp_path / "work"
    tool = ["bash", "tools/dist_train.sh", SMALL_DETR, str(ranks)] if ranks else None
    command = [
        *(tool or [sys.executable, "tools/train.py", SMALL_DETR]),
        "--work-dir",
        str(work),
        *args,
        "--cfg-options",
        *data_options(tiny_shapes),
        *FAST,
        *ONE_STEP,
    ]
    env = dict(npu_env(**(env or {})), PYTHONWARNINGS="ignore")
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    return proc, work


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_amp_on_npu(tmp_path, tiny_shapes, dtype):
    proc, work = _train(tmp_path, tiny_shapes, "--amp", "--amp-dtype", dtype)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = _log(work)
    assert "type='AmpOptimWrapper'" in log and f"dtype='{dtype}'" in log
    assert f"npudet MSDA auto on npu {dtype}: using 'npu_vendor'" in log, log[-2000:]
    assert _losses(work), log[-2000:]


def test_mmengine_forces_amp_below_full_precision_socs(tmp_path, tiny_shapes):
    """SoC version < 220 (an Ascend 910A): mmengine turns the plain optimizer wrapper into
    AmpOptimWrapper by itself, and the run trains in float16."""
    proc, work = _train(tmp_path, tiny_shapes, env={"NPUDET_SIMULATED_NPU_SOC": "100"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "npudet MSDA auto on npu float16: using 'npu_vendor'" in _log(work)


def test_two_ranks_over_the_hccl_stand_in(tmp_path, tiny_shapes):
    proc, work = _train(tmp_path, tiny_shapes, "--msda-impl", "auto", ranks=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "[npu_sim] hccl stand-in: gloo on host copies (rank 0 of 2)" in output
    assert "[npu_sim] hccl stand-in: gloo on host copies (rank 1 of 2)" in output
    assert (work / "epoch_1.pth").is_file() and _losses(work)


# Dynamo traces the whole detector with every op going through the CPU fallback: minutes.
@pytest.mark.timeout(2400)
def test_compile_on_npu(tmp_path, tiny_shapes):
    refused, _ = _train(tmp_path, tiny_shapes, "--compile")
    assert refused.returncode == 2
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith("error: compile: inductor has no code generator for the npu device")
    )
    proc, work = _train(tmp_path, tiny_shapes, "--compile", "aot_eager")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _losses(work)


@pytest.mark.timeout(2400)  # parity in four dtypes and a benchmark, through the CPU fallback
def test_check_device_on_npu(tmp_path):
    out = tmp_path / "check.json"
    proc = run_tool(
        ["tools/misc/check_device.py", "--device", "npu", "--fast", "--json", str(out), "--save"],
        env=npu_env(NPUDET_VERIFY_FILE=str(tmp_path / "verified.json")),
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "times measure the simulation on the CPU, not an NPU" in proc.stdout
    report = json.loads(out.read_text())
    assert report["simulated"] is True
    correct = {(r["impl"], r["dtype"]) for r in report["parity"] if r["correct"]}
    assert {("npu_vendor", "float32"), ("gather", "float32")} <= correct
    records = json.loads((tmp_path / "verified.json").read_text())
    assert any("Simulated" in device for device in json.dumps(records).split('"'))


def test_ablate_on_npu(tmp_path, tiny_shapes):
    work = tmp_path / "ablate"
    proc = run_tool(
        [
            "tools/analysis_tools/ablate.py",
            SMALL_DETR,
            "--impls",
            "grid_sample,npu_vendor",
            "--iters",
            "2",
            "--rounds",
            "1",
            "--warmup",
            "1",
            "--work-dir",
            str(work),
            "--cfg-options",
            f"train_dataloader.dataset.data_root={tiny_shapes}",
        ],
        env=npu_env(),
        cwd=ROOT,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (work / "ablation.md").read_text()
    assert "device npu" in table and "not an NPU" in table
    npu = [row for row in markdown_rows(table) if row["variant"] == "npu_vendor"]
    assert npu and npu[0]["max abs loss dev."] == "0.00e+00"  # same losses as grid_sample


def test_cpu_checkpoint_tests_on_npu(tmp_path, tiny_shapes):
    """The way back: a checkpoint saved by a CPU-only training evaluates on the simulated NPU."""
    proc = run_tool(
        [
            "tools/train.py",
            SMALL_DETR,
            "--work-dir",
            str(tmp_path / "cpu"),
            "--cfg-options",
            *data_options(tiny_shapes),
            *FAST,
            *ONE_STEP,
        ],
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    options = [*data_options(tiny_shapes), TWO_IMAGES]
    tested = _test(SMALL_DETR, tmp_path / "cpu" / "epoch_1.pth", tmp_path / "npu", options)
    assert "npudet MSDA auto on npu float32: using 'npu_vendor'" in tested.stdout + tested.stderr
