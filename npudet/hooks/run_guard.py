"""Nothing lost, nothing silent: interrupts save a checkpoint, checkpoints carry a checksum,
a run that trains nothing fails.

- ``RunGuardHook``: SIGINT / SIGTERM during training save a resumable checkpoint at the next
  safe point (after the current iteration, or validation batch) and raise
  :class:`TrainingInterrupted`; a second signal interrupts at once. A run that ends having
  trained no iteration raises :class:`NothingTrainedError`.
- :func:`train_keeping_progress`: ``runner.train()`` that saves the iterations done since
  the last checkpoint when training fails (and re-raises; as :class:`TrainingFailed`, one
  line naming the cause and the checkpoint, where the cause is the data's: a dataloader
  worker killed, an image that does not decode).
- ``CheckpointChecksumHook``: every checkpoint the runner saves carries the sha256 of its
  content in ``meta['npudet_sha256']``, checked when the runner loads it
  (:func:`verify_checkpoint`; npudet's tools check it before the runner exists too).

``tools/train.py`` adds both hooks to every run (``tools/test.py`` the checksum hook).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import threading
from typing import Any, Dict, Iterator, Mapping, Optional

import numpy as np
import torch
from mmdet.registry import HOOKS
from mmengine.hooks import CheckpointHook, Hook
from mmengine.runner import EpochBasedTrainLoop

from .atomic_checkpoint import (
    PROGRESS_KEY,
    AtomicCheckpointHook,
    CheckpointSaveError,
    recorded_checkpoint,
    save_atomically,
    write_record,
)
from .non_finite_loss import NonFiniteLossError, _any_rank

CHECKSUM_KEY = "npudet_sha256"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on SIGINT / SIGTERM after saving ``checkpoint`` (a KeyboardInterrupt,
    so that no ``except Exception`` on the way swallows it)."""

    def __init__(self, message: str, signum: int, checkpoint: Optional[str]) -> None:
        super().__init__(message)
        self.signum = signum
        self.checkpoint = checkpoint


class NothingTrainedError(RuntimeError):
    """The training loop ended without running a single iteration."""


class TrainingFailed(RuntimeError):
    """Training failed for a cause outside the model (the data's), reported in one line with
    the checkpoint its progress was saved to (``checkpoint``, None when nothing was)."""

    def __init__(self, message: str, checkpoint: Optional[str]) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


class PeerLostError(RuntimeError):
    """Another rank of a distributed run died (its collective failed on this rank)."""


# What a collective raises on a surviving rank when a peer process dies: gloo's and NCCL's
# words (torch raises them as a plain RuntimeError or as DistError).
_PEER_LOST = ("closed by peer", "reset by peer", "remote worker crash", "remote process exit")


def peer_lost(err: BaseException) -> bool:
    """Whether ``err`` is a collective failing because another rank is gone."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    if torch.distributed.get_world_size() < 2:
        return False
    text = str(err).lower()
    return isinstance(err, torch.distributed.DistError) or any(m in text for m in _PEER_LOST)


class CheckpointCorruptError(ValueError):
    """A checkpoint's content does not match the checksum stored when it was saved."""


def _feed(digest: Any, obj: Any) -> None:
    """Hash ``obj`` by content: tensors and arrays by dtype, shape and bytes, containers
    item by item, other objects by their attributes (what a loaded copy has again)."""
    if isinstance(obj, torch.Tensor):
        digest.update(f"T{obj.dtype}{tuple(obj.shape)}".encode())
        data = obj.detach().cpu().contiguous().reshape(-1)
        digest.update(data.view(torch.uint8).numpy())
    elif isinstance(obj, np.ndarray):
        digest.update(f"A{obj.dtype}{obj.shape}".encode())
        if obj.dtype.hasobject:
            _feed(digest, obj.tolist())
        else:
            digest.update(np.ascontiguousarray(obj).reshape(-1).view(np.uint8))
    elif isinstance(obj, Mapping):
        digest.update(f"D{len(obj)}".encode())
        for key, value in obj.items():
            _feed(digest, key)
            _feed(digest, value)
    elif isinstance(obj, (list, tuple)):
        digest.update(f"{type(obj).__name__}{len(obj)}".encode())
        for item in obj:
            _feed(digest, item)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):  # mmengine's HistoryBuffer
        digest.update(type(obj).__qualname__.encode())
        _feed(digest, vars(obj))
    else:
        digest.update(f"{type(obj).__name__}:{obj!r}".encode())


