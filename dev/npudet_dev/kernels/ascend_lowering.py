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

import functools
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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


# What ``triton.compile`` passes to bishengir-compile for an A2/A3 target (triton-ascend 3.2.0's
# ``linalg_to_bin_enable_npu_compile_A2_A3`` with its default options).
HIVM_OPTIONS = (
    "--enable-auto-multi-buffer=true",
    "--enable-hfusion-compile=true",
    "--enable-hivm-compile=true",
    "--enable-triton-kernel-compile=true",
)
# Passes whose output the figures are read from: the UB plan, and the last HIVM-level module
# (synchronisation inserted) before ConvertHIVMToStandard.
HIVM_DUMPS = ("hivm-plan-memory", "hivm-graph-sync-solver")
# Everything bishengir-compile 1.2.0 says, besides the IR dumps, when the only thing missing is
# the external binary code generator ``hivmc`` (not shipped in PyPI's ascendnpu-ir). Any other
# line fails the rung with the compiler's own words.
HIVMC_MISSING = (
    "[ERROR] Cannot find hivmc under $PATH",
    "[ERROR] Failed to run `hivmc --version`.",
    "[WARNING] Failed to detect hivmc version for backward compatibility",
    "error: External hivmc run fails, returning module before running external compiler",
    "[ERROR] Failed to run BiShengIR pipeline",
)
_HIVMC_STOP = HIVMC_MISSING[3]
_DUMP = re.compile(r"^// -----// IR Dump After \w+ \(([\w-]+)\) //----- //$")
_SAID = re.compile(r"^(?:loc\(|\[(?:ERROR|WARNING|INFO)\]|error:|warning:)")
_LOC = re.compile(r'^loc\((?:"[^"]*"|[^)])*\):\s*')
_CAST = re.compile(r"hivm\.hir\.pointer_cast\(([^)]*)\)\s*:\s*(memref<[^>]*address_space<ub>>)")
_I64 = re.compile(r"^\s*(%[\w]+) = arith\.constant (-?\d+) : i64\s*$", re.M)
_HIVM_OP = re.compile(
    r"\b(hivm\.hir\.[a-z_0-9]+|memref\.(?:load|store|atomic_rmw|generic_atomic_rmw))\b"
)
_BITS = {"f64": 64, "i64": 64, "f32": 32, "i32": 32, "f16": 16, "bf16": 16, "i16": 16, "i8": 8}
_BITS["i1"] = 1  # PlanMemory packs i1 masks as bits (a 16x256xi1 buffer takes 512 B)
SYNC_OPS = ("hivm.hir.set_flag", "hivm.hir.wait_flag", "hivm.hir.pipe_barrier")


def find_compiler(name: str = "bishengir-compile") -> Optional[str]:
    """The compiler as triton-ascend finds it (``PATH``, then ``TRITON_NPU_COMPILER_PATH``),
    else the one PyPI's ``ascendnpu-ir`` installs into this environment; None if none."""
    found = shutil.which(name)
    root = os.environ.get("TRITON_NPU_COMPILER_PATH")
    if not found and root and os.access(os.path.join(root, name), os.X_OK):
        found = os.path.join(root, name)
    if not found:
        spec = importlib.util.find_spec("ascendnpuir")
        if spec and spec.submodule_search_locations:
            path = os.path.join(list(spec.submodule_search_locations)[0], "bin", name)
            found = path if os.access(path, os.X_OK) else None
    return found


@functools.cache
def compiler_version(compiler: str) -> str:
    """First line of ``compiler --version``."""
    proc = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    return (proc.stdout or proc.stderr).strip().splitlines()[0].strip()


def split_output(text: str, kernel: str) -> Tuple[Dict[str, List[str]], List[str]]:
    """bishengir-compile's output -> ({pass: [dumps of ``kernel``'s function]}, other lines).

    A dump runs from its header to the first line that is a lone ``}`` (the function's end);
    diagnostics (``loc(...): error: ...``, ``[ERROR] ...``) are never part of one.
    """
    dumps: Dict[str, List[str]] = {}
    said: List[str] = []
    current: Optional[List[str]] = None
    name = ""
    for line in text.splitlines():
        if _SAID.match(line):  # a diagnostic, even where a dump printed in another form runs on
            said.append(_LOC.sub("", line.strip()))
            continue
        if current is not None:
            current.append(line)
            if line == "}":
                body = "\n".join(current)
                if f"func.func @{kernel}(" in body:
                    dumps.setdefault(name, []).append(body)
                current = None
            continue
        header = _DUMP.match(line.strip())
        if header:
            name, current = header.group(1), []
        elif line.strip():
            said.append(_LOC.sub("", line.strip()))
    return dumps, said


