"""The deploy speed benchmark's result (:mod:`.bench`) as markdown: a header and one table per
model, and the JSON and markdown files."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from npudet.benchmark.conditions import RULE, ratio_cell, record_reasons
from npudet.utils.json_io import write_json_atomic

from .bench import BASELINE, FUSED, REFERENCE


def header(result: Dict[str, Any]) -> str:
    """One paragraph: where it ran and how the numbers are taken."""
    m, t, v = result["machine"], result["threads"], result["versions"]
    return (
        f"Per-image latency, batch {result['batch']}: median of {result['runs']} runs after "
        f"{result['warmup']} warm-up. CPU: {m['cpu_model']} ({', '.join(m['cpu_features'])}), "
        f"ATen capability {m['aten_capability']}, cpu kernel variant "
        f"{m['cpu_kernel_variant']}; torch threads {t['torch']}, ONNX Runtime intra-op threads "
        f"{t['ort_intra_op']} (inter-op {t['ort_inter_op']}); torch {v['torch']}, onnxruntime "
        f"{v['onnxruntime']}; commit {result['commit'][:10]}. Speed-ups are `{BASELINE}`'s "
        f"and `{REFERENCE}`'s median over the route's; outputs are compared with "
        f"`{REFERENCE}`'s (scores, and boxes normalised by the image's larger side, within "
        f"{result['tolerance']:g}; labels equal where scores are untied). The AOTI package "
        f"is timed through `torch._inductor.aoti_load_package` in the benchmark's process "
        f"(the C++ runner reports no time). `load avg` is the machine's 1-minute load average "
        f"before and after the timed runs (torch threads: {t['torch']}, cores: "
        f"{result['cpu_count']}); {RULE} (npudet.benchmark.conditions): a loaded "
        f"speed-up is shown in parentheses with its CPU-time speed-up where it was recorded."
        + (
            ""
            if "loaded_rule" in result
            else " Stored before the routes were interleaved and their CPU time recorded: each "
            "route was timed on its own, under its own load."
        )
    )


def route_reasons(r: Dict[str, Any], threads: int) -> List[str]:
    """Why a route's times were loaded: as recorded, or for a result stored before, the load
    rule on its ``load_avg_1m``."""
    if "loaded" in r:
        return [r["loaded_why"]] if r["loaded"] else []
    return record_reasons({"load_1m": r["load_avg_1m"], "threads": threads})


def _ratio(r: Dict[str, Any], base: str, loaded: bool) -> str:
    """The speed-up of route ``r`` over ``base`` (wall; a loaded one with its CPU-time one)."""
    value = r["speedup"][f"vs_{base}"]
    if value is None:
        return "—"
    return ratio_cell(value, r.get("cpu_time_speedup", {}).get(f"vs_{base}"), loaded)


def _export(r: Dict[str, Any]) -> str:
    """Seconds the route's export took ("?" when a reused file did not record it)."""
    if "export_s" not in r:
        return ""  # an eager route
    seconds = "?" if r["export_s"] is None else f"{r['export_s']:.0f}"
    return seconds + (" (reused)" if r.get("reused") else "")


def _agreement(a: Dict[str, Any]) -> str:
    if "why" in a:
        return f"**no** ({a['why']})"
    agrees = "yes" if a["agrees"] else "**no**"
    return (
        f"{agrees} (scores {a['max_score_diff']:.1e}, boxes "
        f"{a['max_box_diff_normalised']:.1e}, labels {'equal' if a['labels_equal'] else 'differ'})"
    )


def model_table(name: str, model: Dict[str, Any], routes: Dict[str, str], threads: int = 1) -> str:
    """The rows of one model: median and runs (ms), speed-ups (``loaded`` when either route's
    times were, with the CPU-time speed-up), export time, load, agreement."""
    _, _, height, width = model["input"]
    lines = [
        f"**{name}**: `{model['config']}` at {height}x{width}, {model['weights']}.",
        "",
        f"| route | what | median ms | runs ms | vs `{BASELINE}` | vs `{REFERENCE}` "
        "| export s | load avg | agrees with eager |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    timed = {route: r for route, r in model["routes"].items() if "error" not in r}
    why = {route: route_reasons(r, threads) for route, r in timed.items()}
    for route, r in model["routes"].items():
        if "error" in r:
            cells: List[str] = [f"`{route}`", routes[route], f"not run: {r['error']}"] + [""] * 6
        else:
            loaded = {b: bool(why[route] or why.get(b)) for b in (BASELINE, REFERENCE)}
            cells = [
                f"`{route}`",
                routes[route],
                f"{r['median_ms']:.1f}",
                " ".join(f"{t:.0f}" for t in r["runs_ms"]),
                _ratio(r, BASELINE, loaded[BASELINE]),
                _ratio(r, REFERENCE, loaded[REFERENCE]),
                _export(r),
                "-".join(f"{v:.1f}" for v in r["load_avg_1m"]),
                _agreement(r["agreement"]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def op_lines(model: Dict[str, Any], top: int = 6) -> str:
    """Per ORT route, its profiled run's time by op type: the ``top`` largest, the rest summed."""
    lines = []
    for route, r in model["routes"].items():
        ops = r.get("ort_op_ms")
        if not ops:
            continue
        items = list(ops.items())
        parts = [f"{name} {ms:.0f}" for name, ms in items[:top]]
        rest = sum(ms for _, ms in items[top:])
        total = sum(ops.values())
        lines.append(
            f"- `{route}`, ORT's profiler, ms by op type (one run, sum {total:.0f}): "
            + ", ".join(parts + ([f"other {rest:.0f}"] if rest else []))
        )
    return "\n".join(lines)


def goal_line(name: str, model: Dict[str, Any], threads: int = 1) -> str:
    """Whether each fused route is at least 2x faster than ``BASELINE`` (issue 34's goal);
    a loaded ratio is not judged."""
    parts = []
    base = model["routes"].get(BASELINE, {})
    for route in FUSED:
        r = model["routes"].get(route, {})
        ratio = r.get("speedup", {}).get(f"vs_{BASELINE}")
        if ratio is None:
            continue
        if route_reasons(r, threads) or ("error" not in base and route_reasons(base, threads)):
            parts.append(f"`{route}` ({ratio:.2f}x) not judged: loaded")
        else:
            parts.append(f"`{route}` {ratio:.2f}x ({'met' if ratio >= 2 else 'not met'})")
    return f"Goal (fused routes >= 2x `{BASELINE}`) on {name}: " + (", ".join(parts) or "not timed")


def markdown(result: Dict[str, Any]) -> str:
    """Header, then per model its table and the goal line."""
    parts = [header(result)]
    threads = result["threads"]["torch"]
    for name, model in result["models"].items():
        parts += [model_table(name, model, result["routes"], threads).rstrip()]
        parts += [p for p in (op_lines(model), goal_line(name, model, threads)) if p]
    return "\n\n".join(parts) + "\n"


def read_result(json_path: str) -> Dict[str, Any]:
    """A result JSON written by :func:`write_outputs`; ValueError naming ``--json`` when the
    file is missing or is not one."""
    try:
        with open(json_path) as f:
            result = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--json: cannot read a result from {json_path}: {err}") from err
    if not isinstance(result, dict) or "models" not in result:
        raise ValueError(f"--json: {json_path} is not a dev/tools/bench_deploy.py result")
    return result


def write_outputs(result: Dict[str, Any], json_path: str) -> None:
    """``json_path`` and, next to it, ``<stem>.md``."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    write_json_atomic(json_path, result)
    with open(os.path.splitext(json_path)[0] + ".md", "w") as f:
        f.write(markdown(result))
