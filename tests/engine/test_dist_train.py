"""tools/dist_train.sh: 2 CPU processes on gloo for a few iterations."""

from __future__ import annotations

import os
import socket
import subprocess

import torch.distributed as dist
from plugin_util import ROOT, SMALL_DETR, data_options

from npudet.engine.cpu_dist import end_distributed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_cpu_processes(tiny_shapes: str, tmp_path) -> None:
    work = tmp_path / "work"
    opts = [
        *data_options(tiny_shapes),
        "train_cfg.max_epochs=2",
        "train_cfg.val_interval=2",
        "train_dataloader.batch_size=2",
        "default_hooks.logger.interval=1",
    ]
    env = dict(os.environ, PORT=str(_free_port()), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [
            "bash",
            "tools/dist_train.sh",
            SMALL_DETR,
            "2",
            "--work-dir",
            str(work),
            "--msda-impl",
            "cpu",
            "--cfg-options",
            *opts,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
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
