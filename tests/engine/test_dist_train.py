"""tools/dist_train.sh: 2 CPU processes on gloo for a few iterations; elastic restarts."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Tuple

import pytest
import torch.distributed as dist
from mmengine.config import Config
from plugin_util import ROOT, SMALL_DETR, data_options

from npudet.engine.cpu_dist import end_distributed
from npudet.engine.resume import plan_elastic_restart
from npudet.hooks import run_guard
from npudet.hooks.run_guard import peer_lost


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _dist_train(work: Path, options: List[str], **env: str) -> Tuple[List[str], Dict[str, str]]:
    """``bash tools/dist_train.sh`` on the small config, 2 CPU processes, and its environment
    (a free port, ``env`` added)."""
    command = ["bash", "tools/dist_train.sh", SMALL_DETR, "2", "--work-dir", str(work)]
    command += ["--msda-impl", "cpu", "--cfg-options", *options]
    environ = dict(os.environ, PORT=str(_free_port()), OMP_NUM_THREADS="1", **env)
    return command, {**environ, "PYTHONWARNINGS": "ignore"}


def test_two_cpu_processes(tiny_shapes: str, tmp_path) -> None:
    work = tmp_path / "work"
    opts = [
        *data_options(tiny_shapes),
        "train_cfg.max_epochs=2",
        "train_cfg.val_interval=2",
        "train_dataloader.batch_size=2",
        "default_hooks.logger.interval=1",
    ]
    command, env = _dist_train(work, opts)
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = [p for p in work.glob("*/*.log")]
    text = logs[0].read_text()
    assert "Distributed launcher: pytorch" in text and "Distributed training: True" in text
    assert "GPU number: 2" in text  # mmengine's name for the world size
    assert "type='MMDistributedDataParallel'" in text
    # 8 images / (2 processes x batch 2) = 2 iterations per epoch.
    assert "Epoch(train) [2][2/2]" in text
    assert (work / "epoch_2.pth").is_file() and (work / "coco_bbox_val.json").is_file()


def test_end_distributed_destroys_the_group(tmp_path) -> None:
    """The tools end the process group themselves (mmengine does not); twice is harmless."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    assert dist.is_initialized()
    end_distributed()
    assert not dist.is_initialized()
    end_distributed()


def test_elastic_restart_resumes_from_the_work_dir(tmp_path) -> None:
    """A worker torchrun restarted continues from the work dir's last checkpoint, even when
    the command line named another; with none saved yet it starts as the first attempt."""
    cfg = Config(dict(work_dir=str(tmp_path), resume=True, load_from="given.pth"))
    assert plan_elastic_restart(cfg, {}) == ""  # not under torchrun
    assert plan_elastic_restart(cfg, {"TORCHELASTIC_RESTART_COUNT": "0"}) == ""  # first start
    restarted = {"TORCHELASTIC_RESTART_COUNT": "1"}
    note = plan_elastic_restart(cfg, restarted)
    assert note.endswith(f"no checkpoint in {tmp_path} yet; starting from given.pth again")
    assert cfg.load_from == "given.pth"
    (tmp_path / "epoch_1.pth").write_bytes(b"")  # only its name is read
    note = plan_elastic_restart(cfg, restarted)
    assert note.startswith("elastic restart 1 (torchrun --max-restarts): --resume: resuming")
    assert cfg.load_from == str(tmp_path / "epoch_1.pth") and cfg.resume


