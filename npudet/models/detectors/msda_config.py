"""The ``msda`` config key: which MSDA implementation each part of a detector uses."""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from torch import nn

from npudet.ops.msda import check_impl_name

from ..layers import deformable_layers

PARTS = ("encoder", "decoder")


def resolve_msda_cfg(msda: Optional[Mapping], key: str = "model.msda") -> Dict[str, str]:
    """``dict(impl='auto', encoder=None, decoder=None)`` -> ``{'encoder': .., 'decoder': ..}``.

    ``impl`` is the default of every part; ``encoder`` / ``decoder`` override it for
    that part (ablations). Unknown keys or names raise ``ValueError`` naming the key.
    """
    return _resolve(msda, key)[1]


def _resolve(msda: Optional[Mapping], key: str) -> Tuple[str, Dict[str, str]]:
    """(the default ``impl``, the per-part implementations), each name checked once."""
    if msda is not None and not isinstance(msda, Mapping):
        # `--cfg-options model.msda=cpu` gives a string; dict('cpu') would fail with
        # "dictionary update sequence element #0 has length 1", which names nothing.
        raise ValueError(
            f"{key}: expected a dict like dict(impl='auto', encoder=None, decoder=None), got "
            f"{msda!r}; to choose one implementation set {key}.impl={msda} or --msda-impl {msda}"
        )
    msda = dict(msda or {})
    unknown = sorted(set(msda) - {"impl", *PARTS})
    if unknown:
        raise ValueError(f"{key}: unknown keys {unknown}; expected impl, encoder, decoder")
    default = check_impl_name(msda.get("impl", "auto"), f"{key}.impl")
    parts = {
        part: default if msda.get(part) is None else check_impl_name(msda[part], f"{key}.{part}")
        for part in PARTS
    }
    return default, parts


def layer_part(name: str) -> Optional[str]:
    """The part a layer belongs to: the first component of its qualified module name that
    is a part name (``encoder.layers.0.self_attn`` -> ``encoder``), or None."""
    return next((comp for comp in name.split(".") if comp in PARTS), None)


def apply_msda_cfg(detector: nn.Module, msda: Optional[Mapping]) -> Dict[str, str]:
    """Set the implementation of every deformable-attention layer of ``detector`` per ``msda``.

    A layer under a module named ``encoder`` / ``decoder`` takes that part's
    implementation, any other layer ``impl``; mmcv's own MSDA layers are converted to
    npudet's in place. A part override for a part with no layer in this model (Mask2Former's
    MSDA is its pixel decoder's ``encoder``; it has no MSDA ``decoder``) raises ``ValueError``
    naming the key and the model's parts. Returns the per-part implementations.
    """
    default, impls = _resolve(msda, "model.msda")
    layers = list(deformable_layers(detector))
    # part -> the module holding it, e.g. encoder -> panoptic_head.pixel_decoder.encoder
    found: Dict[str, str] = {}
    for name, layer in layers:
        part = layer_part(name)
        layer.impl = default if part is None else impls[part]
        if part is not None and part not in found:
            components = name.split(".")
            found[part] = ".".join(components[: components.index(part) + 1])
    missing = [part for part in PARTS if (msda or {}).get(part) is not None and part not in found]
    if missing:
        listed = ", ".join(f"{part} ({path})" for part, path in sorted(found.items())) or "none"
        raise ValueError(
            f"model.msda.{missing[0]}: {type(detector).__name__} has no deformable-attention "
            f"layer under a module named {missing[0]!r}; its MSDA parts: {listed}"
        )
    return impls
