"""Fault injection (issue 36, item 7): nothing lost, nothing silent in training.

Each test reproduces one fault a new user hit and checks what happens now: ``--resume``
without ``last_checkpoint`` or from a copied work dir, Ctrl-C / SIGTERM mid-run, flipped
checkpoint bytes, bad annotation entries and images, class names that miss the config's,
an unusable extension cache, an implementation unusable on the device, ``model.msda``
given a string or naming a part the model lacks, box-only data for a mask pipeline, a run that
trains nothing, NaN sampling locations, a dataloader worker killed and an image that does not
decode mid-run, a kernel build interrupted before the run; a ``last_checkpoint`` holding
binary bytes, ``--resume`` with a changed config, a misspelled ``--cfg-options`` key.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import pytest
import torch
import torch.nn.functional as F
from hooks_util import KEYS, QUERIES, SHAPES, RandomSet, toy_runner
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from plugin_util import ROOT, SMALL_DETR, data_options, run_tool, train_args
from torch.utils.data import Dataset

import npudet.hooks  # noqa: F401  (register)
from npudet.engine.cfg_options import apply_cfg_options
from npudet.engine.cli import run_checks, run_guarded
from npudet.engine.preflight import PreflightError, check_data, check_msda
from npudet.engine.resume import find_resume_checkpoint, plan_resume
from npudet.hooks import (
    CheckpointCorruptError,
    NonFiniteLossError,
    NothingTrainedError,
    TrainingInterrupted,
    train_keeping_progress,
)
from npudet.models import resolve_msda_cfg
from npudet.nn import MSDeformAttn
from npudet.ops import msda_impls
from npudet.ops.msda.kernels.native_build import BuildInterrupted

HAVE_CPU = "cpu" in msda_impls()
MASK2FORMER = os.path.join(ROOT, "configs", "small", "mask2former_r18-tiny_shapes.py")
FAST = ["default_hooks.logger.interval=1", "log_processor.window_size=1"]
NO_VAL = ["val_cfg=None", "val_dataloader=None", "val_evaluator=None"]


# -- helpers -----------------------------------------------------------------------------
def _tool(tool: str, args: List[str], monkeypatch, capsys, code: int = 2) -> List[str]:
    """Run ``tools/<tool>`` in this process; its exit status and stderr lines."""
    monkeypatch.setattr(sys, "argv", [tool, *args])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(os.path.join(ROOT, "tools", tool), run_name="__main__")
    assert exit_info.value.code == code
    return capsys.readouterr().err.strip().splitlines()


def _train_error(args: List[str], tmp_path, monkeypatch, capsys, config: str = SMALL_DETR) -> str:
    """``tools/train.py`` stops before the runner: one ``error:`` line, work dir untouched."""
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "keep.txt").write_text("x")
    err = _tool("train.py", [config, "--work-dir", str(work), *args], monkeypatch, capsys)
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert sorted(os.listdir(work)) == ["keep.txt"]
    return err[0]


def _data_cfg(root: str, config: str = SMALL_DETR) -> Config:
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(dict(opt.split("=", 1) for opt in data_options(root)))
    return cfg


def _copy_data(tiny_shapes: str, tmp_path) -> str:
    data = str(tmp_path / "data")
    shutil.copytree(tiny_shapes, data)
    return data


def _edit(data: str, split: str, change: Callable[[Dict], None]) -> str:
    path = os.path.join(data, "annotations", f"instances_{split}.json")
    with open(path) as f:
        content = json.load(f)
    change(content)
    with open(path, "w") as f:
        json.dump(content, f)
    return path


def _flip_tensor_byte(path: str) -> None:
    """Flip one byte in the middle of the largest tensor record of a torch zip checkpoint
    (what a bad disk or transfer does; torch reads such a file without complaint)."""
    with zipfile.ZipFile(path) as archive:
        info = max(
            (i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size
        )
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        offset = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


# -- model.msda, implementations, extension cache ----------------------------------------
def test_msda_given_a_string_names_the_key(tiny_shapes, tmp_path, monkeypatch, capsys) -> None:
    with pytest.raises(ValueError, match=r"model\.msda: expected a dict like dict\(impl="):
        resolve_msda_cfg("cpu")
    opts = ["--cfg-options", "model.msda=cpu", *data_options(tiny_shapes)]
    line = _train_error(opts, tmp_path, monkeypatch, capsys)
    assert "model.msda: expected a dict" in line and "model.msda.impl=cpu" in line


def test_a_part_the_model_lacks_stops_at_preflight(
    tiny_shapes, tmp_path, monkeypatch, capsys
) -> None:
    """``model.msda.decoder=cpu`` on Mask2Former (its one MSDA part is its pixel decoder's
    encoder) was a traceback when the runner built the model, after the work dir was made;
    the preflight reads the parts from the model's class, unbuilt."""
    opts = ["--cfg-options", "model.msda.decoder=cpu", *data_options(tiny_shapes)]
    line = _train_error(opts, tmp_path, monkeypatch, capsys, config=MASK2FORMER)
    assert line == (
        "error: model.msda.decoder: Mask2Former has no deformable-attention layer under a "
        "module named 'decoder'; its MSDA parts: encoder (panoptic_head.pixel_decoder.encoder)"
    )


