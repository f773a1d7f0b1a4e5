"""The GPU kit's report as markdown, and the issue's goals computed from it."""

from __future__ import annotations

from typing import Dict, List, Optional

BASELINE = "grid_sample"
GOAL_CASE = "ddetr-enc-coco"
# Benchmark columns: (header, row key, format); per-call times are wall time between two
# device syncs, device times the GPU's own (profiler), queued = 20 calls between two syncs.
COLUMNS = (
    ("fwd ms", "fwd_ms", ".3f"),
    ("bwd ms", "bwd_ms", ".3f"),
    ("fwd+bwd ms", "fwd_bwd_ms", ".3f"),
    ("queued ms", "queued_ms", ".3f"),
    ("GPU fwd ms", "fwd_device_ms", ".3f"),
    ("GPU bwd ms", "bwd_device_ms", ".3f"),
    ("GPU fwd+bwd ms", "kernel_ms", ".3f"),
    ("x base", "fwd_bwd_x", ".2f"),
    ("GPU x base", "kernel_x", ".2f"),
    ("peak MB", "peak_mem_mb", ".1f"),
    ("grad rel err", "max_rel_grad_err", ".1e"),
)


def _cell(value, fmt: str) -> str:
    return "-" if value is None or isinstance(value, str) else f"{value:{fmt}}"


def _find(rows: List[dict], case: str, dtype: str, impl: str) -> Optional[dict]:
    return next(
        (r for r in rows if (r["case"], r.get("dtype"), r["impl"]) == (case, dtype, impl)), None
    )


def _ratio(slow: Optional[dict], fast: Optional[dict], key: str) -> Optional[float]:
    if not slow or not fast or not slow.get(key) or not fast.get(key):
        return None
    return slow[key] / fast[key]


def goals(report: dict) -> List[Dict[str, object]]:
    """Issue 28's goals: ``triton`` over ``mmcv`` forward+backward at ``GOAL_CASE`` (float32;
    bfloat16 against mmcv's float16, its only half type) and a training iteration with
    ``triton`` over ``grid_sample``; per call and in GPU time, None where not measured."""
    rows, out = report["bench"]["rows"], []
    for name, mmcv_dtype, triton_dtype, target in (
        ("triton vs mmcv fwd+bwd, float32", "float32", "float32", 1.25),
        ("triton bfloat16 vs mmcv float16 fwd+bwd", "float16", "bfloat16", 2.0),
        ("triton vs mmcv fwd+bwd, float16", "float16", "float16", None),
    ):
        mmcv = _find(rows, GOAL_CASE, mmcv_dtype, "mmcv")
        triton = _find(rows, GOAL_CASE, triton_dtype, "triton")
        per_call, device = _ratio(mmcv, triton, "fwd_bwd_ms"), _ratio(mmcv, triton, "kernel_ms")
        out.append(
            {"goal": f"{name} at {GOAL_CASE}", "target": target, "x": per_call, "gpu_x": device}
        )
    train = {r["impl"]: r for r in report["train"] if "ms" in r}
    out.append(
        {
            "goal": "training iteration, triton vs grid_sample",
            "target": 1.3,
            "x": _ratio(train.get(BASELINE), train.get("triton"), "ms"),
            "gpu_x": None,
        }
    )
    for goal in out:
        x, target = goal["x"], goal["target"]
        goal["met"] = None if x is None or target is None else x >= target
    return out


def _bench_lines(rows: List[dict]) -> List[str]:
    head = "| case | dtype | impl | " + " | ".join(h for h, _, _ in COLUMNS) + " |"
    lines = [head, "|---|---|---|" + "---:|" * len(COLUMNS)]
    for r in rows:
        cells = [_cell(r.get(key), fmt) for _, key, fmt in COLUMNS]
        lines.append(
            f"| {r['case']} | {r.get('dtype', '')} | {r['impl']} | " + " | ".join(cells) + " |"
        )
    return lines


