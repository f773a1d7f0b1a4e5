"""The docs' register table, worked out from a stored compile report.

``dev/tools/compile_kernels.py --json FILE`` stores every CUDA row; ``cuda_table(report)`` is the
worst case over the cases of each (kernel, dtype): registers per target, spill bytes and
warps. ``python dev/tools/compile_kernels.py --table-of FILE`` prints it, and the pages that quote
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


def _percent_fewer(before: int, after: int) -> float:
    return 100.0 * (before - after) / before


def ascend_change(before: dict, after: dict, head_dims: Dict[str, int]) -> str:
    """Markdown: per (kernel, dtype) of the Ascend rows in both reports, how many percent
    fewer scalar loads and sync ops ``after`` has than ``before`` (HIVM figures), as the
    range over the cases of head_dim >= 8 and, apart, those below (``head_dims``: case ->
    head_dim); negative: more."""

    def ascend(report: dict) -> Dict[Tuple[str, str, str], dict]:
        return {
            (r["kernel"], r["dtype"], r["case"]): r
            for r in report["rows"]
            if r["target"] == "ascend" and r["compiled"]
        }

    was, now = ascend(before), ascend(after)
    fields = (("scalar loads", "hivm_scalar_loads"), ("sync ops", "hivm_sync_ops"))
    head = ["kernel", "dtype"]
    head += [f"% fewer {label}, head_dim >= 8" for label, _ in fields]
    head += [f"% fewer {label}, head_dim < 8" for label, _ in fields]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kernel, label in KERNEL_NAMES:
        for dtype in CUDA_DTYPES:
            keys = [k for k in now if k[:2] == (kernel, dtype) and k in was]
            if not keys:
                continue
            cells = [label, dtype]
            for wide in (True, False):
                for _, field in fields:
                    changes = sorted(
                        _percent_fewer(was[k][field], now[k][field])
                        for k in keys
                        if (head_dims[k[2]] >= 8) == wide and was[k][field]
                    )
                    span = f"{changes[0]:.0f}" if changes else "-"
                    if len(changes) > 1 and round(changes[-1]) != round(changes[0]):
                        span += f" to {changes[-1]:.0f}"
                    cells.append(span)
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
