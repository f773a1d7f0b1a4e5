"""One training per work dir (issue 48, item 4): a second ``tools/train.py`` on a work dir in
use stops with one line naming the process that holds it; the lock dies with its owner.

Before, two trainings in one work dir both exited 0, each overwriting the other's
checkpoints, metrics and config dump.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys

from plugin_util import ROOT, SMALL_DETR, data_options, run_tool

from npudet.engine.work_dir_lock import LOCK_NAME

# A training holding the work dir: what tools/train.py does before it builds its runner.
HOLDER = (
    "import sys, time\n"
    "from npudet.engine.work_dir_lock import lock_work_dir\n"
    "lock_work_dir(sys.argv[1])\n"
    "print('LOCKED', flush=True)\n"
    "time.sleep(600)\n"
)


def _train(work: str, data: str) -> subprocess.CompletedProcess:
    options = ["--cfg-options", *data_options(data), "train_cfg.max_epochs=1"]
    return run_tool(["tools/train.py", SMALL_DETR, "--work-dir", work, *options], timeout=300)


def test_a_second_training_in_a_work_dir_in_use_stops(tiny_shapes, tmp_path) -> None:
    work = str(tmp_path / "work")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, work], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "LOCKED"
        second = _train(work, tiny_shapes)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    err = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(err) == 1, second.stderr[-3000:]
    assert err[0].startswith(f"error: work dir {work} is in use by training process {holder.pid}")
    assert sorted(os.listdir(work)) == [LOCK_NAME]  # nothing of the first run overwritten
    # The holder is dead (SIGKILL): its lock went with it.
    with open(os.path.join(work, LOCK_NAME)) as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_work_dir_that_cannot_be_created_is_one_line(tiny_shapes, tmp_path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    proc = _train(str(blocker / "work"), tiny_shapes)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert err[0] == (
        f"error: work dir {blocker / 'work'}: cannot create or write it (Not a directory); "
        "pass a writable --work-dir"
    )


def test_the_holder_may_lock_its_work_dir_again(tmp_path) -> None:
    code = HOLDER.replace("print(", "lock_work_dir(sys.argv[1]); print(").replace(
        "time.sleep(600)\n", ""
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "LOCKED", proc.stderr[-2000:]
