"""Profile real-size training iterations by op (``dev/tools/profile_iteration.py``).

The run is one run of the iteration benchmark (:func:`..iteration_bench.bench_iteration`: the
same generated batch at the given size, initial weights built from the seed with no
pretrained download, the same random state, a child process on ``threads`` threads, its
conditions recorded), made by :mod:`.child`: the iterations after ``warmup`` are
profiled and split by :mod:`.split`. The result (:func:`profile_iteration`) holds the
mean split over the profiled iterations, each iteration's split, the benchmark's own time
split of the same run (whose times include the profiler's overhead), the losses and where
and under which load it ran.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from npudet.ablation.ablate import run_variant
from npudet.benchmark.conditions import RULE

from ..iteration_bench import bench_iteration
from ..iteration_report import write_json_and_table
from .report import markdown
from .split import mean_split, totals, transformer_rest

CHILD = "npudet_dev.ablation.op_profile.child"


def profile_iteration(
    config: str,
    impl: str,
    iters: int,
    warmup: int,
    work_dir: str,
    size: Optional[Tuple[int, int]] = None,
    seed: int = 0,
    threads: int = 2,
    run_variant_fn: Callable[..., Dict[str, Any]] = run_variant,
) -> Dict[str, Any]:
    """Train ``config`` with MSDA implementation ``impl`` for ``iters`` iterations, profile
    those after ``warmup``, and return the result (see the module docstring).
    ``run_variant_fn``: what runs the child (``run_variant``'s signature; tests run it in
    process)."""
    if impl == "stock":
        raise ValueError("--impl stock: the profile splits npudet's MSDA layers; name an impl")

    def run_child(spec: Dict[str, Any], run_threads: int, module: str = CHILD) -> Dict[str, Any]:
        return run_variant_fn({**spec, "profile_warmup": warmup}, run_threads, module=CHILD)

    bench = bench_iteration(
        config, [impl], iters, warmup, work_dir, size, seed, threads, run_variant_fn=run_child
    )
    run = bench["runs"][impl]
    summary = bench["summary"][impl]
    split = mean_split(run["op_profile"])
    return {
        **{k: bench[k] for k in ("config", "input", "iters", "warmup", "seed", "machine")},
        **{k: bench[k] for k in ("versions", "commit")},
        "impl": impl,
        "threads": threads,
        "loaded_rule": RULE,
        "loaded": summary["run_loaded"],
        "loaded_why": summary["loaded_why"],
        "conditions": run["conditions"],
        "loss": run["loss"],
        "iter_ms": run["iter_ms"],
        "iter_cpu_ms": run["iter_cpu_ms"],
        "time_split_ms": summary["phases_ms"],
        "msda_calls": run["msda_calls"],
        "peak_rss_mb": run["peak_rss_mb"],
        "profile": split,
        "totals": totals(split),
        "transformer_rest_ms": transformer_rest(split),
        "profile_iterations": run["op_profile"],
    }


def write_outputs(result: Dict[str, Any], json_path: str) -> str:
    """Write ``result`` to ``json_path`` and its table to the ``.md`` beside; returns the table."""
    return write_json_and_table(result, json_path, markdown(result))
