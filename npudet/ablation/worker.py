"""One ablation run in its own process: train a config for N iterations and record it.

``python -m npudet.ablation.worker SPEC_JSON`` reads a spec written by
``tools/analysis_tools/ablate.py``::

    {"config": path, "cfg_options": {...} | null, "msda": {...}, "iters": N,
     "work_dir": dir, "load_from": init weights path, "seed": 0, "threads": 2,
     "compile": {torch.compile options} | null}

trains with validation and checkpoints off, MSDA profiled per iteration (in eager runs:
a compiled forward has no per-call timing), the forward compiled when ``compile`` is
given (``TorchCompileHook``), and writes ``WORK_DIR/record.json``: ``{"msda_impls",
"loss": [N], "iter_ms": [N], "msda_fwd_ms": [N], "msda_bwd_ms": [N], "msda_calls",
"iter_cpu_ms": [N], "peak_mem_mb", "device", "threads", "torch", "graph_breaks"}``
(``iter_cpu_ms``: the process's CPU time per iteration, all threads).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from npudet.hooks.hook_types import DataBatch, Outputs

# Hooks of the config that rerun MSDA or time it: a timed run brings its own timing.
DROPPED_HOOKS = {"MSDAProfilerHook", "MSDAParityHook"}


class LossRecorderHook(Hook):
    """Keeps the total training loss of every iteration (``losses``) and every logged loss
    term (``terms``: one ``{name: value}`` per iteration, e.g. ``d0.loss_cls``)."""

    priority = "LOW"

    def __init__(self) -> None:
        self.losses: List[float] = []
        self.terms: List[Dict[str, float]] = []

    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: DataBatch = None, outputs: Outputs = None
    ) -> None:
        outputs = outputs or {}
        self.losses.append(float(outputs["loss"]))
        self.terms.append({k: float(v) for k, v in outputs.items() if "loss" in k and k != "loss"})


class CPUTimeHook(Hook):
    """Keeps this process's CPU time (all threads) of every training iteration in ``iter_cpu_ms``:
    beside the wall time, what tells a loaded run (npudet.benchmark.conditions)."""

    priority = "VERY_HIGH"

    def __init__(self) -> None:
        self.iter_cpu_ms: List[float] = []
        self._start = 0.0

    def before_train_iter(self, runner: Any, batch_idx: int, data_batch: DataBatch = None) -> None:
        self._start = time.process_time()

    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: DataBatch = None, outputs: Outputs = None
    ) -> None:
        self.iter_cpu_ms.append(1e3 * (time.process_time() - self._start))


def short_training(cfg: Config, work_dir: str, iters: int, seed: int) -> None:
    """Set ``cfg`` up, in place, for ``iters`` timed training iterations from ``seed``: no
    validation, test or checkpoints, a log line per iteration, and none of the config's own
    MSDA-timing hooks (the caller times)."""
    cfg.work_dir = work_dir
    cfg.resume = False
    cfg.randomness = dict(seed=seed, deterministic=False)
    cfg.train_cfg = dict(type="IterBasedTrainLoop", max_iters=iters, val_interval=iters + 1)
    for key in ("val_dataloader", "val_cfg", "val_evaluator"):
        cfg[key] = None
    for key in ("test_dataloader", "test_cfg", "test_evaluator"):
        cfg[key] = None
    cfg.default_hooks = dict(cfg.get("default_hooks") or {})
    cfg.default_hooks["checkpoint"] = None
    cfg.default_hooks["logger"] = dict(type="LoggerHook", interval=1)
    cfg.custom_hooks = [
        h for h in cfg.get("custom_hooks", []) if h.get("type") not in DROPPED_HOOKS
    ]
    cfg.compile = None


def ablation_config(spec: Dict[str, Any]) -> Config:
    """The spec's config, set up for a short, timed, validation-free training run."""
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    cfg = Config.fromfile(spec["config"])
    if spec.get("cfg_options"):
        cfg.merge_from_dict(spec["cfg_options"])
    cfg.model.msda = dict(spec["msda"])
    short_training(cfg, spec["work_dir"], int(spec["iters"]), spec.get("seed", 0))
    cfg.load_from = spec.get("load_from")
    cfg.custom_hooks.append(dict(type="MSDAProfilerHook", warmup_iters=0))
    if spec.get("compile") is not None:
        cfg.custom_hooks.append(dict(type="TorchCompileHook", **spec["compile"]))
    return cfg


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "npu":
        return torch.npu.max_memory_allocated(device) / 2**20  # type: ignore[attr-defined]
    # Peak resident set size of this process (Linux reports KiB).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Train as ``spec`` says and return (and write) the record."""
    import npudet.engine  # noqa: F401  (checkpoint loading)
    import npudet.hooks  # noqa: F401  (MSDAProfilerHook)
    import npudet.models  # noqa: F401
    from npudet.hooks import MSDAProfilerHook, TorchCompileHook

    torch.set_num_threads(int(spec["threads"]))
    cfg = ablation_config(spec)
    runner = Runner.from_cfg(cfg) if "runner_type" not in cfg else RUNNERS.build(cfg)
    recorder, cpu_time = LossRecorderHook(), CPUTimeHook()
    runner.register_hook(recorder)
    runner.register_hook(cpu_time)
    profiler = next(h for h in runner.hooks if isinstance(h, MSDAProfilerHook))
    compiler = next((h for h in runner.hooks if isinstance(h, TorchCompileHook)), None)
    runner.train()

    model = runner.model.module if hasattr(runner.model, "module") else runner.model
    device = next(model.parameters()).device
    record = {
        "msda_impls": getattr(model, "msda_impls", None),
        "loss": recorder.losses,
        "iter_ms": [r["iter_ms"] for r in profiler.records],
        "iter_cpu_ms": cpu_time.iter_cpu_ms,
        "msda_fwd_ms": [r["fwd_ms"] for r in profiler.records],
        "msda_bwd_ms": [r["bwd_ms"] for r in profiler.records],
        "msda_calls": profiler.records[-1]["calls"] if profiler.records else 0,
        "peak_mem_mb": _peak_mem_mb(device),
        "device": device.type,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "graph_breaks": compiler.recorder.total() if compiler is not None else 0,
    }
    return save_record(spec, record)


def save_record(spec: Dict[str, Any], record: Dict[str, Any]) -> Dict[str, Any]:
    """Write ``record`` to ``WORK_DIR/record.json`` (what the parent reads); returns it."""
    with open(os.path.join(spec["work_dir"], "record.json"), "w") as f:
        json.dump(record, f, indent=1)
    return record


def spec_main(
    run_spec: Callable[[Dict[str, Any]], Any], module: str, argv: Optional[List[str]]
) -> None:
    """``python -m MODULE SPEC_JSON``: run ``run_spec`` on the spec file's contents."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit(f"usage: python -m {module} SPEC_JSON")
    with open(args[0]) as f:
        run_spec(json.load(f))


def main(argv: Optional[List[str]] = None) -> None:
    spec_main(run, "npudet.ablation.worker", argv)


if __name__ == "__main__":
    main()
