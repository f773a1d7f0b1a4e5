"""``TorchCompileHook``: train with the detector's forward under ``torch.compile``.

mmengine's own ``compile`` setting compiles ``model.train_step``, which also traces the
backward call and the optimiser step; with torch 2.13 Dynamo stops on mmengine's
optimiser there (``InternalTorchDynamoError: 'UserDefinedDictVariable' object has no
attribute 'items'`` in ``Adam.step``). This hook compiles the forward of the training
step instead (``mode='loss'``: backbone, transformer with its MSDA layers, head and
losses); AOTAutograd compiles the matching backward, and the optimiser step stays eager.
Graph breaks are recorded with their code locations, logged, and written to
``graph_breaks.json`` in the log dir whenever new ones appear.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any, Dict, Optional, Sequence

import torch
from mmdet.registry import HOOKS
from mmengine.config import Config
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from npudet.utils.device import current_device_type

from .graph_breaks import MSDA_FILES, GraphBreakRecorder
from .hook_types import DataBatch, Outputs


def compile_forward(
    model: torch.nn.Module, options: Dict[str, Any], modes: Sequence[str] = ("loss",)
) -> None:
    """Make ``model``'s forward run under ``torch.compile(**options)`` in ``modes``.

    mmdet detectors take ``forward(inputs, data_samples, mode)``; calls in other modes
    run the eager forward. The compiled forward is an instance attribute, which
    ``nn.Module.__call__`` finds and ``state_dict`` does not see.
    """
    eager = model.forward
    compiled = torch.compile(eager, **options)
    chosen = tuple(modes)

    def forward(*args: Any, mode: str = "tensor", **kwargs: Any) -> Any:
        run = compiled if mode in chosen else eager
        return run(*args, mode=mode, **kwargs)

    model.forward = forward


@HOOKS.register_module()
class TorchCompileHook(Hook):
    """Compile the detector's forward for training.

    Args:
        backend: ``torch.compile`` backend (``"inductor"``, ``"aot_eager"``, ...).
        mode: ``torch.compile`` mode (``None``, ``"reduce-overhead"``, ...).
        dynamic: ``torch.compile``'s ``dynamic`` (``None``: mark sizes dynamic after the
            first recompilation, so images of a new size do not recompile again).
        fullgraph: refuse graph breaks (the detectors' Hungarian matching has some).
        options: backend options (``torch.compile(options=...)``, e.g. inductor's).
        modes: the forward modes that run compiled; the others (``"predict"`` in
            validation) stay eager.
    """

    priority = "VERY_HIGH"

    def __init__(
        self,
        backend: str = "inductor",
        mode: Optional[str] = None,
        dynamic: Optional[bool] = None,
        fullgraph: bool = False,
        options: Optional[Dict[str, Any]] = None,
        modes: Sequence[str] = ("loss",),
    ) -> None:
        if not isinstance(backend, str) or not backend:
            raise ValueError(f"backend: expected a torch.compile backend name, got {backend!r}")
        if isinstance(modes, str) or not modes:
            raise ValueError(f"modes: expected a non-empty list of forward modes, got {modes!r}")
        self.options: Dict[str, Any] = dict(
            backend=backend, mode=mode, dynamic=dynamic, fullgraph=fullgraph
        )
        if options:
            self.options["options"] = dict(options)
        self.modes = tuple(modes)
        self.recorder = GraphBreakRecorder()
        self._written = -1

    def before_train(self, runner: Any) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        compile_forward(model, self.options, self.modes)
        self.recorder.start()
        runner.logger.info(
            f"[npudet] torch.compile({', '.join(f'{k}={v!r}' for k, v in self.options.items())}) "
            f"on the forward in modes {list(self.modes)}; the first iterations compile"
        )

    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: DataBatch = None, outputs: Outputs = None
    ) -> None:
        total = self.recorder.total()
        runner.message_hub.update_scalar("train/graph_breaks", total)
        if total != self._written:
            self._write(runner)

    def after_train(self, runner: Any) -> None:
        self._write(runner)
        self.recorder.stop()
        breaks = self.recorder.breaks()
        in_msda = [b for b in breaks if b.in_files(MSDA_FILES)]
        lines = [f"  {b.count:4d}x {b.location}: {b.reason}" for b in breaks]
        runner.logger.info(
            f"[npudet] torch.compile: {len(breaks)} distinct graph breaks "
            f"({self.recorder.total()} reports), {len(in_msda)} inside the MSDA op / layers"
            + ("\n" + "\n".join(lines) if lines else "")
        )

    def _write(self, runner: Any) -> None:
        self._written = self.recorder.total()
        if not is_main_process():
            return
        breaks = self.recorder.breaks()
        report = dict(
            options=self.options,
            modes=list(self.modes),
            total=self._written,
            distinct=len(breaks),
            in_msda=sum(b.in_files(MSDA_FILES) for b in breaks),
            breaks=[asdict(b) for b in breaks],
        )
        with open(os.path.join(runner.log_dir, "graph_breaks.json"), "w") as f:
            json.dump(report, f, indent=1)


def inductor_problem(device_type: str) -> Optional[str]:
    """Why inductor cannot generate code for ``device_type`` here (None if it can).

    Inductor ships code generators for CPU and CUDA (and XPU, MPS); an out-of-tree device
    brings its own (torch_npu registers one with its inductor support). Without one,
    compilation dies in lowering after the first batch with an ``AssertionError``.
    """
    try:
        from torch._inductor.codegen.common import (
            get_scheduling_for_device,
            init_backend_registration,
        )
    except ImportError:  # a torch without these hooks: let torch.compile decide
        return None
    init_backend_registration()
    if get_scheduling_for_device(device_type) is not None:
        return None
    return (
        f"inductor has no code generator for the {device_type} device in this torch "
        f"(torch_npu registers one where its inductor support is installed); use "
        "--compile aot_eager to capture the graphs without generating code, or train without "
        "--compile"
    )


def compile_with_hook(cfg: Config, backend: Optional[str] = None) -> bool:
    """Route a ``compile`` setting to :class:`TorchCompileHook` instead of mmengine.

    The setting is the config's ``compile`` (mmengine's key: ``True`` or a dict of
    ``torch.compile`` options), with ``backend`` (``tools/train.py --compile BACKEND``)
    taking precedence. ``cfg.compile`` is cleared so mmengine does not compile
    ``train_step`` as well. Returns whether training will be compiled.
    """
    setting = cfg.get("compile")
    if setting is not None and not isinstance(setting, (bool, dict)):
        raise ValueError(
            f"compile: expected True, False or a dict of torch.compile options, got {setting!r}"
        )
    if backend is not None:
        setting = dict(setting if isinstance(setting, dict) else {}, backend=backend)
    cfg.compile = None
    if not setting:
        return False
    chosen = setting.get("backend", "inductor") if isinstance(setting, dict) else "inductor"
    problem = inductor_problem(current_device_type()) if chosen == "inductor" else None
    if problem:
        raise ValueError(f"compile: {problem}")
    hook = dict(type="TorchCompileHook", **(setting if isinstance(setting, dict) else {}))
    others = [h for h in cfg.get("custom_hooks", []) if h.get("type") != "TorchCompileHook"]
    cfg.custom_hooks = others + [hook]
    return True
