"""Registry of MSDA implementations (xformers style) and the one check of an impl name.

Each implementation states why it cannot run on this machine (``unavailable_reasons``)
and why it cannot take a given call (``not_supported_reasons``); ``auto`` (``auto.py``)
chooses among them. Experiment variants (``register_variant``: the ``cpu`` kernel with one
design choice changed) have names of their own, listed by ``msda_variants()`` and not by
``msda_impls()``; ``auto`` never takes them, but ``get_impl``, ``impl=`` and the benchmark
and ablation tools accept their names. ``check_impl_name`` is where every layer, config
key and command line validates a name.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch

from npudet.utils.torch_compat import assume_constant_result

from . import call_plan
from .call_plan import Kernel
from .inputs import MSDAInputs


class MSDAImpl:
    """One MSDA implementation. Subclasses set the class attributes and ``forward``."""

    NAME: str = ""
    DEVICES: Sequence[str] = ()
    DTYPES: Sequence[torch.dtype] = (torch.float32, torch.float64)
    MAX_HEAD_DIM: int = 1 << 30
    # Device types on which forward and backward give bitwise-identical results run to run
    # (at a fixed thread count): what torch.use_deterministic_algorithms(True) asks for.
    # None by default: atomic adds (mmcv, triton) or an undocumented vendor kernel.
    DETERMINISTIC: Sequence[str] = ()
    # Files it runs besides the modules of its classes (subclasses add theirs: every class
    # of the MRO counts), hashed into the key of a recorded verification (verification.records).
    # Paths relative to the ``npudet/ops/msda`` package; ``native:PATH`` is relative to the
    # native source root (the top-level ``ops/``); a trailing ``/`` takes every file of that
    # folder; ``env:NAME`` is the file the environment variable names (a library built on
    # the machine).
    SOURCES: Tuple[str, ...] = ()
    # Whether ``forward`` takes ``level_shapes=`` (the (H, W) pairs, when the caller gave
    # them): an implementation that reads the level shapes on the host uses them instead of
    # reading ``spatial_shapes``, which a tracer could only see as data (``levels``).
    TAKES_LEVEL_SHAPES: bool = False

    def unavailable_reasons(self) -> List[str]:
        """Why this implementation cannot run on this machine at all ([] if it can)."""
        return []

    def not_supported_reasons(self, inputs: MSDAInputs) -> List[str]:
        """Why this implementation cannot take a call with these inputs ([] if it can)."""
        reasons = list(_unavailable(self.NAME))
        if inputs.device_type not in self.DEVICES:
            reasons.append(f"device {inputs.device_type!r} not in {list(self.DEVICES)}")
        if inputs.dtype not in self.DTYPES:
            names = [str(d).replace("torch.", "") for d in self.DTYPES]
            reasons.append(f"dtype {inputs.dtype} not in {names}")
        if inputs.head_dim > self.MAX_HEAD_DIM:
            reasons.append(f"head_dim {inputs.head_dim} > {self.MAX_HEAD_DIM}")
        return reasons

    def forward(
        self,
        value: torch.Tensor,
        spatial_shapes: torch.Tensor,
        level_start_index: torch.Tensor,
        sampling_locations: torch.Tensor,
        attention_weights: torch.Tensor,
    ) -> torch.Tensor:
        """(bs, num_keys, heads, D), ... -> (bs, num_queries, heads * D)."""
        raise NotImplementedError

    def build_info(self) -> str:
        """What build of this implementation runs here, for the log (e.g. the CPU kernel's
        instruction-set variant); empty when there is nothing to say."""
        return ""

    def build_key(self) -> Optional[str]:
        """What build of the kernel this machine runs, when a verification holds only for
        it (the ``cpu`` kernel's instruction-set variant); None when the sources say all."""
        return None

    def bind(self, inputs: MSDAInputs) -> Kernel:
        """``forward`` for calls of ``inputs``' signature, with whatever can be decided from
        it decided now (kernel options, launch plans): what a steady-state call runs."""
        return self.forward


_REGISTRY: Dict[str, MSDAImpl] = {}
_VARIANTS: Set[str] = set()


@assume_constant_result
def _unavailable(name: str) -> tuple:
    """``unavailable_reasons`` of a registered name; a constant to ``torch.compile``."""
    return tuple(_REGISTRY[name].unavailable_reasons())


def register(impl: MSDAImpl) -> MSDAImpl:
    """Add an implementation under ``impl.NAME`` (replacing one of the same name)."""
    if not impl.NAME:
        raise ValueError("impl.NAME: expected a non-empty name")
    _REGISTRY[impl.NAME] = impl
    _VARIANTS.discard(impl.NAME)
    call_plan.clear()
    return impl


def register_variant(impl: MSDAImpl) -> MSDAImpl:
    """Add an experiment variant: selectable by name, never listed by ``msda_impls()``."""
    register(impl)
    _VARIANTS.add(impl.NAME)
    return impl


def get_impl(name: str) -> MSDAImpl:
    """The registered implementation or experiment variant called ``name``."""
    if name not in _REGISTRY:
        raise ValueError(_unknown(name, "impl"))
    return _REGISTRY[name]


def _unknown(name: object, argument: str) -> str:
    public = sorted(set(_REGISTRY) - _VARIANTS)
    return (
        f"{argument}: unknown MSDA implementation {name!r}; expected 'auto' or one of "
        f"{public} (experiment variants: {sorted(_VARIANTS)})"
    )


def check_impl_name(name: object, argument: str = "impl") -> str:
    """``name`` if it is ``"auto"`` or a registered implementation or variant usable on this
    machine; else ``ValueError`` naming ``argument`` (a config key, an option) and the
    choices. The one check of an implementation name: layers, config keys and command-line
    options all come here (``multi_scale_deformable_attn`` resolves names with
    ``auto.select_impl``, which also says why a usable one cannot take a call)."""
    if not isinstance(name, str):
        raise ValueError(f"{argument}: expected an MSDA implementation name, got {name!r}")
    if name == "auto":
        return name
    if name not in _REGISTRY:
        raise ValueError(_unknown(name, argument))
    reasons = _unavailable(name)
    if reasons:
        raise ValueError(
            f"{argument}: MSDA implementation {name!r} is not usable here "
            f"({'; '.join(reasons)}); usable: {msda_impls()}"
        )
    return name


def registered_impls() -> List[str]:
    """Every registered name, variants included, usable here or not."""
    return sorted(_REGISTRY)


def msda_impls() -> List[str]:
    """Names of the implementations usable on this machine (no experiment variants)."""
    return [name for name in sorted(_REGISTRY) if name not in _VARIANTS and not _unavailable(name)]


def msda_variants() -> List[str]:
    """Names of the experiment variants usable on this machine."""
    return [name for name in sorted(_VARIANTS) if not _unavailable(name)]
