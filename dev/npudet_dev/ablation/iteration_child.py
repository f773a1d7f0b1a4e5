"""One run of the iteration benchmark in its own process (so its peak memory is its own).

``python -m npudet_dev.ablation.iteration_child SPEC_JSON`` reads::

    {"config": path, "impl": "stock" | an MSDA implementation, "perturb_ulp": false,
     "data": {"kind": "coco" |
     "bev", "root": dir, "width": W, "height": H}, "iters": N, "init_weights": path,
     "seed": 0, "threads": 2, "work_dir": dir, "reference_matching": path | null,
     "bare": false, "cfg_options": {key: value} | null}

builds the runner (``stock``: mmdet's config and classes, npudet's plugin never imported,
see :mod:`.bench_config`), loads the shared initial weights (strict: the same parameter
names), reseeds, trains N iterations and writes ``WORK_DIR/record.json``: ``loss`` [N],
``loss_terms`` [N] {term: value}, ``matching`` and ``matching_ties`` (:mod:`.matching`;
``reference_matching``: a JSON file of the reference run's ``matching``), ``iter_ms`` [N],
``iter_cpu_ms`` [N], ``phases`` {phase: [N] ms} (:mod:`.time_split`), ``msda_calls``,
``peak_rss_mb``, ``detector``, ``msda_layer_classes``, ``msda_impls``, ``npudet_modules``.
``bare``: none of the benchmark's own work inside the model (no MSDA timer, no matching
recorder; both add ops to the iteration), for runs that count what the model dispatches.
``cfg_options``: merged into the config (``Config.merge_from_dict``) before the run.
"""

from __future__ import annotations

import json
import resource
import sys
import warnings
from typing import Any, Dict, List, Optional, Sequence

import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner, set_random_seed

from npudet.ablation.worker import LossRecorderHook, save_record, spec_main

from .bench_config import load_config, prepare_for_bench
from .bench_data import use_bev_frames, use_coco_images
from .matching import MatchingRecorder
from .roundoff_control import perturb_mmcv_output
from .time_split import PHASES, TimeSplitHook, time_mmcv_sampling


class InitialStateHook(Hook):
    """Before training: load the benchmark's initial weights (every parameter and buffer,
    by name) and reseed, so every run starts from the same weights and random state
    whatever its model's construction consumed."""

    priority = "VERY_HIGH"

    def __init__(self, path: str, seed: int) -> None:
        self.path, self.seed = path, seed

    def before_train(self, runner: Any) -> None:
        model = runner.model.module if hasattr(runner.model, "module") else runner.model
        state = torch.load(self.path, map_location="cpu", weights_only=True)["state_dict"]
        model.load_state_dict(state, strict=True)
        set_random_seed(self.seed)


def _msda_layer_classes(model: torch.nn.Module) -> List[str]:
    """Qualified class names of the model's deformable-attention modules (mmcv's or npudet's)."""
    names = set()
    for module in model.modules():
        cls = type(module)
        if "DeformableAttention" in cls.__name__ or "DeformAttn" in cls.__name__:
            names.add(f"{cls.__module__}.{cls.__qualname__}")
    return sorted(names)


def run(spec: Dict[str, Any], hooks: Sequence[Hook] = ()) -> Dict[str, Any]:
    """Train as ``spec`` says, with ``hooks`` registered after the benchmark's own (e.g. a
    profiler's); returns (and writes) the record."""
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
    torch.set_num_threads(int(spec["threads"]))
    stock = spec["impl"] == "stock"
    cfg = load_config(spec["config"], stock)
    if not stock:
        impl, _, layers = spec["impl"].partition(":")  # ``cpu:stock``: model.msda.layers
        cfg.model.msda = dict(
            impl=impl, encoder=None, decoder=None, **({"layers": layers} if layers else {})
        )
    if spec.get("cfg_options"):
        cfg.merge_from_dict(spec["cfg_options"])
    data = spec["data"]
    if data["kind"] == "coco":
        use_coco_images(cfg, data["root"], data["width"], data["height"])
    else:
        use_bev_frames(cfg, data["root"])
    prepare_for_bench(cfg, spec["work_dir"], int(spec["iters"]), int(spec["seed"]))

    runner = Runner.from_cfg(cfg)
    torch.set_num_threads(int(spec["threads"]))
    bare = bool(spec.get("bare"))
    splitter = TimeSplitHook(observe_op=not stock and not bare)
    recorder = LossRecorderHook()
    reference = None
    if spec.get("reference_matching"):
        with open(spec["reference_matching"]) as f:
            reference = json.load(f)
    matching = MatchingRecorder(reference)
    initial = InitialStateHook(spec["init_weights"], int(spec["seed"]))
    own = (initial, splitter, recorder) if bare else (initial, splitter, recorder, matching)
    for hook in (*own, *hooks):
        runner.register_hook(hook)
    # The perturbation first, so the timer wraps (and times) the perturbed sampling.
    undo_ulp = perturb_mmcv_output(int(spec["seed"])) if spec.get("perturb_ulp") else None
    undo = time_mmcv_sampling(splitter.msda) if stock and not bare else (lambda: None)
    try:
        runner.train()
    finally:
        undo()
        if undo_ulp is not None:
            undo_ulp()

    model = runner.model.module if hasattr(runner.model, "module") else runner.model
    record = {
        "impl": spec["impl"],
        "loss": recorder.losses,
        "loss_terms": recorder.terms,
        "matching": matching.pairs,
        "matching_ties": matching.ties,
        "iter_ms": [r["iter_ms"] for r in splitter.records],
        "iter_cpu_ms": [r["iter_cpu_ms"] for r in splitter.records],
        "phases": {p: [r[p] for r in splitter.records] for p in PHASES},
        "msda_calls": splitter.msda.calls,
        # Linux reports KiB: the peak resident set of this process, the run's own
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "detector": f"{type(model).__module__}.{type(model).__qualname__}",
        "msda_layer_classes": _msda_layer_classes(model),
        "msda_impls": getattr(model, "msda_impls", None),
        "npudet_modules": sorted(m for m in sys.modules if m.startswith("npudet.")),
        "threads": torch.get_num_threads(),
    }
    return save_record(spec, record)


def main(argv: Optional[List[str]] = None) -> None:
    spec_main(run, "npudet_dev.ablation.iteration_child", argv)


if __name__ == "__main__":
    main()
