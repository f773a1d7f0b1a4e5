"""What an ablation compares: MSDA implementations for the encoder and the decoder, and the
transformer layers' pieces (``model.msda.layers``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from npudet.models.layers import resolve_layers
from npudet.ops.msda import auto_order, check_impl_name, msda_impls


@dataclass(frozen=True)
class Variant:
    """One ablation run: the MSDA implementation of the encoder and of the decoder, and
    ``model.msda.layers`` (None: the config's)."""

    encoder: str
    decoder: str
    layers: Optional[str] = None

    @property
    def label(self) -> str:
        """``cpu`` when both parts agree, ``cpu/grid_sample`` (encoder/decoder) otherwise;
        ``:LAYERS`` after it when the variant sets the layers (``cpu:ffn+dropout``)."""
        impls = self.encoder if self.encoder == self.decoder else f"{self.encoder}/{self.decoder}"
        return impls if self.layers is None else f"{impls}:{self.layers}"

    @property
    def dirname(self) -> str:
        """A file-system friendly form of :attr:`label`."""
        return self.label.replace("/", "__").replace(":", "-")

    def msda_cfg(self) -> Dict[str, str]:
        """The ``model.msda`` config value that selects this variant: ``impl`` alone when
        both parts agree (a model with one MSDA part, e.g. Mask2Former's pixel decoder, has
        no ``decoder`` to name), else ``impl`` with the per-part overrides."""
        layers = {} if self.layers is None else dict(layers=self.layers)
        if self.encoder == self.decoder:
            return dict(impl=self.encoder, **layers)
        return dict(impl=self.encoder, encoder=self.encoder, decoder=self.decoder, **layers)


def parse_variants(spec: str, key: str = "--impls") -> List[Variant]:
    """``"grid_sample,cpu,cpu/grid_sample,cpu:stock"`` -> variants, in order.

    Each comma-separated item is an implementation name used everywhere, or
    ``ENCODER/DECODER`` to choose the two parts separately (per-layer ablation), optionally
    followed by ``:LAYERS``, a ``model.msda.layers`` value (``fast``, ``stock``,
    ``ffn+dropout``: each piece's share). Names are checked against the usable
    implementations and the pieces; duplicates and empty items raise ``ValueError`` naming
    ``key``.
    """
    variants: List[Variant] = []
    for item in spec.split(","):
        item = item.strip()
        impls, _, layers = item.partition(":")
        parts = impls.split("/")
        if not item or len(parts) > 2 or not all(parts) or (":" in item and not layers):
            raise ValueError(
                f"{key}: expected NAME or ENCODER/DECODER items, each optionally followed by "
                f":LAYERS, separated by commas, got {item!r}"
            )
        names = [check_impl_name(name, f"{key} item {item!r}") for name in parts]
        if layers:
            resolve_layers(layers, f"{key} item {item!r}")
        variant = Variant(names[0], names[-1], layers or None)
        if variant in variants:
            raise ValueError(f"{key}: {variant.label!r} is listed twice")
        variants.append(variant)
    return variants


def default_impls(device_type: str) -> str:
    """The ``--impls`` default on ``device_type``: the baseline, ``gather``, then every other
    usable implementation ``auto`` considers there (``cpu`` on the CPU; ``mmcv`` and
    ``triton`` on CUDA; ``npu_vendor`` and ``triton`` on NPU), in ``auto``'s order."""
    usable = set(msda_impls())
    names = ["grid_sample", "gather"]
    names += [n for n in auto_order(device_type) if n in usable and n not in names]
    return ",".join(names)