def _bytes(memref_type: str) -> int:
    m = re.match(r"memref<((?:\d+x)*)(\w+)", memref_type)
    if not m or m.group(2) not in _BITS:
        raise ValueError(f"unexpected UB buffer type {memref_type}")
    dims = [int(d) for d in m.group(1).split("x") if d]
    return -(-math.prod(dims) * _BITS[m.group(2)] // 8)


def plan_figures(planned: str) -> Dict[str, int]:
    """UB figures of the function after PlanMemory (every UB buffer is a ``pointer_cast`` of
    constant offsets, two or more for a multi-buffered one).

    ``ub_planned_bytes``: the end of the highest buffer, second copies included;
    ``multi_buffers``: buffers given more than one copy; ``multi_buffer_bytes``: what those
    extra copies take.
    """
    consts = {m.group(1): int(m.group(2)) for m in _I64.finditer(planned)}
    top = multi = extra = 0
    for m in _CAST.finditer(planned):
        size = _bytes(m.group(2))
        offsets = [consts[a.strip()] for a in m.group(1).split(",")]
        top = max(top, *(o + size for o in offsets))
        if len(offsets) > 1:
            multi += 1
            extra += (len(offsets) - 1) * size
    return dict(ub_planned_bytes=top, multi_buffers=multi, multi_buffer_bytes=extra)


def op_figures(hivm: str) -> Dict[str, int]:
    """Op counts of the HIVM function after synchronisation (static; ``*_per_item`` multiply by
    the constant trip counts of the enclosing loops, so they are per work item).

    ``vector_ops``: ``hivm.hir.v*`` ops (``single_point_vector_ops``: those on one element);
    ``dma_loads``/``dma_stores``: copies between global memory and UB; ``row_atomics``: atomic-add
    copies of more than one element, ``scalar_atomics``: of one element, or scalar atomic RMWs;
    ``element_copies``: non-atomic copies of one element (``looped_element_copies``: those inside
    a loop, the per-program level tables excluded); ``scalar_loads``/``scalar_stores``:
    ``memref.load``/``store`` (the scalar unit; ``gm_scalar_loads`` read global memory);
    ``sync_ops``: set_flag + wait_flag + pipe_barrier; ``body_copies``: ``get_block_idx`` ops
    (one per copy of the kernel body).
    """
    lines = hivm.splitlines()
    trips = _trip_counts(lines)
    looped = [False] * len(lines)
    for start, end in _regions(lines).items():
        if "scf.for" in lines[start]:
            looped[start + 1 : end] = [True] * (end - start - 1)
    names = (
        "vector_ops", "single_point_vector_ops", "dma_loads", "dma_stores", "row_atomics",
        "scalar_atomics", "element_copies", "scalar_loads", "gm_scalar_loads", "scalar_stores",
        "sync_ops", "body_copies", "element_copies_per_item", "scalar_atomics_per_item",
        "row_atomics_per_item", "dma_loads_per_item", "looped_element_copies",
        "scalar_loads_per_item", "sync_ops_per_item", "vector_ops_per_item",
    )  # fmt: skip
    counts = dict.fromkeys(names, 0)
    for i, line in enumerate(lines):
        found = _HIVM_OP.search(line)
        if not found or "pointer_cast" in found.group(1):
            continue
        op = found.group(1)
        if op.startswith("hivm.hir.v"):
            counts["vector_ops"] += 1
            counts["vector_ops_per_item"] += trips[i]
            types = re.findall(r"memref<[^>]*>", line)
            counts["single_point_vector_ops"] += bool(types) and all(
                _elements(t) == 1 for t in types
            )
        elif op in ("hivm.hir.load", "hivm.hir.store"):
            ins = re.search(r"ins\(%[\w]+ : (memref<[^>]*>)", line)
            single = ins is not None and _elements(ins.group(1)) == 1
            if "atomic = <" in line:
                kind = "scalar_atomics" if single else "row_atomics"
                counts[kind] += 1
                counts[kind + "_per_item"] += trips[i]
            elif single:
                counts["element_copies"] += 1
                counts["element_copies_per_item"] += trips[i]
                counts["looped_element_copies"] += looped[i]
            elif op == "hivm.hir.load":
                counts["dma_loads"] += 1
                counts["dma_loads_per_item"] += trips[i]
            else:
                counts["dma_stores"] += 1
        elif op == "memref.load":
            counts["scalar_loads"] += 1
            counts["scalar_loads_per_item"] += trips[i]
            counts["gm_scalar_loads"] += "address_space<gm>" in line
        elif op == "memref.store":
            counts["scalar_stores"] += 1
        elif "atomic" in op:
            counts["scalar_atomics"] += 1
            counts["scalar_atomics_per_item"] += trips[i]
        elif op in SYNC_OPS:
            counts["sync_ops"] += 1
            counts["sync_ops_per_item"] += trips[i]
        elif op == "hivm.hir.get_block_idx":
            counts["body_copies"] += 1
    return counts


def compile_hivm(
    linalg: str, kernel: str, compiler: str, arch: str = TARGET_ARCH
) -> Dict[str, object]:
    """Run ``compiler`` on the Linalg of ``kernel`` through its whole pipeline.

    ``hivm_ok`` when the compiler printed the UB plan and the synchronised HIVM module and its
    only complaint is :data:`HIVMC_MISSING`; otherwise ``hivm_error`` holds what it said.
    """
    result: Dict[str, object] = {"hivm_ok": False, "hivm_error": None}
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.mlir")
        with open(src, "w") as f:
            f.write(linalg)
        cmd = [compiler, src, f"--target={arch}", *HIVM_OPTIONS]
        cmd += [f"--mlir-print-ir-after={','.join(HIVM_DUMPS)}", "-o", os.path.join(tmp, "kernel")]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=600)
    result["hivm_seconds"] = round(time.perf_counter() - begin, 3)
    dumps, said = split_output(proc.stdout + "\n" + proc.stderr, kernel)
    # The -a5 build (next generation) looks for its own code generator, hivmc-a5, and says so
    # (instead of "External hivmc run fails") at the external step of each of its attempts.
    a5 = any("hivmc-a5 " in s for s in said)
    said = [s.replace("hivmc-a5 ", "hivmc ") for s in said]
    unknown = [s for s in said if s not in HIVMC_MISSING]
    missing = [p for p in HIVM_DUMPS if p not in dumps]
    if unknown or missing or (HIVMC_MISSING[0] if a5 else _HIVMC_STOP) not in said:
        # Its errors first: a build that prints IR in another form leaves IR lines here too.
        errors = [s for s in unknown if "error" in s.lower()]
        reason = "\n".join(errors or unknown or said)[-2000:]
        if missing:
            reason += f"\n(no IR printed after {', '.join(missing)})"
        result["hivm_error"] = f"bishengir-compile exited {proc.returncode}: {reason}"
        return result
    result.update(plan_figures(dumps["hivm-plan-memory"][-1]))
    ops = op_figures(dumps["hivm-graph-sync-solver"][-1])
    result.update({f"hivm_{k}": v for k, v in ops.items()})
    # The compiler re-plans with less multi-buffering when a plan does not fit.
    result["plan_memory_runs"] = sum("address_space<ub>" in d for d in dumps["hivm-plan-memory"])
    result["hivm_ok"] = True
    return result


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