def test_impl_unusable_on_the_device_stops_at_preflight(tmp_path) -> None:
    """``triton`` on CPU tensors without the Triton interpreter passed the name check and
    died at the first forward after the work dir existed; now one line, no work dir."""
    cfg = Config.fromfile(SMALL_DETR)
    cfg.model.msda = dict(impl="grid_sample", encoder=None, decoder="cpu")
    with pytest.raises(
        PreflightError, match=r"model\.msda\.decoder: .*'cpu' cannot run on .*'cuda'"
    ):
        check_msda(cfg, device="cuda")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "tools/train.py", SMALL_DETR, "--msda-impl", "triton"]
        + ["--work-dir", str(work)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert err[0].startswith("error: model.msda.impl: MSDA implementation 'triton'"), err
    assert not work.exists()


def test_unusable_extension_cache_falls_back_with_a_warning(tmp_path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    code = (
        "import warnings, torch\n"
        "warnings.simplefilter('always')\n"
        "from npudet.ops import msda_impls, multi_scale_deformable_attn\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    impls = msda_impls()\n"
        "v = torch.randn(1, 20, 2, 4); loc = torch.rand(1, 3, 2, 2, 2, 2)\n"
        "w = torch.rand(1, 3, 2, 2, 2)\n"
        "out = multi_scale_deformable_attn(v, torch.tensor([[4, 4], [2, 2]]),\n"
        "    torch.tensor([0, 16]), loc, w, impl='auto')\n"
        "print('IMPLS', 'cpu' in impls, tuple(out.shape))\n"
        "print('WARNED', [str(c.message) for c in caught])\n"
    )
    env = dict(os.environ, NPUDET_EXT_CACHE=str(blocker / "ext"))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPLS False (1, 3, 8)" in proc.stdout, proc.stdout
    warned = proc.stdout.split("WARNED", 1)[1]
    assert str(blocker) in warned, proc.stdout  # the warning names the unusable folder


# -- data preflight ----------------------------------------------------------------------
def _drop(kind: str, index: int, field: str) -> Callable[[Dict], None]:
    return lambda d: d[kind][index].pop(field)


def _set(kind: str, index: int, field: str, value) -> Callable[[Dict], None]:
    return lambda d: d[kind][index].__setitem__(field, value)


BAD_ENTRIES = [
    ("no_file_name", _drop("images", 1, "file_name"), r"images\[1\] \(id \d+\): no 'file_name'"),
    ("no_height", _drop("images", 0, "height"), r"images\[0\] \(id \d+\): no 'height'"),
    (
        "no_bbox",
        _drop("annotations", 2, "bbox"),
        r"annotations\[2\] \(id \d+\) of image_id .*'bbox'",
    ),
    ("no_area", _drop("annotations", 0, "area"), r"annotations\[0\] \(id \d+\).*: no 'area'"),
    ("no_category", _drop("annotations", 0, "category_id"), r"no 'category_id'"),
    ("bbox_3", _set("annotations", 1, "bbox", [1, 2, 3]), r"annotations\[1\].*expected 4 numbers"),
    ("bbox_w0", _set("annotations", 1, "bbox", [1, 2, 0, 3]), r"width and height must be > 0"),
    ("bad_image_id", _set("annotations", 0, "image_id", 999), r"image_id 999 is not the id"),
    (
        "bbox_outside",  # mmdet dropped it: trained with loss_bbox 0 when all boxes were
        _set("annotations", 1, "bbox", [5000, 10, 20, 20]),
        r"annotations\[1\].*bbox \[5000, 10, 20, 20\] lies outside its image \(\d+ x \d+\)",
    ),
    (
        "duplicate_image_id",  # was "image_id 2 is not the id of any image"
        lambda d: d["images"][1].__setitem__("id", d["images"][0]["id"]),
        r"images\[1\] \(id \d+\): id \d+ is also the id of images\[0\]",
    ),
    ("empty_images", lambda d: d.update(images=[], annotations=[]), r"lists no images"),
    ("no_gt", lambda d: d.update(annotations=[]), r"no annotation of the classes"),
]


@pytest.mark.parametrize(
    "change,pattern", [b[1:] for b in BAD_ENTRIES], ids=[b[0] for b in BAD_ENTRIES]
)
def test_bad_annotation_entries(tiny_shapes, tmp_path, change, pattern) -> None:
    """Each was a raw KeyError (from the preflight or mmdet), "need at least one array to
    concatenate", or a run without ground truth; now one line naming file and entry."""
    data = _copy_data(tiny_shapes, tmp_path)
    path = _edit(data, "train", change)
    with pytest.raises(PreflightError) as err:
        check_data(_data_cfg(data), ["train", "val"])
    message = str(err.value)
    assert "\n" not in message and message.startswith("train_dataloader.dataset.ann_file: ")
    assert path in message and re.search(pattern, message), message


def test_evaluator_file_needs_iscrowd(tiny_shapes, tmp_path) -> None:
    data = _copy_data(tiny_shapes, tmp_path)
    _edit(data, "val", _drop("annotations", 0, "iscrowd"))
    with pytest.raises(PreflightError, match=r"^val_evaluator\.ann_file: .*no 'iscrowd'"):
        check_data(_data_cfg(data), ["train", "val"])


def test_evaluator_file_of_another_split(tiny_shapes, tmp_path) -> None:
    """The evaluator scoring the val images against the train split's JSON, or a val JSON
    without annotations (twelve -1.000 and no warning), ran to the end."""
    data = _copy_data(tiny_shapes, tmp_path)
    cfg = _data_cfg(data)
    train = os.path.join(data, "annotations", "instances_train.json")
    cfg.val_evaluator.ann_file = train
    with pytest.raises(
        PreflightError,
        match=rf"^val_evaluator\.ann_file: {re.escape(train)} is not the ground truth of .*"
        r"instances_val\.json: its images\[0\] .* has other boxes there",
    ):
        check_data(cfg, ["val"])
    _edit(data, "val", lambda d: d.update(annotations=[]))
    with pytest.raises(PreflightError, match=r"instances_val\.json has no annotations: every COCO"):
        check_data(_data_cfg(data), ["val"])


def test_image_size_differing_from_the_file(tiny_shapes, tmp_path) -> None:
    """mmdet scales boxes with the decoded size and evaluates at the JSON's: it trained on."""
    data = _copy_data(tiny_shapes, tmp_path)
    _edit(data, "train", lambda d: d["images"][2].update(height=d["images"][2]["height"] + 8))
    with pytest.raises(
        PreflightError, match=r"images\[2\] \(id \d+\) of .* is \d+ x \d+ \(width x height\), "
    ):
        check_data(_data_cfg(data), ["train"])
    check_data(_data_cfg(data), ["train"], check_images=False)  # sizes need the decoding


def test_class_names_differing_in_case(tiny_shapes, tmp_path, monkeypatch, capsys) -> None:
    """'Circle' in the file vs 'circle' in the config trained with no ground truth and
    exit 0; now an error naming both lists."""
    data = _copy_data(tiny_shapes, tmp_path)
    _edit(data, "train", lambda d: d["categories"][0].__setitem__("name", "Circle"))
    line = _train_error(["--cfg-options", *data_options(data)], tmp_path, monkeypatch, capsys)
    assert (
        "classes ['circle'] of the config's metainfo.classes ['circle', 'square', 'triangle']"
        in line
    )
    assert "['Circle', 'square', 'triangle']" in line and "'circle' vs 'Circle'" in line


def test_corrupt_image_and_skip_image_check(tiny_shapes, tmp_path) -> None:
    data = _copy_data(tiny_shapes, tmp_path)
    image = os.path.join(data, "train", sorted(os.listdir(os.path.join(data, "train")))[1])
    with open(image, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 not really a jpeg" * 8)
    with pytest.raises(PreflightError, match=r"images\[1\] \(id \d+\) of .*does not decode"):
        check_data(_data_cfg(data), ["train"])
    check_data(_data_cfg(data), ["train"], check_images=False)  # --skip-image-check


def test_box_only_data_for_a_mask_pipeline_stops_at_preflight(tiny_shapes, tmp_path) -> None:
    """Mask2Former on a COCO file without ``segmentation`` passed the preflight and died in
    mmdet's LoadAnnotations with ``KeyError: 'mask'``."""
    data = _copy_data(tiny_shapes, tmp_path)

    def drop_segmentations(count: int) -> Callable[[Dict], None]:
        return lambda d: [ann.pop("segmentation", None) for ann in d["annotations"][:count]]

    path = _edit(data, "train", drop_segmentations(1))
    step = "pipeline[1] LoadAnnotations(with_mask=True)"
    with open(path) as f:
        total = len(json.load(f)["annotations"])
    with pytest.raises(PreflightError) as err:
        check_data(_data_cfg(data, MASK2FORMER), ["train"], check_images=False)
    assert str(err.value) == (
        f"train_dataloader.dataset.ann_file: {path}: annotations[0] (id 1) has no segmentation "
        f"(1 of {total} annotations have none), but {step} needs a mask for each"
    )
    _edit(data, "train", drop_segmentations(total))
    with pytest.raises(PreflightError, match=f"no segmentation in any of its {total} annotations"):
        check_data(_data_cfg(data, MASK2FORMER), ["train"], check_images=False)
    check_data(_data_cfg(data), ["train"], check_images=False)  # a box config takes them


def test_missing_data_names_the_tool_that_makes_it(tmp_path) -> None:
    root = str(tmp_path / "data" / "shapes")
    with pytest.raises(
        PreflightError,
        match=r"make it with: python tools/dataset_converters/make_shapes_dataset.py",
    ):
        check_data(_data_cfg(root), ["train"])


def test_nothing_to_train_stops_at_preflight(tiny_shapes, tmp_path, monkeypatch, capsys) -> None:
    opts = ["--cfg-options", "train_cfg.max_epochs=-1", *data_options(tiny_shapes)]
    line = _train_error(opts, tmp_path, monkeypatch, capsys)
    assert "train_cfg.max_epochs=-1: nothing to train" in line
    data = _copy_data(tiny_shapes, tmp_path)
    _edit(data, "train", lambda d: d["annotations"].clear())
    cfg = _data_cfg(data)
    cfg.train_dataloader.dataset.filter_cfg = dict(filter_empty_gt=True)
    with pytest.raises(PreflightError, match="no annotation of the classes"):
        check_data(cfg, ["train"])


# -- runs that train nothing; interrupts; checksums (in-process, toy model) ---------------
def test_a_run_that_trains_nothing_fails(tmp_path, capsys) -> None:
    with pytest.raises(NothingTrainedError, match="trained 0 iterations"):
        toy_runner(str(tmp_path / "a"), [{"type": "RunGuardHook"}], max_iters=0).train()
    first = toy_runner(str(tmp_path / "b"), [{"type": "RunGuardHook"}], max_iters=2)
    first.train()
    ckpt = str(tmp_path / "b" / "iter_2.pth")
    first.save_checkpoint(str(tmp_path / "b"), "iter_2.pth", by_epoch=False, meta=dict(iter=2))
    again = toy_runner(
        str(tmp_path / "c"), [{"type": "RunGuardHook"}], max_iters=2, resume=True, load_from=ckpt
    )
    with pytest.raises(NothingTrainedError, match=r"starts at iteration 2.*max_iters=2"):
        again.train()
    with pytest.raises(SystemExit) as exit_info:
        run_guarded(again.train)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().startswith("error: trained 0 iterations")
    # tools/train.py's way: no copy of the finished run's checkpoint as iter_2.pth (it was
    # saved and logged with "continue with --resume", which fails the same way)
    with pytest.raises(NothingTrainedError):
        train_keeping_progress(again)
    assert not list((tmp_path / "c").glob("*.pth"))


class _SignalAt(Hook):
    """Sends ``signum`` to this process after iteration ``at`` (1-based)."""

    def __init__(self, signum: int, at: int) -> None:
        self.signum, self.at = signum, at

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.at:
            guard = next(h for h in runner.hooks if type(h).__name__ == "RunGuardHook")
            # Never signal an unguarded pytest: that would end the test session.
            assert signal.getsignal(self.signum) == guard._handle
            os.kill(os.getpid(), self.signum)


def test_sigterm_saves_a_resumable_checkpoint(tmp_path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    work = str(tmp_path)
    hooks = [_SignalAt(signal.SIGTERM, at=2), {"type": "RunGuardHook"}]
    with pytest.raises(TrainingInterrupted) as err:
        toy_runner(work, hooks, max_iters=4, checkpoint_interval=3).train()
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored
    path = os.path.join(work, "iter_2.pth")
    assert err.value.signum == signal.SIGTERM and err.value.checkpoint == path
    assert "interrupted by SIGTERM after iteration 2" in str(err.value)
    assert torch.load(path, weights_only=False)["meta"]["iter"] == 2
    assert open(os.path.join(work, "last_checkpoint")).read() == path
    atomic = dict(type="AtomicCheckpointHook")
    resumed = toy_runner(
        work,
        [{"type": "RunGuardHook"}],
        max_iters=4,
        checkpoint_interval=3,
        checkpoint_options=atomic,
        resume=True,
        load_from=path,
    )
    resumed.train()
    guard = next(h for h in resumed.hooks if type(h).__name__ == "RunGuardHook")
    assert resumed.iter == 4 and guard.trained == 2
    # the interrupt's iter_2.pth went with the first checkpoint after it (it stayed for ever)
    assert sorted(p for p in os.listdir(work) if p.endswith(".pth")) == ["iter_3.pth", "iter_4.pth"]
    with pytest.raises(SystemExit) as exit_info:
        run_guarded(lambda: (_ for _ in ()).throw(err.value))
    assert exit_info.value.code == 128 + signal.SIGTERM


def test_checksum_catches_flipped_bytes(tmp_path) -> None:
    """A byte-flipped checkpoint loaded silently (optimizer state off by 5.6e33)."""
    work = str(tmp_path)
    hooks = [{"type": "CheckpointChecksumHook"}, {"type": "RNGStateHook"}]
    toy_runner(work, hooks, max_iters=2, checkpoint_interval=2).train()
    path = os.path.join(work, "iter_2.pth")
    checkpoint = torch.load(path, weights_only=False)
    assert len(checkpoint["meta"]["npudet_sha256"]) == 64
    assert "optimizer" in checkpoint and "rng_state" in checkpoint["meta"]
    good = toy_runner(str(tmp_path / "ok"), hooks, max_iters=3, resume=True, load_from=path)
    good.train()  # an intact checkpoint resumes
    _flip_tensor_byte(path)
    torch.load(path, weights_only=False)  # negative control: torch itself does not notice
    bad = toy_runner(str(tmp_path / "bad"), hooks, max_iters=3, resume=True, load_from=path)
    with pytest.raises(CheckpointCorruptError, match=f"checkpoint {re.escape(path)} is corrupt"):
        bad.train()


class _LayerModel(BaseModel):
    """npudet's ``MSDeformAttn`` regressing a target, on hooks_util's RandomSet."""

    def __init__(self, impl: str) -> None:
        super().__init__()
        self.attn = MSDeformAttn(
            8, num_heads=2, num_levels=2, num_points=2, dropout=0.0, batch_first=True, impl=impl
        )
        self.register_buffer(
            "ref", torch.rand(1, QUERIES, 2, 2, generator=torch.Generator().manual_seed(0))
        )
        self.register_buffer("shapes", torch.tensor(SHAPES))

    def init_weights(self) -> None:
        """Keep the weights the test set (the Runner initialises models before training)."""

    def forward(self, query, feats, target, mode: str = "loss"):
        out = self.attn(
            query,
            value=feats,
            reference_points=self.ref.expand(len(query), -1, -1, -1),
            spatial_shapes=self.shapes,
        )
        return {"loss_mse": F.mse_loss(out, target)} if mode == "loss" else out


IMPLS = ["grid_sample", "gather"] + (["cpu"] if HAVE_CPU else [])


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_sampling_offsets_stop_the_run(tmp_path, impl) -> None:
    """A NaN sampling location gave finite zeros in the fused implementations, so a
    diverged ``sampling_offsets`` trained on silently; the layer now makes the output
    non-finite for every implementation and ``NonFiniteLossHook`` stops the run."""
    model = _LayerModel(impl)
    with torch.no_grad():
        model.attn.sampling_offsets.bias[3] = float("nan")
    query, feats = torch.randn(2, QUERIES, 8), torch.randn(2, KEYS, 8)
    model.train()
    assert not torch.isfinite(model(query, feats, torch.zeros(2, QUERIES, 8))["loss_mse"])
    model.eval()  # outside training the output is the op's (no added reduction)
    runner = toy_runner(str(tmp_path), [{"type": "NonFiniteLossHook"}], max_iters=2, model=model)
    with pytest.raises(NonFiniteLossError, match="iteration 1"):
        runner.train()


# -- --resume ------------------------------------------------------------------------------
def _fake_ckpt(path, iters: int) -> str:
    torch.save({"meta": {"iter": iters, "epoch": 0}, "state_dict": {}}, str(path))
    return str(path)


def test_resume_finds_the_newest_checkpoint_in_the_work_dir(tmp_path) -> None:
    cfg = Config(dict(work_dir=str(tmp_path / "a"), default_hooks=dict(checkpoint=dict())))
    work = tmp_path / "a"
    work.mkdir()
    assert find_resume_checkpoint(cfg) == (
        None,
        f"--resume: no checkpoint in {work}; starting from scratch",
    )
    _fake_ckpt(work / "epoch_1.pth", 4)
    _fake_ckpt(work / "epoch_2.pth", 8)
    newest = _fake_ckpt(work / "iter_10.pth", 10)  # an interrupt in epoch 3
    path, note = find_resume_checkpoint(cfg)
    assert path == newest and f"no {work / 'last_checkpoint'}" in note
    (work / "last_checkpoint").write_text(str(work / "epoch_2.pth"))
    assert find_resume_checkpoint(cfg)[0] == str(work / "epoch_2.pth")
    # A copied work dir: last_checkpoint still names the original's file.
    shutil.copytree(work, tmp_path / "b")
    cfg.work_dir = str(tmp_path / "b")
    path, note = find_resume_checkpoint(cfg)
    assert path == str(tmp_path / "b" / "iter_10.pth") and "outside" in note
    assert plan_resume(Config(dict(cfg, resume=True, load_from=None))) == note
    # Checkpoints only elsewhere, or none to resume from: refuse rather than overwrite.
    for name in os.listdir(tmp_path / "b"):
        if name.endswith(".pth"):
            os.remove(tmp_path / "b" / name)
    with pytest.raises(PreflightError, match=r"to continue from that checkpoint pass it"):
        find_resume_checkpoint(cfg)
    os.remove(tmp_path / "b" / "last_checkpoint")
    _fake_ckpt(tmp_path / "b" / "best_coco_bbox_mAP_epoch_2.pth", 8)
    with pytest.raises(PreflightError, match=r"holds \['best_coco.*no epoch_N.pth / iter_N.pth"):
        find_resume_checkpoint(cfg)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\xff\xfe\x00\x01 a checkpoint's bytes", "holds bytes that are not UTF-8 (at byte 0)"),
        (b"/work/epoch_1.pth\x00\x00\x00", "holds a NUL byte"),
    ],
)
def test_a_damaged_last_checkpoint_is_named(
    content, problem, tmp_path, monkeypatch, capsys
) -> None:
    """``last_checkpoint`` holding bytes that are not a path (a disk or copy fault) was a
    ``UnicodeDecodeError`` / ``ValueError`` traceback from ``--resume``."""
    work = tmp_path / "work"
    work.mkdir()
    _fake_ckpt(work / "epoch_1.pth", 4)
    record = work / "last_checkpoint"
    record.write_bytes(content)
    err = _tool("train.py", [SMALL_DETR, "--work-dir", str(work), "--resume"], monkeypatch, capsys)
    assert err == [
        f"error: --resume: {record} {problem}; expected the path of a checkpoint (mmengine "
        f"writes it there): delete the file to resume from the newest epoch_N.pth / "
        f"iter_N.pth in {work}, or pass one as --resume PATH"
    ]
    assert sorted(os.listdir(work)) == ["epoch_1.pth", "last_checkpoint"]
    assert record.read_bytes() == content


@pytest.fixture(scope="module")
def interrupted(tiny_shapes, tmp_path_factory) -> Dict:
    """tools/train.py on the tiny set, SIGINT after its first logged iteration; then
    ``--resume`` with ``last_checkpoint`` deleted (the newest checkpoint is found), for one
    epoch instead of two and at twice the learning rate."""
    work = str(tmp_path_factory.mktemp("interrupted") / "work")
    impl = "cpu" if HAVE_CPU else "grid_sample"
    # 4 iterations of 1 image per epoch: the signal lands mid-epoch, the resume reruns 4.
    opts = [*data_options(tiny_shapes), *FAST, *NO_VAL, "train_dataloader.batch_size=1"]
    opts.append("train_dataloader.dataset.indices=4")

    def args(*extra: str, epochs: int, changed: Sequence[str] = ()) -> List[str]:
        options = [*opts, f"train_cfg.max_epochs={epochs}", *changed]
        return train_args(SMALL_DETR, work, "--msda-impl", impl, *extra, options=options)

    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    log = os.path.join(os.path.dirname(work), "first.log")
    # Both streams to a file (a pipe nobody reads could fill and block the run), watched
    # for the logger's first iteration line.
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, *args(epochs=2)], cwd=ROOT, env=env, stdout=sink, stderr=sink
        )
        deadline = time.time() + 300
        while proc.poll() is None and time.time() < deadline:
            if "Epoch(train)" in Path(log).read_text():
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
    output = Path(log).read_text()
    first = dict(code=proc.returncode, output=output)
    os.remove(os.path.join(work, "last_checkpoint"))
    lr = Config.fromfile(SMALL_DETR).optim_wrapper.optimizer.lr
    second = run_tool(args("--resume", epochs=1, changed=[f"optim_wrapper.optimizer.lr={lr * 2}"]))
    return dict(work=work, first=first, second=second, lr=lr)


