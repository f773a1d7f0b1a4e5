"""The one mechanism by which an mmdet model built on mmcv's MSDA takes ``model.msda``.

mmdet builds mmcv's ``MultiScaleDeformableAttention`` straight from ``mmcv.ops`` inside its
transformer layers, with no registry in between. So npudet does not touch how a model is
built: :class:`MSDAModel` lets mmdet's constructor build it exactly as stock, then converts
every mmcv MSDA layer in place and sets its implementation from ``msda``
(:func:`~.msda_config.apply_msda_cfg`). npudet's detectors put it first among their bases
and register under mmdet's names (``deformable_detr.py``, ``dino.py``, ``switched.py``), so an
unchanged mmdet config builds them once ``npudet.plugin`` is imported. :func:`switch_msda`
does the same at run time for a model npudet does not list (a user's own, or mmdet's next).
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar, Mapping, Optional

from mmdet.registry import MODELS
from mmengine.registry import Registry

from .msda_config import apply_msda_cfg


class MSDAModel:
    """Put first among a model class's bases: its constructor takes one more keyword,
    ``msda`` (``dict(impl='auto', encoder=None, decoder=None)``, see
    :func:`~.msda_config.resolve_msda_cfg`), and once the base class has built the model
    every deformable-attention layer in it runs on ``npudet.ops``. ``msda_impls``: the
    implementation of each part, as resolved.

    ``msda_parts``: the parts the class builds, part -> the module holding it (what
    :func:`~.msda_config.msda_parts_of` finds in a built model), so that the preflight checks
    ``model.msda``'s part overrides without building the model; None where only the built
    model tells (a class made by :func:`switch_msda`)."""

    msda_parts: ClassVar[Optional[Mapping[str, str]]] = None

    def __init__(self, *args: Any, msda: Optional[Mapping] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.msda_impls = apply_msda_cfg(self, msda)  # type: ignore[arg-type]


def switch_msda(name: str, registry: Registry = MODELS) -> type:
    """Make the model class registered as ``name`` in ``registry`` accept ``model.msda``.

    For a model npudet does not list (its own are classes in this package): registers
    ``type(name, (MSDAModel, registered class), {})`` under ``name`` (``force``), so configs
    naming ``type=name`` build it; parameters, checkpoints and ``isinstance`` checks are the
    base class's. Returns the class; a class already switched is returned as is. Call it
    after the class is registered, before the model is built.

    Example:
        ```python
        @MODELS.register_module()
        class MyDetector(BaseDetector): ...  # builds mmcv's MultiScaleDeformableAttention
        switch_msda("MyDetector")  # dict(type="MyDetector", msda=dict(impl="cpu")) now builds
        ```

    Raises:
        ValueError: nothing is registered as ``name``.
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
    # pickle finds a class by module and name: a class made at run time pickles (whole-model
    # saves, spawned workers) only as an attribute of the module it names, this one.
    setattr(sys.modules[__name__], name, cls)
    return cls
