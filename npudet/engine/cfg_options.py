"""``--cfg-options`` checked as they are applied, so that a typo stops with one line naming the
key before any work dir is made, not minutes later as a ``TypeError`` at runner build (a
misspelled ``train_cfg.max_epoch``) or at the first checkpoint (``default_hooks.checkpoint``).

Two checks: a value replacing a number of the config is a number; a key set inside a dict that
builds a known class (``train_cfg``: a training loop; ``optim_wrapper.optimizer``: a torch
optimizer; ``default_hooks.X`` and ``custom_hooks.N``: a hook) is one of that class's
parameters, else the error names the nearest one.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from mmengine.config import Config
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS, LOOPS, OPTIMIZERS, Registry
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from .preflight import PreflightError

# Arguments the builder passes itself, never taken from the config.
_BUILDER_ARGS = {"self", "runner", "dataloader", "params"}


def apply_cfg_options(cfg: Config, options: Dict[str, Any]) -> None:
    """Merge ``options`` (``--cfg-options``, parsed) into ``cfg``; PreflightError naming the key
    of a number given text or of a parameter the built class does not take."""
    for key, value in options.items():
        _check_number(cfg, key, value)
    cfg.merge_from_dict(options)
    for key in options:
        for location, registry, extra in _known_dicts(cfg):
            if key == location or key.startswith(location + ".") or location.startswith(key + "."):
                _check_keys(cfg, key, location, registry, extra)


def _check_number(cfg: Config, key: str, value: Any) -> None:
    """``key=value`` replacing a number of the config takes a number: else the run fails
    minutes later without naming the key (``lr=4e-4x``: "can't multiply sequence by
    non-int"). A new key has nothing to compare with."""
    old = _lookup(cfg, key)
    number = (int, float)
    if isinstance(old, number) and not isinstance(old, bool):
        if not isinstance(value, number) or isinstance(value, bool):
            raise PreflightError(
                f"--cfg-options {key}={value!r}: expected a number (the config has {old!r})"
            )


def _lookup(cfg: Config, key: str) -> Any:
    """The value at dotted ``key`` of ``cfg`` (list items by index); None where there is none."""
    first, *rest = key.split(".")
    if first not in cfg.keys():
        return None
    value: Any = cfg.get(first)
    for part in rest:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _known_dicts(cfg: Config) -> Iterator[Tuple[str, Registry, Set[str]]]:
    """(dotted location, the registry its ``type`` is found in, keys taken besides the
    class's parameters) of each dict of ``cfg`` that builds a class of known parameters."""
    yield "train_cfg", LOOPS, {"type", "by_epoch"}
    yield "optim_wrapper.optimizer", OPTIMIZERS, {"type"}
    hooks = cfg.get("default_hooks") or {}
    # the runner pops `priority` before it builds a hook
    for name in hooks if isinstance(hooks, dict) else ():
        yield f"default_hooks.{name}", HOOKS, {"type", "priority"}
    for index, _ in enumerate(cfg.get("custom_hooks") or ()):
        yield f"custom_hooks.{index}", HOOKS, {"type", "priority"}


def _built_class(cfg: Config, spec: Dict, registry: Registry) -> Optional[type]:
    """The class ``spec`` builds: its ``type`` (a class, or a name in ``registry`` under the
    config's scope); for a ``train_cfg`` without one, mmengine's epoch or iteration loop by
    ``by_epoch``. None when unknown (a type registered by an import the runner does later)."""
    kind = spec.get("type")
    if kind is None and registry is LOOPS and "by_epoch" in spec:
        return EpochBasedTrainLoop if spec["by_epoch"] else IterBasedTrainLoop
    if isinstance(kind, type):
        return kind
    if not isinstance(kind, str):
        return None
    try:
        with registry.switch_scope_and_registry(cfg.get("default_scope")) as scoped:
            return scoped.get(kind)
    except Exception:  # noqa: BLE001 - an unknown scope or type: nothing to check against
        return None


def _parameters(cls: type) -> Optional[List[str]]:
    """The keyword parameters ``cls(...)`` takes from a config; None when it takes any
    (``**kwargs``) or its signature is unknown."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    # CheckpointHook hands its **kwargs to Runner.save_checkpoint, whose parameters the hook
    # already passes: any such key fails at the first save, after an epoch.
    if any(p.kind is p.VAR_KEYWORD for p in params) and not issubclass(cls, CheckpointHook):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.name not in _BUILDER_ARGS]


def _check_keys(cfg: Config, key: str, location: str, registry: Registry, extra: Set[str]) -> None:
    """The keys option ``key`` sets in the dict at ``location`` (one key below it, or all of
    them when the option replaces the dict or one above it) are parameters of its class."""
    spec = _lookup(cfg, location)
    if not isinstance(spec, dict):
        return
    cls = _built_class(cfg, spec, registry)
    params = None if cls is None else _parameters(cls)
    if params is None:
        return
    names = [key[len(location) + 1 :].split(".")[0]] if key.startswith(location + ".") else []
    if names in ([], ["type"]):  # a new dict or a new class: every key it holds
        names = list(spec)
    if "type" in spec:  # mmengine refuses by_epoch beside a type
        extra = extra - {"by_epoch"}
    known = sorted(set(params) | extra)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PreflightError(
                f"--cfg-options {location}.{name}: unknown key: {cls.__name__} takes no "
                f"{name!r}{hint} ({location} takes: {', '.join(known)})"
            )