def test_sigint_saves_a_checkpoint_and_resume_continues(interrupted) -> None:
    """Ctrl-C before the first checkpoint lost everything, with a traceback; ``--resume``
    without ``last_checkpoint`` trained from scratch over the old checkpoints."""
    first, second, work = interrupted["first"], interrupted["second"], interrupted["work"]
    assert first["code"] == 128 + signal.SIGINT, first["output"][-3000:]
    assert "Traceback" not in first["output"], first["output"][-3000:]
    match = re.search(
        r"interrupted by SIGINT after iteration (\d+) \(epoch (\d+)\): resumable "
        r"checkpoint saved to (\S+); continue with --resume",
        first["output"],
    )
    assert match, first["output"][-3000:]
    iters, path = int(match.group(1)), match.group(3)
    assert path == os.path.join(work, f"iter_{iters}.pth")
    assert second.returncode == 0, second.stderr[-3000:]
    # the resumed run's epoch_1.pth superseded the interrupt's checkpoint, which it removed
    assert os.path.isfile(os.path.join(work, "epoch_1.pth")) and not os.path.exists(path)
    assert (
        f"[npudet] --resume: resuming from {path}, the newest checkpoint in {work} "
        f"(no {os.path.join(work, 'last_checkpoint')})"
    ) in second.stdout
    assert f"resumed epoch: {match.group(2)}, iter: {iters}" in second.stdout + second.stderr


