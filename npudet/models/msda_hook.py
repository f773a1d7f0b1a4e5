"""``MSDASwitchHook``: any mmengine model's mmcv MSDA layers on npudet's op, from a config.

npudet's detectors take ``model.msda`` because npudet registers their classes; a model npudet
does not list (MMSegmentation's ``EncoderDecoder`` with mmdet's Mask2Former pixel decoder, an
mmdet3d project, a user's own) builds mmcv's ``MultiScaleDeformableAttention`` untouched. The
hook converts those layers of ``runner.model`` in place in ``before_run``, before the first
training, validation or test iteration and before a checkpoint loads, with the same
arguments and the same conversion (:func:`~.detectors.msda_config.apply_msda_cfg`) as
``model.msda``::

    custom_imports = dict(imports=["npudet.plugin"], allow_failed_imports=False)
    custom_hooks = [dict(type="MSDASwitchHook", impl="cpu", paths=dict(decode_head="gather"))]

It is registered in mmengine's root ``HOOKS``, so every toolbox's scope (mmdet, mmseg,
mmdet3d, a user's) finds it by that name.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from .detectors.msda_config import apply_msda_cfg, msda_summary
from .layers import stock_msda_layers


@HOOKS.register_module()
class MSDASwitchHook(Hook):
    """Convert every mmcv MSDA layer of ``runner.model`` to npudet's, in place.

    Args:
        impl: the implementation of every layer (a name of ``msda_impls()`` or ``auto``).
        encoder: the implementation of the layers under a module named ``encoder``
            (default ``impl``); a model with no such layer refuses it in ``before_run``.
        decoder: the same for ``decoder``.
        paths: module path prefix -> implementation (``dict(decode_head='gather')``), for
            the layers under that module (the longest prefix wins, over ``encoder`` /
            ``decoder``); a path with no layer under it is refused in ``before_run``.
        layers: the transformer layers' training-grade pieces, as ``model.msda.layers``
            (default ``'fast'``: all; ``'stock'``: mmcv's FFNs and layers as they are).

    Only the layers' class changes: their parameters (the optimizer's, when it was built
    first), buffers and ``state_dict`` keys are the stock model's, so stock checkpoints load
    and the optimizer keeps updating them. The log names how many layers it converted and
    each part's implementation.
    """

    priority = "VERY_HIGH"  # before any hook that looks at the layers (profiler, parity)

    def __init__(
        self,
        impl: str = "auto",
        encoder: Optional[str] = None,
        decoder: Optional[str] = None,
        paths: Optional[Mapping[str, str]] = None,
        layers: Union[None, str, Sequence[str]] = None,
    ) -> None:
        self.msda = dict(impl=impl, encoder=encoder, decoder=decoder, paths=paths, layers=layers)

    def before_run(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        converted = len(stock_msda_layers(model))
        apply_msda_cfg(model, self.msda, key=type(self).__name__)
        runner.logger.info(
            f"{type(self).__name__}: converted {converted} mmcv MSDA layer"
            f"{'' if converted == 1 else 's'} of {type(model).__name__}; {msda_summary(model)}"
        )
