"""The device check (``tools/misc/check_device.py`` is its command line): which MSDA
implementations are correct and fast on this machine's device.

Parity of every implementation available on the device through the parity engine
(``verification.parity.check_parity``: every dtype it declares, each case passed, failed or
declined), the benchmark side by side (``harness.run_case``), the Triton kernels' compile
figures (``dev/tools/compile_kernels.py``, in a child process), a summary table with the
recommended ``auto`` order, and the records ``auto`` reads (``verification.records``, ``--save``).
With ``isolate`` each implementation's parity, and the benchmark, run in a child process
of the tool (``--child``), so a kernel that crashes the process or poisons the device
context is reported as failed with its error and the check goes on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from npudet.ops.msda.kernels import CUDA_TARGETS
from npudet.ops.msda.registry import get_impl, msda_impls, msda_variants, registered_impls
from npudet.ops.msda.verification import records
from npudet.ops.msda.verification.parity import REFERENCE, case_summary, check_parity
from npudet.ops.msda.verification.records import dtype_name
from npudet.utils.device import SIMULATED_NPU_NOTE, device_name, simulated_npu
from npudet.utils.environment import environment_report, report_lines

from . import harness

BASELINE = REFERENCE
# The models whose MSDA calls each benchmark case stands for (``cases``): a check covers every
# model npudet switches. Grounding DINO's image encoder and decoder have DINO's shapes.
CASE_MODELS = {
    "ddetr-enc": ("Deformable DETR", "DINO", "DDQ-DETR", "Grounding DINO"),
    "ddetr-dec": ("Deformable DETR",),
    "dino-dec": ("DINO", "Grounding DINO"),
    "ddq-dec": ("DDQ-DETR",),
    "m2f-enc": ("Mask2Former",),
    "bev-sca": ("BEVFormer",),
    "bev-tsa": ("BEVFormer",),
}
# Benchmark plans: (cases, timed rounds). The first case is the one recorded for ``auto``.
FULL_CASES = list(CASE_MODELS)
FAST_CASES = ["ddetr-dec"]
CHILD_TIMEOUT_S = 480  # a child: one implementation's parity, or the benchmark
# The compile tool of a checkout (the project's own, never shipped): absent in an installed npudet.
COMPILE_TOOL = Path(__file__).resolve().parents[2] / "dev" / "tools" / "compile_kernels.py"


def plan_impls(device: str, only: Optional[List[str]]) -> Dict[str, object]:
    """Implementations to check on ``device``, and why the other registered ones are not."""
    usable, variants = msda_impls(), msda_variants()
    checked, skipped = [], {}
    for name in registered_impls():
        impl = get_impl(name)
        if only is not None and name not in only:
            continue
        if name in variants and only is None:
            skipped[name] = ["experiment variant (name it in --impls to check it)"]
        elif name not in usable and name not in variants:
            skipped[name] = list(impl.unavailable_reasons()) or ["not usable here"]
        elif device not in impl.DEVICES:
            skipped[name] = [f"runs on {list(impl.DEVICES)}, not {device}"]
        else:
            checked.append(name)
    return {"checked": checked, "skipped": skipped}


def parity(device: str, impls: List[str]) -> List[dict]:
    """``verification.parity.check_parity`` of every dtype each implementation declares, in
    process."""
    results = []
    for name in impls:
        for dtype in get_impl(name).DTYPES:
            result = check_parity(name, device, dtype)
            results.append(result.to_json())
            summary = case_summary(result.to_json())
            if result.correct:
                state = f"ok: {summary}"
            elif result.declined:
                state = f"declined: {'; '.join(result.declined)}"
            else:
                state = f"FAILED ({summary}): {result.error}"
            print(
                f"[check] {name} {dtype_name(dtype)} on {device} ({result.seconds:.1f} s): {state}",
                file=sys.stderr,
                flush=True,
            )
    return results


def benchmark(device: str, impls: List[str], cases: List[str], repeat: int) -> dict:
    """``npudet.benchmark.harness.run_case`` for each case (float32), errors kept per case."""
    rows, errors = [], {}
    for spec in cases:
        try:
            rows.extend(harness.run_case(spec, impls, repeat, device))
        except Exception as exc:  # one case's failure must not lose the others
            errors[spec] = f"{type(exc).__name__}: {exc}"[:500]
    return {"cases": cases, "repeat": repeat, "rows": rows, "errors": errors}


def child(tool: Path, args: argparse.Namespace, part: str, impls: List[str]) -> dict:
    """Run ``part`` ("parity" or "bench") for ``impls`` in a child process of ``tool`` (the
    command line, with ``--child``); its JSON, or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "part.json"
        cmd = [sys.executable, str(tool), "--device", args.device]
        cmd += ["--child", part, "--impls", ",".join(impls), "--json", str(out)]
        cmd += ["--repeat", str(args.repeat), "--cases", ",".join(args.cases)]
        cmd += ["--fast"] if args.fast else []
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"error": f"child process timed out after {CHILD_TIMEOUT_S} s"}
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0 or not out.exists():
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            return {"error": f"child process exited with {proc.returncode}: {tail}"[:800]}
        return json.loads(out.read_text())