def _source(fn, signature: Dict[str, str], constexprs: Dict[str, object]):
    """triton's ``ASTSource`` of ``fn`` at these argument types and constexpr values."""
    from triton.compiler.compiler import ASTSource

    consts = {k: _constexpr(v) for k, v in constexprs.items()}
    missing = [a for a in fn.arg_names if a not in consts and a not in signature]
    if missing:
        raise ValueError(f"signature: no type for argument(s) {missing}")
    sig = {a: ("constexpr" if a in consts else signature[a]) for a in fn.arg_names}
    return ASTSource(fn, sig, consts)


def lower(fn, signature: Dict[str, str], constexprs: Dict[str, object]) -> Tuple[str, str]:
    """(TTIR, Linalg MLIR) of ``fn`` by triton-ascend's own stages."""
    from triton._C.libtriton import ir
    from triton.backends.ascend.compiler import AscendBackend, make_ttir, ttir_to_linalg
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("npu", TARGET_ARCH, 0)
    backend = AscendBackend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    src = _source(fn, signature, constexprs)
    module = src.make_ir(
        options, backend.get_codegen_implementation(), backend.get_module_map(), context
    )
    metadata = {"hash": src.hash(), "target": target, **options.__dict__}
    module = make_ttir(module, metadata, options)
    ttir = str(module)
    return ttir, ttir_to_linalg(module, metadata, options, named_ops=True)


def _crash_reason(error: subprocess.CalledProcessError) -> str:
    """What a failed triton-adapter-opt printed before its stack dump (the last 2000 chars)."""
    stderr = error.stderr
    stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    # A crash prints its reason first, then a stack dump that says nothing more.
    return (stderr or str(error)).split("PLEASE submit a bug report")[0].strip()[-2000:]