def test_resume_with_a_changed_config_warns(interrupted) -> None:
    """``--resume`` at another learning rate trained at the checkpoint's without a word (the
    dumped config said the new rate); one warning line in the log now names every changed key
    (``resume`` and ``load_from`` differ by design and are left out)."""
    work, lr = interrupted["work"], interrupted["lr"]
    logs = [path.read_text() for path in Path(work).glob("*/*.log")]  # the two runs'
    log = next(text for text in logs if "resumed epoch" in text)
    lines = [line for text in logs for line in text.splitlines() if "config differs" in line]
    assert len(lines) == 1 and " - WARNING - " in lines[0], lines
    assert lines[0].endswith(
        f"2 key(s): optim_wrapper.optimizer.lr ({lr!r} -> {lr * 2!r}); train_cfg.max_epochs "
        "(2 -> 1); the optimizer (learning rates, momentum, weight decay) and the parameter "
        "schedulers continue from the checkpoint's state, so changes to them do not take effect"
    ), lines[0]
    # What it says: the resumed run goes on with the first's warm-up (linear from 0.1 x the
    # rate over 100 iterations: under twice its first value for 11 iterations, where twice
    # the rate would start above it).
    rate = r"Epoch\(train\).* lr: (\S+)"
    first = float(re.findall(rate, interrupted["first"]["output"])[0])
    resumed = [float(r) for r in re.findall(rate, log)]
    assert resumed and max(resumed) < 2 * first, (first, resumed)


