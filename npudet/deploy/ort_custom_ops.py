"""npudet's ONNX Runtime custom-op library (``ops/onnxruntime/``): the fused MSDA node on the
``cpu`` kernel, built on first use.

``ort_library()`` returns the ``.so`` a user registers::

    import onnxruntime as ort
    from npudet.deploy import ort_library

    options = ort.SessionOptions()
    options.register_custom_ops_library(str(ort_library()))
    session = ort.InferenceSession("model.onnx", options)

It runs ``npudet::MultiScaleDeformableAttn`` and ``mmdeploy::MMCVMultiScaleDeformableAttention``
nodes (``onnx_nodes``). The library is compiled from ``msda_ort.cpp`` and the kernel's own
``msda_cpu.cpp`` (the instruction-set variant ``cpu_isa`` picks here, the default
``CPUKernelOptions``), against ORT's headers (``ort_headers``) and the installed torch's
libtorch, with an rpath to it: an ORT process needs torch's wheel but never Python.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any, List, Optional, Sequence

import torch

from npudet.ops.msda.backends import cpu_isa
from npudet.ops.msda.backends.cpu_options import CPUKernelOptions
from npudet.ops.msda.kernels import native_build

from . import ort_headers
from .aoti import CXX_STD, torch_dirs

SOURCES = ["onnxruntime/msda_ort.cpp", "msda_cpu/msda_cpu.cpp"]
NAME = "npudet_msda_ort"

_built: dict = {}


def compile_flags(march: str) -> List[str]:
    """The compiler flags of a build for ``-march`` level ``march``, without paths: the
    kernel's (``native_build.FLAGS``), a shared object exporting only ORT's entry point,
    and the default kernel options compiled in."""
    options = ",".join(str(v) for v in CPUKernelOptions().as_ints())
    abi = int(torch.compiled_with_cxx11_abi())
    return [
        CXX_STD,
        *native_build.FLAGS,
        march,
        "-fPIC",
        "-shared",
        # Only RegisterCustomOps is exported; -Bsymbolic binds the library's own copy of the
        # kernel even when the torch operator library (same symbols) is loaded in the process.
        "-fvisibility=hidden",
        "-Wl,-Bsymbolic",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-DNPUDET_ORT_KERNEL_OPTIONS={{{options}}}",
    ]


def build_command(sources: Sequence[Path], headers: Path, march: str, out: Path) -> List[str]:
    """The compiler command that builds the library ``out`` from ``sources``."""
    dirs = torch_dirs()
    lib = dirs["lib"][0]
    includes = [headers, *{s.parent for s in sources}, *dirs["include"]]
    return [
        native_build.compiler(),
        *compile_flags(march),
        *[f"-I{d}" for d in includes],
        *[str(s) for s in sources],
        "-o",
        str(out),
        f"-L{lib}",
        f"-Wl,-rpath,{lib}",
        *native_build.LDFLAGS,
        "-ltorch_cpu",
        "-lc10",
    ]


def build_dir(sources: Sequence[Path], headers: Path, march: str) -> Path:
    """The cache folder of the build from ``sources`` for ``march`` against ``headers``:
    ``native_build.cache_dir``'s key (the sources and their folders' headers, the flags, the
    compiler, torch) plus ORT's C API header."""
    api = hashlib.sha256((headers / "onnxruntime_c_api.h").read_bytes()).hexdigest()
    native = march == cpu_isa.NATIVE.march  # a build for this CPU only: keyed by it
    return native_build.cache_dir(NAME, list(sources), [*compile_flags(march), api], native)


def _variant_march() -> str:
    variants = cpu_isa.candidates()
    if isinstance(variants, str):
        raise RuntimeError(f"npudet's ORT library cannot be built: {variants}")
    return variants[0].march


def ort_library(timeout: float = 900.0, march: Optional[str] = None) -> Path:
    """The custom-op library's path, built on the first call (about a minute) into the
    extension cache. ``march`` defaults to the ``cpu`` kernel's variant for this CPU.
    RuntimeError with the compiler's first error, a missing compiler or missing headers."""
    march = march or _variant_march()
    if march in _built:
        return _built[march]
    missing = native_build.compiler_missing()
    if missing:
        raise RuntimeError(f"npudet's ORT library cannot be built: {missing}")
    root = native_build.source_root(SOURCES)
    if root is None:
        raise RuntimeError(f"{SOURCES} not found under {native_build.SOURCE_ROOTS}")
    sources = [root / rel for rel in SOURCES]
    headers = ort_headers.headers_dir()
    folder = build_dir(sources, headers, march)
    library = folder / f"{NAME}.so"
    if not library.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        # Built under a name of this process's, then renamed: a concurrent build or one cut
        # short never leaves a half-written library under the final name.
        partial = folder / f"{NAME}.{os.getpid()}.partial.so"
        done = subprocess.run(
            build_command(sources, headers, march, partial),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            why = native_build.first_error(done.stderr) or f"exit {done.returncode}"
            raise RuntimeError(f"building npudet's ORT library failed: {why}")
        partial.replace(library)
    _built[march] = library
    return library


def ort_session(
    path: Path, threads: Optional[int], library: Optional[Path], options: Any = None
) -> Any:
    """An ONNX Runtime CPU session of ``path`` with ``threads`` intra-op threads (None: ONNX
    Runtime's default; given, inter-op 1) and the custom-op ``library`` registered if given,
    on ``options`` (default: fresh ones)."""
    import onnxruntime as ort

    options = options or ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