def lower_retrying_a_crash(
    fn, signature: Dict[str, str], constexprs: Dict[str, object]
) -> Tuple[str, str, Optional[str]]:
    """``lower``, run once more when triton-adapter-opt was killed by a signal (an MLIR
    assertion aborts it) rather than exiting with a diagnostic: 3.2.0's binary aborted once
    ("Malformed type storage object") on a launch that lowered on every rerun. A launch that
    crashes twice fails. Returns (TTIR, Linalg, the first crash's reason or None)."""
    try:
        return (*lower(fn, signature, constexprs), None)
    except subprocess.CalledProcessError as e:
        if e.returncode >= 0:  # a diagnostic: the same input fails the same way again
            raise
        crash = _crash_reason(e)
    return (*lower(fn, signature, constexprs), crash)


def triton_compile(fn, signature: Dict[str, str], constexprs: Dict[str, object], compiler: str):
    """What ``triton.compile(src, target=GPUTarget("npu", arch, 0))`` does with ``compiler``
    first on ``PATH`` (an NPU user's first call): ``{"triton_compile": "compiled"}`` or the stage
    it stopped at and why, and the Linalg it cached for the stages before.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    saved = {k: os.environ.get(k) for k in ("PATH", "TRITON_CACHE_DIR")}
    result: Dict[str, object] = {}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PATH"] = os.pathsep.join((os.path.dirname(compiler), saved["PATH"] or ""))
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            triton.compile(
                _source(fn, signature, constexprs), target=GPUTarget("npu", TARGET_ARCH, 0)
            )
            result["triton_compile"] = "compiled"
        except Exception as e:  # where it stops is the finding
            stage = re.search(r"\[(\w+)\] encounters error", str(e))
            reason = str(e).split("encounters error:")[-1].split("[INFO]")[0].strip()
            result["triton_compile"] = stage.group(1) if stage else type(e).__name__
            result["triton_compile_error"] = reason[-1000:]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        cached = [
            os.path.join(d, f)
            for d, _, fs in os.walk(cache)
            for f in fs
            if f.endswith(".ttadapter")
        ]
        if cached:
            with open(cached[0]) as f:
                result["triton_compile_linalg"] = f.read()
    return result


def run_job(job: dict) -> Tuple[dict, Optional[str]]:
    """One job -> (its result, the Linalg or None); never raises: failures are reported in
    ``error``. A job with ``"triton_compile": true`` also runs :func:`triton_compile`."""
    grid = [int(g) for g in job.get("grid", (1, 1, 1))]
    result = {
        "tag": job.get("tag"),
        "lowered": False,
        "error": None,
        "programs": math.prod(grid),
        "grid_ok": math.prod(grid) <= MAX_PROGRAMS,
    }
    begin = time.perf_counter()
    linalg = None
    try:
        fn = _load_kernel(job["module_path"], job["kernel"])
        _, linalg, crash = lower_retrying_a_crash(fn, job["signature"], job.get("constexprs", {}))
        if crash:
            result["retried_after_crash"] = crash
        result.update(analyze(linalg))
        result["ub_ok"] = result["ub_bytes"] <= UB_LIMIT_BYTES
        result["linalg_lines"] = len(linalg.splitlines())
        result["lowered"] = True
        if job.get("triton_compile"):
            compiler = find_compiler()
            if compiler is None:
                raise FileNotFoundError("bishengir-compile: not found (pip install ascendnpu-ir)")
            probe = triton_compile(fn, job["signature"], job.get("constexprs", {}), compiler)
            cached = probe.pop("triton_compile_linalg", None)
            probe["triton_compile_same_linalg"] = cached == linalg
            result.update(probe)
    except subprocess.CalledProcessError as e:
        result["error"] = f"triton-adapter-opt failed: {_crash_reason(e)}"
    except Exception as e:  # reported per job: one kernel failing must not hide the others
        # the reason is at the end (CompilationError starts with the kernel source)
        result["error"] = f"{type(e).__name__}: ...{str(e).strip()[-1000:]}"
    result["seconds"] = round(time.perf_counter() - begin, 3)
    return result, linalg if result["lowered"] else None


def run_hivm(job: dict, result: dict, linalg: Optional[str]) -> None:
    """Adds :func:`compile_hivm`'s figures to ``result`` for a job with ``"hivm": true``
    (``"compiler"``: the binary's name, default bishengir-compile; ``"arch"``: its target)."""
    if not job.get("hivm") or linalg is None:
        return
    name = job.get("compiler", "bishengir-compile")
    compiler = find_compiler(name)
    if compiler is None:
        result.update(hivm_ok=False, hivm_error=f"{name}: not found (pip install ascendnpu-ir)")
        return
    result["compiler"] = name
    result["compiler_version"] = compiler_version(compiler)
    result.update(compile_hivm(linalg, job["kernel"], compiler, job.get("arch", TARGET_ARCH)))


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
    lowered = [run_job(job) for job in jobs]
    # The compiler runs are separate processes: one per core at a time.
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(run_hivm, jobs, *zip(*lowered)))
    json.dump([result for result, _ in lowered], sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
