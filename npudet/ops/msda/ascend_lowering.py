"""Lower Triton kernels through triton-ascend's own stages to Linalg and count what matters.

A worker script, run by the python of an environment with triton-ascend 3.2 installed
(``.venv-ascend``; no torch, no NPU, no CANN): ``python ascend_lowering.py < jobs.json``.

stdin: a JSON list of jobs ``{"tag", "module_path", "kernel", "signature", "constexprs",
"grid"}``; ``signature`` maps every non-constexpr argument to ``"*fp32"``, ``"*fp16"``,
``"*bf16"``, ``"*i32"``, ``"*i64"``, ``"i32"`` or ``"i64"``; constexpr values are ints, bools,
floats or triton dtype names (``"fp32"``, ``"float32"`` or ``"tl.float32"``).

stdout: a JSON list, one result per job, in order: ``tag``, ``lowered``, ``error`` and the
counts below (see ``analyze``). The kernel module is loaded by file path, so it must import
only ``triton`` (and the standard library).

Stages: ``ASTSource.make_ir`` -> ``triton.backends.ascend.compiler.make_ttir`` ->
``ttir_to_linalg(..., named_ops=True)`` (``triton-adapter-opt``), exactly what
``triton.compile(src, target=GPUTarget("npu", "Ascend910B3", 0))`` runs before it needs
CANN's ``bishengir-compile``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

UB_LIMIT_BYTES = 96 * 1024  # 192 KB UB, half of it with double buffering
MAX_PROGRAMS = 65535  # triton-ascend's launcher: "grid should be less than 65536"
TARGET_ARCH = "Ascend910B3"

_ELEM_BYTES = {"f64": 8, "i64": 8, "index": 8, "f32": 4, "i32": 4, "f16": 2, "bf16": 2}
_ELEM_BYTES.update({"i16": 2, "i8": 1, "i1": 1})
_TYPE = re.compile(r"(tensor|memref)<((?:\d+x)*)(f64|f32|f16|bf16|i64|i32|i16|i8|i1|index)\b")
_VALUE = re.compile(r"%[\w#]+")
_DEF = re.compile(r"^\s*(%[\w]+(?::\d+)?(?:\s*,\s*%[\w]+)*)\s*=\s*([\w.]+)")
# Ops whose result is a view of (or shares storage with) their first operand, or has none.
_ALIASES = {
    "bufferization.to_tensor",
    "bufferization.to_memref",
    "memref.subview",
    "memref.reinterpret_cast",
    "memref.cast",
    "tensor.expand_shape",
    "tensor.collapse_shape",
    "tensor.extract_slice",
}
_NO_STORAGE = {"tensor.empty", "arith.constant"}


def _static_bytes(text: str) -> int:
    """Bytes of the last statically shaped tensor/memref type in ``text`` (0 if none)."""
    found = _TYPE.findall(text)
    if not found:
        return 0
    _, dims, elem = found[-1]
    shape = [int(d) for d in dims.split("x") if d]
    return math.prod(shape) * _ELEM_BYTES[elem]


def _elements(memref_type: str) -> Optional[int]:
    """Element count of a memref type string like ``memref<1x1x32xf32, ...>``; None if dynamic."""
    m = re.match(r"memref<([^>]*?)x?(f64|f32|f16|bf16|i64|i32|i16|i8|i1)", memref_type)
    if not m:
        return None
    dims = [d for d in m.group(1).split("x") if d]
    if any(not d.isdigit() for d in dims):
        return None
    return math.prod(int(d) for d in dims)


def _regions(lines: List[str]) -> Dict[int, int]:
    """Line of each region opener ('{' at the end) -> line of its closing '}'."""
    ends: Dict[int, int] = {}
    stack: List[int] = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("}"):
            if stack:
                ends[stack.pop()] = i
        if stripped.endswith("{"):
            stack.append(i)
    return ends


def live_tile_bytes(linalg: str) -> int:
    """Peak bytes of statically shaped tensors and buffers live at once in the kernel body.

    Every SSA value of a static tensor/memref type (``memref.alloc`` UB buffers, results of
    Linalg/arith ops on tiles, ``scf.for`` loop-carried tiles) is live from its definition to
    its last use; a value used inside a loop but defined outside stays live to the loop's end.
    Views (``to_tensor``, ``subview``, ``extract_slice``, reshapes) share their source's
    storage; ``tensor.empty`` has none. No buffer reuse or in-place fusion is assumed (the
    CANN compiler does both, so it needs less) and no double buffering (it may double load
    buffers; that is why the budget is half of the 192 KB UB).
    """
    lines = linalg.splitlines()
    ends = _regions(lines)
    root: Dict[str, str] = {}
    size: Dict[str, int] = {}
    born: Dict[str, int] = {}
    last: Dict[str, int] = {}
    open_regions: List[int] = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("}") and open_regions:
            open_regions.pop()
        m = _DEF.match(line)
        defined: List[str] = []
        if m:
            defined = [d.split(":")[0].strip() for d in m.group(1).split(",")]
            op = m.group(2)
            rhs = line[m.end() :]
            operands = _VALUE.findall(rhs)
            if op in _ALIASES and operands and operands[0] in born:
                for d in defined:
                    root[d] = root.get(operands[0], operands[0])
            elif op not in _NO_STORAGE:
                nbytes = _static_bytes(line)
                for d in defined:
                    if nbytes:
                        size[d] = nbytes
                        born[d] = i
                        last[d] = i
        used = _VALUE.findall(line[m.end() :] if m else line)
        for u in used:
            r = root.get(u, u)
            if r not in born:
                continue
            end = i
            for start in open_regions:
                if start > born[r]:
                    end = max(end, ends.get(start, i))
                    break
            last[r] = max(last[r], end)
        if stripped.endswith("{"):
            open_regions.append(i)
    if not size:
        return 0
    delta = [0] * (len(lines) + 1)
    for v, nbytes in size.items():
        delta[born[v]] += nbytes
        delta[last[v] + 1] -= nbytes
    peak = running = 0
    for d in delta:
        running += d
        peak = max(peak, running)
    return peak


def _constants(lines: List[str]) -> Dict[str, int]:
    consts: Dict[str, int] = {}
    for line in lines:
        m = re.match(r"\s*(%[\w]+) = arith\.constant (-?\d+) : (?:index|i32|i64)\s*$", line)
        if m:
            consts[m.group(1)] = int(m.group(2))
    return consts


def _trip_counts(lines: List[str]) -> List[int]:
    """Per line: product of the trip counts of the enclosing constant-bound ``scf.for`` loops.

    Loops with a bound only known at run time (the persistent loop over work items) count
    as 1, so the products are per work item.
    """
    consts = _constants(lines)
    ends = _regions(lines)
    factor = [1] * len(lines)
    loop = re.compile(r"scf\.for %\w+ = (%[\w]+) to (%[\w]+) step (%[\w]+)")
    for i, line in enumerate(lines):
        m = loop.search(line)
        if not m or i not in ends:
            continue
        lo, hi, step = (consts.get(v) for v in m.groups())
        if lo is None or hi is None or not step:
            continue
        trips = max(0, -(-(hi - lo) // step))
        for k in range(i + 1, ends[i]):
            factor[k] *= trips
    return factor


def _discrete_lines(lines: List[str]) -> List[bool]:
    """Per line: inside an ``scf.for`` the adapter made from a gather or scatter."""
    ends = _regions(lines)
    inside = [False] * len(lines)
    for start, end in ends.items():
        if "scf.for" in lines[start] and "ExtractedLoadOrStore" in lines[end]:
            for k in range(start + 1, end):
                inside[k] = True
    return inside


def analyze(linalg: str) -> Dict[str, int]:
    """Counts on the Linalg IR of one kernel (static op counts; ``*_per_item`` are executions).

    - ``scalar_atomics``: atomic read-modify-writes (``linalg.generic`` with
      ``GenericAtomicRMW``) on a one-element memref: the per-element atomics a tile atomic
      becomes when its mask differs along the row. ``row_atomics``: those on a memref of more
      than one element (a whole D-contiguous row, or a tile).
    - ``scalar_loads``: ``memref.load`` (one element from global memory) inside a loop the
      adapter made from a gathered tile (``ExtractedLoadOrStore``): indirect loads the scalar
      unit runs one by one. ``uniform_scalar_loads``: other ``memref.load`` ops.
    - ``row_gathers``: ``memref.copy`` inside such loops: one DMA copy of a contiguous row.
    - ``masked_gathers``: ``arith.select`` ops that pick from gathered data: a masked gather
      whose mask the adapter turned into a select, so its masked-off addresses are read.
    - ``ub_bytes``: ``live_tile_bytes``.
    """
    lines = linalg.splitlines()
    trips = _trip_counts(lines)
    discrete = _discrete_lines(lines)
    ends = _regions(lines)
    counts = dict.fromkeys(
        (
            "scalar_atomics",
            "scalar_atomics_per_item",
            "row_atomics",
            "row_atomics_per_item",
            "scalar_loads",
            "scalar_loads_per_item",
            "uniform_scalar_loads",
            "row_gathers",
            "row_gathers_per_item",
            "masked_gathers",
        ),
        0,
    )
    view_of: Dict[str, str] = {}
    gathered: set = set()
    for i, line in enumerate(lines):
        m = _DEF.match(line)
        if m and m.group(2) == "memref.subview":
            view_of[m.group(1)] = _VALUE.findall(line[m.end() :])[0]
        if "GenericAtomicRMW" in line:
            ins = re.search(r"ins\(%[\w]+(?:, %[\w]+)* : (memref<[^>]*>)", line)
            kind = "scalar_atomics" if ins and _elements(ins.group(1)) == 1 else "row_atomics"
            counts[kind] += 1
            counts[kind + "_per_item"] += trips[i]
        elif "memref.load %reinterpret_cast" in line:  # one element of a kernel argument
            if discrete[i]:
                counts["scalar_loads"] += 1
                counts["scalar_loads_per_item"] += trips[i]
            else:
                counts["uniform_scalar_loads"] += 1
        elif "memref.copy %reinterpret_cast" in line and discrete[i]:
            counts["row_gathers"] += 1
            counts["row_gathers_per_item"] += trips[i]
            dest = re.search(r"memref\.copy %[\w]+, (%[\w]+)", line)
            if dest:
                buf = dest.group(1)
                while buf in view_of:
                    buf = view_of[buf]
                gathered.add(buf)
    for i, line in enumerate(lines):
        m = _DEF.match(line)
        if not m:
            continue
        name, op = m.group(1).split(":")[0], m.group(2)
        operands = _VALUE.findall(line[m.end() :])
        if op == "scf.for" and "ExtractedLoadOrStore" in lines[ends.get(i, i)]:
            gathered.add(name)  # a gather the adapter split into element loads
        elif op == "bufferization.to_tensor" and operands and operands[0] in gathered:
            gathered.add(name)
        elif op == "arith.select" and len(operands) >= 3 and operands[1] in gathered:
            counts["masked_gathers"] += 1
    counts["ub_bytes"] = live_tile_bytes(linalg)
    return counts


def _constexpr(value):
    """JSON constexpr -> what triton expects (dtype names become ``tl.dtype``)."""
    import triton.language as tl

    if isinstance(value, str):
        name = value[3:] if value.startswith("tl.") else value
        dtype = getattr(tl, name, None)
        if isinstance(dtype, tl.dtype):
            return dtype
        return tl.dtype(name)
    return value


def _load_kernel(module_path: str, kernel: str):
    spec = importlib.util.spec_from_file_location(f"_lowered_{abs(hash(module_path))}", module_path)
    if spec is None or spec.loader is None:
        raise ValueError(f"module_path: cannot load {module_path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, kernel)


def lower(fn, signature: Dict[str, str], constexprs: Dict[str, object]) -> Tuple[str, str]:
    """(TTIR, Linalg MLIR) of ``fn`` by triton-ascend's own stages."""
    from triton._C.libtriton import ir
    from triton.backends.ascend.compiler import AscendBackend, make_ttir, ttir_to_linalg
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    consts = {k: _constexpr(v) for k, v in constexprs.items()}
    missing = [a for a in fn.arg_names if a not in consts and a not in signature]
    if missing:
        raise ValueError(f"signature: no type for argument(s) {missing}")
    sig = {a: ("constexpr" if a in consts else signature[a]) for a in fn.arg_names}
    target = GPUTarget("npu", TARGET_ARCH, 0)
    backend = AscendBackend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    src = ASTSource(fn, sig, consts)
    module = src.make_ir(
        options, backend.get_codegen_implementation(), backend.get_module_map(), context
    )
    metadata = {"hash": src.hash(), "target": target, **options.__dict__}
    module = make_ttir(module, metadata, options)
    ttir = str(module)
    return ttir, ttir_to_linalg(module, metadata, options, named_ops=True)


