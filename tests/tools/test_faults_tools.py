"""Bad input to the tools stops with one line before their minutes of work (issue 48, items
6 and 7): an unwritable ``tools/export.py --out`` (it failed after tracing), a non-ONNX file
or missing data for ``tools/deployment/eval_export.py``, unknown names and unwritable files for
``tools/misc/check_device.py`` (it ran the whole check, then failed or said "saved" without
writing), the environment variables with undocumented values (issue 57: in check_device too,
and ``NPUDET_SIMULATED_NPU``), and a work dir ``tools/test.py`` cannot write (a traceback after
the model was loaded); a missing input of ``tools/analysis_tools/bev_heading_errors.py`` and
``tools/dataset_converters/create_nuscenes_infos.py`` (tracebacks).
"""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import onnx
import pytest
from onnx import TensorProto, helper
from plugin_util import ROOT, SMALL_DETR, data_options

from npudet.deploy import evaluate, export

CHECK_DEVICE = os.path.join(ROOT, "tools", "misc", "check_device.py")


def _exit_lines(run, capsys) -> List[str]:
    """Status 2 and the stderr lines of ``run()`` (a tool's main, exiting)."""
    with pytest.raises(SystemExit) as exit_info:
        run()
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def _tool(path: str, args: List[str], monkeypatch, capsys) -> List[str]:
    """``path`` (a tool) run as a script in this process with ``args``; its stderr lines."""
    monkeypatch.setattr(sys, "argv", [path, *args])
    return _exit_lines(lambda: runpy.run_path(path, run_name="__main__"), capsys)


@pytest.fixture
def blocker(tmp_path) -> Path:
    """A file where a tool's output folder would be."""
    path = tmp_path / "a_file"
    path.write_text("in the way")
    return path


@pytest.fixture
def read_only(tmp_path) -> Iterator[Path]:
    """A folder no one may write: a read-only tmpfs where this process may mount one (root
    writes through a mode of 555), else a folder of mode 555."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    mount = shutil.which("mount")
    cmd = [mount or "mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)]
    if mount is None or subprocess.run(cmd, capture_output=True).returncode != 0:
        pytest.skip("root without a read-only mount: no folder is read-only to this process")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _detector_onnx(path: Path, input_name: str = "images") -> Path:
    """A valid ONNX graph (an Identity) whose input is named ``input_name``."""
    value = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [1, 3, 64, 64])
    out = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 3, 64, 64])
    graph = helper.make_graph(
        [helper.make_node("Identity", [input_name], ["boxes"])], "g", [value], [out]
    )
    onnx.save(helper.make_model(graph), str(path))
    return path


# -- tools/export.py ----------------------------------------------------------------------
def test_export_to_an_unwritable_out_stops_before_loading(tmp_path, blocker, capsys) -> None:
    """It failed after tracing (99 s on the small Deformable DETR); now before the config or
    the checkpoint is read (the checkpoint here does not even exist)."""
    out = blocker / "model.onnx"
    args = [SMALL_DETR, str(tmp_path / "none.pth"), "--format", "onnx", "--out", str(out)]
    err = _exit_lines(lambda: export.main(args), capsys)
    assert err == [f"error: --out {out}: cannot be written ({blocker} is not a writable folder)"]


def test_export_to_a_folder_is_refused(tmp_path, capsys) -> None:
    args = [SMALL_DETR, str(tmp_path / "none.pth"), "--format", "aoti", "--out", str(tmp_path)]
    err = _exit_lines(lambda: export.main(args), capsys)
    assert err == [f"error: --out {tmp_path}: a folder; expected a file path"]


# -- tools/deployment/eval_export.py ---------------------------------------------------------------
def test_eval_export_of_a_file_that_is_not_onnx(tiny_shapes, tmp_path, capsys) -> None:
    """A checkpoint given for the model failed in ONNX's parser ("DecodeError: Wire format
    was corrupt"), after the data set was loaded."""
    model = tmp_path / "epoch_1.pth"
    model.write_bytes(bytes(range(256)) * 8)
    args = [SMALL_DETR, str(model), "--cfg-options", *data_options(tiny_shapes)]
    err = _exit_lines(lambda: evaluate.main(args), capsys)
    assert len(err) == 1 and err[0].startswith(f"error: model: {model} is not an ONNX model ("), err
    assert err[0].endswith("); expected the .onnx written by tools/export.py")
    other = _detector_onnx(tmp_path / "other.onnx", input_name="x")
    err = _exit_lines(lambda: evaluate.main([SMALL_DETR, str(other)]), capsys)
    assert err == [
        f"error: model: {other} takes inputs ['x']; expected a detector graph with an 'images' "
        "input (tools/export.py of a Deformable DETR / DINO)"
    ]


