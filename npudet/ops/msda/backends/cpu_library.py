"""The ``cpu`` implementation's native libraries (``ops/msda_cpu/``), loaded once per process,
and the Python side of their operators.

Two libraries, built on first use (``kernels.native_build``):

* the operators, ``npudet_msda_cpu_<isa>``: ``npudet::msda_cpu_forward`` / ``_backward``
  with their schemas, CPU and Meta kernels, and the tools' probes
  (``msda_cpu_ops.cpp`` + ``msda_cpu.cpp``), one build per instruction set chosen at run
  time (``cpu_isa``; ``NPUDET_CPU_ISA`` forces one). It links libtorch only: a C++ program
  (an AOTInductor package's runner) loads the same build;
* their autograd, ``npudet_msda_cpu_autograd`` (``msda_cpu_autograd.cpp``): a C++ node, so
  a training call is one dispatcher call. It uses torch's internal autograd headers; if it
  cannot be built, a Python ``autograd.Function`` is registered as the Autograd kernel instead
  (same results, more host time per call) and one warning says so.

Forward-mode AD raises and gradients are differentiable once only, on both autograd routes.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch

from ..kernels.native_build import load_library
from . import cpu_isa
from .first_order import first_order

# NPUDET_CPU_SANITIZE=1 builds the libraries with AddressSanitizer and UndefinedBehaviorSanitizer
# (builds of their own). Python is not built with them: the process must start with the ASan
# runtime preloaded, as dev/tools/sanitize_cpu.sh does.
SANITIZE_ENV = "NPUDET_CPU_SANITIZE"
SANITIZE_FLAGS = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer",
    "-g",
]
OPS_SOURCES = ["msda_cpu/msda_cpu_ops.cpp", "msda_cpu/msda_cpu.cpp"]
AUTOGRAD_SOURCES = ["msda_cpu/msda_cpu_autograd.cpp"]
# The files that shape a build besides the sources: records of a verification expire with them.
BUILD_FILES = ("backends/cpu_isa.py", "backends/cpu_library.py", "kernels/native_build.py")
STRATEGIES = ("private", "owner", "atomic")  # msda_cpu.h's backward_plan codes

# What was loaded, once per process: "isa" (a cpu_isa variant name), "library" (its path, or
# why no variant could be loaded), "sanitized", "autograd" ("C++ node" or "Python (why)").
_state: Dict[str, object] = {}


def sanitize_requested() -> Union[bool, str]:
    """Whether ``NPUDET_CPU_SANITIZE`` asks for the sanitized builds (``1``; unset or ``0``:
    not), or why its value is refused (a string): a typo must not switch to the slow build."""
    value = os.environ.get(SANITIZE_ENV, "").strip()
    if value not in ("", "0", "1"):
        return f"{SANITIZE_ENV}={value!r}: expected 1 (sanitized builds) or 0 / unset"
    return value == "1"


class _MSDACpuFunction(torch.autograd.Function):
    """The Autograd kernel used when the C++ node cannot be built: the op below autograd in
    forward, ``msda_cpu_backward`` in backward. No ``jvp``: forward-mode AD raises."""

    @staticmethod
    def forward(ctx, value, spatial_shapes, level_start_index, loc, attn, options):
        with torch._C._AutoDispatchBelowAutograd():
            out = forward_op()(value, spatial_shapes, level_start_index, loc, attn, options)
        ctx.save_for_backward(value, spatial_shapes, level_start_index, loc, attn)
        ctx.options = options
        return out

    @staticmethod
    def backward(ctx, grad_output):
        args = (grad_output, *ctx.saved_tensors, ctx.options)
        grads = first_order("npudet::msda_cpu_backward", backward_op(), *args)
        return grads[0], None, None, grads[1], grads[2], None


# Holds the Python Autograd registration for the life of the process (dropping a Library
# object removes what it registered).
_python_autograd: List[torch.library.Library] = []


def _register_python_autograd() -> None:
    lib = torch.library.Library("npudet", "IMPL")
    lib.impl("msda_cpu_forward", _MSDACpuFunction.apply, "Autograd")
    _python_autograd.append(lib)


def _load_autograd(suffix: str, flags: List[str]) -> None:
    built = load_library(
        f"npudet_msda_cpu_autograd{suffix}",
        AUTOGRAD_SOURCES,
        flags,
        extra_ldflags=flags,
        what="the cpu MSDA kernel's C++ autograd node",
    )
    if isinstance(built, Path):
        _state["autograd"] = "C++ node"
        return
    _register_python_autograd()
    _state["autograd"] = f"Python ({built})"
    warnings.warn(
        f"npudet: the cpu MSDA kernel's C++ autograd node is unavailable ({built}); its "
        "gradients come from a Python autograd.Function instead (same results, more host "
        "time per training call)",
        stacklevel=3,
    )


def load() -> Union[Path, str]:
    """The loaded operator library's path, or why none could be loaded (a string).

    Only the chosen instruction-set variant is built; under ``auto`` one the compiler cannot
    build falls back to the next best. The autograd library is loaded right after.
    """
    if "library" in _state:
        return _state["library"]
    variants = cpu_isa.candidates()
    if isinstance(variants, str):
        _state["library"] = variants
        return variants
    sanitize = sanitize_requested()
    if isinstance(sanitize, str):
        _state["library"] = sanitize
        return sanitize
    suffix, flags = ("_sanitized", SANITIZE_FLAGS) if sanitize else ("", [])
    failures = []
    for variant in variants:
        built = load_library(
            f"npudet_msda_cpu_{variant.name}{suffix}",
            OPS_SOURCES,
            [variant.march, *flags],
            cpu_specific=variant.cpu_specific,
            extra_ldflags=flags,
            what=f"the cpu MSDA kernel ({variant.name})",
        )
        if isinstance(built, Path):
            _state.update(isa=variant.name, library=built, sanitized=bool(flags))
            _load_autograd(suffix, flags)
            return built
        failures.append(built)
    _state["library"] = "; ".join(failures)
    return _state["library"]


def unavailable_reason() -> Optional[str]:
    """Why the kernel cannot be used in this process (building it if needed), or None."""
    loaded = load()
    return loaded if isinstance(loaded, str) else None


def require() -> Path:
    """The loaded operator library's path; RuntimeError saying why when it is unavailable."""
    loaded = load()
    if isinstance(loaded, str):
        raise RuntimeError(f"npudet cpu MSDA kernel unavailable: {loaded}")
    return loaded