def run_job(job: dict) -> dict:
    """One job -> its result (never raises: failures are reported in ``error``)."""
    grid = [int(g) for g in job.get("grid", (1, 1, 1))]
    result = {
        "tag": job.get("tag"),
        "lowered": False,
        "error": None,
        "programs": math.prod(grid),
        "grid_ok": math.prod(grid) <= MAX_PROGRAMS,
    }
    begin = time.perf_counter()
    try:
        fn = _load_kernel(job["module_path"], job["kernel"])
        _, linalg = lower(fn, job["signature"], job.get("constexprs", {}))
        result.update(analyze(linalg))
        result["ub_ok"] = result["ub_bytes"] <= UB_LIMIT_BYTES
        result["linalg_lines"] = len(linalg.splitlines())
        result["lowered"] = True
    except subprocess.CalledProcessError as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        # A crash prints its reason first, then a stack dump that says nothing more.
        reason = (stderr or str(e)).split("PLEASE submit a bug report")[0].strip()
        result["error"] = f"triton-adapter-opt failed: {reason[-2000:]}"
    except Exception as e:  # reported per job: one kernel failing must not hide the others
        # the reason is at the end (CompilationError starts with the kernel source)
        result["error"] = f"{type(e).__name__}: ...{str(e).strip()[-1000:]}"
    result["seconds"] = round(time.perf_counter() - begin, 3)
    return result


def main() -> int:
    # Kernels are lowered, never interpreted: a caller under the interpreter (the tests)
    # must not pass TRITON_INTERPRET=1 on to the triton.jit of the kernel modules loaded here.
    os.environ["TRITON_INTERPRET"] = "0"
    # Nor may the caller's PYTHONPATH (another environment's triton) shadow triton-ascend's.
    for entry in os.environ.pop("PYTHONPATH", "").split(os.pathsep):
        while entry and entry in sys.path:
            sys.path.remove(entry)
    jobs = json.load(sys.stdin)
    if not isinstance(jobs, list):
        raise TypeError(f"stdin: expected a JSON list of jobs, got {type(jobs).__name__}")
    json.dump([run_job(job) for job in jobs], sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