def checkpoint_digest(checkpoint: Mapping) -> str:
    """sha256 of everything in ``checkpoint`` but the stored checksum itself."""
    meta = {k: v for k, v in (checkpoint.get("meta") or {}).items() if k != CHECKSUM_KEY}
    digest = hashlib.sha256()
    _feed(digest, {**checkpoint, "meta": meta})
    return digest.hexdigest()


def verify_checkpoint(checkpoint: Mapping, path: str) -> bool:
    """Raise :class:`CheckpointCorruptError` naming ``path`` if the stored checksum does not
    match; False if there is none (a checkpoint not saved with ``CheckpointChecksumHook``)."""
    meta = checkpoint.get("meta") if isinstance(checkpoint, Mapping) else None
    stored = meta.get(CHECKSUM_KEY) if isinstance(meta, Mapping) else None
    if stored is None:
        return False
    actual = checkpoint_digest(checkpoint)
    if actual != stored:
        raise CheckpointCorruptError(
            f"checkpoint {path} is corrupt: the sha256 of its content ({actual[:12]}...) differs "
            f"from the one stored when it was saved ({str(stored)[:12]}...); use an earlier one"
        )
    return True


@HOOKS.register_module()
class CheckpointChecksumHook(Hook):
    """Store the sha256 of each saved checkpoint in ``meta['npudet_sha256']``; check it on load.

    Priority LOWEST: the checksum is taken after every other hook has added its part
    (``RNGStateHook``'s states, ``EMAHook``'s swap). On load it runs last as well, so a
    checkpoint with ``ema_state_dict`` (which ``EMAHook`` has rearranged by then) is not
    checked here; npudet's tools check every checkpoint file before the runner loads it.
    """

    priority = "LOWEST"

    def before_save_checkpoint(self, runner: Any, checkpoint: Dict) -> None:
        checkpoint.setdefault("meta", {})[CHECKSUM_KEY] = checkpoint_digest(checkpoint)

    def after_load_checkpoint(self, runner: Any, checkpoint: Dict) -> None:
        if "ema_state_dict" in checkpoint:
            return
        verify_checkpoint(checkpoint, str(getattr(runner, "_load_from", None) or "(loaded)"))


