"""The ``msda`` config key: which MSDA implementation each part of a detector uses."""

from __future__ import annotations

from collections import Counter
from typing import Dict, Mapping, Optional, Tuple

from torch import nn

from npudet.ops.msda import check_impl_name

from ..layers import active_pieces, convert_layers, deformable_layers, resolve_layers

PARTS = ("encoder", "decoder")
# The ``msda_parts`` of a DETR whose transformer is its own ``encoder`` and ``decoder``.
ENCODER_DECODER = {"encoder": "encoder", "decoder": "decoder"}


def resolve_msda_cfg(msda: Optional[Mapping], key: str = "model.msda") -> Dict[str, str]:
    """``dict(impl='auto', encoder=None, decoder=None)`` -> ``{'encoder': .., 'decoder': ..}``.

    ``impl`` is the default of every part; ``encoder`` / ``decoder`` override it for
    that part (ablations); ``paths`` for the layers under a module path
    (:func:`resolve_paths`, checked here too); ``layers`` (checked here, applied by
    :func:`apply_msda_cfg`) picks the transformer layers' pieces
    (:func:`~npudet.models.layers.resolve_layers`). Unknown keys or names raise
    ``ValueError`` naming the key.
    """
    parts = _resolve(msda, key)[1]
    resolve_paths(msda, key)
    return parts


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
    unknown = sorted(set(msda) - {"impl", "layers", *PARTS, "paths"})
    if unknown:
        raise ValueError(
            f"{key}: unknown keys {unknown}; expected impl, encoder, decoder, paths, layers"
        )
    resolve_layers(msda.get("layers"), f"{key}.layers")
    default = check_impl_name(msda.get("impl", "auto"), f"{key}.impl")
    parts = {
        part: default if msda.get(part) is None else check_impl_name(msda[part], f"{key}.{part}")
        for part in PARTS
    }
    return default, parts


def resolve_paths(msda: Optional[Mapping], key: str = "model.msda") -> Dict[str, str]:
    """``msda['paths']``: module path prefix -> implementation, each name checked."""
    paths = (msda or {}).get("paths") or {}
    if not isinstance(paths, Mapping):
        raise ValueError(
            f"{key}.paths: expected a dict of module path -> implementation, like "
            f"dict(decode_head='cpu'), got {paths!r}"
        )
    return {path: check_impl_name(impl, f"{key}.paths.{path}") for path, impl in paths.items()}


def _under(name: str, path: str) -> bool:
    """Whether module ``name`` is ``path`` or sits under it (``a.b.1`` is not under ``a.b.10``)."""
    return name == path or name.startswith(path + ".")


def layer_part(name: str) -> Optional[str]:
    """The part a layer belongs to: the first component of its qualified module name that
    is a part name (``encoder.layers.0.self_attn`` -> ``encoder``), or None."""
    return next((comp for comp in name.split(".") if comp in PARTS), None)


def msda_parts_of(detector: nn.Module) -> Dict[str, str]:
    """The MSDA parts ``detector`` has: part -> the module holding its first layer
    (Mask2Former: ``encoder`` -> ``panoptic_head.pixel_decoder.encoder``)."""
    found: Dict[str, str] = {}
    for name, _ in deformable_layers(detector):
        part = layer_part(name)
        if part is not None and part not in found:
            components = name.split(".")
            found[part] = ".".join(components[: components.index(part) + 1])
    return found


def missing_part_error(
    model: str, msda: Optional[Mapping], parts: Mapping[str, str], key: str = "model.msda"
) -> Optional[str]:
    """The error for a part override in ``msda`` naming a part model class ``model`` lacks
    (``parts``: its :func:`msda_parts_of`), or None. The preflight's too: it reads ``parts``
    from the class (``msda_parts``) without building the model. ``key``: where ``msda``
    came from, named in the error."""
    missing = [part for part in PARTS if (msda or {}).get(part) is not None and part not in parts]
    if not missing:
        return None
    listed = ", ".join(f"{part} ({path})" for part, path in sorted(parts.items())) or "none"
    return (
        f"{key}.{missing[0]}: {model} has no deformable-attention layer under a module "
        f"named {missing[0]!r}; its MSDA parts: {listed}"
    )


def apply_msda_cfg(
    detector: nn.Module, msda: Optional[Mapping], key: str = "model.msda"
) -> Dict[str, str]:
    """Set the implementation of every deformable-attention layer of ``detector`` per ``msda``.

    The one conversion: npudet's detectors (``model.msda``) and ``MSDASwitchHook`` (any
    mmengine model, ``key`` naming the hook's arguments in errors) both call it.

    A layer under a module path of ``paths`` (``dict(decode_head='cpu')``: the longest that
    matches) takes that implementation, one under a module named ``encoder`` / ``decoder``
    that part's, any other layer ``impl``; mmcv's own MSDA layers are converted to npudet's
    in place, then mmcv's FFNs and the MSDA layers take ``layers``' pieces
    (:func:`~npudet.models.layers.convert_layers`; default all). A path no layer sits under
    raises ``ValueError``, and so does a part override for a part with no layer in this
    model (Mask2Former's MSDA is its pixel decoder's ``encoder``; it has no MSDA
    ``decoder``), naming the key and the model's parts (:func:`missing_part_error`).
    Returns the per-part implementations.
    """
    default, impls = _resolve(msda, key)
    paths = resolve_paths(msda, key)
    model = type(detector).__name__
    problem = missing_part_error(model, msda, msda_parts_of(detector), key)
    if problem:
        raise ValueError(problem)
    layers = list(deformable_layers(detector))
    names = [name for name, _ in layers]
    for path in paths:
        if not any(_under(name, path) for name in names):
            listed = ", ".join(names[:3]) + (f" ({len(names)} in all)" if len(names) > 3 else "")
            raise ValueError(
                f"{key}.paths: {model} has no deformable-attention layer under {path!r}; "
                f"its MSDA layers: {listed or 'none'}"
            )
    for name, layer in layers:
        # the longest path a layer sits under wins, then its part, then ``impl``
        path = max((p for p in paths if _under(name, p)), key=len, default=None)
        part = layer_part(name)
        layer.impl = paths[path] if path else impls[part] if part else default
    convert_layers(detector, resolve_layers((msda or {}).get("layers"), f"{key}.layers"))
    return impls


def msda_summary(model: nn.Module) -> str:
    """``"MSDA implementation per model part: decoder: auto (6 layers), encoder: cpu (6
    layers); layer pieces (model.msda.layers): ffn (12), dropout (24), projections (12)"``:
    what each part's deformable-attention layers were set to (``auto`` names its own choice
    in the log at the first call) and how many modules run each training-grade piece."""
    parts: Dict[str, Counter] = {}
    for name, layer in deformable_layers(model):
        part = layer_part(name) or "other"
        parts.setdefault(part, Counter())[layer.impl] += 1
    if not parts:
        return "MSDA implementation per model part: the model has no deformable-attention layer"
    listed = ", ".join(
        f"{part}: "
        + ", ".join(f"{impl} ({n} layer{'s' if n > 1 else ''})" for impl, n in sorted(c.items()))
        for part, c in sorted(parts.items())
    )
    pieces = ", ".join(f"{piece} ({n})" for piece, n in active_pieces(model).items() if n)
    return (
        f"MSDA implementation per model part: {listed}; layer pieces (model.msda.layers): "
        f"{pieces or 'none (stock)'}"
    )