def run_parity(tool: Path, args: argparse.Namespace, impls: List[str]) -> List[dict]:
    """``parity`` here, or per implementation in a child process (``args.isolate``)."""
    if not args.isolate:
        return parity(args.device, impls)
    results = []
    for name in impls:
        part = child(tool, args, "parity", [name])
        if "error" in part:
            for dtype in get_impl(name).DTYPES:
                dname = dtype_name(dtype)
                results.append(
                    {
                        "impl": name,
                        "dtype": dname,
                        "correct": False,
                        "error": part["error"],
                        "declined": [],
                        "cases": [],
                        "counts": {},
                    }
                )
        else:
            results.extend(part["parity"])
    return results


def run_benchmark(tool: Path, args: argparse.Namespace, impls: List[str]) -> dict:
    """``benchmark`` here, or in a child process (``args.isolate``)."""
    if not args.isolate:
        return benchmark(args.device, impls, args.cases, args.repeat)
    part = child(tool, args, "bench", impls)
    if "error" in part:
        return {
            "cases": args.cases,
            "repeat": args.repeat,
            "rows": [],
            "errors": {"all": part["error"]},
        }
    return part["benchmark"]


def compile_targets(device: str) -> Optional[List[str]]:
    """``--targets`` for the compile tool: the GPU's own sm where the tool knows it."""
    if device == "npu":
        return ["ascend"]
    if device != "cuda":
        return None  # the tool's default set
    major, minor = torch.cuda.get_device_capability(0)
    own = f"cuda:{major * 10 + minor}"
    return [own] if own in CUDA_TARGETS else sorted(CUDA_TARGETS)


