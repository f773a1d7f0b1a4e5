"""``--resume`` without a path: which checkpoint of the work dir to continue from.

mmengine resumes from the path in ``WORK_DIR/last_checkpoint`` and, without that file,
silently trains from scratch (overwriting ``epoch_1.pth`` ...); the file holds an absolute
path, so a copied work dir resumes from the original's checkpoint. Here the newest
checkpoint inside the checkpoint folder is taken instead whenever ``last_checkpoint`` is
missing, names a missing file or points elsewhere, and the choice is said; a
``last_checkpoint`` that holds no path (binary bytes) stops the run, naming it.

mmengine also resumes the optimizer's and the schedulers' state without a word about a config
changed since the checkpoint: :func:`resume_config_warning` names every changed key.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from mmengine.config import Config

from .preflight import PreflightError

_NAME = re.compile(r"^(epoch|iter)_(\d+)\.pth$")


def checkpoint_dir(cfg: Config) -> Optional[str]:
    """Where ``CheckpointHook`` writes: ``out_dir/<work dir name>`` if ``out_dir`` is set,
    else the work dir; None for a remote ``out_dir`` (left to mmengine)."""
    hook = (cfg.get("default_hooks") or {}).get("checkpoint") or {}
    out_dir = hook.get("out_dir")
    if not out_dir:
        return os.path.abspath(cfg.work_dir)
    if "://" in str(out_dir):
        return None
    return os.path.abspath(os.path.join(out_dir, os.path.basename(os.path.normpath(cfg.work_dir))))


def _iterations(path: str) -> int:
    """``meta['iter']`` of a checkpoint (memory-mapped: only the meta is read)."""
    try:
        meta = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("meta", {})
        return int(meta.get("iter", -1))
    except Exception:  # noqa: BLE001 - an unreadable candidate ranks last; preflight names it
        return -1


def newest_checkpoint(folder: str) -> Optional[str]:
    """The newest ``epoch_N.pth`` / ``iter_N.pth`` in ``folder``: the largest N of each
    kind, and between the two kinds the one with more iterations done (its ``meta``)."""
    if not os.path.isdir(folder):
        return None
    best = {}
    for name in os.listdir(folder):
        match = _NAME.match(name)
        if match and os.path.isfile(os.path.join(folder, name)):
            kind, number = match.group(1), int(match.group(2))
            if number > best.get(kind, (-1, ""))[0]:
                best[kind] = (number, os.path.join(folder, name))
    paths = [path for _, path in best.values()]
    if len(paths) == 2:
        paths.sort(key=_iterations)
    return paths[-1] if paths else None


def _inside(path: str, folder: str) -> bool:
    return os.path.dirname(os.path.realpath(path)) == os.path.realpath(folder)


def _read_record(record: str, folder: str) -> Optional[str]:
    """The path ``last_checkpoint`` holds (None when empty); PreflightError naming the file
    when it cannot be read or holds no path (bytes that are not UTF-8, a NUL byte: a disk or
    copy fault), which no fallback should paper over."""
    try:
        with open(record, "rb") as f:
            raw = f.read()
    except OSError as err:
        problem = f"cannot be read ({err.strerror or err})"
    else:
        try:
            text = raw.decode("utf-8")
            problem = "holds a NUL byte" if "\0" in text else ""
        except UnicodeDecodeError as err:
            problem = f"holds bytes that are not UTF-8 (at byte {err.start})"
        if not problem:
            return text.strip() or None
    raise PreflightError(
        f"--resume: {record} {problem}; expected the path of a checkpoint (mmengine writes it "
        f"there): delete the file to resume from the newest epoch_N.pth / iter_N.pth in "
        f"{folder}, or pass one as --resume PATH"
    )


def find_resume_checkpoint(cfg: Config) -> Tuple[Optional[str], str]:
    """(checkpoint to resume from or None to start from scratch, the line saying which).

    Raises PreflightError when the work dir holds checkpoints but none to resume from, or
    ``last_checkpoint`` names a checkpoint elsewhere and there is none inside.
    """
    work_dir = os.path.abspath(cfg.work_dir)
    folder = checkpoint_dir(cfg)
    if folder is None:
        return None, ""
    record = os.path.join(work_dir, "last_checkpoint")
    recorded = _read_record(record, folder) if os.path.isfile(record) else None
    if recorded and not os.path.isabs(recorded):
        recorded = os.path.join(work_dir, recorded)
    if recorded and _inside(recorded, folder) and os.path.isfile(recorded):
        return recorded, f"--resume: resuming from {recorded} (last_checkpoint)"
    newest = newest_checkpoint(folder)
    if recorded is None:
        why = f"no {record}"
    elif not _inside(recorded, folder):
        why = f"{record} names {recorded}, outside {folder} (a copied work dir?)"
    else:
        why = f"{record} names {recorded}, which does not exist"
    if newest is not None:
        return (
            newest,
            f"--resume: resuming from {newest}, the newest checkpoint in {folder} ({why})",
        )
    if recorded and os.path.isfile(recorded):
        raise PreflightError(
            f"--resume: {why} and {folder} holds no epoch_N.pth / iter_N.pth; to continue from "
            f"that checkpoint pass it: --resume {recorded}"
        )
    others = _checkpoint_files(folder)
    if others:
        raise PreflightError(
            f"--resume: {folder} holds {others} but no epoch_N.pth / iter_N.pth to resume from "
            f"({why}); pass one as --resume PATH, or drop --resume to start from scratch"
        )
    return None, f"--resume: no checkpoint in {folder}; starting from scratch"


def _checkpoint_files(folder: str) -> List[str]:
    if not os.path.isdir(folder):
        return []
    return sorted(name for name in os.listdir(folder) if name.endswith(".pth"))


def plan_resume(cfg: Config) -> str:
    """For ``cfg.resume`` without ``cfg.load_from`` (``--resume`` alone): set ``load_from`` to
    the checkpoint :func:`find_resume_checkpoint` chooses, or turn ``resume`` off when it
    starts from scratch; returns the line saying which ("" when there was nothing to do)."""
    if not cfg.get("resume") or cfg.get("load_from"):
        return ""
    path, note = find_resume_checkpoint(cfg)
    cfg.load_from = path
    if path is None and note:
        cfg.resume = False  # else mmengine reads last_checkpoint again
    return note


# Keys that differ between a run and its resumption by design: where it writes (work_dir),
# what it starts from (resume, load_from) and how it was launched (launcher: the command line).
RESUME_KEYS = ("work_dir", "resume", "load_from", "launcher")


def _flatten(value: Any, prefix: str, out: Dict[str, Any]) -> Dict[str, Any]:
    """``value`` as ``{dotted key: leaf}``: dicts by key, lists holding dicts or lists (a
    pipeline, hooks) by index; anything else, an empty dict too, is a leaf."""
    containers = (dict, list, tuple)
    if isinstance(value, dict) and value:
        items: Any = value.items()
    elif isinstance(value, (list, tuple)) and any(isinstance(v, containers) for v in value):
        items = enumerate(value)
    else:
        out[prefix] = value
        return out
    for key, item in items:
        _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def config_changes(path: str, cfg: Config) -> List[str]:
    """``key (the checkpoint's value -> this run's)`` for every dotted key whose value differs
    between the config saved in the checkpoint at ``path`` (mmengine's ``meta['cfg']``, the
    text of its run's config) and ``cfg``, but :data:`RESUME_KEYS`; [] when the checkpoint
    holds no config to compare with (one saved by another tool)."""
    try:
        text = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["meta"]["cfg"]
        saved = _flatten(Config.fromstring(text, ".py").to_dict(), "", {})
        # through text as the saved side, so that both hold the same types (tuples, lists)
        current = _flatten(Config.fromstring(cfg.pretty_text, ".py").to_dict(), "", {})
    except Exception:  # noqa: BLE001 - no meta, no cfg in it, or text that does not parse
        return []
    unset = object()
    changes = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key, unset), current.get(key, unset)
        if key.split(".")[0] not in RESUME_KEYS and old != new:
            shown = [_short(v) if v is not unset else "unset" for v in (old, new)]
            changes.append(f"{key} ({shown[0]} -> {shown[1]})")
    return changes


def resume_config_warning(path: str, cfg: Config) -> str:
    """The line that warns of :func:`config_changes` when resuming from ``path`` ("" when
    there are none): mmengine resumes the optimizer's and the parameter schedulers' state, so
    a learning rate or schedule changed for the resumed run does not take effect."""
    changes = config_changes(path, cfg)
    if not changes:
        return ""
    return (
        f"--resume: this run's config differs from the one {path} was trained with in "
        f"{len(changes)} key(s): {'; '.join(changes)}; the optimizer (learning rates, momentum, "
        "weight decay) and the parameter schedulers continue from the checkpoint's state, so "
        "changes to them do not take effect"
    )


def plan_elastic_restart(cfg: Config, environ: Mapping[str, str]) -> str:
    """For a worker that torchrun restarted (``--max-restarts``; it sets
    ``TORCHELASTIC_RESTART_COUNT`` > 0 in a restarted worker's environment): resume from the
    work dir's last checkpoint (:func:`find_resume_checkpoint`) whatever the command line said,
    since the first attempt saved its progress there; with none saved yet, start as the first
    attempt did (``--resume PATH``, the config's ``load_from``, or from scratch). Returns the
    line saying which ("" for a first start). Raises PreflightError as
    :func:`find_resume_checkpoint` does."""
    try:
        restarts = int(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        restarts = 0
    if restarts <= 0:
        return ""
    head = f"elastic restart {restarts} (torchrun --max-restarts)"
    path, note = find_resume_checkpoint(cfg)
    if path is None:
        start = f"from {cfg.load_from}" if cfg.get("load_from") else "from scratch"
        return f"{head}: no checkpoint in {checkpoint_dir(cfg)} yet; starting {start} again"
    cfg.resume = True
    cfg.load_from = path
    return f"{head}: {note}"