def test_corrupt_training_checkpoint_stops_test_py(
    interrupted, tiny_shapes, tmp_path, monkeypatch, capsys
) -> None:
    """The checkpoints tools/train.py writes carry their sha256; a flipped byte stops
    tools/test.py (and --resume) with one line naming the file."""
    path = str(tmp_path / "flipped.pth")
    shutil.copy(os.path.join(interrupted["work"], "epoch_1.pth"), path)
    assert len(torch.load(path, weights_only=False)["meta"]["npudet_sha256"]) == 64
    _flip_tensor_byte(path)
    torch.load(path, weights_only=False)  # negative control: torch reads it
    args = [
        SMALL_DETR,
        path,
        "--work-dir",
        str(tmp_path / "w"),
        "--cfg-options",
        *data_options(tiny_shapes),
    ]
    err = _tool("test.py", args, monkeypatch, capsys)
    assert len(err) == 1 and err[0].startswith(
        f"error: checkpoint: checkpoint {path} is corrupt"
    ), err
    assert not (tmp_path / "w").exists()


def test_cpu_sanitize_takes_1_or_0_only(monkeypatch) -> None:
    """Any non-empty ``NPUDET_CPU_SANITIZE`` (even ``banana``) built the slow sanitizer
    variant; a value other than 1 / 0 now makes the kernel unavailable, saying why."""
    from npudet.ops.msda.backends import cpu_library

    monkeypatch.setattr(cpu_library, "_state", {})
    monkeypatch.setenv("NPUDET_CPU_SANITIZE", "banana")
    assert cpu_library.unavailable_reason() == (
        "NPUDET_CPU_SANITIZE='banana': expected 1 (sanitized builds) or 0 / unset"
    )
    monkeypatch.setenv("NPUDET_CPU_SANITIZE", "0")
    assert cpu_library.sanitize_requested() is False


