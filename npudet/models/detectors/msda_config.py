"""The ``msda`` config key: which MSDA implementation each part of a detector uses."""

from __future__ import annotations

from typing import Dict, Mapping, Optional

from torch import nn

from ..layers import check_impl_name, convert_msda

PARTS = ("encoder", "decoder")


def resolve_msda_cfg(msda: Optional[Mapping], key: str = "model.msda") -> Dict[str, str]:
    """``dict(impl='auto', encoder=None, decoder=None)`` -> ``{'encoder': .., 'decoder': ..}``.

    ``impl`` is the default of every part; ``encoder`` / ``decoder`` override it for
    that part (ablations). Unknown keys or names raise ``ValueError`` naming the key.
    """
    msda = dict(msda or {})
    unknown = sorted(set(msda) - {"impl", *PARTS})
    if unknown:
        raise ValueError(f"{key}: unknown keys {unknown}; expected impl, encoder, decoder")
    default = check_impl_name(msda.get("impl", "auto"), f"{key}.impl")
    return {
        part: default if msda.get(part) is None else check_impl_name(msda[part], f"{key}.{part}")
        for part in PARTS
    }


def apply_msda_cfg(detector: nn.Module, msda: Optional[Mapping]) -> Dict[str, str]:
    """Convert the MSDA modules of ``detector.encoder`` / ``.decoder`` per ``msda``."""
    impls = resolve_msda_cfg(msda)
    for part, impl in impls.items():
        convert_msda(getattr(detector, part), impl)
    return impls
