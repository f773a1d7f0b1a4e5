"""A profiled iteration's split (:mod:`.run`) as markdown: what ran and under
which load, the categories forward / backward with their share of the iteration, the sum
against the profiled total, and the MSDA layers' top ops."""

from __future__ import annotations

from typing import Any, Dict, List

from ..time_split import PHASES
from .split import CATEGORIES, UNATTRIBUTED, transformer_rest

GROUPS = {"msda": "MSDA layers' own work", "rest": "the rest"}
TOP_OPS = 15


def header(result: Dict[str, Any]) -> str:
    """What ran, where, and under which conditions (a loaded run is marked)."""
    m, v, cond = result["machine"], result["versions"], result["conditions"]
    profiled = result["profile"]["iterations"]
    load = "LOADED (" + result["loaded_why"] + ")" if result["loaded"] else "not loaded"
    return (
        f"{result['config']}, impl `{result['impl']}`, input {result['input']}, batch 1, "
        f"{result['threads']} threads: {result['iters']} iterations, the last {profiled} "
        f"profiled (torch.profiler, CPU activity; mean over them). CPU {m['cpu_model']}, ATen "
        f"capability {m['aten_capability']}; torch {v['torch']}, mmdet {v['mmdet']}, mmcv "
        f"{v['mmcv']}; commit {result['commit'][:10]}. Run conditions: load average "
        f"{cond['load_1m'][0]:g} before / {cond['load_1m'][1]:g} after, {cond['wall_s']:.1f} s "
        f"wall / {cond['cpu_s']:.1f} s CPU: {load} ({result['loaded_rule']}). Times are self "
        "times on the training thread under the profiler (its overhead included), from "
        "before_train_iter to after_train_iter (the batch's loading is outside); forward: the "
        "data preprocessor and the model's forward, backward: the autograd nodes (each in the "
        "category of the forward op that made it), other: the optimizer and what ran outside "
        "the model."
    )


def _ms(value: float) -> str:
    return f"{value:.1f}" if value else "-"


def category_table(result: Dict[str, Any]) -> List[str]:
    """The split: one row per category, a subtotal per group, the sum against the total."""
    rows = result["totals"]
    profile = result["profile"]
    lines = [
        "| part | category | forward ms | backward ms | other ms | total ms | share |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]

    def line(part: str, label: str, row: Dict[str, float]) -> str:
        cells = " | ".join(_ms(row[p]) for p in ("forward", "backward", "other"))
        return f"| {part} | {label} | {cells} | {row['total']:.1f} | {100 * row['share']:.1f}% |"

    for group, title in GROUPS.items():
        for c in CATEGORIES:
            if c.group == group:
                lines.append(line(title, c.label, rows[c.key]))
        lines.append(line(f"**{title}**", "**all**", rows[f"group:{group}"]))
    unattributed = profile["unattributed_ms"]
    lines += [
        "",
        f"Sum of the categories {profile['sum_ms']:.1f} ms of the profiled iteration's "
        f"{profile['total_ms']:.1f} ms; not attributed to a part of the model ("
        + ", ".join(next(c.label for c in CATEGORIES if c.key == k) for k in UNATTRIBUTED)
        + f"): {unattributed:.1f} ms ({100 * unattributed / profile['total_ms']:.1f}%); other "
        f"threads' self time in the window: {profile['other_threads_ms']:.1f} ms.",
    ]
    return lines


def top_ops_table(result: Dict[str, Any], group: str) -> List[str]:
    """The ops with the most self time in ``group``'s categories, forward and backward."""
    profile = result["profile"]
    ops = [
        (ms, phase, c.label, name)
        for c in CATEGORIES
        if c.group == group
        for phase, names in profile["top_ops"].get(c.key, {}).items()
        for name, ms in names.items()
    ]
    lines = [
        f"{GROUPS[group]}: the top {TOP_OPS} ops by self time (an autograd node's ops as "
        "`node > op`):",
        "",
        "| phase | category | op | self ms |",
        "|---|---|---|---:|",
    ]
    for ms, phase, label, name in sorted(ops, reverse=True)[:TOP_OPS]:
        lines.append(f"| {phase} | {label} | `{name}` | {ms:.1f} |")
    return lines


def calls_line(result: Dict[str, Any]) -> str:
    """How many MSDA layer and op calls the iteration made, and the projections' linear calls."""
    profile = result["profile"]
    scopes = profile["scopes"]
    linears = sum(
        n
        for c in CATEGORIES
        if c.group == "msda"
        for op, n in profile["calls"].get(c.key, {}).items()
        if op == "aten::linear"
    )
    return (
        f"Per iteration: {scopes.get('msda.layer', 0):g} MSDA layer calls, "
        f"{scopes.get('msda.op', 0):g} op calls, {linears:g} `aten::linear` calls in the MSDA "
        "layers."
    )


def time_split_line(result: Dict[str, Any]) -> str:
    """The benchmark's own time split of the same run, and its "transformer rest" split."""
    split = result["time_split_ms"]
    cells = ", ".join(f"{p} {split[p]:.1f}" for p in PHASES)
    rest = transformer_rest(result["profile"])
    share = rest["msda_layers"] / rest["total"] if rest["total"] else 0.0
    return (
        f"The iteration benchmark's time split of this run (median ms after warm-up): {cells}. "
        f"Its transformer rest in the profile's categories (all but data, backbone + neck, the "
        f"MSDA op, the losses' forward, optimizer and outside any scope): {rest['total']:.1f} "
        f"ms, of which the MSDA layers' own work besides the op {rest['msda_layers']:.1f} ms "
        f"({100 * share:.1f}%), the rest {rest['others']:.1f} ms."
    )


def markdown(result: Dict[str, Any]) -> str:
    """The whole report."""
    parts = [
        header(result),
        "\n".join(category_table(result)),
        calls_line(result),
        *("\n".join(top_ops_table(result, group)) for group in GROUPS),
        time_split_line(result),
    ]
    return "\n\n".join(parts) + "\n"
