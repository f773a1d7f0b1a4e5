"""Checkpoint saves are atomic and rotate only after the new one is on disk (issue 48, item 2).

A child trains the toy model with the checkpoint settings ``tools/train.py`` applies
(``guard_training``: ``max_keep_ckpts=1`` as the shipped configs keep) and is SIGKILLed
halfway through writing its second checkpoint, or runs out of disk space there. mmengine's
``CheckpointHook`` deleted the first checkpoint before writing the second: the kill left no
checkpoint at all and ``last_checkpoint`` naming a deleted file; the full disk a truncated
``.pth`` and a raw ``OSError`` traceback.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional, Tuple

import pytest
import torch
from hooks_util import toy_runner
from mmengine.config import Config
from plugin_util import ROOT

import npudet.hooks  # noqa: F401  (register)
from npudet.engine.resume import find_resume_checkpoint

DISK_KIB = 512  # the small disk; the second save (600 KB) does not fit, the first (100 KB) does
CHILD = """
import os, resource, signal, sys, time
import torch
from mmengine.config import Config
from mmengine.fileio.backends.local_backend import LocalBackend
from mmengine.hooks import Hook
from hooks_util import toy_runner
import npudet.hooks
from npudet.engine.cli import guard_training, run_guarded

mode, work, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
checkpoint = dict(type="CheckpointHook", interval=2, by_epoch=False, max_keep_ckpts=1)
cfg = Config(dict(work_dir=work, default_hooks=dict(checkpoint=checkpoint)))
guard_training(cfg)  # what tools/train.py does before it builds the runner


class Payload(Hook):
    # Checkpoints of a known size: 100 KB at iteration 2, 600 KB at iteration 4.
    def before_save_checkpoint(self, runner, checkpoint):
        size = 100_000 if runner.iter < 3 else 600_000
        checkpoint["payload"] = torch.randint(0, 255, (size,), dtype=torch.uint8)


if mode == "kill":
    put = LocalBackend.put

    def half_put(self, obj, filepath):
        # The second save writes half its bytes, then the parent SIGKILLs this process.
        if "4" in os.path.basename(filepath):
            with open(filepath, "wb") as f:
                f.write(obj[: len(obj) // 2])
            print("HALF", flush=True)
            time.sleep(600)
        return put(self, obj, filepath)

    LocalBackend.put = half_put
elif limit:  # no tmpfs: a file-size limit stands for the full disk (write fails: EFBIG)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
hooks = [*cfg.custom_hooks, Payload()]
runner = toy_runner(work, hooks, max_iters=4, checkpoint_interval=2,
                    checkpoint_options=cfg.default_hooks.checkpoint)
run_guarded(runner.train)
print("DONE", flush=True)
"""


def _child(mode: str, work: Path, limit: int = 0) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests", "hooks"), PYTHONWARNINGS="ignore")
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(work), str(limit)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _cfg(work: Path) -> Config:
    return Config(dict(work_dir=str(work), default_hooks=dict(checkpoint=dict())))


def _loads(path: Path, iters: int) -> None:
    assert torch.load(path, weights_only=False)["meta"]["iter"] == iters


def test_sigkill_during_a_save_keeps_the_last_checkpoint(tmp_path) -> None:
    work = tmp_path / "work"
    proc = _child("kill", work)
    end = time.monotonic() + 300
    while proc.stdout.readline().strip() != "HALF":
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    first = work / "iter_2.pth"
    _loads(first, 2)  # mmengine had deleted it before writing iter_4.pth
    assert not (work / "iter_4.pth").exists()
    assert (work / ".iter_4.pth.partial").stat().st_size > 0  # the half-written save
    assert (work / "last_checkpoint").read_text() == str(first)
    assert find_resume_checkpoint(_cfg(work))[0] == str(first)
    # The resumed run trains on, saves iter_4.pth, rotates iter_2.pth out only then and
    # removes the partial file the kill left.
    options = dict(type="AtomicCheckpointHook", max_keep_ckpts=1)
    resumed = toy_runner(
        str(work),
        [],
        max_iters=4,
        checkpoint_interval=2,
        checkpoint_options=options,
        resume=True,
        load_from=str(first),
    )
    resumed.train()
    assert sorted(p.name for p in work.glob("*.pth*")) == ["iter_4.pth"]
    assert not list(work.glob(".*.partial"))
    _loads(work / "iter_4.pth", 4)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Tuple[Path, Optional[int]]]:
    """A folder on a ``DISK_KIB`` tmpfs where this process may mount one (root), with no
    file-size limit; else a plain folder and the limit that stands in for the full disk."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mount = shutil.which("mount")
    mounted = (
        os.geteuid() == 0
        and mount is not None
        and subprocess.run(
            [mount, "-t", "tmpfs", "-o", f"size={DISK_KIB}k", "tmpfs", str(folder)],
            capture_output=True,
        ).returncode
        == 0
    )
    try:
        yield folder, None if mounted else DISK_KIB * 1024
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)


def test_full_disk_during_a_save_is_one_line_and_keeps_the_last_checkpoint(small_disk) -> None:
    folder, limit = small_disk
    work = folder / "work"
    proc = _child("disk", work, limit or 0)
    out, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in err, err
    first = work / "iter_2.pth"
    reason = "No space left on device" if limit is None else "File too large"
    assert lines[-1] == (
        f"error: could not save checkpoint {work / 'iter_4.pth'}: {reason}; "
        f"the last good checkpoint is {first}"
    ), err
    _loads(first, 2)
    assert sorted(p.name for p in work.glob("*.pth*")) == ["iter_2.pth"]  # no partial left
    assert find_resume_checkpoint(_cfg(work))[0] == str(first)
