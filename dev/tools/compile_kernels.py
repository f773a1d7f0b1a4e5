"""Compile every Triton MSDA kernel with the real toolchains, no accelerator needed.

    python dev/tools/compile_kernels.py --json results/kernel_compile.json
    python dev/tools/compile_kernels.py --targets cuda:80 --dtypes float32 --cases ddetr-enc
    python dev/tools/compile_kernels.py --table-of results/kernel_compile.json   # the docs' table
    python dev/tools/compile_kernels.py --change-of results/kernel_compile_ascend_before.json \
        results/kernel_compile.json       # % fewer Ascend scalar loads and sync ops

CUDA (``cuda:80``, ``cuda:90``): triton compiles the launches the custom ops plan
(``npudet/ops/msda/kernels/triton_launch.py``) to cubins; registers, stack (spills) and shared
memory come from the bundled cuobjdump. Ascend (``ascend``): the same launches of the
``ascend`` schedule go through triton-ascend's own passes to Linalg in ``.venv-ascend``, then
through bishengir-compile's HIVM pipeline (PyPI ``ascendnpu-ir``) up to the binary code generator
``hivmc``, which is not shipped (``dev/npudet_dev/kernels/ascend_lowering.py`` reads a JSON
list on stdin and answers one on stdout); without that environment Ascend is reported as not run.

    python dev/tools/compile_kernels.py --targets ascend --ascend-compiler bishengir-compile-a5 \
        --ascend-arch Ascend950PR_9599     # the next-generation build and target

Prints a table per (kernel, target, dtype, case), a summary per (kernel, target, dtype),
and writes JSON. Ascend columns: "UB est." is the Linalg-stage estimate of live tiles (held to
96 KB, half the UB); "UB planned" is where PlanMemory put the end of the last UB buffer, second
copies of multi-buffered buffers included (held to the 192 KB UB); op counts are of the HIVM
module after GraphSyncSolver (``ascend_lowering.op_figures``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from npudet.benchmark.cases import launch_shapes
from npudet.benchmark.provenance import provenance
from npudet.ops.msda.kernels.triton_launch import plan_launches
from npudet_dev.kernels import ascend_lowering, kernel_compile
from npudet_dev.kernels.compile_table import ascend_change, cuda_table

ROOT = Path(__file__).resolve().parents[2]

ASCEND_PYTHON = ROOT / ".venv-ascend" / "bin" / "python"
ASCEND_LOWERING = Path(ascend_lowering.__file__)
ASCEND_DTYPES = ("float32", "float16", "bfloat16")  # triton-ascend has no float64
TARGETS = (*kernel_compile.CUDA_TARGETS, "ascend")


def _csv(text: str) -> List[str]:
    return [t for t in text.split(",") if t]


def check_ascend(
    dtypes: Sequence[str],
    shapes: Dict[str, object],
    compiler: str = "bishengir-compile",
    arch: str = "Ascend910B3",
) -> Tuple[str, List[dict]]:
    """(status, rows) of the ``ascend`` schedule's launches: lowered to Linalg by triton-ascend,
    then through ``compiler``'s HIVM pipeline for ``arch`` (``ascend_lowering.py``)."""
    if not ASCEND_PYTHON.exists():
        return "not run: .venv-ascend is missing (tools/setup.sh makes it)", []
    if not ASCEND_LOWERING.exists():
        return f"not run: {ASCEND_LOWERING} is missing", []
    try:
        plans = {
            (dtype, case): plan_launches("ascend", dtype, shape)
            for dtype in dtypes
            for case, shape in shapes.items()
        }
    except ValueError as exc:
        return f"not run: {exc}", []
    # Identical launches (same code and grid) are compiled once, tagged by their first row.
    requests: Dict[str, dict] = {}
    first_tag: Dict[str, str] = {}
    tags: Dict[Tuple[str, str, str], str] = {}
    for (dtype, case), launches in plans.items():
        for launch in launches.values():
            key = kernel_compile.launch_key(launch) + json.dumps(launch.grid)
            tag = first_tag.setdefault(key, f"{launch.kernel}|{dtype}|{case}")
            tags[(launch.kernel, dtype, case)] = tag
            requests[tag] = kernel_compile.lowering_job(
                tag, launch, hivm=True, compiler=compiler, arch=arch
            )
    proc = subprocess.run(
        [str(ASCEND_PYTHON), "-I", str(ASCEND_LOWERING)],
        input=json.dumps(list(requests.values())),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        return f"failed: ascend_lowering.py exited {proc.returncode}: {proc.stderr[-2000:]}", []
    answers = {a["tag"]: a for a in json.loads(proc.stdout)}
    rows = []
    for (kernel, dtype, case), tag in tags.items():
        answer = answers.get(tag, dict(lowered=False, error="no answer"))
        row = dict(kernel=kernel, target="ascend", dtype=dtype, case=case)
        row |= {k: answer.get(k) for k in ASCEND_FIELDS}
        row["compiled"] = bool(row["lowered"] and row["hivm_ok"])
        rows.append(row)
    versions = sorted({a["compiler_version"] for a in answers.values() if "compiler_version" in a})
    return f"run: {'; '.join(versions) or compiler} --target={arch}", rows


# What the Ascend rows keep of ascend_lowering.py's answers: the Linalg-stage estimate and counts,
# then the compiler's own figures (UB as PlanMemory placed it, ops after GraphSyncSolver).
ASCEND_FIELDS = (
    "lowered", "error", "hivm_ok", "hivm_error", "programs", "ub_bytes", "ub_planned_bytes",
    "multi_buffers", "multi_buffer_bytes", "plan_memory_runs", "hivm_vector_ops",
    "hivm_single_point_vector_ops", "hivm_dma_loads", "hivm_dma_stores", "hivm_row_atomics",
    "hivm_scalar_atomics", "hivm_element_copies", "hivm_looped_element_copies",
    "hivm_scalar_loads", "hivm_gm_scalar_loads", "hivm_scalar_stores", "hivm_sync_ops",
    "hivm_body_copies", "hivm_seconds", "scalar_atomics", "scalar_loads",
    "hivm_vector_ops_per_item", "hivm_scalar_loads_per_item", "hivm_sync_ops_per_item",
)  # fmt: skip
# Ascend table: (column, row field).
ASCEND_COLUMNS = (
    ("UB est. (B)", "ub_bytes"),
    ("UB planned (B)", "ub_planned_bytes"),
    ("multi-buffered", "multi_buffers"),
    ("vector ops", "hivm_vector_ops"),
    ("1-element vector ops", "hivm_single_point_vector_ops"),
    ("scalar loads", "hivm_scalar_loads"),
    ("scalar stores", "hivm_scalar_stores"),
    ("row atomics", "hivm_row_atomics"),
    ("scalar atomics", "hivm_scalar_atomics"),
    ("element copies", "hivm_element_copies"),
    ("sync ops", "hivm_sync_ops"),
    ("body copies", "hivm_body_copies"),
    ("programs", "programs"),
)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def table(rows: List[dict]) -> str:
    """Markdown tables, one line per (kernel, target, dtype, case): CUDA, then Ascend."""
    cuda = [r for r in rows if r["target"] != "ascend"]
    ascend = [r for r in rows if r["target"] == "ascend"]
    parts = []
    if cuda:
        head = "| kernel | target | dtype | case | compiled | registers | spills (B) | shared (B) |"
        lines = [head, "|" + "---|" * 8]
        for r in cuda:
            cells = [r["kernel"], r["target"], r["dtype"], r["case"], r["compiled"]]
            cells += [r.get(k) for k in ("registers", "stack_bytes", "shared_bytes")]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        parts.append("\n".join(lines))
    if ascend:
        head = "| kernel | target | dtype | case | compiled | "
        head += " | ".join(c for c, _ in ASCEND_COLUMNS) + " |"
        lines = [head, "|" + "---|" * (5 + len(ASCEND_COLUMNS))]
        for r in ascend:
            cells = [r["kernel"], r["target"], r["dtype"], r["case"], r["compiled"]]
            cells += [r.get(k) for _, k in ASCEND_COLUMNS]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def summary(rows: List[dict]) -> str:
    """Markdown table: the worst case over the cases of each (kernel, target, dtype)."""
    groups: Dict[Tuple[str, str, str], List[dict]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["target"], r["dtype"]), []).append(r)
    figures = (
        "registers",
        "stack_bytes",
        "shared_bytes",
        "ub_bytes",
        "ub_planned_bytes",
        "hivm_scalar_atomics",
        "hivm_element_copies",
        "hivm_sync_ops",
        "programs",
    )
    lines = [
        "| kernel | target | dtype | compiled | warps | max registers | max spills (B) "
        "| max shared (B) | max UB est. (B) | max UB planned (B) | max scalar atomics "
        "| max element copies | max sync ops | max programs |",
        "|" + "---|" * 14,
    ]
    for (kernel, target, dtype), group in groups.items():
        ok = [r for r in group if r["compiled"]]
        warps = sorted({r["num_warps"] for r in group if "num_warps" in r})
        cells = [
            kernel,
            target,
            dtype,
            f"{len(ok)}/{len(group)}",
            ",".join(map(str, warps)) or None,
        ]
        for key in figures:
            values = [r[key] for r in ok if r.get(key) is not None]
            cells.append(max(values) if values else None)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=_csv, default=list(TARGETS), help=",".join(TARGETS))
    parser.add_argument(
        "--dtypes", type=_csv, default=list(kernel_compile.CUDA_DTYPES), help="float32,..."
    )
    shapes = kernel_compile.check_shapes(launch_shapes())
    parser.add_argument("--cases", type=_csv, default=list(shapes), help=",".join(shapes))
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument(
        "--ascend-compiler",
        default="bishengir-compile",
        help="the HIVM compiler of the Ascend rows (bishengir-compile-a5: the next generation)",
    )
    parser.add_argument("--ascend-arch", default="Ascend910B3", help="its --target")
    parser.add_argument(
        "--table-of",
        type=Path,
        default=None,
        help="print the docs' register table of a stored --json report, compile nothing",
    )
    parser.add_argument(
        "--change-of",
        type=Path,
        nargs=2,
        default=None,
        metavar=("BEFORE", "AFTER"),
        help="print the change of the Ascend figures between two stored reports",
    )
    args = parser.parse_args(list(argv) or None)
    if args.table_of is not None:
        print(cuda_table(json.loads(args.table_of.read_text())))
        return 0
    if args.change_of is not None:
        before, after = (json.loads(p.read_text()) for p in args.change_of)
        print(ascend_change(before, after, {c: s.head_dim for c, s in shapes.items()}))
        return 0
    for name, given, known in (
        ("--targets", args.targets, TARGETS),
        ("--dtypes", args.dtypes, kernel_compile.CUDA_DTYPES),
        ("--cases", args.cases, tuple(shapes)),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"{name}: unknown {unknown}; expected some of {list(known)}")
    chosen = {c: shapes[c] for c in args.cases}
    origin = provenance()  # the commit compiled: taken before, as the checkout may move on
    start = time.perf_counter()
    cuda_targets = [t for t in args.targets if t != "ascend"]
    rows = kernel_compile.check_cuda(chosen, cuda_targets, args.dtypes) if cuda_targets else []
    ascend_status = "not requested"
    if "ascend" in args.targets:
        ascend_dtypes = [d for d in args.dtypes if d in ASCEND_DTYPES]
        ascend_status, ascend_rows = check_ascend(
            ascend_dtypes, chosen, args.ascend_compiler, args.ascend_arch
        )
        rows += ascend_rows
    seconds = time.perf_counter() - start
    print(table(rows))
    print()
    print(summary(rows))
    print(f"\nascend: {ascend_status}; {len(rows)} rows in {seconds:.0f} s")
    failed = [r for r in rows if not r["compiled"]]
    for r in failed:
        why = r.get("error") or r.get("hivm_error")
        print(f"FAILED {r['kernel']} {r['target']} {r['dtype']} {r['case']}: {why}")
    if args.json:
        import triton

        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = dict(
            command="python dev/tools/compile_kernels.py " + " ".join(argv or sys.argv[1:]),
            triton=triton.__version__,
            **origin,
            targets=args.targets,
            ascend=ascend_status,
            seconds=round(seconds, 1),
            rows=rows,
        )
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
