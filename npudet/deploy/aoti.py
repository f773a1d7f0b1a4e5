"""AOTInductor packages of models that call npudet's op, and the C++ runner that runs them.

``package`` exports a module (``torch.export``, dynamic shapes as the caller names them) and
compiles it into a ``.pt2`` package (``torch._inductor.aoti_compile_and_package``). A call of
``multi_scale_deformable_attn(..., impl="cpu")`` stays one ``npudet::msda_cpu_forward`` call
in the package: AOTInductor has no C shim for it, so the package calls it through the
dispatcher by its schema, which the operator library registers in C++ when it loads.

``build_runner`` compiles ``ops/aoti_runner/runner.cpp`` (``npudet_aoti_run``) against the
installed torch's libtorch, once per source, compiler and torch (``native_build``'s cache);
``run_package`` runs a package through it in a child process with a bare environment: the
runner and the operator libraries it loads link libtorch only, never libpython.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from npudet.ops.msda.backends import cpu_library
from npudet.ops.msda.kernels import native_build

RUNNER_SOURCE = "aoti_runner/runner.cpp"
RUNNER_NAME = "npudet_aoti_run"
# torch 2.13's headers need C++20 (bit-field initializers); cpp_extension builds with it too.
CXX_STD = "-std=c++20"


def package(
    module: torch.nn.Module,
    example_args: tuple,
    dynamic_shapes: Any,
    out_path: Path,
) -> Path:
    """Export ``module`` at ``example_args`` with ``dynamic_shapes`` (``torch.export``'s
    argument: a ``Dim`` per dynamic size) and compile it into the AOTInductor package
    ``out_path`` (``.pt2``); returns ``out_path``. The package takes the module's tensor
    arguments, flattened in order, and returns its tensor outputs."""
    program = torch.export.export(module, tuple(example_args), dynamic_shapes=dynamic_shapes)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(out_path)))


def torch_dirs() -> Dict[str, List[Path]]:
    """The installed torch's header folders and its library folder."""
    root = Path(torch.__file__).resolve().parent
    include = root / "include"
    return {"include": [include, include / "torch/csrc/api/include"], "lib": [root / "lib"]}


def runner_command(source: Path, out: Path) -> List[str]:
    """The compiler command that builds the runner ``out`` from ``source``: libtorch's
    headers, its libraries with an rpath to them, torch's C++ ABI, no Python."""
    dirs = torch_dirs()
    abi = int(torch.compiled_with_cxx11_abi())
    lib = dirs["lib"][0]
    return [
        native_build.compiler(),
        CXX_STD,
        "-O2",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *[f"-I{d}" for d in dirs["include"]],
        str(source),
        "-o",
        str(out),
        f"-L{lib}",
        f"-Wl,-rpath,{lib}",
        # --as-needed keeps only what the runner calls (libtorch_cpu, c10): no Python.
        "-Wl,--as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        "-ldl",
    ]


def _runner_dir(source: Path) -> Path:
    """The cache folder of the runner built from ``source`` here: keyed by the source,
    the compile command, the compiler's version and torch's."""
    digest = hashlib.sha256(source.read_bytes())
    for part in (
        *runner_command(source, Path(RUNNER_NAME)),
        native_build.compiler_version(),
        torch.__version__,
    ):
        digest.update(part.encode())
    return native_build.cache_root() / f"{RUNNER_NAME}-{digest.hexdigest()[:16]}"


def build_runner(build_dir: Optional[Path] = None, timeout: float = 600.0) -> Path:
    """The runner executable, built once into ``build_dir`` (default: a folder of the
    extension cache, ``native_build.cache_root()``, named by its key). RuntimeError with the
    compiler's first error when the build fails or no compiler is found."""
    missing = native_build.compiler_missing()
    if missing:
        raise RuntimeError(f"npudet_aoti_run cannot be built: {missing}")
    root = native_build.source_root([RUNNER_SOURCE])
    if root is None:
        raise RuntimeError(f"{RUNNER_SOURCE} not found under {native_build.SOURCE_ROOTS}")
    source = root / RUNNER_SOURCE
    build_dir = Path(build_dir) if build_dir is not None else _runner_dir(source)
    runner = build_dir / RUNNER_NAME
    if runner.is_file() and os.access(runner, os.X_OK):
        return runner
    build_dir.mkdir(parents=True, exist_ok=True)
    # Build under a name of this process's, then rename: a concurrent build or one cut
    # short never leaves a half-written runner under the final name.
    partial = build_dir / f"{RUNNER_NAME}.{os.getpid()}.partial"
    done = subprocess.run(
        runner_command(source, partial), capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        why = native_build.first_error(done.stderr) or f"exit {done.returncode}"
        raise RuntimeError(f"building npudet_aoti_run failed: {why}")
    partial.replace(runner)
    return runner


def operator_libraries() -> List[Path]:
    """The operator libraries a package of npudet's ``cpu`` op needs: the ``cpu`` kernel's
    build for this CPU (``cpu_library.require()``; its autograd library is not needed)."""
    return [cpu_library.require()]


def linked_libraries(path: Path) -> List[str]:
    """The shared libraries ``path`` (an executable or a library) names as NEEDED
    (``readelf -d``), e.g. ``["libtorch_cpu.so", "libc10.so", ...]``."""
    done = subprocess.run(
        ["readelf", "-d", str(path)], capture_output=True, text=True, check=True, timeout=60
    )
    return [
        line.split("[", 1)[1].rstrip("]").strip()
        for line in done.stdout.splitlines()
        if "(NEEDED)" in line
    ]


def _bare_env() -> Dict[str, str]:
    """The runner's environment: a PATH and the thread and temp settings, nothing of
    Python's (no PYTHONPATH, no virtual environment)."""
    keep = ("TMPDIR", "OMP_NUM_THREADS")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    env.update({k: os.environ[k] for k in keep if k in os.environ})
    return env


def run_package(
    pt2: Path,
    inputs: Sequence[torch.Tensor],
    libraries: Optional[Sequence[Path]] = None,
    runner: Optional[Path] = None,
    timeout: float = 600.0,
) -> List[torch.Tensor]:
    """Run package ``pt2`` on ``inputs`` (the packaged module's tensor arguments, in order,
    on the CPU) through the C++ runner, and return its outputs (e.g. one tensor
    (bs, num_queries, heads * D) for the op). ``libraries`` are loaded first (default:
    ``operator_libraries()``); ``runner`` defaults to ``build_runner()``. RuntimeError with
    the runner's message when it fails."""
    libraries = operator_libraries() if libraries is None else libraries
    runner = build_runner() if runner is None else runner
    with tempfile.TemporaryDirectory(prefix="npudet_aoti_") as tmp:
        in_path, out_path = Path(tmp) / "inputs.pt", Path(tmp) / "outputs.pt"
        torch.save([t.detach().contiguous() for t in inputs], in_path)
        # Absolute paths: the runner works in the temporary folder.
        command = [str(Path(runner).resolve())]
        for library in libraries:
            command += ["--load-library", str(Path(library).resolve())]
        command += [str(Path(pt2).resolve()), str(in_path), str(out_path)]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=_bare_env(), cwd=tmp
        )
        if done.returncode != 0:
            why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            raise RuntimeError(f"npudet_aoti_run failed: {why[0][:500]}")
        return list(torch.load(out_path, weights_only=True))
