"""Which instruction-set build of the CPU kernel to load: chosen at run time, as ATen does.

The kernel is compiled per variant (one ``-march`` level each, a distinct extension name
and build folder) and only the chosen variant is built, on first use:

==========  ===============================  ==========================================
variant     compiler flag                    CPU features needed (/proc/cpuinfo names)
==========  ===============================  ==========================================
avx512      ``-march=x86-64-v4``             x86-64-v3 + avx512f/bw/cd/dq/vl
avx2        ``-march=x86-64-v3``             x86-64-v2 + avx avx2 bmi1 bmi2 f16c fma
                                             abm (lzcnt) movbe xsave
baseline    ``-march=x86-64-v2`` (x86-64),   cx16 lahf_lm popcnt pni (sse3) ssse3
            ``-march=armv8-a`` (aarch64)     sse4_1 sse4_2; nothing on aarch64
native      ``-march=native`` (opt-in only)  the CPU it was built on
==========  ===============================  ==========================================

The features come from the kernel's flags in ``/proc/cpuinfo``: they are exactly what
each ``-march`` level lets the compiler emit, and the kernel clears a flag the operating
system cannot save (AVX-512 state), as a hypervisor hides one it does not pass through.
``torch.backends.cpu.get_cpu_capability()`` is used only where ``/proc/cpuinfo`` is
absent: it answers a different question (which of ATen's own kernels to run), drops to
AVX2 when ``ATEN_CPU_CAPABILITY`` says so (which would tie this kernel to a setting made
for ATen's), and does not check the BMI, MOVBE and LZCNT instructions x86-64-v3 code uses.

``NPUDET_CPU_ISA=auto|baseline|avx2|avx512|native`` forces a variant; one the CPU cannot
run is refused, naming the variable.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Tuple, Union

ENV = "NPUDET_CPU_ISA"

_V2 = ("cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2")
_V3 = (*_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_V4 = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")


@dataclass(frozen=True)
class ISAVariant:
    """One build of the kernel: its name, the ``-march`` flag and the CPU features it needs."""

    name: str
    march: str
    features: Tuple[str, ...] = ()

    @property
    def cpu_specific(self) -> bool:
        """Whether a build is tied to the CPU it was made on (its cache key names the CPU)."""
        return self.name == "native"


NATIVE = ISAVariant("native", "-march=native")
# Per architecture, best first; the last is the portable baseline.
VARIANTS = {
    "x86_64": (
        ISAVariant("avx512", "-march=x86-64-v4", _V4),
        ISAVariant("avx2", "-march=x86-64-v3", _V3),
        ISAVariant("baseline", "-march=x86-64-v2", _V2),
    ),
    "aarch64": (ISAVariant("baseline", "-march=armv8-a"),),
}
_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}
_ATEN_LEVELS = {"AVX512": "avx512", "AVX2": "avx2"}


def machine() -> str:
    """This CPU's architecture, normalised (``x86_64``, ``aarch64``, ...)."""
    arch = platform.machine().lower()
    return _ALIASES.get(arch, arch)


def cpu_flags() -> Optional[FrozenSet[str]]:
    """The CPU's feature flags from ``/proc/cpuinfo``, or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def _runnable_by_aten(arch: str) -> List[ISAVariant]:
    """Variants runnable by ATen's capability (no ``/proc/cpuinfo``: macOS, Windows)."""
    import torch

    level = _ATEN_LEVELS.get(torch.backends.cpu.get_cpu_capability(), "baseline")
    names = [v.name for v in VARIANTS[arch]]
    return list(VARIANTS[arch][names.index(level) :])


def runnable(
    arch: Optional[str] = None, flags: Optional[FrozenSet[str]] = None
) -> List[ISAVariant]:
    """The variants (``native`` excluded) this CPU can run, best first.

    ``arch`` and ``flags`` default to this machine's; pass them to ask about another CPU.
    """
    arch = arch or machine()
    if arch not in VARIANTS:
        return []
    if flags is None:
        flags = cpu_flags()
        if flags is None:
            return _runnable_by_aten(arch)
    return [v for v in VARIANTS[arch] if set(v.features) <= flags]


def requested() -> str:
    """The variant asked for by ``NPUDET_CPU_ISA`` (``auto`` when unset or empty)."""
    return os.environ.get(ENV, "").strip().lower() or "auto"


def candidates(
    request: Optional[str] = None,
    arch: Optional[str] = None,
    flags: Optional[FrozenSet[str]] = None,
) -> Union[List[ISAVariant], str]:
    """The variants to try building, in order, or why none may be built (a string).

    ``request`` defaults to ``NPUDET_CPU_ISA``: ``auto`` gives every runnable variant best
    first (a variant the compiler cannot build falls back to the next); a named one gives
    only that variant, or a refusal naming the variable if this CPU cannot run it.
    """
    request = requested() if request is None else request.strip().lower()
    arch = arch or machine()
    ok = runnable(arch, flags)
    known = ["auto", *(v.name for v in VARIANTS.get(arch, ())), NATIVE.name]
    if request == "auto":
        if ok:
            return ok
        return f"no portable CPU kernel build for {arch!r}; set {ENV}=native to build for this CPU"
    if request == NATIVE.name:
        return [NATIVE]
    if request not in known:
        return f"{ENV}={request!r}: expected one of {known}"
    variant = next(v for v in VARIANTS[arch] if v.name == request)
    if variant in ok:
        return [variant]
    lacking = sorted(set(variant.features) - (flags if flags is not None else cpu_flags() or set()))
    runs = [v.name for v in ok] + [NATIVE.name]
    return (
        f"{ENV}={request!r} needs {variant.march} CPU features this CPU lacks "
        f"({', '.join(lacking) or 'not reported'}); unset {ENV} or choose one of {runs}"
    )
