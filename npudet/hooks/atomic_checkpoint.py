"""Checkpoints that are never half written and never rotated out before their successor exists.

mmengine's ``CheckpointHook`` deletes the oldest checkpoint it keeps *before* writing the
new one, and writes the file in place: a kill (OOM killer, power loss) during the save leaves
no checkpoint at all with ``max_keep_ckpts=1``, and a full disk leaves a truncated one.
Here a checkpoint is written to a hidden ``.NAME.partial`` in the same folder, flushed to
the disk (``fsync``) and renamed over ``NAME`` (``os.replace``, atomic on POSIX); only then
is ``last_checkpoint`` replaced the same way and the checkpoints beyond ``max_keep_ckpts``
removed. A save that fails (``OSError``: disk full, quota, permissions) removes its partial
file and raises :class:`CheckpointSaveError` naming the file, the reason and the checkpoint
that is kept. Remote ``out_dir`` backends are left to mmengine.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, List, Optional

from mmdet.registry import HOOKS
from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook

RECORD = "last_checkpoint"
PARTIAL = ".partial"
# The message hub's list of checkpoints saved outside the hook's rotation (a signal's or a
# failure's ``iter_N.pth``, names in ``out_dir``); kept in the checkpoints, so a resumed run
# removes them once its own next checkpoint supersedes them.
PROGRESS_KEY = "npudet_progress_checkpoints"


class CheckpointSaveError(OSError):
    """A checkpoint could not be written; the previous one is intact."""


def _fsync(path: str) -> None:
    """Flush ``path`` (a file or a folder's entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def recorded_checkpoint(work_dir: str) -> Optional[str]:
    """The path ``work_dir/last_checkpoint`` names, if any."""
    record = os.path.join(work_dir, RECORD)
    if not os.path.isfile(record):
        return None
    with open(record) as f:
        return f.read().strip() or None


def replace_atomically(path: str, write: Any) -> None:
    """Create ``path`` by ``write(partial_path)``, fsync and rename: ``path`` is either the
    old file or the whole new one. The partial file is removed when ``write`` fails."""
    folder, name = os.path.split(os.path.abspath(path))
    partial = os.path.join(folder, f".{name}{PARTIAL}")
    try:
        write(partial)
        _fsync(partial)
        os.replace(partial, path)
    except BaseException:  # a failed or interrupted write leaves no partial file behind
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise
    _fsync(folder)  # the rename itself survives a power loss


def write_record(work_dir: str, checkpoint: str) -> None:
    """Point ``work_dir/last_checkpoint`` at ``checkpoint``, atomically."""

    def write(partial: str) -> None:
        with open(partial, "w") as f:
            f.write(checkpoint)

    replace_atomically(os.path.join(work_dir, RECORD), write)


def save_atomically(runner: Any, out_dir: str, filename: str, **kwargs: Any) -> str:
    """``runner.save_checkpoint(out_dir, filename, **kwargs)`` through a partial file; the
    path written. Raises :class:`CheckpointSaveError` (one line) when it cannot be written."""
    path = os.path.join(out_dir, filename)
    if not is_main_process():  # Runner.save_checkpoint writes on rank 0 only
        runner.save_checkpoint(out_dir, filename, **kwargs)
        return path

    def write(partial: str) -> None:
        runner.save_checkpoint(out_dir, os.path.basename(partial), **kwargs)

    try:
        replace_atomically(path, write)
    except OSError as err:
        kept = recorded_checkpoint(runner.work_dir)
        kept = kept if kept and os.path.isfile(kept) else None
        raise CheckpointSaveError(
            f"could not save checkpoint {path}: {err.strerror or err}; "
            f"the last good checkpoint is {kept or 'none (no checkpoint saved yet)'}"
        ) from err
    return path


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` (same arguments), saving atomically and rotating old
    checkpoints out only after the new one and ``last_checkpoint`` are on disk.
    ``last_ckpt_iters``: the iterations done when ``last_ckpt`` was saved."""

    last_ckpt_iters: Optional[int] = None

    def before_train(self, runner: Any) -> None:
        super().before_train(runner)
        # A save killed mid-write leaves its partial file; the run that owns the work dir
        # now (tools/train.py locks it) removes it.
        if isinstance(self.file_backend, LocalBackend) and is_main_process():
            folder = self.out_dir if os.path.isdir(self.out_dir) else None
            for name in os.listdir(folder) if folder else []:
                if name.startswith(".") and name.endswith(PARTIAL):
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(folder, name))

    def _save_checkpoint_with_step(self, runner: Any, step: int, meta: dict) -> None:
        if not isinstance(self.file_backend, LocalBackend):
            super()._save_checkpoint_with_step(runner, step, meta)
            return
        evicted: List[int] = []
        # _save_checkpoint and _save_best_checkpoint may both save one step (mmengine's rule)
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            # a deque of maxlen max_keep_ckpts (mmengine's): pop before it drops one silently
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                evicted.append(self.keep_ckpt_ids.popleft())
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info("keep_ckpt_ids", list(self.keep_ckpt_ids))
        filename = self.filename_tmpl.format(step)
        superseded = runner.message_hub.get_info(PROGRESS_KEY) or []
        runner.message_hub.update_info(PROGRESS_KEY, [])
        self.last_ckpt = os.path.join(self.out_dir, filename)
        self.last_ckpt_iters = meta.get("iter")  # RunGuardHook reuses a checkpoint of its point
        runner.message_hub.update_info("last_ckpt", self.last_ckpt)
        save_atomically(
            runner,
            self.out_dir,
            filename,
            file_client_args=self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args,
        )
        if not is_main_process():
            return
        write_record(runner.work_dir, self.last_ckpt)
        old_names = [self.filename_tmpl.format(old) for old in evicted]
        for name in old_names + [n for n in superseded if n != filename]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.out_dir, name))
