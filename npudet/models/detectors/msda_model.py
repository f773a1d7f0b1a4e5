"""The one mechanism by which an mmdet model built on mmcv's MSDA takes ``model.msda``.

mmdet builds mmcv's ``MultiScaleDeformableAttention`` straight from ``mmcv.ops`` inside its
transformer layers, with no registry in between. So npudet does not touch how a model is
built: :class:`MSDAModel` lets mmdet's constructor build it exactly as stock, then converts
every mmcv MSDA layer in place and sets its implementation from ``msda``
(:func:`~.msda_config.apply_msda_cfg`). :func:`switch_msda` puts that in front of a class
registered in mmdet's ``MODELS`` and re-registers the result under the same name, so an
unchanged mmdet config builds it once ``npudet.plugin`` is imported. A new mmdet model on
MSDA needs one line (a name in :data:`MSDA_MODELS`, or ``switch_msda('Name')``).
"""

from __future__ import annotations

import sys
from typing import Any, Mapping, Optional

from mmdet.registry import MODELS
from mmengine.registry import Registry

from .msda_config import apply_msda_cfg


class MSDAModel:
    """Put first among a model class's bases: its constructor takes one more keyword,
    ``msda`` (``dict(impl='auto', encoder=None, decoder=None)``, see
    :func:`~.msda_config.resolve_msda_cfg`), and once the base class has built the model
    every deformable-attention layer in it runs on ``npudet.ops``. ``msda_impls``: the
    implementation of each part, as resolved."""

    def __init__(self, *args: Any, msda: Optional[Mapping] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.msda_impls = apply_msda_cfg(self, msda)  # type: ignore[arg-type]


def switch_msda(name: str, registry: Registry = MODELS) -> type:
    """Make the model class registered as ``name`` in ``registry`` accept ``model.msda``.

    Registers ``type(name, (MSDAModel, registered class), {})`` under ``name`` (``force``),
    so configs naming ``type=name`` build it; parameters, checkpoints and mmdet's
    ``isinstance`` checks are the base class's. Returns the class; a class already switched
    is returned as is. The class is an attribute of this module, so it pickles.
    """
    base = registry.get(name)
    if base is None:
        raise ValueError(f"name: no model registered as {name!r} in the {registry.name!r} registry")
    if issubclass(base, MSDAModel):
        return base
    cls = type(
        name,
        (MSDAModel, base),
        {
            "__module__": __name__,
            "__doc__": f"{base.__module__}.{base.__qualname__} on npudet's MSDA "
            "(``model.msda``, :class:`MSDAModel`).",
        },
    )
    registry.register_module(name=name, module=cls, force=True)
    setattr(sys.modules[__name__], name, cls)
    return cls


# mmdet 3.3 models whose transformers use mmcv's MSDA and need nothing but the switch (the
# parts each converts: docs/user-guide/configs.md). DeformableDETR and DINO have their own
# subclasses (export path), in deformable_detr.py / dino.py.
MSDA_MODELS = (
    "DDQDETR",  # encoder, decoder
    "GroundingDINO",  # encoder (image layers; its text layers are not MSDA), decoder
    "Mask2Former",  # encoder: the pixel decoder's (panoptic_head.pixel_decoder.encoder)
    "Mask2FormerVideo",  # the same pixel decoder, per video frame
)

for _name in MSDA_MODELS:
    switch_msda(_name)
