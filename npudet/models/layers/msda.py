"""Drop-in replacement for mmcv's ``MultiScaleDeformableAttention`` on npudet's op.

Not to be confused with ``npudet.nn.MSDeformAttn``: the same module and ``forward`` without
mmcv, for machines and models without OpenMMLab.
"""

from __future__ import annotations

from typing import Any

from mmcv.ops import MultiScaleDeformableAttention as MMCVMultiScaleDeformableAttention

from npudet.nn import DeformableAttention, MSDeformAttn
from npudet.ops.msda import check_impl_name


class MultiScaleDeformableAttention(DeformableAttention, MMCVMultiScaleDeformableAttention):
    """mmcv's MSDA module with the sampling done by :class:`DeformableAttention`.

    Same constructor, parameters, ``init_weights`` and ``forward`` as mmcv 2.1's class
    (it is a subclass, so mmdet's ``isinstance`` checks and released checkpoints keep
    working), plus ``impl``: a name from ``npudet.ops.msda_impls()`` or ``"auto"``.
    It adds no parameter or buffer, so an mmcv instance can be converted in place
    (see :func:`convert_msda`).
    """

    def __init__(self, *args: Any, impl: str = "auto", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.impl = check_impl_name(impl, "impl")

    # mmcv's forward on DeformableAttention's sampling, written once for both classes.
    forward = MSDeformAttn.forward  # type: ignore[assignment]
    extra_repr = MSDeformAttn.extra_repr
    residual = MSDeformAttn.residual
