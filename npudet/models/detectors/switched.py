"""mmdet's MSDA detectors that need nothing but the switch: mmdet's class behind :class:`MSDAModel`.

Each is registered in mmdet's ``MODELS`` under mmdet's own name (``force=True``), so an
unchanged mmdet config builds it once ``npudet.plugin`` is imported; ``model.msda`` as in
:class:`~.deformable_detr.DeformableDETR`. Parameters, state_dict keys and mmdet's
``isinstance`` checks are mmdet's class's. Which parts each converts:
``docs/user-guide/configs.md``. Defining them imports nothing beyond ``mmdet.models`` (which
``deformable_detr.py`` imports anyway); ``transformers`` stays optional, as in mmdet: mmdet
needs it only to build Grounding DINO's language model.
"""

from __future__ import annotations

from mmdet.models.detectors import DDQDETR as MMDetDDQDETR
from mmdet.models.detectors import GroundingDINO as MMDetGroundingDINO
from mmdet.models.detectors import Mask2Former as MMDetMask2Former
from mmdet.models.vis import Mask2FormerVideo as MMDetMask2FormerVideo
from mmdet.registry import MODELS

from .msda_config import ENCODER_DECODER
from .msda_model import MSDAModel


@MODELS.register_module(force=True)
class DDQDETR(MSDAModel, MMDetDDQDETR):
    """mmdet's ``DDQDETR`` on npudet's MSDA: encoder and decoder."""

    msda_parts = ENCODER_DECODER


@MODELS.register_module(force=True)
class GroundingDINO(MSDAModel, MMDetGroundingDINO):
    """mmdet's ``GroundingDINO`` on npudet's MSDA: the image encoder's layers (its text and
    fusion layers are not MSDA) and the decoder's image cross-attention."""

    msda_parts = ENCODER_DECODER


@MODELS.register_module(force=True)
class Mask2Former(MSDAModel, MMDetMask2Former):
    """mmdet's ``Mask2Former`` on npudet's MSDA: the pixel decoder's encoder
    (``panoptic_head.pixel_decoder.encoder``, ``model.msda.encoder``); it has no MSDA decoder."""

    msda_parts = {"encoder": "panoptic_head.pixel_decoder.encoder"}


@MODELS.register_module(force=True)
class Mask2FormerVideo(MSDAModel, MMDetMask2FormerVideo):
    """mmdet's ``Mask2FormerVideo`` on npudet's MSDA: the same pixel decoder, per frame."""

    msda_parts = {"encoder": "track_head.pixel_decoder.encoder"}


# mmdet's names of the classes above (DeformableDETR and DINO have their own modules).
MSDA_MODELS = tuple(cls.__name__ for cls in (DDQDETR, GroundingDINO, Mask2Former, Mask2FormerVideo))