class _CountSaves(Hook):
    def __init__(self) -> None:
        self.count = 0

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        self.count += 1


def test_a_signal_after_the_last_iteration_says_training_is_complete(tmp_path) -> None:
    """Ctrl-C during the final validation said "resumable checkpoint saved ... continue with
    --resume", and that resume failed ("trained 0 iterations"); now it points at the final
    checkpoint and at tools/test.py. The checkpoint hook's own save of that point is named,
    not saved again (at an epoch's end the second save was an ``iter_N.pth`` copy of
    ``epoch_K.pth`` that nothing removed)."""
    work = str(tmp_path)
    saves = _CountSaves()
    hooks = [_SignalAt(signal.SIGINT, at=4), {"type": "RunGuardHook"}, saves]
    atomic = dict(type="AtomicCheckpointHook")
    with pytest.raises(TrainingInterrupted) as err:
        toy_runner(
            work, hooks, max_iters=4, checkpoint_interval=3, checkpoint_options=atomic
        ).train()
    assert saves.count == 2  # iterations 3 and 4, by the checkpoint hook
    path = os.path.join(work, "iter_4.pth")
    assert str(err.value) == (
        f"interrupted by SIGINT after the last iteration (4): training is complete, its "
        f"checkpoint is {path}; evaluate it with tools/test.py"
    )
    assert err.value.checkpoint == path and err.value.signum == signal.SIGINT


