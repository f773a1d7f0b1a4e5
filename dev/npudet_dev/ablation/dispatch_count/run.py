"""Count a config's training iteration on the simulated NPU, stock and npudet side by side.

The runs are runs of the iteration benchmark (:func:`..iteration_bench.bench_iteration`: the
same generated batch, initial weights built from the seed with no pretrained download, the
same random state, each in its own process), made by :mod:`.child` with
``NPUDET_SIMULATED_NPU=1`` so that the runner trains on the ``npu`` device; the iterations
after ``warmup`` are counted. Counts, never times: the simulation runs every op on the host.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Dict, Iterator, List, Sequence

from npudet.ablation.ablate import run_variant

from ..iteration_bench import bench_iteration
from ..iteration_report import write_json_and_table
from .counter import SOURCES
from .report import markdown

CHILD = "npudet_dev.ablation.dispatch_count.child"
SIMULATED_NPU = "NPUDET_SIMULATED_NPU"


@contextlib.contextmanager
def simulated_npu_children() -> Iterator[None]:
    """Child processes started within see the simulated NPU (the variable, as a user sets it)."""
    before = os.environ.get(SIMULATED_NPU)
    os.environ[SIMULATED_NPU] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[SIMULATED_NPU]
        else:
            os.environ[SIMULATED_NPU] = before


def per_iteration(counts: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The mean of the counted iterations' totals and split (``ops``, ``views``, ``syncs``,
    ``backward_ops``, ``host_to_device``, ``by_source``, ``sync_kinds``); the last
    iteration's sites (``top_op_sites``, ``sync_sites``)."""
    n = len(counts)
    keys = ("ops", "views", "syncs", "backward_ops", "host_to_device")
    mean: Dict[str, Any] = {k: sum(c[k] for c in counts) / n for k in keys}
    mean["by_source"] = {
        s: {k: sum(c["by_source"][s][k] for c in counts) / n for k in ("ops", "views", "syncs")}
        for s in SOURCES
    }
    kinds = sorted({k for c in counts for k in c["sync_kinds"]})
    mean["sync_kinds"] = {k: sum(c["sync_kinds"].get(k, 0) for c in counts) / n for k in kinds}
    mean["top_op_sites"] = counts[-1]["top_op_sites"]
    mean["sync_sites"] = counts[-1]["sync_sites"]
    return mean


def count_dispatch(
    config: str,
    impls: List[str],
    warmup: int,
    command: str = "",
    run_variant_fn: Callable[..., Dict[str, Any]] = run_variant,
    **options: Any,
) -> Dict[str, Any]:
    """Train ``config`` as each of ``impls`` (``stock``: mmdet + mmcv; else an npudet MSDA
    implementation, ``auto`` being npudet's default path) on the simulated NPU and count the
    iterations after ``warmup``; ``options``: :func:`..iteration_bench.bench_iteration`'s
    (``iters``, ``work_dir``, ``size``, ``seed``, ``threads``). Returns the result (module
    docstring). ``command``: the command that regenerates it, stored. ``run_variant_fn``: what
    runs a child (tests run it in process)."""

    def run_child(spec: Dict[str, Any], run_threads: int, module: str = CHILD) -> Dict[str, Any]:
        return run_variant_fn({**spec, "count_warmup": warmup}, run_threads, module=CHILD)

    with simulated_npu_children():
        bench = bench_iteration(config, impls, warmup=warmup, run_variant_fn=run_child, **options)
    runs = {}
    for impl, run in bench["runs"].items():
        if not run.get("dispatch"):
            raise ValueError(f"{impl}: no counted iteration (--warmup {warmup})")
        runs[impl] = {
            "per_iteration": per_iteration(run["dispatch"]),
            "iterations": run["dispatch"],
            "loss": run["loss"],
            "device": run["device"],
            "msda_layer_classes": run["msda_layer_classes"],
            "msda_impls": run["msda_impls"],
        }
    reference = "stock" if "stock" in runs else impls[0]
    ref_ops = runs[reference]["per_iteration"]["ops"]
    for run in runs.values():
        run["ops_vs_reference"] = run["per_iteration"]["ops"] / ref_ops
    keep = ("config", "input", "batch_size", "iters", "warmup", "seed", "versions", "commit")
    return {**{k: bench[k] for k in keep}, "command": command, "reference": reference, "runs": runs}


def write_outputs(result: Dict[str, Any], json_path: str) -> str:
    """Write ``result`` to ``json_path`` and its table to the ``.md`` beside; returns the table."""
    return write_json_and_table(result, json_path, markdown(result))