def isa() -> Optional[str]:
    """The instruction-set variant loaded (``baseline``, ``avx2``, ``avx512`` or ``native``,
    see ``cpu_isa``), building it if needed; None when the kernel is unavailable."""
    load()
    return _state.get("isa")


def sanitized() -> bool:
    """Whether the loaded libraries are the sanitized builds."""
    load()
    return bool(_state.get("sanitized"))


def autograd() -> Optional[str]:
    """Which autograd kernel the ops have: ``"C++ node"`` or ``"Python (<why>)"``; None when
    the kernel is unavailable."""
    load()
    return _state.get("autograd")


def forward_op() -> torch._ops.OpOverload:
    """``npudet::msda_cpu_forward``: value (bs, keys, heads, D), spatial_shapes,
    level_start_index, sampling_locations, attention_weights, ``options``
    (``CPUKernelOptions.as_ints()``) -> (bs, num_queries, heads * D) of value's dtype."""
    require()
    return torch.ops.npudet.msda_cpu_forward.default


def backward_op() -> torch._ops.OpOverload:
    """``npudet::msda_cpu_backward``: grad_output (bs, num_queries, heads * D), the forward's
    six arguments -> the gradients of value, sampling_locations and attention_weights."""
    require()
    return torch.ops.npudet.msda_cpu_backward.default


def num_options() -> int:
    """How many ints the kernel's ``options`` hold."""
    require()
    return torch.ops.npudet._msda_cpu_num_options()


def backward_plan(
    batch: int, keys: int, heads: int, dim: int, queries: int, elem_bytes: int, options: List[int]
) -> Tuple[str, int, int]:
    """The backward strategy ``options`` resolve to for these sizes on this process's
    threads: (``private``, ``owner`` or ``atomic``, ownership chunks, bytes of private
    grad_value copies)."""
    require()
    code, chunks, extra = torch.ops.npudet._msda_cpu_backward_plan(
        batch, keys, heads, dim, queries, elem_bytes, options
    )
    return STRATEGIES[code], chunks, extra


def gather_probe(
    rows: torch.Tensor,
    top_left: torch.Tensor,
    corners: torch.Tensor,
    row_step: torch.Tensor,
    x_step: int,
    grain: int,
) -> torch.Tensor:
    """The kernel's row-load probe (``msda_cpu.h``): rows (num_rows, D) float32, top_left
    (N, S) int32, corners (N, S) uint8, row_step (S,) int64 -> (N, D)."""
    require()
    return torch.ops.npudet._msda_cpu_gather_probe(rows, top_left, corners, row_step, x_step, grain)