def test_a_config_number_given_text_names_the_key(tmp_path, monkeypatch, capsys) -> None:
    """``optimizer.lr=4e-4x`` failed in the first step with "can't multiply sequence by
    non-int", naming neither the key nor the value."""
    err = _train_error(
        ["--cfg-options", "optim_wrapper.optimizer.lr=4e-4x"], tmp_path, monkeypatch, capsys
    )
    assert err == (
        "error: --cfg-options optim_wrapper.optimizer.lr='4e-4x': expected a number "
        "(the config has 0.0004)"
    )


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (
            "train_cfg.max_epoch=1",
            "train_cfg.max_epoch: unknown key: EpochBasedTrainLoop takes no 'max_epoch'; did "
            "you mean 'max_epochs'?",
        ),
        (
            "optim_wrapper.optimizer.weight_decy=0.1",
            "optim_wrapper.optimizer.weight_decy: unknown key: AdamW takes no 'weight_decy'; "
            "did you mean 'weight_decay'?",
        ),
        (
            "default_hooks.checkpoint.intervall=2",
            "default_hooks.checkpoint.intervall: unknown key: CheckpointHook takes no "
            "'intervall'; did you mean 'interval'?",
        ),
    ],
)
def test_a_misspelled_option_names_the_key(option, expected, tmp_path, monkeypatch, capsys) -> None:
    """``train_cfg.max_epoch=1`` was a ``TypeError`` when the runner built its loop; a
    misspelled checkpoint option failed at the first save, after an epoch."""
    err = _train_error(["--cfg-options", option], tmp_path, monkeypatch, capsys)
    assert err.startswith(f"error: --cfg-options {expected} ("), err


def test_options_are_checked_against_the_class_they_build() -> None:
    """Known keys pass (a hook's ``priority`` too); a new ``type`` puts every key of its dict
    to the new class."""
    cfg = Config.fromfile(SMALL_DETR)
    known = {"train_cfg.val_begin": 1, "default_hooks.checkpoint.priority": "LOW"}
    apply_cfg_options(cfg, {**known, "optim_wrapper.optimizer.amsgrad": True})
    with pytest.raises(
        PreflightError,
        match=r"^--cfg-options train_cfg\.max_epochs: unknown key: IterBasedTrainLoop takes no "
        r"'max_epochs'; did you mean 'max_iters'\?",
    ):
        apply_cfg_options(cfg, {"train_cfg.type": "IterBasedTrainLoop"})


def test_unwritable_test_out_stops_before_the_evaluation(tmp_path, monkeypatch, capsys) -> None:
    """``tools/test.py --out`` to a path that cannot be written failed after the whole
    evaluation, with no table; now it is the first check."""
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    out = blocker / "preds.pkl"
    err = _tool(
        "test.py", [SMALL_DETR, str(tmp_path / "none.pth"), "--out", str(out)], monkeypatch, capsys
    )
    assert err == [f"error: --out {out}: cannot be written ({blocker} is not a writable folder)"]


def _not_decoding(index: int) -> None:
    raise OSError(f"image {index} does not decode")


def _mmcv_undecodable(index: int) -> None:
    # what mmcv's LoadImageFromFile asserts when cv2 cannot decode a file (a truncated one)
    raise AssertionError(f"failed to load image: data/train/{index:06d}.jpg")


def _killed(index: int) -> None:
    if torch.utils.data.get_worker_info() is not None:  # a worker, never the test process
        os.kill(os.getpid(), signal.SIGKILL)


