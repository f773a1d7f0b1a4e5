"""The docs' register table, worked out from a stored compile report.

``tools/compile_kernels.py --json FILE`` stores every CUDA row; ``cuda_table(report)`` is the
worst case over the cases of each (kernel, dtype): registers per target, spill bytes and
warps. ``python tools/compile_kernels.py --table-of FILE`` prints it, and the pages that quote
it (docs/ops/triton-cuda.md, docs/ops/gpu-runs.md) hold exactly that text (tested), so a figure
on those pages is the stored file's.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from .kernel_compile import CUDA_DTYPES, CUDA_TARGETS

KERNEL_NAMES = (("msda_fwd_kernel", "forward"), ("msda_bwd_kernel", "backward"))


def cuda_table(report: dict) -> str:
    """Markdown: per (kernel, dtype) the most registers on each CUDA target of ``report``,
    the most spill bytes (stack) and the warps used, over every case; a header line names
    the triton version and the commit."""
    rows: List[dict] = [r for r in report["rows"] if r["target"] in CUDA_TARGETS]
    targets = [t for t in CUDA_TARGETS if any(r["target"] == t for r in rows)]
    groups: Dict[Tuple[str, str], List[dict]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["dtype"]), []).append(r)
    head = ["kernel", "dtype", "compiled"]
    head += [f"sm_{CUDA_TARGETS[t]} registers" for t in targets] + ["spills (B)", "warps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kernel, label in KERNEL_NAMES:
        for dtype in CUDA_DTYPES:
            group = groups.get((kernel, dtype), [])
            if not group:
                continue
            ok = [r for r in group if r["compiled"]]
            cells = [label, dtype, f"{len(ok)}/{len(group)}"]
            for target in targets:
                regs = [r["registers"] for r in ok if r["target"] == target]
                cells.append(str(max(regs)) if regs else "-")
            cells.append(str(max((r["stack_bytes"] for r in ok), default=0)))
            cells.append(",".join(str(w) for w in sorted({r["num_warps"] for r in ok})))
            lines.append("| " + " | ".join(cells) + " |")
    commit = str(report.get("commit", "not stored"))
    commit = commit[:7] + ("+dirty" if commit.endswith("+dirty") else "")
    title = f"triton {report.get('triton', '?')}, commit {commit}, {len(rows)} CUDA launches"
    return title + ":\n\n" + "\n".join(lines)
