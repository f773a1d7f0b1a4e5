"""tools/misc/check_device.py: the fast CPU run end to end, and its parts as pure logic."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npudet.benchmark import device_check
from npudet.ops.msda import MSDAImpl, get_impl
from npudet.ops.msda.registry import _REGISTRY
from npudet.ops.msda.verification import parity, records
from npudet.utils.device import device_name

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "misc" / "check_device.py"


@pytest.fixture(scope="module")
def fast_report(tmp_path_factory):
    """One ``--fast --save`` run on the CPU in a child process, with its own record file."""
    tmp = tmp_path_factory.mktemp("check_device")
    env = dict(os.environ, NPUDET_VERIFY_FILE=str(tmp / "verified.json"))
    # As a user runs it: no Triton interpreter, so triton declines CPU tensors.
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, str(TOOL), "--device", "cpu", "--fast"]
    cmd += ["--json", str(tmp / "report.json"), "--save"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp / "report.json").read_text()), tmp / "verified.json", proc.stdout


def test_fast_run_finds_every_cpu_implementation_correct(fast_report):
    report, _, stdout = fast_report
    checked = {row["impl"] for row in report["parity"]}
    assert {"grid_sample", "gather", "cpu"} <= checked
    assert report["environment"]["cpu"]["aten_cpu_capability"]
    assert report["environment"]["device"]["name"]
    ran = [row for row in report["parity"] if not row["declined"]]
    for row in ran:
        if row["impl"] == "grid_sample" and row["dtype"] in ("float16", "bfloat16"):
            # The baseline itself computes in half precision: reported with its errors,
            # whatever they are (within 4e-3 on one machine, 20-40% off on another).
            assert row["correct"] or "max relative error grad" in row["error"]
            continue
        assert row["correct"], (row["impl"], row["dtype"], row["error"])
        assert {case["status"] for case in row["cases"]} <= {"passed", "declined"}
    dtypes = {(row["impl"], row["dtype"]) for row in ran}
    for name in checked - {"triton"}:
        assert {(name, d) for d in ("float16", "bfloat16", "float32", "float64")} <= dtypes
    for row in report["parity"]:
        if row["impl"] == "triton":  # the interpreter is a test path, not a CPU kernel
            assert row["declined"] and "interpreter" in row["declined"][0]
    assert "recommended auto order" in stdout and report["seconds"] < 60


def test_declined_cases_are_counted_apart_never_as_passes(fast_report):
    """grid_sample propagates NaN locations: that case is declined, in every dtype."""
    report, _, stdout = fast_report
    total = len(parity.PARITY_CASES)
    for row in report["parity"]:
        if row["impl"] == "grid_sample" and row["correct"]:
            cases = {case["case"]: case for case in row["cases"]}
            assert cases["nan-locations"]["status"] == "declined"
            assert cases["nan-locations"]["out_err"] is None  # not run
            assert row["counts"] == {"passed": total - 1, "failed": 0, "declined": 1}
    table = {(r["impl"], r["dtype"]): r for r in report["summary"]["table"]}
    assert table[("grid_sample", "float32")]["cases"] == (
        f"{total - 1} passed, 1 declined (nan-locations)"
    )
    assert table[("cpu", "float32")]["cases"] == f"{total} passed"
    assert f"| {total - 1} passed, 1 declined (nan-locations) |" in stdout


def test_saved_records_carry_the_key_of_the_checking_process(fast_report):
    report, path, _ = fast_report
    for row in report["parity"]:
        assert row["key"]["torch"] == torch.__version__ and len(row["key"]["sources"]) == 16
    record = records.recorded("cpu", device_name("cpu"), "cpu", "float32", path=str(path))
    assert record.key["build"] and not records.stale_reasons(record, "cpu")


def test_fast_run_times_and_ranks_the_correct_implementations(fast_report):
    report, _, _ = fast_report
    summary = report["summary"]
    assert summary["case"] == "ddetr-dec"
    timed = {r["impl"]: r for r in summary["table"] if r["fwd_bwd_ms"] is not None}
    assert {"grid_sample", "gather", "cpu"} <= set(timed)
    assert all(r["dtype"] == "float32" and r["fwd_bwd_ms"] > 0 for r in timed.values())
    order = summary["recommended_auto_order"]
    assert sorted(order) == sorted(timed)
    assert [timed[n]["fwd_bwd_ms"] for n in order] == sorted(
        r["fwd_bwd_ms"] for r in timed.values()
    )
    assert report["benchmark"]["rows"] and not report["benchmark"]["errors"]


def test_save_writes_what_auto_reads_back(fast_report):
    report, path, _ = fast_report
    assert report["saved"] == str(path)
    assert records.load_records(str(path))["version"] == records.FORMAT_VERSION
    name = device_name("cpu")
    for row in report["summary"]["table"]:
        record = records.recorded("cpu", name, row["impl"], row["dtype"], path=str(path))
        assert record is not None and record.correct == row["correct"]
        assert record.fwd_bwd_ms == row["fwd_bwd_ms"]
    gather = records.recorded("cpu", name, "gather", "float32", path=str(path))
    assert gather.correct and gather.fwd_bwd_ms > 0 and gather.case == "ddetr-dec"


class _Crashing(MSDAImpl):
    NAME = "test_crashing"
    DEVICES = ("cpu",)

    def forward(self, *args):
        raise RuntimeError("kernel exploded")


class _Wrong(MSDAImpl):
    NAME = "test_wrong"
    DEVICES = ("cpu",)

    def forward(self, *args):
        return get_impl("gather").forward(*args) * 1.01


def test_a_crashing_or_wrong_implementation_is_a_failed_case_not_an_abort(monkeypatch):
    for impl in (_Crashing(), _Wrong()):
        monkeypatch.setitem(_REGISTRY, impl.NAME, impl)
    crashed = parity.check_parity("test_crashing", "cpu", torch.float32, cases=["basic"])
    assert not crashed.correct and "RuntimeError: kernel exploded" in crashed.error
    assert crashed.counts == {"passed": 0, "failed": 1, "declined": 0}
    wrong = parity.check_parity("test_wrong", "cpu", torch.float32, cases=["basic", "dim-3"])
    assert not wrong.correct and "max relative error" in wrong.error
    assert [c.case for c in wrong.cases] == ["basic", "dim-3"]
    right = parity.check_parity("gather", "cpu", torch.float32, cases=["basic"])
    assert right.correct and right.cases[0].out_err < 1e-5


def test_cases_outside_declared_limits_are_declined_not_failed():
    """npu_vendor's mmcv route takes head_dim >= 32 only: dim-3 is declined on an NPU."""
    from npudet.utils.packages import assume_packages

    with assume_packages({"torch_npu": "2.6.0", "mmcv": "2.2.0", "mmcv._ext": ""}):
        case = parity.check_case("npu_vendor", "npu", torch.float32, "dim-3")
    assert case.status == parity.DECLINED and any("head_dim 3 < 32" in r for r in case.declined)
    assert case.out_err is None