class _FailingAt(Dataset):
    """hooks_util's RandomSet whose sample ``bad`` fails to load (``fail(index)``): an image
    that does not decode mid-epoch under ``--skip-image-check``, a worker killed."""

    def __init__(self, bad: int, fail: Callable[[int], None]) -> None:
        self.items, self.bad, self.fail = RandomSet(8).items, bad, fail

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        if index == self.bad:
            self.fail(index)
        return self.items[index]


def test_a_failure_mid_run_saves_the_progress_first(tmp_path) -> None:
    """An image that failed to decode mid-epoch lost every iteration since the last
    checkpoint; tools/train.py's ``train_keeping_progress`` saves them, then the error goes on
    (as it is: a cause it does not know, as a crash in a layer, keeps its traceback)."""
    work = str(tmp_path)
    runner = toy_runner(work, [{"type": "RunGuardHook"}], max_iters=4)
    runner._train_dataloader = torch.utils.data.DataLoader(
        _FailingAt(6, _not_decoding), batch_size=2, shuffle=False
    )
    with pytest.raises(OSError, match="image 6 does not decode"):
        train_keeping_progress(runner)
    path = os.path.join(work, "iter_3.pth")  # batches 0-2 trained, batch 3 holds sample 6
    assert torch.load(path, weights_only=False)["meta"]["iter"] == 3
    assert open(os.path.join(work, "last_checkpoint")).read() == path


@pytest.mark.parametrize(
    ("fail", "workers", "cause"),
    [
        (_mmcv_undecodable, 0, r"image file data/train/000006\.jpg could not be decoded"),
        (_killed, 1, r"dataloader worker \(pid \d+\) killed by signal 9 \(SIGKILL\)"),
    ],
    ids=["undecodable", "worker-killed"],
)
def test_a_data_failure_mid_run_ends_in_one_line(tmp_path, capsys, fail, workers, cause) -> None:
    """A truncated image under ``--skip-image-check`` and a dataloader worker killed (the
    OOM killer) saved ``iter_N.pth`` but ended in a raw traceback (a worker killed while it
    sent a batch: a ``ConnectionResetError``, and at times torch's SIGCHLD handler broke the
    save itself); now one line names the cause and the checkpoint (status 2)."""
    work = str(tmp_path)
    runner = toy_runner(work, [{"type": "RunGuardHook"}], max_iters=4)
    # One batch in flight at most: the worker reaches sample 6 (batch 3) only once batch 2
    # was taken, so iterations were trained whatever the load (with torch's default of two
    # per worker, a slowed test process met the killed worker before its first iteration).
    prefetch = {"prefetch_factor": 1} if workers else {}
    runner._train_dataloader = torch.utils.data.DataLoader(
        _FailingAt(6, fail), batch_size=2, shuffle=False, num_workers=workers, **prefetch
    )
    with pytest.raises(SystemExit) as exit_info:
        run_guarded(lambda: train_keeping_progress(runner))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    match = re.fullmatch(
        rf"error: {cause}; training failed after iteration (?P<iters>\d+): the progress is "
        r"saved to (?P<path>\S+); continue with --resume once the cause is fixed",
        lines[0],
    )
    assert match, lines[0]
    iters, path = int(match["iters"]), match["path"]
    assert path == os.path.join(work, f"iter_{iters}.pth")
    assert torch.load(path, weights_only=False)["meta"]["iter"] == iters > 0


@pytest.mark.slow  # a tools/train.py run of 7 iterations
def test_a_truncated_image_under_skip_image_check_ends_in_one_line(tiny_shapes, tmp_path) -> None:
    """The tool end to end (the message logic: the test above): a training image truncated
    to 64 bytes, found by mmcv's loader mid-epoch."""
    data = _copy_data(tiny_shapes, tmp_path)
    train = os.path.join(data, "train")
    image = os.path.join(train, sorted(os.listdir(train))[-1])
    with open(image, "r+b") as f:
        f.truncate(64)
    work = str(tmp_path / "work")
    impl = "cpu" if HAVE_CPU else "grid_sample"
    opts = [*data_options(data), *FAST, *NO_VAL, "train_dataloader.batch_size=1"]
    opts += ["train_dataloader.sampler.shuffle=False", "train_cfg.max_epochs=1"]
    args = train_args(SMALL_DETR, work, "--msda-impl", impl, "--skip-image-check", options=opts)
    proc = run_tool(args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    match = re.fullmatch(
        rf"error: image file \S+{os.path.basename(image)} could not be decoded; training failed "
        r"after iteration (?P<iters>\d+): the progress is saved to (?P<path>\S+); continue "
        r"with --resume once the cause is fixed",
        line,
    )
    assert match and int(match["iters"]) > 0, line
    assert match["path"] == os.path.join(work, f"iter_{match['iters']}.pth")


def test_an_interrupted_kernel_build_in_the_preflight_ends_in_one_line(capsys) -> None:
    """A compiler interrupted by Ctrl-C (a background job: Python ignores SIGINT) ended the
    kernel build with a fallback to a slower one; its BuildInterrupted now ends the tool."""

    def build() -> None:
        raise BuildInterrupted("building the cpu MSDA kernel (avx2) stopped: its compiler "
                               "was interrupted (SIGINT)")  # fmt: skip

    with pytest.raises(SystemExit) as exit_info:
        run_checks(build)
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines() == [
        "interrupted: building the cpu MSDA kernel (avx2) stopped: its compiler was "
        "interrupted (SIGINT) (no checkpoint saved)"
    ]
