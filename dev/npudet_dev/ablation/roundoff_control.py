"""Run names of ``dev/tools/bench_iteration.py``: an implementation, optionally a round-off control.

``IMPL`` runs the implementation as it is. A control, ``IMPL+ulp`` and/or ``IMPL@T``, runs it
with only float32 round-off changed, to measure how far round-off alone carries the losses
of this model from step to step:

* ``@T``: on T threads; oneDNN's convolutions and the GEMMs may then sum in another order;
* ``+ulp`` (``stock`` only): mmcv's MSDA sampling locations and output each multiplied by
  1 +- 2**-23 (one float32 ulp of 1, the sign drawn per element from a generator of its own, so
  the run's random state is untouched): the size of the difference between two MSDA
  implementations that compute the same function with other float32 operations. The
  locations matter most: bilinear sampling's gradient with respect to a location jumps where
  the location crosses a pixel centre, and mmcv's initial sampling offsets put many
  locations exactly on pixel centres, where one ulp (or another order of the same
  arithmetic) decides which side's gradient a location gets.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

ULP = "ulp"


class RunName(NamedTuple):
    """A parsed run name: the implementation and its control modifiers."""

    impl: str
    threads: Optional[int] = None
    ulp: bool = False

    @property
    def control(self) -> bool:
        return self.threads is not None or self.ulp


def parse_run_name(name: str) -> RunName:
    """``'stock+ulp@1'`` -> RunName('stock', 1, True), ``'cpu:stock'`` -> RunName('cpu:stock')
    (an npudet implementation with its ``model.msda.layers``); ValueError naming the run for
    a bad thread count, an unknown modifier, ``+ulp`` on anything but ``stock`` or bad layers."""
    head, at, threads = name.partition("@")
    if at and (not threads.isdigit() or int(threads) < 1):
        raise ValueError(f"--impls: {name!r}: expected IMPL@THREADS with THREADS >= 1")
    impl, plus, modifier = head.partition("+")
    if plus and (modifier != ULP or impl != "stock"):
        raise ValueError(f"--impls: {name!r}: the only modifier is stock+{ULP}")
    base, colon, layers = impl.partition(":")
    if colon:
        if base == "stock" or not base:
            raise ValueError(f"--impls: {name!r}: expected IMPL:LAYERS with an npudet IMPL")
        from npudet.models.layers import resolve_layers

        resolve_layers(layers, f"--impls item {name!r}")
    return RunName(impl, int(threads) if at else None, bool(plus))


def perturb_mmcv_output(seed: int = 0) -> Callable[[], None]:
    """``+ulp``: mmcv's pure-PyTorch MSDA sampling (its CPU path) takes its sampling locations
    and returns its output each times 1 +- 2**-23 per element; returns the undo function."""
    import torch
    from mmcv.ops import multi_scale_deform_attn as mmcv_msda

    original = mmcv_msda.multi_scale_deformable_attn_pytorch
    generator = torch.Generator().manual_seed(seed)

    def off_by_one_ulp(t: torch.Tensor) -> torch.Tensor:
        sign = torch.randint(0, 2, t.shape, generator=generator).to(t.dtype) * 2 - 1
        return t * (1 + sign * 2.0**-23)

    def perturbed(value, value_spatial_shapes, sampling_locations, attention_weights):  # noqa: ANN001
        locations = off_by_one_ulp(sampling_locations)
        out = original(value, value_spatial_shapes, locations, attention_weights)
        return off_by_one_ulp(out)

    mmcv_msda.multi_scale_deformable_attn_pytorch = perturbed

    def undo() -> None:
        mmcv_msda.multi_scale_deformable_attn_pytorch = original

    return undo