def _train_lines(results: List[dict]) -> List[str]:
    base = next((r for r in results if r["impl"] == BASELINE and "ms" in r), None)
    lines = [
        "| impl | iteration ms (median) | min-max | x grid_sample | peak MB | loss first -> last |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if "ms" not in r:
            lines.append(f"| {r['impl']} | - | - | - | - | {r.get('error', '')} |")
            continue
        x = _ratio(base, r, "ms")
        lines.append(
            f"| {r['impl']} | {r['ms']:.1f} | {r['ms_min']:.1f}-{r['ms_max']:.1f} | "
            f"{_cell(x, '.2f')} | {_cell(r.get('peak_mem_mb'), '.0f')} | "
            f"{r['first_loss']:.3f} -> {r['last_loss']:.3f} |"
        )
    return lines


def _compile_lines(results: List[dict]) -> List[str]:
    lines = [
        "| impl | mode | eager ms | compiled ms | x | first call s | error |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        eager, compiled = r.get("eager") or {}, r.get("compiled") or {}
        lines.append(
            f"| {r['impl']} | {r.get('mode') or r.get('backend') or '-'} | "
            f"{_cell(eager.get('ms'), '.2f')} | {_cell(compiled.get('ms'), '.2f')} | "
            f"{_cell(r.get('speedup'), '.2f')} | {_cell(r.get('compile_s'), '.0f')} | "
            f"{r.get('error', '')} |"
        )
    return lines


def _host_lines(rows: List[dict]) -> List[str]:
    """Every numeric column the host-cost rows carry, in their order."""
    keys = [k for k, v in rows[0].items() if isinstance(v, (int, float)) and k != "runs"]
    lines = ["| impl | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for r in rows:
        cells = [_cell(r.get(k), ".2f") for k in keys]
        lines.append(f"| {r.get('impl', '')} | " + " | ".join(cells) + " |")
    return lines


def markdown(report: dict) -> str:
    """The report as markdown: parts, benchmark, training, compile, device check, goals."""
    env = report.get("environment", {})
    packages = env.get("packages", {})
    lines = [
        f"# GPU kit: {report['gpu']}{' (dry run)' if report['dry_run'] else ''}",
        "",
        f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
        f"triton {packages.get('triton')}, Python {env.get('python')}; "
        f"{report.get('seconds', 0):.0f} s of a {report['budget_s']:.0f} s budget.",
        "",
        "Parts: "
        + "; ".join(
            f"{name} {p['status']} ({p['seconds']:.0f} s)" for name, p in report["parts"].items()
        ),
        "",
    ]
    build = report.get("mmcv_build") or {}
    if build:
        state = build.get("error") or f"built for {build.get('arch')} in {build.get('seconds')} s"
        lines += [f"mmcv's CUDA kernel (library built from mmcv 2.1.0's sdist): {state}", ""]
    bench = report["bench"]
    lines += ["## MSDA benchmark", ""]
    lines += [
        "Per call: one call between two device syncs; queued: 20 calls between two syncs, "
        "per call; GPU: the device's own time (profiler). x base: speed-up over "
        f"{BASELINE} in the same dtype.",
        "",
    ]
    lines += _bench_lines(bench["rows"]) if bench["rows"] else ["(not run)"]
    lines += [f"- {spec}: {error}" for spec, error in bench["errors"].items()]
    lines += ["", "## Training iteration (Deformable-DETR-sized, plain torch)", ""]
    lines += _train_lines(report["train"]) if report["train"] else ["(not run)"]
    lines += ["", "## torch.compile of one encoder layer (fwd+bwd)", ""]
    lines += _compile_lines(report["compile"]) if report["compile"] else ["(not run)"]
    lines += ["", "## Host cost per call (tools/analysis_tools/benchmark_msda.py --host)", ""]
    lines += _host_lines(report["host_cost"]) if report.get("host_cost") else ["(not run)"]
    lines += ["", "## Device check (tools/misc/check_device.py)", ""]
    check = report.get("check")
    if check and check.get("summary"):
        summary = check["summary"]
        lines += ["| impl | dtype | correct | error |", "|---|---|---|---|"]
        for r in summary["table"]:
            correct = "yes" if r["correct"] else "NO"
            lines.append(f"| {r['impl']} | {r['dtype']} | {correct} | {r['error'][:120]} |")
        lines += [
            "",
            f"recommended auto order: {', '.join(summary['recommended_auto_order']) or '-'}",
        ]
    else:
        lines += ["(not run)"]
    lines += ["", "## Device tests (NPUDET_TEST_DEVICE)", ""]
    tests = report.get("device_tests")
    if tests:
        lines.append(
            f"{tests['passed']} passed, {tests['skipped']} skipped, {len(tests['failed'])} failed"
        )
        lines += [f"- FAILED {failure}" for failure in tests["failed"]]
    else:
        lines += ["(not run)"]
    lines += ["", "## Goals (issue 28)", ""]
    for g in goals(report):
        target = f">= {g['target']}x" if g["target"] else "no target"
        met = {True: "met", False: "NOT met", None: "not measured"}[g["met"]] if g["target"] else ""
        lines.append(
            f"- {g['goal']}: per call {_cell(g['x'], '.2f')}x, GPU {_cell(g['gpu_x'], '.2f')}x "
            f"({target}{', ' + met if met else ''})"
        )
    return "\n".join(lines) + "\n"