def test_eval_export_without_the_data_names_the_tool_that_makes_it(tmp_path, capsys) -> None:
    """A missing data set was a raw FileNotFoundError; tools/train.py and tools/test.py name
    the tool that makes it, and so does this one now."""
    model = _detector_onnx(tmp_path / "model.onnx")
    root = tmp_path / "shapes"
    args = [SMALL_DETR, str(model), "--cfg-options", *data_options(str(root))]
    err = _exit_lines(lambda: evaluate.main(args), capsys)
    ann = root / "annotations" / "instances_val.json"
    assert err == [
        f"error: test_dataloader.dataset.ann_file: annotation file not found: {ann} "
        f"(make it with: python tools/dataset_converters/make_shapes_dataset.py --root {root})"
    ]


def test_eval_export_to_an_unwritable_json_stops_first(tmp_path, blocker, capsys) -> None:
    model = _detector_onnx(tmp_path / "model.onnx")
    out = blocker / "metrics.json"
    err = _exit_lines(lambda: evaluate.main([SMALL_DETR, str(model), "--json", str(out)]), capsys)
    assert err == [f"error: --json {out}: cannot be written ({blocker} is not a writable folder)"]


# -- tools/misc/check_device.py ----------------------------------------------------------------
def test_check_device_refuses_unknown_names_up_front(monkeypatch, capsys) -> None:
    """``--impls cpux`` exited 0 with an empty table (and with --save said "saved")."""
    err = _tool(CHECK_DEVICE, ["--device", "cpu", "--fast", "--impls", "cpux"], monkeypatch, capsys)
    assert err[-1].startswith(
        "check_device.py: error: --impls: unknown MSDA implementation 'cpux'; known: ["
    )
    assert "'grid_sample'" in err[-1] and "'cpu'" in err[-1]
    err = _tool(CHECK_DEVICE, ["--device", "cpu", "--cases", "ddetr"], monkeypatch, capsys)
    assert err[-1].startswith("check_device.py: error: --cases: unknown case 'ddetr'; expected")


@pytest.mark.parametrize("option", ["--save", "--json"])
def test_check_device_checks_its_files_before_the_check(
    option, blocker, monkeypatch, capsys
) -> None:
    """A record file (``--save``) or report (``--json``) that cannot be written failed after
    the whole check."""
    path = blocker / "verified.json"
    monkeypatch.setenv("NPUDET_VERIFY_FILE", str(path))
    args = ["--device", "cpu", "--fast", "--impls", "grid_sample", option]
    args += [str(path)] if option == "--json" else []
    err = _tool(CHECK_DEVICE, args, monkeypatch, capsys)
    assert err[-1] == (
        f"check_device.py: error: {option} {path}: cannot be written ({blocker} is not a "
        "writable folder)"
    )