class _Picky(MSDAImpl):
    """gather that declines head_dim 3 (as a vendor kernel with a minimum would)."""

    NAME = "test_picky"
    DEVICES = ("cpu",)

    def not_supported_reasons(self, inputs):
        return ["head_dim 3 < 8"] if inputs.head_dim == 3 else []

    def forward(self, *args):
        return get_impl("gather").forward(*args)


def test_an_implementation_that_declines_every_case_is_declined_not_correct(monkeypatch):
    monkeypatch.setitem(_REGISTRY, _Picky.NAME, _Picky())
    some = parity.check_parity("test_picky", "cpu", torch.float32, cases=["basic", "dim-3"])
    assert some.correct and some.counts == {"passed": 1, "failed": 0, "declined": 1}
    assert parity.case_summary(some.to_json()) == "1 passed, 1 declined (dim-3)"
    none = parity.check_parity("test_picky", "cpu", torch.float32, cases=["dim-3"])
    assert not none.correct and none.declined == ["head_dim 3 < 8"]
    assert none.error == "declined" and parity.case_summary(none.to_json()) == (
        "1 declined (dim-3)"
    )


def test_unavailable_device_is_refused_with_its_reason():
    done = subprocess.run(
        [sys.executable, str(TOOL), "--device", "tpu"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "--device tpu: device unavailable: expected cpu, cuda or npu" in done.stderr


def test_summary_ranks_only_correct_timed_implementations():
    parity_rows = [
        {"impl": "a", "dtype": "float32", "correct": True, "error": "", "declined": []},
        {"impl": "b", "dtype": "float32", "correct": False, "error": "x", "declined": []},
        {"impl": "c", "dtype": "float32", "correct": True, "error": "", "declined": []},
        {"impl": "grid_sample", "dtype": "float32", "correct": True, "error": "", "declined": []},
        {"impl": "c", "dtype": "float16", "correct": True, "error": "", "declined": []},
        {"impl": "d", "dtype": "float32", "correct": False, "error": "", "declined": ["no"]},
    ]
    rows = [("a", 4.0), ("b", 1.0), ("c", 2.0), ("grid_sample", 20.0)]
    bench = {"cases": ["k"], "rows": [{"case": "k", "impl": i, "fwd_bwd_ms": t} for i, t in rows]}
    summary = device_check.summarize(parity_rows, bench)
    assert summary["recommended_auto_order"] == ["c", "a", "grid_sample"]
    table = {(r["impl"], r["dtype"]): r for r in summary["table"]}
    assert ("d", "float32") not in table
    assert table[("c", "float32")]["speedup"] == 10.0
    assert table[("c", "float16")]["fwd_bwd_ms"] is None


def test_a_child_that_dies_is_reported_with_its_error():
    """--isolate: a child process that fails is an error entry, the parent goes on."""
    args = argparse.Namespace(device="cpu", repeat=1, cases=device_check.FAST_CASES, fast=True)
    part = device_check.child(TOOL, args, "parity", ["no_such_impl"])  # refused: status 2
    assert "exited with 2" in part["error"] and "no_such_impl" in part["error"]


def test_compile_targets_follow_the_device():
    assert device_check.compile_targets("cpu") is None  # the compile tool's own default set
    assert device_check.compile_targets("npu") == ["ascend"]
