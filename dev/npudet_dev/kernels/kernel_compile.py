"""Compile planned Triton launches to CUDA cubins without a GPU and read their resources.

``triton.compile`` targets any ``GPUTarget("cuda", arch, 32)`` on a machine without a
GPU or driver; the register, stack and shared-memory figures come from the
``cuobjdump --dump-resource-usage`` that triton bundles (the metadata only has them once a
driver has loaded the kernel). The kernels compiled are those of
:func:`triton_launch.plan_launches`, so the figures are those of what the custom ops launch.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from npudet.ops.msda import kernels
from npudet.ops.msda.kernels import CUDA_TARGETS
from npudet.ops.msda.kernels.triton_launch import KernelLaunch, MSDAShape, plan_launches

_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


@dataclass(frozen=True)
class CudaCompileResult:
    """What compiling one launch for one CUDA target gave.

    ``stack_bytes`` is the per-thread stack frame: register spills (the kernels keep no
    local arrays, so a non-zero frame is spilled registers).
    """

    compiled: bool
    error: Optional[str] = None
    registers: Optional[int] = None
    stack_bytes: Optional[int] = None
    local_bytes: Optional[int] = None
    shared_bytes: Optional[int] = None


# npudet/ops/msda/kernels, and the folders npudet and npudet_dev are imported from.
KERNELS = Path(kernels.__file__).resolve().parent
IMPORT_ROOTS = (KERNELS.parents[3], Path(__file__).resolve().parents[2])


def module_path(module: str) -> str:
    """File of ``npudet.ops.msda.kernels.<module>``."""
    return str(KERNELS / f"{module}.py")


def lowering_job(tag: str, launch: KernelLaunch, **extra: object) -> Dict[str, object]:
    """One job of ``ascend_lowering.py`` (its stdin: a JSON list of them) for ``launch``;
    ``extra``: its options (``hivm``, ``compiler``, ``arch``)."""
    return dict(
        tag=tag,
        module_path=module_path(launch.module),
        kernel=launch.kernel,
        signature=launch.signature,
        constexprs=launch.constexprs,
        grid=list(launch.grid),
        **extra,
    )


@functools.cache
def compiled_module(path: str) -> ModuleType:
    """The kernel module at ``path`` loaded so its kernels compile, never interpreted.

    A process that set ``TRITON_INTERPRET=1`` (the tests) holds interpreted kernels in
    ``npudet.ops.msda``; this loads a second copy with the interpreter switched off
    while ``triton.jit`` decorates it.
    """
    import triton

    name = f"{__package__}._compiled_{os.path.splitext(os.path.basename(path))[0]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"path: expected a Python file of Triton kernels, got {path!r}")
    module = importlib.util.module_from_spec(spec)
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = False
        sys.modules[name] = module  # jit resolves the kernels' globals through the module
        spec.loader.exec_module(module)
    return module


def _cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resource_usage(cubin: bytes, kernel: str) -> Tuple[int, int, int, int]:
    """(registers, stack, shared, local bytes) of ``kernel`` in ``cubin``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [_cuobjdump(), "--dump-resource-usage", f.name],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    # " Function <name>:" then its "  REG:.. STACK:.. SHARED:.. LOCAL:.." line.
    function = None
    for line in text.splitlines():
        if line.strip().startswith("Function "):
            function = line.strip()[len("Function ") :].rstrip(":")
        found = _USAGE.search(line)
        if found and function == kernel:
            reg, stack, shared, local = (int(v) for v in found.groups())
            return reg, stack, shared, local
    raise RuntimeError(f"cuobjdump printed no resource usage for {kernel}:\n{text}")


def stdlib_interpreted() -> bool:
    """Whether this process imported triton with ``TRITON_INTERPRET=1``.

    Then ``triton.language``'s own jit functions (``tl.cdiv``, the reductions' combine
    functions) are interpreted too, and no kernel calling them compiles here.
    """
    import triton.language.standard as standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.cdiv, InterpretedFunction)


Job = Tuple[KernelLaunch, int, Optional[str]]  # (launch, sm arch, kernel file or None)


def compile_cuda(
    launch: KernelLaunch, arch: int, path: Optional[str] = None, want_ir: bool = False
) -> Tuple[CudaCompileResult, Dict[str, str]]:
    """Compile ``launch`` for sm_``arch``: its result and, with ``want_ir``, the IR text
    (ttir, llir, ptx).

    ``path`` compiles the kernel of another file with the same name (default: the module of
    the launch). Pointers are assumed 16-byte aligned, as torch allocates them (the
    specialisation Triton's launcher picks for such tensors).
    """
    return compile_many([(launch, arch, path)], want_ir)[0]


def compile_many(
    jobs: Sequence[Job], want_ir: bool = False
) -> List[Tuple[CudaCompileResult, Dict[str, str]]]:
    """:func:`compile_cuda` of each job; in a child process when this one interprets."""
    if not stdlib_interpreted():
        return [_compile_here(launch, arch, path, want_ir) for launch, arch, path in jobs]
    request = dict(
        jobs=[dict(launch=asdict(launch), arch=arch, path=path) for launch, arch, path in jobs],
        want_ir=want_ir,
    )
    roots = [str(root) for root in IMPORT_ROOTS]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (*roots, env.get("PYTHONPATH"))))
    with tempfile.TemporaryDirectory() as tmp:
        answer = os.path.join(tmp, "answer.json")
        subprocess.run(
            [sys.executable, "-m", __name__, answer],
            input=json.dumps(request),
            text=True,
            env=env,
            check=True,
        )
        with open(answer) as f:
            return [(CudaCompileResult(**r), ir) for r, ir in json.load(f)]


