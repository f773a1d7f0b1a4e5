"""The markdown table of :func:`.run.count_dispatch`'s result."""

from __future__ import annotations

from typing import Any, Dict, List

from .counter import SOURCES

SOURCE_NAMES = {
    "layers": "npudet's layers + op (stock: mmcv's MSDA)",
    "backbone_neck": "backbone + neck",
    "transformer_heads": "transformer + heads",
    "matcher": "assigner / matcher",
    "losses": "losses",
    "loop": "mmengine loop",
    "optimizer": "optim wrapper",
    "autograd": "autograd engine",
    "other": "other",
}


def _n(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def markdown(result: Dict[str, Any]) -> str:
    """Header, the table (``impl``, ``ops per iteration``, ``host syncs per iteration``, then
    ops / syncs per source), sync kinds and the sync sites of each run."""
    runs = result["runs"]
    ref = result["reference"]
    counted = result["iters"] - result["warmup"]
    device = next(iter(runs.values()))["device"]
    lines: List[str] = [
        f"# Ops and host syncs per training iteration on the simulated NPU: `{result['config']}`",
        "",
        "**Counts on the simulated `npu` device (ops/npu_sim), never times.** "
        f"Device: {device}. Input {result['input']} (reduced from the config's size: the "
        "counts barely depend on it, the simulation's run time does), batch "
        f"{result['batch_size']}, seed {result['seed']}; the mean of {counted} counted "
        f"iteration(s) after {result['warmup']} warm-up; torch "
        f"{result['versions']['torch']}, mmdet {result['versions']['mmdet']}, mmcv "
        f"{result['versions']['mmcv']}; commit {result['commit'][:10]}.",
        "",
        f"Regenerate: `{result['command']}`",
        "",
        "An iteration is the train loop's `run_iter`: the batch's copy to the device, "
        "forward, losses with Hungarian matching, backward and the optimizer step through "
        "mmengine's OptimWrapper, and the loop's hooks. *Ops*: every op below autograd "
        "with an `npu` tensor among its inputs or outputs (views, which launch nothing, in "
        "parentheses); DrivingSDK's binding counts as one op. *Host syncs*: reads of a "
        "device value (`item`: `_local_scalar_dense`, `equal`), copies to the host "
        "(`copy_to_host`: `.cpu()`, `.tolist()`, `.numpy()`), and ops whose output size "
        "depends on the data (`data_dependent_shape`: `nonzero`, `masked_select`, `unique`, "
        "`bincount`, `repeat_interleave`; `bool_index`: indexing with a boolean mask). "
        "Each is attributed to the innermost frame of interest on the Python stack at "
        "dispatch time; backward ops to the forward op whose node runs them "
        "(npudet_dev.ablation.dispatch_count.counter). The benchmark's own hooks (its loss "
        "recorder's reads) are left out.",
        "",
    ]
    split = [f"{SOURCE_NAMES[s]}: ops / syncs" for s in SOURCES]
    lines += [
        "| " + " | ".join(["impl", "ops per iteration", "host syncs per iteration", *split]) + " |",
        "|" + "---|" * (3 + len(SOURCES)),
    ]
    for impl, run in runs.items():
        p = run["per_iteration"]
        ops = f"{_n(p['ops'])} ({_n(p['views'])} views), {run['ops_vs_reference']:.2f}x {ref}"
        cells = [f"`{impl}`", ops, _n(p["syncs"])]
        for s in SOURCES:
            b = p["by_source"][s]
            cells.append(f"{_n(b['ops'])} / {_n(b['syncs'])}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Total loss per iteration (warm-up included; the same model, batch and seed):",
        "",
    ]
    for impl, run in runs.items():
        lines.append(f"- `{impl}`: " + " ".join(f"{loss:.6f}" for loss in run["loss"]))
    lines += ["", "Host syncs by kind, per iteration:", ""]
    for impl, run in runs.items():
        kinds = ", ".join(f"{k} {_n(v)}" for k, v in run["per_iteration"]["sync_kinds"].items())
        lines.append(f"- `{impl}`: {kinds or 'none'}")
    for impl, run in runs.items():
        lines += ["", f"Host syncs of `{impl}` by site (last counted iteration):", ""]
        lines += ["| source | site | kind | op | count |", "|---|---|---|---|---|"]
        for source, site, kind, op, count in run["per_iteration"]["sync_sites"]:
            lines.append(f"| {source} | `{site}` | {kind} | `{op}` | {count} |")
    for impl, run in runs.items():
        lines += ["", f"Sites that dispatch the most ops, `{impl}` (last counted iteration):", ""]
        lines += ["| source | site | ops |", "|---|---|---|"]
        for source, site, count in run["per_iteration"]["top_op_sites"]:
            lines.append(f"| {source} | `{site}` | {count} |")
    return "\n".join(lines) + "\n"
