"""What an ablation compares: MSDA implementations for the encoder and the decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from npudet.ops.msda import auto_order, check_impl_name, msda_impls


@dataclass(frozen=True)
class Variant:
    """One ablation run: the MSDA implementation of the encoder and of the decoder."""

    encoder: str
    decoder: str

    @property
    def label(self) -> str:
        """``cpu`` when both parts agree, ``cpu/grid_sample`` (encoder/decoder) otherwise."""
        return self.encoder if self.encoder == self.decoder else f"{self.encoder}/{self.decoder}"

    @property
    def dirname(self) -> str:
        """A file-system friendly form of :attr:`label`."""
        return self.label.replace("/", "__")

    def msda_cfg(self) -> Dict[str, str]:
        """The ``model.msda`` config value that selects this variant: ``impl`` alone when
        both parts agree (a model with one MSDA part, e.g. Mask2Former's pixel decoder, has
        no ``decoder`` to name), else ``impl`` with the per-part overrides."""
        if self.encoder == self.decoder:
            return dict(impl=self.encoder)
        return dict(impl=self.encoder, encoder=self.encoder, decoder=self.decoder)


def parse_variants(spec: str, key: str = "--impls") -> List[Variant]:
    """``"grid_sample,cpu,cpu/grid_sample"`` -> variants, in order.

    Each comma-separated item is an implementation name used everywhere, or
    ``ENCODER/DECODER`` to choose the two parts separately (per-layer ablation). Names
    are checked against the usable implementations; duplicates and empty items raise
    ``ValueError`` naming ``key``.
    """
    variants: List[Variant] = []
    for item in spec.split(","):
        item = item.strip()
        parts = item.split("/")
        if not item or len(parts) > 2 or not all(parts):
            raise ValueError(
                f"{key}: expected NAME or ENCODER/DECODER items separated by commas, got {item!r}"
            )
        names = [check_impl_name(name, f"{key} item {item!r}") for name in parts]
        variant = Variant(names[0], names[-1])
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