@HOOKS.register_module()
class RunGuardHook(Hook):
    """Save a resumable checkpoint on SIGINT / SIGTERM; fail a run that trained nothing.

    The signal handler only records the signal: the checkpoint is written at the next
    iteration boundary (after the current iteration or validation batch, or after the
    epoch's own hooks at an epoch's end), where model, optimizer, schedulers and counters
    agree. There ``runner.save_checkpoint`` writes ``iter_N.pth`` (N: iterations done) next
    to ``CheckpointHook``'s checkpoints, ``last_checkpoint`` names it, and
    :class:`TrainingInterrupted` ends the run. A second signal before that raises
    ``KeyboardInterrupt`` at once. Ranks agree (all-reduce), so all of them stop together.

    An epoch-based run resumed from a mid-epoch checkpoint reruns that epoch from its first
    batch (mmengine's ``EpochBasedTrainLoop`` starts epochs at batch 0); iteration-based runs
    skip the batches already trained.
    """

    priority = "LOWEST"

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.trained = 0
        self._start_iter = 0
        self._previous: Dict[int, Any] = {}

    # -- signals ---------------------------------------------------------------------
    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:  # second signal: stop now
            self._restore()
            raise KeyboardInterrupt
        self.signum = signum

    def _install(self) -> None:
        # Python delivers signals to the main thread only; elsewhere signal() raises.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    # -- hook stages -----------------------------------------------------------------
    def before_train(self, runner: Any) -> None:
        self._start_iter = runner.iter
        self.signum = None
        self._install()

    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        by_epoch = isinstance(runner.train_loop, EpochBasedTrainLoop)
        if by_epoch and batch_idx + 1 == len(runner.train_dataloader):
            return  # the epoch's own hooks (schedulers, CheckpointHook) run first
        # The loop counts this iteration only after its hooks: iter + 1 are done.
        self._stop_if_signalled(runner, epoch=runner.epoch, iters=runner.iter + 1)

    def after_train_epoch(self, runner: Any) -> None:
        self._stop_if_signalled(runner, epoch=runner.epoch + 1, iters=runner.iter)

    def after_val_iter(
        self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        if self._previous or self.signum is not None:  # validation inside training
            self._stop_if_signalled(runner, epoch=runner.epoch, iters=runner.iter)

    def after_train(self, runner: Any) -> None:
        self._restore()
        self.trained = runner.iter - self._start_iter
        if self.trained > 0:
            return
        loop = runner.train_loop
        if len(runner.train_dataloader) == 0:
            why = "the training set is empty (after the dataset's filter_cfg)"
        elif runner.iter >= loop.max_iters:
            limit = (
                f"train_cfg.max_epochs={loop.max_epochs}"
                if isinstance(loop, EpochBasedTrainLoop)
                else f"train_cfg.max_iters={loop.max_iters}"
            )
            why = f"the run starts at iteration {runner.iter}, its end by {limit}"
        else:
            why = "the training loop stopped before its first iteration"
        raise NothingTrainedError(f"trained 0 iterations: {why}")

    # -- the checkpoint --------------------------------------------------------------
    def _stop_if_signalled(self, runner: Any, epoch: int, iters: int) -> None:
        device = next(runner.model.parameters()).device
        if not _any_rank(self.signum is not None, device):
            return
        signum = self.signum if self.signum is not None else signal.SIGTERM  # another rank's
        self._restore()
        name = signal.Signals(signum).name
        path = saved_at(runner, iters) or save_progress(runner, epoch, iters)
        if iters >= runner.train_loop.max_iters:  # the final validation: nothing to resume
            message = (
                f"interrupted by {name} after the last iteration ({iters}): training is "
                f"complete, its checkpoint is {path}; evaluate it with tools/test.py"
            )
        else:
            message = (
                f"interrupted by {name} after iteration {iters} (epoch {epoch}): resumable "
                f"checkpoint saved to {path}; continue with --resume"
            )
        runner.logger.warning(message)
        raise TrainingInterrupted(message, signum, path)


def saved_at(runner: Any, iters: int) -> Optional[str]:
    """The checkpoint ``AtomicCheckpointHook`` saved after ``iters`` iterations, if it did
    (at an epoch's or the training's end): no copy of it is needed."""
    hook = next((h for h in runner.hooks if isinstance(h, AtomicCheckpointHook)), None)
    if hook is None or getattr(hook, "last_ckpt_iters", None) != iters:
        return None
    return hook.last_ckpt if os.path.isfile(hook.last_ckpt) else None


def save_progress(runner: Any, epoch: int, iters: int) -> str:
    """Save ``iter_{iters}.pth`` next to ``CheckpointHook``'s checkpoints (atomically) and
    point ``last_checkpoint`` at it; its path."""
    hook = next((h for h in runner.hooks if isinstance(h, CheckpointHook)), None)
    out_dir = getattr(hook, "out_dir", None) or runner.work_dir
    name = f"iter_{iters}.pth"
    # outside the hook's rotation: its next checkpoint (after a resume too) removes this one
    progress = runner.message_hub.get_info(PROGRESS_KEY) or []
    runner.message_hub.update_info(PROGRESS_KEY, [*progress, name])
    path = save_atomically(
        runner,
        out_dir,
        name,
        meta=dict(epoch=epoch, iter=iters),
        by_epoch=False,
        backend_args=getattr(hook, "backend_args", None),
    )
    if runner.rank == 0:
        write_record(runner.work_dir, path)
    return path


# What torch's DataLoader raises when a worker dies (its SIGCHLD handler, or the check when
# the queue fails), and what mmcv's LoadImageFromFile (an assert) and PIL say of an image that
# does not decode; a worker's error arrives re-raised with its traceback in the message.
_WORKER_SIGNALLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)")
_WORKER_EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
_UNDECODABLE = re.compile(r"failed to load image: (\S+)|cannot identify image file '([^']+)'")


def _signal_number(description: str) -> Optional[signal.Signals]:
    """The signal whose ``strsignal`` text is ``description`` (``Killed`` -> 9), or None."""
    return next((s for s in signal.Signals if signal.strsignal(s) == description.strip()), None)


def dead_worker_error() -> Optional[str]:
    """torch's own check of the DataLoader workers still registered (those of the loop that
    failed: its frame is alive in the traceback): its message when one has died, else None.
    A worker killed while it sends a batch fails the loop with whatever the transfer hit
    (``ConnectionResetError``), which names no worker."""
    from torch.utils.data._utils.signal_handling import _error_if_any_worker_fails

    try:
        _error_if_any_worker_fails()
    except RuntimeError as err:
        return str(err)
    return None