def test_check_device_saves_nothing_when_nothing_was_checked(tmp_path, monkeypatch, capsys):
    """``mmcv`` does not run on CPU tensors: nothing is checked, so nothing is saved (it said
    "saved verification ... to FILE")."""
    path = tmp_path / "verified.json"
    monkeypatch.setenv("NPUDET_VERIFY_FILE", str(path))
    monkeypatch.setattr(sys, "argv", [CHECK_DEVICE, "--device", "cpu", "--fast", "--save"])
    monkeypatch.setattr(sys, "argv", [*sys.argv, "--impls", "mmcv"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(CHECK_DEVICE, run_name="__main__")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--save: no implementation was checked on this device; nothing saved" in out
    assert "saved verification" not in out and not path.exists()


# -- the environment variables, the work dir of tools/test.py ----------------------------
# (variable, an undocumented value, the line every tool stops with)
BAD_ENVIRONMENT = [
    (
        "NPUDET_TRITON_SCHEDULE",
        "banana",
        "NPUDET_TRITON_SCHEDULE='banana': expected 'cuda' or 'ascend' (or unset)",
    ),
    (
        "NPUDET_CPU_SANITIZE",
        "banana",
        "NPUDET_CPU_SANITIZE='banana': expected 1 (sanitized builds) or 0 / unset",
    ),
    (
        "NPUDET_SIMULATED_NPU",
        "yes",
        "NPUDET_SIMULATED_NPU='yes': expected 1 (the simulated NPU of ops/npu_sim) or 0 / unset "
        "(no simulation)",
    ),
]


@pytest.mark.parametrize(("variable", "value", "message"), BAD_ENVIRONMENT)
@pytest.mark.parametrize("tool", ["train.py", "test.py"])
def test_an_undocumented_environment_value_stops_the_preflight(
    tool, variable, value, message, tmp_path, monkeypatch, capsys
) -> None:
    """``NPUDET_TRITON_SCHEDULE=banana`` was a traceback at the first Triton call, after the
    work dir existed; any non-empty ``NPUDET_CPU_SANITIZE`` switched to the slow sanitizer
    build (now the cpu kernel is refused, and ``auto`` would quietly train without it);
    ``NPUDET_SIMULATED_NPU=yes`` trained on the CPU without a word."""
    monkeypatch.setenv(variable, value)
    work = tmp_path / "work"
    args = [SMALL_DETR, *([str(tmp_path / "none.pth")] if tool == "test.py" else [])]
    args += ["--work-dir", str(work), "--cfg-options", *data_options(str(tmp_path / "shapes"))]
    err = _tool(os.path.join(ROOT, "tools", tool), args, monkeypatch, capsys)
    assert err == [f"error: {message}"]
    assert not work.exists()


@pytest.mark.parametrize(("variable", "value", "message"), BAD_ENVIRONMENT)
def test_check_device_checks_the_environment_first(
    variable, value, message, monkeypatch, capsys
) -> None:
    """``NPUDET_TRITON_SCHEDULE=banana`` ran the whole check and showed as a failed Triton
    parity check; the device check now stops with the preflight's line."""
    monkeypatch.setenv(variable, value)
    err = _tool(CHECK_DEVICE, ["--device", "cpu", "--fast"], monkeypatch, capsys)
    assert err == [f"check_device.py: error: {message}"]


def test_test_py_work_dir_behind_a_file(tmp_path, blocker, monkeypatch, capsys) -> None:
    """A file in the way of the work dir was a NotADirectoryError traceback once the model
    had been loaded; now it is checked before the checkpoint is read (it does not exist)."""
    work = blocker / "work"
    args = [SMALL_DETR, str(tmp_path / "none.pth"), "--work-dir", str(work)]
    err = _tool(os.path.join(ROOT, "tools", "test.py"), args, monkeypatch, capsys)
    assert err == [
        f"error: work dir {work}: cannot be written ({blocker} is not a writable folder); "
        "pass a writable --work-dir"
    ]


def test_test_py_read_only_work_dir(tmp_path, read_only, monkeypatch, capsys) -> None:
    args = [SMALL_DETR, str(tmp_path / "none.pth"), "--work-dir", str(read_only)]
    err = _tool(os.path.join(ROOT, "tools", "test.py"), args, monkeypatch, capsys)
    assert err == [
        f"error: work dir {read_only}: cannot be written ({read_only} is not a writable "
        "folder); pass a writable --work-dir"
    ]


HEADINGS = os.path.join(ROOT, "tools", "analysis_tools", "bev_heading_errors.py")
NUSCENES_INFOS = os.path.join(ROOT, "tools", "dataset_converters", "create_nuscenes_infos.py")


def test_heading_errors_without_its_predictions(tmp_path, monkeypatch, capsys) -> None:
    """A missing or foreign predictions file was a ``FileNotFoundError`` /
    ``UnpicklingError`` traceback."""
    made_by = "write it with tools/test.py CONFIG CHECKPOINT --out preds.pkl"
    missing = tmp_path / "preds.pkl"
    err = _tool(HEADINGS, [str(missing)], monkeypatch, capsys)
    assert err == [f"error: preds {missing}: no such file; {made_by}"]
    text = tmp_path / "notes.txt"
    text.write_text("not a pickle")
    (line,) = _tool(HEADINGS, [str(text)], monkeypatch, capsys)
    assert line.startswith(f"error: preds {text}: not a pickle of predictions (")
    assert line.endswith(made_by)


def test_nuscenes_infos_without_the_dataroot(tmp_path, monkeypatch, capsys) -> None:
    """A missing dataroot, or one without the version's tables, was the devkit's
    ``AssertionError: Database version not found`` traceback; now checked before it loads."""
    missing = tmp_path / "nuscenes"
    args = ["--dataroot", str(missing), "--version", "v1.0-mini"]
    err = _tool(NUSCENES_INFOS, args, monkeypatch, capsys)
    assert err == [f"error: dataroot {missing}: no such folder (nuScenes' root)"]
    missing.mkdir()
    err = _tool(NUSCENES_INFOS, args, monkeypatch, capsys)
    assert err == [
        f"error: dataroot {missing}: no v1.0-mini/ folder in it (nuScenes' tables, "
        "v1.0-mini/*.json; the version is --version)"
    ]
