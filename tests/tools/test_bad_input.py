"""Bad input stops tools/train.py and tools/test.py with one error line, work dir untouched."""

from __future__ import annotations

import os
import runpy
import shutil
import sys
from typing import List

import pytest
import torch
from plugin_util import ROOT, SMALL_DETR, data_options


def _run(tool: str, args: List[str], monkeypatch, capsys) -> str:
    monkeypatch.setattr(sys, "argv", [tool, *args])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(os.path.join(ROOT, "tools", tool), run_name="__main__")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def _train(args, tmp_path, monkeypatch, capsys) -> str:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("x")
    line = _run("train.py", [SMALL_DETR, "--work-dir", str(work), *args], monkeypatch, capsys)
    assert sorted(os.listdir(work)) == ["keep.txt"]
    return line


def test_unknown_msda_impl(tiny_shapes, tmp_path, monkeypatch, capsys) -> None:
    opts = ["--cfg-options", "model.msda.impl=fastest", *data_options(tiny_shapes)]
    line = _train(opts, tmp_path, monkeypatch, capsys)
    assert "model.msda.impl: unknown MSDA implementation 'fastest'" in line
    line = _train(["--msda-impl", "nope"], tmp_path / "b", monkeypatch, capsys)
    assert "'nope'" in line


def test_nondeterministic_msda_impl_in_deterministic_mode(
    tiny_shapes, tmp_path, monkeypatch, capsys
):
    opts = ["--msda-impl", "cpu_atomic", "--cfg-options", "randomness.deterministic=True"]
    line = _train([*opts, *data_options(tiny_shapes)], tmp_path, monkeypatch, capsys)
    assert "model.msda.impl: MSDA implementation 'cpu_atomic' has no deterministic backward" in line
    assert "deterministic on 'cpu': ['auto', " in line and "'gather_det'" in line


def test_missing_and_corrupt_annotations(tiny_shapes, tmp_path, monkeypatch, capsys) -> None:
    data = tmp_path / "data"
    shutil.copytree(tiny_shapes, data)
    train_ann = data / "annotations" / "instances_train.json"
    train_ann.unlink()
    opts = ["--cfg-options", *data_options(str(data))]
    line = _train(opts, tmp_path / "a", monkeypatch, capsys)
    assert "train_dataloader.dataset.ann_file: annotation file not found" in line
    assert str(train_ann) in line
    train_ann.write_text('{"images": [')
    line = _train(opts, tmp_path / "b", monkeypatch, capsys)
    assert "corrupt annotation file" in line and str(train_ann) in line


def test_missing_image(tiny_shapes, tmp_path, monkeypatch, capsys) -> None:
    data = tmp_path / "data"
    shutil.copytree(tiny_shapes, data)
    (data / "val" / "000002.jpg").unlink()
    line = _train(["--cfg-options", *data_options(str(data))], tmp_path, monkeypatch, capsys)
    assert "val_dataloader.dataset: image file not found" in line
    assert str(data / "val" / "000002.jpg") in line


def test_checkpoint_of_another_model(tiny_shapes, tmp_path, monkeypatch, capsys) -> None:
    ckpt = tmp_path / "other.pth"
    torch.save({"state_dict": torch.nn.Linear(3, 4).state_dict(), "meta": {}}, ckpt)
    work = tmp_path / "work"
    args = [
        SMALL_DETR,
        str(ckpt),
        "--work-dir",
        str(work),
        "--cfg-options",
        *data_options(tiny_shapes),
    ]
    line = _run("test.py", args, monkeypatch, capsys)
    assert f"checkpoint: checkpoint {ckpt} does not fit model DeformableDETR" in line
    assert "missing" in line and not work.exists()
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    args[1] = str(tmp_path / "junk.pth")
    assert "cannot read checkpoint" in _run("test.py", args, monkeypatch, capsys)
    line = _train(
        ["--resume", str(ckpt), "--cfg-options", *data_options(tiny_shapes)],
        tmp_path / "r",
        monkeypatch,
        capsys,
    )
    assert "--resume: checkpoint" in line