@contextlib.contextmanager
def sigchld_default() -> Iterator[None]:
    """SIGCHLD's default action meanwhile: torch's DataLoader handler raises on it when a
    worker has died, in whatever runs then (the progress save's own ``git`` child sends one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def _worker_exit(err: BaseException, pid: int) -> Optional[int]:
    """The exit code of DataLoader worker ``pid`` (-N: killed by signal N), read from the
    iterator in ``err``'s traceback: torch's queue check reaps a dead worker before it says
    "exited unexpectedly", so only the worker's process object still knows how it ended."""
    tb = err.__traceback__
    while tb is not None:
        workers = getattr(tb.tb_frame.f_locals.get("self"), "_workers", None)
        for worker in workers if isinstance(workers, list) else []:
            if getattr(worker, "pid", None) == pid:
                return getattr(worker, "exitcode", None)
        tb = tb.tb_next
    return None


def failure_cause(err: BaseException) -> Optional[str]:
    """What went wrong outside the model when training failed with ``err``, in words (a
    dataloader worker killed by a signal or gone: :func:`dead_worker_error` first, an image
    file that does not decode); None for any other error."""
    text = f"{dead_worker_error() or ''}\n{err}"
    match = _WORKER_SIGNALLED.search(text)
    if match:
        number = _signal_number(match.group(2))
        what = f"signal {int(number)} ({number.name})" if number else f"signal {match.group(2)}"
        return f"dataloader worker (pid {match.group(1)}) killed by {what}"
    match = _WORKER_EXITED.search(text)
    if match:
        pid = match.group(1).split(",")[0].strip()
        code = _worker_exit(err, int(pid))
        if code is not None and code < 0:
            name = next((s.name for s in signal.Signals if s == -code), "")
            how = f"killed by signal {-code}" + (f" ({name})" if name else "")
        else:
            how = "exited unexpectedly" if code is None else f"exited with status {code}"
        return f"dataloader worker (pid {pid}) {how}"
    match = _UNDECODABLE.search(text)
    if match:
        return f"image file {match.group(1) or match.group(2)} could not be decoded"
    return None


def train_keeping_progress(runner: Any) -> None:
    """``runner.train()``; when it fails (an image that does not decode mid-epoch, a crash
    in a layer), the iterations done since the last checkpoint are saved first
    (``iter_N.pth``, logged) and the error goes on: as :class:`TrainingFailed` naming the
    cause and the checkpoint where :func:`failure_cause` knows the cause, as it is
    otherwise (a traceback is what tells a crash in a layer). Not after a stop that must
    keep the last checkpoint as it is (divergence, a failed save, a corrupt checkpoint) or
    that trained nothing (a resumed finished run: its checkpoint is the progress); when a
    peer rank is lost, :class:`PeerLostError` names the last checkpoint instead."""
    try:
        runner.train()
    except (NonFiniteLossError, CheckpointSaveError, CheckpointCorruptError, NothingTrainedError):
        raise
    except Exception as err:
        iters = runner.iter
        # A dataloader worker's death reads like a lost peer ("reset by peer") in a
        # distributed run: the cause found in the error wins over the collective's words.
        cause = failure_cause(err)
        if cause is None and peer_lost(err):
            # This rank's state alone after a collective failed half way: keep the last
            # checkpoint as the point to restart from (tools/dist_train.sh MAX_RESTARTS=N).
            kept = recorded_checkpoint(runner.work_dir)
            restart = "with MAX_RESTARTS (tools/dist_train.sh) the job"
            if kept and os.path.isfile(kept):
                after = f"the last checkpoint is {kept}; {restart} restarts from it"
            else:
                after = f"no checkpoint was saved yet; {restart} starts again as it first did"
            message = f"a peer rank was lost at iteration {iters + 1}; {after}"
            runner.logger.error(message)
            raise PeerLostError(message) from err
        path = saved_at(runner, iters)
        if iters > 0 and path is None:
            with sigchld_default():
                path = save_progress(runner, runner.epoch, iters)
            kept = f"the progress is saved to {path}"
        elif path is not None:
            kept = f"its checkpoint is {path}"
        else:
            kept = "no iteration was trained, nothing is saved"
        message = f"training failed after iteration {iters}: {kept}" + (
            "; continue with --resume once the cause is fixed" if path else ""
        )
        if cause is None:
            if path is not None:
                runner.logger.error(message)
            raise
        message = f"{cause}; {message}"
        runner.logger.error(message)
        raise TrainingFailed(message, path) from err