def test_max_restarts_must_be_a_number() -> None:
    proc = subprocess.run(
        ["bash", "tools/dist_train.sh", SMALL_DETR, "2"],
        cwd=ROOT,
        env=dict(os.environ, MAX_RESTARTS="three"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr == "error: MAX_RESTARTS=three: expected a whole number >= 0\n"


def test_peer_lost_needs_a_distributed_run() -> None:
    """Outside a process group, gloo's words in an error are not a lost peer."""
    assert not peer_lost(RuntimeError("Connection closed by peer [127.0.0.1]:1"))


def test_a_lost_peer_names_the_last_checkpoint(tmp_path, monkeypatch) -> None:
    """The surviving rank saves nothing and names the checkpoint a restart resumes from."""
    (tmp_path / "epoch_1.pth").write_bytes(b"")
    (tmp_path / "last_checkpoint").write_text(str(tmp_path / "epoch_1.pth"))
    logged = []

    class Runner:
        iter, work_dir = 2, str(tmp_path)
        logger = SimpleNamespace(error=logged.append)

        def train(self) -> None:
            raise RuntimeError("Connection closed by peer [127.0.0.1]:1")

    monkeypatch.setattr(run_guard, "peer_lost", lambda err: True)  # as in a 2-rank group
    with pytest.raises(run_guard.PeerLostError) as err:
        run_guard.train_keeping_progress(Runner())
    assert (
        str(err.value)
        == logged[0]
        == (
            f"a peer rank was lost at iteration 3; the last checkpoint is {tmp_path}/epoch_1.pth; "
            "with MAX_RESTARTS (tools/dist_train.sh) the job restarts from it"
        )
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_1.pth", "last_checkpoint"]
    (tmp_path / "last_checkpoint").unlink()
    with pytest.raises(run_guard.PeerLostError, match="; no checkpoint was saved yet; with MAX_"):
        run_guard.train_keeping_progress(Runner())


def test_a_dead_worker_in_a_distributed_run_is_not_a_lost_peer(tmp_path, monkeypatch) -> None:
    """A dataloader worker's death says "reset by peer" too: its cause is named, not a rank."""
    logged = []

    class Runner:
        iter, work_dir, hooks, epoch = 0, str(tmp_path), [], 0
        logger = SimpleNamespace(error=logged.append)

        def train(self) -> None:
            raise RuntimeError(
                "DataLoader worker (pid 4242) is killed by signal: Killed. Connection reset by peer"
            )

    monkeypatch.setattr(run_guard, "peer_lost", lambda err: True)  # as in a 2-rank group
    with pytest.raises(run_guard.TrainingFailed) as err:
        run_guard.train_keeping_progress(Runner())
    assert str(err.value).startswith("dataloader worker (pid 4242) killed by signal 9 (SIGKILL)")
    assert logged == [str(err.value)]


def _train_elastic(work: Path, options: List[str]) -> subprocess.Popen:
    """tools/dist_train.sh in elastic mode (one restart), its output in ``WORK.out``."""
    command, env = _dist_train(work, options, MAX_RESTARTS="1")
    with open(f"{work}.out", "w") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _worker_pid(launcher: int, rank: int) -> int:
    """The pid of torchrun's worker ``rank`` (its child with RANK=rank in its environment)."""
    for entry in Path("/proc").iterdir():
        try:
            ppid = next(
                line.split()[1]
                for line in (entry / "status").read_text().splitlines()
                if line.startswith("PPid")
            )
            if int(ppid) == launcher and f"RANK={rank}".encode() in (
                (entry / "environ").read_bytes().split(b"\0")
            ):
                return int(entry.name)
        except (OSError, ValueError, StopIteration):
            continue
    raise AssertionError(f"no worker of rank {rank} under pid {launcher}")


def _losses(work: Path) -> List[str]:
    text = "".join(p.read_text() for p in sorted(work.glob("*/*.log")))
    return re.findall(r"Epoch\(train\) \[(\d+)\]\[(\d+)/\d+\].*? loss: ([\d.]+)", text)


@pytest.mark.slow
def test_a_killed_rank_restarts_from_the_last_checkpoint(tiny_shapes: str, tmp_path) -> None:
    """MAX_RESTARTS=1: rank 1 SIGKILLed in epoch 2 (after epoch_1.pth) costs that epoch's
    iterations only; the job restarts, resumes and ends like an uninterrupted run.

    The final loss is compared within 1e-3 (relative): three runs here (one uninterrupted, two
    killed and restarted) logged the same final loss to its 4 decimals; gloo reduces 2 ranks
    in a fixed order, and the sampler's order and the schedulers resume from the checkpoint.
    """
    options = [
        *data_options(tiny_shapes),
        "train_cfg.max_epochs=3",
        "train_cfg.val_interval=3",
        "train_dataloader.batch_size=2",
        "default_hooks.logger.interval=1",
    ]
    reference = _train_elastic(tmp_path / "ref", options)
    assert reference.wait(timeout=600) == 0, (tmp_path / "ref.out").read_text()[-3000:]

    work = tmp_path / "killed"
    proc = _train_elastic(work, options)
    deadline = time.monotonic() + 300
    while not (work / "epoch_1.pth").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, "no epoch_1.pth"
        time.sleep(0.05)
    os.kill(_worker_pid(proc.pid, 1), signal.SIGKILL)
    assert proc.wait(timeout=600) == 0, Path(f"{work}.out").read_text()[-3000:]

    out = Path(f"{work}.out").read_text()
    assert "a peer rank was lost at iteration 3; the last checkpoint is" in out
    assert "elastic restart 1 (torchrun --max-restarts)" in out
    assert f"--resume: resuming from {work / 'epoch_1.pth'}" in out
    ref_losses, losses = _losses(tmp_path / "ref"), _losses(work)
    # the restarted run logs epochs 2 and 3 (the killed one logged epoch 1): 6 iterations
    assert [step[:2] for step in losses] == [step[:2] for step in ref_losses]
    assert float(losses[-1][2]) == pytest.approx(float(ref_losses[-1][2]), rel=1e-3)
    assert (work / "epoch_3.pth").is_file()