def _compile_here(
    launch: KernelLaunch, arch: int, path: Optional[str], want_ir: bool
) -> Tuple[CudaCompileResult, Dict[str, str]]:
    import triton
    from triton.backends.compiler import GPUTarget

    module = compiled_module(path or module_path(launch.module))
    fn = getattr(module, launch.kernel)
    names = list(fn.arg_names)
    signature = {n: launch.signature.get(n, "constexpr") for n in names}
    missing = [n for n in names if n not in launch.signature and n not in launch.constexprs]
    if missing:
        raise ValueError(
            f"launch: {launch.kernel} arguments {missing} are neither typed nor constexpr"
        )
    constexprs = {(names.index(n),): v for n, v in launch.constexprs.items()}
    attrs = {
        (i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if signature[n].startswith("*")
    }
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    try:
        k = triton.compile(
            src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=launch.num_warps)
        )
    except Exception as exc:  # a compiler error is a result of the check, not a crash
        return CudaCompileResult(False, error=f"{type(exc).__name__}: {exc}"[:2000]), {}
    reg, stack, shared, local = resource_usage(k.asm["cubin"], launch.kernel)
    # Dynamic shared memory Triton asks for at launch, beside any static in the cubin.
    shared = max(shared, int(getattr(k.metadata, "shared", 0) or 0))
    ir = {key: k.asm[key] for key in ("ttir", "llir", "ptx") if want_ir and key in k.asm}
    return CudaCompileResult(True, None, reg, stack, local, shared), ir


# The benchmark cases, plus two odd shapes: head_dim 3 (a 4-wide tile, masked lanes) and
# head_dim 257 (a 512-wide tile, one sample a chunk), both over 5 levels.
_ODD_LEVELS = ((13, 17), (7, 9), (4, 5), (2, 3), (1, 1))
_ODD_KEYS = sum(h * w for h, w in _ODD_LEVELS)
ODD_SHAPES: Dict[str, MSDAShape] = {
    "odd-d3": MSDAShape(2, _ODD_KEYS, 77, 2, 3, len(_ODD_LEVELS), 3),
    "odd-d257": MSDAShape(2, _ODD_KEYS, 77, 2, 257, len(_ODD_LEVELS), 3),
}
CUDA_DTYPES = ("float32", "float16", "bfloat16", "float64")


def check_shapes(cases: Mapping[str, MSDAShape]) -> Dict[str, MSDAShape]:
    """Case name -> shape: ``cases`` (the benchmark's,
    ``npudet.benchmark.cases.launch_shapes()``) and :data:`ODD_SHAPES`."""
    return {**cases, **ODD_SHAPES}


def launch_key(launch: KernelLaunch) -> str:
    """What a compiled kernel depends on (the grid does not change the code)."""
    return json.dumps(
        [launch.module, launch.kernel, launch.signature, launch.constexprs, launch.num_warps],
        sort_keys=True,
    )


def check_cuda(
    shapes: Mapping[str, MSDAShape],
    targets: Sequence[str] = tuple(CUDA_TARGETS),
    dtypes: Sequence[str] = CUDA_DTYPES,
) -> List[Dict[str, object]]:
    """Compile the ``cuda`` schedule's launches of every shape x dtype for every target.

    Identical launches compile once. Returns one row per (kernel, target, dtype, case):
    ``kernel, target, dtype, case, num_warps, constexprs, why`` and the fields of
    :class:`CudaCompileResult`.
    """
    for target in targets:
        if target not in CUDA_TARGETS:
            raise ValueError(f"targets: expected some of {sorted(CUDA_TARGETS)}, got {target!r}")
    planned = [
        (target, dtype, case, launch)
        for target in targets
        for dtype in dtypes
        for case, shape in shapes.items()
        for launch in plan_launches("cuda", dtype, shape).values()
    ]
    jobs: Dict[Tuple[str, str], Job] = {}
    for target, _, _, launch in planned:
        jobs.setdefault((launch_key(launch), target), (launch, CUDA_TARGETS[target], None))
    results = dict(zip(jobs, (r for r, _ in compile_many(list(jobs.values())))))
    return [
        dict(
            kernel=launch.kernel,
            target=target,
            dtype=dtype,
            case=case,
            num_warps=launch.num_warps,
            constexprs=launch.constexprs,
            why=launch.why,
            **asdict(results[(launch_key(launch), target)]),
        )
        for target, dtype, case, launch in planned
    ]


def _serve(answer_path: str) -> None:
    """Child process of :func:`compile_many`: jobs as JSON on stdin, answers to a file."""
    request = json.load(sys.stdin)
    jobs = [
        (KernelLaunch(**{**j["launch"], "grid": tuple(j["launch"]["grid"])}), j["arch"], j["path"])
        for j in request["jobs"]
    ]
    answers = compile_many(jobs, request["want_ir"])
    with open(answer_path, "w") as f:
        json.dump([(asdict(r), ir) for r, ir in answers], f)


if __name__ == "__main__":
    _serve(sys.argv[1])