def compile_figures(device: str, script: Path) -> dict:
    """``dev/tools/compile_kernels.py``'s (``script``) table and JSON, for the device's own target.

    Run as a child process: a compiler crash is reported, never the end of the check.
    """
    if not script.exists():
        note = "dev/tools/compile_kernels.py absent (a checkout's, not installed with npudet)"
        return {"available": False, "note": note, "result": None}
    targets = compile_targets(device)
    flags = ["--targets", ",".join(targets)] if targets else []
    cmd = [sys.executable, str(script), *flags]
    note = " ".join(["python dev/tools/compile_kernels.py", *flags])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "compile.json"
        try:
            proc = subprocess.run(
                [*cmd, "--json", str(out)], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return {"available": True, "note": f"{note}: timed out", "result": None}
        if not out.exists():  # exit 1 with a JSON means some kernel failed: in the rows
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            note = f"{note}: exited with {proc.returncode}: {tail}"[:800]
            return {"available": True, "note": note, "result": None}
        result = json.loads(out.read_text())
    return {"available": True, "note": note, "result": result, "table": proc.stdout}


def summarize(parity_rows: List[dict], bench: dict) -> Dict[str, object]:
    """The summary: impl x dtype table (correct?, fwd+bwd ms, speed-up) and the recommended
    auto order."""
    primary = bench["cases"][0] if bench["cases"] else None
    times = {r["impl"]: r["fwd_bwd_ms"] for r in bench["rows"] if r["case"] == primary}
    base = times.get(BASELINE)
    table = []
    for row in parity_rows:
        if row.get("declined"):
            continue
        ms = times.get(row["impl"]) if row["dtype"] == "float32" else None
        table.append(
            {
                "impl": row["impl"],
                "dtype": row["dtype"],
                "correct": row["correct"],
                "cases": case_summary(row),
                "error": row["error"],
                "case": primary if ms is not None else "",
                "fwd_bwd_ms": ms,
                "speedup": base / ms if ms and base else None,
                "key": row.get("key"),
            }
        )
    correct32 = {r["impl"] for r in table if r["dtype"] == "float32" and r["correct"]}
    order = sorted((n for n in times if n in correct32), key=times.__getitem__)
    return {"case": primary, "table": table, "recommended_auto_order": order}


def summary_lines(summary: dict) -> List[str]:
    """The summary table: correct only where every case run passed; declined cases counted
    apart (they were not run)."""
    lines = [
        f"| impl | dtype | correct | cases | fwd+bwd ms ({summary['case']}) | x {BASELINE} "
        "| error |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for r in summary["table"]:
        ms = f"{r['fwd_bwd_ms']:.2f}" if r["fwd_bwd_ms"] is not None else "-"
        speed = f"{r['speedup']:.1f}" if r["speedup"] is not None else "-"
        correct = "yes" if r["correct"] else "NO"
        lines.append(
            f"| {r['impl']} | {r['dtype']} | {correct} | {r['cases']} | {ms} | {speed} "
            f"| {r['error'][:120]} |"
        )
    lines.append(f"recommended auto order: {', '.join(summary['recommended_auto_order']) or '-'}")
    return lines


def save(device: str, summary: dict) -> str:
    """Record every checked (impl, dtype) of ``summary`` (correct or not, with its time) for
    ``auto``, keyed by the fingerprint of the process that checked it (this one's where none
    came back)."""
    rows = [
        records.Record(
            impl=r["impl"],
            dtype=r["dtype"],
            correct=r["correct"],
            error=r["error"],
            fwd_bwd_ms=r["fwd_bwd_ms"],
            case=r["case"],
            key=r.get("key"),
        )
        for r in summary["table"]
    ]
    device_type, _, index = device.partition(":")
    # The device's model and capability (verification.device_identity), as ``auto`` looks it up.
    where = records.current_device_name(device_type, int(index) if index else None)
    return records.save_records(device_type, where or device_name(device_type), rows)


def run(tool: Path, args: argparse.Namespace) -> int:
    """The check ``tool`` (``tools/misc/check_device.py``) asked for with ``args`` (its parsed
    options): the whole check, or one child part (``args.child``)."""
    if args.child:
        if args.child == "parity":
            payload = {"parity": parity(args.device, args.impls)}
        else:
            payload = {"benchmark": benchmark(args.device, args.impls, args.cases, args.repeat)}
        args.json.write_text(json.dumps(payload))
        return 0
    start = time.perf_counter()
    env = environment_report(args.device)
    print("\n".join(report_lines(env)))
    simulated = args.device.startswith("npu") and simulated_npu()
    if simulated:
        print(SIMULATED_NPU_NOTE)
    plan = plan_impls(args.device, args.impls)
    for name, reasons in plan["skipped"].items():
        print(f"not checked: {name}: {'; '.join(reasons)}")
    phases = {}
    parity_rows = run_parity(tool, args, plan["checked"])
    phases["parity"] = round(time.perf_counter() - start, 1)
    correct32 = [r["impl"] for r in parity_rows if r["dtype"] == "float32" and r["correct"]]
    bench_impls = [n for n in plan["checked"] if n in correct32 or n == BASELINE]
    bench = run_benchmark(tool, args, bench_impls)
    phases["benchmark"] = round(max(0.0, time.perf_counter() - start - sum(phases.values())), 1)
    if bench["rows"]:
        print(harness.markdown(bench["rows"]))
        covered = [f"{c} ({', '.join(CASE_MODELS[c])})" for c in args.cases if c in CASE_MODELS]
        print(f"cases of the models: {'; '.join(covered) or '-'}")
    for spec, error in bench["errors"].items():
        print(f"benchmark {spec} failed: {error}")
    if args.no_compile or args.fast:
        why = "--fast" if args.fast else "--no-compile"
        compiled = {"available": None, "note": f"skipped ({why})", "result": None}
    else:
        compiled = compile_figures(args.device, COMPILE_TOOL)
    phases["compile"] = round(max(0.0, time.perf_counter() - start - sum(phases.values())), 1)
    # The compile tool prints its full table, a blank line, then the per-kernel summary.
    kernels = (compiled.get("table") or "").split("\n\n", 1)[-1].strip()
    print(
        f"compile figures ({compiled['note']}):\n{kernels}"
        if kernels
        else f"compile figures: {compiled['note']}"
    )
    summary = summarize(parity_rows, bench)
    print("\n".join(summary_lines(summary)))
    saved = save(args.device, summary) if args.save and summary["table"] else None
    if saved:
        print(f"saved verification for impl='auto' to {saved}")
    elif args.save:
        print("--save: no implementation was checked on this device; nothing saved")
    report = {
        "tool": "check_device",
        "version": 2,
        "device": args.device,
        "simulated": simulated,
        "fast": args.fast,
        "seconds": round(time.perf_counter() - start, 1),
        "phase_seconds": phases,
        "environment": env,
        "skipped": plan["skipped"],
        "parity": parity_rows,
        "benchmark": bench,
        "case_models": {c: list(CASE_MODELS[c]) for c in args.cases if c in CASE_MODELS},
        "compile": compiled,
        "summary": summary,
        "saved": saved,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    print(f"done in {report['seconds']} s", file=sys.stderr)
    return 0
